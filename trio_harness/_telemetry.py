"""OpenTelemetry traces and metrics, in the GenAI semantic conventions, from the session logs.

The log already holds every boundary a trace needs, so the telemetry is an
observer: ``open_harness`` builds one :class:`Telemetry` when a tracer or meter
provider is configured (passed in, or the global one set by an SDK), and it
watches every agent's session (:meth:`Session.observe`, from ``agent/created``
on) and the bus (``task/done``).  Each appended event opens, annotates or ends
a span as it is appended (docs/tracing.rst has the tree and the attributes):

* ``turn/start`` .. ``turn/end``: ``invoke_agent {agent}``, whose parent is the
  OpenTelemetry context current where the turn's message was sent (captured
  when its inbox splice is appended: ``send`` appends it in the caller's task);
* ``request/header`` .. ``assistant/message``: ``chat {model}`` (retries are
  span events; a failed request ends with the turn's failure as ``error.type``);
* ``tool/call`` .. ``tool/result``: ``execute_tool {tool}`` (approval events on
  it), current while the handler runs (``_trace_hooks.tool_scope``), so a
  subagent's turn is its child;
* ``context/compacted`` / ``context/compaction-failed`` and ``task/done``: spans
  of their own, linked to the turn that started them.

Nothing is installed when the API is missing or no SDK is configured (the
providers are the API's proxies or no-ops): the agents then run exactly as
without this module.
"""

from __future__ import annotations

import collections
import json
import logging
import os
import re
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import TYPE_CHECKING, Any

import attrs

from ._bus import EventBus, Notice
from ._records import Failure, Usage, UsageTotals
from ._trace_hooks import register_tool_scope
from .session import _events as ev

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.metrics import Histogram, Meter, MeterProvider, Observation
    from opentelemetry.trace import Link, Span, SpanContext, Tracer, TracerProvider

    from .agents._agent import Agent
    from .agents._registry import AgentRegistry
    from .tasks._service import TaskService
    from .tasks._types import TaskSnapshot
    from .tools._mcp import McpConnection

try:
    from opentelemetry import context as otel_context
    from opentelemetry import metrics as otel_metrics
    from opentelemetry import trace as otel_trace

    _HAVE_API = True
except ImportError:  # the ``otel`` extra is not installed
    _HAVE_API = False

log = logging.getLogger("trio_harness.telemetry")

SCOPE_NAME = "trio_harness"
CAPTURE_ENV = "OTEL_INSTRUMENTATION_GENAI_CAPTURE_MESSAGE_CONTENT"

# The conventions' advisory buckets (gen_ai.client.token.usage, gen_ai.client.operation.duration).
_TOKEN_BUCKETS = [1, 4, 16, 64, 256, 1024, 4096, 16384, 65536, 262144, 1048576, 4194304, 16777216, 67108864]
_DURATION_BUCKETS = [0.01, 0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.28, 2.56, 5.12, 10.24, 20.48, 40.96, 81.92]
_EXIT_CODE = re.compile(r"\[exit code: (-?\d+)\]\s*\Z")
# How many recent turns of an agent are kept to link the tasks started in them.
_RECENT_TURNS = 32


def api_available() -> bool:
    """Whether the OpenTelemetry API (the ``otel`` extra) can be imported."""
    return _HAVE_API


def _tracing_configured(provider: object) -> bool:
    # The API's global provider is a proxy until an SDK sets one; a no-op one records nothing.
    return not isinstance(provider, otel_trace.ProxyTracerProvider | otel_trace.NoOpTracerProvider)


def _metrics_configured(provider: object) -> bool:
    if isinstance(provider, otel_metrics.NoOpMeterProvider):
        return False
    return type(provider).__name__ != "_ProxyMeterProvider"  # the API's global proxy: no SDK set


