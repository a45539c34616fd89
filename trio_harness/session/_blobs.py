"""Large message images stored by reference: content-addressed blobs beside the log.

An image part larger than :data:`~._events.MAX_INLINE_IMAGE_BYTES` is written
by the store as a blob named by its SHA-256 (a file ``blobs/<sha256>`` in a
JSONL session's directory, a row of ``blobs`` in PostgreSQL) *before* the
event that references it, and the event's line holds only the reference
(:func:`externalize`).  A crash between the two leaves at most a blob that
nothing references, harmless and deleted with the session; never a reference
without its blob.  A resume reads the references back (:func:`resolve_images`,
checking each blob's hash), so requests and ACP replays see the same images.
Docs: docs/sessions.rst, "Images".
"""

from __future__ import annotations

import base64
import errno
import hashlib
import os
import re
import stat
import uuid
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

import attrs
import trio

from .._errors import SessionCorruptError, SessionStoreError
from ._codec import encode_event
from ._events import MAX_IMAGE_BYTES, MAX_INLINE_IMAGE_BYTES, Event, ImagePart, InboxMessage, InboxSpliced, UserMessage
from ._session import validate_session_id

BLOBS_DIR = "blobs"
"""The directory of a JSONL session's blobs, inside the session's directory."""

# The events whose records may hold images.
IMAGE_EVENTS: frozenset[type[Event]] = frozenset({UserMessage, InboxSpliced})

# A base64 text longer than this holds more than MAX_INLINE_IMAGE_BYTES bytes.
_INLINE_CHARS = (MAX_INLINE_IMAGE_BYTES + 2) // 3 * 4
_SHA256 = re.compile(r"[0-9a-f]{64}")

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


@runtime_checkable
class BlobReader(Protocol):
    """A store that keeps large images beside the log (JSONL, PostgreSQL): it reads them back.

    A store without it keeps every image inline in its events (the memory store).
    """

    async def read_blob(self, session_id: str, sha256: str) -> bytes:
        """The bytes of the blob ``sha256`` of the session, checked against their hash.

        Raises:
            SessionCorruptError: the blob is missing, or its bytes do not have its hash.
            SessionStoreError: it cannot be read.
        """
        ...


# ---------------------------------------------------------------- writing


def _by_reference(part: ImagePart, blobs: dict[str, bytes]) -> ImagePart:
    if len(part.data) <= _INLINE_CHARS:
        return part
    data = base64.b64decode(part.data)
    if len(data) <= MAX_INLINE_IMAGE_BYTES:
        return part
    digest = hashlib.sha256(data).hexdigest()
    blobs[digest] = data
    return ImagePart(part.media_type, sha256=digest, size=len(data))


def _message(message: InboxMessage, blobs: dict[str, bytes]) -> InboxMessage:
    if not message.images:
        return message
    parts = tuple(_by_reference(part, blobs) for part in message.images)
    return message if parts == message.images else attrs.evolve(message, images=parts)


def externalize(event: Event, blobs: dict[str, bytes]) -> Event:
    """``event`` as its line stores it: each image above the inline limit replaced by its reference.

    The bytes of those images are put in ``blobs`` (by SHA-256), for the
    store to write before the line.  An event without large images is
    returned as it is.
    """
    if type(event) is UserMessage:
        if not event.images:
            return event
        parts = tuple(_by_reference(part, blobs) for part in event.images)
        return event if parts == event.images else attrs.evolve(event, images=parts)
    if type(event) is InboxSpliced:
        if not event.inserted:
            return event
        inserted = tuple(_message(message, blobs) for message in event.inserted)
        return event if inserted == event.inserted else attrs.evolve(event, inserted=inserted)
    return event


def encode_stored(events: Sequence[Event]) -> tuple[list[str], dict[str, bytes]]:
    """The lines of ``events`` as a store writes them (:func:`externalize`), and the blobs they reference.

    Raises:
        ValueError: an event holds an image by reference (a read-only load's):
            its blob is in the session it was loaded from, not here.
    """
    if references(events):
        raise ValueError(
            "cannot store events that hold images by reference (from a read-only load); "
            "read them back first (the session's resume, or SessionRegistry.fork, does)"
        )
    blobs: dict[str, bytes] = {}
    return [encode_event(externalize(e, blobs) if type(e) in IMAGE_EVENTS else e) for e in events], blobs


