"""Usage totals folded from the log, and the budgets that end a turn.

An agent's usage is a pure function of its session log: every
``request/header`` is one model request, every ``assistant/message`` carries
the tokens its request reported, and every ``context/compacted`` the usage of
the summary requests it made.  :class:`UsageCounter` folds those events
incrementally (O(new events) per read), so a resumed agent reports exactly the
totals of a never-restarted one.

Budgets (:class:`Budget`) are checked before every model request, the
summary requests of a compaction and the retry after a context-length refusal
included (docs/long-sessions.rst, "Usage and budgets"): when the turn's or the
session's usage has reached a limit, the turn ends with reason ``budget`` and
a failure naming the limit, before the request is made.  A compaction is
started only when the budgets leave room for all its summary requests (and,
inside a turn, for the step's request after it).
"""

from __future__ import annotations

from typing import Final

import attrs

from .._records import Failure, UsageTotals, plain_constructor
from .._util import positive_int
from ..session import _events as ev
from ..session._session import Session

__all__ = ["BUDGET_REQUESTS", "BUDGET_TOKENS", "Budget", "UsageCounter", "budget_failure"]

BUDGET_TOKENS: Final = "budget-tokens"
"""The failure code of a turn that ended on a token budget."""

BUDGET_REQUESTS: Final = "budget-requests"
"""The failure code of a turn that ended on a request budget."""


@attrs.frozen
class Budget:
    """Limits on model usage; None leaves a dimension unlimited.

    Attributes:
        tokens: input plus output tokens (:attr:`UsageTotals.total_tokens`).
        requests: model requests (a provider's retries of one request count once).
    """

    tokens: int | None = attrs.field(default=None, validator=positive_int("Budget", optional=True))
    requests: int | None = attrs.field(default=None, validator=positive_int("Budget", optional=True))


def budget_failure(
    budget: Budget | None, used: UsageTotals, what: str, *, needed: int = 1, purpose: str = ""
) -> Failure | None:
    """The failure to end a turn with when ``budget`` (``what`` names it) does not allow the next requests.

    ``used`` is what was spent already; the next ``needed`` requests (for
    ``purpose``, which the message names when more than one is needed) must
    fit in the request limit, and the tokens limit must not be reached yet.
    None when they may be made.
    """
    if budget is None:
        return None
    limit = budget.requests
    if limit is not None and used.requests + needed > limit:
        if used.requests >= limit:
            message = f"the {what} budget of {limit} model requests is used up ({used.requests} made)"
        else:
            message = (
                f"the {what} budget of {limit} model requests has {limit - used.requests} left "
                f"({used.requests} made), too few for {purpose or f'{needed} more'}"
            )
        return Failure(BUDGET_REQUESTS, message)
    if budget.tokens is not None and used.total_tokens >= budget.tokens:
        return Failure(
            BUDGET_TOKENS,
            f"the {what} budget of {budget.tokens} tokens is used up ({used.total_tokens} used)",
        )
    return None


# The event types that count: requests, the usage of answers and of compactions.
# Totals folded from logged ints: built by the plain constructor (the same object, cheaper).
_plain_totals = plain_constructor(UsageTotals) or UsageTotals

_COUNTED: frozenset[type[ev.Event]] = frozenset(
    {ev.RequestHeader, ev.AssistantMessage, ev.ContextCompacted, ev.CompactionFailed}
)


@attrs.define(eq=False)
class UsageCounter:
    """The usage totals of a session, folded from its log incrementally."""

    session: Session
    _totals: UsageTotals = attrs.field(factory=UsageTotals, init=False)
    _position: int = attrs.field(default=0, init=False)

    @property
    def totals(self) -> UsageTotals:
        """The totals of every event logged so far."""
        events = self.session.events
        end = len(events)
        if self._position == end:
            return self._totals
        t = self._totals
        tokens_in, tokens_out, cached, reasoning, requests = (
            t.input_tokens,
            t.output_tokens,
            t.cache_hit_tokens,
            t.reasoning_tokens,
            t.requests,
        )
        before = (tokens_in, tokens_out, cached, reasoning, requests)
        for event in events[self._position : end]:
            if type(event) not in _COUNTED:
                continue  # one set lookup for the events that carry no usage
            # ``type(event) is`` narrows like isinstance, and is cheaper.
            if type(event) is ev.RequestHeader:
                requests += 1
            elif type(event) is ev.AssistantMessage:
                usage = event.usage
                if usage is not None:
                    tokens_in += usage.input_tokens
                    tokens_out += usage.output_tokens
                    cached += usage.cache_hit_tokens
                    reasoning += usage.reasoning_tokens
            elif type(event) is ev.ContextCompacted or type(event) is ev.CompactionFailed:
                summed = event.usage
                if summed is not None:
                    tokens_in += summed.input_tokens
                    tokens_out += summed.output_tokens
                    cached += summed.cache_hit_tokens
                    reasoning += summed.reasoning_tokens
                    requests += summed.requests
        self._position = end
        if (tokens_in, tokens_out, cached, reasoning, requests) == before:
            return t  # nothing that counts was logged since
        self._totals = _plain_totals(tokens_in, tokens_out, cached, reasoning, requests)
        return self._totals
