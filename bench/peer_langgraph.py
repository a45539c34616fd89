"""LangGraph's PostgreSQL checkpointer doing a 10-step turn, for :mod:`bench_postgres_turn`.

The graph is LangGraph's own agent loop: a ``StateGraph(MessagesState)`` with
a ``model`` node (a fake, instant model: an ``AIMessage`` with one ``echo``
tool call while fewer than 9 tool results are in the state, then the final
answer ``"done"``), the prebuilt ``ToolNode`` running an instant ``@tool``
``echo``, and ``tools_condition`` between them; compiled with
``AsyncPostgresSaver`` (``langgraph-checkpoint-postgres``) on the server the
caller names.  One run is ``await graph.ainvoke({"messages": [("user", "go")]},
config, durability=MODE)`` on a new thread (``thread_id``): the 10 model steps
and 9 tool steps of one turn, every super-step checkpointed.  Modes
``"sync"`` (each checkpoint is written before the next step starts) and
``"async"`` (written while the next step runs; LangGraph's default) are
measured in interleaved batches.

LangGraph runs on asyncio, so this runs in its own process (the bench's
interpreter, or ``$BENCH_LANGGRAPH_PYTHON``).  With ``--serve`` (how the bench
runs it, so that its batches interleave with ours in one run) it prints one
JSON line once the checkpointer is set up (``{"ready": true, "version": ...}``
or ``{"error": ...}``), then answers each ``MODE TURNS`` line on stdin with
``{"wall_us": ..., "cpu_us": ...}`` per step (or ``{"error": ...}``).
Without it, it measures on its own and prints one JSON object::

    {"version": "...", "checkpointer": "...", "modes": {"sync": {"wall_us": [...], "cpu_us": [...]}, ...},
     "error": null}

with per-step microseconds per timed batch; ``error`` (and no timings) when
LangGraph is not installed or a run fails.  The packages come from the
``bench`` dependency group (``nox -s bench``); they are imported with
:mod:`importlib`, so type checking does not need them.

Run with ``python bench/peer_langgraph.py DSN [--turns N] [--batches B] [--serve]``.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import importlib
import importlib.metadata
import json
import sys
import time
import traceback
import uuid
from collections.abc import AsyncIterator, Mapping
from typing import Any

STEPS = 10  # model steps per turn: 9 tool calls, then the final answer
MODES = ("sync", "async")


def _graph(checkpointer: Any) -> Any:
    graph_mod = importlib.import_module("langgraph.graph")
    prebuilt = importlib.import_module("langgraph.prebuilt")
    messages = importlib.import_module("langchain_core.messages")
    tools = importlib.import_module("langchain_core.tools")
    ai_message, tool_message = messages.AIMessage, messages.ToolMessage

    def echo(x: str) -> str:
        """Echo x back."""
        return x

    async def model(state: dict[str, Any]) -> dict[str, Any]:
        """The fake model: a tool call for steps 1..9, the final answer at step 10."""
        await asyncio.sleep(0)
        answered = sum(isinstance(message, tool_message) for message in state["messages"])
        if answered < STEPS - 1:
            call = {"name": "echo", "args": {"x": "hi"}, "id": f"call_{answered + 1}", "type": "tool_call"}
            return {"messages": [ai_message(content="", tool_calls=[call])]}
        return {"messages": [ai_message(content="done")]}

    builder = graph_mod.StateGraph(graph_mod.MessagesState)
    builder.add_node("model", model)
    builder.add_node("tools", prebuilt.ToolNode([tools.tool(echo)]))
    builder.add_edge(graph_mod.START, "model")
    builder.add_conditional_edges("model", prebuilt.tools_condition)
    builder.add_edge("tools", "model")
    return builder.compile(checkpointer=checkpointer)


class Runner:
    """The compiled graph on an open checkpointer; :meth:`batch` times turns in one mode."""

    def __init__(self, graph: Any, tool_message: type) -> None:
        self.graph = graph
        self.tool_message = tool_message

    async def run_once(self, mode: str) -> None:
        config = {"configurable": {"thread_id": uuid.uuid4().hex}}
        state = await self.graph.ainvoke({"messages": [("user", "go")]}, config, durability=mode)
        got = state["messages"]
        tool_results = sum(isinstance(message, self.tool_message) for message in got)
        if got[-1].content != "done" or tool_results != STEPS - 1:
            raise RuntimeError(f"unexpected LangGraph run: {got[-1].content!r} after {tool_results} tool results")
        stored = await self.graph.aget_state(config)
        if len(stored.values["messages"]) != len(got):
            raise RuntimeError("the checkpointer does not hold the run's final state")

    async def batch(self, mode: str, turns: int) -> dict[str, float]:
        """Per-step microseconds (wall and CPU) of ``turns`` turns."""
        if mode not in MODES:
            raise ValueError(f"unknown durability mode {mode!r}")
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(turns):
            await self.run_once(mode)
        wall, cpu = time.perf_counter() - start, time.process_time() - start_cpu
        return {"wall_us": wall / (turns * STEPS) * 1e6, "cpu_us": cpu / (turns * STEPS) * 1e6}


@contextlib.asynccontextmanager
async def _runner(dsn: str) -> AsyncIterator[Runner]:
    aio = importlib.import_module("langgraph.checkpoint.postgres.aio")
    messages = importlib.import_module("langchain_core.messages")
    async with aio.AsyncPostgresSaver.from_conn_string(dsn) as saver:
        await saver.setup()
        yield Runner(_graph(saver), messages.ToolMessage)


async def _measure(dsn: str, turns: int, batches: int) -> dict[str, dict[str, list[float]]]:
    results: dict[str, dict[str, list[float]]] = {mode: {"wall_us": [], "cpu_us": []} for mode in MODES}
    async with _runner(dsn) as runner:
        for batch in range(batches + 1):  # the first batch warms up and is not reported
            for mode in MODES:  # interleaved, so drift of a shared machine hits both alike
                timing = await runner.batch(mode, turns)
                if batch:
                    for key, value in timing.items():
                        results[mode][key].append(value)
    return results


def _versions() -> dict[str, object]:
    """The versions, and ``error`` when LangGraph or its PostgreSQL checkpointer cannot be imported."""
    result: dict[str, object] = {"version": None, "checkpointer": None, "error": None}
    try:
        result["version"] = importlib.metadata.version("langgraph")
        result["checkpointer"] = importlib.metadata.version("langgraph-checkpoint-postgres")
        importlib.import_module("langgraph.checkpoint.postgres.aio")
    except (importlib.metadata.PackageNotFoundError, ImportError) as exc:
        name = getattr(exc, "name", None) or str(exc)
        result["error"] = (
            f"{name} is not installed in {sys.executable} (langgraph and langgraph-checkpoint-postgres "
            "come with the bench dependency group, nox -s bench; or set $BENCH_LANGGRAPH_PYTHON to a venv's python)"
        )
    return result


def _failed(exc: BaseException) -> str:
    traceback.print_exc(file=sys.stderr)
    return f"{type(exc).__name__}: {exc}"


def measure(dsn: str, turns: int, batches: int) -> dict[str, object]:
    """Time LangGraph's 10-step turn in each durability mode; per-step microseconds per batch."""
    result = _versions()
    result["modes"] = {}
    if result["error"] is None:
        try:
            result["modes"] = asyncio.run(_measure(dsn, turns, batches))
        except Exception as exc:
            result["error"] = _failed(exc)
    return result


