"""The turn driver: a ReAct loop around one session (the default agent implementation).

Phases: ``idle``, ``maintenance`` and ``running``; the public status maps
maintenance to ``idle``.  Maintenance is ``agent.compact()`` or
``maintenance()``, or the automatic compaction the driver runs between turns
when the next turn would pass the context threshold.

A waking send while idle starts an *activity*: the agent's driver task (spawned
at the first wake, parked while idle, ended by disposal) runs turns while there
is work.  Activities share one cancel scope until one is cancelled (the first
cause wins); a waking send latched after a cancel runs in a replacement
activity once the cancelled turn has closed.

Where is a turn cancelled?  :meth:`ReactAgent.cancel` cancels the activity's
cancel scope; the ``finally`` blocks of ``_run_turn``, ``_run_step``
(``_turn_loop.py``) and ``ToolDispatch.run`` close the turn (synthetic tool results, ``step/end``,
``turn/end`` with the cause, or ``paused`` when a disposal cut off an approval
wait) and flush the session, so the log stays balanced.

The driver's parts have their own modules: the turn loop, its base class
(``_turn_loop.py``: a turn's steps, the request, the budgets), approval and
paused turns (``_approval.py``), tool dispatch (``_dispatch.py``), the next
request (``_request.py``), the model's response (``_model_stream.py``) and the
context window with its maintenance (``_context.py``).
"""

from __future__ import annotations

import datetime
import logging
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Literal, TypeVar, overload

import attrs
import trio

from .._construct import NoPublicConstructor
from .._errors import AgentDisposedError
from .._initiator import _set_initiator
from ..model._cost import price_route, usage_cost
from ..model._images import refuse_images
from ..model._protocol import (
    ModelProvider,
    ModelRequest,
    ModelSettings,
    OutputMode,
    UsageTotals,
    supports_json_schema,
)
from ..session import _events as ev
from ..session._events import ApprovalOutcome, CancelCause, InboxMessage, SendMode
from ..session._session import Session
from ._approval import ApprovalDecision, ApprovalGate, Approver
from ._budget import UsageCounter
from ._context import ContextWindow
from ._dispatch import ToolDispatch
from ._durability import Checkpoints, Durability
from ._follow import FollowedPrompt, Followers
from ._function_tools import caller_namespace, output_adapter
from ._history import History
from ._inbox import Inbox, Prompt, resume_wakes
from ._options import AgentOptions
from ._request import RequestBuilder
from ._run import PendingOutput, RunResult, run_prompt
from ._stream import DEFAULT_STREAM_BUFFER, EventStream, StreamRegistry
from ._tools import ToolSet
from ._turn_loop import TurnLoop

if TYPE_CHECKING:
    from .._bus import EventBus
    from .._scope import Scope
    from ._agent import AgentStatus
    from ._registry import AgentRegistry
    from ._turns import TurnOutcome


log = logging.getLogger("trio_harness.agent")

Phase = Literal["idle", "maintenance", "running"]

T = TypeVar("T")


