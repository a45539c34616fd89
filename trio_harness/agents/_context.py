"""One agent's context window: the estimate of the next request, and when to compact it.

``_compaction.py`` holds the algorithm (the policy record, where to cut, the
summary requests); this module decides when it runs and records what it did:

* inside a turn, before each step, when the next request would pass
  ``ContextPolicy.threshold`` of the window, and once more when the provider
  refuses a request as too long (the driver's ``_ask``);
* between turns, as maintenance (the agent idle, waking input waiting), when
  the next request plus a turn like the last one would pass it;
* on demand, ``agent.compact()``.

A compaction that fails, or is cancelled after a summary request completed,
logs ``context/compaction-failed`` with what it spent; the automatic one is
then not retried between turns until another turn has run.  Decided from the
log alone, so a resumed agent decides as a never-restarted one would
(docs/long-sessions.rst, "Context-window management").
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import TYPE_CHECKING, Literal, Protocol

import attrs
import trio

from .._errors import AgentDisposedError, CompactionError
from .._records import Failure, UsageTotals
from ..model._context import CHARS_PER_TOKEN, tokens_for_chars
from ..session import _events as ev
from ._agent import Agent
from ._budget import OverBudget, budget_failure
from ._compaction import SummaryFailed, SummaryOverBudget, choose_boundary, summarize
from ._history import TurnMark

if TYPE_CHECKING:
    from .._bus import EventBus
    from ..model._protocol import Message, ModelProvider
    from ..session._session import Session
    from ._budget import UsageCounter
    from ._compaction import BudgetCheck, ContextPolicy
    from ._durability import Checkpoints
    from ._history import History
    from ._options import AgentOptions
    from ._request import RequestBuilder


log = logging.getLogger("trio_harness.agent")


class _Agent(Agent, Protocol):
    """What the context window reads of its agent."""

    @property
    def turn(self) -> int:
        """The number of the latest turn (0 before the first)."""
        ...


@attrs.define(eq=False, repr=False, weakref_slot=False)
class ContextWindow:
    """The context window of one agent: its estimate, and the compactions that keep it below the threshold.

    It reads the next request (its size besides the conversation, its model
    and settings) and the agent's latest turn.
    """

    _session: Session = attrs.field(alias="session")
    _history: History = attrs.field(alias="history")
    _usage: UsageCounter = attrs.field(alias="usage")
    _options: AgentOptions = attrs.field(alias="options")
    _provider: ModelProvider = attrs.field(alias="provider")
    _bus: EventBus = attrs.field(alias="bus")
    # The agent (its latest turn, its maintenance phase, the source of agent/compaction-failed).
    _agent: _Agent = attrs.field(alias="agent")
    # The next request: its characters besides the conversation, its model and settings.
    _request: RequestBuilder = attrs.field(alias="request")
    # The agent's checkpoints (a compaction inside a turn checkpoints before its requests).
    _checkpoints: Checkpoints | None = attrs.field(default=None, alias="checkpoints")
    # The cancel scope of agent.compact() while it runs (disposal cancels it).
    _manual_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    # The cancel scope of the automatic compaction running as maintenance between
    # turns (cancel() and disposal cancel it), and whether cancel() cancelled it.
    _auto_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _auto_cancelled: bool = attrs.field(default=False, init=False)
    # The turn after which a compaction failed or was cancelled: the automatic one
    # is not retried between turns until another turn has run (the in-turn check still applies).
    _skipped_at: int | None = attrs.field(default=None, init=False)
    # Set at disposal: no maintenance is due any more.
    _closed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        for event in reversed(self._session.events):
            if isinstance(event, ev.TurnStart):
                break
            if isinstance(event, ev.CompactionFailed):  # since the latest turn: as the agent that logged it decided
                self._skipped_at = self._agent.turn
                break

    @property
    def maintaining(self) -> bool:
        """Whether the automatic compaction runs as maintenance now."""
        return self._auto_scope is not None

    def close(self) -> None:
        """Disposal: cancel a compaction in progress (it compacts nothing); none is due any more."""
        self._closed = True
        if self._manual_scope is not None:
            self._manual_scope.cancel()
        if self._auto_scope is not None:
            self._auto_scope.cancel()

    def window(self) -> int | None:
        """The context window in tokens: the policy's, else the provider's (None: unknown)."""
        window = self._options.context.window
        if window is None:
            window = getattr(self._provider, "context_window", None)
        return window if type(window) is int and window > 0 else None

    def estimate(self) -> int:
        """The estimated tokens of the next request (O(events appended since the last estimate))."""
        return self._history.estimate(self._request.fixed_chars)

    # ------------------------------------------------------------ inside a turn

    async def compact_if_due(self, turn: int, turn_start: UsageTotals) -> Failure | None:
        """Compact when the next request would pass the policy's threshold; a failure ends the turn.

        ``turn_start`` is the session's usage when the turn started (the
        turn's budget applies to the summary requests).
        """
        policy = self._options.context
        if not policy.auto:
            return None
        window = self.window()
        if window is None:
            return None
        estimate = self.estimate()
        if estimate <= policy.threshold * window:
            return None
        try:
            await self.compact("threshold", turn, turn_start, estimate)
        except SummaryOverBudget as exc:
            # The budgets cannot afford the compaction: the step goes as it is (threshold is below the
            # window), checked against the budgets itself; summary requests already made were logged.
            log.debug("agent %s: no compaction in turn %d: %s", self._session.id, turn, exc)
        except CompactionError as exc:
            return Failure(
                "compaction-failed",
                f"the next request (about {estimate} tokens) passes {policy.threshold:.0%} of the context window "
                f"({window} tokens) and could not be compacted: {exc}",
            )
        return None

    async def compact_refused(self, turn: int, turn_start: UsageTotals, refused: str) -> Failure | Literal[True] | None:
        """The provider refused a request as too long: compact once so that the retry fits.

        Returns True to retry, None when nothing can be compacted (the
        refusal stands), or the failure ending the turn.

        Raises:
            OverBudget: the budgets do not allow the compaction.
        """
        try:
            compacted = await self.compact("overflow", turn, turn_start)
        except SummaryOverBudget as exc:
            message = f"{exc.failure.message}: no compaction to make the refused request fit ({refused})"
            raise OverBudget(attrs.evolve(exc.failure, message=message)) from None
        except CompactionError as exc:
            return Failure("compaction-failed", f"{exc} (after the provider said: {refused})")
        return None if compacted is None else True

    def _plan(
        self, turn: int | None, estimate: int, keep: int | None, *, all_but_latest: bool = False
    ) -> tuple[ContextPolicy, int | None, TurnMark, Sequence[Message]] | None:
        """Where a compaction would cut, and with which policy; None when nothing can be compacted.

        ``all_but_latest`` (an explicit ``compact()`` without ``keep_tokens``)
        cuts at the start of the latest turn, whatever the window.
        """
        history = self._history
        messages = history.messages()
        policy = self._options.context
        window = self.window()
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
            room = policy.threshold * window - tokens_for_chars(self._request.fixed_chars()) - policy.summary_tokens
            keep = max(0, min(keep, int(room / 2)))
        marks = history.marks
        if turn is None:  # between turns, the end of the conversation is a turn boundary too
            marks = (*marks, TurnMark(seq=len(self._session), index=len(messages), chars=history.chars))
        mark = choose_boundary(marks, history.chars, keep * CHARS_PER_TOKEN)
        if mark is None:
            return None
        return policy, window, mark, messages

    async def compact(
        self,
        reason: ev.CompactionReason,
        turn: int | None,
        turn_start: UsageTotals | None = None,
        estimate: int | None = None,
        keep: int | None = None,
        *,
        all_but_latest: bool = False,
    ) -> ev.ContextCompacted | None:
        """Summarize the conversation before a turn boundary and log it; None when nothing can be compacted.

        ``turn`` is the running turn (None between turns), ``turn_start`` the
        session's usage when it started.  Nothing is logged until the summary
        is complete, but a compaction that fails, or is cancelled after a
        summary request completed, logs ``context/compaction-failed`` with
        what it spent.

        Raises:
            CompactionError: the summary request failed.
            SessionStoreError: inside a turn, the checkpoint before the
                summary requests was refused (the turn ends ``store-error``).
        """
        if estimate is None:
            estimate = self.estimate()
        plan = self._plan(turn, estimate, keep, all_but_latest=all_but_latest)
        if plan is None:
            return None
        policy, window, mark, messages = plan
        session = self._session
        if turn is not None and self._checkpoints is not None:
            await self._checkpoints()  # the running turn reaches the store before the summary requests
        # What the summary requests completed so far spent: ``summarize`` asks ``check`` before each
        # request with it, so a cancellation during a request knows the usage of those before it.
        spent = UsageTotals()
        budget_check = self._summary_check(turn, turn_start)

        def check(usage: UsageTotals, remaining: int) -> Failure | None:
            nonlocal spent
            spent = usage
            return budget_check(usage, remaining) if budget_check is not None else None

        try:
            summary, usage, partials = await summarize(
                self._provider,
                model=self._request.model_name(),
                settings=self._request.settings(),
                policy=policy,
                previous=self._history.summary,
                messages=messages[: mark.index],
                window=window,
                check=check,
            )
        except trio.Cancelled:
            if spent.requests:  # cancelled after a summary request completed: what it spent is logged and counts
                failure = Failure("cancelled", "the compaction was cancelled")
                session.append(ev.CompactionFailed, reason=reason, failure=failure, turn=turn, usage=spent)
                self._skipped_at = self._agent.turn
            raise
        except SummaryOverBudget as exc:
            if exc.usage.requests:  # stopped part-way (a token budget): what it spent is logged and counts
                session.append(ev.CompactionFailed, reason=reason, failure=exc.failure, turn=turn, usage=exc.usage)
                self._skipped_at = self._agent.turn
            raise  # not started: nothing to log, a resumed agent decides the same from the log
        except SummaryFailed as exc:
            # Logged: its usage counts, and a resumed agent skips as this one does.
            session.append(ev.CompactionFailed, reason=reason, failure=exc.failure, turn=turn, usage=exc.usage)
            self._skipped_at = self._agent.turn
            raise
        return session.append(
            ev.ContextCompacted,
            boundary=mark.seq,
            summary=summary,
            reason=reason,
            turn=turn,
            tokens_before=estimate,
            usage=usage,
            partials=partials,
        )

    def _summary_check(self, turn: int | None, turn_start: UsageTotals | None) -> BudgetCheck | None:
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
        started = turn_start if turn_start is not None else UsageTotals()

        def check(spent: UsageTotals, needed: int) -> Failure | None:
            totals = self._usage.totals + spent
            purpose = f"the compaction's {needed} summary request{'s' if needed > 1 else ''}"
            if reserve:
                purpose += " and the step's request after it"
            return budget_failure(
                turn_budget, totals - started, "turn", needed=needed + reserve, purpose=purpose
            ) or budget_failure(session_budget, totals, "session", needed=needed + reserve, purpose=purpose)

        return check

    # ------------------------------------------------------------ between turns

    def maintenance_due(self) -> bool:
        """Whether to compact between turns, before the agent goes idle or takes its next input.

        Due when the next request, plus a turn as large as the last one,
        would pass the policy's threshold, and something can be compacted:
        the compaction then runs between turns as maintenance instead of
        inside the next turn (docs/long-sessions.rst, "Context-window
        management").  A pure function of the log, so a resumed agent decides
        as a never-restarted one would.
        """
        policy = self._options.context
        if not policy.auto or self._closed or self._skipped_at == self._agent.turn:
            return False
        window = self.window()
        if window is None:
            return False
        if budget_failure(self._options.session_budget, self._usage.totals, "session") is not None:
            return False  # a summary request is a request: not made past the session's budget
        try:
            history = self._history
            estimate = self.estimate()
            last = history.last_mark
            growth = history.chars - last.chars if last is not None else 0
            if estimate + tokens_for_chars(growth) <= policy.threshold * window:
                return False
            return self._plan(None, estimate, None) is not None
        except Exception:
            # A failing hook (prompt section, tool filter): the next step meets it
            # too and ends its turn with the error (driver-error), so it is not lost.
            log.debug("agent %s: the maintenance check failed", self._session.id, exc_info=True)
            return False

    async def run_maintenance(self) -> bool:
        """Run the automatic compaction as maintenance; returns whether cancel() cancelled it.

        A failure is reported (``agent/compaction-failed`` on the bus, a
        warning in the log) and the compaction is not retried before another
        turn has run; a turn whose request still passes the threshold
        compacts inside the turn and ends with ``compaction-failed`` if that
        fails too.  A cancelled compaction compacts nothing (it logs what its
        completed summary requests spent, as ``context/compaction-failed``).
        """
        agent_id = self._session.id
        self._auto_cancelled = False
        with trio.CancelScope() as scope:
            self._auto_scope = scope
            if self._closed:
                scope.cancel()
            try:
                await self.compact("threshold", None)
            except SummaryOverBudget as exc:
                # The session's budget cannot afford it: not a failure, as when it is used up already
                # (a compaction stopped part-way by a token limit is logged, and reported).
                self._skipped_at = self._agent.turn
                if exc.usage.requests:
                    log.warning("agent %s: automatic compaction stopped: %s", agent_id, exc)
                    self._bus.emit("agent/compaction-failed", self._agent, error=exc)
                else:
                    log.debug("agent %s: no automatic compaction: %s", agent_id, exc)
            except Exception as exc:
                self._skipped_at = self._agent.turn
                log.warning("agent %s: automatic compaction failed: %s", agent_id, exc)
                self._bus.emit("agent/compaction-failed", self._agent, error=exc)
            finally:
                self._auto_scope = None
        if scope.cancelled_caught:
            self._skipped_at = self._agent.turn
        return self._auto_cancelled

    def cancel_maintenance(self) -> None:
        """cancel(): stop the automatic compaction running as maintenance (it compacts nothing)."""
        if self._auto_scope is not None:
            self._auto_cancelled = True
            self._auto_scope.cancel()

    async def compact_now(self, keep_tokens: int | None) -> ev.ContextCompacted | None:
        """``agent.compact()``: compact in the agent's maintenance phase (see there)."""
        if keep_tokens is not None and (type(keep_tokens) is not int or keep_tokens < 0):
            raise ValueError(f"keep_tokens must be a non-negative int or None, got {keep_tokens!r}")
        async with self._agent.maintenance():
            with trio.CancelScope() as scope:
                self._manual_scope = scope
                try:
                    return await self.compact("manual", None, keep=keep_tokens, all_but_latest=keep_tokens is None)
                finally:
                    self._manual_scope = None
        raise AgentDisposedError(f"agent {self._session.id!r} was disposed while compacting; nothing was compacted")
