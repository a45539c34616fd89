"""A fleet of pooled workers on one small server: 4 processes, 10,000 live sessions, ``max_connections = 40``.

Each worker process (this file run as a program, :func:`_worker`) holds
2,500 live sessions of a :class:`~trio_harness.session.PooledPostgresStore`,
each with at least one stored turn (session writers appending a real turn's
events, not harness agents: see :func:`_create`), and keeps turning them over
(a turn each, round after round, group-committed) while the test counts its
connections in ``pg_stat_activity`` (its own ``application_name``), has a
fifth worker try sampled sessions (refused), then kills one worker with
``SIGKILL`` mid-round.  The other three take its 2,500 sessions over: the
test measures the time from the moment its liveness lock is gone from
``pg_locks`` to the first successful take and to the last, and checks that
none is lost (every acknowledged turn stored, every batch whole) and none
doubly held (the leases table, the takers' reports, a fifth worker refused).
Real cluster, real processes, real clock.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import attrs
import psycopg
import pytest
import trio
from _postgres import Cluster, fresh_schema, running_cluster
from test_postgres_store import Worker, one_turn

from trio_harness.session import PooledPostgresStore, SessionEntry, SessionRegistry

WORKERS = 4
SESSIONS = 2500  # per worker
POOL_SIZE = 4
MAX_CONNECTIONS = 40
EVENTS_PER_TURN = 8  # one_turn's events
TAKE_BOUND = 0.1  # seconds from the lock's drop to the first take (issue 28)
SAMPLE = 50  # sessions the fifth worker tries
# A worker that cannot run its heartbeat for this long loses its sessions.  On this 2-core machine
# shared with other jobs, 4 workers turning 2,500 sessions each starve for seconds at a time: the
# default 2 s evicted every one of them while the test ran (the store did its job: fenced, retaken).
HEARTBEAT = 0.5
IDLE_SESSION_TIMEOUT = 6.0


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def worker_argv(dsn: str, schema: str, name: str, lock_timeout: float) -> list[str]:
    return [sys.executable, os.path.abspath(__file__), dsn, schema, name, str(lock_timeout)]


async def _create(registry: SessionRegistry, ids: list[str], limit: trio.CapacityLimiter) -> list[SessionEntry]:
    """Create the sessions, each with one turn stored (its first flush), a few at a time; their entries.

    Session writers with the events of a real turn (``one_turn``), not
    harness agents: 2,500 agents per process would cost the loaded machine
    minutes and the store sees the same appends either way.
    """
    entries: list[SessionEntry] = []

    async def one(session_id: str) -> None:
        async with limit:
            session = await registry.prepare_new(session_id, cwd="/fleet")
            entries.append(registry.enter(session))
            one_turn(session, 1)
            await session.flush()

    async with trio.open_nursery() as nursery:
        for session_id in ids:
            nursery.start_soon(one, session_id)
    return entries


@attrs.define(eq=False)
class _Fleet:
    """One fleet worker's sessions and the commands of :func:`_worker`."""

    registry: SessionRegistry
    entries: list[SessionEntry] = attrs.field(factory=list)  # the sessions it created (churned)
    taken_over: list[SessionEntry] = attrs.field(factory=list)  # the sessions it took (left as found)
    resting: trio.Event | None = None  # set: the churn stops after its round

    async def create(self, name: str, count: int) -> None:
        ids = [f"{name}-{n}" for n in range(count)]
        limit = trio.CapacityLimiter(2 * POOL_SIZE)
        for start in range(0, len(ids), 500):
            self.entries += await _create(self.registry, ids[start : start + 500], limit)
            _emit(progress=len(self.entries))
        _emit(created=len(self.entries))

    async def churn(self, store: PooledPostgresStore) -> None:
        turn = 1
        while self.resting is None:
            turn += 1
            began = time.perf_counter()
            async with trio.open_nursery() as flushes:
                for entry in self.entries:
                    one_turn(entry.session, turn, "churn")
                    flushes.start_soon(entry.session.flush)
                    await trio.lowlevel.checkpoint()  # a turn's work yields, as an agent's does
            _emit(acked=turn, seconds=round(time.perf_counter() - began, 3), live_pid=store._live_pid)
        _emit(rested=turn, live_pid=store._live_pid)

    async def take(self, ids: list[str]) -> None:
        taken: list[str] = []
        counts: list[int] = []
        failed: list[str] = []
        limit = trio.CapacityLimiter(2 * POOL_SIZE)

        async def one(session_id: str) -> None:
            async with limit:
                try:
                    session = await self.registry.prepare_resume(session_id)
                except Exception as exc:
                    failed.append(f"{session_id}: {type(exc).__name__}: {exc}")
                    return
                self.taken_over.append(self.registry.enter(session))
                taken.append(session_id)
                counts.append(len(session.events))

        _emit(waiting=ids[0])
        await one(ids[0])
        first = time.monotonic()
        async with trio.open_nursery() as takes:
            for session_id in ids[1:]:
                takes.start_soon(one, session_id)
        _emit(taken=taken, events=counts, first=first, last=time.monotonic(), failed=failed)

    async def attempt(self, ids: list[str]) -> None:
        from trio_harness import SessionLockedError

        refused, won, errors = 0, [], []
        for session_id in ids:
            try:
                session = await self.registry.prepare_resume(session_id)
            except SessionLockedError:
                refused += 1
                continue
            except Exception as exc:
                errors.append(f"{session_id}: {type(exc).__name__}: {exc}")
                continue
            won.append(session_id)
            await self.registry.detach(self.registry.enter(session))
        _emit(refused=refused, taken=won, errors=errors)


