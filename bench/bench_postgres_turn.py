"""A 10-step turn on PostgreSQL: ours per durability policy against LangGraph's PostgreSQL checkpointer.

The turn: prompt -> 9 steps each calling an instant ``echo`` tool -> the final
answer ``"done"`` at step 10, with a zero-latency model, on one throwaway
PostgreSQL server with its default durability (``fsync`` on, synchronous
commit; or ``$TRIO_HARNESS_POSTGRES_URL``).  Every figure is the time **per
step** (the turn's wall time / 10), the median over batches after a warm-up
batch; in brackets the CPU time of the same batches and the server's write
transactions per step (:class:`XidProbe`).

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
  checkpoint per step; the row says which.  With it, the emulation runs as
  well (on ``durability="turn"`` agents), as what one commit per step costs.
* **The floor** (:class:`Floor`): only the commits: one statement per step
  inserting a step's worth of event lines the way the session writer does
  (a prepared statement, its own transaction, sent from the Trio thread),
  waiting for the disk and not, in the same interleaved batches.
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
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import trio

from trio_harness import ScriptedModel, Tool, ToolContext, open_harness
from trio_harness.model._protocol import Emit, ModelRequest
from trio_harness.session import Session, encode_event
from trio_harness.session import _events as ev

sys.path.insert(0, str(Path(__file__).parent))
from bench_store import NoServer, postgres_server

HERE = Path(__file__).parent

STEPS = 10  # model steps per turn: 9 tool calls, then the final answer
TURNS = 5  # turns per batch
BATCHES = 5  # timed batches, after one warm-up batch
POLICIES = ("sync", "step", "turn")
FLOORS = ("floor sync", "floor step")
# With the real policy: one flush per step on a "turn" agent, for comparison (the emulation).
EMULATED = ("emulated sync", "emulated step")
LANGGRAPH_MODES = ("sync", "async")
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


class XidProbe:
    """Counts the server's write transactions: the next transaction id, which each one that writes takes.

    Read between batches (nothing else writes then but the stores'
    occasional heartbeats), the difference is the batch's commits.
    """

    def __init__(self, dsn: str) -> None:
        import psycopg

        self.conn = psycopg.connect(dsn, autocommit=True)

    def __call__(self) -> int:
        row = self.conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
        assert row is not None
        return int(row[0])


class Timing:
    """Per-step microseconds of each timed batch, wall and CPU, and commits per step."""

    def __init__(self) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.commits: list[float] = []  # write transactions per step (see XidProbe)

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


class Floor:
    """The floor of a per-step checkpoint: one statement per step, sent the way the session writer sends it.

    Each "step" inserts one step's worth of pre-encoded event lines (a 10th
    of a stored turn) into the store's events table under a scratch session
    id with the writer's own statement and path (``session/_pg_wire.py``: a
    prepared ``INSERT ... unnest``, its own transaction, ``synchronous_commit``
    off for it when ``sync=False``, sent through libpq's non-blocking API from
    the Trio thread); nothing else of the harness.
    """

    def __init__(self, dsn: str, schema: str, lines: list[str], *, sync: bool) -> None:
        import psycopg

        from trio_harness.session._pg_schema import _Sql

        self.conn = psycopg.connect(dsn, autocommit=True)
        self.sync = sync
        per_step = max(1, len(lines) // STEPS)
        self.batch = lines[:per_step]
        self.seq = 0
        self.session_id = f"bench-floor-{'sync' if sync else 'step'}".encode()
        self.query = _Sql(schema).append_events(sync=sync)

    async def turns(self, turns: int) -> None:
        from trio_harness.session._pg_wire import _statement, text_array
        from trio_harness.session._pg_writer import _APPEND_FORMATS, _APPEND_TYPES

        for _ in range(turns * STEPS):
            params = [self.session_id, b"%d" % self.seq, text_array(self.batch, "utf-8")]
            await _statement(self.conn, self.query, params, _APPEND_TYPES, _APPEND_FORMATS)
            self.seq += len(self.batch)


class PeerError(Exception):
    """The LangGraph process cannot be used (the message says why)."""


class LangGraphPeer:
    """:mod:`peer_langgraph` ``--serve`` in its own process: batches timed on request.

    Its stderr goes to a temporary file, whose last line is quoted when it fails.
    """

    def __init__(self, process: trio.Process, stderr: Any, python: str) -> None:
        self.process = process
        self.stderr = stderr
        self.python = python
        self.buffer = b""
        self.version = ""

    @classmethod
    async def start(cls, dsn: str) -> LangGraphPeer:
        python = os.environ.get("BENCH_LANGGRAPH_PYTHON") or sys.executable
        stderr = tempfile.TemporaryFile()  # noqa: SIM115 (the peer's: closed by aclose)
        command = [python, str(HERE / "peer_langgraph.py"), dsn, "--serve"]
        try:
            process = await trio.lowlevel.open_process(
                command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr
            )
        except OSError as exc:
            stderr.close()
            raise PeerError(f"cannot run {python}: {exc}") from exc
        peer = cls(process, stderr, python)
        try:
            ready = await peer._receive()
            peer.version = f"{ready.get('version')} (AsyncPostgresSaver {ready.get('checkpointer')})"
        except BaseException:
            await peer.aclose()
            raise
        return peer

    async def _receive(self) -> dict[str, Any]:
        assert self.process.stdout is not None
        try:
            with trio.fail_after(LANGGRAPH_TIMEOUT):
                while b"\n" not in self.buffer:
                    chunk = await self.process.stdout.receive_some()
                    if not chunk:
                        raise PeerError(f"the LangGraph process exited ({self._stderr_tail()})")
                    self.buffer += chunk
        except trio.TooSlowError:
            raise PeerError(f"the LangGraph process did not answer in {LANGGRAPH_TIMEOUT:g} s") from None
        line, self.buffer = self.buffer.split(b"\n", 1)
        try:
            message: dict[str, Any] = json.loads(line)
        except ValueError:
            raise PeerError(f"the LangGraph process said {line[:200]!r}") from None
        if message.get("error"):
            raise PeerError(str(message["error"]))
        return message

    def _stderr_tail(self) -> str:
        self.stderr.seek(0)
        lines = self.stderr.read().decode(errors="replace").strip().splitlines()
        return lines[-1] if lines else "no output"

    async def batch(self, mode: str, turns: int) -> tuple[float, float]:
        """Per-step microseconds (wall, CPU) of ``turns`` LangGraph turns with ``durability=mode``."""
        assert self.process.stdin is not None
        try:
            await self.process.stdin.send_all(f"{mode} {turns}\n".encode())
        except trio.BrokenResourceError:
            raise PeerError(f"the LangGraph process exited ({self._stderr_tail()})") from None
        answer = await self._receive()
        return float(answer["wall_us"]), float(answer["cpu_us"])

    async def aclose(self) -> None:
        with trio.CancelScope(shield=True):
            if self.process.stdin is not None:
                with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError):
                    await self.process.stdin.aclose()
            with trio.move_on_after(10):
                await self.process.wait()
            if self.process.returncode is None:
                self.process.kill()
                await self.process.wait()
            self.stderr.close()


class Measured:
    """Per-step timings keyed by policy, ``floor sync`` / ``floor step`` and ``langgraph sync`` / ``async``."""

    def __init__(self, *, real: bool) -> None:
        self.real = real  # open_harness took durability (else sync and step are emulated)
        names = (*POLICIES, *EMULATED, *FLOORS, *(f"langgraph {mode}" for mode in LANGGRAPH_MODES))
        self.timings = {name: Timing() for name in names}
        self.langgraph_version = ""
        self.langgraph_error: str | None = None


async def measure(dsn: str, turns: int = TURNS, batches: int = BATCHES) -> Measured:
    """Ours per policy, the floors and LangGraph per mode, in interleaved batches on one server."""
    from trio_harness.session import PostgresStore

    result = Measured(real=has_durability())
    real, timings = result.real, result.timings
    schema = f"bench_turn_{uuid.uuid4().hex[:8]}"
    agents: dict[str, tuple[Any, ScriptedModel]] = {}
    async with contextlib.AsyncExitStack() as stack:
        peer: LangGraphPeer | None = None

        async def close_peer() -> None:
            if peer is not None:
                await peer.aclose()

        stack.push_async_callback(close_peer)
        try:
            peer = await LangGraphPeer.start(dsn)
            result.langgraph_version = peer.version
        except PeerError as exc:
            result.langgraph_error = str(exc)
        for policy in (*POLICIES, *EMULATED) if real else POLICIES:
            scripted = ScriptedModel([])
            model: Any = scripted
            options: dict[str, Any] = {}
            if real:
                options["durability"] = policy if policy in POLICIES else "turn"
            if policy in EMULATED or (not real and policy != "turn"):
                model = FlushEachStep(scripted, sync=policy.endswith("sync"))
            harness = await stack.enter_async_context(
                open_harness(model=model, store=PostgresStore(dsn, schema=schema), builtin_tools=False, **options)
            )
            harness.tools.add(ECHO)
            handle = await harness.agents.create()
            stack.push_async_callback(handle.dispose)
            if isinstance(model, FlushEachStep):
                model.session = handle.agent.session
            agents[policy] = (handle.agent, scripted)
        floors: dict[str, Floor] = {}
        probe = XidProbe(dsn)
        stack.callback(probe.conn.close)
        gc.collect()
        for batch in range(batches + 1):  # the first batch warms up and is not reported
            for policy, (agent, scripted) in agents.items():
                scripted.push(*(TURN_SCRIPT * turns))
                scripted.requests.clear()  # the test double keeps every request: not the harness's cost
                start_len = len(agent.session.events)
                xid = probe()
                wall, cpu = time.perf_counter(), time.process_time()
                for _ in range(turns):
                    agent.followup("go")
                    await agent.when_idle()
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                _check_turns(agent.session.events, start_len, turns)
                if batch:
                    timings[policy].add(wall, cpu, turns * STEPS)
                    timings[policy].commits.append((probe() - xid) / (turns * STEPS))
            if not floors:  # the events of the warm-up's last turn are the floor's lines
                events = agents["sync"][0].session.events
                last = max(i for i, event in enumerate(events) if isinstance(event, ev.TurnStart))
                lines = [encode_event(event) for event in events[last:]]
                for name in FLOORS:
                    floors[name] = Floor(dsn, schema, lines, sync=name == "floor sync")
                    stack.callback(floors[name].conn.close)
            for name, floor in floors.items():
                xid = probe()
                wall, cpu = time.perf_counter(), time.process_time()
                await floor.turns(turns)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                if batch:
                    timings[name].add(wall, cpu, turns * STEPS)
                    timings[name].commits.append((probe() - xid) / (turns * STEPS))
            if peer is not None:
                try:
                    for mode in LANGGRAPH_MODES:
                        xid = probe()
                        wall_us, cpu_us = await peer.batch(mode, turns)
                        if batch:
                            timing = timings[f"langgraph {mode}"]
                            timing.wall.append(wall_us)
                            timing.cpu.append(cpu_us)
                            timing.commits.append((probe() - xid) / (turns * STEPS))
                except PeerError as exc:
                    result.langgraph_error = str(exc)
                    await peer.aclose()
                    peer = None
    return result


# ---------------------------------------------------------------- rows


def _row(figure: str, value: object, unit: str, target: str) -> Row:
    return {"figure": figure, "value": value, "unit": unit, "target": target}


def _timed(figure: str, timing: Timing, target: str = "report") -> Row:
    commits = f"; {statistics.median(timing.commits):.1f} commits" if timing.commits else ""
    label = f"[cpu {timing.median_cpu / 1000:.2f} ms{commits}]"
    row = _row(f"{figure} {label}", round(timing.median / 1000, 3), "ms", target)
    row["wall_us_per_batch"] = [round(v, 1) for v in timing.wall]
    row["cpu_us_per_batch"] = [round(v, 1) for v in timing.cpu]
    row["commits_per_step_per_batch"] = [round(v, 2) for v in timing.commits]
    return row


GOALS = (
    ("sync", "sync", SYNC_GOAL),
    ("async", "step", STEP_GOAL),
)
TITLE = f"PostgreSQL {STEPS}-step turn, per step:"


def rows_for(measured: Measured | None, skipped: str | None = None) -> list[Row]:
    """The table's rows (``skipped``: why nothing was measured)."""
    goal_names = [f'  LangGraph "{theirs}" / ours "{mine}" per step' for theirs, mine, _ in GOALS]
    if measured is None:
        names = [f'{TITLE} ours, durability="{policy}"' for policy in POLICIES]
        names += [f'  LangGraph, durability="{mode}"' for mode in LANGGRAPH_MODES]
        rows = [_row(name, f"skipped: {skipped}", "", "report") for name in names]
        rows += [_row(name, "n/a", "", f">= {goal:g} x") for name, (_, _, goal) in zip(goal_names, GOALS)]
        return rows
    timings, rows = measured.timings, []
    for policy in POLICIES:
        emulated = " (emulated: a flush before each model request)" if not measured.real and policy != "turn" else ""
        rows.append(_timed(f'{TITLE} ours, durability="{policy}"{emulated}', timings[policy]))
    if measured.real:
        for name in EMULATED:
            mode = name.removeprefix("emulated ")
            figure = f"  one checkpoint per step instead (emulated: flush(sync={mode == 'sync'}) before each request)"
            rows.append(_timed(figure, timings[name]))
    for name, how in (("floor sync", "waiting for the disk"), ("floor step", "synchronous_commit off")):
        figure = f"  floor: one commit of a step's events, as the writer sends it (nothing else), {how}"
        rows.append(_timed(figure, timings[name]))
    error = measured.langgraph_error
    for mode in LANGGRAPH_MODES:
        version = f" {measured.langgraph_version}" if measured.langgraph_version else ""
        figure = f'  LangGraph{version}, durability="{mode}"'
        if error:
            rows.append(_row(f"{figure}: not measured: {error}", "n/a", "", "report"))
        else:
            rows.append(_timed(figure, timings[f"langgraph {mode}"], "report (issue: ~5.1 ms)"))
    for name, (their_mode, our_policy, goal) in zip(goal_names, GOALS):
        if error:
            rows.append(_row(f"{name}: LangGraph not measured", "n/a", "", f">= {goal:g} x"))
            continue
        theirs, ours = timings[f"langgraph {their_mode}"], timings[our_policy]
        ratio = statistics.median(t / o for t, o in zip(theirs.wall, ours.wall))
        rows.append(_row(f"{name} (median of per-batch ratios)", round(ratio, 2), "x", f">= {goal:g} x"))
    if not error:
        # The same ratios in CPU time (each process's own, the server's not included): on a machine
        # whose cores are shared, the wall ratios follow the load; these much less.
        for their_mode, our_policy, _ in GOALS:
            theirs, ours = timings[f"langgraph {their_mode}"], timings[our_policy]
            ratio = statistics.median(t / o for t, o in zip(theirs.cpu, ours.cpu))
            figure = f'  CPU per step, LangGraph "{their_mode}" over ours "{our_policy}" (median of per-batch ratios)'
            rows.append(_row(figure, round(ratio, 2), "x", "report"))
    return rows


async def bench() -> list[Row]:
    """Run the PostgreSQL turn benchmark.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``.
    """
    try:
        import psycopg  # noqa: F401

        with postgres_server() as dsn:
            measured = await measure(dsn)
    except ImportError as exc:
        return rows_for(None, f"the PostgreSQL driver is not installed ({exc})")
    except NoServer as exc:
        return rows_for(None, str(exc))
    return rows_for(measured)


if __name__ == "__main__":
    for row in trio.run(bench):
        print(json.dumps(row))
