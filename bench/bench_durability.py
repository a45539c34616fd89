"""What durable steps cost (issue 24, "Speed"): the tool run with each durability policy.

The run is bench_agents' (prompt -> one ``echo`` call -> its result -> ``"done"``:
2 steps, 4 checkpoints under ``"step"`` and ``"sync"``), on reused agents of one
harness, one agent per policy, in interleaved batches (the order alternating
from batch to batch); a ratio is the median of the per-batch ratios.

- Memory store: ``step`` / ``turn`` (target <= 1.05x): what the checkpoints cost
  in the driver when the store costs nothing.
- JSONL store in a temporary directory, fsync on: ``step`` / ``turn`` (target
  <= 1.15x): the checkpoints' writes without fsync beside the turn end's fsync;
  ``sync`` / ``turn`` is reported (one fsync per checkpoint).

Run with ``python bench/bench_durability.py`` (rows as JSON lines).
"""

from __future__ import annotations

import gc
import json
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

sys.path.insert(0, str(Path(__file__).parent))
from bench_agents import CALL, DONE, ECHO, Row, Timing, _open, _ratio, _reused_batch, _timed

from trio_harness import AgentOptions, ScriptedModel

MEMORY_RATIO_TARGET = 1.05
JSONL_RATIO_TARGET = 1.15
MEMORY_BATCH, MEMORY_BATCHES = 250, 12
JSONL_BATCH, JSONL_BATCHES = 60, 8


async def measure(store: Any, policies: tuple[str, ...], batch: int, batches: int) -> dict[str, Timing]:
    """Per-run timings of one reused agent per policy, in interleaved batches after a warm-up batch."""
    timings = {policy: Timing() for policy in policies}
    gc.collect()
    async with _open(ScriptedModel([]), store=store) as harness:
        harness.tools.add(ECHO)
        agents: dict[str, tuple[Any, ScriptedModel]] = {}
        for policy in policies:
            model = ScriptedModel([])
            handle = await harness.agents.create(options=AgentOptions(model=model, durability=policy))  # type: ignore[arg-type]
            agents[policy] = (handle.agent, model)
        for index in range(batches + 1):
            order = policies if index % 2 == 0 else tuple(reversed(policies))
            for policy in order:
                agent, model = agents[policy]
                model.push(*([CALL, DONE] * batch))
                model.requests.clear()
                await _reused_batch(agent, batch, timings[policy] if index else None)
    return timings


def _per_batch(a: Timing, b: Timing) -> float:
    return statistics.median(x / y for x, y in zip(a.wall, b.wall, strict=True))


def _per_batch_cpu(a: Timing, b: Timing) -> float:
    return statistics.median(x / y for x, y in zip(a.cpu, b.cpu, strict=True))


async def bench() -> list[Row]:
    """The durability rows: memory and JSONL, ``step`` (and ``sync``) against ``turn``."""
    rows: list[Row] = []
    memory = await measure(":memory:", ("turn", "step"), MEMORY_BATCH, MEMORY_BATCHES)
    rows += [
        _timed("durability: tool run (2 steps), memory store, durability='turn'", memory["turn"], "report"),
        _timed("  the same, durability='step' (4 checkpoints)", memory["step"], "report"),
        _ratio(
            "  step / turn, memory store (median of per-batch ratios)",
            _per_batch(memory["step"], memory["turn"]),
            f"<= {MEMORY_RATIO_TARGET:g} x",
        ),
        _ratio("  step / turn, memory store, CPU time", _per_batch_cpu(memory["step"], memory["turn"])),
    ]
    with tempfile.TemporaryDirectory(prefix="bench-durability-") as root:
        jsonl = await measure(root, ("turn", "step", "sync"), JSONL_BATCH, JSONL_BATCHES)
    rows += [
        _timed("durability: tool run (2 steps), JSONL (tmp dir, fsync on), durability='turn'", jsonl["turn"], "report"),
        _timed("  the same, durability='step' (4 checkpoints, written; the turn end fsynced)", jsonl["step"], "report"),
        _timed("  the same, durability='sync' (4 checkpoints fsynced, and the turn end)", jsonl["sync"], "report"),
        _ratio(
            "  step / turn, JSONL with fsync (median of per-batch ratios)",
            _per_batch(jsonl["step"], jsonl["turn"]),
            f"<= {JSONL_RATIO_TARGET:g} x",
        ),
        _ratio("  step / turn, JSONL with fsync, CPU time", _per_batch_cpu(jsonl["step"], jsonl["turn"])),
        _ratio("  sync / turn, JSONL with fsync", _per_batch(jsonl["sync"], jsonl["turn"])),
    ]
    return rows


def main() -> None:
    for row in trio.run(bench):
        print(json.dumps(row))


if __name__ == "__main__":
    main()