async def _worker(dsn: str, schema: str, name: str, lock_timeout: float) -> None:
    """A fleet worker driven over stdin / stdout, one JSON object a line.

    Prints ``{"ready": pid, "worker_id": ..., "worker_key": ...}`` once its
    store is open (its liveness lock held).  Commands:

    * ``{"create": COUNT}``: create ``NAME-0`` .. ``NAME-(COUNT-1)`` (one
      stored turn each, all kept live); prints ``{"created": COUNT}``.
    * ``{"churn": true}``: forever, a round of one more turn in every session
      it created, flushed at once; prints ``{"acked": ROUND}`` after each round
      whose every flush returned (those turns are stored).
    * ``{"status": true}``: prints ``{"status": LIVE_SESSIONS, "live_pid": PID}``
      (the server process holding its liveness lock).
    * ``{"rest": true}``: stop churning after the round in progress; prints
      ``{"rested": ROUND}``.
    * ``{"take": [IDS]}``: resume (and keep live, not churned) the first,
      waiting up to the store's ``lock_timeout`` for it, then the others at
      once; prints ``{"taken": [...], "events": [...], "first": T, "last": T,
      "failed": [...]}`` with ``time.monotonic()`` instants (the machine's
      clock, the same in every process).
    * ``{"try": [IDS]}``: resume each without waiting (and let it go);
      prints ``{"refused": N, "taken": [...], "errors": [...]}``.
    """
    url = f"{dsn}&application_name=fleet-{name}"
    store = PooledPostgresStore(
        url,
        direct_dsn=url,
        schema=schema,
        pool_size=POOL_SIZE,
        lock_timeout=lock_timeout,
        write_timeout=30.0,
        heartbeat=HEARTBEAT,
        idle_session_timeout=IDLE_SESSION_TIMEOUT,
    )
    stdin = trio.lowlevel.FdStream(os.dup(0))
    pending = bytearray()

    async def read_line() -> dict[str, Any] | None:
        while b"\n" not in pending:
            chunk = await stdin.receive_some()
            if not chunk:
                return None
            pending.extend(chunk)
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        value: dict[str, Any] = json.loads(line)
        return value

    async with store:
        worker = _Fleet(SessionRegistry(store))
        _emit(ready=os.getpid(), worker_id=store.worker_id, worker_key=store.worker_key)
        async with trio.open_nursery() as nursery:
            while (command := await read_line()) is not None:
                if "create" in command:
                    await worker.create(name, command["create"])
                elif "churn" in command:
                    nursery.start_soon(worker.churn, store)
                    _emit(churning=True)
                elif "status" in command:
                    _emit(status=len(worker.entries) + len(worker.taken_over), live_pid=store._live_pid)
                elif "rest" in command:
                    worker.resting = trio.Event()
                elif "take" in command:
                    await worker.take(command["take"])
                elif "try" in command:
                    await worker.attempt(command["try"])
            nursery.cancel_scope.cancel()


