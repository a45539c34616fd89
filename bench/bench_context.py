"""The per-step cost of context-window management must not grow with the session.

Before each step the driver estimates the size of the request it is about to
send (docs/long-sessions.rst): the last usage the provider reported plus an
estimate of what was added since, so the work is O(new events).  This module
grows one agent's session to about 1,000 and to about 100,000 events with a
constant-cost model (a context window so large that nothing is ever compacted,
so the estimate runs on every step and nothing else changes), then measures:

1. the estimate alone (``agent.context_estimate()`` after one more turn), and
2. one whole turn (``followup`` + ``when_idle``, a single step),

at both sizes, in interleaved batches (so warm-up, garbage collection and a
shared machine's load hit both alike), as the median over batches.  The rows
report each time and the 100k / 1k ratio (target <= 1.2).

Run with ``python bench/bench_context.py`` (rows as JSON lines).
"""

from __future__ import annotations

import json
import statistics
import time
from typing import Any

import trio

from trio_harness.agents import AgentOptions, ContextPolicy, ReactAgent
from trio_harness.model import Emit, Finish, ModelRequest, TextDelta, Usage
from trio_harness.testing import open_test_harness

SMALL = 1_000
LARGE = 100_000
BATCHES = 15
PER_BATCH = 40


class ConstantModel:
    """Answers every request with the same short text and usage: O(1) per request."""

    name = "constant"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        await trio.lowlevel.checkpoint()
        emit(TextDelta("ok, noted."))
        emit(Usage(input_tokens=1_000, output_tokens=3))
        emit(Finish("stop"))


async def _grow(agent: Any, events: int) -> None:
    while len(agent.session) < events:
        agent.followup("note this down")
        await agent.when_idle()


async def _batch(agent: ReactAgent) -> tuple[float, float]:
    """Seconds of (one estimate after a turn, one turn), averaged over a batch."""
    start = time.perf_counter()
    for _ in range(PER_BATCH):
        agent.followup("note this down")
        await agent.when_idle()
    turn = (time.perf_counter() - start) / PER_BATCH
    estimate_total = 0.0
    for _ in range(PER_BATCH):
        agent.followup("note this down")
        await agent.when_idle()
        began = time.perf_counter()
        agent.context_estimate()
        estimate_total += time.perf_counter() - began
    return estimate_total / PER_BATCH, turn


async def bench() -> list[dict[str, object]]:
    """Run the benchmark; rows ``{"figure", "value", "unit", "target"}``."""
    options = AgentOptions(context=ContextPolicy(window=10**12))  # estimated every step, never compacted
    samples: dict[int, list[tuple[float, float]]] = {SMALL: [], LARGE: []}
    async with (
        open_test_harness(ConstantModel()) as harness,
        harness.agents.open(options=options) as small,
        harness.agents.open(options=options) as large,
    ):
        assert isinstance(small, ReactAgent) and isinstance(large, ReactAgent)
        await _grow(small, SMALL)
        await _grow(large, LARGE)
        await _batch(small)  # warm-up
        await _batch(large)
        for _ in range(BATCHES):
            samples[SMALL].append(await _batch(small))
            samples[LARGE].append(await _batch(large))
    small_estimate, small_turn = (statistics.median(column) for column in zip(*samples[SMALL]))
    large_estimate, large_turn = (statistics.median(column) for column in zip(*samples[LARGE]))
    return [
        {
            "figure": f"context estimate per step, session of {SMALL:,} events",
            "value": round(small_estimate * 1e6, 2),
            "unit": "us",
            "target": "report",
        },
        {
            "figure": f"context estimate per step, session of {LARGE:,} events",
            "value": round(large_estimate * 1e6, 2),
            "unit": "us",
            "target": "report",
        },
        {
            "figure": f"context estimate per step, {LARGE:,} / {SMALL:,} events",
            "value": round(large_estimate / small_estimate, 3),
            "unit": "x",
            "target": "<= 1.2 x",
        },
        {
            "figure": f"one turn (estimate on), {LARGE:,} / {SMALL:,} events",
            "value": round(large_turn / small_turn, 3),
            "unit": "x",
            "target": "<= 1.2 x",
        },
    ]


if __name__ == "__main__":
    for row in trio.run(bench):
        print(json.dumps(row))