def _say(message: Mapping[str, object]) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


async def _serve(dsn: str) -> None:
    """Answer ``MODE TURNS`` lines on stdin with one JSON line each, until end of input."""
    loop = asyncio.get_running_loop()
    async with _runner(dsn) as runner:
        _say({**_versions(), "ready": True})
        while line := await loop.run_in_executor(None, sys.stdin.readline):
            mode, turns = line.split()
            try:
                _say(await runner.batch(mode, int(turns)))
            except Exception as exc:
                _say({"error": _failed(exc)})
                return


def serve(dsn: str) -> None:
    """The served mode: one JSON line when ready (or with ``error``), then one per batch asked for."""
    versions = _versions()
    if versions["error"] is not None:
        _say(versions)
        return
    try:
        asyncio.run(_serve(dsn))
    except Exception as exc:
        _say({"error": _failed(exc)})


def main(argv: list[str] | None = None) -> None:
    """Measure and print one JSON object on stdout (or serve batches with ``--serve``)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("dsn", help="a postgresql:// URL")
    parser.add_argument("--turns", type=int, default=5, help="10-step turns per batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches per mode (after one warm-up batch)")
    parser.add_argument("--serve", action="store_true", help="time the batches asked for on stdin (MODE TURNS)")
    args = parser.parse_args(argv)
    if args.serve:
        serve(args.dsn)
    else:
        print(json.dumps(measure(args.dsn, args.turns, args.batches)))


if __name__ == "__main__":
    main()
