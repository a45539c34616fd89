"""Approval before dangerous tool calls: what an approver is asked, and what it answers.

An *approver* is an async callable given to :func:`~trio_harness.open_harness`
(``approver=``, every agent of the harness) or to
:class:`~trio_harness.AgentOptions` (``approver=``, one agent; it wins).  Before a
call of a tool that requires approval runs, the driver logs
``approval/requested``, awaits the approver inside the turn's cancel scope, logs
``approval/decided``, and then runs the call or gives the model an error result
saying that it was denied (docs/approval.rst).

With no approver configured, a call that requires approval is denied: the
model's error result and the log's ``approval/decided`` say how to allow it.
:func:`allow_all` is the explicit way to run every such call unasked.

Each agent holds one ``ApprovalGate``: it asks the approver and remembers the
session's ``allow_always`` / ``deny_always`` decisions (rebuilt from the log).
"""

from __future__ import annotations

import logging
import math
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import attrs
import trio

from .._errors import CallNotPendingError
from .._util import describe, split_cancelled
from ..session import _events as ev
from ..session._control import call_seq_of, pending_call, stale_reason
from ..session._paused import paused_calls, unanswered_calls

if TYPE_CHECKING:
    from .._records import ToolCall
    from ..session._events import ApprovalOutcome, CancelCause, TurnEndReason
    from ..session._session import Session
    from ._agent import Agent
    from ._durability import Checkpoints
    from ._tools import Tool

log = logging.getLogger("trio_harness.agent")


Verdict: TypeAlias = Literal["allow_once", "allow_always", "deny", "deny_always"]
"""What an approver decides: ``allow_once`` runs this call; ``allow_always`` runs
it and every later call of the same tool in this session without asking;
``deny`` refuses this call; ``deny_always`` refuses it and every later call of
the same tool in this session without asking."""

_VERDICTS: tuple[str, ...] = get_args(Verdict)


def _verdict(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or value not in _VERDICTS:
        raise ValueError(f"ApprovalDecision.verdict must be one of {', '.join(_VERDICTS)}, got {value!r:.80}")


def _message(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"ApprovalDecision.message must be a str or None, got {type(value).__name__} {value!r:.80}")


@attrs.frozen
class ApprovalDecision:
    """An approver's answer.

    Build one with the class methods: ``ApprovalDecision.allow_once()``,
    ``allow_always()``, ``deny("use the test database")``,
    ``deny_always()``.

    Attributes:
        verdict: see :data:`Verdict`.
        message: for a denial, the text the model reads beside "denied" (why,
            or what to do instead); logged in ``approval/decided``.

    Raises:
        ValueError: ``verdict`` is not one of the four.
        TypeError: ``message`` is not a str or None.
    """

    verdict: Verdict = attrs.field(validator=_verdict)
    message: str | None = attrs.field(default=None, validator=_message)

    @classmethod
    def allow_once(cls) -> ApprovalDecision:
        """Run this call."""
        return cls("allow_once")

    @classmethod
    def allow_always(cls) -> ApprovalDecision:
        """Run this call and, without asking, every later call of the same tool in this session."""
        return cls("allow_always")

    @classmethod
    def deny(cls, message: str | None = None) -> ApprovalDecision:
        """Refuse this call; ``message`` is given to the model."""
        return cls("deny", message)

    @classmethod
    def deny_always(cls, message: str | None = None) -> ApprovalDecision:
        """Refuse this call and, without asking, every later call of the same tool in this session."""
        return cls("deny_always", message)

    @property
    def allowed(self) -> bool:
        """Whether the call runs."""
        return self.verdict in ("allow_once", "allow_always")

    @property
    def remembered(self) -> bool:
        """Whether the decision applies to later calls of the tool in this session."""
        return self.verdict in ("allow_always", "deny_always")


@attrs.frozen
class ApprovalRequest:
    """What an approver is asked about one tool call.

    Attributes:
        tool: the tool name.
        arguments: the arguments after validation against the tool's schema
            (for a typed-function tool, converted to the annotated types).
        raw_arguments: the arguments exactly as the model sent them (JSON text).
        call_id: the model's id of the call.
        agent_id: the id of the calling agent (== its session id).
        turn: the turn number.
        step: the step number.
        agent: the calling agent (a subagent's request names the child; its
            ``parent_id`` leads to the agent that started it).
    """

    tool: str
    arguments: Mapping[str, Any]
    raw_arguments: str
    call_id: str
    agent_id: str
    turn: int
    step: int
    agent: Agent = attrs.field(eq=False, repr=False)


Approver: TypeAlias = Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]
"""``async def approver(request: ApprovalRequest) -> ApprovalDecision``.

It runs inside the calling turn's cancel scope: cancelling the turn or
disposing the agent ends the wait at once (the call does not run).  An approver
that raises denies the call; the error reaches the session log and the model's
error result."""


