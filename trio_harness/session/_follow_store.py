"""Following a session's stored events while another process appends (``harness.sessions.follow``).

A follower is read-only: it never takes the session, so it runs beside the
writer, in this process or any other sharing the store.  It yields every
stored event from ``start`` on, in ``seq`` order, each exactly once, then
waits for more:

* JSONL: the log file is read from where the follower stopped, every
  ``poll_interval`` seconds; only complete lines (ending in a newline) are
  read, so a line being written is read once it is whole.  A log that shrinks
  (a writer rewound a failed append) is read again from the event the
  follower expects next.
* PostgreSQL: the events from the next ``seq`` on are read, every
  ``poll_interval`` seconds (one indexed read; whole batches only, since a
  batch commits in one transaction).
* Any other store: :meth:`load` every ``poll_interval`` seconds.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Sequence

import attrs
import trio

from .._errors import EventDecodeError, SessionCorruptError, SessionNotFoundError
from ._codec import decode_event_line
from ._events import Event
from ._jsonl import JsonlStore
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
    _ready: deque[Event] = attrs.field(factory=deque, init=False)
    # JSONL: bytes and lines of complete lines consumed (the header is line 1).
    _offset: int = attrs.field(default=0, init=False)
    _lines: int = attrs.field(default=0, init=False)

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
        event = self._ready.popleft()
        self.expected = event.seq + 1
        return event

    async def _read(self) -> bool:
        """Queue what was stored since the last read; whether anything new was found."""
        if isinstance(self.persistence, JsonlStore):
            return await self._read_jsonl(self.persistence)
        if isinstance(self.persistence, PostgresStore):
            events: Sequence[Event] = await self.persistence.events_since(self.session_id, self.expected)
        else:
            try:
                events = (await self.persistence.load(self.session_id)).events[self.expected :]
            except SessionNotFoundError:
                events = ()  # live here, not stored yet
        return self._take(events)

    def _take(self, events: Iterable[Event]) -> bool:
        expected = self.expected
        for event in events:
            if event.seq == expected:
                self._ready.append(event)
                expected += 1
        return bool(self._ready)

    async def _read_jsonl(self, store: JsonlStore) -> bool:
        path = str(store.path_of(self.session_id))
        read = await trio.to_thread.run_sync(_read_from, path, self._offset)
        if read is None:
            return False
        data, size = read
        if size < self._offset:  # a writer rewound a failed append: read again from the top
            self._offset = self._lines = 0
            return False
        end = data.rfind(b"\n")
        if end < 0:
            return False
        events = []
        for raw in data[:end].split(b"\n"):
            self._offset += len(raw) + 1
            self._lines += 1
            if self._lines == 1:
                continue  # the header
            try:
                events.append(decode_event_line(raw))
            except EventDecodeError as exc:
                raise SessionCorruptError(f"{path}:{self._lines}: {exc}", path=path, line=self._lines) from exc
        return self._take(events)


def _read_from(path: str, offset: int) -> tuple[bytes, int] | None:
    """(worker thread) The bytes of ``path`` from ``offset`` on, and its size; None if it does not exist yet."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    try:
        size = os.fstat(fd).st_size
        if size <= offset:
            return b"", size
        chunks = []
        position = offset
        while position < size:
            chunk = os.pread(fd, min(size - position, 1 << 20), position)
            if not chunk:
                break
            chunks.append(chunk)
            position += len(chunk)
        return b"".join(chunks), size
    finally:
        os.close(fd)
