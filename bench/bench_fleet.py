"""Benchmark of a fleet on one PostgreSQL (pooled mode): what a worker holds, and how fast others take over.

Figures, on ``$TRIO_HARNESS_POSTGRES_URL`` or a throwaway durable local
cluster (``max_connections = 50``, see bench_store.py), with
:class:`PooledPostgresStore` workers (``pool_size`` 4, the default
``heartbeat`` 0.4 s and ``idle_session_timeout`` 2 s):

* the connections a worker process uses while it holds 2,000 live sessions
  (``pg_stat_activity``; at most ``pool_size + 2``);
* after ``kill -9`` of that worker: how long until its liveness lock is
  free (the server drops it as soon as the socket closes), until another
  worker, waiting in ``resume``, resumed one of its sessions (target < 100 ms
  after the lock is free), and until it resumed all of them;
* after ``SIGSTOP`` of it (a frozen worker, its connections open): how long
  until another worker resumed the first of its sessions (the server ends
  the silent liveness connection after ``idle_session_timeout``), and all.

Run with ``python bench/bench_fleet.py``.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import trio
from bench_store import NoServer, postgres_server

from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.session._events import InboxMessage
from trio_harness.session._session import Session

SESSIONS = 2000
POOL_SIZE = 4
CONCURRENCY = 32
IDLE_SESSION_TIMEOUT = 2.0

_HOLDER = """
import sys, trio
from trio_harness.session import PooledPostgresStore, SessionRegistry

async def main(dsn, schema, count):
    async with PooledPostgresStore(dsn, schema=schema, pool_size=POOL_SIZE) as store:
        sessions = SessionRegistry(store)
        limiter = trio.CapacityLimiter(CONCURRENCY)
        held = []

        async def take(n):
            async with limiter:
                held.append(sessions.enter(await sessions.prepare_resume(f"s{n}")))

        async with trio.open_nursery() as nursery:
            for n in range(int(count)):
                nursery.start_soon(take, n)
        print("held", len(held), store.worker_key, flush=True)
        await trio.sleep_forever()

