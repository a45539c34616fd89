"""OpenTelemetry: spans and metrics in the GenAI conventions, from the session logs (docs/tracing.rst)."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _acp_clients import connected
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from trio_harness import (
    AgentOptions,
    ApprovalDecision,
    ApprovalRequest,
    McpStdioServer,
    ScriptedModel,
    Tool,
    ToolContext,
    allow_all,
)
from trio_harness._harness import Harness
from trio_harness._telemetry import continue_trace, open_telemetry
from trio_harness.model import Failure, Finish, ModelRequest, ResponseInfo, Retry, TextDelta, Usage
from trio_harness.model._protocol import Emit
from trio_harness.session._events import AssistantMessage as AssistantMessageEvent
from trio_harness.testing import open_test_harness

SERVERS = Path(__file__).resolve().parent / "mcp_servers"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def provider(exporter: InMemorySpanExporter) -> TracerProvider:
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(SimpleSpanProcessor(exporter))
    return tracer_provider


@asynccontextmanager
async def traced(model: Any, provider: TracerProvider, **kwargs: Any) -> AsyncIterator[Harness]:
    async with open_test_harness(model, tracer_provider=provider, **kwargs) as h:
        yield h


def named(spans: Sequence[ReadableSpan], name: str) -> list[ReadableSpan]:
    return [span for span in spans if span.name == name]


def one(spans: Sequence[ReadableSpan], name: str) -> ReadableSpan:
    found = named(spans, name)
    assert len(found) == 1, [span.name for span in spans]
    return found[0]


def parent_of(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.span_id)


def trace_id(span: ReadableSpan) -> int:
    assert span.context is not None
    return int(span.context.trace_id)


async def echo(ctx: ToolContext, args: dict[str, Any]) -> str:
    return f"echo {args['x']}"


ECHO = Tool(
    name="echo",
    description="Echo x.",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    handler=echo,
)


async def test_a_tool_turn_is_invoke_agent_over_chat_and_execute_tool_under_the_callers_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "echo", "arguments": {"x": "hi"}}]}, {"text": "done"}])
    tracer = provider.get_tracer("app")
    async with traced(model, provider) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s1") as agent:
            with tracer.start_as_current_span("request") as app_span:
                agent.followup("say hi")
            await agent.when_idle()
    spans = exporter.get_finished_spans()
    turn = one(spans, "invoke_agent agent")
    chats = named(spans, "chat")
    tool = one(spans, "execute_tool echo")
    # The caller's span (current where followup was called) is the turn's parent.
    assert parent_of(turn) == app_span.get_span_context().span_id
    assert trace_id(turn) == app_span.get_span_context().trace_id
    assert len(chats) == 2 and all(parent_of(chat) == span_id(turn) for chat in chats)
    assert parent_of(tool) == span_id(turn)
    assert turn.attributes is not None and tool.attributes is not None and chats[0].attributes is not None
    assert turn.attributes["gen_ai.operation.name"] == "invoke_agent"
    assert turn.attributes["gen_ai.agent.id"] == "s1"
    assert turn.attributes["gen_ai.conversation.id"] == "s1"
    assert turn.attributes["trio_harness.turn"] == 1
    assert turn.attributes["trio_harness.turn.end_reason"] == "completed"
    assert turn.status.status_code is StatusCode.UNSET
    assert chats[0].kind is trace.SpanKind.CLIENT
    assert chats[0].attributes["gen_ai.operation.name"] == "chat"
    assert chats[0].attributes["gen_ai.provider.name"] == "scripted"
    assert "gen_ai.request.model" not in chats[0].attributes  # the scripted model has no name
    assert tuple(chats[0].attributes["gen_ai.response.finish_reasons"]) == ("tool-calls",)  # type: ignore[arg-type]
    assert tool.attributes["gen_ai.operation.name"] == "execute_tool"
    assert tool.attributes["gen_ai.tool.name"] == "echo"
    assert tool.attributes["gen_ai.tool.type"] == "function"
    assert str(tool.attributes["gen_ai.tool.call.id"]).startswith("call")
    # Spans nest in time: the tool ran between the two requests.
    assert chats[0].end_time is not None and tool.start_time is not None and tool.end_time is not None
    assert chats[0].end_time <= tool.start_time and tool.end_time <= (chats[1].start_time or 0)
    # No content without the opt-in.
    for span in spans:
        assert span.attributes is not None
        assert not {"gen_ai.input.messages", "gen_ai.output.messages", "gen_ai.tool.call.arguments"} & set(
            span.attributes
        )


async def test_message_content_only_when_opted_in(
    provider: TracerProvider, exporter: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT", "true")
    model = ScriptedModel([{"tool_calls": [{"name": "echo", "arguments": {"x": "hi"}}]}, {"text": "done"}])
    async with traced(model, provider) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            agent.followup("say hi")
            await agent.when_idle()
    spans = exporter.get_finished_spans()
    turn, tool = one(spans, "invoke_agent agent"), one(spans, "execute_tool echo")
    last_chat = named(spans, "chat")[-1]
    assert turn.attributes is not None and tool.attributes is not None and last_chat.attributes is not None
    assert json.loads(str(turn.attributes["gen_ai.input.messages"]))[0]["parts"][0]["content"] == "say hi"
    assert json.loads(str(last_chat.attributes["gen_ai.output.messages"]))[0]["parts"][0]["content"] == "done"
    assert json.loads(str(tool.attributes["gen_ai.tool.call.arguments"])) == {"x": "hi"}
    assert tool.attributes["gen_ai.tool.call.result"] == "echo hi"


async def test_a_subagents_turn_is_a_child_of_the_parents_tool_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "count", "run_in_background": False}}]},
            {"text": "1 2 3"},
            {"text": "the child counted"},
        ]
    )
    async with traced(model, provider, builtin_tools=["subagent"]) as h:
        async with h.agents.open(session_id="parent") as agent:
            agent.followup("delegate")
            await agent.when_idle()
    spans = exporter.get_finished_spans()
    parent_turn = one(spans, "invoke_agent agent")
    tool = one(spans, "execute_tool subagent")
    child_turn = one(spans, "invoke_agent subagent")
    assert parent_of(tool) == span_id(parent_turn)
    assert parent_of(child_turn) == span_id(tool)
    assert trace_id(child_turn) == trace_id(parent_turn)
    assert child_turn.attributes is not None
    assert child_turn.attributes["trio_harness.agent.parent_id"] == "parent"
    assert child_turn.attributes["gen_ai.conversation.id"] != "parent"
    child_chat = [s for s in named(spans, "chat") if parent_of(s) == span_id(child_turn)]
    assert len(child_chat) == 1


async def test_an_mcp_call_has_the_mcp_attributes(
    provider: TracerProvider, exporter: InMemorySpanExporter, tmp_path: Path
) -> None:
    server = McpStdioServer(
        name="calc",
        command=sys.executable,
        args=(str(SERVERS / "calc_server.py"), "--record", str(tmp_path / "record.txt")),
    )
    model = ScriptedModel([{"tool_calls": [{"name": "mcp__calc__add", "arguments": {"a": 2, "b": 3}}]}, {"text": "5"}])
    async with traced(model, provider, mcp_servers=[server]) as h, h.agents.open() as agent:
        agent.followup("add")
        with trio.fail_after(30):
            await agent.when_idle()
    tool = one(exporter.get_finished_spans(), "execute_tool mcp__calc__add")
    assert tool.attributes is not None
    assert tool.attributes["gen_ai.tool.type"] == "extension"
    assert tool.attributes["mcp.method.name"] == "tools/call"
    assert tool.attributes["trio_harness.mcp.server"] == "calc"
    assert tool.attributes["trio_harness.mcp.tool"] == "add"
    assert tool.attributes["network.transport"] == "pipe"
    assert tool.status.status_code is StatusCode.UNSET


async def test_approval_wait_and_decision_are_events_of_the_tool_span(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    asked: list[ApprovalRequest] = []

    async def deny(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision("deny", message="no")

    guarded = Tool(
        name="guarded",
        description="Needs asking.",
        parameters={"type": "object", "properties": {}},
        handler=echo,
        requires_approval=True,
    )
    model = ScriptedModel([{"tool_calls": [{"name": "guarded", "arguments": {}}]}, {"text": "ok"}])
    async with traced(model, provider, approver=deny) as h:
        h.tools.add(guarded)
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
    assert asked
    tool = one(exporter.get_finished_spans(), "execute_tool guarded")
    events = [event.name for event in tool.events]
    assert events == ["trio_harness.approval.requested", "trio_harness.approval.decided"]
    decided = tool.events[1].attributes
    assert decided is not None
    assert decided["trio_harness.approval.outcome"] == "deny"
    assert decided["trio_harness.approval.source"] == "approver"
    assert tool.status.status_code is StatusCode.ERROR
    assert tool.attributes is not None and tool.attributes["error.type"] == "approval-denied"


async def test_an_allowed_bash_call_records_its_exit_code_not_its_output(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo secret-output; exit 3"}}]},
            {"text": "ok"},
        ]
    )
    async with traced(model, provider, builtin_tools=["bash"], approver=allow_all) as h, h.agents.open() as agent:
        agent.followup("run")
        with trio.fail_after(30):
            await agent.when_idle()
    tool = one(exporter.get_finished_spans(), "execute_tool bash")
    assert tool.attributes is not None
    assert tool.attributes["trio_harness.bash.exit_code"] == 3
    assert tool.attributes["error.type"] == "tool-error"
    assert [event.name for event in tool.events][-1] == "trio_harness.tool.started"
    assert not any("secret-output" in str(value) for value in tool.attributes.values())


class RetryingModel:
    """Retries once (a 429), then answers with usage, cache reads included."""

    name = "retrying"
    called_ns = retried_ns = 0

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        self.called_ns = time.time_ns()
        await trio.lowlevel.checkpoint()
        emit(Retry(attempt=1, delay=0.5, failure=Failure("http-429", "slow down", retryable=True)))
        self.retried_ns = time.time_ns()
        await trio.lowlevel.checkpoint()
        emit(TextDelta("done"))
        emit(Usage(input_tokens=30, output_tokens=2, cache_hit_tokens=10))
        emit(Finish("stop"))


async def test_a_retry_is_an_event_of_the_chat_span_and_usage_is_recorded(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    model = RetryingModel()
    async with (
        open_test_harness(model, tracer_provider=provider, meter_provider=meters) as h,
        h.agents.open() as agent,
    ):
        agent.followup("go")
        await agent.when_idle()
        metrics = _metrics(reader)
        assert metrics["trio_harness.agents.live"][0][1] == 1
    spans = exporter.get_finished_spans()
    chat = one(spans, "chat")
    (retry,) = chat.events
    assert retry.name == "gen_ai.request.retry"
    assert retry.attributes is not None and retry.attributes["error.type"] == "http-429"
    assert retry.attributes["trio_harness.retry.attempt"] == 1
    # The span is handed to the SDK when the response is complete, with the request's start
    # time and the retry's own: the times are when they happened.
    assert chat.start_time is not None and chat.end_time is not None
    assert chat.start_time <= model.called_ns <= retry.timestamp <= model.retried_ns <= chat.end_time
    assert chat.attributes is not None
    assert chat.attributes["gen_ai.usage.input_tokens"] == 30
    assert chat.attributes["gen_ai.usage.output_tokens"] == 2
    assert chat.attributes["gen_ai.usage.cache_read.input_tokens"] == 10
    turn = one(spans, "invoke_agent agent")
    assert turn.attributes is not None and turn.attributes["gen_ai.usage.input_tokens"] == 30
    metrics = _metrics(reader)
    tokens = {attrs["gen_ai.token.type"]: value for attrs, value in metrics["gen_ai.client.token.usage"]}
    assert tokens == {"input": 30, "output": 2}
    ((duration_attrs, count),) = metrics["gen_ai.client.operation.duration"]
    assert duration_attrs["gen_ai.operation.name"] == "chat" and count == 1
    assert duration_attrs["gen_ai.provider.name"] == "retrying"


def _metrics(reader: InMemoryMetricReader) -> dict[str, list[tuple[dict[str, Any], Any]]]:
    """Metric name -> (attributes, value) per point: the sum of a histogram, the value of a gauge."""
    found: dict[str, list[tuple[dict[str, Any], Any]]] = {}
    data = reader.get_metrics_data()
    assert data is not None
    for resource in data.resource_metrics:
        for scope in resource.scope_metrics:
            for metric in scope.metrics:
                for point in metric.data.data_points:
                    value = getattr(point, "sum", None) if hasattr(point, "bucket_counts") else point.value  # type: ignore[union-attr]
                    if metric.name == "gen_ai.client.operation.duration":
                        value = point.count  # type: ignore[union-attr]
                    found.setdefault(metric.name, []).append((dict(point.attributes or {}), value))
    return found


async def test_a_failed_turn_ends_its_request_and_turn_with_the_error(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel([{"error": {"message": "overloaded", "code": "http-529"}}])
    async with traced(model, provider) as h, h.agents.open() as agent:
        agent.followup("go")
        await agent.when_idle()
    spans = exporter.get_finished_spans()
    chat, turn = one(spans, "chat"), one(spans, "invoke_agent agent")
    for span in (chat, turn):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "http-529"
    assert turn.attributes is not None and turn.attributes["trio_harness.turn.end_reason"] == "error"


async def test_a_cancelled_turn_ends_its_open_tool_span_cancelled(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    started = trio.Event()

    async def hang(ctx: ToolContext, args: dict[str, Any]) -> str:
        started.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    slow = Tool(name="slow", description="Hangs.", parameters={"type": "object", "properties": {}}, handler=hang)
    model = ScriptedModel([{"tool_calls": [{"name": "slow", "arguments": {}}]}])
    async with traced(model, provider) as h:
        h.tools.add(slow)
        async with h.agents.open() as agent:
            agent.followup("go")
            await started.wait()
            agent.cancel()
            await agent.when_idle()
    spans = exporter.get_finished_spans()
    tool, turn = one(spans, "execute_tool slow"), one(spans, "invoke_agent agent")
    assert parent_of(tool) == span_id(turn)
    for span in (tool, turn):
        assert span.status.status_code is StatusCode.ERROR
        assert span.attributes is not None and span.attributes["error.type"] == "cancelled"
    assert turn.attributes is not None
    assert turn.attributes["trio_harness.turn.end_reason"] == "aborted"
    assert turn.attributes["trio_harness.turn.cancel_cause"] == "user"


async def test_a_traceparent_continues_the_callers_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    traceparent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
    model = ScriptedModel([{"text": "hi"}])
    async with traced(model, provider) as h, h.agents.open() as agent:
        with continue_trace({"traceparent": traceparent}):
            agent.followup("go")
        agent.followup("again, outside the trace")
        await agent.when_idle()
    first, second = named(exporter.get_finished_spans(), "invoke_agent agent")
    assert trace_id(first) == 0x0AF7651916CD43DD8448EB211C80319C
    assert parent_of(first) == 0xB7AD6B7169203331
    assert first.parent is not None and first.parent.is_remote
    assert second.parent is None and trace_id(second) != trace_id(first)


async def test_no_sdk_configured_installs_nothing() -> None:
    # The global providers are the API's proxies here (no SDK set): no observer, no listener.
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
    async with open_test_harness(ScriptedModel([{"text": "hi"}])) as h:
        assert h.bus._listeners.get("agent/created") is None
        telemetry = open_telemetry(bus=h.bus, agents=h.agents, tasks=h.tasks, mcp_connections=())
        assert telemetry is None
        async with h.agents.open() as agent:
            assert agent.session._observers == []


async def test_a_background_task_and_a_compaction_are_spans_linked_to_their_turn(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "exit 0", "run_in_background": True}}]},
            *({"text": "ok"} for _ in range(6)),  # the turn, the task notice's, the second, the summary
        ]
    )
    async with (
        traced(model, provider, builtin_tools=["bash", "tasks"], approver=allow_all) as h,
        h.agents.open(options=AgentOptions()) as agent,
    ):
        agent.followup("go")
        await agent.when_idle()
        with trio.fail_after(30):
            while not named(exporter.get_finished_spans(), "task bash"):
                await trio.sleep(0.01)
        agent.followup("second")
        await agent.when_idle()
        await agent.compact(keep_tokens=0)
    spans = exporter.get_finished_spans()
    first_turn = named(spans, "invoke_agent agent")[0]
    task = one(spans, "task bash")
    assert task.parent is None and [link.context.span_id for link in task.links] == [span_id(first_turn)]
    assert task.attributes is not None and task.attributes["trio_harness.task.status"] == "completed"
    compaction = one(spans, "compaction")
    assert compaction.attributes is not None
    assert compaction.attributes["trio_harness.compaction.reason"] == "manual"
    assert len(compaction.links) == 1


async def test_an_acp_prompt_with_a_traceparent_in_meta_continues_that_trace(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    traceparent = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
    async with traced(ScriptedModel([{"text": "hi"}, {"text": "again"}]), provider) as h:
        async with connected(h) as (peer, _server, _):
            await peer.call("initialize", {"protocolVersion": 1})
            session_id = (await peer.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
            prompt = [{"type": "text", "text": "hi"}]
            meta = {"traceparent": traceparent, "tracestate": "vendor=1"}
            reply = await peer.call("session/prompt", {"sessionId": session_id, "prompt": prompt, "_meta": meta})
            assert reply["stopReason"] == "end_turn"
            await peer.call("session/prompt", {"sessionId": session_id, "prompt": prompt})
    first, second = named(exporter.get_finished_spans(), "invoke_agent agent")
    assert trace_id(first) == 0x4BF92F3577B34DA6A3CE929D0E0E4736
    assert first.parent is not None and first.parent.span_id == 0x00F067AA0BA902B7 and first.parent.is_remote
    assert first.parent.trace_state.get("vendor") == "1"
    assert first.attributes is not None and first.attributes["gen_ai.conversation.id"] == session_id
    assert second.parent is None  # a prompt without one starts a trace of its own


async def test_tool_duration_and_the_running_tasks_gauge(provider: TracerProvider) -> None:
    reader = InMemoryMetricReader()
    meters = MeterProvider(metric_readers=[reader])
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60", "run_in_background": True}}]},
            {"text": "started"},
        ]
    )
    async with (
        open_test_harness(
            model, builtin_tools=["bash", "tasks"], approver=allow_all, tracer_provider=provider, meter_provider=meters
        ) as h,
        h.agents.open() as agent,
    ):
        agent.followup("go")
        await agent.when_idle()
        metrics = _metrics(reader)
        assert metrics["trio_harness.tasks.running"] == [({}, 1)]
        ((attributes, seconds),) = metrics["trio_harness.tool.duration"]
        assert attributes == {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "bash"}
        assert seconds >= 0
    assert _metrics(reader)["trio_harness.tasks.running"] == [({}, 0)]  # the owner's disposal stopped it


def test_otlp_from_env_follows_the_standard_variables() -> None:
    from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
    from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider

    from trio_harness._telemetry import otlp_from_env

    endpoint = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}
    assert otlp_from_env({}) == {}  # no endpoint: nothing is configured
    assert otlp_from_env({**endpoint, "OTEL_SDK_DISABLED": "true"}) == {}
    both = otlp_from_env(endpoint)
    assert isinstance(both["tracer_provider"], SdkTracerProvider)
    assert isinstance(both["meter_provider"], SdkMeterProvider)
    assert both["tracer_provider"].resource.attributes["service.name"] == "trio-harness"
    traces_only = otlp_from_env({**endpoint, "OTEL_METRICS_EXPORTER": "none"})
    assert set(traces_only) == {"tracer_provider"}
    metrics_only = otlp_from_env({"OTEL_EXPORTER_OTLP_METRICS_ENDPOINT": "http://x:9", "OTEL_TRACES_EXPORTER": "none"})
    assert set(metrics_only) == {"meter_provider"}
    for options in (both, traces_only, metrics_only):
        for provider in options.values():
            provider.shutdown()


def test_without_the_api_a_harness_runs_and_a_provider_is_refused() -> None:
    import subprocess

    code = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import trio
from trio_harness import ScriptedModel
from trio_harness.testing import open_test_harness

async def main():
    async with open_test_harness(ScriptedModel([{"text": "hi"}])) as h, h.agents.open() as agent:
        agent.followup("go")
        await agent.when_idle()
        assert agent.session.events[-1].reason == "completed"
    try:
        async with open_test_harness(tracer_provider=object()):
            pass
    except RuntimeError as exc:
        print(exc)

trio.run(main)
"""
    root = Path(__file__).resolve().parent.parent
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=root)
    assert run.returncode == 0, run.stderr
    assert "need the OpenTelemetry API: pip install 'trio-harness[otel]'" in run.stdout


