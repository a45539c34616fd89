"""Context-window management: when and how the older part of a conversation is summarized.

The driver estimates the size of the next request
(:meth:`~trio_harness.agents._history.History.estimate`: the last usage a
provider reported plus an estimate of what was added since, O(new events)).
When a turn ends and the next request plus a turn like the last one would pass
``ContextPolicy.threshold`` of the model's context window, it compacts between
turns, as a maintenance activity (the agent idle, waking input waiting); before
each step it checks again, so a turn that grows past the threshold compacts
before that step.  A compaction picks a boundary at the start of a turn, so that the turns after it fit in
``ContextPolicy.keep`` of the window (never inside a turn, so never between a
tool call and its result, and never inside the open turn), asks the model for
a summary of everything before the boundary (the previous summary included),
and logs a ``context/compacted`` event.  Requests are then built from the
system prompt, the summary and the events after the boundary.  The event is
appended only once the summary is complete: a cancelled compaction compacts
nothing (the agent logs what its completed summary requests spent).  A
provider refusing a request as too long triggers one compaction and one retry
of the step; ``agent.compact()`` runs one on demand, as a maintenance activity
(docs/long-sessions.rst, "Context-window management").

This module is the algorithm; when it runs, and what is logged, is decided by
each agent's ``ContextWindow`` (``_context.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Final

import attrs
import trio

from .._errors import CompactionError
from .._records import Failure, ModelSettings, UsageTotals
from .._util import positive_int
from ..model._context import CHARS_PER_TOKEN
from ..model._protocol import (
    AssistantMessage,
    Chunk,
    Finish,
    Message,
    ModelProvider,
    ModelRequest,
    TextDelta,
    ToolMessage,
    Usage,
    UserMessage,
)
from ._history import TurnMark

HistoryProcessor = Callable[[Sequence[Message]], Sequence[Message]]
"""A user hook from the derived conversation to the messages sent (must be a pure function of its input)."""

DEFAULT_SUMMARY_PROMPT: Final = (
    "You maintain the memory of a long conversation between a user and an AI assistant that uses tools. "
    "Write a summary that lets the assistant continue the work without the original messages: the user's "
    "goals and instructions, decisions made, facts learned (names, paths, numbers, identifiers), results of "
    "tool calls that still matter, open questions and the work in progress. Be concise and factual; write "
    "plain prose or bullet points, without any preamble."
)
"""The system prompt of a summary request (``ContextPolicy.summary_prompt``)."""

_RESULT_LIMIT: Final = 2_000  # characters of one tool result or argument list quoted in a transcript


def _fraction(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 < value <= 1:
        raise ValueError(f"ContextPolicy.{attribute.name} must be a number within (0, 1], got {value!r}")


@attrs.frozen
class ContextPolicy:
    """When an agent compacts its context, and how much it keeps.

    Attributes:
        auto: compact automatically: between turns (as maintenance) when
            the next turn would pass ``threshold``, and before a step whose
            request estimate passes it (``agent.compact()`` and the retry
            after a provider's context-length error work either way).
        threshold: the fraction of the context window that triggers a
            compaction (default 80 %).
        keep: the fraction of the window the recent turns kept verbatim may
            fill (default 30 %); the turn in progress is always kept.
        window: the context window in tokens; None takes the provider's
            ``context_window`` (known models, ``?context_window=N``,
            ``ScriptedModel(context_window=N)``); without one, only a
            provider's context-length error triggers a compaction.
        summary_tokens: the cap on a summary answer's tokens.
        summary_prompt: the system prompt of a summary request.
    """

    auto: bool = True
    threshold: float = attrs.field(default=0.8, validator=_fraction)
    keep: float = attrs.field(default=0.3, validator=_fraction)
    window: int | None = attrs.field(default=None, validator=positive_int("ContextPolicy", optional=True))
    summary_tokens: int = attrs.field(default=2_000, validator=positive_int("ContextPolicy"))
    summary_prompt: str = DEFAULT_SUMMARY_PROMPT


def summary_section(summary: str) -> str:
    """The system-prompt section standing for the compacted part of the conversation."""
    return (
        "The earlier part of this conversation was compacted into the summary below; "
        "the messages that follow it continue from there.\n\n<conversation-summary>\n"
        f"{summary}\n</conversation-summary>"
    )


def choose_boundary(marks: Sequence[TurnMark], total_chars: int, keep_chars: int) -> TurnMark | None:
    """The turn start to compact at: the earliest whose later messages fit in ``keep_chars``.

    ``marks`` are the turn starts of the verbatim part (the first one has no
    message before it).  None when the whole verbatim part fits (nothing needs
    compacting) or no mark has messages before it.  When even the latest mark
    does not make the kept part fit, the latest is taken: the turn in progress
    always stays whole.
    """
    for mark in marks:
        if total_chars - mark.chars <= keep_chars:
            return mark if mark.index > 0 else None
    candidates = [mark for mark in marks if mark.index > 0]
    return candidates[-1] if candidates else None


def _cut(text: str, limit: int = _RESULT_LIMIT) -> str:
    return text if len(text) <= limit else f"{text[:limit]} [... {len(text) - limit} more characters]"


def render_transcript(messages: Sequence[Message]) -> list[str]:
    """The messages as transcript entries for a summary request (long tool texts cut)."""
    lines: list[str] = []
    for message in messages:
        if isinstance(message, UserMessage):
            lines.append(f"User: {message.text}")
            lines.extend(f"User attached an image ({image.media_type})" for image in message.images)
        elif isinstance(message, AssistantMessage):
            if message.text:
                lines.append(f"Assistant: {message.text}")
            for call in message.tool_calls:
                lines.append(f"Assistant called tool {call.name} with {_cut(call.arguments)}")
        elif isinstance(message, ToolMessage):
            label = "error" if message.is_error else "result"
            lines.append(f"Tool {message.name} {label}: {_cut(message.content)}")
    return lines


def _chunks(lines: Sequence[str], budget: int) -> list[str]:
    """Join entries into chunks of at most ``budget`` characters (an entry longer than that is cut)."""
    chunks: list[str] = []
    current: list[str] = []
    size = 0
    for line in lines:
        if len(line) > budget:
            line = _cut(line, max(budget - 64, 1))
        if current and size + len(line) + 2 > budget:
            chunks.append("\n\n".join(current))
            current, size = [], 0
        current.append(line)
        size += len(line) + 2
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _prompt(previous: str | None, chunk: str) -> str:
    head = f"Summary so far:\n{previous}\n\n" if previous else ""
    return (
        f"{head}Conversation to add to the summary:\n\n{chunk}\n\n"
        "Write the updated summary of the whole conversation so far."
    )


class SummaryFailed(CompactionError):
    """A summary request failed: ``failure`` says how, ``usage`` is what the summary requests spent."""

    def __init__(self, message: str, failure: Failure, usage: UsageTotals) -> None:
        super().__init__(message)
        self.failure = failure
        self.usage = usage


class SummaryOverBudget(SummaryFailed):
    """A budget does not allow the next summary request: ``failure`` is the budget's (``budget-*``)."""


BudgetCheck = Callable[[UsageTotals, int], Failure | None]
"""Whether the next summary requests may be made: given what the compaction spent so far and how many
requests it still needs, the budget failure that forbids them, or None."""


async def summarize(
    provider: ModelProvider,
    *,
    model: str,
    settings: ModelSettings,
    policy: ContextPolicy,
    previous: str | None,
    messages: Sequence[Message],
    window: int | None,
    check: BudgetCheck | None = None,
) -> tuple[str, UsageTotals, tuple[str, ...]]:
    """Summarize ``messages`` (after ``previous``) with the model, in as few requests as fit the window.

    ``check`` is asked before every summary request (with the usage spent so
    far and the number of requests still to make), so a compaction whose
    requests the budgets do not allow is not started, and one that reaches a
    token limit stops before its next request.

    Returns:
        The summary, the usage of the requests, and the intermediate
        summaries when it took more than one request.

    Raises:
        SummaryFailed: a summary request failed or gave no text (a
            :class:`~trio_harness.CompactionError`).
        SummaryOverBudget: ``check`` refused the next request.
        trio.Cancelled: propagated at once; nothing is left behind.
    """
    lines = render_transcript(messages)
    # Each summary request stays within half the window: the transcript, the summary so far, the answer.
    budget = max(window // 2 - policy.summary_tokens, window // 4) * CHARS_PER_TOKEN if window is not None else 400_000
    budget -= len(policy.summary_prompt) + (len(previous) if previous else 0)
    chunks = _chunks(lines, max(budget, 1_000)) or [""]
    summary = previous
    usage = UsageTotals()
    answers: list[str] = []
    answer_settings = settings.merge(ModelSettings(max_tokens=policy.summary_tokens))
    for index, chunk in enumerate(chunks):
        if check is not None:
            refused = check(usage, len(chunks) - index)
            if refused is not None:
                raise SummaryOverBudget(f"the compaction was not done: {refused.message}", refused, usage)
        text, used, failure = await _ask(
            provider,
            ModelRequest(
                model=model,
                system=policy.summary_prompt,
                messages=(UserMessage(_prompt(summary, chunk)),),
                max_tokens=answer_settings.max_tokens,
                settings=answer_settings,
                purpose="compaction",
            ),
        )
        usage = usage.add(used, requests=1)
        if failure is not None:
            raise SummaryFailed(
                f"the summary request failed: {failure.message} ({failure.code})",
                Failure("summary-failed", f"{failure.message} ({failure.code})"),
                usage,
            )
        if not text.strip():
            raise SummaryFailed(
                "the summary request returned no text",
                Failure("summary-empty", "the summary request returned no text"),
                usage,
            )
        summary = text.strip()
        answers.append(summary)
    assert summary is not None
    return summary, usage, tuple(answers[:-1])


async def _ask(provider: ModelProvider, request: ModelRequest) -> tuple[str, Usage | None, Failure | None]:
    text: list[str] = []
    usage: Usage | None = None
    finish: Finish | None = None

    def emit(chunk: Chunk) -> None:
        nonlocal usage, finish
        if finish is not None:
            return
        if type(chunk) is TextDelta:
            text.append(chunk.text)
        elif type(chunk) is Usage:
            usage = chunk
        elif type(chunk) is Finish:
            finish = chunk

    try:
        await provider.stream(request, emit)
    except trio.Cancelled:
        raise
    except Exception as exc:
        return "", usage, Failure("provider-crashed", f"the model provider raised {exc!r}")
    if finish is None:
        return "", usage, Failure("no-finish", "the model stream ended without a finish")
    if finish.reason == "error":
        return "", usage, finish.failure or Failure("unknown", "the model reported an error without details")
    return "".join(text), usage, None