async def allow_all(request: ApprovalRequest) -> ApprovalDecision:
    """The approver that allows every call, once, without asking anyone.

    ``open_harness(approver=allow_all)`` runs every call that requires
    approval (every ``bash`` command the model picks) as if approval did not
    exist, except that each call is still logged: ``approval/decided`` with
    outcome ``allow_once`` and source ``approver``.  Use it only where whatever
    the model may run is acceptable (a sandbox, a throw-away machine, a test);
    see docs/approval.rst, "What approval protects against".
    """
    return ApprovalDecision.allow_once()


_NO_APPROVER = (
    "the call to {name!r} requires approval and no approver is configured; to allow such calls, "
    "pass approver= to open_harness or AgentOptions (trio_harness.allow_all runs every call unasked), "
    "or turn approval off for bash with bash_tool_options=BashToolOptions(requires_approval=False)"
)


def _denied_text(name: str, outcome: ApprovalOutcome, message: str | None, *, remembered: bool = False) -> str:
    """The error result of a call that was not approved (docs/approval.rst)."""
    if remembered:
        text = f"error: denied: calls to {name!r} were denied for this session, so this call did not run"
    else:
        always = " (and later calls of this tool in this session)" if outcome == "deny_always" else ""
        text = f"error: denied: the call to {name!r}{always} was not approved, so it did not run"
    return f"{text}; message: {message}" if message else text


@attrs.frozen
class _Posted:
    """A posted decision kept until its call is reached (a paused turn's call, before the continuation asks)."""

    decision: ApprovalDecision
    applied: Callable[[], None]
    call_seq: int | None  # the assistant/message that made the call it answers
    refused: Callable[[str], None] | None


@attrs.define(eq=False)
class RemoteDecisions:
    """Decisions posted for one agent's calls (``harness.sessions.post(call_id=, decision=)``), each used once.

    A decision for a call being asked about ends the approver's wait; one
    that arrives first (for a paused turn's call, before its continuation
    asks) is kept until the call is reached, bound to that call (the
    ``assistant/message`` that made it): a later call reusing the id does
    not take it, and it is refused (``refused(reason)``) instead.  ``applied``
    runs once the decision is logged.
    """

    _early: dict[str, _Posted] = attrs.field(factory=dict, init=False)
    _waiting: dict[str, Callable[[ApprovalDecision, Callable[[], None]], None]] = attrs.field(factory=dict, init=False)

    def waiting(self, call_id: str) -> bool:
        """Whether the approver is being asked about ``call_id`` now."""
        return call_id in self._waiting

    def post(
        self,
        call_id: str,
        decision: ApprovalDecision,
        applied: Callable[[], None],
        *,
        call_seq: int | None = None,
        refused: Callable[[str], None] | None = None,
    ) -> None:
        """Answer ``call_id`` with ``decision`` (now if it is being asked about, else when it is).

        Raises:
            CallNotPendingError: a decision for the call is kept already (the first one posted applies).
        """
        deliver = self._waiting.get(call_id)
        if deliver is not None:
            deliver(decision, applied)
            return
        if call_id in self._early:
            raise CallNotPendingError(
                f"tool call {call_id!r} has a posted decision waiting to apply already (the first one posted "
                "applies); this one was not applied"
            )
        self._early[call_id] = _Posted(decision, applied, call_seq, refused)

    def take(
        self, call_id: str, events: Sequence[ev.Event] | None = None
    ) -> tuple[ApprovalDecision, Callable[[], None]] | None:
        """The decision posted for ``call_id`` before it was asked about, if any.

        With ``events`` (the log), a kept decision bound to another call with
        the same id (an earlier one, answered otherwise) is not returned but
        refused.
        """
        posted = self._early.pop(call_id, None)
        if posted is None:
            return None
        if posted.call_seq is not None and events is not None:
            reason = stale_reason(call_id, posted.call_seq, call_seq_of(events, call_id))
            if reason is not None:
                self._refuse(posted, call_id, reason)
                return None
        return posted.decision, posted.applied

    def discard(self, call_id: str, reason: str) -> None:
        """Refuse the decision kept for ``call_id``, if any: its call was answered otherwise."""
        posted = self._early.pop(call_id, None)
        if posted is not None:
            self._refuse(posted, call_id, reason)

    @staticmethod
    def _refuse(posted: _Posted, call_id: str, reason: str) -> None:
        if posted.refused is not None:
            posted.refused(reason)
        else:  # posted by a caller that asked for no report (tests)
            log.warning("the posted decision for call %s was not applied: %s", call_id, reason)

    async def ask(self, approver: Approver, request: ApprovalRequest) -> tuple[object, Callable[[], None] | None]:
        """The approver's answer, or a posted one that arrived first (with its ``applied``)."""
        early = self._early.pop(request.call_id, None)
        if early is not None:  # posted while the question was being stored: the approver is not asked
            return early.decision, early.applied
        posted: list[tuple[ApprovalDecision, Callable[[], None]]] = []
        scope = trio.CancelScope()

        def deliver(decision: ApprovalDecision, applied: Callable[[], None]) -> None:
            if not posted:
                posted.append((decision, applied))
                scope.cancel()

        self._waiting[request.call_id] = deliver
        answer: object = None
        try:
            with scope:
                answer = await approver(request)
        finally:
            if self._waiting.get(request.call_id) is deliver:
                del self._waiting[request.call_id]
        if posted:
            return posted[0]
        return answer, None


