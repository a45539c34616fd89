"""The turn driver: a ReAct loop around one session (the default agent implementation).

Phases: ``idle``, ``maintenance`` and ``running``; the public status maps
maintenance to ``idle``.  Maintenance is ``agent.compact()`` or
``maintenance()``, or the automatic compaction the driver runs between turns
when the next turn would pass the context threshold.

A waking send while idle starts an *activity*: the agent's driver task runs
turns while there is work.  The driver task is spawned into the agent's scope
at the first wake and parks while the agent is idle (a wake reschedules it), so
an activity costs no task spawn; disposal ends it.  Each activity has one
cancel scope and one cancel cause (the first cause wins); activities share the
driver's cancel scope until one is cancelled, and the next one enters a fresh
scope.  A waking send that arrives after a cancel but before the activity ends
is latched and runs in a replacement activity once the cancelled turn has
closed.

Where is a turn cancelled?  :meth:`ReactAgent.cancel` cancels the activity's
cancel scope; the ``finally`` blocks of :meth:`_run_turn`, :meth:`_run_step`
and :meth:`_run_tools` close the turn (synthetic tool results, ``step/end``,
``turn/end`` with the cause) and flush the session, so the log stays balanced
whatever interrupted it.
"""

from __future__ import annotations

import datetime
import logging
import math
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import attrs
import trio

from .._errors import AgentDisposedError, CompactionError, SessionStoreError
from .._initiator import _set_initiator
from .._records import plain_constructor
from .._util import describe as _describe
from .._util import split_cancelled as _split_cancelled
from ..model._context import CHARS_PER_TOKEN, is_context_overflow, tokens_for_chars, tools_chars
from ..model._cost import price_route, usage_cost
from ..model._protocol import (
    Chunk,
    Failure,
    Finish,
    Message,
    ModelProvider,
    ModelRequest,
    ModelSettings,
    OutputMode,
    ReasoningDelta,
    Retry,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UsageTotals,
    supports_json_schema,
)
from ..session import _events as ev
from ..session._events import ApprovalOutcome, CancelCause, InboxMessage, SendMode, TurnEndReason
from ..session._session import Session
from ._approval import ApprovalDecision, ApprovalRequest, Approver
from ._budget import UsageCounter, budget_failure
from ._compaction import (
    BudgetCheck,
    ContextPolicy,
    SummaryFailed,
    SummaryOverBudget,
    choose_boundary,
    summarize,
    summary_section,
)
from ._follow import FollowedPrompt, Followers
from ._function_tools import caller_namespace, output_adapter
from ._history import History, TurnMark
from ._inbox import Inbox
from ._options import AgentOptions
from ._run import PendingOutput, RunResult, output_instructions, run_prompt
from ._stream import DEFAULT_STREAM_BUFFER, EventStream, StreamRegistry
from ._tools import Tool, ToolContext, ToolOutput, ToolSet

if TYPE_CHECKING:
    from .._bus import EventBus
    from .._scope import Scope
    from ._agent import AgentStatus
    from ._registry import AgentRegistry
    from ._turns import TurnOutcome

__all__ = ["ReactAgent"]

log = logging.getLogger("trio_harness.agent")

Phase = Literal["idle", "maintenance", "running"]

T = TypeVar("T")


