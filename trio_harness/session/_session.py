"""A session: a header and an append-only, immutable event log."""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import attrs

from .._errors import HarnessError, InvalidSessionIdError, SessionStoreError
from .._records import plain_constructor
from ._events import EVENT_TYPES, Event, SessionHeader

__all__ = ["Session", "SessionWriter", "validate_session_id"]

log = logging.getLogger("trio_harness.session")

E = TypeVar("E", bound=Event)

MAX_SESSION_ID_LENGTH = 200

# Event classes whose first two parameters are seq and ts (all of the library's):
# append passes those two by position, which is cheaper than by keyword, to the
# class's plain constructor (the same object, built without attrs' per-field
# ``object.__setattr__``; see ``plain_constructor``) or else to the class.
# (Typed as returning Any: each builds an instance of its key, which append returns as E.)
_CONSTRUCTORS: dict[type[Event], Callable[..., Any]] = {
    cls: plain_constructor(cls) or cls
    for cls in EVENT_TYPES
    if [(f.name, f.kw_only) for f in attrs.fields(cls)[:2]] == [("seq", False), ("ts", False)]
}

# Ids made only of these characters need no per-character checks.
_PLAIN_ID = re.compile(r"[A-Za-z0-9_.:@+=-]+")


def validate_session_id(session_id: object) -> str:
    """Check that ``session_id`` can name a session, and return it.

    A session id is a non-empty string of at most 200 characters with no path
    separator, no NUL or other control character, and not ``.`` or ``..``.

    Raises:
        InvalidSessionIdError: naming what is wrong with the id.
    """
    if not isinstance(session_id, str):
        raise InvalidSessionIdError(f"a session id must be a string, got {type(session_id).__name__}")
    if not session_id:
        raise InvalidSessionIdError("a session id must not be empty")
    if len(session_id) > MAX_SESSION_ID_LENGTH:
        raise InvalidSessionIdError(
            f"session id {session_id[:40]!r}... is {len(session_id)} characters; at most {MAX_SESSION_ID_LENGTH}"
        )
    if "/" in session_id or "\\" in session_id:
        raise InvalidSessionIdError(f"session id {session_id!r} contains a path separator")
    if session_id in (".", ".."):
        raise InvalidSessionIdError(f"session id {session_id!r} is a relative path component")
    if _PLAIN_ID.fullmatch(session_id):  # the common case: nothing more to check
        return session_id
    for char in session_id:
        if char == "\x00":
            raise InvalidSessionIdError(f"session id {session_id!r} contains a NUL character")
        if ord(char) < 0x20 or ord(char) == 0x7F:
            raise InvalidSessionIdError(f"session id {session_id!r} contains a control character")
        if 0xD800 <= ord(char) <= 0xDFFF:
            # Not encodable as UTF-8: it could be neither escaped nor written to a log.
            raise InvalidSessionIdError(f"session id {session_id!r} contains a lone surrogate")
    return session_id


class SessionWriter(Protocol):
    """Where a session's appends go: buffered by ``write``, made durable by ``flush``.

    A writer whose ``flush`` never awaits anything may say so with a class
    attribute ``flush_never_waits = True`` (the in-memory store's does):
    :attr:`Session.flush_waits` is then False, and the driver skips the cancel
    shield around a turn's final flushes, which nothing could cancel anyway.
    """

    def write(self, event: Event) -> None:
        """Buffer one event (must not block)."""
        ...

    async def flush(self, *, sync: bool = True) -> None:
        """Write every buffered event; with ``sync``, make it durable before returning.

        ``sync=False`` writes without forcing the data to disk: the driver uses
        it to learn that the store takes the turn's events before it logs the
        turn's end.  On failure the buffered events must stay buffered, so a
        later flush retries them.
        """
        ...

    async def aclose(self) -> None:
        """Release the writer's resources and the session it holds (after a final flush).

        Never fails and returns promptly: a store that must reach a server to
        release the session (PostgreSQL) does so within a bounded time and
        otherwise drops the connection, which releases it as well.
        """
        ...


