"""The session registry (``harness.sessions``): the live sessions of this process, over a store.

Publication is split in steps (docs/guarantees.rst, "Publication"): *prepare*
builds a session that nobody can see (a fresh one, whose id the persistence
claims at ``open_writer``: the same-id arbitration of creates, before anything
runs; or one loaded and recovered from persistence); *enter* makes it live
under its id (a second live session with the same id is refused); *announce*
emits ``session/created``; *detach* flushes, removes exactly that entry and
emits ``session/disposed`` if it had been announced.
"""

from __future__ import annotations

import builtins
import functools
import logging
import os
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import attrs
import trio

from .._bus import EventBus
from .._errors import (
    AgentNotFoundError,
    ForkBoundaryError,
    HarnessError,
    SessionExistsError,
    SessionNotFoundError,
    SessionStoreError,
)
from ._blobs import resolve_images
from ._control import (
    VERDICTS,
    ApprovalDecisionLike,
    Control,
    check_pending,
    control_message,
    is_control,
    read_control,
    refuse_control,
)
from ._events import Event, InboxMessage, SendMode, SessionHeader
from ._follow_store import DEFAULT_POLL_INTERVAL, SessionFollower, check_follow
from ._persistence import RemoteInbox, ServerSideFork, SessionStore, has_mailbox
from ._recovery import closers_for, open_turn_at
from ._session import Session, SessionWriter, validate_session_id

log = logging.getLogger("trio_harness.session")

_SEND_MODES = ("followup", "steer", "inject")


@attrs.define(eq=False)
class SessionEntry:
    """One live publication of a session; detach is bound to this exact object."""

    session: Session
    writer: SessionWriter
    # Set once session/created was dispatched for this entry.
    announced: bool = False
    # Set when detach started; a second detach is a no-op.
    detached: bool = False
    # Splices a posted message into the live agent's inbox (set by the agent registry).
    receiver: Callable[[InboxMessage], object] | None = None
    # Applies a posted control; calls its second argument once the control took effect (its log events appended).
    control: Callable[[Any, Callable[[], None]], object] | None = None