# ---------------------------------------------------------------- reading back


def references(events: Sequence[Event]) -> set[str]:
    """The SHA-256 of every image the events hold by reference."""
    found: set[str] = set()
    for event in events:
        if type(event) is UserMessage:
            found.update(part.sha256 for part in event.images if part.by_reference)
        elif type(event) is InboxSpliced:
            for message in event.inserted:
                found.update(part.sha256 for part in message.images if part.by_reference)
    return found


def _inline(part: ImagePart, data: dict[str, str]) -> ImagePart:
    if not part.by_reference:
        return part
    return ImagePart(part.media_type, data[part.sha256])  # as it was sent


def image_key(part: ImagePart) -> tuple[str, str]:
    """What identifies an image, inline or by reference: its media type and its bytes' SHA-256."""
    if part.by_reference:
        return part.media_type, part.sha256
    return part.media_type, hashlib.sha256(base64.b64decode(part.data)).hexdigest()


def _inline_message(message: InboxMessage, data: dict[str, str]) -> InboxMessage:
    if not any(part.by_reference for part in message.images):
        return message
    return attrs.evolve(message, images=tuple(_inline(part, data) for part in message.images))


async def resolve_images(store: object, session_id: str, events: Sequence[Event]) -> tuple[Event, ...]:
    """``events`` with every image held by reference read back from ``store`` (inline again).

    Each blob is read once and checked against its hash.  Events without
    references are returned as they are (the same objects).

    Raises:
        SessionCorruptError: a referenced blob is missing or does not match
            its hash, or the store keeps no blobs.
        SessionStoreError: a blob cannot be read.
    """
    wanted = references(events)
    if not wanted:
        return tuple(events)
    if not isinstance(store, BlobReader):
        raise SessionCorruptError(
            f"session {session_id!r} references {len(wanted)} images stored as blobs, "
            f"but its store ({type(store).__name__}) keeps no blobs",
            path=session_id,
            line=0,
        )
    data = {}
    for digest in sorted(wanted):
        data[digest] = base64.b64encode(await store.read_blob(session_id, digest)).decode("ascii")
    out: list[Event] = []
    for event in events:
        if type(event) is UserMessage and any(part.by_reference for part in event.images):
            event = attrs.evolve(event, images=tuple(_inline(part, data) for part in event.images))
        elif type(event) is InboxSpliced and any(m.images for m in event.inserted):
            event = attrs.evolve(event, inserted=tuple(_inline_message(m, data) for m in event.inserted))
        out.append(event)
    return tuple(out)


def check_blob(digest: str, data: bytes, where: str) -> bytes:
    """``data`` when its SHA-256 is ``digest``.

    Raises:
        SessionCorruptError: it is not (the blob was changed or damaged).
    """
    actual = hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise SessionCorruptError(
            f"{where}: the image blob {digest} holds {len(data)} bytes whose SHA-256 is {actual}; "
            "it was changed or damaged",
            path=where,
            line=0,
        )
    return data


def check_digest(digest: str, session_id: str) -> str:
    """``digest`` when it is a lowercase hex SHA-256 (a reference read from a log names a file).

    Raises:
        SessionCorruptError: it is not.
    """
    if not isinstance(digest, str) or _SHA256.fullmatch(digest) is None:
        raise SessionCorruptError(
            f"session {session_id!r} references an image blob named {digest!r:.80}, not a SHA-256",
            path=session_id,
            line=0,
        )
    return digest


# ---------------------------------------------------------------- JSONL files


