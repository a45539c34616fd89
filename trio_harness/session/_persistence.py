"""Persistence providers: the protocol, and the in-memory provider."""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from typing import ClassVar, Protocol, TypeGuard, runtime_checkable

import attrs

from .._errors import SessionExistsError, SessionLockedError, SessionNotFoundError, SessionStoreError
from ._events import Event, InboxMessage, SessionHeader
from ._session import SessionWriter, validate_session_id


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


class SessionStore(Protocol):
    """Where sessions are stored.  Implementations: memory, JSONL directory, PostgreSQL.

    One writer at a time: a session is *held* by the writer that created it
    (from its first successful flush) or resumed it (from :meth:`resume`) until
    that writer is closed; nobody else can resume it meanwhile.
    """

    async def check(self) -> None:
        """Check that sessions can be stored here (run before any model call).

        Raises:
            SessionStoreError: naming the store and what is wrong with it.
        """
        ...

    async def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored."""
        ...

    async def list(self) -> list[SessionHeader]:
        """The headers of every stored session, sorted by creation time (then id)."""
        ...

    async def load(self, session_id: str) -> LoadedSession:
        """Read a stored session (read-only: it may be live elsewhere).

        Raises:
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the log is damaged before its last committed turn.
        """
        ...

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        """A writer for a new session, claiming its id; nothing is stored before its first flush.

        The claim is the same-id arbitration of creates: it is taken here,
        before the creator runs anything, and held until the first flush has
        stored the session (which is held by the writer from then on) or the
        writer is closed.  That flush stores the header and the buffered
        events together (or fails with :exc:`SessionExistsError` when a
        provider that could not claim the id finds it stored meanwhile).  A
        writer closed before any flush leaves nothing behind and frees the id.

        Raises:
            SessionExistsError: the id is stored already, or claimed by
                another writer creating it (in this process or another).
        """
        ...

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        """Take a stored session for writing and read it.

        The returned writer holds the session until it is closed
        (:meth:`SessionWriter.aclose`); the log is read after the session was
        taken, so nobody can append in between.

        Raises:
            SessionLockedError: another writer holds the session (it is live
                in another process).
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the log is damaged before its last committed turn.
        """
        ...

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Store a complete new session at once (used by fork).

        Raises:
            SessionExistsError: a session with this id is already stored.
        """
        ...


@runtime_checkable
class RemoteInbox(Protocol):
    """A store that keeps messages posted to a session until its holder takes them (PostgreSQL).

    :meth:`SessionRegistry.post <trio_harness.session.SessionRegistry.post>` uses
    it; a store without it delivers only to agents live in this process.
    """

    async def post(self, session_id: str, message: InboxMessage) -> None:
        """Store ``message`` for the session and wake whoever holds it.

        Raises:
            SessionNotFoundError: nothing is stored under this id.
        """
        ...


@runtime_checkable
class MailboxWriter(Protocol):
    """A writer that receives the messages posted to its session (see :class:`RemoteInbox`)."""

    def receive(self, on_mail: Callable[[], Awaitable[None]]) -> None:
        """Call ``on_mail`` (in the store's service) now and whenever messages may be waiting."""
        ...

    async def take_mail(self) -> list[tuple[int, InboxMessage]]:
        """The waiting messages not taken yet, oldest first, with their mailbox ids."""
        ...

    def ack_mail(self, mail_ids: Sequence[int]) -> None:
        """These were spliced into the inbox: remove them in the transaction of the next flush."""
        ...

    def release_mail(self, mail_ids: Sequence[int]) -> None:
        """These were not delivered: leave them for later."""
        ...


# The members of MailboxWriter, checked by has_mailbox.
MAILBOX_METHODS = ("receive", "take_mail", "ack_mail", "release_mail")


def has_mailbox(writer: object) -> TypeGuard[MailboxWriter]:
    """``isinstance(writer, MailboxWriter)``, checked the same way (each member present).

    Python 3.11's runtime protocol check walks the protocol's members on every
    call (about 12 us, 5% of creating and disposing an agent); this reads the
    four attributes.
    """
    return all(getattr(writer, name, None) is not None for name in MAILBOX_METHODS)


@runtime_checkable
class ServerSideFork(Protocol):
    """A store that copies a fork's events itself instead of being sent them (PostgreSQL)."""

    async def copy_prefix(self, source: str, boundary: int, child: SessionHeader) -> bool:
        """Store ``child`` with ``source``'s first ``boundary`` stored events; False if fewer are stored.

        Raises:
            SessionExistsError: ``child`` is already stored.
        """
        ...


