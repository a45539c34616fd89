"""Benchmarks of the agent runtime: per-run overhead, create / dispose, memory.

The run measured everywhere is: prompt -> one tool call (``echo(x="hi")``) ->
the tool result -> the final text ``"done"``, with a zero-latency model, one
trivial harness-wide tool and ``builtin_tools=False``.

Figures (times are wall clock, median over batches after a warm-up batch; the
CPU time of the same batches is shown in brackets, as this machine may be
shared):

1. **Per run, reused agent**: one agent doing sequential ``followup`` +
   ``when_idle`` runs, its session growing by 17 events a run.

   * with :class:`ScriptedModel` (the responses pushed in bulk; its record
     of requests is cleared between batches, outside the timing), target
     <= 190 us; and how the per-run time grows from the first to the last batch;
   * with a constant-cost bench model emitting exactly the chunks the scripted
     model emits, to separate the harness from the test double;
   * the same constant-cost agent again once its session holds 10,000 runs
     (history derivation is incremental, but anything per step that is
     O(session) shows up here).

   **Per run, fresh agent**: a new agent per run; the timed region is
   ``followup`` + ``when_idle`` only (create and dispose are figure 4); the
   whole create + run + dispose cycle is reported too.

   The same with the JSONL store in a temporary directory (fsync on, the
   default), target <= 400 us for the reused agent.
2. **The Trio floor** (:mod:`floor`): the same run in plain Trio, measured in
   batches interleaved with the reused-agent batches; the harness / floor
   ratio is the median of the per-batch ratios (target <= 4x).
3. **Peers** (:mod:`peers`, in a subprocess on asyncio): the OpenAI Agents SDK
   and pydantic-ai with their own zero-latency models; harness / peer ratios.
4. **Create + dispose**: agents per second, sequential and 1,000 at a time in a
   nursery (target >= 5,000/s).
5. **Memory**: 10,000 idle (created, never run) agents in a fresh subprocess:
   bytes per agent by RSS delta (``/proc/self/statm``) and by tracemalloc; the
   target (<= 16 KiB) applies to the larger of the two.
6. **Typed-function tools**: the same run with the constant-cost model on two
   reused agents, one whose ``echo`` is the raw-schema :class:`Tool` above, one
   whose ``echo`` is made by ``@tool`` from ``async def echo(x: str) -> str``,
   in interleaved batches; the typed / raw ratio is the median of the
   per-batch ratios (target <= 1.1x).  Also the tool call alone
   (``validate`` + ``handler``, no driver) for each, in a tight loop.

Run with ``python bench/bench_agents.py`` (rows as JSON lines), or
``python bench/bench_agents.py --profile reused|fresh|jsonl|create|typed`` for a
cProfile of one figure, or ``--memory-top`` for the biggest allocation sites
of an idle agent.
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import trio

from trio_harness import (
    Agent,
    AgentOptions,
    Harness,
    JsonlStore,
    ScriptedModel,
    Tool,
    ToolContext,
    open_harness,
    tool,
)
from trio_harness.model._protocol import (
    Emit,
    Finish,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolMessage,
    Usage,
)
from trio_harness.session import _events as ev

sys.path.insert(0, str(Path(__file__).parent))
from floor import FloorAgent

HERE = Path(__file__).parent

RUN_TARGET_US = 190.0
JSONL_TARGET_US = 400.0
FLOOR_RATIO_TARGET = 4.0
CREATE_TARGET = 5_000.0
MEMORY_TARGET = 16 * 1024
TYPED_RATIO_TARGET = 1.1

BATCH = 250  # runs per batch
BATCHES = 8  # timed batches (2,000 runs), after one warm-up batch
JSONL_BATCH = 100
JSONL_BATCHES = 5
PEER_BATCH = 100
PEER_BATCHES = 5
CREATE_BATCH = 1_000
CREATE_BATCHES = 3
MEMORY_AGENTS = 10_000
EVENTS_PER_RUN = 17
LONG_RUNS = 10_000  # session length (runs) for the long-session figure
FSYNC_ROUNDS = 200

CALL: dict[str, Any] = {"tool_calls": [{"name": "echo", "arguments": {"x": "hi"}}]}
DONE: dict[str, Any] = {"text": "done"}

Row = dict[str, object]


# ---------------------------------------------------------------- fixtures


async def _echo(ctx: ToolContext, args: dict[str, Any]) -> str:
    return str(args["x"])


ECHO = Tool(
    name="echo",
    description="Echo x back.",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    handler=_echo,
)


@tool(name="echo")
async def TYPED_ECHO(x: str) -> str:
    """Echo x back."""
    return x


class InstantModel:
    """A constant-cost model: exactly the chunks ScriptedModel emits for CALL, then DONE.

    It answers from the type of the last message (a tool result -> the text),
    so its cost does not depend on the length of the conversation.
    """

    def __init__(self) -> None:
        self._calls = 0

    @property
    def name(self) -> str:
        return "instant"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        await trio.lowlevel.checkpoint()
        if type(request.messages[-1]) is ToolMessage:
            emit(TextDelta("do"))
            emit(TextDelta("ne"))
            emit(Usage(input_tokens=30, output_tokens=2))
            emit(Finish("stop"))
        else:
            self._calls += 1
            emit(ToolCallDelta(index=0, id=f"call_{self._calls}", name="echo", arguments='{"x": "hi"}'))
            emit(Usage(input_tokens=30, output_tokens=1))
            emit(Finish("tool-calls"))


def _open(model: Any, store: str | JsonlStore = ":memory:") -> Any:
    return open_harness(model=model, store=store, builtin_tools=False)


def _check_runs(events: Any, start: int, runs: int) -> None:
    """Every run since ``start`` completed one turn with one successful tool result."""
    completed = results = 0
    for event in events[start:]:
        if isinstance(event, ev.TurnEnd):
            completed += event.reason == "completed"
        elif isinstance(event, ev.ToolResult):
            results += not event.is_error
    if completed != runs or results != runs:
        raise RuntimeError(f"{runs} runs gave {completed} completed turns and {results} tool results")


class Timing:
    """Per-run microseconds of each timed batch, wall and CPU."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def add(self, wall_s: float, cpu_s: float, runs: int) -> None:
        self.wall.append(wall_s / runs * 1e6)
        self.cpu.append(cpu_s / runs * 1e6)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)

    def label(self) -> str:
        return f"[cpu {self.median_cpu:.1f} us; {len(self.wall)} batches]"