# ------------------------------------------------------------------ the test


@pytest.fixture
async def fleet() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            await worker.kill()


async def start(started: list[Worker], cluster: Cluster, schema: str, name: str, lock_timeout: float) -> Worker:
    worker = await Worker.start(worker_argv(cluster.dsn(), schema, name, lock_timeout))
    started.append(worker)
    return worker


async def drain(worker: Worker) -> list[dict[str, Any]]:
    """The lines an exited worker printed and nobody read."""
    assert worker.process.stdout is not None
    rest = bytearray(worker._pending)
    with trio.fail_after(30):
        while chunk := await worker.process.stdout.receive_some():
            rest.extend(chunk)
    return [json.loads(line) for line in bytes(rest).splitlines() if line.strip()]


def connections(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE application_name LIKE 'fleet-%' "
        "GROUP BY application_name"
    ).fetchall()
    return {str(name): int(count) for name, count in rows}


def wait_for_lock_drop(dsn: str, key: int, armed: threading.Event, stop: threading.Event) -> float:
    """(thread) Poll ``pg_locks`` until the advisory lock ``key`` is held by nobody; that instant.

    ``armed`` is set once a poll saw it held.
    """
    query = (
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s"
    )
    params = ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF)
    with psycopg.connect(dsn, autocommit=True) as conn:
        while not stop.is_set():
            row = conn.execute(query, params).fetchone()
            assert row is not None
            if row[0] == 0:
                assert armed.is_set(), "the lock was not held when the watch began"
                return time.monotonic()
            armed.set()
    raise AssertionError("the killed worker's liveness lock was never released")