@attrs.define(eq=False)
class SessionRegistry:
    """Live sessions of this process, over a :class:`~trio_harness.session.SessionStore`."""

    persistence: SessionStore
    bus: EventBus = attrs.field(factory=EventBus)
    clock: Callable[[], float] = time.time
    _live: dict[str, SessionEntry] = attrs.field(factory=dict, init=False)
    _writers: dict[Session, SessionWriter] = attrs.field(factory=dict, init=False)
    # Detach failures nobody has reported yet (see take_failure / take_unreported).
    _unreported: dict[SessionEntry, SessionStoreError] = attrs.field(factory=dict, init=False)

    # ------------------------------------------------------------ prepare

    async def check(self) -> None:
        """Check that the persistence can store sessions (before any model call).

        Raises:
            SessionStoreError: naming the store and what is wrong with it.
        """
        await self.persistence.check()

    async def prepare_new(
        self, session_id: str | None = None, *, cwd: str | None = None, parent_session: str | None = None
    ) -> Session:
        """Build a fresh session that is not live yet, claiming its id in the persistence.

        The claim is held until the session's first flush stored it, or until
        :meth:`discard`; meanwhile every other prepare of the id, in this
        process or another sharing the store, is refused.

        Raises:
            InvalidSessionIdError: the id is unusable.
            SessionExistsError: a session with this id is live, already
                stored, or being created (claimed by another writer).
            SessionStoreError: the store cannot hold this id (e.g. a symbolic
                link is planted where its directory belongs).
        """
        session_id = validate_session_id(session_id if session_id is not None else uuid.uuid4().hex)
        if session_id in self._live:
            raise SessionExistsError(f"session {session_id!r} already exists (it is live)")
        if await self.persistence.exists(session_id):
            raise SessionExistsError(f"session {session_id!r} already exists in the store; resume it instead")
        if session_id in self._live:  # went live while the store answered
            raise SessionExistsError(f"session {session_id!r} already exists (it is live)")
        header = SessionHeader(
            id=session_id,
            created_at=self.clock(),
            cwd=cwd if cwd is not None else os.getcwd(),
            parent_session=parent_session,
        )
        writer = await self.persistence.open_writer(header)
        session = Session(header=header, events=[], writer=writer, clock=self.clock)
        self._writers[session] = writer
        return session

    async def prepare_resume(self, session_id: str) -> Session:
        """Take and load a stored session, closing a turn that died mid-way, without making it live.

        The session is held (its log locked, for the JSONL store) from before
        it is read until it is discarded or detached, so no other process can
        resume it meanwhile.

        Raises:
            SessionExistsError: the session is live in this process.
            SessionLockedError: another writer holds it (live in another process).
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: the stored log is damaged.
        """
        validate_session_id(session_id)
        if session_id in self._live:
            raise SessionExistsError(f"session {session_id!r} is live; dispose its agent before resuming it")
        loaded, writer = await self.persistence.resume(session_id)
        try:
            events = await resolve_images(self.persistence, session_id, loaded.events)  # large images, read back
            session = Session(header=loaded.header, events=list(events), writer=writer, clock=self.clock)
            for cls, fields in closers_for(session.events):
                session.append(cls, **fields)
        except BaseException:
            with trio.CancelScope(shield=True):
                await writer.aclose()  # releases the session's lock
            raise
        self._writers[session] = writer
        return session

    async def discard(self, session: Session) -> None:
        """Drop a prepared session that will never be entered (releasing its lock; nothing is stored).

        Runs shielded: a cancelled caller still releases the session.
        """
        writer = self._writers.pop(session, None)
        if writer is not None:
            with trio.CancelScope(shield=True):
                await writer.aclose()

    # ------------------------------------------------------------ publish

    def enter(self, session: Session) -> SessionEntry:
        """Make a prepared session live under its id (no event is emitted).

        Raises:
            SessionExistsError: another session with this id is live.
        """
        if session.id in self._live:
            raise SessionExistsError(f"session {session.id!r} already exists (it is live)")
        writer = self._writers.pop(session, None)
        if writer is None:
            raise SessionExistsError(f"session {session.id!r} was not prepared by this store or was discarded")
        entry = SessionEntry(session=session, writer=writer)
        self._live[session.id] = entry
        if hasattr(writer, "on_restored"):  # a store that can lose acknowledged events and put them back
            writer.on_restored = functools.partial(self._restored, entry)
        return entry

    def _restored(self, entry: SessionEntry, count: int) -> None:
        self.bus.emit("session/restored", entry.session, events=count)

    def receive(
        self,
        entry: SessionEntry,
        deliver: Callable[[InboxMessage], object],
        control: Callable[[Any, Callable[[], None]], object] | None = None,
    ) -> None:
        """Route messages posted to ``entry``'s session (:meth:`post`) to ``deliver``.

        The agent registry passes the live agent's ``send``, and ``control``:
        ``control(control, applied)`` applies a posted cancel or decision
        (session/_control.py) and calls ``applied()`` once it took effect.  With a store that
        keeps posted messages (PostgreSQL), the ones waiting for the session
        (posted while nobody held it) are delivered now, in order, and later
        ones as they are posted.
        """
        entry.receiver = deliver
        entry.control = control
        if has_mailbox(entry.writer):
            entry.writer.receive(functools.partial(self._deliver_mail, entry))

    async def _deliver_mail(self, entry: SessionEntry) -> None:
        """Splice the messages waiting in the store into the live agent's inbox, durably and once.

        Each message is removed from the store's mailbox in the transaction
        that stores its splice, and the agent acts on it only after that
        commit (``deliver_posted``, :meth:`Session.on_stored`): a worker that
        lost the session in between never does, and the worker that took it
        over delivers the message instead.  A message the agent could not take
        (it is being disposed) stays in the mailbox for the next resume.
        """
        writer, deliver = entry.writer, entry.receiver
        if entry.detached or deliver is None or not has_mailbox(writer):
            return
        mail = await writer.take_mail()
        if self._live.get(entry.session.id) is not entry:  # detached meanwhile: the next resume delivers them
            writer.release_mail([mail_id for mail_id, _ in mail])
            return
        delivered: list[int] = []
        controls = self._log_unreadable(entry)
        try:
            for mail_id, message in mail:
                if self._apply_control(entry, mail_id, message):
                    controls = True  # acknowledged once applied, with the flush that stores its effect
                    continue
                try:
                    deliver(message)
                except HarnessError as exc:
                    log.info("session %r: posted message %s stays queued: %s", entry.session.id, message.id, exc)
                    break
                delivered.append(mail_id)
        finally:
            writer.ack_mail(delivered)
            writer.release_mail([mail_id for mail_id, m in mail if mail_id not in delivered and not is_control(m)])
        if delivered or controls:
            try:
                await entry.session.flush()
            except SessionStoreError as exc:
                # Kept on session.store_failure (the next flush, at the latest
                # the agent's disposal, raises it); the agent acts on the
                # messages only if a later flush stores them with the mailbox
                # delete, and another worker that took the session meanwhile
                # delivers them instead.
                log.warning("session %r: posted messages wait for a flush that stores them: %s", entry.session.id, exc)

    def _log_unreadable(self, entry: SessionEntry) -> bool:
        """Log in the session the mailbox rows the store found to be no message (whether there were any).

        The store acked them (removed with the next flush): each leaves a
        ``control/refused`` of kind ``unknown`` in that flush, for whoever
        follows the session, instead of only a log line.
        """
        unreadable: list[tuple[int, str]] | None = getattr(entry.writer, "unreadable", None)
        if not unreadable:
            return False
        for mail_id, reason in unreadable:
            refuse_control(
                entry.session,
                Control("unknown", message_id=f"mailbox row {mail_id}"),
                f"the posted row is no message or control this trio-harness can read ({reason}); it was removed",
            )
        unreadable.clear()
        return True

    def _apply_control(self, entry: SessionEntry, mail_id: int, message: InboxMessage) -> bool:
        """Apply a control from the mailbox (whether ``message`` is one).

        Its mailbox row is deleted with the flush that stores what it did:
        acknowledged once the control took effect (a decision: its
        ``approval/decided`` appended), so a worker that dies first leaves it
        to the next holder.  A control this agent cannot apply stays taken
        until the writer closes and is delivered at the next resume.
        """
        if not is_control(message):
            return False
        apply = entry.control
        writer = entry.writer
        if apply is None or not has_mailbox(writer):
            log.warning(
                "session %r: the live agent cannot apply posted controls; %s waits", entry.session.id, message.id
            )
            return True
        try:
            control = read_control(message)
        except ValueError as exc:  # never spliced as a message; the session says it
            log.info("session %r: posted control %s not applied: %s", entry.session.id, message.id, exc)
            refuse_control(entry.session, Control("unknown", message_id=message.id), str(exc))
            writer.ack_mail([mail_id])
            return True
        if control is None:  # not reached: is_control said it is one
            return False
        applied = functools.partial(writer.ack_mail, [mail_id])
        try:
            apply(control, applied)
        except HarnessError as exc:
            # The poster is gone: the session says it (the row goes with the flush that stores it).
            log.info("session %r: posted control %s not applied: %s", entry.session.id, message.id, exc)
            refuse_control(entry.session, control, str(exc))
            applied()
        return True

    async def deliver_waiting(self, entry: SessionEntry) -> None:
        """Deliver what waits in the store's mailbox now (a resume does, before a paused turn asks again).

        Shielded; a store failure is logged (the mailbox loop delivers later).
        """
        if not has_mailbox(entry.writer):
            return
        with trio.CancelScope(shield=True):
            try:
                await self._deliver_mail(entry)
            except SessionStoreError as exc:
                log.warning("session %r: the waiting mail is delivered later: %s", entry.session.id, exc)

    async def post(
        self,
        session_id: str,
        text: str | None = None,
        *,
        mode: SendMode = "followup",
        cancel: bool = False,
        call_id: str | None = None,
        decision: ApprovalDecisionLike | None = None,
        question_seq: int | None = None,
    ) -> str:
        """Deliver a message, a cancel or an approval decision to ``session_id`` wherever it is live.

        Exactly one of ``text``, ``cancel=True`` or ``call_id`` with
        ``decision`` is given.  A cancel acts as ``agent.cancel("user")``; a
        decision (an :class:`~trio_harness.agents.ApprovalDecision`) answers
        the approval question of the call ``call_id``, asked in any process,
        or waiting in a paused turn (it then applies at the next resume
        without asking the approver again).  Both travel like messages:
        see :meth:`post_message`.

        A decision is bound to the call waiting now (the ``assistant/message``
        that made it): it never decides a later call that reuses the id
        (models reuse ids such as ``call_0``).  ``question_seq``, the seq of
        the ``approval/requested`` event the decision answers, binds it to
        that question: refused when it is not the one waiting.  A decision
        that turns out not to apply once it arrives is not applied: the
        error is raised here when the agent is live in this process, and
        otherwise the session logs ``control/refused`` (docs/approval.rst).

        Raises:
            TypeError, ValueError: not exactly one thing to post, or a bad decision.
            CallNotFoundError: the session's log has no call ``call_id``, or no
                question for it at ``question_seq``.
            CallNotPendingError: that call is not waiting for approval, the
                question at ``question_seq`` was answered, or the agent live
                here found it answered or stale.
            AgentError: the agent live here takes no posted decisions (a custom loop).
            SessionNotFoundError, AgentNotFoundError, AgentDisposedError,
                SessionStoreError: as for a message.
        """
        given = [text is not None, bool(cancel), call_id is not None or decision is not None]
        if sum(given) != 1:
            raise TypeError("post() takes exactly one of: text, cancel=True, or call_id= with decision=")
        if text is not None:
            return await self.post_message(session_id, text, mode=mode)
        validate_session_id(session_id)
        if cancel:
            return await self._post_control(session_id, Control("cancel"))
        verdict = getattr(decision, "verdict", None)
        if not isinstance(call_id, str) or not call_id or verdict not in VERDICTS:
            raise ValueError("a decision needs call_id= (a tool call id) and decision= (an ApprovalDecision)")
        message = getattr(decision, "message", None)
        entry = self._live.get(session_id)
        if entry is not None:
            events: Sequence[Event] = entry.session.events
        else:
            try:
                events = (await self.persistence.load(session_id)).events
            except SessionNotFoundError:
                raise SessionNotFoundError(f"no live or stored session {session_id!r} to post to") from None
        if question_seq is not None and (type(question_seq) is not int or question_seq < 0):
            raise ValueError(f"question_seq must be the seq of an approval/requested event, got {question_seq!r}")
        call_seq = check_pending(events, session_id, call_id, question_seq)
        return await self._post_control(session_id, Control("decision", call_id, verdict, message, call_seq))

    async def _post_control(self, session_id: str, control: Control) -> str:
        message = control_message(control)
        entry = self._live.get(session_id)
        if isinstance(self.persistence, RemoteInbox) and not (entry is not None and not entry.session.events):
            await self.persistence.post(session_id, message)
            return message.id
        if entry is None or entry.control is None or entry.detached:
            if not await self.persistence.exists(session_id):
                raise SessionNotFoundError(f"no live or stored session {session_id!r} to post to")
            raise AgentNotFoundError(
                f"session {session_id!r} is not live in this process, and this store cannot keep controls "
                "for a session nobody holds; resume its agent first (the PostgreSQL store keeps them until then)"
            )
        entry.control(attrs.evolve(control, message_id=message.id), lambda: None)  # raises: the poster is told
        await entry.session.flush()
        return message.id

    async def post_message(self, session_id: str, text: str, *, mode: SendMode = "followup") -> str:
        """Deliver a message to the agent of ``session_id`` wherever it is live.

        With a store that keeps posted messages (PostgreSQL), the message is
        stored in the session's mailbox and the worker holding the session
        splices it into its agent's inbox within milliseconds; if nobody holds
        the session, it is delivered when the session is next resumed.
        Exactly once, in the order of the posts.  With the in-memory and JSONL
        stores, the agent must be live in this process: the message is
        spliced into its inbox and flushed before this returns.

        Args:
            session_id: the session (agent) to deliver to.
            text: the message.
            mode: ``followup`` (a new turn), ``steer`` (the next step of the
                running turn) or ``inject`` (the next step, without waking the agent).

        Returns:
            The message id (the ``message_id`` of the ``user/message`` that
            claims it).

        Raises:
            SessionNotFoundError: nothing is stored (or live) under this id.
            AgentNotFoundError: the store cannot keep messages and no agent of
                this session is live in this process.
            AgentDisposedError: the local agent is being disposed.
            SessionStoreError: the store did not take the message.
        """
        validate_session_id(session_id)
        if mode not in _SEND_MODES:
            raise ValueError(f"unknown send mode {mode!r}; use followup, steer or inject")
        message = InboxMessage(id=f"msg-{uuid.uuid4().hex}", text=text, mode=mode)
        entry = self._live.get(session_id)
        if isinstance(self.persistence, RemoteInbox):
            if entry is not None:
                await entry.session.flush()  # a new session is stored at its first flush
                if not entry.session.events and entry.receiver is not None and not entry.detached:
                    # Live here and not stored yet (no event at all): nobody else can post to it.
                    entry.receiver(message)
                    await entry.session.flush()
                    return message.id
            await self.persistence.post(session_id, message)
            return message.id
        if entry is None or entry.receiver is None or entry.detached:
            if not await self.persistence.exists(session_id):
                raise SessionNotFoundError(f"no live or stored session {session_id!r} to post to")
            raise AgentNotFoundError(
                f"session {session_id!r} is not live in this process, and this store cannot keep messages "
                "for a session nobody holds; resume its agent first (the PostgreSQL store keeps them until then)"
            )
        entry.receiver(message)
        await entry.session.flush()
        return message.id

    def announce(self, entry: SessionEntry) -> None:
        """Emit ``session/created`` once, for the current live entry only."""
        if entry.announced or entry.detached or self._live.get(entry.session.id) is not entry:
            return
        entry.announced = True
        self.bus.emit("session/created", entry.session)

    async def detach(self, entry: SessionEntry) -> None:
        """Flush, then remove exactly this entry; emits ``session/disposed`` if announced.

        Idempotent; runs shielded so a cancelled caller cannot skip the flush.
        A stale entry never removes a later session that reuses the id.

        Raises:
            SessionStoreError: the final flush failed.  The entry is detached
                all the same; the failure is also kept until
                :meth:`take_failure` or :meth:`take_unreported` takes it.
        """
        if entry.detached:
            return
        entry.detached = True
        with trio.CancelScope(shield=True):
            try:
                await entry.session.flush()
            except SessionStoreError as exc:
                failure = SessionStoreError(
                    f"session {entry.session.id!r} was closed with events that could not be stored: {exc}",
                    session_id=entry.session.id,
                    path=exc.path,
                )
                failure.__cause__ = exc
                self._unreported[entry] = failure
                raise failure from exc
            finally:
                await entry.writer.aclose()
                if self._live.get(entry.session.id) is entry:
                    del self._live[entry.session.id]
                if entry.announced:
                    self.bus.emit("session/disposed", entry.session)

    async def detach_all(self) -> None:
        """Flush and detach every live session (the store's own shutdown).

        A session that cannot be stored does not stop the others from being
        detached; its failure is kept for :meth:`take_unreported`.
        """
        for entry in list(self._live.values()):
            try:
                await self.detach(entry)
            except SessionStoreError:
                pass  # kept in _unreported

    def take_failure(self, entry: SessionEntry) -> SessionStoreError | None:
        """The failure of ``entry``'s detach, if it failed and was not taken yet."""
        return self._unreported.pop(entry, None)

    def take_unreported(self) -> builtins.list[SessionStoreError]:
        """Every detach failure not taken yet (the harness raises them at exit)."""
        failures = list(self._unreported.values())
        self._unreported.clear()
        return failures

    # ------------------------------------------------------------ queries

    def get(self, session_id: str) -> Session | None:
        """The live session with this id, or None."""
        entry = self._live.get(session_id)
        return entry.session if entry is not None else None

    def list(self) -> list[Session]:
        """The live sessions, in publication order."""
        return [entry.session for entry in self._live.values()]

    async def stored(self) -> builtins.list[SessionHeader]:
        """The headers of every stored session, oldest first."""
        return await self.persistence.list()

    async def load_events(self, session_id: str) -> tuple[SessionHeader, tuple[Event, ...]]:
        """The header and events of a live or stored session (read-only)."""
        entry = self._live.get(session_id)
        if entry is not None:
            return entry.session.header, tuple(entry.session.events)
        loaded = await self.persistence.load(session_id)
        return loaded.header, loaded.events

    def follow(
        self, session_id: str, *, start: int = 0, poll_interval: float = DEFAULT_POLL_INTERVAL
    ) -> SessionFollower:
        """Iterate over a session's stored events from ``start`` on, live while any process appends.

        Read-only (the session is not taken; it may be live here, in another
        process or nowhere).  Each stored event is yielded once, in ``seq``
        order; once caught up the follower reads the store again every
        ``poll_interval`` seconds (session/_follow_store.py).  It never ends by
        itself: break out of it (or cancel) when done.

        Raises:
            InvalidSessionIdError: the id is unusable (at once).
            ValueError: ``start`` is not an int >= 0 or ``poll_interval`` is
                not in (0, 5] seconds (at once).
            SessionNotFoundError: nothing is stored (or live) under this id
                (at the first iteration).
            SessionCorruptError: a stored event cannot be read.
        """
        validate_session_id(session_id)
        check_follow(start, poll_interval)
        return SessionFollower(
            self.persistence, session_id, poll_interval, lambda: session_id in self._live, expected=start
        )

    async def fork(self, source: str, boundary: int, child_id: str) -> SessionHeader:
        """Store a new session holding ``source``'s first ``boundary`` events.

        The child records ``parent_session=source`` (lineage only: it grants no
        runtime ownership) and ``seed_length=boundary``.

        Raises:
            SessionNotFoundError: ``source`` is neither live nor stored.
            ForkBoundaryError: the boundary is out of range or inside an open turn.
            SessionExistsError: ``child_id`` is live or stored already.
        """
        validate_session_id(child_id)
        try:
            header, events = await self.load_events(source)
        except SessionNotFoundError:
            raise SessionNotFoundError(f"cannot fork unknown session {source!r}") from None
        if not 0 <= boundary <= len(events):
            raise ForkBoundaryError(f"fork boundary {boundary} is outside 0..{len(events)} for session {source!r}")
        turn = open_turn_at(events, boundary)
        if turn is not None:
            raise ForkBoundaryError(
                f"fork boundary {boundary} of session {source!r} falls inside open turn {turn}; "
                "pick a boundary at a turn end"
            )
        if child_id in self._live or await self.persistence.exists(child_id):
            raise SessionExistsError(f"cannot fork into {child_id!r}: that session already exists")
        child = SessionHeader(
            id=child_id,
            created_at=self.clock(),
            cwd=header.cwd,
            parent_session=source,
            seed_length=boundary,
        )
        if isinstance(self.persistence, ServerSideFork) and await self.persistence.copy_prefix(source, boundary, child):
            return child
        await self.persistence.save(child, await resolve_images(self.persistence, source, events[:boundary]))
        return child
