"""``agent.run()``: one prompt, awaited to the end of its turn, with an optionally typed answer.

``await agent.run(prompt)`` queues the prompt as a followup, follows it to the
``turn/end`` of the turn that ran it (:class:`~trio_harness.agents.TurnWatcher`)
and returns a :class:`RunResult`: the final text and the turn's usage.

With ``output=TYPE`` the turn's requests carry an
:class:`~trio_harness.model.OutputFormat` (the JSON schema of ``TYPE``, built
by the typed tools' machinery): providers with a JSON-schema response format
send it, and the system prompt asks for JSON in every case.  When the turn's
final answer does not validate, the driver steers the validation errors back
to the model in the same turn (a ``steer`` message, logged like any other)
and lets it answer again, up to ``retries`` times; then the turn ends with
reason ``error`` and failure code ``output-invalid``, and ``run`` raises
:class:`~trio_harness.OutputValidationError` (docs/long-sessions.rst,
"Structured output").
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

import attrs
import trio

from .._errors import OutputValidationError, RunError
from .._records import Failure, UsageTotals
from ..model._protocol import OutputFormat
from ..session import _events as ev
from ._function_tools import OutputAdapter
from ._turns import TurnOutcome, TurnWatcher

if TYPE_CHECKING:
    from .._records import ModelSettings
    from ._driver import ReactAgent

__all__ = ["OUTPUT_INVALID", "PendingOutput", "RunResult", "output_instructions", "run_prompt"]

T = TypeVar("T")

OUTPUT_INVALID: Final = "output-invalid"
"""The failure code of a turn whose final answer never matched its output type."""


@attrs.frozen
class RunResult(Generic[T]):
    """What ``agent.run()`` returns.

    Attributes:
        output: the validated answer (an instance of the output type), or the
            final text when no output type was asked for.
        text: the final assistant text of the turn.
        usage: the turn's model usage (as its ``turn/end`` records it).
        turn: the turn's number.
        end: the ``turn/end`` event.
    """

    output: T
    text: str
    usage: UsageTotals
    turn: int
    end: ev.TurnEnd


@attrs.define(eq=False)
class PendingOutput:
    """The output type of one queued ``run()`` prompt, and the outcome of its validation."""

    adapter: OutputAdapter
    retries: int
    format: OutputFormat = attrs.field(init=False)
    attempts: int = attrs.field(default=0, init=False)
    valid: bool = attrs.field(default=False, init=False)
    value: Any = attrs.field(default=None, init=False)
    error: str = attrs.field(default="", init=False)

    def __attrs_post_init__(self) -> None:
        self.format = OutputFormat(name=self.adapter.name, schema=self.adapter.schema)

    def check(self, text: str) -> str | Failure | None:
        """Validate one final answer: None when valid, the feedback for the model, or the failure ending the turn."""
        self.attempts += 1
        try:
            self.value = self.adapter.validate(text)
        except ValueError as exc:
            self.error = str(exc)
        else:
            self.valid = True
            return None
        if self.attempts > self.retries:
            return Failure(
                OUTPUT_INVALID,
                f"the answer did not match the output type {self.adapter.name} after {self.attempts} attempts; "
                f"last error: {self.error}",
            )
        return (
            f"Your answer does not match the required JSON schema ({self.error}). "
            "Answer again with only the JSON value, matching the schema exactly."
        )


def output_instructions(output: OutputFormat) -> str:
    """The system-prompt section asking for an answer in ``output``'s format."""
    schema = json.dumps(output.schema, ensure_ascii=False, separators=(",", ":"))
    return (
        "When you give your final answer, answer with only one JSON value (no prose, no code fence) "
        f"matching this JSON schema ({output.name}):\n{schema}"
    )


async def run_prompt(
    agent: ReactAgent,
    prompt: str,
    output: OutputAdapter | None,
    *,
    retries: int,
    settings: ModelSettings | None,
) -> RunResult[Any]:
    """Queue ``prompt`` on ``agent``, wait for its turn to end, and build the result (see the module docstring)."""
    from ._inbox import Inbox

    message = Inbox.message(prompt, "followup")
    pending = PendingOutput(output, retries) if output is not None else None
    outcome: TurnOutcome | None = None
    done = trio.Event()
    last_text = ""

    def on_event(event: ev.Event) -> None:
        nonlocal last_text
        if isinstance(event, ev.AssistantMessage) and event.finish not in ("error", "aborted"):
            last_text = event.text

    def on_done(result: TurnOutcome) -> None:
        nonlocal outcome
        outcome = result
        done.set()

    watcher = TurnWatcher(message.id, on_event, on_done)
    remove = agent.session.observe(watcher)
    agent._watch_run(watcher, message.id, pending)
    try:
        agent.send(message, mode="followup", settings=settings)
        try:
            await done.wait()
        except trio.Cancelled:
            # The caller gave up: its prompt does not run on unobserved.
            agent._abandon_run(message.id, watcher)
            raise
    finally:
        remove()
        agent._unwatch_run(watcher, message.id)
    assert outcome is not None
    end = outcome.end
    if end is None:
        raise RunError(f"agent {agent.id!r}: the prompt never ran (it was cancelled, or the agent was disposed)")
    if end.reason != "completed":
        detail = f": {end.failure.message} ({end.failure.code})" if end.failure is not None else ""
        cause = f" (cause: {end.cause})" if end.cause is not None else ""
        error = OutputValidationError if end.failure is not None and end.failure.code == OUTPUT_INVALID else RunError
        raise error(f"agent {agent.id!r}: turn {end.turn} ended {end.reason}{cause}{detail}", end=end)
    usage = end.usage if end.usage is not None else UsageTotals()
    if pending is not None:
        if not pending.valid:  # completed without a final answer to validate (cannot happen for a text answer)
            raise OutputValidationError(
                f"agent {agent.id!r}: turn {end.turn} gave no answer to validate as {pending.adapter.name}", end=end
            )
        return RunResult(output=pending.value, text=last_text, usage=usage, turn=end.turn, end=end)
    return RunResult(output=last_text, text=last_text, usage=usage, turn=end.turn, end=end)