@pytest.mark.slow
async def test_four_workers_hold_10000_sessions_on_40_connections_and_take_over_a_killed_one(
    fleet: list[Worker],
) -> None:
    from trio_harness.session import PostgresStore

    began = time.perf_counter()
    schema = fresh_schema()
    with running_cluster(max_connections=MAX_CONNECTIONS) as cluster:
        await PostgresStore(cluster.dsn(), schema=schema).check()
        async with PooledPostgresStore(cluster.dsn(), schema=schema, pool_size=1):
            pass  # creates the leases table once, before the workers start
        admin = psycopg.connect(cluster.dsn(), autocommit=True)
        try:
            names = [f"w{n}" for n in range(WORKERS)]
            workers = [await start(fleet, cluster, schema, name, 30.0) for name in names]
            ready = [await worker.until("ready") for worker in workers]
            for worker in workers:
                await worker.send({"create": SESSIONS})
            for worker in workers:
                assert (await worker.until("created"))["created"] == SESSIONS
            created = time.perf_counter()
            stored = admin.execute(
                f"SELECT count(DISTINCT session_id), min(n), count(*) FROM (SELECT session_id, count(*) AS n "
                f"FROM {schema}.events GROUP BY session_id) AS per"
            ).fetchone()
            assert stored is not None and stored[0] == WORKERS * SESSIONS and stored[1] >= EVENTS_PER_TURN
            for worker in workers:
                await worker.send({"churn": True})
                await worker.until("churning")
            rounds = [await worker.until("acked") for worker in workers]  # each went through a round of turns
            seconds = [r["seconds"] for r in rounds]
            print(f"a round of {SESSIONS} turns (a group-committed flush each) took {seconds} s per worker")
            used = connections(admin)
            print(f"connections per worker while churning: {used} (pool_size {POOL_SIZE})")
            assert set(used) == {f"fleet-{name}" for name in names}
            assert all(count <= POOL_SIZE + 2 for count in used.values()), used

            fifth = await start(fleet, cluster, schema, "w5", 0.0)
            await fifth.until("ready")
            sample = [f"{name}-{n}" for name in names for n in range(0, SESSIONS, SESSIONS * WORKERS // SAMPLE)]
            await fifth.send({"try": sample})
            tried = await fifth.until("refused")
            assert tried == {"refused": len(sample), "taken": [], "errors": []}, tried

            # Kill w0 mid-round; the other three (their own sessions live, no longer turning: this machine's
            # two cores are shared with other jobs) are waiting for one of its sessions each.
            victim, takers = workers[0], workers[1:]
            for taker in takers:
                await taker.send({"rest": True})
            rested = [await taker.until("rested") for taker in takers]
            victim_ids = [f"w0-{n}" for n in range(SESSIONS)]
            shares = [victim_ids[n :: len(takers)] for n in range(len(takers))]
            for taker, share in zip(takers, shares, strict=True):
                await taker.send({"take": share})
                await taker.until("waiting")
            await victim.until("acked")  # a round in progress after this one
            armed, stop = threading.Event(), threading.Event()
            async with trio.open_nursery() as nursery:
                dropped: list[float] = []

                async def watch() -> None:
                    dropped.append(
                        await trio.to_thread.run_sync(
                            wait_for_lock_drop,
                            cluster.dsn(),
                            ready[0]["worker_key"],
                            armed,
                            stop,
                            abandon_on_cancel=True,
                        )
                    )

                nursery.start_soon(watch)
                assert await trio.to_thread.run_sync(armed.wait, 30.0)
                victim.signal(signal.SIGKILL)
                killed = time.monotonic()
                results = [await taker.until("taken") for taker in takers]
                stop.set()
            await victim.kill()
            rest = [line for line in await drain(victim) if "acked" in line]
            acked = max([line["acked"] for line in rest], default=1)
            assert {line["live_pid"] for line in rest} <= {rounds[0]["live_pid"]}, "w0 lost its liveness lock"
            drop = dropped[0]
            first = min(result["first"] for result in results) - drop
            last = max(result["last"] for result in results) - drop
            print(
                f"kill -9 of w0 (acked round {acked}): lock gone {1000 * (drop - killed):.1f} ms after the kill; "
                f"first take {1000 * first:.1f} ms after that, all {SESSIONS} taken {last:.2f} s after it"
            )
            for result in results:
                assert result["failed"] == [], result["failed"][:5]
            taken = [set(result["taken"]) for result in results]
            assert sorted(sid for part in taken for sid in part) == sorted(victim_ids)  # none lost, none twice
            assert sum(len(part) for part in taken) == SESSIONS

            # None lost: each acknowledged round stored (the round in flight whole or not at all).
            counts: dict[str, int] = dict(
                admin.execute(
                    f"SELECT session_id, count(*) FROM {schema}.events WHERE session_id LIKE %s GROUP BY session_id",
                    ("w0-%",),
                ).fetchall()
            )
            for result in results:
                for sid, loaded in zip(result["taken"], result["events"], strict=True):
                    assert loaded == counts[sid], (sid, loaded, counts[sid])
                    assert loaded % EVENTS_PER_TURN == 0 and loaded >= acked * EVENTS_PER_TURN, (sid, loaded, acked)

            # None doubly held: each lease names the taker that reported it, at a new epoch.
            leases = {
                sid: (worker_id, epoch)
                for sid, worker_id, epoch in admin.execute(
                    f"SELECT session_id, worker_id, epoch FROM {schema}.leases WHERE session_id LIKE %s", ("w0-%",)
                ).fetchall()
            }
            for result, info in zip(results, ready[1:], strict=True):
                for sid in result["taken"]:
                    assert leases[sid] == (info["worker_id"], 2), (sid, leases[sid])
            await fifth.send({"try": victim_ids[:: SESSIONS // SAMPLE]})
            tried = await fifth.until("refused")
            assert tried == {"refused": SAMPLE, "taken": [], "errors": []}, tried
            used = connections(admin)
            print(f"connections per worker after the takeover: {used}")
            assert "fleet-w0" not in used
            assert all(count <= POOL_SIZE + 2 for count in used.values()), used

            for taker, before, resting, share in zip(takers, rounds[1:], rested, shares, strict=True):
                await taker.send({"status": True})
                after = await taker.until("status")
                assert after["status"] == SESSIONS + len(share)
                assert after["live_pid"] == resting["live_pid"] == before["live_pid"], "a worker lost its liveness lock"
            assert first < TAKE_BOUND, f"first take {1000 * first:.1f} ms after the lock's drop (bound 100 ms)"
            print(
                f"fleet: {WORKERS * SESSIONS} sessions created in {created - began:.1f} s, "
                f"test {time.perf_counter() - began:.1f} s"
            )
            for worker in [*takers, fifth]:
                assert await worker.close() == 0
        finally:
            admin.close()


if __name__ == "__main__":
    trio.run(_worker, sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4]))
