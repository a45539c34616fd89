"""The cost of OpenTelemetry on the tool run (docs/tracing.rst, "Cost").

The run is bench/bench_agents.py's: prompt -> one tool call -> the tool result
-> ``"done"``, on a reused agent with the constant-cost model (its
"constant-cost model" row).  Rows, in one run of this script:

1. **Telemetry off** (the OpenTelemetry API installed, no SDK configured):
   this tree against the tree named by ``--baseline`` or
   ``TRIO_HARNESS_BENCH_BASELINE`` (default: the main checkout
   ``/work/main`` when there is one; without a baseline the row says so), each
   in child processes, alternated ``--rounds`` times; the ratio of the medians
   (target < 1.03).
2. **An SDK with a batch span processor** (its exporter discards the spans:
   the cost is the harness's and the SDK's, not a network's) and an SDK meter
   provider, against telemetry off, in interleaved batches of one process;
   the median of the per-batch ratios (target < 1.25).  Interleaved with them,
   **stub providers** whose spans and instruments do nothing: what the
   harness's own telemetry code costs, without the SDK's work.
3. **The SDK's own floor**: what the run's telemetry costs the SDK alone, no
   harness around it: 4 spans (a turn, two requests, a call) with the run's
   attributes and 7 histogram records, in a tight loop (CPU time per run).

Run with ``python bench/bench_telemetry.py`` (rows as JSON lines), or as part of
``nox -s bench`` (bench/run.py calls :func:`bench`; the bench group has the SDK).
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import trio
from bench_agents import ECHO, InstantModel, Timing, _reused_batch
from opentelemetry import trace
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from trio_harness import AgentOptions, open_harness

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BATCH = 250
BATCHES = 8
ROUNDS = 4
OFF_TARGET = 1.03
SDK_TARGET = 1.25


class Discard(SpanExporter):
    """Takes every batch and drops it."""

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        return SpanExportResult.SUCCESS


_STUB_CONTEXT = trace.SpanContext(trace_id=1, span_id=2, is_remote=False, trace_flags=trace.TraceFlags(1))


class StubSpan:
    """A span that records nothing (a valid context, so that children have a parent)."""

    def set_attributes(self, attributes: object) -> None: ...
    def set_attribute(self, key: str, value: object) -> None: ...
    def add_event(self, *args: object, **kwargs: object) -> None: ...
    def set_status(self, *args: object, **kwargs: object) -> None: ...
    def end(self, end_time: int | None = None) -> None: ...
    def get_span_context(self) -> trace.SpanContext:
        return _STUB_CONTEXT


class StubTracerProvider:
    """Hands out one do-nothing span: the harness's telemetry work without the SDK's."""

    span = StubSpan()

    def get_tracer(self, *args: object, **kwargs: object) -> StubTracerProvider:
        return self

    def start_span(self, *args: object, **kwargs: object) -> StubSpan:
        return self.span


class StubMeterProvider:
    """Instruments that record nothing."""

    def get_meter(self, *args: object, **kwargs: object) -> StubMeterProvider:
        return self

    def create_histogram(self, *args: object, **kwargs: object) -> StubMeterProvider:
        return self

    def create_observable_gauge(self, *args: object, **kwargs: object) -> None: ...
    def record(self, *args: object, **kwargs: object) -> None: ...


async def _agent_runs(harness: Any) -> Any:
    harness.tools.add(ECHO)
    handle = await harness.agents.create(options=AgentOptions(model=InstantModel()))
    return handle


async def measure_off(batch: int = BATCH, batches: int = BATCHES) -> tuple[float, float]:
    """Median per-run microseconds (wall, CPU) of the tool run, telemetry off (no providers configured)."""
    timing = Timing()
    gc.collect()
    async with open_harness(store=":memory:", builtin_tools=False) as harness:
        handle = await _agent_runs(harness)
        for index in range(batches + 1):
            await _reused_batch(handle.agent, batch, timing if index else None)
        await handle.dispose()
    return timing.median, timing.median_cpu


async def measure_sdk(batch: int = BATCH, batches: int = BATCHES) -> tuple[Timing, Timing, Timing, list[float]]:
    """Interleaved batches: telemetry off, stub providers, an SDK with a batch span processor and a meter provider."""
    off, stub, on = Timing(), Timing(), Timing()
    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    meter_provider = MeterProvider(metric_readers=[InMemoryMetricReader()])
    stubs: dict[str, Any] = {"tracer_provider": StubTracerProvider(), "meter_provider": StubMeterProvider()}
    gc.collect()
    async with (
        open_harness(store=":memory:", builtin_tools=False) as plain,
        open_harness(store=":memory:", builtin_tools=False, **stubs) as stubbed,
        open_harness(
            store=":memory:", builtin_tools=False, tracer_provider=tracer_provider, meter_provider=meter_provider
        ) as traced,
    ):
        handles = [await _agent_runs(plain), await _agent_runs(stubbed), await _agent_runs(traced)]
        for index in range(batches + 1):
            for handle, timing in zip(handles, (off, stub, on)):
                await _reused_batch(handle.agent, batch, timing if index else None)
        for handle in handles:
            await handle.dispose()
    tracer_provider.shutdown()
    meter_provider.shutdown()
    ratios = [b / a for a, b in zip(off.wall, on.wall)]
    return off, stub, on, ratios


def sdk_floor(runs: int = 5000) -> float:
    """CPU microseconds the SDK alone spends on one run's spans and metric records."""
    import time

    from opentelemetry import context, trace

    tracer_provider = TracerProvider()
    tracer_provider.add_span_processor(BatchSpanProcessor(Discard()))
    tracer = tracer_provider.get_tracer("floor")
    histogram = MeterProvider(metric_readers=[InMemoryMetricReader()]).get_meter("floor").create_histogram("h")
    base: dict[str, Any] = {"gen_ai.operation.name": "chat", "gen_ai.provider.name": "instant", "trio_harness.step": 1}
    token = {**base, "gen_ai.token.type": "input"}
    start = time.process_time()
    for _ in range(runs):
        turn = tracer.start_span("invoke_agent agent", context=context.Context(), attributes=base)
        parent = trace.set_span_in_context(turn)
        for name in ("chat", "execute_tool echo", "chat"):
            span = tracer.start_span(name, context=parent, attributes=base)
            span.set_attributes({"gen_ai.usage.input_tokens": 30, "gen_ai.response.finish_reasons": ("stop",)})
            span.end()
        turn.set_attributes({"gen_ai.usage.input_tokens": 60, "trio_harness.turn.end_reason": "completed"})
        turn.end()
        for _ in range(7):
            histogram.record(30, token)
    floor = (time.process_time() - start) / runs * 1e6
    tracer_provider.shutdown()
    return floor


