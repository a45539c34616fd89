"""Benchmark of the PostgreSQL store's pooled mode (PooledPostgresStore): group commit and connections.

Figures, on ``$TRIO_HARNESS_POSTGRES_URL`` or a throwaway durable local
cluster (``max_connections = 50``, see bench_store.py):

* appends per second with 1,000 live sessions on one worker flushing a turn
  (8 events) each at once, pooled mode (group commit);
* the same with the per-session mode, which holds a connection per live
  session, so only as many sessions as the server's connections allow (40
  here) flush at once: each flush is its own transaction;
* the per-session mode holding the same 1,000 sessions (a connection each),
  on a second cluster started with ``max_connections = 1100``;
* the ratios (goal >= 5x): against the same 1,000 sessions (the honest
  headline) and against the 40 a stock-sized server allows;

Each mode's rounds start after a full garbage collection (untimed): the
appends before a round grow the heap by 8,000 events, and the collection
they make due otherwise lands in one round's flushes at random (a 60-80 ms
pause, as long as the round itself).
* the connections the pooled worker used for its 1,000 sessions
  (``pg_stat_activity``; at most ``pool_size + 2``).

Run with ``python bench/bench_pooled.py``.
"""

from __future__ import annotations

import gc
import sys
import time
import uuid
from typing import Any

import trio
from bench_store import NoServer, postgres_server

from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.session._events import InboxMessage

POOLED_SESSIONS = 1000
PER_SESSION_SESSIONS = 40
ROUNDS = 10
POOL_SIZE = 4


def one_turn(session: Any, number: int) -> None:
    message_id = f"m{number}"
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage(message_id, "go"),))
    session.append(ev.TurnStart, turn=number)
    session.append(ev.StepStart, turn=number, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=(message_id,), outcome="claimed", turn=number)
    session.append(ev.UserMessage, turn=number, step=1, message_id=message_id, text="go")
    session.append(ev.AssistantMessage, turn=number, step=1, text="done " * 20)
    session.append(ev.StepEnd, turn=number, step=1)
    session.append(ev.TurnEnd, turn=number, reason="completed")


def _count(row: Any) -> int:
    """The count of a ``SELECT count(*)`` row."""
    assert row is not None
    return int(row[0])


async def appends(store: PostgresStore, count: int) -> tuple[float, int]:
    """Events/s of ``count`` live sessions flushing a turn each at once, ``ROUNDS`` times; connections used."""
    sessions = SessionRegistry(store)
    entries = []
    for number in range(count):
        session = await sessions.prepare_new(f"s{number}", cwd="/w")
        entries.append(sessions.enter(session))
        one_turn(session, 1)
        await session.flush()
    elapsed = 0.0
    for round_number in range(2, ROUNDS + 3):  # the first round warms up (untimed): the pool's connections open
        for entry in entries:
            one_turn(entry.session, round_number)
        # The collector's walk of the heap the appends just grew (the sessions' events) is not the flushes' work:
        # run here, untimed, in every mode, it does not land in one mode's timed flushes at random.
        gc.collect()
        started = time.perf_counter()
        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(entry.session.flush)
        if round_number > 2:
            elapsed += time.perf_counter() - started
    used = await store._run(
        "count connections",
        lambda conn: _count(
            conn.execute("SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bench-pooled'").fetchone()
        ),
    )
    for entry in entries:
        await sessions.detach(entry)
    return count * 8 * ROUNDS / elapsed, int(used)


async def figures(dsn: str, runs: tuple[tuple[str, type[PostgresStore], int], ...]) -> dict[str, float]:
    dsn += ("&" if "?" in dsn else "?") + "application_name=bench-pooled"
    out: dict[str, float] = {}
    for name, cls, count in runs:
        # 1,000 per-session writers: no heartbeats (on a small machine their 1,000 connections' heartbeats
        # fall behind while the sessions are created and the server drops them), the appends alone measured.
        quiet: dict[str, Any] = {"heartbeat": None, "idle_session_timeout": None} if count > 100 else {}
        store = cls(dsn, schema="bench_" + uuid.uuid4().hex[:12], pool_size=POOL_SIZE, **quiet)
        await store.check()
        async with store:
            rate, used = await appends(store, count)
        out[name], out[f"{name} connections"] = rate, used
        print(f"{name}: {rate:,.0f} events/s, {count} sessions", file=sys.stderr, flush=True)
    return out


async def bench() -> list[dict[str, object]]:
    names = (
        f"PostgreSQL pooled mode: appends/s, {POOLED_SESSIONS:,} live sessions on one worker flushing a turn at once",
        f"  per-session mode: {PER_SESSION_SESSIONS} live sessions (a connection each) flushing at once",
        f"  pooled / per-session appends/s ({PER_SESSION_SESSIONS} per-session sessions)",
        f"  per-session mode: the same {POOLED_SESSIONS:,} live sessions (a connection each, max_connections 1100)",
        f"  pooled / per-session appends/s (the same {POOLED_SESSIONS:,} sessions: the headline)",
        f"  connections the pooled worker used for {POOLED_SESSIONS:,} live sessions (pool_size {POOL_SIZE})",
    )
    try:
        import psycopg  # noqa: F401

        with postgres_server() as dsn:
            found = await figures(
                dsn,
                (
                    ("pooled", PooledPostgresStore, POOLED_SESSIONS),
                    ("per-session", PostgresStore, PER_SESSION_SESSIONS),
                ),
            )
        with postgres_server(max_connections=POOLED_SESSIONS + 100) as dsn:
            found.update(await figures(dsn, (("per-session same", PostgresStore, POOLED_SESSIONS),)))
    except (ImportError, NoServer) as exc:
        return [{"figure": name, "value": f"skipped: {exc}", "unit": "", "target": "report"} for name in names]
    return [
        {"figure": names[0], "value": round(found["pooled"]), "unit": "events/s", "target": "report"},
        {"figure": names[1], "value": round(found["per-session"]), "unit": "events/s", "target": "report"},
        {"figure": names[2], "value": round(found["pooled"] / found["per-session"], 1), "unit": "x", "target": ">= 5x"},
        {"figure": names[3], "value": round(found["per-session same"]), "unit": "events/s", "target": "report"},
        {
            "figure": names[4],
            "value": round(found["pooled"] / found["per-session same"], 1),
            "unit": "x",
            "target": ">= 5x",
        },
        {
            "figure": names[5],
            "value": found["pooled connections"],
            "unit": "connections",
            "target": f"<= {POOL_SIZE + 2}",
        },
    ]


if __name__ == "__main__":
    for row in trio.run(bench):
        print(row)