def _holds(blobs_fd: int, digest: str, size: int) -> bool:
    """Whether ``digest`` in ``blobs_fd`` is a regular file (not a link) holding the bytes of that hash."""
    try:
        fd = os.open(digest, _READ_FLAGS, dir_fd=blobs_fd)
    except OSError:
        return False  # missing, or a symbolic link (ELOOP): written anew
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size != size:
            return False
        digester = hashlib.sha256()
        while chunk := os.read(fd, 1 << 20):
            digester.update(chunk)
        return digester.hexdigest() == digest
    finally:
        os.close(fd)


def discard_blob_files(dir_fd: int) -> None:
    """(blocking) Remove the ``blobs`` of a session directory this call created (a failed create)."""
    try:
        blobs_fd = os.open(BLOBS_DIR, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError:
        return
    try:
        for name in os.listdir(blobs_fd):
            os.unlink(name, dir_fd=blobs_fd)
    except OSError:
        pass
    finally:
        os.close(blobs_fd)
    try:
        os.rmdir(BLOBS_DIR, dir_fd=dir_fd)
    except OSError:
        pass


def write_blob_files(dir_fd: int, blobs: dict[str, bytes], *, fsync: bool) -> None:
    """(blocking) Store ``blobs`` as ``blobs/<sha256>`` files under the session directory ``dir_fd``.

    Each file is written under a temporary name and renamed into place (a
    rename replaces a name, never follows it: a symbolic link planted at a
    blob's path is replaced, nothing outside the store is written).  With
    ``fsync`` the files and the directory entries are synced before this
    returns, so the events referencing them are written after their blobs
    are durable.  A blob already stored is kept (same name, same bytes).

    Raises:
        SessionStoreError: ``blobs`` in the session directory is a symbolic link or not a directory.
        OSError: the file system refused a step.
    """
    if not blobs:
        return
    created = False
    try:
        os.mkdir(BLOBS_DIR, 0o700, dir_fd=dir_fd)
        created = True
    except FileExistsError:
        pass
    try:
        blobs_fd = os.open(BLOBS_DIR, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SessionStoreError(
                f"the {BLOBS_DIR} entry of a session directory is not a directory (a symbolic link?); "
                "refusing to store image blobs through it"
            ) from None
        raise
    try:
        if created:
            os.fchmod(blobs_fd, 0o700)  # a umask such as 0o277 would leave it unwritable
        for digest, data in blobs.items():
            if _holds(blobs_fd, digest, len(data)):
                continue  # stored already (a damaged or planted one is replaced)
            temp = f".{digest}.{uuid.uuid4().hex}.tmp"
            fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=blobs_fd)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.write(fd, view) :]
                if fsync:
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                os.unlink(temp, dir_fd=blobs_fd)
                raise
            os.close(fd)
            os.rename(temp, digest, src_dir_fd=blobs_fd, dst_dir_fd=blobs_fd)
        if fsync:
            os.fsync(blobs_fd)
            if created:
                os.fsync(dir_fd)
    finally:
        os.close(blobs_fd)


async def write_blobs_in(session_dir: os.PathLike[str] | str, blobs: dict[str, bytes], *, fsync: bool) -> None:
    """:func:`write_blob_files` in a stored session's directory (not followed if a symbolic link), on a thread."""
    if blobs:
        await trio.to_thread.run_sync(_write_blobs_in, session_dir, blobs, fsync)


def _write_blobs_in(session_dir: os.PathLike[str] | str, blobs: dict[str, bytes], fsync: bool) -> None:
    try:
        dir_fd = os.open(session_dir, _DIR_FLAGS)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            raise SessionStoreError(
                f"{session_dir} is not a directory (a symbolic link?); refusing to store image blobs in it",
                path=str(session_dir),
            ) from None
        raise
    try:
        write_blob_files(dir_fd, blobs, fsync=fsync)
    finally:
        os.close(dir_fd)