@attrs.define(eq=False, repr=False)
class Session:
    """A session's header and its append-only event log.

    ``seq`` of every event equals its index.  Events are immutable attrs
    records; :meth:`append` assigns ``seq`` and ``ts``, hands the event to the
    persistence writer, stores it and then tells the observers (whose errors
    are logged and contained).
    """

    header: SessionHeader
    # The log; never shrinks, never mutated in place.
    _events: list[Event] = attrs.field(alias="events")
    _writer: SessionWriter | None = attrs.field(default=None, alias="writer")
    _clock: Callable[[], float] = attrs.field(default=time.time, alias="clock")
    _observers: list[Callable[[Event], None]] = attrs.field(factory=list, init=False)
    # The error of the last flush when it failed and no flush succeeded since.
    _store_failure: SessionStoreError | None = attrs.field(default=None, init=False)
    # (seq, callback) pairs waiting for a flush that stores the event at seq (on_stored).
    _stored_waiters: list[tuple[int, Callable[[], None]]] = attrs.field(factory=list, init=False)
    # writer.write, bound once (append calls it for every event).
    _write: Callable[[Event], None] | None = attrs.field(init=False)

    @_write.default
    def _bind_write(self) -> Callable[[Event], None] | None:
        return self._writer.write if self._writer is not None else None

    def __repr__(self) -> str:
        return f"<Session {self.header.id!r} events={len(self._events)}>"

    @property
    def id(self) -> str:
        """The session id."""
        return self.header.id

    @property
    def events(self) -> Sequence[Event]:
        """The event log (a read-only view; do not mutate)."""
        return self._events

    def __len__(self) -> int:
        return len(self._events)

    def append(self, cls: type[E], /, **fields: Any) -> E:
        """Append a new event of type ``cls`` built from ``fields``.

        Returns:
            The appended event, with ``seq`` equal to its index.
        """
        events = self._events
        construct = _CONSTRUCTORS.get(cls)
        if construct is not None:
            event: E = construct(len(events), self._clock(), **fields)
        else:
            event = cls(seq=len(events), ts=self._clock(), **fields)
        write = self._write
        if write is not None:
            write(event)
        events.append(event)
        observers = self._observers
        if not observers:
            return event
        for observer in tuple(observers):
            try:
                observer(event)
            except Exception:
                log.exception("session observer %r failed on %s", observer, event.type)
        return event

    def observe(self, observer: Callable[[Event], None]) -> Callable[[], None]:
        """Call ``observer(event)`` after every append; returns a remover.

        This is the low-level hook: the observer runs synchronously inside
        :meth:`append`, on the driver's hot path and in the shielded blocks
        that close a turn, so it **must not block** (it cannot await, and what
        it does delays the agent); its errors are logged and contained.  It
        sees every event in order.  To read events at the reader's own pace,
        use ``agent.events()``; to follow one prompt's turn, ``agent.follow()``
        (docs/long-sessions.rst, "Event streams").
        """
        self._observers.append(observer)

        def remove() -> None:
            try:
                self._observers.remove(observer)
            except ValueError:
                pass

        return remove

    def on_stored(self, seq: int, callback: Callable[[], None]) -> None:
        """Call ``callback()`` once a flush has stored the event at ``seq``.

        It runs synchronously at the end of the first successful :meth:`flush`
        that began after the event was appended (at once without a writer), in
        the order of ``seq``; it must not block or raise (an error is logged).
        A session that is never stored again never calls it: use it to act on
        a fact only after every other worker can see it (the splice of a
        message posted through the store, docs/postgres.rst).
        """
        if not 0 <= seq < len(self._events):
            raise ValueError(f"session {self.id!r} has no event at seq {seq}")
        if self._writer is None:
            self._call_stored(callback)
            return
        self._stored_waiters.append((seq, callback))

    def _call_stored(self, callback: Callable[[], None]) -> None:
        try:
            callback()
        except Exception:
            log.exception("session %r: a callback waiting for a flush failed", self.id)

    def _stored_through(self, length: int) -> None:
        waiters = self._stored_waiters
        while waiters and waiters[0][0] < length:
            self._call_stored(waiters.pop(0)[1])

    @property
    def flush_waits(self) -> bool:
        """Whether :meth:`flush` may wait (reach a Trio checkpoint, where it could be cancelled).

        False without a writer, or when the writer declares that its flush
        never waits (``flush_never_waits = True``, the in-memory store's).
        """
        writer = self._writer
        return writer is not None and not getattr(writer, "flush_never_waits", False)

    @property
    def store_failure(self) -> SessionStoreError | None:
        """Why the last flush failed, while events it could not store are still only in memory.

        None when the last flush succeeded (or none failed yet).
        """
        return self._store_failure

    async def flush(self, *, sync: bool = True) -> None:
        """Make every appended event durable (no-op without a writer).

        Args:
            sync: False to write without waiting for the disk (see
                :meth:`SessionWriter.flush`).

        Raises:
            SessionStoreError: the store did not take the events; they stay
                buffered and the next flush retries them.
        """
        if self._writer is None:
            return
        length = len(self._events)  # the writer holds every event appended so far
        try:
            await self._writer.flush(sync=sync)
        except SessionStoreError as exc:
            if exc.session_id == self.id:
                self._store_failure = exc
                raise
            failure = SessionStoreError(
                f"session {self.id!r} could not be stored: {exc}", session_id=self.id, path=exc.path
            )
            self._store_failure = failure
            raise failure from exc
        except (OSError, HarnessError) as exc:
            failure = SessionStoreError(
                f"session {self.id!r} could not be stored: {exc}",
                session_id=self.id,
                path=getattr(exc, "filename", None),
            )
            self._store_failure = failure
            raise failure from exc
        self._store_failure = None
        if self._stored_waiters:
            self._stored_through(length)
