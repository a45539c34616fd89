"""The turn loop of the built-in agent: a turn's steps, a step's claim, request and calls, the budgets.

:class:`TurnLoop` is a part of :class:`~trio_harness.agents._driver.ReactAgent`
(its base class), kept apart from the scheduling (activities, the driver
task) and the public interface in ``_driver.py``: ``_run_turn`` runs the
steps of one turn and always closes it (``turn/end`` with the cause, or
``paused`` when a disposal cut off an approval wait, after a flush that tells
whether the store took its events); ``_run_step`` claims the inbox, asks the
model and dispatches the calls (or continues a paused turn's); ``_ask``
compacts first when the context is full, checks the budgets, logs the
request header, checkpoints and streams the response, retrying once after
a compaction when the provider refuses the request as too long.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

import trio

from .._errors import SessionStoreError
from ..model._context import is_context_overflow
from ..model._protocol import Failure, Finish, ModelProvider, ToolCall, UsageTotals
from ..session import _events as ev
from ._budget import OverBudget
from ._durability import UNSHIELDED
from ._inbox import log_claimed
from ._model_stream import stream_response

if TYPE_CHECKING:
    from ..session._events import CancelCause, TurnEndReason
    from ..session._session import Session
    from ._approval import ApprovalGate
    from ._budget import UsageCounter
    from ._context import ContextWindow
    from ._dispatch import ToolDispatch
    from ._durability import Checkpoints
    from ._inbox import Inbox
    from ._options import AgentOptions
    from ._request import RequestBuilder
    from ._run import PendingOutput
    from ._tools import Tool

log = logging.getLogger("trio_harness.agent")


class TurnLoop:
    """The turn loop's methods; the agent's state they use is :class:`ReactAgent`'s (declared here for types)."""

    if TYPE_CHECKING:  # ReactAgent's fields (attrs defines them there)
        _session: Session
        _options: AgentOptions
        _provider: ModelProvider
        _approvals: ApprovalGate
        _checkpoints: Checkpoints
        _dispatch: ToolDispatch
        _request: RequestBuilder
        _context: ContextWindow
        _inbox: Inbox
        _usage: UsageCounter
        _outputs: dict[str, PendingOutput]
        _cause: CancelCause | None
        _wake_requested: bool
        _last_turn: int
        _turn_start_usage: UsageTotals
    else:
        __slots__ = ()  # the agent's instances stay without a __dict__ (bench/bench_agents.py, memory)

    async def _run_turn(self) -> None:
        turn = self._last_turn = self._last_turn + 1
        session = self._session
        request = self._request
        request.clear_turn()
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
                    # A step's end reaches the store with the next request's checkpoint
                    # (nothing between them waits or has effects); the turn end flushes itself.
                    outcome = await self._run_step(turn, step)
                except SessionStoreError as exc:  # a checkpoint the store refused (docs/guarantees.rst)
                    reason, failure = "error", Failure("store-error", str(exc))
                    break
                except Exception as exc:
                    # A bug or a failing hook (tool filter, prompt section, ...):
                    # end the turn as an error instead of crashing the scope tree.
                    log.exception("agent %s: step %d of turn %d failed", self._session.id, step, turn)
                    reason = "error"
                    failure = Failure("driver-error", f"the turn failed: {exc!r}")
                    break
                if outcome is not None:
                    reason, failure = outcome
                    break
        finally:
            cause = self._cause
            if cause is not None:  # paused when a disposal cut off an approval wait (docs/approval.rst)
                reason, failure = self._approvals.end_reason(), None
            # Shielded when a flush may wait (a flush that never waits cannot be cancelled).
            with trio.CancelScope(shield=True) if session.flush_waits else UNSHIELDED:
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
                request.clear_turn()
                try:
                    await session.flush()
                except SessionStoreError:
                    # Kept on session.store_failure: when_idle() retries and
                    # raises it, dispose() and the harness exit report it.
                    log.warning("agent %s: the end of turn %d could not be stored", self._session.id, turn)

    async def _run_step(self, turn: int, step: int) -> tuple[TurnEndReason, Failure | None] | None:
        session = self._session
        request = self._request
        session.append(ev.StepStart, turn=turn, step=step)
        try:
            # Reset before claiming: a wake raised while the claim is logged
            # (a session observer sending) must survive.
            self._wake_requested = False
            if step == 1 and (paused := self._approvals.take_paused()):  # a paused turn's continuation
                return await self._dispatch.run(turn, step, list(paused), request.tools())  # type: ignore[func-returns-value]
            claimed = self._inbox.claim(turn, turn_boundary=step == 1)
            for message in claimed:
                log_claimed(session, turn, step, message)
                if message.settings is not None and request.turn_settings is None:
                    request.turn_settings = message.settings
                if self._outputs and request.turn_output is None:
                    request.turn_output = self._outputs.get(message.id)
            exhausted = self._budget_failure()
            if exhausted is not None:
                return "budget", exhausted
            tools = request.tools()
            try:
                finish, calls = await self._ask(turn, step, tools)
            except OverBudget as exc:  # the request after a compaction, or the retry after a refusal
                return "budget", exc.failure
            if finish.reason == "error":
                return "error", finish.failure
            if calls:
                await self._dispatch.run(turn, step, calls, tools)
                pending = request.turn_output
                if pending is not None and pending.tool is not None:  # a final_answer call settles the turn
                    if pending.valid:
                        return "completed", None
                    if pending.failure is not None:
                        return "error", pending.failure
                return None
            if finish.reason == "max-tokens":
                return "max-tokens", None
            if request.turn_output is not None:
                return request.turn_output.settle_turn(session.events, self._inbox)
            return "completed", None
        finally:
            session.append(ev.StepEnd, turn=turn, step=step)

    async def _ask(self, turn: int, step: int, tools: dict[str, Tool]) -> tuple[Finish, list[ToolCall]]:
        """Log the request header and stream the request; compact first when the context is full.

        A request the provider refuses as too long for the context window is
        retried once after a compaction (docs/long-sessions.rst).  Every
        request is checked against the budgets first.

        Raises:
            OverBudget: a budget forbids the request, or the compaction
                that would make the refused request fit.
        """
        session = self._session
        failure = await self._context.compact_if_due(turn, self._turn_start_usage)
        if failure is not None:
            return Finish("error", failure), []
        retried = False
        while True:
            exhausted = self._budget_failure()  # the summary requests of a compaction count
            if exhausted is not None:
                raise OverBudget(exhausted)
            request = self._request.build(tools)
            session.append(
                ev.RequestHeader,
                turn=turn,
                step=step,
                provider=self._provider.name,
                model=request.model,
                tools=self._dispatch.names(tools),
                max_tokens=request.max_tokens,
                settings=self._request.header_settings(request.settings),
            )
            await self._checkpoints()  # the prompt, the step so far and the header: on the store first
            finish, calls = await stream_response(self._provider, session, request, turn, step)
            if retried or finish.reason != "error" or not is_context_overflow(finish.failure):
                return finish, calls
            retried = True
            refused = finish.failure.message if finish.failure is not None else "too long"
            outcome = await self._context.compact_refused(turn, self._turn_start_usage, refused)
            if outcome is not True:
                return (finish, calls) if outcome is None else (Finish("error", outcome), [])

    def _budget_failure(self) -> Failure | None:
        """Why the next request must not be made: a turn or session budget is used up (else None)."""
        return self._usage.over_budget(self._options.turn_budget, self._options.session_budget, self._turn_start_usage)
