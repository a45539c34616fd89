"""The JSONL directory store: one directory per session, one JSON line per event.

Layout under the root::

    <root>/<escaped session id>/session.jsonl

The first line is the header, every later line one event.  No file exists
before the first flush; the writer only appends, batching lines in memory and
writing + ``fsync``-ing them at :meth:`flush` (the driver flushes at every turn
end).  A flush that returned is durable even if the process is killed next.

Loading is tolerant exactly where a crash can leave damage and strict
elsewhere: a torn last line (no newline) is dropped, and so is a bad line after
the last committed ``turn/end``; a bad line before it is a
:class:`SessionCorruptError` naming the file and line.  A failed load changes
nothing on disk; a writer resuming a log with a dropped tail cuts the tail off
before its first append.
"""

from __future__ import annotations

import errno
import fcntl
import logging
import os
import string
import urllib.parse
import uuid
from collections.abc import Sequence
from pathlib import Path

import attrs
import trio

from .._errors import (
    EventDecodeError,
    InvalidSessionIdError,
    SessionCorruptError,
    SessionError,
    SessionExistsError,
    SessionNotFoundError,
)
from ._codec import decode_event, decode_event_line, decode_header, encode_event, encode_header
from ._events import Event, SessionHeader, TurnEnd
from ._persistence import LoadedSession
from ._session import SessionWriter, validate_session_id

__all__ = ["JsonlPersistence", "escape_session_id", "unescape_session_id"]

log = logging.getLogger("trio_harness.session.jsonl")

LOG_NAME = "session.jsonl"
_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_TURN_END_MARK = b'"type":"turn/end"'


def escape_session_id(session_id: str) -> str:
    """Map a session id to a directory name, one-to-one.

    Letters, digits, ``_`` and ``-`` stand for themselves; every other
    character becomes ``%XX`` per UTF-8 byte, so the result never contains a
    path separator, never starts with ``.`` and decodes back uniquely.
    """
    validate_session_id(session_id)
    out = []
    for char in session_id:
        if char in _SAFE:
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    name = "".join(out)
    if len(name.encode()) > 255:
        raise InvalidSessionIdError(f"session id {session_id!r} is too long to store as a directory name")
    return name


def unescape_session_id(name: str) -> str:
    """Invert :func:`escape_session_id`."""
    return urllib.parse.unquote(name, errors="strict")


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        written = os.write(fd, view)
        view = view[written:]


