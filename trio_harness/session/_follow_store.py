"""Following a session's stored events while another process appends (``harness.sessions.follow``).

A follower is read-only: it never takes the session, so it runs beside the
writer, in this process or any other sharing the store.  It yields every
stored event from ``start`` on, in ``seq`` order, each exactly once, then
waits for more:

* JSONL: the log file is read from where the follower stopped, every
  ``poll_interval`` seconds; only complete lines (ending in a newline) are
  read, so a line being written is read once it is whole.  A line that cannot
  be decoded is not read past: it may be a damaged tail that the next writer
  cuts off (see :mod:`._jsonl_parse`); one followed by a committed
  ``turn/end`` is a :exc:`SessionCorruptError`.  A log that was rewritten
  meanwhile -- replaced by another file (another inode), shrunk (a writer
  rewound a failed append, or cut a damaged tail off at a resume), or changed
  in place where the follower stopped -- is read again from its first line:
  the lines of the events already yielded must be there again, byte for byte
  (a follower waits while the log is shorter, as after a rewind the writer
  appends them again), and the follower goes on from the event it expects
  next; when they differ, the follower raises :exc:`SessionCorruptError`
  naming the first line that changed, never yielding an event twice or a
  replaced one.  The lines yielded are remembered by an 8-byte digest each;
  only the line where the follower stopped is checked at every read, so an
  edit of earlier lines that keeps the length and that line is not seen.
* PostgreSQL: the events from the last one yielded on are read, every
  ``poll_interval`` seconds (one indexed read; whole batches only, since a
  batch commits in one transaction).  The last event yielded must be stored
  as it was yielded: a server crash may lose a suffix of events committed
  without sync, which their writer stores again (the follower waits for it
  meanwhile); another writer storing other events there instead is a
  :exc:`SessionCorruptError` (only a suffix is ever lost, so an event
  yielded before the last one cannot have changed unless the last did).
* Any other store: :meth:`load` every ``poll_interval`` seconds.
"""

from __future__ import annotations

import hashlib
import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import attrs
import trio

from .._errors import EventDecodeError, SessionCorruptError, SessionNotFoundError
from ._codec import decode_event_line
from ._events import Event
from ._jsonl import JsonlStore
from ._jsonl_parse import _TURN_END_MARK, _is_turn_end
from ._persistence import SessionStore
from ._postgres import PostgresStore

DEFAULT_POLL_INTERVAL = 0.05
"""Seconds between two reads of the store when the follower has caught up."""

MAX_POLL_INTERVAL = 5.0
"""The longest interval a follower may ask for."""


def check_follow(start: object, poll_interval: object) -> None:
    """Refuse a bad offset or interval, naming it."""
    if isinstance(start, bool) or not isinstance(start, int) or start < 0:
        raise ValueError(f"start must be an event seq (an int >= 0), got {start!r}")
    if (
        isinstance(poll_interval, bool)
        or not isinstance(poll_interval, int | float)
        or not 0 < poll_interval <= MAX_POLL_INTERVAL
    ):
        raise ValueError(
            f"poll_interval must be a number of seconds in (0, {MAX_POLL_INTERVAL:g}], got {poll_interval!r}"
        )


