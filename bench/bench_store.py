"""Benchmarks of the JSONL session store.

Figures:

* appends per second through :meth:`Session.append` into the JSONL store with
  a flush (``write`` + ``fsync``) every 15 events: the event mix of one
  tool-calling turn (target >= 100,000 events/s);
* the same without ``fsync``, to separate the CPU cost from the disk's;
* the time to resume (:meth:`SessionRegistry.prepare_resume`) a stored
  100,000-event session (target < 1.0 s);
* the PostgreSQL store (:class:`PostgresStore`), on
  ``$TRIO_HARNESS_POSTGRES_URL`` or a throwaway local cluster with default
  durability: appends per second with a flush every 100 events (target >=
  40,000 events/s), the resume of a 100,000-event session (target < 1.5 s),
  and how long another worker needs to take a session over after its holder
  was killed with ``SIGKILL`` (target < 100 ms).  Without a server or the
  driver these rows say why they were skipped.

Run with ``python bench/bench_store.py [DIR]``; the store lives in a temporary
directory under ``DIR`` (default: the system temporary directory), whose
filesystem decides what an ``fsync`` costs.
"""

from __future__ import annotations

import contextlib
import gc
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.parse
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import trio

from trio_harness.model._protocol import ToolCall, Usage
from trio_harness.session import JsonlStore, Session, SessionRegistry, encode_event
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
    store = SessionRegistry(JsonlStore(directory, fsync=fsync, inline_fsync=inline_fsync))
    session = await store.prepare_new("bench-append", cwd="/bench")
    entry = store.enter(session)
    turns = APPEND_EVENTS // TURN_LENGTH
    prepared = [turn_events(turn) for turn in range(1, turns + 1)]
    # The input is not what is measured: collected now, the cyclic GC does not spend
    # the timed loop traversing and promoting its 60,000 fresh dicts (about 12% of it).
    gc.collect()
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
    persistence = JsonlStore(directory, fsync=False)
    writer_store = SessionRegistry(persistence)
    session = await writer_store.prepare_new("bench-load", cwd="/bench")
    entry = writer_store.enter(session)
    fill(session, LOAD_EVENTS // TURN_LENGTH)
    while len(session) < LOAD_EVENTS:  # pad to exactly 100,000 with balanced events
        session.append(InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m", "later"),))
    await writer_store.detach(entry)
    size = persistence.path_of("bench-load").stat().st_size

    best = float("inf")
    for _ in range(3):
        store = SessionRegistry(JsonlStore(directory))
        started = time.perf_counter()
        resumed = await store.prepare_resume("bench-load")
        best = min(best, time.perf_counter() - started)
        if len(resumed) != LOAD_EVENTS:
            raise RuntimeError(f"resumed {len(resumed)} events")
        await store.discard(resumed)
    return best, size


# ---------------------------------------------------------------- PostgreSQL

POSTGRES_BATCH = 100
POSTGRES_APPEND_EVENTS = 30_000
TAKEOVERS = 5


class NoServer(Exception):
    """No PostgreSQL server to measure (the message says why)."""


@contextlib.contextmanager
def postgres_server(max_connections: int = 50) -> Iterator[str]:
    """A PostgreSQL URL: ``$TRIO_HARNESS_POSTGRES_URL``, or a throwaway durable cluster (``max_connections``).

    Raises:
        NoServer: no server is installed and no URL is given.
    """
    url = os.environ.get("TRIO_HARNESS_POSTGRES_URL")
    if url:
        yield url
        return
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    if not found:
        raise NoServer("no PostgreSQL server installed and $TRIO_HARNESS_POSTGRES_URL not set")
    bindir = found[-1].parent
    directory = Path(tempfile.mkdtemp(prefix="bench-pg-", dir="/tmp"))
    prefix: list[str] = []
    if os.geteuid() == 0:  # initdb and pg_ctl refuse to run as root
        import pwd

        entry = pwd.getpwnam("postgres")
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        prefix = ["runuser", "-u", "postgres", "--"]
    sockets, data = directory / "sock", directory / "data"

    def run(*argv: str) -> None:
        subprocess.run([*prefix, *argv], check=True, capture_output=True, timeout=120)

    try:
        run(str(bindir / "initdb"), "--no-sync", "-D", str(data), "-A", "trust", "-U", "postgres")
        run("mkdir", "-m", "0700", str(sockets))
        options = f"-k {sockets} -c listen_addresses='' -c max_connections={max_connections}"
        run(str(bindir / "pg_ctl"), "-D", str(data), "-l", str(directory / "log"), "-o", options, "-w", "start")
        yield f"postgresql://postgres@/postgres?host={urllib.parse.quote(str(sockets), safe='')}"
    finally:
        subprocess.run(
            [*prefix, str(bindir / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(directory, ignore_errors=True)


def raw_appends(dsn: str, schema: str, lines: list[str]) -> float:
    """The floor: the same batches inserted through psycopg directly (pre-encoded, one transaction each)."""
    import psycopg

    query = (
        f'INSERT INTO "{schema}".events (session_id, seq, body) '
        "SELECT %s, %s + o - 1, b FROM unnest(%s::text[]) WITH ORDINALITY AS t(b, o)"
    )
    batches = POSTGRES_APPEND_EVENTS // POSTGRES_BATCH
    with psycopg.connect(dsn, autocommit=True) as conn:
        started = time.perf_counter()
        for number in range(batches):
            with conn.pipeline(), conn.transaction():
                conn.execute(query, ("bench-floor", number * len(lines), lines), binary=True)
        return batches * len(lines) / (time.perf_counter() - started)


_HOLDER = """
import sys, trio
from trio_harness.session import PostgresStore, SessionRegistry

async def main(dsn, schema, session_id):
    async with PostgresStore(dsn, schema=schema) as store:
        session = await SessionRegistry(store).prepare_resume(session_id)
        print("held", flush=True)
        await trio.sleep_forever()

trio.run(main, *sys.argv[1:4])
"""


async def postgres_figures(dsn: str) -> dict[str, float]:
    from trio_harness.session import PostgresStore

    schema = f"bench_{uuid.uuid4().hex[:8]}"
    persistence = PostgresStore(dsn, schema=schema)
    await persistence.check()
    figures: dict[str, float] = {}
    async with persistence:
        # Appends: a flush every 100 events, the tool-calling turn mix.
        store = SessionRegistry(persistence)
        session = await store.prepare_new("bench-append", cwd="/bench")
        entry = store.enter(session)
        mix = [step for turn in range(1, POSTGRES_BATCH // TURN_LENGTH + 2) for step in turn_events(turn)]
        batch = mix[:POSTGRES_BATCH]
        started = time.perf_counter()
        for _ in range(POSTGRES_APPEND_EVENTS // POSTGRES_BATCH):
            for cls, fields in batch:
                session.append(cls, **fields)
            await session.flush()
        figures["appends"] = len(session) / (time.perf_counter() - started)
        await store.detach(entry)
        figures["floor"] = await trio.to_thread.run_sync(
            raw_appends, dsn, schema, [encode_event(event) for event in session.events[:POSTGRES_BATCH]]
        )

        # Resume of 100,000 events.
        session = await store.prepare_new("bench-load", cwd="/bench")
        entry = store.enter(session)
        while LOAD_EVENTS - len(session) >= TURN_LENGTH:  # stored in batches of about 10,000 events
            turns = min(10_000 // TURN_LENGTH, (LOAD_EVENTS - len(session)) // TURN_LENGTH)
            fill(session, turns, first_turn=len(session) // TURN_LENGTH + 1)
            await session.flush()
        while len(session) < LOAD_EVENTS:
            session.append(InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m", "later"),))
        await store.detach(entry)
        best = float("inf")
        for _ in range(3):
            started = time.perf_counter()
            resumed = await store.prepare_resume("bench-load")
            best = min(best, time.perf_counter() - started)
            if len(resumed) != LOAD_EVENTS:
                raise RuntimeError(f"resumed {len(resumed)} events")
            await store.discard(resumed)
        figures["resume"] = best

        # A one-turn session for the takeover: the figure is the lock, not the read.
        session = await store.prepare_new("bench-takeover", cwd="/bench")
        entry = store.enter(session)
        fill(session, 1)
        await store.detach(entry)

    # Takeover after kill -9 of the holder (another process).
    taker = PostgresStore(dsn, schema=schema, lock_timeout=5.0)
    takeovers = []
    async with taker:
        for _ in range(TAKEOVERS):
            holder = subprocess.Popen(
                [sys.executable, "-c", _HOLDER, dsn, schema, "bench-takeover"], stdout=subprocess.PIPE, text=True
            )
            try:
                assert holder.stdout is not None
                if await trio.to_thread.run_sync(holder.stdout.readline) != "held\n":
                    raise RuntimeError("the holder process did not take the session")
                holder.send_signal(signal.SIGKILL)
                killed = time.perf_counter()
                sessions = SessionRegistry(taker)
                taken = await sessions.prepare_resume("bench-takeover")
                takeovers.append(time.perf_counter() - killed)
                await sessions.discard(taken)
            finally:
                holder.kill()
                holder.wait()
    figures["takeover"] = statistics.median(takeovers)
    return figures


async def postgres_rows() -> list[dict[str, object]]:
    names = (
        f"PostgreSQL appends, flush every {POSTGRES_BATCH} events (one transaction each, durable commit)",
        "  the same batches through psycopg directly, pre-encoded (the floor on this machine)",
        f"PostgreSQL: resume a {LOAD_EVENTS:,}-event session via prepare_resume (best of 3)",
        f"PostgreSQL: another worker takes a session over after kill -9 of its holder (median of {TAKEOVERS})",
    )
    try:
        import psycopg  # noqa: F401

        with postgres_server() as dsn:
            figures = await postgres_figures(dsn)
    except (ImportError, NoServer) as exc:
        reason = f"skipped: {exc}"
        return [{"figure": name, "value": reason, "unit": "", "target": "report"} for name in names]
    return [
        {"figure": names[0], "value": round(figures["appends"]), "unit": "events/s", "target": ">= 40,000 events/s"},
        {"figure": names[1], "value": round(figures["floor"]), "unit": "events/s", "target": "report"},
        {"figure": names[2], "value": round(figures["resume"], 3), "unit": "s", "target": "< 1.5 s"},
        {"figure": names[3], "value": round(figures["takeover"] * 1000, 1), "unit": "ms", "target": "< 100 ms"},
    ]


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
            "figure": "  the same with JsonlStore(inline_fsync=True) (fsync on the loop's thread)",
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
        *await postgres_rows(),
    ]


if __name__ == "__main__":
    for row in trio.run(bench, sys.argv[1] if len(sys.argv) > 1 else None):
        print(json.dumps(row))
