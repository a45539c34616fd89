"""A 10-step turn on PostgreSQL: ours per durability policy against LangGraph's PostgreSQL checkpointer.

The turn: prompt -> 9 steps each calling an instant ``echo`` tool -> the final
answer ``"done"`` at step 10, with a zero-latency model, on one throwaway
PostgreSQL server with its default durability (``fsync`` on, synchronous
commit; or ``$TRIO_HARNESS_POSTGRES_URL``).  Every figure is the time **per
step** (the turn's wall time / 10), the median over batches after a warm-up
batch; the CPU time of the same batches is in brackets.

* **Ours**: :class:`ScriptedModel` on :class:`PostgresStore` through
  :func:`open_harness`, a reused agent doing ``followup`` + ``when_idle``, one
  agent per policy in interleaved batches:

  * ``"sync"``: every step's events committed before the next step starts,
    waiting for the disk;
  * ``"step"`` (the default of issue 24): committed at every step without
    waiting for the disk (``synchronous_commit`` off), the turn end waits;
  * ``"turn"``: one commit at the turn's end.

  When :func:`open_harness` takes ``durability`` the agents use it.  Without
  it (before issue 24's policy landed) ``"sync"`` and ``"step"`` are
  *emulated*: the model is wrapped so that it flushes the session before each
  model request (``flush()`` for sync, ``flush(sync=False)`` for step), one
  checkpoint per step; the row says which.
* **LangGraph** (:mod:`peer_langgraph`, in its own asyncio process): the same
  turn as a ``StateGraph`` with a model node and a ``ToolNode``, compiled with
  ``AsyncPostgresSaver`` on the same server, ``durability="sync"`` and
  ``"async"`` (its default, the closest to our ``"step"``).  Without
  LangGraph installed (or when a run fails) its rows say why and the goal
  rows are ``n/a``.

Goals (issue 24): our ``"sync"`` at least 3x cheaper per step than LangGraph
``"sync"``; our ``"step"`` at least 5x cheaper than LangGraph ``"async"``.

Run with ``python bench/bench_postgres_turn.py`` (rows as JSON lines).  The
LangGraph process uses this interpreter, or ``$BENCH_LANGGRAPH_PYTHON`` (a
venv holding ``langgraph`` and ``langgraph-checkpoint-postgres``).
"""

from __future__ import annotations

import contextlib
import gc
import inspect
import json
import os
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from trio_harness import ScriptedModel, Tool, ToolContext, open_harness
from trio_harness.model._protocol import Emit, ModelRequest
from trio_harness.session import Session
from trio_harness.session import _events as ev

sys.path.insert(0, str(Path(__file__).parent))
from bench_store import NoServer, postgres_server

HERE = Path(__file__).parent

STEPS = 10  # model steps per turn: 9 tool calls, then the final answer
TURNS = 5  # turns per batch
BATCHES = 5  # timed batches, after one warm-up batch
POLICIES = ("sync", "step", "turn")
LANGGRAPH_TIMEOUT = 600.0
SYNC_GOAL = 3.0  # LangGraph "sync" / ours "sync", per step
STEP_GOAL = 5.0  # LangGraph "async" / ours "step", per step

CALL: dict[str, Any] = {"tool_calls": [{"name": "echo", "arguments": {"x": "hi"}}]}
DONE: dict[str, Any] = {"text": "done"}
TURN_SCRIPT = [CALL] * (STEPS - 1) + [DONE]

Row = dict[str, object]


async def _echo(ctx: ToolContext, args: dict[str, Any]) -> str:
    return str(args["x"])