@attrs.define(eq=False)
class _JsonlWriter:
    path: Path
    header: SessionHeader
    fsync: bool
    # Byte length to cut the file to before the first append (resume of a torn log).
    truncate_to: int | None
    new: bool
    # Byte length of the file when it was loaded (resume): a file that changed
    # since then was written by someone else, and appending would duplicate seqs.
    expected_length: int | None = None
    # fsync on the event loop's thread instead of a worker thread.
    inline_fsync: bool = False
    _buffer: list[str] = attrs.field(factory=list, init=False)
    _fd: int | None = attrs.field(default=None, init=False)
    # Length of the file as far as this writer knows it is good.
    _length: int = attrs.field(default=0, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    # Written by a flush(sync=False) and not yet fsynced.
    _unsynced: bool = attrs.field(default=False, init=False)

    def write(self, event: Event) -> None:
        self._buffer.append(encode_event(event))

    def _open(self) -> int:
        if self.new:
            self.path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_CLOEXEC, 0o600)
            except FileExistsError:
                raise SessionExistsError(f"session {self.header.id!r} is already stored at {self.path}") from None
            self._length = 0
        else:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CLOEXEC)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise SessionError(f"session {self.header.id!r} is open for writing in another process") from None
            raise
        if not self.new:
            self._length = os.fstat(fd).st_size  # under the lock: nobody appends meanwhile
            if self.expected_length is not None and self._length != self.expected_length:
                os.close(fd)
                raise SessionError(
                    f"session {self.header.id!r} was written by another writer since it was loaded "
                    f"({self.path} is {self._length} bytes, was {self.expected_length}); resume it again"
                )
            self.expected_length = None  # checked once, at the first open
        if self.truncate_to is not None and self.truncate_to < self._length:
            os.ftruncate(fd, self.truncate_to)
            self._length = self.truncate_to
        if self.new:
            header = (encode_header(self.header) + "\n").encode()
            _write_all(fd, header)
            self._length = len(header)
            if self.fsync:
                os.fsync(fd)
                # The new file's entry in its directory, and the directory's in the root.
                for directory in (self.path.parent, self.path.parent.parent):
                    dir_fd = os.open(directory, os.O_RDONLY)
                    try:
                        os.fsync(dir_fd)
                    finally:
                        os.close(dir_fd)
        return fd

    async def flush(self, *, sync: bool = True) -> None:
        async with self._lock:
            if not self._buffer:
                if sync and self._unsynced:
                    await self._sync()
                return
            lines = self._buffer
            self._buffer = []
            try:
                if self._fd is None:
                    self._fd = self._open()
                data = ("\n".join(lines) + "\n").encode("utf-8")
                try:
                    _write_all(self._fd, data)
                except BaseException:
                    os.ftruncate(self._fd, self._length)  # never leave half a batch behind
                    raise
                self._length += len(data)
            except BaseException:
                self._buffer[:0] = lines
                raise
            self._unsynced = True
            if sync:
                await self._sync()

    async def _sync(self) -> None:
        assert self._fd is not None
        if self.fsync:
            if self.inline_fsync:
                os.fsync(self._fd)
                await trio.lowlevel.checkpoint()
            else:
                await trio.to_thread.run_sync(os.fsync, self._fd)
        self._unsynced = False

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


