"""``agent.run()``: one prompt, awaited to the end of its turn, with an optionally typed answer.

``await agent.run(prompt)`` sends the prompt as a followup, follows it to the
``turn/end`` of the turn that ran it (``agent.follow()``,
:class:`~trio_harness.agents.FollowedPrompt`) and returns a :class:`RunResult`:
the final text and the turn's usage.

With ``output=TYPE`` the answer is asked for in one of two ways
(:data:`~trio_harness.model.OutputMode`), both built from the JSON schema of
``TYPE`` (the typed tools' machinery):

* ``"native"``: the turn's requests carry an
  :class:`~trio_harness.model.OutputFormat`, sent as the provider's JSON
  response format, the system prompt asks for JSON, and the final text answer
  is validated.  When it does not validate, the driver steers the errors back
  in the same turn (a ``steer`` message, logged like any other);
* ``"tool"``: the model is offered a ``final_answer`` tool whose parameters
  are the schema, and the answer is the arguments of its call.  Invalid
  arguments go back as the call's error result, naming the errors.

Either way the model answers again, up to ``retries`` times; then the turn
ends with reason ``error`` and failure code ``output-invalid``, and ``run``
raises :class:`~trio_harness.OutputValidationError` (docs/long-sessions.rst,
"Structured output").  ``"auto"`` picks native where the provider declares a
JSON-schema response format, the tool otherwise.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final, Generic, Literal, TypeVar

import attrs
import trio

from .._errors import OutputValidationError, RunError
from .._records import Failure, UsageTotals
from ..model._cost import load_prices
from ..model._protocol import FINAL_ANSWER, OutputFormat
from ..session import _events as ev
from ._function_tools import OutputAdapter
from ._tools import Tool, ToolContext, ToolOutput

if TYPE_CHECKING:
    from .._records import ModelSettings
    from ..session._events import InboxMessage, TurnEndReason
    from ._agent import Agent
    from ._inbox import Inbox


T = TypeVar("T")

OUTPUT_INVALID: Final = "output-invalid"
"""The failure code of a turn whose final answer never matched its output type."""


@attrs.frozen
class RunResult(Generic[T]):
    """What ``agent.run()`` returns.

    Attributes:
        output: the validated answer (an instance of the output type), or the
            final text when no output type was asked for.
        text: the final assistant text of the turn (with the ``"tool"``
            output mode, the accepted ``final_answer`` arguments).
        usage: the turn's model usage (as its ``turn/end`` records it).
        turn: the turn's number.
        end: the ``turn/end`` event.
        cost: the turn's usage in US dollars, or None when unknown (needs
            the ``cost`` extra; see ``Agent.cost_of``).
    """

    output: T
    text: str
    usage: UsageTotals
    turn: int
    end: ev.TurnEnd
    cost: Decimal | None = None


class _FinalAnswerTool(Tool):
    """The ``final_answer`` tool: its arguments are validated by the output type, not by the schema check.

    ``validate`` hands the raw arguments to the handler, so every call counts
    as one attempt and gets the output type's own error messages.
    """

    def validate(self, arguments: str) -> dict[str, Any]:
        return {"arguments": arguments}


@attrs.define(eq=False)
class PendingOutput:
    """The output type of one queued ``run()`` prompt, how it is asked for, and the outcome of its validation."""

    adapter: OutputAdapter
    retries: int
    mode: Literal["native", "tool"] = "native"
    format: OutputFormat = attrs.field(init=False)
    tool: Tool | None = attrs.field(default=None, init=False)
    attempts: int = attrs.field(default=0, init=False)
    valid: bool = attrs.field(default=False, init=False)
    value: Any = attrs.field(default=None, init=False)
    answer: str = attrs.field(default="", init=False)
    error: str = attrs.field(default="", init=False)
    failure: Failure | None = attrs.field(default=None, init=False)

    def __attrs_post_init__(self) -> None:
        self.format = OutputFormat(name=self.adapter.name, schema=self.adapter.schema)
        if self.mode == "tool":
            self.tool = _FinalAnswerTool(
                FINAL_ANSWER,
                f"Give your final answer ({self.adapter.name}): call this once, with the answer as the arguments.",
                self.adapter.schema,
                self._final_answer,
                parallel_safe=False,
            )

    @property
    def request_format(self) -> OutputFormat | None:
        """What a request carries as its ``output``: the format in native mode, nothing in tool mode."""
        return self.format if self.mode == "native" else None

    def _attempt(self, text: str) -> bool:
        self.attempts += 1
        try:
            self.value = self.adapter.validate(text)
        except ValueError as exc:
            self.error = str(exc)
            if self.attempts > self.retries:
                self.failure = Failure(
                    OUTPUT_INVALID,
                    f"the answer did not match the output type {self.adapter.name} after {self.attempts} "
                    f"attempts; last error: {self.error}",
                )
            return False
        self.valid = True
        self.answer = text
        return True

    def check(self, text: str) -> str | Failure | None:
        """Validate a final text answer: None when valid, the feedback for the model, or the failure ending the turn.

        In tool mode a text answer that validates is accepted too (a model, or
        a replayed recording, may answer in text); otherwise the feedback asks
        for the tool.
        """
        if self._attempt(text):
            return None
        if self.failure is not None:
            return self.failure
        if self.mode == "tool":
            return (
                f"Your answer was not given through the {FINAL_ANSWER} tool ({self.error}). "
                f"Call {FINAL_ANSWER} with your final answer as its arguments, matching its schema exactly."
            )
        return (
            f"Your answer does not match the required JSON schema ({self.error}). "
            "Answer again with only the JSON value, matching the schema exactly."
        )

    def settle_turn(self, events: Sequence[ev.Event], inbox: Inbox) -> tuple[TurnEndReason, Failure | None] | None:
        """Validate a run() turn's final answer: complete it, steer the errors back (on ``inbox``), or fail it."""
        verdict = self.check_turn(events)
        if verdict is None:
            return "completed", None
        if isinstance(verdict, Failure):
            return "error", verdict
        inbox.append("next-step", inbox.message(verdict, "steer"))
        return None

    def check_turn(self, events: Sequence[ev.Event]) -> str | Failure | None:
        """:meth:`check` the text of the turn's last assistant message (``events``: the session's)."""
        for index in range(len(events) - 1, -1, -1):
            event = events[index]
            if type(event) is ev.AssistantMessage:
                return self.check(event.text)
        return self.check("")

    async def _final_answer(self, ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        if self.valid:
            return ToolOutput("The final answer was already accepted; nothing more is needed.")
        if self._attempt(args["arguments"]):
            return ToolOutput("Final answer accepted.")
        if self.failure is not None:
            return ToolOutput(f"error: the final answer does not match the schema: {self.error}", is_error=True)
        return ToolOutput(
            f"error: the final answer does not match the schema: {self.error}. "
            f"Call {FINAL_ANSWER} again with arguments matching its schema exactly.",
            is_error=True,
        )


def output_instructions(pending: PendingOutput) -> str:
    """The system-prompt section asking for an answer in ``pending``'s format and mode."""
    output = pending.format
    if pending.mode == "tool":
        return (
            f"When you have your final answer, call the tool {FINAL_ANSWER} with it as the arguments "
            f"(an object matching the tool's schema, {output.name}); do not write the answer as text."
        )
    schema = json.dumps(output.schema, ensure_ascii=False, separators=(",", ":"))
    return (
        "When you give your final answer, answer with only one JSON value (no prose, no code fence) "
        f"matching this JSON schema ({output.name}):\n{schema}"
    )


async def run_prompt(
    agent: Agent,
    message: InboxMessage,
    pending: PendingOutput | None,
    *,
    settings: ModelSettings | None,
) -> RunResult[Any]:
    """Follow ``message`` on ``agent`` to the end of its turn and build the result (see the module docstring).

    ``pending`` is the output the turn that claims the message validates (the
    agent asks for it), or None for the final text.
    """
    last_text = ""

    def on_event(event: ev.Event) -> None:
        nonlocal last_text
        if isinstance(event, ev.AssistantMessage) and event.finish not in ("error", "aborted"):
            last_text = event.text

    followed = agent.follow(message, settings=settings, on_event=on_event)
    try:
        outcome = await followed.wait()
    except trio.Cancelled:
        # The caller gave up: its prompt does not run on unobserved.
        followed.cancel()
        raise
    end = outcome.end
    if end is None:
        raise RunError(f"agent {agent.id!r}: the prompt never ran (it was cancelled, or the agent was disposed)")
    if end.reason != "completed":
        detail = f": {end.failure.message} ({end.failure.code})" if end.failure is not None else ""
        cause = f" (cause: {end.cause})" if end.cause is not None else ""
        error = OutputValidationError if end.failure is not None and end.failure.code == OUTPUT_INVALID else RunError
        raise error(f"agent {agent.id!r}: turn {end.turn} ended {end.reason}{cause}{detail}", end=end)
    usage = end.usage if end.usage is not None else UsageTotals()
    await load_prices()  # in a worker thread: the first import of the price table would stall the loop
    cost = agent.cost_of(end.usage, at=end.ts)
    if pending is not None:
        if not pending.valid:  # completed without a final answer to validate (cannot happen for a text answer)
            raise OutputValidationError(
                f"agent {agent.id!r}: turn {end.turn} gave no answer to validate as {pending.adapter.name}", end=end
            )
        text = pending.answer if pending.mode == "tool" else last_text  # tool mode: the accepted arguments
        return RunResult(output=pending.value, text=text, usage=usage, turn=end.turn, end=end, cost=cost)
    return RunResult(output=last_text, text=last_text, usage=usage, turn=end.turn, end=end, cost=cost)