ECHO = Tool(
    name="echo",
    description="Echo x back.",
    parameters={"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]},
    handler=_echo,
)


def has_durability() -> bool:
    """Whether :func:`open_harness` takes ``durability`` (issue 24's policy)."""
    return "durability" in inspect.signature(open_harness).parameters


class FlushEachStep:
    """The emulation of a per-step checkpoint: the session is flushed before each model request.

    ``sync=True`` waits for the disk (the ``"sync"`` policy); ``sync=False``
    commits without waiting for it (``"step"``).  Everything else is the
    wrapped :class:`ScriptedModel`.
    """

    def __init__(self, model: ScriptedModel, *, sync: bool) -> None:
        self.inner = model
        self.sync = sync
        self.session: Session | None = None

    @property
    def name(self) -> str:
        return self.inner.name

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        if self.session is not None:
            await self.session.flush(sync=self.sync)
        await self.inner.stream(request, emit)


class Timing:
    """Per-step microseconds of each timed batch, wall and CPU."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []

    def add(self, wall_s: float, cpu_s: float, steps: int) -> None:
        self.wall.append(wall_s / steps * 1e6)
        self.cpu.append(cpu_s / steps * 1e6)

    @property
    def median(self) -> float:
        return statistics.median(self.wall)

    @property
    def median_cpu(self) -> float:
        return statistics.median(self.cpu)


def _check_turns(events: Any, start: int, turns: int) -> None:
    """Every turn since ``start`` completed with 9 successful tool results."""
    completed = results = 0
    for event in events[start:]:
        if isinstance(event, ev.TurnEnd):
            completed += event.reason == "completed"
        elif isinstance(event, ev.ToolResult):
            results += not event.is_error
    if completed != turns or results != turns * (STEPS - 1):
        raise RuntimeError(f"{turns} turns gave {completed} completed turns and {results} tool results")


async def measure_ours(dsn: str, turns: int = TURNS, batches: int = BATCHES) -> tuple[dict[str, Timing], bool]:
    """Our 10-step turn per policy, interleaved; returns the timings and whether the policy is real."""
    from trio_harness.session import PostgresStore

    real = has_durability()
    schema = f"bench_turn_{uuid.uuid4().hex[:8]}"
    timings = {policy: Timing() for policy in POLICIES}
    agents: dict[str, tuple[Any, ScriptedModel]] = {}
    async with contextlib.AsyncExitStack() as stack:
        for policy in POLICIES:
            scripted = ScriptedModel([])
            model: Any = scripted
            options: dict[str, Any] = {}
            if real:
                options["durability"] = policy
            elif policy != "turn":
                model = FlushEachStep(scripted, sync=policy == "sync")
            harness = await stack.enter_async_context(
                open_harness(model=model, store=PostgresStore(dsn, schema=schema), builtin_tools=False, **options)
            )
            harness.tools.add(ECHO)
            handle = await harness.agents.create()
            stack.push_async_callback(handle.dispose)
            if isinstance(model, FlushEachStep):
                model.session = handle.agent.session
            agents[policy] = (handle.agent, scripted)
        gc.collect()
        for batch in range(batches + 1):  # the first batch warms up and is not reported
            for policy, (agent, scripted) in agents.items():
                scripted.push(*(TURN_SCRIPT * turns))
                scripted.requests.clear()  # the test double keeps every request: not the harness's cost
                start_len = len(agent.session.events)
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(turns):
                    agent.followup("go")
                    await agent.when_idle()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                _check_turns(agent.session.events, start_len, turns)
                if batch:
                    timings[policy].add(wall, cpu, turns * STEPS)
    return timings, real


async def measure_langgraph(dsn: str, turns: int = TURNS, batches: int = BATCHES) -> dict[str, Any]:
    """Run :mod:`peer_langgraph` in its own process; returns its JSON (with ``error`` when not measured)."""
    python = os.environ.get("BENCH_LANGGRAPH_PYTHON") or sys.executable
    command = [python, str(HERE / "peer_langgraph.py"), dsn, "--turns", str(turns), "--batches", str(batches)]
    try:
        with trio.fail_after(LANGGRAPH_TIMEOUT):
            done = await trio.run_process(command, capture_stdout=True, capture_stderr=True, check=False)
    except trio.TooSlowError:
        return {"error": f"the LangGraph process did not finish in {LANGGRAPH_TIMEOUT:g} s"}
    except OSError as exc:
        return {"error": f"cannot run {python}: {exc}"}
    try:
        data: dict[str, Any] = json.loads(done.stdout.decode().strip().splitlines()[-1])
    except (ValueError, IndexError):
        stderr = done.stderr.decode(errors="replace").strip().splitlines()
        return {"error": f"the LangGraph process exited with code {done.returncode}: {(stderr or ['no output'])[-1]}"}
    modes = data.get("modes") or {}
    if data.get("error") is None and not all(modes.get(mode, {}).get("wall_us") for mode in ("sync", "async")):
        data["error"] = "the LangGraph process reported no timings"
    return data


# ---------------------------------------------------------------- rows


def _row(figure: str, value: object, unit: str, target: str) -> Row:
    return {"figure": figure, "value": value, "unit": unit, "target": target}


def _timed(figure: str, timing: Timing, target: str = "report") -> Row:
    label = f"[cpu {timing.median_cpu / 1000:.2f} ms]"
    row = _row(f"{figure} {label}", round(timing.median / 1000, 3), "ms", target)
    row["wall_us_per_batch"] = [round(v, 1) for v in timing.wall]
    row["cpu_us_per_batch"] = [round(v, 1) for v in timing.cpu]
    return row


GOALS = (
    ("sync", "sync", SYNC_GOAL),
    ("async", "step", STEP_GOAL),
)
TITLE = f"PostgreSQL {STEPS}-step turn, per step:"


def rows_for(ours: dict[str, Timing] | None, real: bool, langgraph: dict[str, Any], skipped: str | None) -> list[Row]:
    """The table's rows (``skipped``: why nothing was measured)."""
    goal_names = [f'  LangGraph "{theirs}" / ours "{mine}" per step' for theirs, mine, _ in GOALS]
    if skipped is not None or ours is None:
        names = [f'{TITLE} ours, durability="{policy}"' for policy in POLICIES]
        names += [f'  LangGraph, durability="{mode}"' for mode in ("sync", "async")]
        rows = [_row(name, f"skipped: {skipped}", "", "report") for name in names]
        rows += [_row(name, "n/a", "", f">= {goal:g} x") for name, (_, _, goal) in zip(goal_names, GOALS)]
        return rows
    rows = []
    for policy in POLICIES:
        emulated = " (emulated: a flush before each model request)" if not real and policy != "turn" else ""
        rows.append(_timed(f'{TITLE} ours, durability="{policy}"{emulated}', ours[policy]))
    error = langgraph.get("error")
    theirs: dict[str, Timing] = {}
    for mode in ("sync", "async"):
        if error:
            rows.append(_row(f'  LangGraph, durability="{mode}": not measured: {error}', "n/a", "", "report"))
            continue
        timing = Timing()
        data = langgraph["modes"][mode]
        timing.wall, timing.cpu = list(data["wall_us"]), list(data.get("cpu_us") or data["wall_us"])
        theirs[mode] = timing
        version = f"{langgraph.get('version')} (AsyncPostgresSaver {langgraph.get('checkpointer')})"
        rows.append(_timed(f'  LangGraph {version}, durability="{mode}"', timing, "report (issue: ~5.1 ms)"))
    for name, (their_mode, our_policy, goal) in zip(goal_names, GOALS):
        if their_mode not in theirs:
            rows.append(_row(f"{name}: LangGraph not measured", "n/a", "", f">= {goal:g} x"))
            continue
        ratio = theirs[their_mode].median / ours[our_policy].median
        rows.append(_row(name, round(ratio, 2), "x", f">= {goal:g} x"))
    return rows


async def bench() -> list[Row]:
    """Run the PostgreSQL turn benchmark.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``.
    """
    try:
        import psycopg  # noqa: F401

        with postgres_server() as dsn:
            ours, real = await measure_ours(dsn)
            langgraph = await measure_langgraph(dsn)
    except ImportError as exc:
        return rows_for(None, False, {}, f"the PostgreSQL driver is not installed ({exc})")
    except NoServer as exc:
        return rows_for(None, False, {}, str(exc))
    return rows_for(ours, real, langgraph, None)


if __name__ == "__main__":
    for row in trio.run(bench):
        print(json.dumps(row))