async def _reused_batch(agent: Any, runs: int, timing: Timing | None) -> None:
    start_len = len(agent.session.events)
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        agent.followup("go")
        await agent.when_idle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if timing is not None:
        timing.add(wall, cpu, runs)
    _check_runs(agent.session.events, start_len, runs)


async def _floor_batch(agent: FloorAgent, runs: int, timing: Timing | None) -> None:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        agent.followup("go")
        await agent.when_idle()
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    if timing is not None:
        timing.add(wall, cpu, runs)


# ---------------------------------------------------------------- figures 1 and 2


class ReusedResult:
    def __init__(self) -> None:
        self.floor = Timing()
        self.scripted = Timing()
        self.instant = Timing()
        self.long = Timing()
        self.events = 0
        self.long_events = 0


async def measure_reused(batch: int = BATCH, batches: int = BATCHES) -> ReusedResult:
    """Interleave floor, scripted-model and constant-cost-model batches on reused agents."""
    result = ReusedResult()
    scripted = ScriptedModel([])
    gc.collect()
    async with trio.open_nursery() as nursery, _open(scripted) as harness:
        harness.tools.add(ECHO)
        floor = FloorAgent(nursery)
        handle = await harness.agents.create()
        instant_handle = await harness.agents.create(options=AgentOptions(model=InstantModel()))
        for index in range(batches + 1):
            timed = index > 0
            await _floor_batch(floor, batch, result.floor if timed else None)
            scripted.push(*([CALL, DONE] * batch))
            scripted.requests.clear()  # the test double keeps every request: not the harness's cost
            await _reused_batch(handle.agent, batch, result.scripted if timed else None)
            await _reused_batch(instant_handle.agent, batch, result.instant if timed else None)
        result.events = len(handle.agent.session.events)
        await handle.dispose()
        # Grow the constant-cost agent's session to LONG_RUNS runs, then time one more batch.
        instant = instant_handle.agent
        while instant.turn < LONG_RUNS:
            await _reused_batch(instant, min(BATCH, LONG_RUNS - instant.turn), None)
        await _reused_batch(instant, batch, result.long)
        result.long_events = len(instant.session.events)
        await instant_handle.dispose()
        nursery.cancel_scope.cancel()
    return result


