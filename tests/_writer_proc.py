"""A writer process for the SIGKILL and lock tests in ``test_jsonl.py``.

Usage::

    python _writer_proc.py ROOT SESSION_ID EVERY [LIMIT]

Creates the session in a JSONL store at ``ROOT`` and appends the events of
:func:`expected_event`; after every ``EVERY`` events it awaits
``session.flush()`` and then prints ``flushed <count>`` (flushed to stdout), so
every reported event is durable.  With ``LIMIT`` it stops appending after that
many events and keeps the session live (its writer open); without, it appends
forever.  It never exits on its own: the test kills it.
"""

from __future__ import annotations

import sys
from typing import Any

import trio

from trio_harness.model._protocol import ToolCall, Usage
from trio_harness.session import JsonlStore, SessionRegistry
from trio_harness.session._events import (
    AssistantMessage,
    Event,
    InboxMessage,
    InboxSpliced,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolResult,
    TurnEnd,
    TurnStart,
)

TS = 1_700_000_000.25
"""The wall-clock time of every event (the store's clock is fixed)."""

CYCLE = 8


def event_for(index: int) -> tuple[type[Event], dict[str, Any]]:
    """The class and fields of the ``index``-th event: tool-calling turns, varied sizes."""
    turn, position = divmod(index, CYCLE)
    turn += 1
    filler = "ü✓x" * (index % 41)  # vary line lengths, multi-byte UTF-8 included
    call = ToolCall(f"call-{turn}", "bash", f'{{"command": "echo {filler}"}}')
    steps: list[tuple[type[Event], dict[str, Any]]] = [
        (InboxSpliced, {"queue": "next-turn", "start": 0, "inserted": (InboxMessage(f"m{turn}", filler),)}),
        (TurnStart, {"turn": turn}),
        (StepStart, {"turn": turn, "step": 1}),
        (
            AssistantMessage,
            {"turn": turn, "step": 1, "text": filler, "tool_calls": (call,), "usage": Usage(index, 2, 0)},
        ),
        (
            ToolCallRequested,
            {"turn": turn, "step": 1, "call_id": call.id, "name": call.name, "arguments": call.arguments},
        ),
        (ToolResult, {"turn": turn, "step": 1, "call_id": call.id, "name": call.name, "content": f"{filler}\nline 2"}),
        (StepEnd, {"turn": turn, "step": 1}),
        (TurnEnd, {"turn": turn, "reason": "completed"}),
    ]
    assert len(steps) == CYCLE
    return steps[position]


def expected_event(index: int) -> Event:
    """The ``index``-th event exactly as the writer appends it."""
    cls, fields = event_for(index)
    return cls(seq=index, ts=TS, **fields)


async def main(root: str, session_id: str, every: int, limit: int | None) -> None:
    store = SessionRegistry(JsonlStore(root), clock=lambda: TS)
    session = await store.prepare_new(session_id, cwd="/")
    store.enter(session)
    count = 0
    while limit is None or count < limit:
        cls, fields = event_for(count)
        session.append(cls, **fields)
        count += 1
        if count % every == 0:
            await session.flush()
            print(f"flushed {count}", flush=True)
    await trio.sleep_forever()  # live until killed


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4]) if len(sys.argv) > 4 else None)