async def _child(code: Path) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": str(code)}
    done = await trio.run_process(
        [sys.executable, str(HERE / "bench_telemetry.py"), "--child"], env=env, capture_stdout=True, check=True
    )
    result = json.loads(done.stdout)
    return float(result["us"]), float(result["cpu_us"])


def default_baseline() -> Path | None:
    """``TRIO_HARNESS_BENCH_BASELINE``, else the main checkout ``/work/main`` when it exists."""
    named = os.environ.get("TRIO_HARNESS_BENCH_BASELINE")
    if named:
        return Path(named)
    main = Path("/work/main")
    return main if (main / "trio_harness").is_dir() else None


async def bench(baseline: Path | None = None, rounds: int = ROUNDS) -> list[dict[str, object]]:
    """The rows (bench/run.py calls this with the defaults)."""
    baseline = baseline if baseline is not None else default_baseline()
    rows: list[dict[str, object]] = []
    if baseline is None:
        missing: dict[str, object] = {"figure": "  telemetry off / baseline", "value": "n/a: no baseline tree"}
        rows.append(missing | {"unit": "x", "target": "report (--baseline or TRIO_HARNESS_BENCH_BASELINE names one)"})
    else:
        ours: list[tuple[float, float]] = []
        theirs: list[tuple[float, float]] = []
        for _ in range(rounds):
            theirs.append(await _child(baseline))
            ours.append(await _child(ROOT))
        our_us, their_us = statistics.median(us for us, _ in ours), statistics.median(us for us, _ in theirs)
        off_ratio = our_us / their_us
        cpu_ratio = statistics.median(cpu for _, cpu in ours) / statistics.median(cpu for _, cpu in theirs)
        rows += [
            {"figure": f"tool run, telemetry off, baseline {baseline}", "value": round(their_us, 1)}
            | {"unit": "us", "target": "report"},
            {"figure": "tool run, telemetry off (API installed, no SDK)", "value": round(our_us, 1)}
            | {"unit": "us", "target": "report"},
            {"figure": "  telemetry off / baseline", "value": round(off_ratio, 3), "unit": "x"}
            | {"target": f"< {OFF_TARGET}", "met": off_ratio < OFF_TARGET},
            {"figure": "  telemetry off / baseline, CPU time", "value": round(cpu_ratio, 3), "unit": "x"}
            | {"target": "report"},
        ]
    off, stub, on, ratios = await measure_sdk()
    sdk_ratio = statistics.median(ratios)
    rows += [
        {"figure": "tool run, telemetry off (interleaved)", "value": round(off.median, 1), "unit": "us"}
        | {"target": "report", "cpu_us": round(off.median_cpu, 1)},
        {"figure": "tool run, stub providers (the harness's telemetry work alone)", "value": round(stub.median, 1)}
        | {"unit": "us", "target": "report", "cpu_us": round(stub.median_cpu, 1)},
        {"figure": "  stub / off, CPU time", "value": round(stub.median_cpu / off.median_cpu, 3), "unit": "x"}
        | {"target": "report"},
        {"figure": "tool run, SDK + BatchSpanProcessor + meters", "value": round(on.median, 1), "unit": "us"}
        | {"target": "report", "cpu_us": round(on.median_cpu, 1)},
        {"figure": "  SDK / off (median of per-batch ratios)", "value": round(sdk_ratio, 3), "unit": "x"}
        | {"target": f"< {SDK_TARGET}", "met": sdk_ratio < SDK_TARGET},
        {"figure": "  SDK / off, CPU time", "value": round(on.median_cpu / off.median_cpu, 3), "unit": "x"}
        | {"target": "report"},
        {"figure": "the SDK alone: 4 spans + 7 histogram records (CPU)", "value": round(sdk_floor(), 1), "unit": "us"}
        | {"target": "report"},
    ]
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="the cost of OpenTelemetry on the tool run")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--baseline", type=Path, default=None, help="the tree to compare against (default: see bench)")
    parser.add_argument("--rounds", type=int, default=ROUNDS, help="child processes per tree")
    args = parser.parse_args(argv)
    if args.child:
        wall, cpu = trio.run(measure_off)
        print(json.dumps({"us": wall, "cpu_us": cpu}))
        return
    for row in trio.run(bench, args.baseline, args.rounds):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