trio.run(main, *sys.argv[1:4])
""".replace("POOL_SIZE", str(POOL_SIZE)).replace("CONCURRENCY", str(CONCURRENCY))


def one_turn(session: Session) -> None:
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m1", "go"),))
    session.append(ev.TurnStart, turn=1)
    session.append(ev.StepStart, turn=1, step=1)
    session.append(ev.UserMessage, turn=1, step=1, message_id="m1", text="go")
    session.append(ev.AssistantMessage, turn=1, step=1, text="done")
    session.append(ev.StepEnd, turn=1, step=1)
    session.append(ev.TurnEnd, turn=1, reason="completed")


async def each(count: int, fn: Callable[[int], Awaitable[None]]) -> None:
    """``fn(n)`` for every ``n < count``, ``CONCURRENCY`` at a time."""
    limiter = trio.CapacityLimiter(CONCURRENCY)

    async def one(n: int) -> None:
        async with limiter:
            await fn(n)

    async with trio.open_nursery() as nursery:
        for n in range(count):
            nursery.start_soon(one, n)


def with_name(dsn: str, name: str) -> str:
    return dsn + ("&" if "?" in dsn else "?") + f"application_name={name}"


def lock_drop(dsn: str, key: int, armed: threading.Event) -> float:
    """(thread) Poll ``pg_locks`` until the advisory lock ``key`` (a worker's liveness lock) is free; that instant.

    ``armed`` is set once a poll saw it held (connected: the figure is not the connection's).
    """
    import psycopg

    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s"
    )
    params = ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while True:
            row = conn.execute(query, params).fetchone()
            if row is not None and row[0] == 0:
                if not armed.is_set():
                    raise RuntimeError("the holder's liveness lock was not held when the watch began")
                return time.perf_counter()
            armed.set()


async def takeover(dsn: str, schema: str, taker: PooledPostgresStore, sig: signal.Signals) -> dict[str, float]:
    """Start a holder of every session, stop it with ``sig``; the taker's first and last take, from the signal."""
    holder = subprocess.Popen(
        [sys.executable, "-c", _HOLDER, with_name(dsn, "bench-fleet-holder"), schema, str(SESSIONS)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None
        line = await trio.to_thread.run_sync(holder.stdout.readline)
        if not line.startswith(f"held {SESSIONS} "):
            raise RuntimeError(f"the holder process did not take the sessions: {line!r}")
        key = int(line.split()[2])
        used = await taker._run(
            "count connections",
            lambda conn: conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'bench-fleet-holder'"
            ).fetchone(),
        )
        sessions = SessionRegistry(taker)
        taken: list[float] = []
        entries = []
        dropped: list[float] = []
        armed = threading.Event()
        stopped = 0.0

        async def take(n: int) -> None:
            entries.append(sessions.enter(await sessions.prepare_resume(f"s{n}")))
            taken.append(time.perf_counter() - stopped)

        async def watch() -> None:
            dropped.append(await trio.to_thread.run_sync(lock_drop, dsn, key, armed) - stopped)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch)
            if not await trio.to_thread.run_sync(armed.wait, 30.0):
                raise RuntimeError("the watch of the holder's liveness lock did not start")
            holder.send_signal(sig)
            stopped = time.perf_counter()
            await take(0)  # one waiting resume: how soon a session is free
            await each(SESSIONS - 1, lambda n: take(n + 1))
        for entry in entries:
            await sessions.detach(entry)
        assert used is not None
        return {"connections": float(used[0]), "drop": dropped[0], "first": min(taken), "all": max(taken)}
    finally:
        holder.kill()
        holder.wait()


async def figures(dsn: str) -> dict[str, float]:
    schema = "bench_" + uuid.uuid4().hex[:12]
    await PostgresStore(dsn, schema=schema).check()
    async with PooledPostgresStore(dsn, schema=schema, pool_size=POOL_SIZE) as store:
        sessions = SessionRegistry(store)

        async def create(n: int) -> None:
            session = await sessions.prepare_new(f"s{n}", cwd="/w")
            entry = sessions.enter(session)
            one_turn(session)
            await sessions.detach(entry)

        await each(SESSIONS, create)
    taker = PooledPostgresStore(
        dsn, schema=schema, pool_size=POOL_SIZE, lock_timeout=30.0, idle_session_timeout=IDLE_SESSION_TIMEOUT
    )
    async with taker:
        killed = await takeover(dsn, schema, taker, signal.SIGKILL)
        frozen = await takeover(dsn, schema, taker, signal.SIGSTOP)
    return {
        "connections": killed["connections"],
        "kill drop": killed["drop"],
        "kill first": killed["first"],
        "stop drop": frozen["drop"],
        "kill all": killed["all"],
        "stop first": frozen["first"],
        "stop all": frozen["all"],
    }


async def bench() -> list[dict[str, Any]]:
    names = (
        f"PostgreSQL pooled mode: connections of one worker holding {SESSIONS:,} live sessions (pool_size {POOL_SIZE})",
        "  kill -9 of that worker: its liveness lock free after",
        "  ... another worker resumed its first session, after the lock was free",
        f"  ... and all {SESSIONS:,} of them (after the first, {CONCURRENCY} at a time), after the kill",
        f"  SIGSTOP of that worker (idle_session_timeout {IDLE_SESSION_TIMEOUT:g} s): its liveness lock free after",
        "  ... another worker resumed its first session, after the stop",
        f"  ... and all {SESSIONS:,} of them, after the stop",
    )
    try:
        import psycopg  # noqa: F401

        with postgres_server() as dsn:
            found = await figures(dsn)
    except (ImportError, NoServer) as exc:
        return [{"figure": name, "value": f"skipped: {exc}", "unit": "", "target": "report"} for name in names]
    connections = int(found["connections"])
    return [
        {"figure": names[0], "value": connections, "unit": "connections", "target": f"<= {POOL_SIZE + 2}"},
        {"figure": names[1], "value": round(found["kill drop"] * 1000, 1), "unit": "ms", "target": "report"},
        {
            "figure": names[2],
            "value": round((found["kill first"] - found["kill drop"]) * 1000, 1),
            "unit": "ms",
            "target": "< 100 ms",
        },
        {"figure": names[3], "value": round(found["kill all"], 2), "unit": "s", "target": "report"},
        {
            "figure": names[4],
            "value": round(found["stop drop"], 2),
            "unit": "s",
            "target": f"<= idle_session_timeout + heartbeat ({IDLE_SESSION_TIMEOUT + 0.4:g} s)",
        },
        {"figure": names[5], "value": round(found["stop first"], 2), "unit": "s", "target": "report"},
        {"figure": names[6], "value": round(found["stop all"], 2), "unit": "s", "target": "report"},
    ]


if __name__ == "__main__":
    for row in trio.run(bench):
        print(json.dumps(row))
