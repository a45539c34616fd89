"""Persistence providers: the protocol, and the in-memory provider."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import attrs

from .._errors import SessionExistsError, SessionNotFoundError
from ._events import Event, SessionHeader
from ._session import SessionWriter, validate_session_id

__all__ = ["LoadedSession", "MemoryPersistence", "SessionPersistence"]


@attrs.frozen
class LoadedSession:
    """A stored session as read back: its header and complete events.

    Attributes:
        header: the session header.
        events: every event whose line was complete, in order.
        dropped_tail: how many trailing bytes (a torn or uncommitted tail) were
            ignored; the writer cuts them off before its first append.
        valid_length: the byte length of the valid prefix of the file.
    """

    header: SessionHeader
    events: tuple[Event, ...]
    dropped_tail: int = 0
    valid_length: int = 0


class SessionPersistence(Protocol):
    """Where sessions are stored.  Implementations: memory and JSONL directory."""

    def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored."""
        ...

    def list(self) -> list[SessionHeader]:
        """The headers of every stored session, sorted by creation time."""
        ...

    async def load(self, session_id: str) -> LoadedSession:
        """Read a stored session.

        Raises:
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the log is damaged before its last committed turn.
        """
        ...

    def open_writer(self, header: SessionHeader, loaded: LoadedSession | None) -> SessionWriter:
        """A writer appending to this session (``loaded`` when resuming)."""
        ...

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Store a complete new session at once (used by fork).

        Raises:
            SessionExistsError: a session with this id is already stored.
        """
        ...


@attrs.define(eq=False)
class _MemoryWriter:
    store: MemoryPersistence
    header: SessionHeader

    def write(self, event: Event) -> None:
        record = self.store._sessions.get(self.header.id)
        if record is None:  # no entry before the first append
            record = self.store._sessions[self.header.id] = (self.header, [])
        record[1].append(event)

    async def flush(self, *, sync: bool = True) -> None:
        return None

    def close(self) -> None:
        return None


@attrs.define(eq=False)
class MemoryPersistence:
    """Sessions kept in this process's memory (tests, examples, ephemeral agents)."""

    _sessions: dict[str, tuple[SessionHeader, list[Event]]] = attrs.field(factory=dict, init=False)

    def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored."""
        return session_id in self._sessions

    def list(self) -> list[SessionHeader]:
        """The stored headers, oldest first."""
        return sorted((h for h, _ in self._sessions.values()), key=lambda h: (h.created_at, h.id))

    async def load(self, session_id: str) -> LoadedSession:
        """Return a stored session (events are immutable records, shared safely)."""
        validate_session_id(session_id)
        record = self._sessions.get(session_id)
        if record is None:
            raise SessionNotFoundError(f"no stored session {session_id!r}")
        return LoadedSession(header=record[0], events=tuple(record[1]))

    def open_writer(self, header: SessionHeader, loaded: LoadedSession | None) -> SessionWriter:
        """A writer appending to the in-memory record."""
        return _MemoryWriter(self, header)

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Store a whole session at once."""
        validate_session_id(header.id)
        if header.id in self._sessions:
            raise SessionExistsError(f"session {header.id!r} is already stored")
        self._sessions[header.id] = (header, list(events))
