"""No message content in spans unless opted in, not even inside failure messages (docs/tracing.rst)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
import trio
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from trio_harness.model import Failure, Finish, ModelRequest, Retry
from trio_harness.model._protocol import Emit
from trio_harness.testing import open_test_harness

SECRET = "SECRET-PROMPT-7731"


class RefusingModel:
    """A gateway that echoes the prompt in its 500 body, then a model whose refusal quotes it."""

    name = "refusing"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        await trio.lowlevel.checkpoint()
        emit(Retry(attempt=1, delay=0.1, failure=Failure("http-500", f"HTTP 500: bad input {SECRET}", retryable=True)))
        emit(Finish("error", Failure("refusal", f"refusing: the model refused: I will not repeat {SECRET}")))


def everything(spans: Sequence[ReadableSpan]) -> str:
    parts = []
    for span in spans:
        parts += [span.name, str(dict(span.attributes or {})), str(span.status.description)]
        parts += [f"{event.name} {dict(event.attributes or {})}" for event in span.events]
    return "\n".join(parts)


@pytest.mark.parametrize("opted_in", [False, True])
async def test_failure_messages_are_content_too(opted_in: bool, monkeypatch: pytest.MonkeyPatch) -> None:
    if opted_in:
        monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    exporter = InMemorySpanExporter()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    async with (
        open_test_harness(RefusingModel(), tracer_provider=tracer_provider) as h,
        h.agents.open() as agent,
    ):
        agent.followup(f"say {SECRET}")
        await agent.when_idle()
    spans = exporter.get_finished_spans()
    turn = next(span for span in spans if span.name.startswith("invoke_agent"))
    assert turn.status.status_code is StatusCode.ERROR
    assert turn.attributes is not None and turn.attributes["error.type"] == "refusal"
    if opted_in:
        assert SECRET in str(turn.status.description)
    else:
        assert SECRET not in everything(spans)
        assert turn.status.description == "refusal"