def read_blob_file(session_dir: str, digest: str, session_id: str) -> bytes:
    """(blocking) The checked bytes of ``blobs/<digest>`` in ``session_dir``.

    Neither the session directory, ``blobs`` nor the blob may be a symbolic
    link; the blob must be a regular file of at most :data:`MAX_IMAGE_BYTES`.

    Raises:
        SessionCorruptError: the blob is missing, too large, or does not match its hash.
        SessionStoreError: it is a symbolic link or not a regular file, or cannot be read.
    """
    check_digest(digest, session_id)
    where = os.path.join(session_dir, BLOBS_DIR, digest)
    fds: list[int] = []
    try:
        try:
            fds.append(os.open(session_dir, _DIR_FLAGS))
            fds.append(os.open(BLOBS_DIR, _DIR_FLAGS, dir_fd=fds[-1]))
            fds.append(os.open(digest, _READ_FLAGS, dir_fd=fds[-1]))
        except FileNotFoundError:
            raise SessionCorruptError(
                f"{where}: the image blob referenced by session {session_id!r} is missing", path=where, line=0
            ) from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise SessionStoreError(
                    f"{where}: refusing to follow a symbolic link (or a non-directory) on the way to an image blob "
                    f"of session {session_id!r}",
                    path=where,
                ) from None
            raise SessionStoreError(f"cannot read the image blob {where}: {exc.strerror}", path=where) from exc
        fd = fds[-1]
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SessionStoreError(f"{where} is not a regular file; refusing to read it as an image blob", path=where)
        if info.st_size > MAX_IMAGE_BYTES:
            raise SessionCorruptError(
                f"{where}: the image blob is {info.st_size} bytes, more than the {MAX_IMAGE_BYTES} an image may have",
                path=where,
                line=0,
            )
        chunks = []
        while chunk := os.read(fd, 1 << 20):
            chunks.append(chunk)
        return check_blob(digest, b"".join(chunks), where)
    finally:
        for fd in reversed(fds):
            os.close(fd)


async def read_blob_file_async(session_dir: str, digest: str, session_id: str) -> bytes:
    """:func:`read_blob_file` on a worker thread."""
    return await trio.to_thread.run_sync(read_blob_file, session_dir, digest, session_id)


# ---------------------------------------------------------------- PostgreSQL


def blobs_table(schema: str) -> str:
    """The statement creating the ``blobs`` table of ``schema`` (quoted), if missing."""
    return (
        f"CREATE TABLE IF NOT EXISTS {schema}.blobs (session_id text NOT NULL "
        f"REFERENCES {schema}.sessions (id) ON DELETE CASCADE, sha256 text NOT NULL, data bytea NOT NULL, "
        "PRIMARY KEY (session_id, sha256))"
    )


def insert_blobs(conn: object, schema: str, session_id: str, blobs: dict[str, bytes]) -> None:
    """(worker thread, in the transaction of the events that reference them) Store ``blobs``."""
    if not blobs:
        return
    execute = getattr(conn, "execute")  # noqa: B009 - a psycopg connection, without importing psycopg here
    for digest, data in blobs.items():
        execute(
            f"INSERT INTO {schema}.blobs (session_id, sha256, data) VALUES (%s, %s, %s) "
            "ON CONFLICT (session_id, sha256) DO NOTHING",
            (session_id, digest, data),
        )


def select_blob(schema: str, session_id: str, digest: str, where: str) -> Callable[[Any], bytes]:
    """(a worker thread's work) Read and check the blob ``digest`` of the session from ``schema.blobs``."""
    validate_session_id(session_id)
    check_digest(digest, session_id)

    def work(conn: Any) -> bytes:
        row = conn.execute(
            f"SELECT data FROM {schema}.blobs WHERE session_id = %s AND sha256 = %s", (session_id, digest)
        ).fetchone()
        if row is None:
            raise SessionCorruptError(
                f"{where}: the image blob referenced by session {session_id!r} is missing", path=where, line=0
            )
        return check_blob(digest, bytes(row[0]), where)

    return work


def copy_blobs(schema: str) -> str:
    """The statement copying a session's blobs to a fork (parameters: child id, source id)."""
    return (
        f"INSERT INTO {schema}.blobs (session_id, sha256, data) SELECT %s, sha256, data FROM {schema}.blobs "
        "WHERE session_id = %s ON CONFLICT (session_id, sha256) DO NOTHING"
    )
