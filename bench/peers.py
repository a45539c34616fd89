"""Peer frameworks doing the same run as the harness figure, with zero-latency test models.

The run: prompt -> one tool call (``echo(x="hi")``) -> the tool result -> the
final text ``"done"``.  Each peer gets a model double that answers instantly
and offline, and its own idiomatic entry point is timed:

* **openai-agents** (the OpenAI Agents SDK): a minimal ``agents.Model``
  subclass returning canned ``ModelResponse`` objects (a ``function_call``
  item, then an assistant message), a ``@function_tool``, ``Runner.run``.
  Tracing is disabled (it would otherwise try to export over the network).
* **pydantic-ai** (``pydantic-ai-slim``): ``FunctionModel`` answering a
  ``ToolCallPart`` and then a ``TextPart``, a ``tool_plain``, ``Agent.run``.

Both are non-streaming runs (their default entry points); each run starts a new
conversation with a reused agent definition.  Peers run on asyncio, so this
module is run as a subprocess by ``bench_agents`` (which also keeps their
imports out of the harness's heap); it prints one JSON object::

    {"openai-agents": {"version": "...", "wall_us": [...], "cpu_us": [...], "error": null}, ...}

A peer that is not installed or fails reports ``error`` instead of timings.
The packages come from the ``bench`` dependency group (``nox -s bench``).
They are imported with :mod:`importlib`, so type checking does not need them.

Run with ``python bench/peers.py [--runs N] [--batches B]``.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import importlib.metadata
import json
import os
import sys
import time
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

__all__ = ["PEERS", "measure_peer"]

RunOnce = Callable[[], Awaitable[None]]


# ---------------------------------------------------------------- openai-agents


async def _openai_get_response(self: Any, system_instructions: Any, input: Any, *args: Any, **kwargs: Any) -> Any:
    """``Model.get_response``: a tool call first, the final text once a tool output is in the input."""
    await asyncio.sleep(0)
    items = input if isinstance(input, list) else []
    answered = any(_item_type(item) == "function_call_output" for item in items)
    self.calls += 1
    if answered:
        output: list[Any] = [
            self.ResponseOutputMessage(
                id=f"msg_{self.calls}",
                type="message",
                role="assistant",
                status="completed",
                content=[self.ResponseOutputText(type="output_text", text="done", annotations=[])],
            )
        ]
    else:
        output = [
            self.ResponseFunctionToolCall(
                id=f"fc_{self.calls}",
                call_id=f"call_{self.calls}",
                type="function_call",
                name="echo",
                arguments='{"x": "hi"}',
            )
        ]
    return self.ModelResponse(output=output, usage=self.Usage(), response_id=None)


def _item_type(item: Any) -> Any:
    if isinstance(item, dict):
        return item.get("type")
    return getattr(item, "type", None)


def _openai_stream_response(self: Any, *args: Any, **kwargs: Any) -> Any:
    raise NotImplementedError("the benchmark model does not stream")


def _setup_openai_agents() -> RunOnce:
    os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")
    agents = importlib.import_module("agents")
    responses = importlib.import_module("openai.types.responses")
    agents.set_tracing_disabled(True)
    model_cls = type(
        "BenchModel",
        (agents.Model,),
        {
            "get_response": _openai_get_response,
            "stream_response": _openai_stream_response,
            "ModelResponse": staticmethod(agents.ModelResponse),
            "Usage": staticmethod(agents.Usage),
            "ResponseOutputMessage": staticmethod(responses.ResponseOutputMessage),
            "ResponseOutputText": staticmethod(responses.ResponseOutputText),
            "ResponseFunctionToolCall": staticmethod(responses.ResponseFunctionToolCall),
        },
    )
    model = model_cls()
    model.calls = 0
    tool_calls = [0]

    def echo(x: str) -> str:
        """Echo ``x`` back."""
        tool_calls[0] += 1
        return x

    agent = agents.Agent(
        name="bench",
        instructions="You are a helpful assistant. Use the tools you are given when they help.",
        model=model,
        tools=[agents.function_tool(echo)],
    )
    runner = agents.Runner

    async def run_once() -> None:
        before = tool_calls[0]
        result = await runner.run(agent, "go")
        if result.final_output != "done" or tool_calls[0] != before + 1:
            got = f"{result.final_output!r} after {tool_calls[0] - before} tool calls"
            raise RuntimeError(f"unexpected openai-agents run: {got}")

    return run_once


# ---------------------------------------------------------------- pydantic-ai


def _setup_pydantic_ai() -> RunOnce:
    pydantic_ai = importlib.import_module("pydantic_ai")
    function = importlib.import_module("pydantic_ai.models.function")
    messages = importlib.import_module("pydantic_ai.messages")
    tool_return = messages.ToolReturnPart

    def respond(history: list[Any], info: Any) -> Any:
        if any(isinstance(part, tool_return) for part in history[-1].parts):
            return messages.ModelResponse(parts=[messages.TextPart("done")])
        return messages.ModelResponse(parts=[messages.ToolCallPart("echo", {"x": "hi"})])

    agent = pydantic_ai.Agent(
        function.FunctionModel(respond),
        instructions="You are a helpful assistant. Use the tools you are given when they help.",
    )
    tool_calls = [0]

    def echo(x: str) -> str:
        """Echo ``x`` back."""
        tool_calls[0] += 1
        return x

    agent.tool_plain(echo)

    async def run_once() -> None:
        before = tool_calls[0]
        result = await agent.run("go")
        if result.output != "done" or tool_calls[0] != before + 1:
            got = f"{result.output!r} after {tool_calls[0] - before} tool calls"
            raise RuntimeError(f"unexpected pydantic-ai run: {got}")

    return run_once


# ---------------------------------------------------------------- measuring

# name -> (distribution name, setup)
PEERS: dict[str, tuple[str, Callable[[], RunOnce]]] = {
    "openai-agents": ("openai-agents", _setup_openai_agents),
    "pydantic-ai": ("pydantic-ai-slim", _setup_pydantic_ai),
}


async def _batches(run_once: RunOnce, runs: int, batches: int) -> tuple[list[float], list[float]]:
    wall: list[float] = []
    cpu: list[float] = []
    for batch in range(batches + 1):  # the first batch warms up and is not reported
        start, start_cpu = time.perf_counter(), time.process_time()
        for _ in range(runs):
            await run_once()
        elapsed, elapsed_cpu = time.perf_counter() - start, time.process_time() - start_cpu
        if batch:
            wall.append(elapsed / runs * 1e6)
            cpu.append(elapsed_cpu / runs * 1e6)
    return wall, cpu


def measure_peer(name: str, runs: int, batches: int) -> dict[str, object]:
    """Time ``batches`` batches of ``runs`` runs of one peer (per-run microseconds)."""
    distribution, setup = PEERS[name]
    result: dict[str, object] = {"version": None, "wall_us": [], "cpu_us": [], "error": None}
    try:
        result["version"] = importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        result["error"] = f"{distribution} is not installed (it comes with the bench dependency group)"
        return result
    try:
        run_once = setup()
        wall, cpu = asyncio.run(_batches(run_once, runs, batches))
    except Exception as exc:
        traceback.print_exc(file=sys.stderr)
        result["error"] = f"{type(exc).__name__}: {exc}"
        return result
    result["wall_us"] = wall
    result["cpu_us"] = cpu
    return result


def main(argv: list[str] | None = None) -> None:
    """Measure every peer and print one JSON object on stdout."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--runs", type=int, default=200, help="runs per batch")
    parser.add_argument("--batches", type=int, default=5, help="timed batches (after one warm-up batch)")
    parser.add_argument("--only", choices=sorted(PEERS), help="measure one peer")
    args = parser.parse_args(argv)
    names = [args.only] if args.only else list(PEERS)
    print(json.dumps({name: measure_peer(name, args.runs, args.batches) for name in names}))


if __name__ == "__main__":
    main()