@attrs.define(eq=False, repr=False)
class ReactAgent(TurnLoop, metaclass=NoPublicConstructor, public_way="harness.agents.create() or resume()"):
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
    # Harness-wide tools and prompt sections, and the registry tools see: the tool dispatch's.
    _shared_tools: ToolSet = attrs.field(alias="shared_tools")
    _agents: AgentRegistry = attrs.field(alias="agents")
    _parent_id: str | None = attrs.field(default=None, alias="parent_id")
    # Asked before calls of tools that require approval (None: such calls are denied): the gate's.
    _approver: Approver | None = attrs.field(default=None, alias="approver")
    # Harness-wide model settings (open_harness(model_settings=...)).
    _harness_settings: ModelSettings | None = attrs.field(default=None, alias="model_settings")
    _durability: Durability = attrs.field(default="step", alias="durability")  # the checkpoints' (_durability.py)
    # Approval (the standing decisions), tool dispatch (the tools, their caches), the next
    # request (the running turn's settings and output type, the merged settings) and the
    # context window (estimate, compactions, maintenance): each owns its state.
    _approvals: ApprovalGate = attrs.field(init=False)
    _checkpoints: Checkpoints = attrs.field(init=False)
    _dispatch: ToolDispatch = attrs.field(init=False)
    _request: RequestBuilder = attrs.field(init=False)
    _context: ContextWindow = attrs.field(init=False)
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
    _usage: UsageCounter = attrs.field(init=False)
    _streams: StreamRegistry = attrs.field(factory=StreamRegistry, init=False)
    # run(): the output type of each queued run() prompt.
    _outputs: dict[str, PendingOutput] = attrs.field(factory=dict, init=False)
    # follow(): the prompts followed to the end of their turns (released at disposal).
    # Built by the first follow() (most agents are never followed: no memory for it).
    _followers: Followers | None = attrs.field(default=None, init=False)
    # The session's usage when the running turn started.
    _turn_start_usage: UsageTotals = attrs.field(factory=UsageTotals, init=False)

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
        cause = self._current_cause
        self._checkpoints = checkpoints = Checkpoints(session=self._session, policy=self._durability)
        self._approvals = ApprovalGate(
            session=self._session, agent=self, approver=self._approver, cause=cause, checkpoints=checkpoints
        )
        self._dispatch = ToolDispatch(
            session=self._session,
            agent=self,
            bus=self._bus,
            agents=self._agents,
            options=self._options,
            approvals=self._approvals,
            checkpoints=checkpoints,
            cause=cause,
            shared=self._shared_tools,
        )
        self._request = RequestBuilder(
            options=self._options,
            provider=self._provider,
            history=self._history,
            dispatch=self._dispatch,
            harness_settings=self._harness_settings,
        )
        self._context = ContextWindow(
            session=self._session,
            history=self._history,
            usage=self._usage,
            options=self._options,
            provider=self._provider,
            bus=self._bus,
            agent=self,
            request=self._request,
            checkpoints=checkpoints,
        )

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
        return self._dispatch.own

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
        return self._approvals.approver

    @property
    def standing_decisions(self) -> dict[str, ApprovalOutcome]:
        """The ``allow_always`` / ``deny_always`` decisions of this session, by tool name (a copy)."""
        return self._approvals.standing_decisions

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
        return usage_cost(usage, self._request.model_name(), provider=provider, api_url=api_url, at=when)

    def send(self, message: Prompt, *, mode: SendMode, settings: ModelSettings | None = None) -> str:
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
            ModelError: the message has images and the agent's model takes none.
        """
        msg, queue = self._route(message, mode, settings)
        if msg.images:  # a model that takes none would fail on them in every later request
            refuse_images(self._provider, self._request.model_name())
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

    def deliver_decision(
        self,
        call_id: str,
        decision: ApprovalDecision,
        *,
        call_seq: int | None,
        applied: Callable[[], None],
        refused: Callable[[str], None],
    ) -> None:
        """Take an approval decision posted through ``harness.sessions.post`` (agents/_remote_control.py).

        Raises:
            CallNotPendingError: the call is not waiting for approval, or the
                call waiting is a later one that reuses the id.
        """
        self._approvals.deliver(call_id, decision, call_seq=call_seq, applied=applied, refused=refused)

    def _posted_applied(self, message: InboxMessage) -> None:
        if message.mode != "inject":
            self._wake()

    def _route(
        self, message: Prompt, mode: SendMode, settings: ModelSettings | None
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

    def followup(self, message: Prompt, *, settings: ModelSettings | None = None) -> str:
        """Queue ``message`` for a new turn and wake the agent (``settings``: that turn's model settings)."""
        return self.send(message, mode="followup", settings=settings)

    def steer(self, message: Prompt) -> str:
        """Queue ``message`` for the next step and wake the agent."""
        return self.send(message, mode="steer")

    def inject(self, message: Prompt) -> str:
        """Queue ``message`` for the next step without waking the agent."""
        return self.send(message, mode="inject")

    def cancel(self, cause: CancelCause = "user", *, keep_inbox: bool = False) -> bool:
        """Abort the current activity and (unless ``keep_inbox``) drop queued work.

        The activity is the running turn, or the automatic compaction running
        as maintenance between turns (stopped at once, nothing logged for it).

        Idle with nothing queued, this does nothing and emits nothing.  An
        effective call emits ``agent/cancel-requested`` before clearing or
        aborting, and (unless ``cause`` is ``disposed``) logs the cancel's mark
        after the clear, so a resume holds what it kept and runs what was sent
        after it (docs/inbox.rst, "The durable inbox").  The first cause of an
        activity is the one its turn records.

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
        maintaining = self._context.maintaining
        queued = (bool(len(self._inbox)) and not keep_inbox) or bool(self._approvals.paused)
        if not active and not queued and not maintaining:
            return False
        self._bus.emit("agent/cancel-requested", self, cause=cause)
        if not keep_inbox:
            self._inbox.clear()
        if cause != "disposed":  # where the wake was dropped, for a resume (a disposal decides nothing)
            self._inbox.mark_cancel()
        self._last_turn = self._approvals.drop_paused(self._last_turn, cause)  # a paused turn's questions
        self._wake_requested = False
        if maintaining:
            self._context.cancel_maintenance()
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
        if self._followers is not None:
            self._followers.abandon_all()

    @overload
    async def run(
        self,
        prompt: Prompt,
        *,
        output: None = None,
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[str]: ...

    @overload
    async def run(
        self,
        prompt: Prompt,
        *,
        output: type[T],
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[T]: ...

    @overload
    async def run(
        self,
        prompt: Prompt,
        *,
        output: Any,
        retries: int = 2,
        settings: ModelSettings | None = None,
        output_mode: OutputMode = "auto",
    ) -> RunResult[Any]: ...

    async def run(
        self,
        prompt: Prompt,
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
        message: Prompt,
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
        followers = self._followers
        if followers is None:
            followers = self._followers = Followers(self._session, self._cancel_followed)
        followed = followers.watch(msg.id, on_event, on_done)
        try:
            self.send(msg, mode=mode, settings=settings)
        except BaseException:
            followers.release(followed)
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

    def _current_cause(self) -> CancelCause | None:
        return self._cause

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
        inbox = self._inbox
        return bool(self._approvals.paused) or inbox.has_turn_work() or (self._wake_requested and inbox.has_step_work())

    def resume_pending(self) -> None:
        """Start the work a resumed agent finds pending, as its writer would have (a resume does, once published).

        A paused turn's continuation (docs/approval.rst); else a turn for the
        waking messages restored in the inbox (a followup, a steer) unless a
        cancel that kept them holds them, while a parked inject stays parked
        (docs/inbox.rst, "The durable inbox").
        """
        if self._approvals.paused:
            self._wake()
            return
        if resume_wakes(self._session, self._inbox):
            self._wake()

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
        due = self._context.maintenance_due()
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

        One cancel scope serves every activity until one is cancelled (a scope per activity cost most).
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
        # The scope closes before its close hook sets _disposing, and a driver a wake scheduled may run
        # in between (Trio orders the two either way): the teardown wins, no turn starts, and the queued
        # message stays pending for a later resume (docs/inbox.rst).
        while not (self._disposing or self._scope.closing):
            if self._phase == "maintenance":
                # Automatic compaction between turns (docs/long-sessions.rst,
                # "Context-window management"): the agent is idle meanwhile,
                # and queued work runs once it ends.
                cancelled = await self._context.run_maintenance()
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
            if not self._disposing and self._context.maintenance_due():
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
            if self._context.maintenance_due():
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
        self._context.close()  # a compaction in progress compacts nothing
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

    # ------------------------------------------------------------ context window

    def context_estimate(self) -> int:
        """The estimated tokens of the next request (O(events appended since the last estimate))."""
        return self._context.estimate()

    async def compact(self, *, keep_tokens: int | None = None) -> ev.ContextCompacted | None:
        """Compact the conversation now, as a maintenance activity.

        Waits until the agent is idle and holds it idle meanwhile (waking input
        waits in the inbox; docs/guarantees.rst, "The driver").  Everything
        before the latest turn is summarized by the model and a
        ``context/compacted`` event is logged; with ``keep_tokens``, the latest
        turns that fit in that many tokens stay instead (``0``: all finished).

        Returns:
            The ``context/compacted`` event, or None when there is nothing to
            compact (a single turn since the start or the last compaction, or,
            with ``keep_tokens``, every turn fits in it).

        Raises:
            CompactionError: the summary request failed (nothing is compacted), or
                the budget forbids its summary requests (docs/long-sessions.rst).
            AgentDisposedError: the agent is disposed, or was disposed while
                compacting (nothing is logged).
        """
        return await self._context.compact_now(keep_tokens)

    def build_request(self) -> ModelRequest:
        """The request the next step would send (for inspection and tests)."""
        request = self._request
        return request.build(request.tools())