def open_telemetry(
    *,
    bus: EventBus,
    agents: AgentRegistry,
    tasks: TaskService,
    mcp_connections: Sequence[McpConnection],
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> Telemetry | None:
    """The harness's telemetry, or None when there is nothing to send it to (zero cost then).

    Args:
        tracer_provider: the application's; None takes the global one.
        meter_provider: the application's; None takes the global one.

    Raises:
        RuntimeError: a provider was passed but the OpenTelemetry API is not installed.
    """
    if not _HAVE_API:
        if tracer_provider is not None or meter_provider is not None:
            raise RuntimeError(
                "tracer_provider / meter_provider need the OpenTelemetry API: pip install 'trio-harness[otel]'"
            )
        return None
    traces = tracer_provider if tracer_provider is not None else otel_trace.get_tracer_provider()
    meters = meter_provider if meter_provider is not None else otel_metrics.get_meter_provider()
    tracing, measuring = _tracing_configured(traces), _metrics_configured(meters)
    if not tracing and not measuring:
        return None
    from ._version import __version__

    telemetry = Telemetry(
        bus=bus,
        agents=agents,
        tasks=tasks,
        mcp_connections=mcp_connections,
        tracer=traces.get_tracer(SCOPE_NAME, __version__),
        meter=meters.get_meter(SCOPE_NAME, __version__) if measuring else None,
        capture_content=os.environ.get(CAPTURE_ENV, "").strip().lower() == "true",
    )
    telemetry.start()
    return telemetry


def continue_trace(meta: Mapping[str, Any] | None) -> AbstractContextManager[object]:
    """Make the W3C ``traceparent`` (and ``tracestate``) of an ACP request's ``_meta`` the current context.

    A no-op without the API or without a ``traceparent``.
    """
    if not _HAVE_API or not meta or not isinstance(meta.get("traceparent"), str):
        return nullcontext()
    from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

    carrier = {key: meta[key] for key in ("traceparent", "tracestate") if isinstance(meta.get(key), str)}
    return _attached(TraceContextTextMapPropagator().extract(carrier))


@contextmanager
def _attached(ctx: Context) -> Iterator[None]:
    token = otel_context.attach(ctx)
    try:
        yield
    finally:
        otel_context.detach(token)


def _add_usage(attributes: dict[str, Any], usage: Usage | UsageTotals) -> None:
    attributes["gen_ai.usage.input_tokens"] = usage.input_tokens
    attributes["gen_ai.usage.output_tokens"] = usage.output_tokens
    if usage.cache_hit_tokens:
        attributes["gen_ai.usage.cache_read.input_tokens"] = usage.cache_hit_tokens
    if usage.cache_write_tokens:
        attributes["gen_ai.usage.cache_creation.input_tokens"] = usage.cache_write_tokens
    if usage.reasoning_tokens:
        attributes["gen_ai.usage.reasoning.output_tokens"] = usage.reasoning_tokens


# A request's model settings that have GenAI attributes.
_SETTINGS = (
    ("temperature", "gen_ai.request.temperature"),
    ("top_p", "gen_ai.request.top_p"),
    ("seed", "gen_ai.request.seed"),
)


def _text_messages(role: str, texts: Sequence[str]) -> str:
    return json.dumps([{"role": role, "parts": [{"type": "text", "content": text}]} for text in texts])


@attrs.frozen
class _ChatKind:
    """What every request to one model of one provider shares (built once each)."""

    name: str
    attributes: Mapping[str, Any]  # the span's, before the request's own
    metric_attributes: Mapping[str, Any]
    input_tokens: Mapping[str, Any]  # gen_ai.client.token.usage's, gen_ai.token.type=input
    output_tokens: Mapping[str, Any]


@attrs.define(eq=False)
class _Chat:
    """A model request in flight: its span is started, with its start time, when it ends."""

    kind: _ChatKind
    parent: Context
    attributes: dict[str, Any]
    start_ns: int
    started: float  # perf_counter, for the duration metric
    events: list[tuple[str, dict[str, Any], int]] = attrs.field(factory=list)
    failed: bool = False


@attrs.frozen
class _ToolKind:
    """What every call of one tool shares: the span name, the span and metric attributes."""

    name: str
    attributes: Mapping[str, Any]  # the span's, before the call's own
    metric_attributes: Mapping[str, Any]


@attrs.define(eq=False)
class _Call:
    span: Span
    started: float
    kind: _ToolKind
    name: str
    arguments: str
    error_type: str | None = None


@attrs.define(eq=False)
class _SpanScope:
    """Makes ``span`` the current span while the tool handler runs (the API's ``use_span``, minus its generator)."""

    span: Span
    token: Any = None

    def __enter__(self) -> None:
        self.token = otel_context.attach(otel_trace.set_span_in_context(self.span))

    def __exit__(self, *exc_info: object) -> None:
        otel_context.detach(self.token)


@attrs.define(eq=False)
class _AgentTrace:
    """The open spans of one agent, fed by its session's appends."""

    telemetry: Telemetry
    agent: Agent
    name: str
    remove: Callable[[], None] = lambda: None
    # Inbox message id -> the context current where it was sent (only contexts with a span).
    parents: dict[str, Context] = attrs.field(factory=dict)
    pending_turn: tuple[int, int] | None = None  # (turn, start ns) until the turn's first message is seen
    turn: Span | None = None
    turn_context: Context | None = None  # the turn span's context: its requests' and calls' parent
    turn_number: int = 0
    inputs: list[str] = attrs.field(factory=list)
    chat: _Chat | None = None
    calls: dict[str, _Call] = attrs.field(factory=dict)
    # (turn, start ns, end ns or None, span context) of recent turns: what a compaction or task links to.
    recent: collections.deque[list[Any]] = attrs.field(factory=lambda: collections.deque(maxlen=_RECENT_TURNS))
    last_ns: int = 0
    turn_name: str = attrs.field(init=False)
    turn_attributes: Mapping[str, Any] = attrs.field(init=False)  # every turn's, before its number

    def __attrs_post_init__(self) -> None:
        agent = self.agent
        self.turn_name = f"invoke_agent {self.name}"
        attributes: dict[str, Any] = {
            "gen_ai.operation.name": "invoke_agent",
            "gen_ai.agent.id": agent.id,
            "gen_ai.agent.name": self.name,
            "gen_ai.conversation.id": agent.session.id,
        }
        if agent.parent_id is not None:
            attributes["trio_harness.agent.parent_id"] = agent.parent_id
        self.turn_attributes = attributes

    # ------------------------------------------------------------ turns

    def observe(self, event: ev.Event) -> None:
        handler = _HANDLERS.get(type(event))
        if handler is not None:
            handler(self, event)
            self.last_ns = time.time_ns()

    def _on_splice(self, event: ev.InboxSpliced) -> None:
        if event.outcome == "canceled":  # claimed ones are taken at their user/message
            for message_id in event.removed:
                self.parents.pop(message_id, None)
        if event.inserted:
            ctx = otel_context.get_current()
            if otel_trace.get_current_span(ctx).get_span_context().is_valid:
                for message in event.inserted:
                    self.parents[message.id] = ctx

    def _on_turn_start(self, event: ev.TurnStart) -> None:
        self.pending_turn = (event.turn, time.time_ns())

    def _open_turn(self, parent: Context | None) -> Span:
        turn, start = self.pending_turn or (self.turn_number + 1, time.time_ns())
        self.pending_turn = None
        attributes = {**self.turn_attributes, "trio_harness.turn": turn}
        span = self.telemetry.tracer.start_span(
            self.turn_name,
            context=parent if parent is not None else otel_context.Context(),
            kind=otel_trace.SpanKind.INTERNAL,
            attributes=attributes,
            start_time=start,
        )
        self.turn, self.turn_number = span, turn
        self.turn_context = otel_trace.set_span_in_context(span)
        self.recent.append([turn, start, None, span.get_span_context()])
        return span

    def _turn_span(self) -> Span:
        return self.turn if self.turn is not None else self._open_turn(None)

    def _turn_parent(self) -> Context:
        if self.turn is None:
            self._open_turn(None)
        assert self.turn_context is not None
        return self.turn_context

    def _on_user_message(self, event: ev.UserMessage) -> None:
        parent = self.parents.pop(event.message_id, None)
        if self.turn is None:
            self._open_turn(parent)
        if self.telemetry.capture_content:
            self.inputs.append(event.text)

    def _on_turn_end(self, event: ev.TurnEnd) -> None:
        span = self._turn_span()
        failure = event.failure
        error_type = (
            failure.code
            if failure is not None
            else "cancelled"
            if event.reason == "aborted"
            else None
            if event.reason in ("completed", "paused")
            else event.reason
        )
        # What the turn left open ends with it: a cancelled request, calls cut off.
        if self.chat is not None:
            self._end_chat(error_type or "cancelled")
        for call_id in list(self.calls):
            self._end_call(call_id, error_type or event.reason)
        attributes: dict[str, Any] = {"trio_harness.turn.end_reason": event.reason}
        if event.cause is not None:
            attributes["trio_harness.turn.cancel_cause"] = event.cause
        if event.usage is not None:
            _add_usage(attributes, event.usage)
            attributes["trio_harness.usage.requests"] = event.usage.requests
        if self.inputs:
            attributes["gen_ai.input.messages"] = _text_messages("user", self.inputs)
            self.inputs = []
        if error_type is not None:
            attributes["error.type"] = error_type
        span.set_attributes(attributes)
        if error_type is not None:
            span.set_status(otel_trace.StatusCode.ERROR, self.telemetry.failure_text(failure, error_type))
        span.end()
        self.turn = self.turn_context = None
        for entry in reversed(self.recent):
            if entry[0] == event.turn:
                entry[2] = time.time_ns()
                break

    # ------------------------------------------------------------ model requests

    def _on_request(self, event: ev.RequestHeader) -> None:
        if self.chat is not None:  # refused as too long, then compacted and asked again
            self._end_chat("context-overflow")
        parent = self._turn_parent()
        kind = self.telemetry.chat_kind(event.provider, event.model)
        attributes = {**kind.attributes, "trio_harness.step": event.step}
        if event.max_tokens is not None:
            attributes["gen_ai.request.max_tokens"] = event.max_tokens
        settings = event.settings
        if settings is not None:
            for field, key in _SETTINGS:
                value = getattr(settings, field, None)
                if value is not None:
                    attributes[key] = value
        self.chat = _Chat(kind, parent, attributes, time.time_ns(), time.perf_counter())

    def _on_retry(self, event: ev.RequestRetry) -> None:
        if self.chat is not None:
            attributes = {
                "trio_harness.retry.attempt": event.attempt,
                "trio_harness.retry.delay": event.delay,
                "error.type": event.failure.code,
            }
            if self.telemetry.capture_content:  # a provider's error body may echo the request
                attributes["trio_harness.retry.message"] = event.failure.message
            self.chat.events.append(("gen_ai.request.retry", attributes, time.time_ns()))

    def _on_assistant(self, event: ev.AssistantMessage) -> None:
        chat = self.chat
        if chat is None:
            return
        attributes = chat.attributes
        attributes["gen_ai.response.finish_reasons"] = (event.finish,)
        if event.response_model:
            attributes["gen_ai.response.model"] = event.response_model
        if event.response_id:
            attributes["gen_ai.response.id"] = event.response_id
        usage = event.usage
        if usage is not None:
            _add_usage(attributes, usage)
            token_usage = self.telemetry.token_usage
            if token_usage is not None:
                token_usage.record(usage.input_tokens, chat.kind.input_tokens)
                token_usage.record(usage.output_tokens, chat.kind.output_tokens)
        if self.telemetry.capture_content:
            attributes["gen_ai.output.messages"] = _text_messages("assistant", [event.text])
        if event.finish == "error":  # the failure is the turn's: it names it at turn/end
            chat.failed = True
            return
        self._end_chat(None if event.finish != "aborted" else "cancelled")

    def _end_chat(self, error_type: str | None) -> None:
        # The span is handed to the SDK whole, at its end (with its start time): one
        # attribute set instead of one at the start and more at the end.  Nothing is
        # ever its child (it is never current), so it need not exist before.
        chat = self.chat
        assert chat is not None
        self.chat = None
        if chat.failed and error_type is None:
            error_type = "error"
        kind = chat.kind
        if error_type is not None:
            chat.attributes["error.type"] = error_type
        span = self.telemetry.tracer.start_span(
            kind.name,
            context=chat.parent,
            kind=otel_trace.SpanKind.CLIENT,
            attributes=chat.attributes,
            start_time=chat.start_ns,
        )
        for name, attributes, at in chat.events:
            span.add_event(name, attributes, at)
        if error_type is not None:
            span.set_status(otel_trace.StatusCode.ERROR, error_type)
        span.end()
        duration = self.telemetry.duration
        if duration is not None:
            seconds = time.perf_counter() - chat.started
            if error_type is None:
                duration.record(seconds, kind.metric_attributes)
            else:
                duration.record(seconds, {**kind.metric_attributes, "error.type": error_type})

    # ------------------------------------------------------------ tool calls

    def _on_tool_call(self, event: ev.ToolCallRequested) -> None:
        parent = self._turn_parent()
        kind = self.telemetry.tool_kind(event.name)
        attributes = {**kind.attributes, "gen_ai.tool.call.id": event.call_id, "trio_harness.step": event.step}
        if self.telemetry.capture_content:
            attributes["gen_ai.tool.call.arguments"] = event.arguments
        span = self.telemetry.tracer.start_span(
            kind.name, context=parent, kind=otel_trace.SpanKind.INTERNAL, attributes=attributes
        )
        self.calls[event.call_id] = _Call(span, time.perf_counter(), kind, event.name, event.arguments)

    def _on_approval_asked(self, event: ev.ApprovalRequested) -> None:
        call = self.calls.get(event.call_id)
        if call is not None:
            call.span.add_event("trio_harness.approval.requested")

    def _on_approval_decided(self, event: ev.ApprovalDecided) -> None:
        call = self.calls.get(event.call_id)
        if call is None:
            return
        attributes: dict[str, Any] = {
            "trio_harness.approval.outcome": event.outcome,
            "trio_harness.approval.source": event.source,
        }
        if event.cause is not None:
            attributes["trio_harness.approval.cause"] = event.cause
        call.span.add_event("trio_harness.approval.decided", attributes)
        if event.outcome in ("deny", "deny_always"):
            call.error_type = "approval-denied"
        elif event.outcome == "cancelled":
            call.error_type = "cancelled"

    def _on_tool_started(self, event: ev.ToolStarted) -> None:
        call = self.calls.get(event.call_id)
        if call is not None:
            call.span.add_event("trio_harness.tool.started")

    def _on_tool_result(self, event: ev.ToolResult) -> None:
        call = self.calls.get(event.call_id)
        if call is None:
            return
        attributes: dict[str, Any] = {}
        if call.name == "bash":
            exit_code = _bash_exit_code(event, call.arguments)
            if exit_code is not None:
                attributes["trio_harness.bash.exit_code"] = exit_code
        if self.telemetry.capture_content:
            attributes["gen_ai.tool.call.result"] = event.content
        error_type = None
        if event.is_error:
            error_type = call.error_type or (
                "cancelled" if event.content.startswith("error: cancelled") else "tool-error"
            )
        self._end_call(event.call_id, error_type, attributes)

    def _end_call(self, call_id: str, error_type: str | None, attributes: dict[str, Any] | None = None) -> None:
        call = self.calls.pop(call_id)
        span = call.span
        if error_type is not None:
            attributes = {**attributes, "error.type": error_type} if attributes else {"error.type": error_type}
        if attributes:
            span.set_attributes(attributes)
        if error_type is not None:
            span.set_status(otel_trace.StatusCode.ERROR, error_type)
        span.end()
        tool_duration = self.telemetry.tool_duration
        if tool_duration is not None:
            seconds = time.perf_counter() - call.started
            metric = call.kind.metric_attributes
            tool_duration.record(seconds, metric if error_type is None else {**metric, "error.type": error_type})

    def tool_context(self, call_id: str) -> AbstractContextManager[object]:
        call = self.calls.get(call_id)
        return nullcontext() if call is None else _SpanScope(call.span)

    # ------------------------------------------------------------ maintenance

    def _on_compaction(self, event: ev.ContextCompacted | ev.CompactionFailed) -> None:
        # Nothing is logged while a compaction runs: it began after the event before it.
        attributes: dict[str, Any] = {
            "gen_ai.conversation.id": self.agent.session.id,
            "gen_ai.agent.id": self.agent.id,
            "trio_harness.compaction.reason": event.reason,
        }
        if event.usage is not None:
            _add_usage(attributes, event.usage)
        if isinstance(event, ev.ContextCompacted):
            attributes["trio_harness.compaction.tokens_before"] = event.tokens_before
            attributes["trio_harness.compaction.boundary"] = event.boundary
        link = self.link_to_turn(event.turn)
        span = self.telemetry.tracer.start_span(
            "compaction",
            context=otel_context.Context(),
            attributes=attributes,
            links=[link] if link is not None else None,
            start_time=self.last_ns or None,
        )
        if isinstance(event, ev.CompactionFailed):
            span.set_attribute("error.type", event.failure.code)
            span.set_status(otel_trace.StatusCode.ERROR, self.telemetry.failure_text(event.failure, event.failure.code))
        span.end()

    def link_to_turn(self, turn: int | None, at_ns: int | None = None) -> Link | None:
        """A link to the turn numbered ``turn``, or to the turn running at ``at_ns``, or to the last one."""
        chosen: SpanContext | None = None
        for number, start, end, context in reversed(self.recent):
            if turn is not None:
                if number == turn:
                    chosen = context
                    break
            elif at_ns is None or (start <= at_ns and (end is None or at_ns <= end)):
                chosen = context
                break
        if chosen is None and turn is None and at_ns is not None and self.recent:
            chosen = self.recent[-1][3]
        return otel_trace.Link(chosen) if chosen is not None else None

    def close(self) -> None:
        self.remove()
        if self.chat is not None:
            self._end_chat("disposed")
        for call_id in list(self.calls):
            self._end_call(call_id, "disposed")
        if self.turn is not None:
            self.turn.set_attribute("error.type", "disposed")
            self.turn.end()
            self.turn = None


def _bash_exit_code(event: ev.ToolResult, arguments: str) -> int | None:
    match = _EXIT_CODE.search(event.content)
    if match is not None:
        return int(match.group(1))
    if event.is_error:
        return None  # killed by a signal, timed out, refused: no exit code
    try:
        args = json.loads(arguments)
    except ValueError:
        return None
    return None if isinstance(args, dict) and args.get("background") else 0


_HANDLERS: dict[type[ev.Event], Callable[[_AgentTrace, Any], None]] = {
    ev.InboxSpliced: _AgentTrace._on_splice,
    ev.TurnStart: _AgentTrace._on_turn_start,
    ev.UserMessage: _AgentTrace._on_user_message,
    ev.TurnEnd: _AgentTrace._on_turn_end,
    ev.RequestHeader: _AgentTrace._on_request,
    ev.RequestRetry: _AgentTrace._on_retry,
    ev.AssistantMessage: _AgentTrace._on_assistant,
    ev.ToolCallRequested: _AgentTrace._on_tool_call,
    ev.ApprovalRequested: _AgentTrace._on_approval_asked,
    ev.ApprovalDecided: _AgentTrace._on_approval_decided,
    ev.ToolStarted: _AgentTrace._on_tool_started,
    ev.ToolResult: _AgentTrace._on_tool_result,
    ev.ContextCompacted: _AgentTrace._on_compaction,
    ev.CompactionFailed: _AgentTrace._on_compaction,
    ev.StepStart: lambda trace, event: None,  # only the time: a compaction starts after it
    ev.StepEnd: lambda trace, event: None,
}


@attrs.define(eq=False)
class Telemetry:
    """One harness's spans and metrics (built by :func:`open_telemetry`)."""

    _bus: EventBus = attrs.field(alias="bus")
    _agents: AgentRegistry = attrs.field(alias="agents")
    _tasks: TaskService = attrs.field(alias="tasks")
    _mcp_connections: Sequence[McpConnection] = attrs.field(alias="mcp_connections")
    tracer: Tracer
    meter: Meter | None
    capture_content: bool = False
    _traces: dict[str, _AgentTrace] = attrs.field(factory=dict, init=False)
    _removers: list[Callable[[], None]] = attrs.field(factory=list, init=False)
    # The histograms (None without a meter provider).
    token_usage: Histogram | None = attrs.field(default=None, init=False)
    duration: Histogram | None = attrs.field(default=None, init=False)
    tool_duration: Histogram | None = attrs.field(default=None, init=False)
    _chat_kinds: dict[tuple[str, str], _ChatKind] = attrs.field(factory=dict, init=False)
    _tool_kinds: dict[str, _ToolKind] = attrs.field(factory=dict, init=False)

    def start(self) -> None:
        bus = self._bus
        self._removers += [
            bus.on("agent/created", self._on_created),
            bus.on("agent/disposed", self._on_disposed),
            bus.on("task/done", self._on_task_done),
            register_tool_scope(bus, self._tool_scope),
        ]
        meter = self.meter
        if meter is not None:
            self.token_usage = meter.create_histogram(
                "gen_ai.client.token.usage",
                unit="{token}",
                description="Number of input and output tokens used.",
                explicit_bucket_boundaries_advisory=_TOKEN_BUCKETS,
            )
            self.duration = meter.create_histogram(
                "gen_ai.client.operation.duration",
                unit="s",
                description="GenAI operation duration.",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
            self.tool_duration = meter.create_histogram(
                "trio_harness.tool.duration",
                unit="s",
                description="Duration of a tool call, from the model's request to its result (approval included).",
                explicit_bucket_boundaries_advisory=_DURATION_BUCKETS,
            )
            meter.create_observable_gauge(
                "trio_harness.agents.live",
                callbacks=[self._observe_agents],
                unit="{agent}",
                description="Live agents of the harness.",
            )
            meter.create_observable_gauge(
                "trio_harness.tasks.running",
                callbacks=[self._observe_tasks],
                unit="{task}",
                description="Background tasks running (or stopping).",
            )

    def close(self) -> None:
        """Stop observing; end what is still open (at the harness's exit)."""
        for remove in self._removers:
            remove()
        self._removers.clear()
        for trace in list(self._traces.values()):
            trace.close()
        self._traces.clear()

    # ------------------------------------------------------------ agents

    def _on_created(self, notice: Notice) -> None:
        agent: Agent = notice.subject  # type: ignore[assignment]
        name = "subagent" if agent.parent_id is not None else "agent"
        trace = _AgentTrace(self, agent, name)
        trace.remove = agent.session.observe(trace.observe)
        self._traces[agent.id] = trace

    def _on_disposed(self, notice: Notice) -> None:
        trace = self._traces.pop(notice.subject.id, None)
        if trace is not None:
            trace.close()

    def _tool_scope(self, session_id: str, call_id: str) -> AbstractContextManager[object]:
        trace = self._traces.get(session_id)
        return nullcontext() if trace is None else trace.tool_context(call_id)

    def mcp_tool(self, name: str) -> tuple[str, str, str] | None:
        """(server, the server's tool name, transport) when ``name`` is an MCP server's tool."""
        for connection in self._mcp_connections:
            server_tool = connection.tool_names.get(name)
            if server_tool is not None:
                return connection.name, server_tool, connection.config.transport
        return None

    def failure_text(self, failure: Failure | None, error_type: str) -> str:
        """A failed span's status description: the failure's message only with content opted in.

        A message may quote content: a refusal the model's text, a gateway's error body the prompt.
        """
        return failure.message if failure is not None and self.capture_content else error_type

    # ------------------------------------------------------------ tasks

    def _on_task_done(self, notice: Notice) -> None:
        snapshot: TaskSnapshot = notice.subject  # type: ignore[assignment]
        now = time.time_ns()
        ran = 0.0 if snapshot.ended_at is None else max(0.0, snapshot.ended_at - snapshot.started_at)
        start = now - int(ran * 1e9)
        links = []
        trace = self._traces.get(snapshot.owner_id) if snapshot.owner_id is not None else None
        if trace is not None:
            link = trace.link_to_turn(None, start)
            if link is not None:
                links.append(link)
        attributes: dict[str, Any] = {
            "trio_harness.task.id": snapshot.id,
            "trio_harness.task.kind": snapshot.kind,
            "trio_harness.task.status": snapshot.status,
        }
        if snapshot.owner_id is not None:
            attributes["gen_ai.conversation.id"] = snapshot.owner_id
        exit_code = snapshot.detail.get("exit_code")
        if type(exit_code) is int:
            attributes["trio_harness.bash.exit_code"] = exit_code
        if self.capture_content:
            attributes["trio_harness.task.label"] = snapshot.label
        name = f"task {snapshot.kind}"
        span = self.tracer.start_span(
            name, context=otel_context.Context(), attributes=attributes, links=links, start_time=start
        )
        if snapshot.status != "completed":
            span.set_attribute("error.type", snapshot.status)
            text = snapshot.error or snapshot.kill_reason or snapshot.status
            span.set_status(otel_trace.StatusCode.ERROR, text if self.capture_content else snapshot.status)
        span.end(now)

    # ------------------------------------------------------------ metrics

    def chat_kind(self, provider: str, model: str) -> _ChatKind:
        """The span name and the span and metric attributes of a request to ``model`` of ``provider``."""
        key = (provider, model)
        kind = self._chat_kinds.get(key)
        if kind is None:
            metric: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": provider}
            if model:
                metric["gen_ai.request.model"] = model
            kind = _ChatKind(
                name=f"chat {model}" if model else "chat",
                attributes=metric,
                metric_attributes=metric,
                input_tokens={**metric, "gen_ai.token.type": "input"},
                output_tokens={**metric, "gen_ai.token.type": "output"},
            )
            if len(self._chat_kinds) < 1024:
                self._chat_kinds[key] = kind
        return kind

    def tool_kind(self, name: str) -> _ToolKind:
        """The span name and the span and metric attributes of a call of the tool ``name``."""
        mcp = self.mcp_tool(name)  # looked up each call: servers come and go
        if mcp is None:
            kind = self._tool_kinds.get(name)
            if kind is not None:
                return kind
        metric = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
        attributes: dict[str, Any] = {**metric, "gen_ai.tool.type": "function"}
        if mcp is not None:
            server, server_tool, transport = mcp
            attributes.update(
                {
                    "gen_ai.tool.type": "extension",
                    "mcp.method.name": "tools/call",
                    "trio_harness.mcp.server": server,
                    "trio_harness.mcp.tool": server_tool,
                    "network.transport": "pipe" if transport == "stdio" else "tcp",
                }
            )
        kind = _ToolKind(name=f"execute_tool {name}", attributes=attributes, metric_attributes=metric)
        if mcp is None and len(self._tool_kinds) < 1024:
            self._tool_kinds[name] = kind
        return kind

    def _observe_agents(self, options: Any) -> Iterator[Observation]:
        yield otel_metrics.Observation(len(self._agents))

    def _observe_tasks(self, options: Any) -> Iterator[Observation]:
        yield otel_metrics.Observation(self._tasks.live_count)


# ---------------------------------------------------------------- the CLI's OTLP exporter

_ENDPOINTS = (
    "OTEL_EXPORTER_OTLP_ENDPOINT",
    "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT",
    "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
)


def otlp_from_env(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """``open_harness`` keyword arguments exporting over OTLP/HTTP, configured by the standard ``OTEL_*`` variables.

    ``trio-harness run`` and ``acp`` call it.  It configures nothing (returns
    ``{}``) unless an OTLP endpoint variable is set (``OTEL_EXPORTER_OTLP_ENDPOINT``
    or its ``_TRACES_`` / ``_METRICS_`` forms) and ``OTEL_SDK_DISABLED`` is not
    ``true``; ``OTEL_TRACES_EXPORTER=none`` / ``OTEL_METRICS_EXPORTER=none`` leave
    one of the two out.  The exporters read the rest (headers, timeouts,
    protocol paths), the resource ``OTEL_SERVICE_NAME`` (default ``trio-harness``)
    and ``OTEL_RESOURCE_ATTRIBUTES``.  The providers are shut down (their
    batches sent) when the process exits.  Without the packages of the
    ``otlp`` extra, a warning says what to install and nothing is exported.
    """
    env = os.environ if environ is None else environ
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true" or not any(env.get(name) for name in _ENDPOINTS):
        return {}
    try:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        from opentelemetry.sdk.metrics import MeterProvider as SdkMeterProvider
        from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider as SdkTracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
    except ImportError as exc:
        log.warning(
            "an OTLP endpoint is set but the exporter cannot be loaded (%s): pip install 'trio-harness[otlp]'", exc
        )
        return {}
    import atexit

    resource = Resource.create({} if env.get("OTEL_SERVICE_NAME") else {"service.name": "trio-harness"})
    options: dict[str, Any] = {}
    if env.get("OTEL_TRACES_EXPORTER", "otlp").strip().lower() != "none":
        tracer_provider = SdkTracerProvider(resource=resource)
        tracer_provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter()))
        atexit.register(tracer_provider.shutdown)
        options["tracer_provider"] = tracer_provider
    if env.get("OTEL_METRICS_EXPORTER", "otlp").strip().lower() != "none":
        meter_provider = SdkMeterProvider(
            resource=resource, metric_readers=[PeriodicExportingMetricReader(OTLPMetricExporter())]
        )
        atexit.register(meter_provider.shutdown)
        options["meter_provider"] = meter_provider
    return options
