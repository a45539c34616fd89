"""The Trio floor: one tool-calling run done with plain Trio and no harness.

This is the yardstick for the harness's per-run figure (``bench_agents``): the
least a Trio program has to do for the same run, so ``harness / floor`` is the
price of everything the harness adds (durable events, the inbox, scopes,
argument validation, notifications).

One run, shaped like the harness's:

* ``followup(text)`` records the message and, when idle, spawns a driver task
  into a long-lived nursery (the harness spawns an *activity* per wake);
* ``when_idle()`` waits on a :class:`trio.Event` the driver sets at the end;
* the driver runs one turn of **2 streamed steps**: step 1 streams a tool call
  (a checkpoint, then chunks through a callback), the **1 tool runs in a
  nursery** (its JSON arguments parsed, a trivial handler awaited), step 2 streams
  the final text in two chunks;
* **16 events** (small tuples) are appended to a plain list on the way:
  inbox, turn start, step start, user message, request, assistant message,
  tool requested, tool result, step end, step start, request, 2 text chunks,
  assistant message, step end, turn end.

Nothing is persisted, validated against a schema or announced to listeners.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable

import trio

__all__ = ["EVENTS_PER_RUN", "FloorAgent", "measure_floor"]

EVENTS_PER_RUN = 16

Event = tuple[object, ...]
Emit = Callable[[tuple[str, str]], None]


async def _model(step: int, emit: Emit) -> None:
    """A zero-latency model: a tool call at step 1, the text ``done`` at step 2."""
    await trio.lowlevel.checkpoint()
    if step == 1:
        emit(("tool", '{"x": "hi"}'))
    else:
        emit(("text", "do"))
        emit(("text", "ne"))


async def _echo(args: dict[str, object]) -> str:
    return str(args["x"])


class FloorAgent:
    """A minimal Trio agent: an event list, a pending list, a driver task per wake."""

    def __init__(self, nursery: trio.Nursery) -> None:
        self.events: list[Event] = []
        self._nursery = nursery
        self._pending: list[str] = []
        self._idle = trio.Event()
        self._idle.set()
        self._running = False
        self._turn = 0

    def followup(self, text: str) -> None:
        """Queue ``text`` for a new turn and wake the driver."""
        self._pending.append(text)
        self.events.append(("inbox", text))
        if not self._running:
            self._running = True
            self._idle = trio.Event()
            self._nursery.start_soon(self._drain)

    async def when_idle(self) -> None:
        """Wait until the driver has no more work."""
        await self._idle.wait()

    async def _drain(self) -> None:
        try:
            while self._pending:
                await self._run_turn(self._pending.pop(0))
        finally:
            self._running = False
            self._idle.set()

    async def _run_turn(self, text: str) -> None:
        self._turn += 1
        turn = self._turn
        self.events.append(("turn/start", turn))
        step = 1
        while await self._run_step(turn, step, text if step == 1 else None):
            step += 1
        self.events.append(("turn/end", turn))

    async def _run_step(self, turn: int, step: int, text: str | None) -> bool:
        """One step; returns whether the model called a tool (so another step follows)."""
        events = self.events
        events.append(("step/start", turn, step))
        if text is not None:
            events.append(("user", turn, step, text))
        events.append(("request", turn, step))
        texts: list[str] = []
        calls: list[str] = []

        def emit(chunk: tuple[str, str]) -> None:
            kind, data = chunk
            if kind == "text":
                texts.append(data)
                events.append(("chunk", turn, step, data))
            else:
                calls.append(data)

        await _model(step, emit)
        events.append(("assistant", turn, step, "".join(texts), tuple(calls)))
        if calls:

            async def run_tool(arguments: str) -> None:
                events.append(("tool/requested", turn, step, arguments))
                result = await _echo(json.loads(arguments))
                events.append(("tool/result", turn, step, result))

            async with trio.open_nursery() as nursery:
                for arguments in calls:
                    nursery.start_soon(run_tool, arguments)
        events.append(("step/end", turn, step))
        return bool(calls)


async def measure_floor(runs: int, batches: int) -> list[float]:
    """Per-run wall time (microseconds) of each batch of ``runs`` floor runs on one agent.

    A warm-up batch runs first and is not reported.
    """
    per_run: list[float] = []
    async with trio.open_nursery() as nursery:
        agent = FloorAgent(nursery)
        for batch in range(batches + 1):
            start = time.perf_counter()
            for _ in range(runs):
                agent.followup("go")
                await agent.when_idle()
            elapsed = time.perf_counter() - start
            if batch:
                per_run.append(elapsed / runs * 1e6)
        if len(agent.events) != EVENTS_PER_RUN * runs * (batches + 1):
            raise RuntimeError(f"floor run produced {len(agent.events)} events, expected {EVENTS_PER_RUN} per run")
    return per_run


if __name__ == "__main__":
    import statistics

    figures = trio.run(measure_floor, 2000, 5)
    print(f"trio floor: {statistics.median(figures):.1f} us per run (batches: {[round(f, 1) for f in figures]})")