class FreshResult:
    def __init__(self) -> None:
        self.run = Timing()
        self.cycle = Timing()


async def _fresh_batch(harness: Harness, model: ScriptedModel | None, runs: int, result: FreshResult | None) -> None:
    if model is not None:
        model.push(*([CALL, DONE] * runs))
        model.requests.clear()
    run_wall = run_cpu = 0.0
    cycle_wall, cycle_cpu = time.perf_counter(), time.process_time()
    for _ in range(runs):
        handle = await harness.agents.create()
        agent = handle.agent
        wall, cpu = time.perf_counter(), time.process_time()
        agent.followup("go")
        await agent.when_idle()
        run_wall += time.perf_counter() - wall
        run_cpu += time.process_time() - cpu
        _check_runs(agent.session.events, 0, 1)
        await handle.dispose()
    cycle_wall, cycle_cpu = time.perf_counter() - cycle_wall, time.process_time() - cycle_cpu
    if result is not None:
        result.run.add(run_wall, run_cpu, runs)
        result.cycle.add(cycle_wall, cycle_cpu, runs)


async def measure_fresh(batch: int = BATCH, batches: int = BATCHES) -> FreshResult:
    """A fresh agent per run on the in-memory store."""
    result = FreshResult()
    model = ScriptedModel([])
    gc.collect()
    async with _open(model) as harness:
        harness.tools.add(ECHO)
        for index in range(batches + 1):
            await _fresh_batch(harness, model, batch, result if index else None)
    return result


class JsonlResult:
    def __init__(self) -> None:
        self.reused = Timing()
        self.fresh = FreshResult()
        self.no_fsync = Timing()
        self.fsync_us: list[float] = []