def _absolute_path(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().resolve()


@attrs.define(eq=False)
class JsonlPersistence:
    """Sessions stored as JSONL files in one directory per session under ``root``.

    Args:
        root: the directory holding the session directories (created on demand).
        fsync: ``fsync`` on every flush (turn off only for throwaway data).
        inline_fsync: run that ``fsync`` on the event loop's thread.  It saves
            the hand-off to a worker thread (about 85 us a flush here) at the
            cost of blocking the loop while the disk syncs: worth it for a
            process with few agents on a fast local disk, not on a slow or
            network file system.  Off by default.
    """

    root: Path = attrs.field(converter=_absolute_path)
    fsync: bool = True
    inline_fsync: bool = False
    _writers: dict[str, _JsonlWriter] = attrs.field(factory=dict, init=False)

    def path_of(self, session_id: str) -> Path:
        """The log file of ``session_id`` (which need not exist)."""
        path = self.root / escape_session_id(session_id) / LOG_NAME
        # Escaping guarantees this; checked anyway so no bug can write outside the root.
        if path.parent.parent != self.root:
            raise InvalidSessionIdError(f"session id {session_id!r} escapes the store root")
        return path

    def exists(self, session_id: str) -> bool:
        """Whether a log file is stored for this id."""
        return self.path_of(session_id).is_file()

    def list(self) -> list[SessionHeader]:
        """Headers of every stored session, oldest first; unreadable ones are logged and skipped."""
        headers = []
        if not self.root.is_dir():
            return []
        for entry in self.root.iterdir():
            path = entry / LOG_NAME
            if not path.is_file():
                continue
            try:
                with path.open("rb") as f:
                    first = f.readline()
                if not first.endswith(b"\n"):
                    continue  # header never completed: nothing committed
                headers.append(decode_header(first))
            except (OSError, SessionError) as exc:
                log.warning("skipping unreadable session log %s: %s", path, exc)
        return sorted(headers, key=lambda h: (h.created_at, h.id))

    async def load(self, session_id: str) -> LoadedSession:
        """Read a stored session back (see the module docs for what is tolerated)."""
        path = self.path_of(session_id)
        try:
            data = await trio.to_thread.run_sync(path.read_bytes)
        except FileNotFoundError:
            raise SessionNotFoundError(f"no stored session {session_id!r} (looked for {path})") from None
        loaded = parse_log(data, str(path))
        if loaded.header.id != session_id:
            # A copied or renamed directory: resuming it would append to the other session's file.
            raise SessionCorruptError(
                f"{path}:1: the header names session {loaded.header.id!r}, but the log is stored as {session_id!r}",
                path=str(path),
                line=1,
            )
        return loaded

    def open_writer(self, header: SessionHeader, loaded: LoadedSession | None) -> SessionWriter:
        """A writer appending to the session's log file."""
        path = self.path_of(header.id)
        truncate = loaded.valid_length if loaded is not None and loaded.dropped_tail else None
        expected = loaded.valid_length + loaded.dropped_tail if loaded is not None else None
        return _JsonlWriter(
            path=path,
            header=header,
            fsync=self.fsync,
            truncate_to=truncate,
            new=loaded is None,
            expected_length=expected,
            inline_fsync=self.inline_fsync,
        )

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Write a whole new session at once (atomically, via a temporary file)."""
        path = self.path_of(header.id)
        lines = [encode_header(header), *(encode_event(e) for e in events)]
        data = ("\n".join(lines) + "\n").encode("utf-8")

        def write() -> None:
            path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            if path.exists():
                raise SessionExistsError(f"session {header.id!r} is already stored at {path}")
            # A name of its own: a concurrent save of the same id must not truncate this one.
            tmp = path.with_name(f".{LOG_NAME}.{uuid.uuid4().hex}.tmp")
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
            try:
                _write_all(fd, data)
                if self.fsync:
                    os.fsync(fd)
            finally:
                os.close(fd)
            try:
                os.link(tmp, path)  # fails if the log appeared meanwhile
            except FileExistsError:
                raise SessionExistsError(f"session {header.id!r} is already stored at {path}") from None
            finally:
                tmp.unlink()

        await trio.to_thread.run_sync(write)


def parse_log(data: bytes, path: str) -> LoadedSession:
    """Parse the bytes of a session log (see the module docs).

    Raises:
        SessionCorruptError: the header is incomplete or damaged, or a line
            before the last committed ``turn/end`` is bad.
        UnsupportedFormatError: the header names another format version.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # the bytes after the last newline: a torn line, or b""
    if not lines:
        raise SessionCorruptError(f"{path}:1: the session header is incomplete", path=path, line=1)
    try:
        header = decode_header(lines[0])
    except EventDecodeError as exc:
        raise SessionCorruptError(f"{path}:1: {exc}", path=path, line=1) from exc
    offset = len(lines[0]) + 1
    events: list[Event] = []
    for index in range(1, len(lines)):
        raw = lines[index]
        try:
            event = decode_event_line(raw)
            if event.seq != len(events):
                raise EventDecodeError(f"event seq {event.seq} where {len(events)} was expected")
        except EventDecodeError as exc:
            if any(_TURN_END_MARK in later and _is_turn_end(later) for later in lines[index + 1 :]):
                raise SessionCorruptError(
                    f"{path}:{index + 1}: {exc} (the log is damaged before its last committed turn; "
                    "repair or remove the file)",
                    path=path,
                    line=index + 1,
                ) from exc
            dropped = len(data) - offset
            log.warning(
                "%s:%d: dropping %d uncommitted bytes after the last turn end: %s", path, index + 1, dropped, exc
            )
            return LoadedSession(header=header, events=tuple(events), dropped_tail=dropped, valid_length=offset)
        events.append(event)
        offset += len(raw) + 1
    return LoadedSession(header=header, events=tuple(events), dropped_tail=len(tail), valid_length=offset)


def _is_turn_end(raw: bytes) -> bool:
    try:
        return isinstance(decode_event(raw), TurnEnd)
    except EventDecodeError:
        return False
