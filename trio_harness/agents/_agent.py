"""The Agent interface consumers depend on (the loop is replaceable)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any, Literal, Protocol, TypeVar, overload

if TYPE_CHECKING:
    from decimal import Decimal

    from .._records import ModelSettings, UsageTotals
    from .._scope import Scope
    from ..model._protocol import OutputMode
    from ..session._events import CancelCause, ContextCompacted, Event, SendMode
    from ..session._session import Session
    from ._follow import FollowedPrompt
    from ._inbox import Inbox, Prompt
    from ._options import AgentOptions
    from ._run import RunResult
    from ._stream import EventStream
    from ._tools import ToolSet
    from ._turns import TurnOutcome


T = TypeVar("T")

AgentStatus = Literal["idle", "running"]
"""The public status of an agent: ``"running"`` while its driver drains work, else ``"idle"``."""


class Agent(Protocol):
    """A live agent: driver, inbox, scope and cancellation around one session.

    ``id`` equals ``session.id``.  Disposal is not a status: a disposed agent
    has left the registry.  Only an owner holding the :class:`AgentHandle` can
    dispose it.  Once disposal has started, every operation that would change
    the agent (``send``, ``followup``, ``steer``, ``inject``, ``cancel``,
    ``maintenance``) raises :class:`~trio_harness.AgentDisposedError`.

    A loop may also define ``deliver_posted(message)``: the registry then hands
    it the messages posted through the store (``harness.sessions.post``)
    instead of calling ``send``, so that it can act on each only once its
    splice is stored (the built-in loop does, docs/postgres.rst); without it a
    posted message goes through ``send`` and the loop acts on it at once.
    A loop takes approval decisions posted the same way only if it defines
    ``deliver_decision(call_id, decision, *, call_seq, applied, refused)``
    (the protocol ``TakesDecisions`` of ``agents/_remote_control.py``; the
    built-in loop does); to another, a posted decision is refused: the
    poster's error, or ``control/refused`` in the session.
    """

    @property
    def id(self) -> str:
        """The agent's id: exactly its session's id."""
        ...

    @property
    def options(self) -> AgentOptions:
        """Provider route, model and limits of this instance."""
        ...

    @property
    def session(self) -> Session:
        """The durable event log this agent drives."""
        ...

    @property
    def inbox(self) -> Inbox:
        """Pending work, rebuilt from the log on resume."""
        ...

    @property
    def scope(self) -> Scope:
        """The agent's scope: tools, listeners and owned tasks unwind with it."""
        ...

    @property
    def tools(self) -> ToolSet:
        """Tools and prompt sections local to this agent."""
        ...

    @property
    def status(self) -> AgentStatus:
        """``"running"`` while the driver drains work, else ``"idle"``."""
        ...

    @property
    def parent_id(self) -> str | None:
        """The runtime owner agent's id (set for subagents), else None."""
        ...

    @property
    def usage(self) -> UsageTotals:
        """The session's model usage so far: tokens and requests, rebuilt from the log on resume."""
        ...

    @property
    def cost(self) -> Decimal | None:
        """The session's usage in US dollars, or None when unknown (needs the ``cost`` extra)."""
        ...

    def cost_of(self, usage: UsageTotals | None, *, at: float | None = None) -> Decimal | None:
        """``usage`` (e.g. a ``turn/end``'s) in US dollars at this agent's model's prices, or None when unknown.

        ``at``: when the requests were made (an event's ``ts``; prices can
        depend on the time of day), None for now.
        """
        ...

    def send(
        self,
        message: Prompt,
        *,
        mode: Literal["followup", "steer", "inject"],
        settings: ModelSettings | None = None,
    ) -> str:
        """Queue a message with the given mode; returns its message id.

        ``settings`` are the model settings of the turn the message opens,
        stored with the message in the log.
        """
        ...

    def followup(self, message: Prompt, *, settings: ModelSettings | None = None) -> str:
        """Queue a message for a new turn, waking the agent; returns its id.

        ``settings`` apply to that turn only (they win over the agent's and
        the harness's, field by field).
        """
        ...

    def steer(self, message: Prompt) -> str:
        """Queue a message for the next step, waking the agent (a turn opens when idle)."""
        ...

    def inject(self, message: Prompt) -> str:
        """Queue a message for the next step without waking the agent."""
        ...

    def cancel(self, cause: CancelCause = "user", *, keep_inbox: bool = False) -> bool:
        """Abort current activity (and clear the inbox unless ``keep_inbox``).

        The activity may be a turn or the automatic compaction the agent runs
        as maintenance between turns (cancelled, it compacts nothing).  A
        paused turn's open question (docs/approval.rst, "Paused approvals")
        not yet asked again is dropped: decided ``cancelled``, the call not run.

        Returns:
            True if the call had an effect (something was running, queued or paused).

        Raises:
            AgentDisposedError: the agent is disposed or being disposed (its
                disposal aborts the turn; queued messages stay in its session).
        """
        ...

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
        """Send ``prompt`` as a followup and await the end of its turn.

        Returns the final text (or, with ``output=TYPE``, the answer validated
        as ``TYPE``, retried with the validation errors up to ``retries``
        times) and the turn's usage; raises :class:`~trio_harness.RunError`
        when the turn does not complete.  ``output_mode`` chooses between the
        provider's JSON response format and a ``final_answer`` tool
        (:data:`~trio_harness.model.OutputMode`).
        """
        ...

    def follow(
        self,
        message: Prompt,
        *,
        mode: SendMode = "followup",
        settings: ModelSettings | None = None,
        on_event: Callable[[Event], None] | None = None,
        on_done: Callable[[TurnOutcome], None] | None = None,
    ) -> FollowedPrompt:
        """Send ``message`` (as :meth:`send` does) and follow it to the end of the turn that runs it.

        ``on_event`` gets each event of that turn, ``on_done`` the
        :class:`~trio_harness.agents.TurnOutcome` once; both are called
        synchronously from the session's append and must not block.  The
        returned :class:`~trio_harness.agents.FollowedPrompt` gives the
        message id, the turn once claimed, ``await wait()`` for the outcome
        and ``cancel()`` to stop this prompt alone.  When the agent is
        disposed first, the outcome has no end.  ``run()``, the ACP bridge
        and the command line are built on it.

        Raises:
            AgentDisposedError: the agent is disposed or being disposed.
        """
        ...

    async def when_idle(self) -> None:
        """Wait until the agent has no activity (following replacement work).

        Maintenance counts as activity here: an automatic compaction between
        turns or ``compact()`` holds this call although the status is idle.

        Raises:
            SessionStoreError: the session's events could not be stored (the
                flush is retried first).
        """
        ...

    def events(self, *, buffer: int = 256) -> AbstractAsyncContextManager[EventStream]:
        """A bounded stream of the session's events: ``async with agent.events() as stream: async for ...``.

        A slow consumer gets counted gaps (:class:`~trio_harness.agents.StreamGap`),
        never blocks the agent; the stream ends when the agent is disposed.
        """
        ...

    async def compact(self, *, keep_tokens: int | None = None) -> ContextCompacted | None:
        """Summarize the older part of the conversation now, as a maintenance activity.

        Everything before the latest turn is summarized, or, with
        ``keep_tokens``, everything before the latest turns that fit in that
        many tokens.  Returns the logged ``context/compacted`` event, or None
        when there is nothing to compact.  A cancelled compaction compacts
        nothing (once a summary request completed, it logs what it spent as
        ``context/compaction-failed`` with the code ``cancelled``).
        """
        ...

    def maintenance(self) -> AbstractAsyncContextManager[None]:
        """Hold the truly idle phase for maintenance; waking input waits until it ends."""
        ...
