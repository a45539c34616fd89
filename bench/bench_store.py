"""Benchmarks of the JSONL session store.

Figures:

* appends per second through :meth:`Session.append` into the JSONL store with
  a flush (``write`` + ``fsync``) every 15 events: the event mix of one
  tool-calling turn (target >= 100,000 events/s);
* the same without ``fsync``, to separate the CPU cost from the disk's;
* the time to resume (:meth:`SessionStore.prepare_resume`) a stored
  100,000-event session (target < 1.0 s).

Run with ``python bench/bench_store.py [DIR]``; the store lives in a temporary
directory under ``DIR`` (default: the system temporary directory), whose
filesystem decides what an ``fsync`` costs.
"""

from __future__ import annotations

import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio

from trio_harness.model._protocol import ToolCall, Usage
from trio_harness.session import JsonlPersistence, Session, SessionStore
from trio_harness.session._events import (
    AssistantChunk,
    AssistantMessage,
    Event,
    InboxMessage,
    InboxSpliced,
    RequestHeader,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)

APPEND_EVENTS = 60_000
LOAD_EVENTS = 100_000
TURN_LENGTH = 15


def turn_events(turn: int) -> list[tuple[type[Event], dict[str, Any]]]:
    """The 15 events of one tool-calling turn (two steps, two tool calls)."""
    message_id = f"msg-{turn}"
    calls = (
        ToolCall(f"call-{turn}-a", "bash", '{"command": "ls -la src/"}'),
        ToolCall(f"call-{turn}-b", "bash", '{"command": "grep -rn TODO src/ | head -20"}'),
    )
    output = "src/app.py:12: TODO handle the error\nsrc/io.py:40: TODO retry\n" * 4
    one = {"turn": turn, "step": 1}
    two = {"turn": turn, "step": 2}
    events: list[tuple[type[Event], dict[str, Any]]] = [
        (
            InboxSpliced,
            {"queue": "next-turn", "start": 0, "removed": (message_id,), "outcome": "claimed", "turn": turn},
        ),
        (TurnStart, {"turn": turn}),
        (StepStart, one),
        (UserMessage, {**one, "message_id": message_id, "text": "Find the TODOs in src/ and summarise them."}),
        (
            RequestHeader,
            {
                **one,
                "provider": "deepseek",
                "model": "deepseek-chat",
                "tools": ("bash", "task_output", "task_list", "task_kill", "subagent"),
            },
        ),
        (
            AssistantMessage,
            {
                **one,
                "text": "Let me look.",
                "reasoning": "I should list and grep.",
                "tool_calls": calls,
                "usage": Usage(1200, 80, 1024),
                "finish": "tool-calls",
            },
        ),
        (ToolCallRequested, {**one, "call_id": calls[0].id, "name": "bash", "arguments": calls[0].arguments}),
        (ToolCallRequested, {**one, "call_id": calls[1].id, "name": "bash", "arguments": calls[1].arguments}),
        (ToolResult, {**one, "call_id": calls[0].id, "name": "bash", "content": "app.py\nio.py\n"}),
        (ToolResult, {**one, "call_id": calls[1].id, "name": "bash", "content": output}),
        (StepEnd, one),
        (StepStart, two),
        (AssistantChunk, {**two, "kind": "text", "text": "There are two TODOs: "}),
        (
            AssistantMessage,
            {
                **two,
                "text": "There are two TODOs: error handling in app.py and a retry in io.py.",
                "usage": Usage(1500, 40, 1200),
            },
        ),
        (TurnEnd, {"turn": turn, "reason": "completed"}),
    ]
    assert len(events) == TURN_LENGTH
    return events


def fill(session: Session, turns: int, first_turn: int = 1) -> None:
    for turn in range(first_turn, first_turn + turns):
        for cls, fields in turn_events(turn):
            session.append(cls, **fields)


async def appends_per_second(directory: Path, *, fsync: bool, inline_fsync: bool = False) -> float:
    """Events/s appended with a flush after every turn (15 events)."""
    store = SessionStore(JsonlPersistence(directory, fsync=fsync, inline_fsync=inline_fsync))
    session = await store.prepare_new("bench-append", cwd="/bench")
    entry = store.enter(session)
    turns = APPEND_EVENTS // TURN_LENGTH
    prepared = [turn_events(turn) for turn in range(1, turns + 1)]
    started = time.perf_counter()
    for events in prepared:
        for cls, fields in events:
            session.append(cls, **fields)
        await session.flush()
    elapsed = time.perf_counter() - started
    await store.detach(entry)
    if len(session) != turns * TURN_LENGTH:
        raise RuntimeError("lost events")
    return len(session) / elapsed


async def resume_seconds(directory: Path) -> tuple[float, int]:
    """Seconds to resume a stored 100,000-event session; returns (seconds, bytes)."""
    persistence = JsonlPersistence(directory, fsync=False)
    writer_store = SessionStore(persistence)
    session = await writer_store.prepare_new("bench-load", cwd="/bench")
    entry = writer_store.enter(session)
    fill(session, LOAD_EVENTS // TURN_LENGTH)
    while len(session) < LOAD_EVENTS:  # pad to exactly 100,000 with balanced events
        session.append(InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m", "later"),))
    await writer_store.detach(entry)
    size = persistence.path_of("bench-load").stat().st_size

    best = float("inf")
    for _ in range(3):
        store = SessionStore(JsonlPersistence(directory))
        started = time.perf_counter()
        resumed = await store.prepare_resume("bench-load")
        best = min(best, time.perf_counter() - started)
        if len(resumed) != LOAD_EVENTS:
            raise RuntimeError(f"resumed {len(resumed)} events")
        await store.discard(resumed)
    return best, size


async def bench(directory: str | None = None) -> list[dict[str, object]]:
    """Run the session store benchmarks.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``.
    """
    with tempfile.TemporaryDirectory(prefix="bench-store-", dir=directory) as tmp:
        root = Path(tmp)
        fsynced = await appends_per_second(root / "fsync", fsync=True)
        inline = await appends_per_second(root / "inline", fsync=True, inline_fsync=True)
        unsynced = await appends_per_second(root / "nofsync", fsync=False)
        seconds, size = await resume_seconds(root / "load")
    return [
        {
            "figure": f"JSONL appends, flush + fsync every {TURN_LENGTH} events (tool-calling turn mix)",
            "value": round(fsynced),
            "unit": "events/s",
            "target": ">= 100,000 events/s",
        },
        {
            "figure": "  the same with JsonlPersistence(inline_fsync=True) (fsync on the loop's thread)",
            "value": round(inline),
            "unit": "events/s",
            "target": ">= 100,000 events/s",
        },
        {
            "figure": f"JSONL appends, flush every {TURN_LENGTH} events, fsync off (CPU cost only)",
            "value": round(unsynced),
            "unit": "events/s",
            "target": "report",
        },
        {
            "figure": f"resume a {LOAD_EVENTS:,}-event session ({size / 1e6:.1f} MB) via prepare_resume (best of 3)",
            "value": round(seconds, 3),
            "unit": "s",
            "target": "< 1.0 s",
        },
    ]


if __name__ == "__main__":
    for row in trio.run(bench, sys.argv[1] if len(sys.argv) > 1 else None):
        print(json.dumps(row))