@attrs.define(eq=False)
class SessionFollower:
    """An async iterator over one session's stored events (from :meth:`SessionRegistry.follow`).

    It holds nothing between two reads (no connection, no open file), so
    leaving its ``async for`` early needs no cleanup.
    """

    persistence: SessionStore
    session_id: str
    poll_interval: float
    is_live: Callable[[], bool]
    # The seq of the next event to yield.
    expected: int
    _checked: bool = attrs.field(default=False, init=False)
    # The events read and not yet yielded, each with its line (JSONL; b"" otherwise).
    _ready: deque[tuple[Event, bytes]] = attrs.field(factory=deque, init=False)
    # JSONL: the file read (device, inode), the bytes and lines of complete lines consumed (the header is
    # line 1), the last line consumed (checked where it was at every read) and the header line.
    _identity: tuple[int, int] | None = attrs.field(default=None, init=False)
    _offset: int = attrs.field(default=0, init=False)
    _lines: int = attrs.field(default=0, init=False)
    _last: bytes = attrs.field(default=b"", init=False)
    _header: bytes | None = attrs.field(default=None, init=False)
    # JSONL: the seq of the first event yielded, a digest of the line of each event yielded since (8
    # bytes each), and whether the log is being read again after a rewrite (those lines to check).
    _first: int = attrs.field(init=False)
    _yielded: bytearray = attrs.field(factory=bytearray, init=False)
    _again: bool = attrs.field(default=False, init=False)
    # PostgreSQL: the last event yielded (read again with the next rows: it must not have changed).
    _last_event: Event | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self._first = self.expected

    def __aiter__(self) -> SessionFollower:
        return self

    async def __anext__(self) -> Event:
        if not self._checked:
            if not self.is_live() and not await self.persistence.exists(self.session_id):
                raise SessionNotFoundError(f"no live or stored session {self.session_id!r} to follow")
            self._checked = True
        while not self._ready:
            if not await self._read():
                await trio.sleep(self.poll_interval)
        event, line = self._ready.popleft()
        self.expected = event.seq + 1
        self._last_event = event
        if line:
            self._yielded += _digest(line)
        return event

    async def _read(self) -> bool:
        """Queue what was stored since the last read; whether anything new was found."""
        if isinstance(self.persistence, JsonlStore):
            return await self._read_jsonl(self.persistence)
        if isinstance(self.persistence, PostgresStore):
            return await self._read_postgres(self.persistence)
        else:
            try:
                events: Sequence[Event] = (await self.persistence.load(self.session_id)).events[self.expected :]
            except SessionNotFoundError:
                events = ()  # live here, not stored yet
        return self._take(events)

    async def _read_postgres(self, store: PostgresStore) -> bool:
        """The rows from the last event yielded on: it must be stored as yielded (a log only loses a suffix)."""
        last = self._last_event
        events = await store.events_since(self.session_id, self.expected if last is None else last.seq)
        if last is not None:
            if not events or events[0].seq != last.seq:
                return False  # lost by a server crash: its writer stores it again, or another writes another
            if events[0] != last:
                where = f"{store.location}, session {self.session_id!r}"
                raise SessionCorruptError(
                    f"{where}: event {last.seq} is not the one this follower yielded (the events from it on were "
                    "lost by the server and stored again by another writer); follow it again (from start=0) to "
                    "read what is stored now",
                    path=where,
                    line=last.seq + 2,
                )
            events = events[1:]
        return self._take(events)

    def _take(self, events: Iterable[Event], lines: Sequence[bytes] = ()) -> bool:
        expected = self.expected
        for index, event in enumerate(events):
            if event.seq == expected:
                self._ready.append((event, lines[index] if lines else b""))
                expected += 1
        return bool(self._ready)

    async def _read_jsonl(self, store: JsonlStore) -> bool:
        path = str(store.path_of(self.session_id))
        read = await trio.to_thread.run_sync(_read_from, path, self._offset - len(self._last))
        if read is None:
            return False
        identity, size, data = read
        if self._identity is not None and (
            identity != self._identity or size < self._offset or not data.startswith(self._last)
        ):
            self._reread()  # rewritten meanwhile: read again from its first line
            read = await trio.to_thread.run_sync(_read_from, path, 0)
            if read is None:
                return False
            identity, size, data = read
        data = data[len(self._last) :]
        self._identity = identity
        end = data.rfind(b"\n")
        if end < 0:
            return False
        lines = data[:end].split(b"\n")
        events: list[Event] = []
        kept: list[bytes] = []
        for index, raw in enumerate(lines):
            number = self._lines + 1
            if number == 1:
                self._check_header(path, raw)
            else:
                try:
                    event = decode_event_line(raw)
                except EventDecodeError as exc:
                    damaged = any(_TURN_END_MARK in later and _is_turn_end(later) for later in lines[index + 1 :])
                    if damaged and not events:  # (the events before it are yielded first)
                        raise SessionCorruptError(
                            f"{path}:{number}: {exc} (the log is damaged before its last committed turn)",
                            path=path,
                            line=number,
                        ) from exc
                    break  # maybe a damaged tail the next writer cuts off: not read past
                line = raw + b"\n"
                if self._again:
                    self._check_again(path, number, event, line)
                events.append(event)
                kept.append(line)
            self._offset += len(raw) + 1
            self._lines = number
            self._last = raw + b"\n"
        return self._take(events, kept)

    def _reread(self) -> None:
        """Start reading the log again from its first line, checking the lines of the events yielded."""
        self._identity, self._offset, self._lines, self._last = None, 0, 0, b""
        self._again = self.expected > self._first

    def _check_header(self, path: str, raw: bytes) -> None:
        if self._header is not None and raw != self._header and self.expected > self._first:
            raise self._rewritten(path, 1, "its header changed (another session under this id)")
        self._header = raw

    def _check_again(self, path: str, number: int, event: Event, line: bytes) -> None:
        """(re-reading after a rewrite) The line of an event yielded before must be the one yielded."""
        seq = event.seq
        if seq < self._first:
            return
        index = (seq - self._first) * _DIGEST_SIZE
        if seq >= self.expected or self._yielded[index : index + _DIGEST_SIZE] != _digest(line):
            raise self._rewritten(path, number, f"event {seq} is not the one it yielded")
        if seq == self.expected - 1:
            self._again = False

    def _rewritten(self, path: str, number: int, what: str) -> SessionCorruptError:
        return SessionCorruptError(
            f"{path}:{number}: the log of session {self.session_id!r} was rewritten while it was followed and "
            f"{what}; follow it again (from start=0) to read what is stored now",
            path=path,
            line=number,
        )


_DIGEST_SIZE = 8


def _digest(line: bytes) -> bytes:
    return hashlib.blake2b(line, digest_size=_DIGEST_SIZE).digest()


def _read_from(path: str, offset: int) -> tuple[tuple[int, int], int, bytes] | None:
    """(worker thread) The identity (device, inode) and size of ``path``, and its bytes from ``offset`` on.

    None if it does not exist yet.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        info = os.fstat(fd)
        identity, size = (info.st_dev, info.st_ino), info.st_size
        if size <= offset:
            return identity, size, b""
        chunks = []
        position = offset
        while position < size:
            chunk = os.pread(fd, min(size - position, 1 << 20), position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
        return identity, size, b"".join(chunks)
    finally:
        os.close(fd)