class _OverBudget(Exception):
    """Raised inside a step when a budget forbids the next model request; the step ends the turn with it."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


_NO_SETTINGS = ModelSettings()
# The turn end's stand-in for a shield when its flushes cannot wait (reusable: it does nothing).
_UNSHIELDED = nullcontext()

# Built from values the driver has checked: plain constructors (the same objects, cheaper).
_tool_call = plain_constructor(ToolCall) or ToolCall
_tool_context = plain_constructor(ToolContext) or ToolContext


def _aborted_text(cause: CancelCause | None) -> str:
    return f"error: not run: the turn was aborted (cause: {cause or 'cancelled'})"


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


@attrs.define(eq=False, repr=False)
class ReactAgent:
    """The default :class:`~trio_harness.Agent`: a ReAct loop over a session.

    Built by the agent factory inside the create / resume pipeline; use
    ``harness.agents.create`` rather than constructing one.  It is given the
    few services it uses: the bus it reports to, the shared tool set it offers
    beside its own, and the registry its tools see (:class:`ToolContext`).
    """

    _session: Session = attrs.field(alias="session")
    _options: AgentOptions = attrs.field(alias="options")
    _scope: Scope = attrs.field(alias="scope")
    _provider: ModelProvider = attrs.field(alias="provider")
    _bus: EventBus = attrs.field(alias="bus")
    # Harness-wide tools and prompt sections; this agent's own win on a name clash.
    _shared_tools: ToolSet = attrs.field(alias="shared_tools")
    _agents: AgentRegistry = attrs.field(alias="agents")
    _parent_id: str | None = attrs.field(default=None, alias="parent_id")
    # Asked before calls of tools that require approval; None: such calls are denied.
    _approver: Approver | None = attrs.field(default=None, alias="approver")
    # allow_always / deny_always decisions of this session and their messages, per tool
    # name (rebuilt from the log).
    _standing: dict[str, tuple[ApprovalOutcome, str | None]] = attrs.field(factory=dict, init=False)
    _warned_no_approver: bool = attrs.field(default=False, init=False)
    # Harness-wide model settings (open_harness(model_settings=...)).
    _harness_settings: ModelSettings | None = attrs.field(default=None, alias="model_settings")
    _tools: ToolSet = attrs.field(factory=ToolSet, init=False)
    _inbox: Inbox = attrs.field(init=False)
    _history: History = attrs.field(init=False)
    # idle | maintenance | running; only the driver task, _start_activity and maintenance() change it.
    _phase: Phase = attrs.field(default="idle", init=False)
    _status: AgentStatus = attrs.field(default="idle", init=False)
    # A waking send arrived since the last claim (or since a cancel).
    _wake_requested: bool = attrs.field(default=False, init=False)
    # The current activity's cancel cause; the first cause wins.
    _cause: CancelCause | None = attrs.field(default=None, init=False)
    _activity_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The driver task: started at the first wake, parked (``_parked``) while idle.
    _driver_alive: bool = attrs.field(default=False, init=False)
    _parked: trio.lowlevel.Task | None = attrs.field(default=None, init=False)
    # An activity is under way in the driver task (its end sets the phase back to idle).
    _draining: bool = attrs.field(default=False, init=False)
    # Set whenever the phase returns to idle; replaced when activity starts.
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Set by the disposal close hook; no wake is ever latched after it.
    _disposing: bool = attrs.field(default=False, init=False)
    _last_turn: int = attrs.field(default=0, init=False)
    # The model settings of the running turn (from the message that opened it).
    _turn_settings: ModelSettings | None = attrs.field(default=None, init=False)
    # Provider, harness and agent settings merged (they do not change); built on first use.
    _base_settings: ModelSettings | None = attrs.field(default=None, init=False)
    _base_empty: bool | None = attrs.field(default=None, init=False)
    # The running turn's settings merged over the base, and whether that is empty:
    # merged once per turn, not per step.
    _merged_settings: tuple[ModelSettings, ModelSettings, ModelSettings, bool] | None = attrs.field(
        default=None, init=False
    )
    _usage: UsageCounter = attrs.field(init=False)
    _streams: StreamRegistry = attrs.field(factory=StreamRegistry, init=False)
    # run(): the output type of each queued run() prompt.
    _outputs: dict[str, PendingOutput] = attrs.field(factory=dict, init=False)
    # follow(): the prompts followed to the end of their turns (released at disposal).
    _followers: Followers = attrs.field(
        default=attrs.Factory(lambda self: Followers(self._session, self._cancel_followed), takes_self=True), init=False
    )
    # The output type of the running turn (from the run() prompt that opened it).
    _turn_output: PendingOutput | None = attrs.field(default=None, init=False)
    # The cancel scope of agent.compact() while it runs (disposal cancels it).
    _maintenance_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The cancel scope of the automatic compaction the driver runs as maintenance between
    # turns (cancel() and disposal cancel it), and whether it was cancelled.
    _auto_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _auto_cancelled: bool = attrs.field(default=False, init=False)
    # The turn after which an automatic compaction failed or was cancelled: not retried
    # between turns until another turn has run (the in-turn check still applies).
    _auto_skipped_at: int | None = attrs.field(default=None, init=False)
    # The session's usage when the running turn started.
    _turn_start_usage: UsageTotals = attrs.field(factory=UsageTotals, init=False)
    # The tools of the last step, their specs and names, while both tool sets hold
    # the same tools (and no tool_filter decides per step): built once, not per step.
    _tools_of: tuple[tuple[Tool, ...], tuple[Tool, ...]] | None = attrs.field(default=None, init=False)
    _tools_cached: dict[str, Tool] | None = attrs.field(default=None, init=False)
    _tool_specs: tuple[ToolSpec, ...] = attrs.field(default=(), init=False)
    _tool_names: tuple[str, ...] = attrs.field(default=(), init=False)

    def __attrs_post_init__(self) -> None:
        self._idle.set()
        self._inbox = Inbox.replay(self._session, notify=self._inbox_notice)
        # Once the agent has quiesced and its scope unwinds, the inbox is read
        # only: the session's final flush is next, and nothing may follow it.
        self._scope.add_exit_callback(self._seal_inbox)
        # Streams end and followers are released once the agent quiesced (they saw its
        # last events), before the seal.
        self._scope.add_exit_callback(self._release_observers)
        self._history = History(self._session)
        self._usage = UsageCounter(self._session)
        for event in self._session.events:
            if isinstance(event, ev.TurnStart):
                self._last_turn = event.turn
            elif isinstance(event, ev.CompactionFailed):
                self._auto_skipped_at = self._last_turn  # as the agent that logged it decided
        self._rebuild_standing()

    def __repr__(self) -> str:
        return f"<ReactAgent {self.id!r} {self._phase}>"

    # ------------------------------------------------------------ interface

    @property
    def id(self) -> str:
        """The agent id (== the session id)."""
        return self._session.id

    @property
    def options(self) -> AgentOptions:
        """This instance's options."""
        return self._options

    @property
    def session(self) -> Session:
        """The session this agent drives."""
        return self._session

    @property
    def inbox(self) -> Inbox:
        """The durable inbox."""
        return self._inbox

    @property
    def scope(self) -> Scope:
        """The agent's scope."""
        return self._scope

    @property
    def tools(self) -> ToolSet:
        """Tools and prompt sections local to this agent."""
        return self._tools

    @property
    def status(self) -> AgentStatus:
        """``"running"`` while an activity drains work, else ``"idle"``."""
        return self._status

    @property
    def parent_id(self) -> str | None:
        """The id of the agent that owns this one at runtime, if any."""
        return self._parent_id

    @property
    def provider(self) -> ModelProvider:
        """The model provider this instance calls."""
        return self._provider

    @property
    def approver(self) -> Approver | None:
        """The approver asked before calls that require approval (None: such calls are denied)."""
        return self._approver

    @property
    def standing_decisions(self) -> dict[str, ApprovalOutcome]:
        """The ``allow_always`` / ``deny_always`` decisions of this session, by tool name (a copy)."""
        return {name: outcome for name, (outcome, _) in self._standing.items()}

    @property
    def turn(self) -> int:
        """The number of the latest turn (0 before the first)."""
        return self._last_turn

    @property
    def usage(self) -> UsageTotals:
        """The session's model usage so far (folded from its log, so a resumed agent has the same)."""
        return self._usage.totals

    @property
    def cost(self) -> Decimal | None:
        """The session's usage in US dollars at this agent's model's prices (None when unknown).

        Needs the ``cost`` extra (``genai-prices``); see :meth:`cost_of`.
        """
        events = self._session.events
        last_end = next((e for e in reversed(events) if isinstance(e, ev.TurnEnd)), None)
        # priced as of the last turn's end: the same answer whenever it is asked
        return self.cost_of(self._usage.totals, at=last_end.ts if last_end is not None else None)

    def cost_of(self, usage: UsageTotals | None, *, at: float | None = None) -> Decimal | None:
        """``usage`` (e.g. a ``turn/end``'s) in US dollars at this agent's provider and model's prices.

        ``at`` is when the requests were made (seconds since the epoch, as an
        event's ``ts``; prices can depend on the time of day), None for now.
        None when ``genai-prices`` (the ``cost`` extra) is not installed, the
        usage is None, or the provider and model are not in its price table
        (docs/long-sessions.rst, "Usage and budgets").
        """
        provider, api_url = price_route(self._provider)
        when = None if at is None else datetime.datetime.fromtimestamp(at, datetime.UTC)
        return usage_cost(usage, self._model_name(), provider=provider, api_url=api_url, at=when)

    def send(self, message: str | InboxMessage, *, mode: SendMode, settings: ModelSettings | None = None) -> str:
        """Persist ``message`` into the inbox, then wake the driver unless ``mode`` is inject.

        Args:
            message: text, or a message object.
            mode: followup, steer or inject.
            settings: model settings for the turn the message opens (stored
                with the message, so a resumed agent uses them too).

        Returns:
            The message id.

        Raises:
            AgentDisposedError: the agent is being disposed.
        """
        msg, queue = self._route(message, mode, settings)
        self._inbox.append(queue, msg)
        if mode != "inject":
            self._wake()
        return msg.id

    def deliver_posted(self, message: InboxMessage) -> None:
        """Take a message posted through the store (``harness.sessions.post``), acting on it once stored.

        Its splice is logged now and the agent wakes (unless it is an inject)
        only after a flush has stored that splice with the mailbox delete: a
        worker that lost the session before that commit never acts on it,
        and the worker that takes the session over delivers it instead.

        Raises:
            AgentDisposedError: the agent is being disposed.
        """
        msg, queue = self._route(message, message.mode, None)
        self._inbox.stage(queue, msg, self._posted_applied)

    def _posted_applied(self, message: InboxMessage) -> None:
        if message.mode != "inject":
            self._wake()

    def _route(
        self, message: str | InboxMessage, mode: SendMode, settings: ModelSettings | None
    ) -> tuple[InboxMessage, ev.InboxQueue]:
        self._check_live("send it a message")
        if mode not in ("followup", "steer", "inject"):
            raise ValueError(f"unknown send mode {mode!r}; use followup, steer or inject")
        if settings is not None and not isinstance(settings, ModelSettings):
            raise TypeError(f"settings must be a ModelSettings or None, got {type(settings).__name__}")
        msg = Inbox.message(message, mode)
        if msg.mode != mode:
            msg = attrs.evolve(msg, mode=mode)
        if settings is not None:
            msg = attrs.evolve(msg, settings=settings)
        queue: ev.InboxQueue = "next-turn" if mode == "followup" else "next-step"
        if mode == "steer" and self._phase == "running" and self._cause is not None:
            queue = "next-turn"  # never join a converging, cancelled turn
        return msg, queue

    def followup(self, message: str | InboxMessage, *, settings: ModelSettings | None = None) -> str:
        """Queue ``message`` for a new turn and wake the agent (``settings``: that turn's model settings)."""
        return self.send(message, mode="followup", settings=settings)

    def steer(self, message: str | InboxMessage) -> str:
        """Queue ``message`` for the next step and wake the agent."""
        return self.send(message, mode="steer")

    def inject(self, message: str | InboxMessage) -> str:
        """Queue ``message`` for the next step without waking the agent."""
        return self.send(message, mode="inject")

    def cancel(self, cause: CancelCause = "user", *, keep_inbox: bool = False) -> bool:
        """Abort the current activity and (unless ``keep_inbox``) drop queued work.

        The activity is the running turn, or the automatic compaction running
        as maintenance between turns (stopped at once, nothing logged).

        Idle with nothing queued, this does nothing and emits nothing.  An
        effective call emits ``agent/cancel-requested`` before clearing or
        aborting.  The first cause of an activity is the one its turn records.

        Returns:
            Whether the call had an effect.

        Raises:
            AgentDisposedError: the agent is disposed or being disposed.  Its
                disposal already aborts the running turn; messages still queued
                stay in its session (resume it to cancel them), and nothing is
                written to a log that is already flushed and detached.
        """
        if cause not in ("user", "parent", "hook", "disposed"):
            raise ValueError(f"unknown cancel cause {cause!r}; use user, parent, hook or disposed")
        self._check_live("cancel it")
        active = self._phase == "running"
        maintaining = self._auto_scope is not None
        queued = bool(len(self._inbox)) and not keep_inbox
        if not active and not queued and not maintaining:
            return False
        self._bus.emit("agent/cancel-requested", self, cause=cause)
        if not keep_inbox:
            self._inbox.clear()
        self._wake_requested = False
        if maintaining:
            self._cancel_auto_maintenance()
        if active:
            if self._cause is None:
                self._cause = cause
            if self._activity_scope is not None:
                self._activity_scope.cancel()
        return True

    async def when_idle(self) -> None:
        """Wait until no activity or maintenance runs, following replacement work.

        Raises:
            SessionStoreError: events of the session could not be stored (a
                flush failed); they are retried first, so this raises only
                while the store still refuses them.
        """
        await self._quiesce()
        if self._session.store_failure is not None:
            await self._session.flush()

    async def _quiesce(self) -> None:
        while self._phase != "idle":
            await self._idle.wait()

    @asynccontextmanager
    async def maintenance(self) -> AsyncIterator[None]:
        """Hold the truly idle phase for maintenance work.

        Waking input received meanwhile stays in the inbox and starts the
        driver only after the block exits.

        Raises:
            AgentDisposedError: the agent is disposed or being disposed.
        """
        self._check_live("start maintenance")
        while self._phase != "idle":
            await self._quiesce()
            self._check_live("start maintenance")
        self._phase = "maintenance"
        self._idle = trio.Event()
        try:
            yield
        finally:
            self._phase = "idle"
            self._idle.set()
            if self._wake_requested and self._has_work():
                self._start_activity()

    def events(self, *, buffer: int = DEFAULT_STREAM_BUFFER) -> AbstractAsyncContextManager[EventStream]:
        """Stream this agent's session events from now on: ``async with agent.events() as stream:``.

        The stream holds at most ``buffer`` events; a consumer that falls
        behind gets a counted :class:`~trio_harness.agents.StreamGap` instead
        of the events it missed, and the agent never waits for it
        (docs/long-sessions.rst, "Event streams").  It ends when the block
        exits or the agent is disposed.

        Raises:
            AgentDisposedError: the agent is disposed or being disposed.
            ValueError: ``buffer`` is not a positive int.
        """
        return self._streams.open(self._session, buffer, lambda: self._check_live("stream its events"))

    def _release_observers(self) -> None:
        self._streams.close_all()
        self._followers.abandon_all()

    @overload
    async def run(
        self,
        prompt: str,
        *,
        output: None = None,
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[str]: ...

    @overload
    async def run(
        self,
        prompt: str,
        *,
        output: type[T],
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[T]: ...

    @overload
    async def run(
        self,
        prompt: str,
        *,
        output: Any,
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[Any]: ...

    async def run(
        self,
        prompt: str,
        *,
        output: Any = None,
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[Any]:
        """Send ``prompt`` as a followup and wait for the end of its turn.

        Args:
            prompt: the prompt text.
            output: a type the final answer must be JSON of (an attrs class,
                ``TypedDict``, dataclass, pydantic model, ``list[...]`` ...;
                what typed tools accept).  None returns the final text.
            retries: how many times an answer that does not validate is sent
                back to the model with the errors before giving up.
            settings: model settings of the turn.
            output_mode: how the typed answer is asked for: ``"native"``
                (the provider's JSON response format, the text answer
                validated), ``"tool"`` (a ``final_answer`` tool whose
                arguments are the answer) or ``"auto"`` (native where the
                provider declares a JSON-schema response format, else the
                tool).

        Returns:
            The :class:`~trio_harness.agents.RunResult`: the validated output
            (or the text), the final text and the turn's usage.

        Raises:
            RunError: the turn ended other than ``completed`` (its ``end``
                says how), or the prompt never ran.
            OutputValidationError: the answer did not validate after
                ``retries`` retries.
            ToolError: ``output`` is a type that cannot be described as JSON.
            AgentDisposedError: the agent is disposed or being disposed.

        Cancelling the call cancels its turn (cause ``user``; other queued
        prompts stay queued) or removes its prompt from the inbox.
        """
        self._check_live("run a prompt")
        if type(retries) is not int or retries < 0:
            raise ValueError(f"retries must be a non-negative int, got {retries!r}")
        if output_mode not in ("auto", "native", "tool"):
            raise ValueError(f"unknown output_mode {output_mode!r}; use auto, native or tool")
        adapter = None
        if output is not None:
            adapter = output_adapter(output, localns=caller_namespace(sys._getframe(1)))
        if output_mode == "auto":
            output_mode = "native" if supports_json_schema(self._provider) else "tool"
        message = Inbox.message(prompt, "followup")
        if adapter is None:
            return await run_prompt(self, message, None, settings=settings)
        # The turn that claims the message asks for the output (_run_step).
        pending = self._outputs[message.id] = PendingOutput(adapter, retries, output_mode)
        try:
            return await run_prompt(self, message, pending, settings=settings)
        finally:
            self._outputs.pop(message.id, None)

    def follow(
        self,
        message: str | InboxMessage,
        *,
        mode: SendMode = "followup",
        settings: ModelSettings | None = None,
        on_event: Callable[[ev.Event], None] | None = None,
        on_done: Callable[[TurnOutcome], None] | None = None,
    ) -> FollowedPrompt:
        """Send ``message`` and follow it to the end of the turn that runs it.

        Args:
            message: text, or a message object.
            mode: how it is sent, as for :meth:`send` (a steer joins the
                running turn, which is then the one followed).
            settings: model settings of the turn the message opens.
            on_event: called with each event of that turn, from the claim of
                the message up to its ``turn/end`` (excluded).
            on_done: called once with the outcome.

        Both callbacks are called synchronously from the session's append, as
        session observers are: they must not block, and their errors are
        logged (docs/long-sessions.rst, "Following a prompt").

        Returns:
            The :class:`~trio_harness.agents.FollowedPrompt`: its message id,
            its turn once claimed, ``await wait()`` for the outcome, and
            ``cancel()`` to stop the prompt alone.

        Raises:
            AgentDisposedError: the agent is disposed or being disposed.
        """
        self._check_live("follow a prompt")
        msg = Inbox.message(message, mode)
        followed = self._followers.watch(msg.id, on_event, on_done)
        try:
            self.send(msg, mode=mode, settings=settings)
        except BaseException:
            self._followers.release(followed)
            raise
        return followed

    def _cancel_followed(self, followed: FollowedPrompt) -> bool:
        """``followed.cancel()``: drop its prompt, or cancel its turn while it runs."""
        if self._disposing or self._scope.closing:
            return False
        if followed.message_id in self._inbox:
            self._inbox.remove(followed.message_id)
            return True
        if followed.turn is not None and followed.turn == self._last_turn and self._phase == "running":
            return self.cancel("user", keep_inbox=True)
        return False

    def _check_live(self, what: str) -> None:
        """Refuse an operation once disposal started (docs/guarantees.rst, "The driver")."""
        if self._disposing or self._scope.closing:
            raise AgentDisposedError(
                f"agent {self.id!r} is disposed (or being disposed); cannot {what}. "
                "Resume its session to work with it again"
            )

    # ------------------------------------------------------------ scheduling

    def _inbox_notice(self, kind: str, message: InboxMessage, turn: int | None) -> None:
        self._bus.emit(f"agent/inbox/{kind}", self, message=message, turn=turn)

    def _set_status(self, status: AgentStatus) -> None:
        if status != self._status:
            self._status = status
            self._bus.emit("agent/status", self, status=status)

    def _has_work(self) -> bool:
        return self._inbox.has_turn_work() or (self._wake_requested and self._inbox.has_step_work())

    def _wake(self) -> None:
        if self._disposing:
            return
        self._wake_requested = True
        if self._phase == "idle":
            self._start_activity()

    def _start_activity(self) -> None:
        # Teardown may have been requested before the close hook set _disposing
        # (the scope is already closing): no driver may start any more.
        if self._disposing or self._scope.closing:
            return
        # Maintenance due first (e.g. a resumed agent over its threshold): the agent
        # stays idle while it runs, and only then turns running for the work.
        due = self._maintenance_due()
        self._phase = "maintenance" if due else "running"
        self._cause = None
        self._idle = trio.Event()
        if not due:
            self._set_status("running")
        parked = self._parked
        if parked is not None:
            self._parked = None
            trio.lowlevel.reschedule(parked)
        elif not self._driver_alive:
            self._scope.spawn(self._drive, name=f"agent {self.id} driver")
            self._driver_alive = True
        # else: the driver is between two activities and sees the new phase before it parks.

    def _unpark(self, raise_cancel: object) -> trio.lowlevel.Abort:
        self._parked = None
        return trio.lowlevel.Abort.SUCCEEDED

    async def _drive(self) -> None:
        """The agent's driver task: started at the first wake, parked while idle, ended by disposal.

        One cancel scope serves every activity until one is cancelled; only
        then is a fresh one entered (entering a cancel scope per activity was
        the largest fixed cost of a turn).
        """
        _set_initiator(self.id)
        task = trio.lowlevel.current_task()
        try:
            while True:
                with trio.CancelScope() as activity:
                    while not activity.cancel_called:
                        if self._phase == "idle":
                            if self._disposing:
                                return  # quiesced for disposal: nothing can wake it any more
                            self._parked = task
                            await trio.lowlevel.wait_task_rescheduled(self._unpark)
                            continue
                        await self._drain(activity)
                # The activity was cancelled: a waking send latched after the cancel runs now.
                self._activity_scope = None
                if self._draining:
                    if self._disposing or not (self._wake_requested and self._has_work()):
                        self._end_drain()
                    else:
                        self._cause = None
        finally:
            self._driver_alive = False
            self._parked = None
            if self._draining:
                self._end_drain()

    def _end_drain(self) -> None:
        self._draining = False
        self._activity_scope = None
        self._cause = None
        self._phase = "idle"
        # Release waiters before notifying: a status listener may start the
        # next activity, whose fresh idle event must stay unset.
        self._idle.set()
        self._set_status("idle")

    async def _drain(self, activity: trio.CancelScope) -> None:
        """Run the work of one activity; returns at its end, or once ``activity`` is cancelled."""
        self._draining = True
        while not self._disposing:
            if self._phase == "maintenance":
                # Automatic compaction between turns (docs/long-sessions.rst,
                # "Context-window management"): the agent is idle meanwhile,
                # and queued work runs once it ends.
                cancelled = await self._run_auto_maintenance()
                # After a cancel, only a wake latched since then goes on (as for a turn).
                if self._disposing or (cancelled and not self._wake_requested) or not self._has_work():
                    break
                self._phase = "running"
                self._cause = None
                self._set_status("running")
            self._activity_scope = activity
            if self._cause is not None:
                activity.cancel()
            await self._run_work()  # the activity's own Cancelled leaves through _drive's scope
            self._activity_scope = None
            if self._cause is not None:
                activity.cancel()  # cancelled past its last checkpoint: _drive decides what follows
                return
            if not self._disposing and self._maintenance_due():
                self._phase = "maintenance"  # public status: idle
                self._set_status("idle")
                continue
            break
        self._end_drain()

    async def _run_work(self) -> None:
        if self._cause is not None:
            await self._run_turn()  # records the pre-run cancellation as an aborted turn
            return
        while self._has_work() and self._cause is None:
            if self._maintenance_due():
                return  # the drain compacts as maintenance first, then comes back for the work
            await self._run_turn()

    def _seal_inbox(self) -> None:
        self._inbox.seal(f"agent {self.id!r} is disposed; resume its session to change its inbox")

    def dispose_hook(self) -> Awaitable[None] | None:
        """Close hook run first when the agent scope closes: stop and quiesce.

        Returns an awaitable only when there is something to wait for, so
        disposing an idle agent costs no checkpoint.
        """
        self._disposing = True
        self._wake_requested = False
        if self._maintenance_scope is not None:
            self._maintenance_scope.cancel()  # a compaction in progress: compacts nothing
        if self._auto_scope is not None:
            self._auto_scope.cancel()  # likewise for the automatic one
        if self._phase == "running":
            if self._cause is None:
                self._cause = "disposed"
            if self._activity_scope is not None:
                self._activity_scope.cancel()
        if self._phase == "idle":
            parked = self._parked
            if parked is not None:  # woken, it sees _disposing and returns (no Cancelled to raise)
                self._parked = None
                trio.lowlevel.reschedule(parked)
            return None
        return self._quiesce()  # a store failure is reported by the session's detach

    # ------------------------------------------------------------ turns

    async def _run_turn(self) -> None:
        turn = self._last_turn = self._last_turn + 1
        session = self._session
        self._turn_settings = None
        self._turn_output = None
        self._turn_start_usage = self._usage.totals
        session.append(ev.TurnStart, turn=turn)
        reason: TurnEndReason = "completed"
        failure: Failure | None = None
        try:
            step = 0
            while self._cause is None:
                step += 1
                if step > self._options.max_steps:
                    reason = "blocked"
                    failure = Failure("max-steps", f"the turn reached max_steps={self._options.max_steps}")
                    break
                try:
                    outcome = await self._run_step(turn, step)
                except Exception as exc:
                    # A bug or a failing hook (tool filter, prompt section, ...):
                    # end the turn as an error instead of crashing the scope tree.
                    log.exception("agent %s: step %d of turn %d failed", self.id, step, turn)
                    reason = "error"
                    failure = Failure("driver-error", f"the turn failed: {exc!r}")
                    break
                if outcome is not None:
                    reason, failure = outcome
                    break
        finally:
            cause = self._cause
            if cause is not None:
                reason, failure = "aborted", None
            # Shielded when a flush may wait (a flush that never waits cannot be cancelled).
            with trio.CancelScope(shield=True) if session.flush_waits else _UNSHIELDED:
                # Hand the turn's events to the store before logging how the
                # turn ended, so a store that refuses them ends the turn in
                # ``error`` instead of a ``completed`` nobody stored
                # (docs/guarantees.rst, "No silent loss").
                try:
                    await session.flush(sync=False)
                except SessionStoreError as exc:
                    reason, failure = "error", Failure("store-error", str(exc))
                usage = self._usage.totals - self._turn_start_usage
                session.append(ev.TurnEnd, turn=turn, reason=reason, cause=cause, failure=failure, usage=usage)
                # Between turns the request is the log's alone (what a resumed agent sees).
                self._turn_settings = None
                self._turn_output = None
                try:
                    await session.flush()
                except SessionStoreError:
                    # Kept on session.store_failure: when_idle() retries and
                    # raises it, dispose() and the harness exit report it.
                    log.warning("agent %s: the end of turn %d could not be stored", self.id, turn)

    async def _run_step(self, turn: int, step: int) -> tuple[TurnEndReason, Failure | None] | None:
        session = self._session
        session.append(ev.StepStart, turn=turn, step=step)
        try:
            # Reset before claiming: a wake raised while the claim is logged
            # (a session observer sending) must survive.
            self._wake_requested = False
            claimed = self._inbox.claim(turn, turn_boundary=step == 1)
            for message in claimed:
                session.append(
                    ev.UserMessage,
                    turn=turn,
                    step=step,
                    message_id=message.id,
                    text=message.text,
                    mode=message.mode,
                    origin=message.origin,
                )
                if message.settings is not None and self._turn_settings is None:
                    self._turn_settings = message.settings
                if self._outputs and self._turn_output is None:
                    self._turn_output = self._outputs.get(message.id)
            exhausted = self._budget_failure()
            if exhausted is not None:
                return "budget", exhausted
            tools = self._available_tools()
            try:
                finish, calls = await self._ask(turn, step, tools)
            except _OverBudget as exc:  # the request after a compaction, or the retry after a refusal
                return "budget", exc.failure
            if finish.reason == "error":
                return "error", finish.failure
            if calls:
                await self._run_tools(turn, step, calls, tools)
                pending = self._turn_output
                if pending is not None and pending.tool is not None:  # a final_answer call settles the turn
                    if pending.valid:
                        return "completed", None
                    if pending.failure is not None:
                        return "error", pending.failure
                return None
            if finish.reason == "max-tokens":
                return "max-tokens", None
            if self._turn_output is not None:
                return self._check_output(self._turn_output)
            return "completed", None
        finally:
            session.append(ev.StepEnd, turn=turn, step=step)

    def _check_output(self, pending: PendingOutput) -> tuple[TurnEndReason, Failure | None] | None:
        """Validate a run() turn's final answer: complete it, steer the errors back, or fail it."""
        events = self._session.events
        text = ""
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if type(event) is ev.AssistantMessage:
                text = event.text
                break
        verdict = pending.check(text)
        if verdict is None:
            return "completed", None
        if isinstance(verdict, Failure):
            return "error", verdict
        self._inbox.append("next-step", Inbox.message(verdict, "steer"))
        return None

    def _available_tools(self) -> dict[str, Tool]:
        """The tools of the next step (do not mutate: it may be the previous step's dict)."""
        shared, own = self._shared_tools.tools(), self._tools.tools()
        keep = self._options.tool_filter
        pending = self._turn_output
        answer_tool = pending.tool if pending is not None else None  # a run() turn in "tool" output mode
        if keep is None and answer_tool is None:
            seen = self._tools_of
            # Tools compare by identity: the same tool objects, in the same order.
            cached = self._tools_cached
            if cached is not None and seen is not None and seen[0] == shared and seen[1] == own:
                return cached
        tools = {tool.name: tool for tool in shared}
        for tool in own:
            tools[tool.name] = tool
        if keep is not None:
            tools = {name: tool for name, tool in tools.items() if keep(tool)}
        if answer_tool is not None:
            tools[answer_tool.name] = answer_tool
        if keep is not None or answer_tool is not None:
            return tools  # decided per step: not cached
        self._tools_of = (shared, own)
        self._tools_cached = tools
        self._tool_specs = tuple(tool.spec for tool in tools.values())
        self._tool_names = tuple(tools)
        return tools

    async def _ask(self, turn: int, step: int, tools: dict[str, Tool]) -> tuple[Finish, list[ToolCall]]:
        """Log the request header and stream the request; compact first when the context is full.

        A request the provider refuses as too long for the context window is
        retried once after a compaction (docs/long-sessions.rst).  Every
        request is checked against the budgets first.

        Raises:
            _OverBudget: a budget forbids the request, or the compaction
                that would make the refused request fit.
        """
        session = self._session
        failure = await self._compact_if_due(turn)
        if failure is not None:
            return Finish("error", failure), []
        retried = False
        while True:
            exhausted = self._budget_failure()  # the summary requests of a compaction count
            if exhausted is not None:
                raise _OverBudget(exhausted)
            request = self._build_request(tools)
            session.append(
                ev.RequestHeader,
                turn=turn,
                step=step,
                provider=self._provider.name,
                model=request.model,
                tools=self._tool_names if tools is self._tools_cached else tuple(tools),
                max_tokens=request.max_tokens,
                settings=self._header_settings(request.settings),
            )
            finish, calls = await self._stream(request, turn, step)
            if retried or finish.reason != "error" or not is_context_overflow(finish.failure):
                return finish, calls
            retried = True
            refused = finish.failure.message if finish.failure is not None else "too long"
            try:
                compacted = await self._compact("overflow", turn)
            except SummaryOverBudget as exc:
                message = f"{exc.failure.message}: no compaction to make the refused request fit ({refused})"
                raise _OverBudget(attrs.evolve(exc.failure, message=message)) from None
            except CompactionError as exc:
                return Finish("error", Failure("compaction-failed", f"{exc} (after the provider said: {refused})")), []
            if compacted is None:
                return finish, calls  # nothing left to compact: the refusal stands

    def _system_prompt(self) -> str:
        sections = (*self._shared_tools.prompt_sections(), *self._tools.prompt_sections())
        summary = self._history.summary
        if summary is not None:
            sections = (*sections, summary_section(summary))
        if self._turn_output is not None:
            sections = (*sections, output_instructions(self._turn_output))
        return "\n\n".join((self._options.system_prompt, *sections)) if sections else self._options.system_prompt

    def _model_name(self) -> str:
        return self._options.model_name or getattr(self._provider, "model", "") or ""

    def _build_request(self, tools: dict[str, Tool]) -> ModelRequest:
        settings = self._model_settings()
        messages = self._history.messages()
        processor = self._options.history_processor
        if processor is not None:
            messages = processor(messages)
        return ModelRequest(
            model=self._model_name(),
            system=self._system_prompt(),
            messages=messages,
            tools=self._tool_specs if tools is self._tools_cached else tuple(tool.spec for tool in tools.values()),
            max_tokens=settings.max_tokens,
            settings=settings,
            output=self._turn_output.request_format if self._turn_output is not None else None,
        )

    # ------------------------------------------------------------ context window

    def _context_window(self) -> int | None:
        window = self._options.context.window
        if window is None:
            window = getattr(self._provider, "context_window", None)
        return window if type(window) is int and window > 0 else None

    def _fixed_chars(self) -> int:
        """The characters of the request besides the conversation: system prompt (summary included) and tools."""
        specs = tuple(tool.spec for tool in self._available_tools().values())
        return len(self._system_prompt()) + tools_chars(specs)

    def context_estimate(self) -> int:
        """The estimated tokens of the next request (O(events appended since the last estimate))."""
        return self._history.estimate(self._fixed_chars)

    async def _compact_if_due(self, turn: int) -> Failure | None:
        """Compact when the next request would pass the policy's threshold; a failure ends the turn."""
        policy = self._options.context
        if not policy.auto:
            return None
        window = self._context_window()
        if window is None:
            return None
        estimate = self.context_estimate()
        if estimate <= policy.threshold * window:
            return None
        try:
            await self._compact("threshold", turn, estimate)
        except SummaryOverBudget as exc:
            # The budgets cannot afford the compaction: the step goes as it is (threshold is below the
            # window), checked against the budgets itself; summary requests already made were logged.
            log.debug("agent %s: no compaction in turn %d: %s", self.id, turn, exc)
        except CompactionError as exc:
            return Failure(
                "compaction-failed",
                f"the next request (about {estimate} tokens) passes {policy.threshold:.0%} of the context window "
                f"({window} tokens) and could not be compacted: {exc}",
            )
        return None

    def _plan_compaction(
        self, turn: int | None, estimate: int, keep: int | None, *, all_but_latest: bool = False
    ) -> tuple[ContextPolicy, int | None, TurnMark, Sequence[Message]] | None:
        """Where a compaction would cut, and with which policy; None when nothing can be compacted.

        ``all_but_latest`` (an explicit ``compact()`` without ``keep_tokens``)
        cuts at the start of the latest turn, whatever the window.
        """
        history = self._history
        messages = history.messages()
        policy = self._options.context
        window = self._context_window()
        if window is not None:
            policy = attrs.evolve(policy, summary_tokens=min(policy.summary_tokens, max(window // 8, 16)))
        if all_but_latest:
            latest = history.last_mark
            if latest is None or latest.index == 0:
                return None  # a single turn (since the last compaction): nothing before it
            return policy, window, latest, messages
        if keep is not None:
            pass
        elif window is None:
            keep = int(policy.keep * estimate)  # refused as too long by a model of unknown window
        else:
            keep = int(policy.keep * window)
            # What the request needs besides the kept turns (system prompt, tools, summary) must leave
            # room below the threshold, or every step would compact again.
            room = policy.threshold * window - tokens_for_chars(self._fixed_chars()) - policy.summary_tokens
            keep = max(0, min(keep, int(room / 2)))
        marks = history.marks
        if turn is None:  # between turns, the end of the conversation is a turn boundary too
            marks = (*marks, TurnMark(seq=len(self._session), index=len(messages), chars=history.chars))
        mark = choose_boundary(marks, history.chars, keep * CHARS_PER_TOKEN)
        if mark is None:
            return None
        return policy, window, mark, messages

    async def _compact(
        self,
        reason: ev.CompactionReason,
        turn: int | None,
        estimate: int | None = None,
        keep: int | None = None,
        *,
        all_but_latest: bool = False,
    ) -> ev.ContextCompacted | None:
        """Summarize the conversation before a turn boundary and log it; None when nothing can be compacted.

        Nothing is logged until the summary is complete, but a compaction
        that fails, or is cancelled after a summary request completed, logs
        ``context/compaction-failed`` with what it spent.

        Raises:
            CompactionError: the summary request failed.
        """
        if estimate is None:
            estimate = self.context_estimate()
        plan = self._plan_compaction(turn, estimate, keep, all_but_latest=all_but_latest)
        if plan is None:
            return None
        policy, window, mark, messages = plan
        # What the summary requests completed so far spent: ``summarize`` asks ``check`` before each
        # request with it, so a cancellation during a request knows the usage of those before it.
        spent = UsageTotals()
        budget_check = self._summary_check(turn)

        def check(usage: UsageTotals, remaining: int) -> Failure | None:
            nonlocal spent
            spent = usage
            return budget_check(usage, remaining) if budget_check is not None else None

        try:
            summary, usage, partials = await summarize(
                self._provider,
                model=self._model_name(),
                settings=self._model_settings(),
                policy=policy,
                previous=self._history.summary,
                messages=messages[: mark.index],
                window=window,
                check=check,
            )
        except trio.Cancelled:
            if spent.requests:  # cancelled after a summary request completed: what it spent is logged and counts
                failure = Failure("cancelled", "the compaction was cancelled")
                self._session.append(ev.CompactionFailed, reason=reason, failure=failure, turn=turn, usage=spent)
                self._auto_skipped_at = self._last_turn
            raise
        except SummaryOverBudget as exc:
            if exc.usage.requests:  # stopped part-way (a token budget): what it spent is logged and counts
                self._session.append(
                    ev.CompactionFailed, reason=reason, failure=exc.failure, turn=turn, usage=exc.usage
                )
                self._auto_skipped_at = self._last_turn
            raise  # not started: nothing to log, a resumed agent decides the same from the log
        except SummaryFailed as exc:
            # Logged: its usage counts, and a resumed agent skips as this one does.
            self._session.append(ev.CompactionFailed, reason=reason, failure=exc.failure, turn=turn, usage=exc.usage)
            self._auto_skipped_at = self._last_turn
            raise
        return self._session.append(
            ev.ContextCompacted,
            boundary=mark.seq,
            summary=summary,
            reason=reason,
            turn=turn,
            tokens_before=estimate,
            usage=usage,
            partials=partials,
        )

    # ------------------------------------------------------------ maintenance

    def _maintenance_due(self) -> bool:
        """Whether to compact between turns, before the agent goes idle or takes its next input.

        Due when the next request, plus a turn as large as the last one,
        would pass the policy's threshold, and something can be compacted:
        the compaction then runs between turns as maintenance instead of
        inside the next turn (docs/long-sessions.rst, "Context-window
        management").  A pure function of the log, so a resumed agent decides
        as a never-restarted one would.
        """
        policy = self._options.context
        if not policy.auto or self._disposing or self._auto_skipped_at == self._last_turn:
            return False
        window = self._context_window()
        if window is None:
            return False
        if budget_failure(self._options.session_budget, self._usage.totals, "session") is not None:
            return False  # a summary request is a request: not made past the session's budget
        try:
            history = self._history
            estimate = self.context_estimate()
            last = history.last_mark
            growth = history.chars - last.chars if last is not None else 0
            if estimate + tokens_for_chars(growth) <= policy.threshold * window:
                return False
            return self._plan_compaction(None, estimate, None) is not None
        except Exception:
            # A failing hook (prompt section, tool filter): the next step meets it
            # too and ends its turn with the error (driver-error), so it is not lost.
            log.debug("agent %s: the maintenance check failed", self.id, exc_info=True)
            return False

    async def _run_auto_maintenance(self) -> bool:
        """Run the automatic compaction as maintenance; returns whether cancel() cancelled it.

        A failure is reported (``agent/compaction-failed`` on the bus, a
        warning in the log) and the compaction is not retried before another
        turn has run; a turn whose request still passes the threshold
        compacts inside the turn and ends with ``compaction-failed`` if that
        fails too.  A cancelled compaction compacts nothing (it logs what its
        completed summary requests spent, as ``context/compaction-failed``).
        """
        self._auto_cancelled = False
        with trio.CancelScope() as scope:
            self._auto_scope = scope
            if self._disposing:
                scope.cancel()
            try:
                await self._compact("threshold", None)
            except SummaryOverBudget as exc:
                # The session's budget cannot afford it: not a failure, as when it is used up already
                # (a compaction stopped part-way by a token limit is logged, and reported).
                self._auto_skipped_at = self._last_turn
                if exc.usage.requests:
                    log.warning("agent %s: automatic compaction stopped: %s", self.id, exc)
                    self._bus.emit("agent/compaction-failed", self, error=exc)
                else:
                    log.debug("agent %s: no automatic compaction: %s", self.id, exc)
            except Exception as exc:
                self._auto_skipped_at = self._last_turn
                log.warning("agent %s: automatic compaction failed: %s", self.id, exc)
                self._bus.emit("agent/compaction-failed", self, error=exc)
            finally:
                self._auto_scope = None
        if scope.cancelled_caught:
            self._auto_skipped_at = self._last_turn
        return self._auto_cancelled

    def _cancel_auto_maintenance(self) -> None:
        if self._auto_scope is not None:
            self._auto_cancelled = True
            self._auto_scope.cancel()

    async def compact(self, *, keep_tokens: int | None = None) -> ev.ContextCompacted | None:
        """Compact the conversation now, as a maintenance activity.

        Waits until the agent is idle and holds it idle meanwhile: waking
        input waits in the inbox until the compaction ends
        (docs/guarantees.rst, "The driver").  Everything before the latest
        turn is summarized by the model (the latest turn stays as it is,
        whatever the context window) and a ``context/compacted`` event is
        logged; with ``keep_tokens``, the latest turns that fit in that many
        tokens stay instead (``0``: every finished turn is summarized).

        Returns:
            The ``context/compacted`` event, or None when there is nothing to
            compact (a single turn since the start or the last compaction, or,
            with ``keep_tokens``, every turn fits in it).

        Raises:
            CompactionError: the summary request failed (nothing is
                compacted), or the session's budget does not allow its
                summary requests (docs/long-sessions.rst, "Usage and budgets").
            AgentDisposedError: the agent is disposed, or was disposed while
                compacting (nothing is logged).
        """
        if keep_tokens is not None and (type(keep_tokens) is not int or keep_tokens < 0):
            raise ValueError(f"keep_tokens must be a non-negative int or None, got {keep_tokens!r}")
        async with self.maintenance():
            with trio.CancelScope() as scope:
                self._maintenance_scope = scope
                try:
                    return await self._compact("manual", None, keep=keep_tokens, all_but_latest=keep_tokens is None)
                finally:
                    self._maintenance_scope = None
        raise AgentDisposedError(f"agent {self.id!r} was disposed while compacting; nothing was compacted")

    def _summary_check(self, turn: int | None) -> BudgetCheck | None:
        """The budget check of a compaction's summary requests (None: no budget applies).

        Inside a turn the turn's and the session's budgets apply, and there
        must be room for the step's request after the summaries; between
        turns (maintenance, ``agent.compact()``) the session's budget.
        """
        options = self._options
        turn_budget = options.turn_budget if turn is not None else None
        session_budget = options.session_budget
        if turn_budget is None and session_budget is None:
            return None
        reserve = 0 if turn is None else 1

        def check(spent: UsageTotals, needed: int) -> Failure | None:
            totals = self._usage.totals + spent
            purpose = f"the compaction's {needed} summary request{'s' if needed > 1 else ''}"
            if reserve:
                purpose += " and the step's request after it"
            return budget_failure(
                turn_budget, totals - self._turn_start_usage, "turn", needed=needed + reserve, purpose=purpose
            ) or budget_failure(session_budget, totals, "session", needed=needed + reserve, purpose=purpose)

        return check

    def _budget_failure(self) -> Failure | None:
        """Why the next request must not be made: a turn or session budget is used up (else None)."""
        options = self._options
        if options.turn_budget is None and options.session_budget is None:
            return None
        totals = self._usage.totals
        return budget_failure(options.turn_budget, totals - self._turn_start_usage, "turn") or budget_failure(
            options.session_budget, totals, "session"
        )

    def _header_settings(self, settings: ModelSettings) -> ModelSettings | None:
        """What ``request/header`` records: the settings, or None when none is set."""
        if settings is self._base_settings and self._base_empty is not None:
            return None if self._base_empty else settings
        merged = self._merged_settings
        if merged is not None and settings is merged[2]:
            return None if merged[3] else settings
        return None if settings.empty else settings

    def _model_settings(self) -> ModelSettings:
        """The merged settings of the next request: turn > agent > harness > the provider's (its spec)."""
        base = self._base_settings
        if base is None:
            provider = getattr(self._provider, "settings", None)
            base = provider if isinstance(provider, ModelSettings) else _NO_SETTINGS
            base = base.merge(self._harness_settings)
            if self._options.max_tokens is not None:
                base = base.merge(ModelSettings(max_tokens=self._options.max_tokens))
            base = self._base_settings = base.merge(self._options.model_settings)
            self._base_empty = base.empty
        turn = self._turn_settings
        if turn is None:
            return base
        merged = self._merged_settings
        if merged is not None and merged[0] is turn and merged[1] is base:
            return merged[2]
        settings = base.merge(turn)
        self._merged_settings = (turn, base, settings, settings.empty)
        return settings

    def build_request(self) -> ModelRequest:
        """The request the next step would send (for inspection and tests)."""
        return self._build_request(self._available_tools())

    # ------------------------------------------------------------ streaming

    async def _stream(self, request: ModelRequest, turn: int, step: int) -> tuple[Finish, list[ToolCall]]:
        session = self._session
        text: list[str] = []
        reasoning: list[str] = []
        pieces: dict[int, list[Any]] = {}
        usage: Usage | None = None
        finish: Finish | None = None

        def emit(chunk: Chunk) -> None:
            nonlocal usage, finish
            if finish is not None:
                return  # nothing counts after the finish
            # ``type(chunk) is`` narrows like isinstance and is cheaper on this hot path.
            if type(chunk) is TextDelta:
                text.append(chunk.text)
                session.append(ev.AssistantChunk, turn=turn, step=step, kind="text", text=chunk.text)
            elif type(chunk) is ReasoningDelta:
                reasoning.append(chunk.text)
                session.append(ev.AssistantChunk, turn=turn, step=step, kind="reasoning", text=chunk.text)
            elif type(chunk) is ToolCallDelta:
                entry = pieces.setdefault(chunk.index, [None, None, []])
                if chunk.id:
                    entry[0] = chunk.id
                if chunk.name:
                    entry[1] = chunk.name
                if chunk.arguments:
                    entry[2].append(chunk.arguments)
            elif type(chunk) is Usage:
                usage = chunk
            elif type(chunk) is Finish:
                finish = chunk
            elif type(chunk) is Retry:
                session.append(
                    ev.RequestRetry,
                    turn=turn,
                    step=step,
                    attempt=chunk.attempt,
                    delay=chunk.delay,
                    failure=chunk.failure,
                )

        try:
            await self._provider.stream(request, emit)
        except BaseException as exc:
            cancelled, failed = _split_cancelled(exc)
            if cancelled is None:
                if not isinstance(failed, Exception):
                    raise
                log.exception("agent %s: model provider %s raised", self.id, self._provider.name)
                finish = Finish("error", Failure("provider-crashed", f"the model provider raised {failed!r}"))
            else:
                if failed is not None:
                    log.error(
                        "agent %s: model provider %s raised while cancelled: %r", self.id, self._provider.name, failed
                    )
                self._log_partial(turn, step, text, reasoning, usage)
                if cancelled is exc:
                    raise
                raise cancelled from None
        if finish is None:
            finish = Finish("error", Failure("no-finish", "the model stream ended without a finish"))
        if finish.reason == "error" and finish.failure is None:
            finish = Finish("error", Failure("unknown", "the model reported an error without details"))
        calls: list[ToolCall] = []
        if finish.reason != "error":
            for index in sorted(pieces):
                call_id, name, args = pieces[index]
                if not name:
                    continue
                calls.append(
                    _tool_call(id=call_id or f"call-{turn}-{step}-{index}", name=name, arguments="".join(args))
                )
        session.append(
            ev.AssistantMessage,
            turn=turn,
            step=step,
            text="".join(text),
            reasoning="".join(reasoning),
            tool_calls=tuple(calls),
            usage=usage,
            finish=finish.reason,
        )
        return finish, calls

    def _log_partial(self, turn: int, step: int, text: list[str], reasoning: list[str], usage: Usage | None) -> None:
        """Log what a cancelled stream had produced, as an aborted assistant message."""
        if text or reasoning:
            self._session.append(
                ev.AssistantMessage,
                turn=turn,
                step=step,
                text="".join(text),
                reasoning="".join(reasoning),
                usage=usage,
                finish="aborted",
            )

    # ------------------------------------------------------------ approval

    def _rebuild_standing(self) -> None:
        """Remember the ``*_always`` decisions of this session's log (a fork's copied events excluded)."""
        events = self._session.events
        for index in range(self._session.header.seed_length, len(events)):
            event = events[index]
            if type(event) is ev.ApprovalDecided and event.outcome in ("allow_always", "deny_always"):
                self._standing[event.name] = (event.outcome, event.message)

    async def _approve(
        self,
        approver: Approver | None,
        tool: Tool,
        call: ToolCall,
        args: dict[str, Any],
        turn: int,
        step: int,
        asked: list[trio.Event] | None,
        index: int,
    ) -> str | None:
        """Decide whether ``call`` runs: None to run it, else the error result to give the model.

        Runs in the turn's cancel scope: a cancel or a disposal while waiting
        raises :class:`trio.Cancelled` here, after ``approval/decided`` records
        it, and the call gets the synthetic "not run" result of an aborted turn.
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
                message = f"deciding whether the call needs approval failed: {_describe(exc)}"
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
            if approver is None:
                # Nobody to ask: denied, saying how to allow it (docs/approval.rst).
                message = _NO_APPROVER.format(name=call.name)
                if not self._warned_no_approver:
                    self._warned_no_approver = True
                    log.warning("agent %s: %s", self.id, message)
                session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                return f"error: denied: {message}; the call did not run"
            session.append(ev.ApprovalRequested, **where, arguments=call.arguments)
            request = ApprovalRequest(
                tool=call.name,
                arguments=args,
                raw_arguments=call.arguments,
                call_id=call.id,
                agent_id=self.id,
                turn=turn,
                step=step,
                agent=self,
            )
            try:
                decision: object = await approver(request)
            except BaseException as exc:
                cancelled, failed = _split_cancelled(exc)
                if cancelled is None:
                    if not isinstance(failed, Exception):
                        raise
                    log.debug("agent %s: the approver raised", self.id, exc_info=True)
                    message = f"the approver failed: {_describe(failed)}"
                    session.append(ev.ApprovalDecided, **where, outcome="deny", source="error", message=message)
                    return f"error: denied: approval could not be obtained ({message}); the call did not run"
                # The wait ended by a cancel or a disposal: the call does not run.
                note = f"the approver also raised: {_describe(failed)}" if failed is not None else None
                session.append(
                    ev.ApprovalDecided,
                    **where,
                    outcome="cancelled",
                    source="cancelled",
                    message=note,
                    cause=self._cause,
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
                session.append(
                    ev.ApprovalDecided,
                    **where,
                    outcome="cancelled",
                    source="cancelled",
                    message=late,
                    cause=self._cause,
                )
                await trio.lowlevel.checkpoint()  # raises Cancelled
            session.append(ev.ApprovalDecided, **where, outcome=verdict, source="approver", message=decision.message)
            if verdict == "allow_always" or verdict == "deny_always":
                self._standing[call.name] = (verdict, decision.message)
            if not decision.allowed:
                return _denied_text(call.name, verdict, decision.message)
            return None
        finally:
            if asked is not None:
                asked[index].set()

    # ------------------------------------------------------------ tools

    async def _run_tools(self, turn: int, step: int, calls: list[ToolCall], tools: dict[str, Tool]) -> None:
        session = self._session
        count = len(calls)
        results: list[tuple[str, bool] | None] = [None] * count
        logged = 0
        approver = self._approver
        # Approval asks are sequential, in model order, also for calls that run in
        # parallel: call i asks once every earlier call is past its approval (docs/approval.rst).
        asked = [trio.Event() for _ in range(count)] if approver is not None and count > 1 else None

        def deliver(index: int, content: str, is_error: bool) -> None:
            nonlocal logged
            if results[index] is not None:
                return
            results[index] = (content, is_error)
            while logged < count and (result := results[logged]) is not None:
                call = calls[logged]
                session.append(
                    ev.ToolResult,
                    turn=turn,
                    step=step,
                    call_id=call.id,
                    name=call.name,
                    content=result[0],
                    is_error=result[1],
                )
                logged += 1

        async def run_one(index: int, limiter: trio.CapacityLimiter | None) -> None:
            call = calls[index]
            tool = tools.get(call.name)
            session.append(
                ev.ToolCallRequested, turn=turn, step=step, call_id=call.id, name=call.name, arguments=call.arguments
            )
            if tool is None:
                known = ", ".join(sorted(tools)) or "none"
                deliver(index, f"error: unknown tool {call.name!r}; available tools: {known}", True)
                if asked is not None:
                    asked[index].set()
                return
            try:
                args = tool.validate(call.arguments)
            except Exception as exc:  # bad arguments; or a schema that cannot be checked: this call's error only
                text = (
                    str(exc)
                    if isinstance(exc, ValueError)
                    else f"the arguments for tool {call.name!r} could not be checked: {_describe(exc)}"
                )
                deliver(index, f"error: {text}", True)
                if asked is not None:
                    asked[index].set()
                return
            if tool.requires_approval is not False:
                refusal = await self._approve(approver, tool, call, args, turn, step, asked, index)
                if refusal is not None:
                    deliver(index, refusal, True)
                    return
            elif asked is not None:
                asked[index].set()
            ctx = _tool_context(agent=self, agents=self._agents, call_id=call.id, turn=turn, step=step)
            try:
                if limiter is None:
                    self._bus.emit("agent/tool/started", self, turn=turn, step=step, call_id=call.id, tool=call.name)
                    output = await tool.handler(ctx, args)
                else:
                    async with limiter:
                        self._bus.emit(
                            "agent/tool/started", self, turn=turn, step=step, call_id=call.id, tool=call.name
                        )
                        output = await tool.handler(ctx, args)
            except BaseException as exc:
                # Cancellation may arrive wrapped in an exception group (a tool
                # with its own nursery), possibly beside the tool's own errors.
                cancelled, failed = _split_cancelled(exc)
                if failed is not None and not isinstance(failed, Exception):
                    raise
                if failed is not None:
                    log.debug("tool %s raised", call.name, exc_info=True)
                    deliver(index, f"error: tool {call.name!r} failed: {_describe(failed)}", True)
                if cancelled is None:
                    return
                deliver(index, f"error: cancelled: the turn was aborted (cause: {self._cause or 'cancelled'})", True)
                if cancelled is exc:
                    raise
                raise cancelled from None
            if isinstance(output, ToolOutput):
                deliver(index, output.content, output.is_error)
            else:
                deliver(index, output if isinstance(output, str) else str(output), False)

        try:
            index = 0
            while index < count:
                tool = tools.get(calls[index].name)
                end = index + 1
                if tool is not None and tool.parallel_safe:
                    while end < count and (other := tools.get(calls[end].name)) is not None and other.parallel_safe:
                        end += 1
                if end - index == 1:
                    await run_one(index, None)
                else:
                    limiter = trio.CapacityLimiter(self._options.tool_concurrency)
                    async with trio.open_nursery() as nursery:
                        for i in range(index, end):
                            nursery.start_soon(run_one, i, limiter)
                index = end
        finally:
            if logged < count:  # some call has no result yet: it did not run to the end
                for index in range(count):
                    deliver(index, _aborted_text(self._cause), True)