@attrs.define(eq=False, repr=False, weakref_slot=False)
class ApprovalGate:
    """One agent's approval: asks its approver before calls that require it, remembers "always".

    The standing (``allow_always`` / ``deny_always``) decisions are rebuilt
    from the session's log, so a resumed agent decides as the one that logged
    them (a fork's copied events excluded).
    """

    _session: Session = attrs.field(alias="session")
    # The agent whose calls are asked about (ApprovalRequest.agent).
    _agent: Agent = attrs.field(alias="agent")
    # None: calls that require approval are denied.
    approver: Approver | None
    # The running turn's cancel cause, recorded when a cancel ends the wait.
    _cause: Callable[[], CancelCause | None] = attrs.field(alias="cause")
    # The agent's checkpoints: the request reaches the store before the approver is asked.
    _checkpoints: Checkpoints = attrs.field(alias="checkpoints")
    # allow_always / deny_always decisions of this session and their messages, per tool name.
    _standing: dict[str, tuple[ApprovalOutcome, str | None]] = attrs.field(factory=dict, init=False)
    _warned_no_approver: bool = attrs.field(default=False, init=False)
    # The calls whose approval wait a disposal cut off in the running turn: it ends paused.
    # (An empty frozenset until the first cut: most agents never have one, and a set costs 216 bytes.)
    _cut: frozenset[str] | set[str] = attrs.field(default=frozenset(), init=False)
    # The calls a paused turn left waiting, for the continuation turn (docs/approval.rst).
    paused: tuple[ToolCall, ...] = attrs.field(default=(), init=False)
    # Decisions posted from anywhere (agents/_remote_control.py); made at first use (the ``remote``
    # property): most agents never get one, and it costs ~180 bytes per idle agent.
    _remote: RemoteDecisions | None = attrs.field(default=None, init=False)

    @property
    def remote(self) -> RemoteDecisions:
        """The decisions posted for this agent's calls (agents/_remote_control.py)."""
        if self._remote is None:
            self._remote = RemoteDecisions()
        return self._remote

    def deliver(
        self,
        call_id: str,
        decision: ApprovalDecision,
        *,
        call_seq: int | None,
        applied: Callable[[], None],
        refused: Callable[[str], None],
    ) -> None:
        """Apply a decision posted for ``call_id`` (see :class:`~trio_harness.agents._remote_control.TakesDecisions`).

        Raises:
            CallNotPendingError: the call is not waiting for approval, or the
                call waiting is a later one that reuses the id.
        """
        session = self._session
        pending = pending_call(session.events, call_id)
        if pending is None and not (self._remote is not None and self._remote.waiting(call_id)):
            raise CallNotPendingError(
                f"tool call {call_id!r} of session {session.id!r} is not waiting for approval any more (it was "
                "answered before the posted decision arrived); the decision was not applied"
            )
        current = pending[0] if pending is not None else None
        reason = stale_reason(call_id, call_seq, current)
        if reason is not None:
            raise CallNotPendingError(f"session {session.id!r}: {reason}; the decision was not applied")
        self.remote.post(
            call_id, decision, applied, call_seq=call_seq if call_seq is not None else current, refused=refused
        )

    def __attrs_post_init__(self) -> None:
        events = self._session.events
        self.paused = paused_calls(events)
        for index in range(self._session.header.seed_length, len(events)):
            event = events[index]
            if type(event) is ev.ApprovalDecided and event.outcome in ("allow_always", "deny_always"):
                self._standing[event.name] = (event.outcome, event.message)

    @property
    def cut(self) -> frozenset[str] | set[str]:
        """The ids of the calls whose approval wait a disposal cut off in the running turn."""
        return self._cut

    def end_reason(self) -> TurnEndReason:
        """How a cancelled turn ends: ``paused`` when a disposal cut off an approval wait, else ``aborted``.

        A paused turn's waiting calls become :attr:`paused`, for the
        continuation turn (called after the turn's last ``step/end``).
        """
        if not self._cut:
            return "aborted"
        self._cut = frozenset()
        self.paused = tuple(unanswered_calls(self._session.events).values())
        return "paused"

    def take_paused(self) -> tuple[ToolCall, ...]:
        """The calls a paused turn left waiting, handed once to the continuation turn's first step."""
        calls, self.paused = self.paused, ()
        return calls

    def drop_paused(self, last_turn: int, cause: CancelCause) -> int:
        """Cancel a paused turn's questions, if any: a turn that decides them ``cancelled`` and ends ``aborted``.

        Returns the number of the latest turn (``last_turn``, or the new turn's).
        """
        session = self._session
        calls = self.take_paused()
        if not calls:
            return last_turn
        turn = last_turn + 1
        session.append(ev.TurnStart, turn=turn)
        session.append(ev.StepStart, turn=turn, step=1)
        for call in calls:
            where = {"turn": turn, "step": 1, "call_id": call.id, "name": call.name}
            note = "the session was cancelled while the paused call waited for approval"
            session.append(
                ev.ApprovalDecided, **where, outcome="cancelled", source="cancelled", message=note, cause=cause
            )
            text = f"error: not run: the turn was cancelled while the call waited for approval (cause: {cause})"
            session.append(ev.ToolResult, **where, content=text, is_error=True)
            if self._remote is not None:
                self._remote.discard(call.id, "the paused call was cancelled before the posted decision applied")
        session.append(ev.StepEnd, turn=turn, step=1)
        session.append(ev.TurnEnd, turn=turn, reason="aborted", cause=cause)
        return turn

    def _decided(
        self, call: ToolCall, where: dict[str, Any], decision: ApprovalDecision, applied: Callable[[], None] | None
    ) -> str | None:
        """Log ``decision`` for ``call``; None to run it, else the denial the model reads."""
        verdict = decision.verdict
        self._session.append(ev.ApprovalDecided, **where, outcome=verdict, source="approver", message=decision.message)
        if applied is not None:
            applied()  # a posted decision: logged, so its mailbox row goes with this event
        if verdict == "allow_always" or verdict == "deny_always":
            self._standing[call.name] = (verdict, decision.message)
        if not decision.allowed:
            return _denied_text(call.name, verdict, decision.message)
        return None

    @property
    def standing_decisions(self) -> dict[str, ApprovalOutcome]:
        """The ``allow_always`` / ``deny_always`` decisions of this session, by tool name (a copy)."""
        return {name: outcome for name, (outcome, _) in self._standing.items()}

    async def approve(
        self,
        tool: Tool,
        call: ToolCall,
        args: dict[str, Any],
        turn: int,
        step: int,
        asked: list[trio.Event] | None,
        index: int,
    ) -> str | None:
        """Decide whether ``call`` runs: None to run it, else the error result to give the model.

        ``asked`` (calls run in parallel) orders the asks: this one waits
        until every earlier call has had its answer, and sets its own event
        when done.  Runs in the turn's cancel scope: a cancel while waiting
        raises :class:`trio.Cancelled` here, after ``approval/decided``
        records it, and the call gets the synthetic "not run" result of an
        aborted turn.  A disposal while waiting records nothing: the call
        joins :attr:`cut`, keeps no decision and no result, and the turn ends
        ``paused`` (docs/approval.rst, "Paused approvals").
        """
        session = self._session
        where = {"turn": turn, "step": step, "call_id": call.id, "name": call.name}
        try:
            if asked is not None:
                for earlier in asked[:index]:  # every earlier call has had its answer
                    await earlier.wait()
            try:
                needed = tool.needs_approval(args)
            except Exception as exc:
                log.debug("tool %s: requires_approval raised", call.name, exc_info=True)
                message = f"deciding whether the call needs approval failed: {describe(exc)}"
                session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                return f"error: denied: {message}; the call to {call.name!r} did not run"
            if not needed:
                return None
            standing = self._standing.get(call.name)
            if standing is not None:
                outcome, remembered_message = standing
                session.append(
                    ev.ApprovalDecided, **where, outcome=outcome, source="remembered", message=remembered_message
                )
                if outcome == "allow_always":
                    return None
                return _denied_text(call.name, outcome, remembered_message, remembered=True)
            remote = self._remote
            early = remote.take(call.id, session.events) if remote is not None else None
            if early is not None:  # posted before the question was reached: the approver is not asked
                return self._decided(call, where, early[0], early[1])
            approver = self.approver
            if approver is None:
                # Nobody to ask: denied, saying how to allow it (docs/approval.rst).
                message = _NO_APPROVER.format(name=call.name)
                if not self._warned_no_approver:
                    self._warned_no_approver = True
                    log.warning("agent %s: %s", session.id, message)
                session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                return f"error: denied: {message}; the call did not run"
            session.append(ev.ApprovalRequested, **where, arguments=call.arguments)
            request = ApprovalRequest(
                tool=call.name,
                arguments=args,
                raw_arguments=call.arguments,
                call_id=call.id,
                agent_id=session.id,
                turn=turn,
                step=step,
                agent=self._agent,
            )
            try:
                # The question reaches the store first (a cancel here is a cancel of the wait).
                if (unstored := await self._checkpoints.before_approval(where)) is not None:
                    return unstored  # not on the store: not asked, not run (docs/guarantees.rst)
                decision, applied = await self.remote.ask(approver, request)
            except BaseException as exc:
                cancelled, failed = split_cancelled(exc)
                if cancelled is None:
                    if not isinstance(failed, Exception):
                        raise
                    log.debug("agent %s: the approver raised", session.id, exc_info=True)
                    message = f"the approver failed: {describe(failed)}"
                    session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                    return f"error: denied: approval could not be obtained ({message}); the call did not run"
                if self._cause() == "disposed" and failed is None:
                    # Cut off by a disposal: the question stays open; the turn ends paused.
                    self._cut = {*self._cut, call.id}
                    if cancelled is exc:
                        raise
                    raise cancelled from None
                # The wait ended by a cancel: the call does not run.
                note = f"the approver also raised: {describe(failed)}" if failed is not None else None
                session.append(
                    ev.ApprovalDecided,
                    **where,
                    outcome="cancelled",
                    source="cancelled",
                    message=note,
                    cause=self._cause(),
                )
                if cancelled is exc:
                    raise
                raise cancelled from None
            if not isinstance(decision, ApprovalDecision):
                message = f"the approver returned {type(decision).__name__} {decision!r:.80}, not an ApprovalDecision"
                session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                return f"error: denied: approval could not be obtained ({message}); the call did not run"
            verdict = decision.verdict
            if trio.current_effective_deadline() == -math.inf:
                # The decision arrived in the instant the turn was cancelled: the
                # cancel wins, nothing of the decision applies, and the call ends
                # "not run" like every call that had not started.
                late = f"the decision {verdict} arrived after the cancel and was not applied"
                if self._cause() == "disposed":
                    self._cut = {*self._cut, call.id}  # the question stays open: the turn ends paused
                    await trio.lowlevel.checkpoint()  # raises Cancelled
                session.append(
                    ev.ApprovalDecided,
                    **where,
                    outcome="cancelled",
                    source="cancelled",
                    message=late,
                    cause=self._cause(),
                )
                await trio.lowlevel.checkpoint()  # raises Cancelled
            return self._decided(call, where, decision, applied)
        finally:
            if asked is not None:
                asked[index].set()