@attrs.define(eq=False)
class _MemoryWriter:
    store: MemoryStore
    header: SessionHeader
    # The events stored already (resume); None until the first flush of a new session.
    _record: list[Event] | None
    _buffer: list[Event] = attrs.field(factory=list, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # flush() never awaits anything (Session.flush_waits).
    flush_never_waits: ClassVar[bool] = True

    def write(self, event: Event) -> None:
        self._buffer.append(event)

    async def flush(self, *, sync: bool = True) -> None:
        if not self._buffer:
            return
        if self._closed:
            raise SessionStoreError(f"the writer of session {self.header.id!r} is closed", path=None)
        if self._record is None:
            # The record appears only now, whole: nothing of a discarded
            # preparation ever reaches it.
            if self.header.id in self.store._sessions:
                raise SessionExistsError(f"session {self.header.id!r} is already stored")
            self._record = list(self._buffer)
            self.store._sessions[self.header.id] = (self.header, self._record)
            self.store._held[self.header.id] = self
            if self.store._claims.get(self.header.id) is self:
                del self.store._claims[self.header.id]  # stored and held from now on
        else:
            self._record.extend(self._buffer)
        self._buffer = []

    async def aclose(self) -> None:
        self._closed = True
        self._buffer = []
        if self.store._held.get(self.header.id) is self:
            del self.store._held[self.header.id]
        if self.store._claims.get(self.header.id) is self:
            del self.store._claims[self.header.id]


@attrs.define(eq=False)
class MemoryStore:
    """Sessions kept in this process's memory (tests, examples, ephemeral agents).

    Like the JSONL store, a new session's record appears at its first flush,
    its id is claimed from :meth:`open_writer` on (two harnesses sharing this
    object cannot both create it), and a session is held by one writer at a
    time (nor can they both resume it).
    """

    _sessions: dict[str, tuple[SessionHeader, list[Event]]] = attrs.field(factory=dict, init=False)
    # Session id -> the writer holding it.
    _held: dict[str, _MemoryWriter] = attrs.field(factory=dict, init=False)
    # Session id -> the writer of a new session that claimed it and has not stored it yet.
    _claims: dict[str, _MemoryWriter] = attrs.field(factory=dict, init=False)

    async def check(self) -> None:
        """Nothing to check: memory is always writable."""

    async def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored.

        Raises:
            InvalidSessionIdError: the id is unusable (as in every store).
        """
        return validate_session_id(session_id) in self._sessions

    async def list(self) -> list[SessionHeader]:
        """The stored headers, oldest first."""
        return sorted((h for h, _ in self._sessions.values()), key=lambda h: (h.created_at, h.id))

    async def load(self, session_id: str) -> LoadedSession:
        """Return a stored session (events are immutable records, shared safely)."""
        validate_session_id(session_id)
        record = self._sessions.get(session_id)
        if record is None:
            raise SessionNotFoundError(f"no stored session {session_id!r}")
        return LoadedSession(header=record[0], events=tuple(record[1]))

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        """Claim the id and return a writer buffering in memory; the record is created at its first flush.

        Raises:
            SessionExistsError: the id is stored, or claimed by another writer.
        """
        session_id = validate_session_id(header.id)
        if session_id in self._sessions:
            raise SessionExistsError(f"session {session_id!r} is already stored")
        if session_id in self._claims:
            raise SessionExistsError(
                f"session {session_id!r} already exists: another writer of this store is creating it"
            )
        writer = _MemoryWriter(self, header, None)
        self._claims[session_id] = writer
        return writer

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        """Take a stored session and return it with a writer appending to its record."""
        loaded = await self.load(session_id)
        if session_id in self._held:
            raise SessionLockedError(
                f"session {session_id!r} is already live in another harness using this store",
                path=":memory:",
            )
        writer = _MemoryWriter(self, loaded.header, self._sessions[session_id][1])
        self._held[session_id] = writer
        return loaded, writer

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Store a whole session at once."""
        validate_session_id(header.id)
        if header.id in self._sessions:
            raise SessionExistsError(f"session {header.id!r} is already stored")
        if header.id in self._claims:
            raise SessionExistsError(f"session {header.id!r} already exists: another writer is creating it")
        self._sessions[header.id] = (header, list(events))
