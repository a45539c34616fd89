"""The JSONL directory store: one directory per session, one JSON line per event.

Layout under the root::

    <root>/<escaped session id>/session.jsonl

The first line is the header, every later line one event.  No file exists
before the first flush; that flush writes the header and the first batch to a
temporary file, syncs it and links it into place (:meth:`JsonlStore._store_new_log`),
so the log appears whole or not at all.  The writer (:mod:`._jsonl_writer`)
only appends, batching lines in memory and writing them at its flush,
``fsync``-ing them when it syncs.

One writer per session: the writer holds an exclusive ``flock`` on the log from
the moment the log appears (new sessions) or from :meth:`JsonlStore.resume`
(before the log is read) until it is closed, so a session live in one process
cannot be resumed in another.

Same-id creates are arbitrated before the creator runs anything: the writer of
a new session claims its id at :meth:`JsonlStore.open_writer` (a lock on
one byte of ``<root>/.create.lock``, see :mod:`._create_lock`) and holds the
claim until its first flush has linked the log into place and locked it, or
until it is closed.  After taking the claim it checks that no log exists (a
writer that stored the id released its claim only after its log appeared).

Nothing escapes the root: session directories are opened with ``O_NOFOLLOW``
and must be real directories, logs must be regular files (a planted symbolic
link, FIFO or device is refused before any byte is read), reads are bounded by
``max_log_bytes`` and run on a worker thread that a cancelled caller abandons
(the primitives: :mod:`._jsonl_files`).

Loading is tolerant exactly where a crash can leave damage and strict
elsewhere (:mod:`._jsonl_parse`): a torn last line is dropped, and so is a bad
line after the last committed ``turn/end``; a bad line before it is a
:class:`SessionCorruptError`.  A failed load changes nothing on disk; a writer
resuming a log with a dropped tail cuts the tail off before its first append.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import secrets
import stat
import uuid
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .._errors import (
    InvalidSessionIdError,
    SessionCorruptError,
    SessionError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
)
from . import _jsonl_files
from ._blobs import discard_blob_files, encode_stored, read_blob_file_async, write_blob_files
from ._codec import decode_header, encode_header
from ._create_lock import CLAIM_NAME, ClaimHeld, take_claim
from ._events import Event, SessionHeader
from ._jsonl_files import (
    _APPEND_FLAGS,
    _DIR_FLAGS,
    _MAX_HEADER_BYTES,
    _READ_FLAGS,
    _TEMP_FLAGS,
    DEFAULT_MAX_LOG_BYTES,
    _absolute_path,
    _check_private,
    _kind,
    _make_private_dirs,
    _read_all,
    _reason,
)
from ._jsonl_files import LOG_NAME as LOG_NAME
from ._jsonl_files import escape_session_id as escape_session_id
from ._jsonl_files import unescape_session_id as unescape_session_id
from ._jsonl_parse import parse_log as parse_log
from ._jsonl_writer import _JsonlWriter
from ._persistence import LoadedSession
from ._session import SessionWriter, validate_session_id

log = logging.getLogger("trio_harness.session.jsonl")


@attrs.define(eq=False)
class JsonlStore:
    """Sessions stored as JSONL files in one directory per session under ``root``.

    Args:
        root: the directory holding the session directories (created on demand).
        fsync: ``fsync`` on every flush (turn off only for throwaway data).
        inline_fsync: run that ``fsync`` on the event loop's thread.  It saves
            the hand-off to a worker thread (about 85 us a flush here) at the
            cost of blocking the loop while the disk syncs: worth it for a
            process with few agents on a fast local disk, not on a slow or
            network file system.  Off by default.
        max_log_bytes: the largest log :meth:`load` and :meth:`resume` read
            (a larger one is a :exc:`SessionStoreError`); 1 GiB by default.
    """

    root: Path = attrs.field(converter=_absolute_path)
    fsync: bool = True
    inline_fsync: bool = False
    max_log_bytes: int = DEFAULT_MAX_LOG_BYTES
    # Ids whose log a writer of this object holds locked.
    _held: set[str] = attrs.field(factory=set, init=False)
    # Ids a writer of this object claimed for creating (see the module docs), not stored yet.
    _claimed: set[str] = attrs.field(factory=set, init=False)

    def path_of(self, session_id: str) -> Path:
        """The log file of ``session_id`` (which need not exist)."""
        path = self.root / escape_session_id(session_id) / LOG_NAME
        # Escaping guarantees this; checked anyway so no bug can write outside the root.
        if path.parent.parent != self.root:
            raise InvalidSessionIdError(f"session id {session_id!r} escapes the store root")
        return path

    async def check(self) -> None:
        """Check that the root is (or can be created as) a writable directory.

        Nothing is left behind: a probe directory is made in the nearest
        existing directory and removed (``access`` alone says yes to root
        where nothing can be made).

        An existing root must be this user's (or root's) and writable by
        nobody else: a root other users can write lets them swap in a
        forged session, so it is refused.  A missing root, and each missing
        parent, is created with mode 0700 at the first flush, whatever the
        umask.

        Raises:
            SessionStoreError: the root, or the nearest existing directory it
                would be created in, is not a directory or not writable; the
                root is writable by its group or others, or owned by another user.
        """
        target = self.root
        while True:
            try:
                info = os.stat(target)
                break
            except (FileNotFoundError, NotADirectoryError):
                target = target.parent  # "/" always exists
            except OSError as exc:
                raise SessionStoreError(
                    f"the session store {self.root} cannot be used: {target}: {_reason(exc)}", path=str(self.root)
                ) from exc
        where = "" if target == self.root else f"cannot be created: {target} "
        if not stat.S_ISDIR(info.st_mode):
            what = f"is {_kind(info.st_mode)}, not a directory"
            advice = "pass a directory path (it is created if missing)"
            raise SessionStoreError(f"the session store {self.root} {where}{what}; {advice}", path=str(self.root))
        if target == self.root:
            _check_private(self.root, info)
        effective = os.access in os.supports_effective_ids
        writable = os.access(target, os.W_OK | os.X_OK, effective_ids=effective)
        if writable:
            # access() answers yes to root everywhere, also where nothing can be
            # made (/proc, /sys): try for real, leaving nothing behind.
            probe = target / f".trio-harness-probe-{os.getpid()}-{secrets.token_hex(4)}"
            try:
                os.mkdir(probe, 0o700)
            except OSError:
                writable = False
            else:
                os.rmdir(probe)
        if not writable:
            raise SessionStoreError(
                f"the session store {self.root} {where}is not writable; pass a directory this process can write to",
                path=str(self.root),
            )

    async def exists(self, session_id: str) -> bool:
        """Whether something is stored as this id's log (in a real directory)."""
        path = self.path_of(session_id)
        try:
            if not stat.S_ISDIR(os.lstat(path.parent).st_mode):
                return False
            os.lstat(path)
        except (FileNotFoundError, NotADirectoryError):
            return False
        except OSError as exc:
            raise SessionStoreError(
                f"cannot look up session {session_id!r} at {path}: {_reason(exc)}", path=str(path)
            ) from exc
        return True

    async def list(self) -> list[SessionHeader]:
        """Headers of every stored session, oldest first; unreadable ones are logged and skipped.

        Symbolic links and special files are skipped (and logged), never followed or read.
        """
        try:
            root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        except (FileNotFoundError, NotADirectoryError):
            return []
        except OSError as exc:
            raise SessionStoreError(
                f"cannot list the session store {self.root}: {_reason(exc)}", path=str(self.root)
            ) from exc
        headers = []
        try:
            with os.scandir(root_fd) as entries:
                names = [entry.name for entry in entries if not entry.name.startswith(".")]
            for name in names:
                header = self._read_header(root_fd, name)
                if header is not None:
                    headers.append(header)
        finally:
            os.close(root_fd)
        return sorted(headers, key=lambda h: (h.created_at, h.id))

    def _read_header(self, root_fd: int, name: str) -> SessionHeader | None:
        path = self.root / name / LOG_NAME
        try:
            dir_fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                log.warning(
                    "skipping %s: it is not a session directory but %s", path.parent, self._describe(path.parent)
                )
            elif exc.errno != errno.ENOENT:
                log.warning("skipping unreadable session directory %s: %s", path.parent, _reason(exc))
            return None
        try:
            fd = os.open(LOG_NAME, _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            return None  # an empty directory: nothing stored
        except OSError as exc:
            log.warning("skipping unreadable session log %s: %s", path, _reason(exc))
            return None
        finally:
            os.close(dir_fd)
        try:
            mode = os.fstat(fd).st_mode
            if not stat.S_ISREG(mode):
                log.warning("skipping %s: it is %s, not a regular file", path, _kind(mode))
                return None
            first = b""
            while b"\n" not in first and len(first) < _MAX_HEADER_BYTES:
                chunk = os.read(fd, 65536)
                if not chunk:
                    break
                first += chunk
            line, newline, _ = first.partition(b"\n")
            if not newline:
                return None  # header never completed: nothing committed
            return decode_header(line)
        except (OSError, SessionError) as exc:
            log.warning("skipping unreadable session log %s: %s", path, exc)
            return None
        finally:
            os.close(fd)

    async def load(self, session_id: str) -> LoadedSession:
        """Read a stored session back (see the module docs for what is tolerated).

        Raises:
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the log is damaged before its last committed turn.
            SessionStoreError: the session directory or log is not what this
                store writes (a symbolic link, a special file), is larger than
                ``max_log_bytes``, or cannot be read.
        """
        fd, size, path = self._open_log(session_id, write=False)
        data = await _read_all(fd, size)
        os.close(fd)
        return self._parse(data, str(path), session_id)

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        """Claim the id and return a writer for it; the log appears, whole and locked, at its first flush.

        The claim (a lock on one byte of ``<root>/.create.lock``, which is
        created with the root if missing) is held until that flush stored the
        log, or the writer is closed.

        Raises:
            SessionExistsError: a log is stored under this id, or another
                writer (of any process) is creating it.
            SessionStoreError: the session's directory is taken by something
                that is not a directory (e.g. a symbolic link), or the claim
                file cannot be used.
            SessionError: the header cannot be encoded.
        """
        path = self.path_of(header.id)
        try:
            info = os.lstat(path.parent)
        except (FileNotFoundError, NotADirectoryError):
            pass  # created at the first flush (check() reports a root that is not a directory)
        except OSError as exc:
            raise SessionStoreError(
                f"cannot look up session {header.id!r} at {path.parent}: {_reason(exc)}", path=str(path.parent)
            ) from exc
        else:
            if not stat.S_ISDIR(info.st_mode):
                raise self._not_a_directory(header.id, path.parent)
        try:
            line = (encode_header(header) + "\n").encode("utf-8")
        except (TypeError, ValueError) as exc:
            raise SessionError(f"the header of session {header.id!r} cannot be stored: {exc}") from exc
        claim = await self._claim(header.id)
        return _JsonlWriter(self, header, path, header_line=line, claim=claim)

    async def _claim(self, session_id: str) -> int | None:
        """Claim ``session_id`` for creating it (:mod:`._create_lock`), then check nothing is stored.

        Returns the descriptor holding the claim (None without OFD locks).
        """
        try:
            _make_private_dirs(self.root)
        except OSError as exc:
            raise SessionStoreError(f"cannot create the session store {self.root}: {exc}", path=str(self.root)) from exc
        busy = False
        try:
            fd = take_claim(self.root, session_id)
        except ClaimHeld:
            fd, busy = None, True
        try:
            if (fd is not None or busy) and await self.exists(session_id):  # its last claimant stored it
                raise SessionExistsError(f"session {session_id!r} is already stored at {self.path_of(session_id)}")
        except BaseException:
            if fd is not None:
                os.close(fd)
            raise
        if busy:
            where = "in this process" if session_id in self._claimed else "by another process or store object"
            raise SessionExistsError(
                f"session {session_id!r} already exists: it is being created {where} on {self.root} (its claim in "
                f"{self.root / CLAIM_NAME} is held); use another id, or resume it once it is stored"
            )
        if fd is not None:
            self._claimed.add(session_id)
        return fd

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        """Lock the session's log, then read it; the writer holds the lock until closed.

        Raises:
            SessionLockedError: another writer holds the log (the session is
                live in another process, or being resumed in this one).
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the log is damaged before its last committed turn.
            SessionStoreError: as for :meth:`load`, or the log cannot be
                opened for writing.
        """
        fd, size, path = self._open_log(session_id, write=True)
        self._held.add(session_id)
        try:
            data = await _read_all(fd, size)
        except BaseException:
            self._held.discard(session_id)
            raise
        try:
            loaded = self._parse(data, str(path), session_id)
        except BaseException:
            os.close(fd)
            self._held.discard(session_id)
            raise
        writer = _JsonlWriter(
            self,
            loaded.header,
            path,
            header_line=None,
            fd=fd,
            length=len(data),
            truncate_to=loaded.valid_length if loaded.dropped_tail else None,
        )
        return loaded, writer

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Write a whole new session at once (atomically, via a temporary file), under its id's claim."""
        path = self.path_of(header.id)
        events_lines, blobs = encode_stored(events)
        lines = [encode_header(header), *events_lines]
        data = ("\n".join(lines) + "\n").encode("utf-8")
        claim = await self._claim(header.id)
        try:
            fd = await trio.to_thread.run_sync(self._store_new_log, header.id, data, blobs)
            os.close(fd)
        except OSError as exc:
            raise SessionStoreError(
                f"cannot write session {header.id!r} to {path}: {_reason(exc)}", path=str(path)
            ) from exc
        finally:
            if claim is not None:
                os.close(claim)
                self._claimed.discard(header.id)

    async def read_blob(self, session_id: str, sha256: str) -> bytes:
        """The checked bytes of the image blob ``sha256`` of the session (``blobs/<sha256>``, session/_blobs.py)."""
        validate_session_id(session_id)
        return await read_blob_file_async(str(self.path_of(session_id).parent), sha256, session_id)

    # ------------------------------------------------------------ internals

    def _describe(self, path: Path) -> str:
        try:
            return _kind(os.lstat(path).st_mode)
        except OSError as exc:
            return f"unreadable ({_reason(exc)})"

    def _not_a_directory(self, session_id: str, directory: Path) -> SessionStoreError:
        try:
            kind = _kind(os.lstat(directory).st_mode)
        except OSError:
            return SessionStoreError(f"the session store {self.root} is not a directory", path=str(self.root))
        return SessionStoreError(
            f"{directory} is {kind}, not a directory; refusing to use it for session {session_id!r} "
            "(this store never creates one: remove it, or use another session id)",
            path=str(directory),
        )

    def _open_log(self, session_id: str, *, write: bool) -> tuple[int, int, Path]:
        """Open (and with ``write`` lock) a stored log; returns ``(fd, size, path)``."""
        path = self.path_of(session_id)
        try:
            dir_fd = os.open(path.parent, _DIR_FLAGS)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no stored session {session_id!r} (looked for {path})") from None
        except OSError as exc:
            if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                raise self._not_a_directory(session_id, path.parent) from None
            raise SessionStoreError(
                f"cannot open the directory of session {session_id!r}, {path.parent}: {_reason(exc)}",
                path=str(path.parent),
            ) from exc
        try:
            fd = os.open(LOG_NAME, _APPEND_FLAGS if write else _READ_FLAGS, dir_fd=dir_fd)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no stored session {session_id!r} (looked for {path})") from None
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise SessionStoreError(
                    f"{path} is a symbolic link; refusing to follow it (the log of session {session_id!r} "
                    "must be a regular file)",
                    path=str(path),
                ) from None
            raise SessionStoreError(
                f"cannot open the log of session {session_id!r}, {path}: {_reason(exc)}", path=str(path)
            ) from exc
        finally:
            os.close(dir_fd)
        try:
            if write:
                self._lock(fd, session_id, path)
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise SessionStoreError(
                    f"{path} is {_kind(info.st_mode)}, not a regular file; refusing to read it as the log of "
                    f"session {session_id!r}",
                    path=str(path),
                )
            if info.st_size > self.max_log_bytes:
                raise SessionStoreError(
                    f"{path} is {info.st_size:,} bytes, more than the {self.max_log_bytes:,} bytes this store reads "
                    "(raise JsonlStore(max_log_bytes=...) to load it)",
                    path=str(path),
                )
        except BaseException:
            os.close(fd)
            raise
        return fd, info.st_size, path

    def _lock(self, fd: int, session_id: str, path: Path) -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if session_id in self._held:
                where = "is already live or being resumed in this process"
                advice = "dispose its agent first"
            else:
                where = "is live in another process"
                advice = "stop it there before resuming it here"
            raise SessionLockedError(
                f"session {session_id!r} {where} ({path} is locked by its writer); {advice}", path=str(path)
            ) from None
        except OSError as exc:
            raise SessionStoreError(
                f"cannot lock the log of session {session_id!r}, {path}: {_reason(exc)}", path=str(path)
            ) from exc

    def _parse(self, data: bytes, path: str, session_id: str) -> LoadedSession:
        loaded = parse_log(data, path)
        if loaded.header.id != session_id:
            # A copied or renamed directory: resuming it would append to the other session's file.
            raise SessionCorruptError(
                f"{path}:1: the header names session {loaded.header.id!r}, but the log is stored as {session_id!r}",
                path=path,
                line=1,
            )
        return loaded

    def _store_new_log(self, session_id: str, content: bytes, blobs: dict[str, bytes] | None = None) -> int:
        """Make ``content`` the log of a new session, atomically (blocking; any thread).

        The content is written to a temporary file in the session directory,
        synced and linked into place (refused if a log exists), then the
        directory is synced.  Returns the log's descriptor, holding the lock
        taken on the temporary file before anyone could see it (``flock``
        locks the file, not the name).  On failure nothing is left behind: no log, no temporary file, no
        descriptor, and a directory created for it is removed again.

        Raises:
            SessionExistsError: a log is stored under this id already.
            SessionStoreError: the session directory is a symbolic link or not a directory.
            OSError: the file system refused a step.
        """
        path = self.path_of(session_id)
        name = path.parent.name
        try:
            _make_private_dirs(self.root)
        except FileExistsError:
            raise SessionStoreError(f"the session store {self.root} is not a directory", path=str(self.root)) from None
        root_fd = os.open(self.root, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        created_dir = False
        dir_fd = fd = temp = None
        linked = False
        try:
            try:
                os.mkdir(name, 0o700, dir_fd=root_fd)
                created_dir = True
                os.chmod(name, 0o700, dir_fd=root_fd)  # a umask such as 0o277 would leave it unwritable
            except FileExistsError:
                pass
            try:
                dir_fd = os.open(name, _DIR_FLAGS, dir_fd=root_fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise self._not_a_directory(session_id, path.parent) from None
                raise
            write_blob_files(dir_fd, blobs or {}, fsync=self.fsync)  # before the log that references them
            # A name of its own: a concurrent create of the same id must not touch this one.
            temp = f".{LOG_NAME}.{uuid.uuid4().hex}.tmp"
            fd = os.open(temp, _TEMP_FLAGS, 0o600, dir_fd=dir_fd)
            os.fchmod(fd, 0o600)  # and the log read-only for a later resume
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # a fresh inode: nobody else has it
            _jsonl_files._write_all(fd, content)
            if self.fsync:
                os.fsync(fd)
            try:
                os.link(temp, LOG_NAME, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)  # fails if a log exists
            except FileExistsError:
                raise SessionExistsError(f"session {session_id!r} is already stored at {path}") from None
            linked = True
            os.unlink(temp, dir_fd=dir_fd)
            temp = None
            if self.fsync:
                os.fsync(dir_fd)  # the log's entry in its directory
                if created_dir:
                    os.fsync(root_fd)  # and the directory's in the root
        except BaseException:
            if linked:
                try:
                    os.unlink(LOG_NAME, dir_fd=dir_fd)
                except OSError:
                    pass
            if temp is not None:
                try:
                    os.unlink(temp, dir_fd=dir_fd)
                except OSError:
                    pass
            if fd is not None:
                os.close(fd)
            if created_dir:
                if dir_fd is not None:
                    discard_blob_files(dir_fd)  # written for the log that never appeared
                try:
                    os.rmdir(name, dir_fd=root_fd)  # only if still empty
                except OSError:
                    pass
            raise
        finally:
            if dir_fd is not None:
                os.close(dir_fd)
            os.close(root_fd)
        assert fd is not None
        return fd