async def _raw_fsync(root: str, rounds: int) -> list[float]:
    """Microseconds to append one run's worth of lines and fsync it in a worker thread."""
    line = b"x" * 4096 + b"\n"  # about one run's 17 events as JSON lines
    fd = os.open(os.path.join(root, "raw-fsync"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    out: list[float] = []
    try:
        for _ in range(rounds):
            start = time.perf_counter()
            os.write(fd, line)
            await trio.to_thread.run_sync(os.fsync, fd)
            out.append((time.perf_counter() - start) * 1e6)
    finally:
        os.close(fd)
    return out


async def measure_jsonl(batch: int = JSONL_BATCH, batches: int = JSONL_BATCHES) -> JsonlResult:
    """Reused and fresh agents on the JSONL store (fsync on) in a temporary directory."""
    result = JsonlResult()
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as root:
        model = ScriptedModel([])
        gc.collect()
        async with _open(model, store=root) as harness:
            harness.tools.add(ECHO)
            handle = await harness.agents.create()
            for index in range(batches + 1):
                model.push(*([CALL, DONE] * batch))
                model.requests.clear()
                await _reused_batch(handle.agent, batch, result.reused if index else None)
            await handle.dispose()
            for index in range(batches + 1):
                await _fresh_batch(harness, model, batch, result.fresh if index else None)
        result.fsync_us = await _raw_fsync(root, FSYNC_ROUNDS)
    with tempfile.TemporaryDirectory(prefix="bench-agents-") as root:
        model = ScriptedModel([])
        async with _open(model, store=JsonlStore(root, fsync=False)) as harness:
            harness.tools.add(ECHO)
            handle = await harness.agents.create()
            for index in range(batches + 1):
                model.push(*([CALL, DONE] * batch))
                model.requests.clear()
                await _reused_batch(handle.agent, batch, result.no_fsync if index else None)
            await handle.dispose()
    return result


# ---------------------------------------------------------------- figure 3


async def measure_peers(batch: int = PEER_BATCH, batches: int = PEER_BATCHES) -> dict[str, Any]:
    """Run :mod:`peers` in a subprocess; returns its JSON (or an ``error`` per peer)."""
    command = [sys.executable, str(HERE / "peers.py"), "--runs", str(batch), "--batches", str(batches)]
    done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    try:
        data: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit code {done.returncode}"]
        data = {"openai-agents": {"error": tail[0]}, "pydantic-ai": {"error": tail[0]}}
    return data


# ---------------------------------------------------------------- figure 4


async def measure_create(batch: int = CREATE_BATCH, batches: int = CREATE_BATCHES) -> tuple[list[float], list[float]]:
    """Agents created and disposed per second: sequentially, and ``batch`` at a time."""
    sequential: list[float] = []
    concurrent: list[float] = []
    gc.collect()
    async with _open(ScriptedModel([])) as harness:

        async def cycle() -> None:
            handle = await harness.agents.create()
            await handle.dispose()

        for index in range(batches + 1):
            start = time.perf_counter()
            for _ in range(batch):
                await cycle()
            if index:
                sequential.append(batch / (time.perf_counter() - start))
        for index in range(batches + 1):
            start = time.perf_counter()
            async with trio.open_nursery() as nursery:
                for _ in range(batch):
                    nursery.start_soon(cycle)
            if index:
                concurrent.append(batch / (time.perf_counter() - start))
        if len(harness.agents) or len(harness.sessions.list()):
            raise RuntimeError("agents or sessions left live after create + dispose")
    return sequential, concurrent


# ---------------------------------------------------------------- figure 6


class TypedResult:
    def __init__(self) -> None:
        self.raw = Timing()
        self.typed = Timing()
        self.raw_call_us = 0.0
        self.typed_call_us = 0.0


def _local_tool(one: Tool) -> Any:
    async def setup(agent: Agent) -> None:
        agent.tools.add(one, scope=agent.scope)

    return setup


async def _call_us(one: Tool, calls: int) -> float:
    """Microseconds per ``validate`` + ``handler`` of ``one``, driven directly (no driver, no session)."""
    ctx: Any = None  # neither echo reads its context
    arguments = '{"x": "hi"}'
    start = time.perf_counter()
    for _ in range(calls):
        await one.handler(ctx, one.validate(arguments))
    return (time.perf_counter() - start) / calls * 1e6


async def measure_typed(batch: int = BATCH, batches: int = BATCHES) -> TypedResult:
    """Interleave runs of a raw-schema echo and a typed-function echo (constant-cost model)."""
    result = TypedResult()
    gc.collect()
    async with _open(ScriptedModel([])) as harness:
        raw = await harness.agents.create(options=AgentOptions(model=InstantModel()), setup=_local_tool(ECHO))
        typed = await harness.agents.create(options=AgentOptions(model=InstantModel()), setup=_local_tool(TYPED_ECHO))
        for index in range(batches + 1):
            timed = index > 0
            await _reused_batch(raw.agent, batch, result.raw if timed else None)
            await _reused_batch(typed.agent, batch, result.typed if timed else None)
        await raw.dispose()
        await typed.dispose()
    calls = batch * batches * 5
    for one in (ECHO, TYPED_ECHO):  # warm up both before timing either
        await _call_us(one, batch)
    raw_calls = [await _call_us(ECHO, calls // 5) for _ in range(5)]
    typed_calls = [await _call_us(TYPED_ECHO, calls // 5) for _ in range(5)]
    result.raw_call_us = statistics.median(raw_calls)
    result.typed_call_us = statistics.median(typed_calls)
    return result


# ---------------------------------------------------------------- figure 5


def _rss_bytes() -> int:
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except OSError:
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


async def _memory_child(kind: str, count: int, top: int) -> dict[str, Any]:
    """In a fresh process: bytes per idle agent by ``kind`` (``rss``, ``tracemalloc`` or ``ran``).

    ``ran``: tracemalloc, each agent idle again after one tool-calling turn
    (its history, and its driver task parked until disposal).
    """
    ran = kind == "ran"
    shared = InstantModel()
    async with _open(ScriptedModel([])) as harness:
        harness.tools.add(ECHO)
        for _ in range(200):  # warm up: lazy imports, caches, free lists
            handle = await harness.agents.create()
            await handle.dispose()
        gc.collect()
        if kind != "rss":
            tracemalloc.start(1)
            before_snapshot = tracemalloc.take_snapshot() if top else None
            before = tracemalloc.get_traced_memory()[0]
        else:
            before = _rss_bytes()
        handles = []
        for _ in range(count):
            handle = await harness.agents.create(options=AgentOptions(model=shared) if ran else None)
            if ran:
                handle.agent.followup("go")
                await handle.agent.when_idle()
            handles.append(handle)
        gc.collect()
        if kind != "rss":
            after = tracemalloc.get_traced_memory()[0]
            lines: list[str] = []
            if before_snapshot is not None:
                stats = tracemalloc.take_snapshot().compare_to(before_snapshot, "lineno")
                for stat in stats[:top]:
                    frame = stat.traceback[0]
                    lines.append(f"{stat.size_diff / count:8.0f} B/agent  {frame.filename}:{frame.lineno}")
            tracemalloc.stop()
        else:
            after = _rss_bytes()
            lines = []
        if len(harness.agents) != count or any(h.agent.status != "idle" for h in handles):
            raise RuntimeError("the agents are not all live and idle")
        for handle in handles:
            await handle.dispose()
    return {"bytes_per_agent": (after - before) / count, "agents": count, "top": lines}


async def measure_memory(count: int = MEMORY_AGENTS) -> dict[str, dict[str, Any]]:
    """Run the memory child once per kind, each in a fresh process."""
    out: dict[str, dict[str, Any]] = {}
    for kind in ("rss", "tracemalloc", "ran"):
        command = [sys.executable, str(Path(__file__)), "--memory-child", kind, "--agents", str(count)]
        done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
        try:
            out[kind] = json.loads(done.stdout.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            tail = done.stderr.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {done.returncode}"]
            out[kind] = {"error": tail[0]}
    return out


# ---------------------------------------------------------------- rows


def _row(figure: str, value: object, unit: str, target: str) -> Row:
    return {"figure": figure, "value": value, "unit": unit, "target": target}


def _timed(figure: str, timing: Timing, target: str) -> Row:
    """A per-run row: the wall median, with the CPU median in the label and every batch in the JSON."""
    row = _row(f"{figure} {timing.label()}", round(timing.median, 1), "us", target)
    row["wall_us_per_batch"] = [round(v, 1) for v in timing.wall]
    row["cpu_us_per_batch"] = [round(v, 1) for v in timing.cpu]
    return row


def _ratio(figure: str, value: float, target: str = "report") -> Row:
    return _row(figure, round(value, 2), "x", target)


async def bench() -> list[Row]:
    """Run every agent benchmark.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}`` (timing rows also carry
        their per-batch wall and CPU figures).
    """
    rows: list[Row] = []
    runs = BATCH * BATCHES
    run_target = f"<= {RUN_TARGET_US:g} us"

    reused = await measure_reused()
    scripted, instant = reused.scripted, reused.instant
    rows += [
        _timed(f"run, reused agent, memory store, ScriptedModel, {runs:,} runs", scripted, run_target),
        _ratio(
            f"  growth over those runs: last / first batch (session reached {reused.events:,} events)",
            scripted.wall[-1] / scripted.wall[0],
        ),
        _timed("run, reused agent, memory store, constant-cost model (harness only)", instant, run_target),
        _timed(
            f"run, same agent after {LONG_RUNS:,} runs ({reused.long_events:,} events), constant-cost model",
            reused.long,
            run_target,
        ),
        _ratio(f"  growth: after {LONG_RUNS:,} runs / first {runs:,} runs", reused.long.median / instant.median),
    ]

    fresh = await measure_fresh()
    rows += [
        _timed("run, fresh agent per run, memory store (followup + when_idle only)", fresh.run, run_target),
        _timed("  whole cycle: create + run + dispose", fresh.cycle, "report"),
    ]

    floor = reused.floor
    rows += [
        _timed(
            "trio floor (bench/floor.py: 2 streamed steps, 1 tool in a nursery, 16 events)",
            floor,
            "report (issue: ~48 us)",
        ),
        _ratio(
            "harness / floor: reused agent, ScriptedModel (median of per-batch ratios)",
            statistics.median(h / f for h, f in zip(scripted.wall, floor.wall)),
            f"<= {FLOOR_RATIO_TARGET:g} x",
        ),
        _ratio(
            "harness / floor: reused agent, constant-cost model",
            statistics.median(h / f for h, f in zip(instant.wall, floor.wall)),
            f"<= {FLOOR_RATIO_TARGET:g} x",
        ),
        _ratio("harness / floor: fresh agent (run only)", fresh.run.median / floor.median),
        _ratio("harness / floor, CPU time: reused agent, constant-cost model", instant.median_cpu / floor.median_cpu),
    ]

    jsonl = await measure_jsonl()
    fsync_p90 = statistics.quantiles(jsonl.fsync_us, n=10)[-1]
    rows += [
        _timed("run, reused agent, JSONL store (tmp dir, fsync on)", jsonl.reused, f"<= {JSONL_TARGET_US:g} us"),
        _row(
            f"  this disk: append 4 KiB + fsync in a worker thread, median of {len(jsonl.fsync_us)} "
            f"(p90 {fsync_p90:,.0f} us)",
            round(statistics.median(jsonl.fsync_us), 1),
            "us",
            "report",
        ),
        _timed("  the same run with fsync off", jsonl.no_fsync, "report"),
        _timed("run, fresh agent per run, JSONL store (its first flush creates the log)", jsonl.fresh.run, "report"),
    ]

    peers = await measure_peers()
    quoted = {"openai-agents": "~1.7 ms", "pydantic-ai": "~3.0 ms"}
    how = {"openai-agents": "Runner.run, fake Model", "pydantic-ai": "Agent.run, FunctionModel"}
    for name, data in peers.items():
        wall = data.get("wall_us") or []
        if data.get("error") or not wall:
            rows.append(_row(f"peer {name}: not measured: {data.get('error') or 'no timings'}", "n/a", "", "report"))
            continue
        timing = Timing()
        timing.wall, timing.cpu = list(wall), list(data.get("cpu_us") or wall)
        rows += [
            _timed(
                f"peer {name} {data.get('version')}: run ({how.get(name, 'its test model')})",
                timing,
                f"report (issue: {quoted.get(name, '?')})",
            ),
            _ratio(f"  harness / {name}: reused agent, ScriptedModel", scripted.median / timing.median),
            _ratio(f"  harness / {name}: fresh agent, create + run + dispose", fresh.cycle.median / timing.median),
        ]

    sequential, concurrent = await measure_create()
    create_target = f">= {CREATE_TARGET:,.0f} agents/s"
    rows += [
        _row(
            f"create + dispose, sequential (median of {len(sequential)} batches of {CREATE_BATCH:,})",
            round(statistics.median(sequential)),
            "agents/s",
            create_target,
        ),
        _row(
            f"create + dispose, {CREATE_BATCH:,} at a time in a nursery (median of {len(concurrent)} batches)",
            round(statistics.median(concurrent)),
            "agents/s",
            create_target,
        ),
    ]

    typed = await measure_typed()
    rows += [
        _timed("run, reused agent, constant-cost model, raw-schema Tool echo (jsonschema)", typed.raw, "report"),
        _timed("  the same run, typed-function echo (@tool, pydantic)", typed.typed, "report"),
        _ratio(
            "  typed-function tool / raw Tool, per run (median of per-batch ratios)",
            statistics.median(t / r for t, r in zip(typed.typed.wall, typed.raw.wall)),
            f"<= {TYPED_RATIO_TARGET:g} x",
        ),
        _ratio(
            "  typed-function tool / raw Tool, CPU time per run",
            statistics.median(t / r for t, r in zip(typed.typed.cpu, typed.raw.cpu)),
        ),
        _row("  tool call alone, raw Tool: validate + handler", round(typed.raw_call_us, 2), "us", "report"),
        _row("  tool call alone, typed function: validate + handler", round(typed.typed_call_us, 2), "us", "report"),
    ]

    memory = await measure_memory()
    after_turn = memory.pop("ran")
    sizes = {kind: data.get("bytes_per_agent") for kind, data in memory.items()}
    numeric = {kind: size for kind, size in sizes.items() if isinstance(size, int | float)}
    larger = max(numeric, key=lambda kind: numeric[kind]) if numeric else None
    names = {"rss": "RSS delta (/proc/self/statm)", "tracemalloc": "tracemalloc (Python allocations)"}
    for kind, data in memory.items():
        size = sizes[kind]
        if not isinstance(size, int | float):
            rows.append(_row(f"memory per idle agent, {names[kind]}: {data.get('error')}", "n/a", "", "report"))
            continue
        applies = kind == larger
        rows.append(
            _row(
                f"memory per idle agent, {MEMORY_AGENTS:,} agents, {names[kind]}"
                + (" (the larger: target applies)" if applies else ""),
                round(size / 1024, 2),
                "KiB",
                f"<= {MEMORY_TARGET / 1024:g} KiB" if applies else "report",
            )
        )
    size = after_turn.get("bytes_per_agent")
    rows.append(
        _row(
            f"memory per agent after one tool-calling turn, {MEMORY_AGENTS:,} agents, tracemalloc"
            " (its history and its parked driver task)",
            round(size / 1024, 2) if isinstance(size, int | float) else "n/a",
            "KiB" if isinstance(size, int | float) else "",
            "report",
        )
    )
    return rows


# ---------------------------------------------------------------- profiling


async def _profile(figure: str) -> None:
    """cProfile one figure's timed loop and print the top functions by own time."""
    profiler = cProfile.Profile()
    runs = BATCH * 4
    if figure in ("reused", "jsonl"):
        with tempfile.TemporaryDirectory(prefix="bench-agents-") as root:
            model = ScriptedModel([CALL, DONE] * (runs + BATCH))
            async with _open(model, store=root if figure == "jsonl" else ":memory:") as harness:
                harness.tools.add(ECHO)
                handle = await harness.agents.create()
                await _reused_batch(handle.agent, BATCH, None)
                model.requests.clear()
                profiler.enable()
                await _reused_batch(handle.agent, runs, None)
                profiler.disable()
                await handle.dispose()
    elif figure == "fresh":
        model = ScriptedModel([])
        async with _open(model) as harness:
            harness.tools.add(ECHO)
            await _fresh_batch(harness, model, BATCH, None)
            profiler.enable()
            await _fresh_batch(harness, model, runs, None)
            profiler.disable()
    elif figure == "typed":
        async with _open(ScriptedModel([])) as harness:
            handle = await harness.agents.create(
                options=AgentOptions(model=InstantModel()), setup=_local_tool(TYPED_ECHO)
            )
            await _reused_batch(handle.agent, BATCH, None)
            profiler.enable()
            await _reused_batch(handle.agent, runs, None)
            profiler.disable()
            await handle.dispose()
    elif figure == "create":
        async with _open(ScriptedModel([])) as harness:
            profiler.enable()
            for _ in range(runs):
                handle = await harness.agents.create()
                await handle.dispose()
            profiler.disable()
    else:
        raise SystemExit(f"unknown figure {figure!r}; use reused, fresh, jsonl, create or typed")
    stats = pstats.Stats(profiler)
    stats.sort_stats("tottime").print_stats(30)
    stats.sort_stats("cumulative").print_stats(30)


def main(argv: list[str] | None = None) -> None:
    """Print the rows as JSON lines (or run a profile / the memory child)."""
    parser = argparse.ArgumentParser(description="agent runtime benchmarks")
    parser.add_argument("--profile", metavar="FIGURE", help="cProfile one figure: reused, fresh, jsonl, create, typed")
    parser.add_argument("--memory-child", choices=["rss", "tracemalloc", "ran"], help=argparse.SUPPRESS)
    parser.add_argument("--agents", type=int, default=MEMORY_AGENTS, help=argparse.SUPPRESS)
    parser.add_argument("--memory-top", action="store_true", help="print the top allocation sites per idle agent")
    args = parser.parse_args(argv)
    if args.memory_child:
        print(json.dumps(trio.run(_memory_child, args.memory_child, args.agents, 0)))
    elif args.memory_top:
        result = trio.run(_memory_child, "tracemalloc", args.agents, 25)
        print(f"{result['bytes_per_agent']:.0f} B per idle agent (tracemalloc); top sites:")
        print("\n".join(result["top"]))
    elif args.profile:
        trio.run(_profile, args.profile)
    else:
        for row in trio.run(bench):
            print(json.dumps(row))


if __name__ == "__main__":
    main()