def test_tool_scope_is_the_shared_no_op_unless_registered_for_the_bus() -> None:
    from trio_harness import _trace_hooks as hooks

    class Bus:
        pass

    bus, other = Bus(), Bus()
    made: list[tuple[str, str]] = []

    def scope(session_id: str, call_id: str) -> contextlib.AbstractContextManager[object]:
        made.append((session_id, call_id))
        return contextlib.nullcontext()

    before = hooks._registered
    remove = hooks.register_tool_scope(bus, scope)
    assert hooks.tool_scope(other, "s", "c0") is hooks._NULL
    hooks.tool_scope(bus, "s", "c1")
    assert made == [("s", "c1")]
    remove()
    remove()  # a second removal changes nothing
    assert hooks._registered == before
    assert hooks.tool_scope(bus, "s", "c2") is hooks._NULL and made == [("s", "c1")]


@attrs.define
class _NamedModel:
    """A provider whose first answer names its model and id (ResponseInfo), the second none."""

    name: str = "named"
    calls: int = 0

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        await trio.lowlevel.checkpoint()
        self.calls += 1
        emit(TextDelta("hi"))
        if self.calls == 1:
            emit(ResponseInfo(model="claude-opus-4-6", id="msg_1"))
        emit(Finish("stop"))


async def test_the_chat_span_names_the_response_model_and_id_when_the_provider_reported_them(
    provider: TracerProvider, exporter: InMemorySpanExporter
) -> None:
    async with traced(_NamedModel(), provider) as h:
        async with h.agents.open(session_id="s1") as agent:
            agent.followup("one")
            await agent.when_idle()
            agent.followup("two")
            await agent.when_idle()
            messages = [e for e in agent.session.events if isinstance(e, AssistantMessageEvent)]
    assert [(m.response_model, m.response_id) for m in messages] == [("claude-opus-4-6", "msg_1"), ("", "")]
    first, second = named(exporter.get_finished_spans(), "chat")
    assert first.attributes is not None and second.attributes is not None
    assert first.attributes["gen_ai.response.model"] == "claude-opus-4-6"
    assert first.attributes["gen_ai.response.id"] == "msg_1"
    assert "gen_ai.response.model" not in second.attributes and "gen_ai.response.id" not in second.attributes
