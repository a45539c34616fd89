"""The PostgreSQL store's pooled mode (PooledPostgresStore): liveness lock, leases, fencing, group commit.

The process tests of one live writer (a race, ``kill -9``, a frozen holder)
run in both modes; the rest is the pooled mode's own: a writer whose lease was
taken never commits again, a group commit stores the sessions whose lease held
and none of the fenced one, a worker's connections stay within
``pool_size + 2`` whatever the number of its sessions, a worker process frozen
in the middle of a group commit and taken over never appends again.  Real cluster
(tests/_postgres.py), real clock.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
from _pg_modes import MODES, make, options
from _postgres import Cluster, postgres_cluster, proxy_for, schema, store, superuser, worker_argv
from _util import WAIT
from test_postgres_store import Worker, one_turn, start_worker, stored_session

from trio_harness import SessionLockedError, SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session import _events as ev

__all__ = ["postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            await worker.kill()


# ------------------------------------------------------------------ one live writer, both modes


@pytest.mark.parametrize("mode", MODES)
async def test_two_workers_racing_for_one_session_exactly_one_wins(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    for round_number in range(2):
        session_id = f"contested-{round_number}"
        await stored_session(store, session_id)
        racers = [
            await start_worker(workers, postgres_cluster, schema, "race", session_id, *options(mode)) for _ in range(2)
        ]
        for racer in racers:
            await racer.send("go")
        results = [await racer.until("won") for racer in racers]
        assert sorted(result["won"] for result in results) == [False, True], results
        loser = next(result for result in results if not result["won"])
        assert loser["error"] == "SessionLockedError" and loser["locked"] is True
        for racer in racers:
            assert await racer.close() == 0
        workers.clear()


@pytest.mark.parametrize("mode", MODES)
async def test_kill_9_of_the_holder_frees_its_session_at_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    events = await stored_session(store, "s1")
    holder = await start_worker(workers, postgres_cluster, schema, "hold", "s1", *options(mode))
    await holder.until("held")
    taker = make(mode, postgres_cluster.dsn(), schema, lock_timeout=10.0)
    async with taker:
        async with make(mode, postgres_cluster.dsn(), schema) as other:
            with pytest.raises(SessionLockedError, match="live on another worker"):
                await SessionRegistry(other).prepare_resume("s1")
        holder.signal(signal.SIGKILL)
        killed = time.perf_counter()
        resumed = await SessionRegistry(taker).prepare_resume("s1")
        took = time.perf_counter() - killed
        await holder.kill()
        assert tuple(resumed.events) == events
        print(f"{mode}: takeover after kill -9: {took * 1000:.1f} ms")
        assert took < 1.0  # the goal is < 100 ms; 1 s bounds a loaded machine


@pytest.mark.parametrize("mode", MODES)
async def test_a_frozen_holder_loses_its_session_within_its_idle_timeout_and_never_appends_again(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    """Split brain after SIGSTOP: the thawed holder's turn reaches nothing of the stored log."""
    await stored_session(store, "s1")
    holder = await start_worker(
        workers, postgres_cluster, schema, "hold", "s1", "--heartbeat=0.2", "--idle-session-timeout=1.0", *options(mode)
    )
    held = await holder.until("held")
    taker = make(mode, postgres_cluster.dsn(), schema, lock_timeout=10.0)
    async with taker:
        sessions = SessionRegistry(taker)
        async with make(mode, postgres_cluster.dsn(), schema) as other:
            with pytest.raises(SessionLockedError):
                await other.resume("s1")
        holder.signal(signal.SIGSTOP)
        frozen = time.perf_counter()
        resumed = await sessions.prepare_resume("s1")
        evicted = time.perf_counter() - frozen
        print(f"{mode}: a frozen holder lost the session after {evicted:.2f} s (idle_session_timeout 1.0 s)")
        assert evicted < 1.0 + 1.0
        entry = sessions.enter(resumed)
        one_turn(resumed, 2, "taken over")
        await resumed.flush()
        holder.signal(signal.SIGCONT)
        await holder.send({"followup": "from the evicted worker"})
        failed = await holder.until("store_error")
        assert "s1" in failed["store_error"]
        await sessions.detach(entry)
        await holder.close()
    stored = (await store.load("s1")).events
    assert stored == tuple(resumed.events)
    assert [e.text for e in stored if isinstance(e, ev.UserMessage)] == ["do it", "taken over"]
    assert held["events"] <= len(stored)


# ------------------------------------------------------------------ pooled mode


async def test_an_idle_worker_keeps_its_sessions_past_the_idle_timeout_through_its_liveness_heartbeat(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    quick = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=0.1, idle_session_timeout=0.5)
    async with quick:
        sessions = SessionRegistry(quick)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        assert quick._live is not None
        pid = quick._live.info.backend_pid
        await trio.sleep(1.5)  # the server's timer is real time: three idle timeouts pass
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
            with pytest.raises(SessionLockedError):
                await other.resume("s1")
        one_turn(entry.session, 2)
        await entry.session.flush()
        assert quick._live.info.backend_pid == pid  # the liveness connection was never dropped
        await sessions.detach(entry)


def _terminate(conn: psycopg.Connection[Any], pid: int) -> None:
    conn.execute("SELECT pg_terminate_backend(%s)", (pid,))


async def test_a_writer_whose_lease_was_taken_is_fenced_and_the_rest_of_its_group_is_stored(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    """One group commit: the fenced session stores nothing, the others their whole batch."""
    for name in ("a", "b", "c"):
        await stored_session(store, name)
    first = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=10.0, idle_session_timeout=None)
    async with first:
        sessions = SessionRegistry(first)
        entries = {name: sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b", "c")}
        # The worker's liveness lock goes (its connection is killed): another worker takes "b".
        assert first._live is not None
        _terminate(superuser, first._live.info.backend_pid)
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=5.0) as second:
            taken = SessionRegistry(second)
            other = taken.enter(await taken.prepare_resume("b"))
            one_turn(other.session, 2, "second worker")
            await other.session.flush()
            first._group._groups.clear()
            for entry in entries.values():
                one_turn(entry.session, 2, "first worker")
            outcomes: dict[str, BaseException | None] = {}

            async def flush(name: str) -> None:
                try:
                    await entries[name].session.flush()
                    outcomes[name] = None
                except SessionStoreError as exc:
                    outcomes[name] = exc

            async with trio.open_nursery() as nursery:
                for name in entries:
                    nursery.start_soon(flush, name)
            assert first._group._groups[0] >= 2  # flushes ready together share a transaction
            assert outcomes["a"] is None and outcomes["c"] is None
            assert isinstance(outcomes["b"], SessionStoreError)
            assert "lease was taken" in str(outcomes["b"])
            await taken.detach(other)
        for name in ("a", "c"):
            assert (await store.load(name)).events == tuple(entries[name].session.events)
        texts = [e.text for e in (await store.load("b")).events if isinstance(e, ev.UserMessage)]
        assert texts == ["do it", "second worker"]
        for name, entry in entries.items():
            if name != "b":
                await sessions.detach(entry)


async def test_many_sessions_flushing_at_once_share_few_transactions_and_few_connections(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    count, pool_size = 200, 3
    dsn = postgres_cluster.dsn() + "&application_name=pooled-count"
    pooled = PooledPostgresStore(dsn, schema=schema, pool_size=pool_size)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = []
        for number in range(count):
            session = await sessions.prepare_new(f"s{number}", cwd="/w")
            entries.append(sessions.enter(session))
            one_turn(session, 1)
            await session.flush()
        pooled._group._groups.clear()
        for entry in entries:
            one_turn(entry.session, 2)
        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(entry.session.flush)
        groups = list(pooled._group._groups)
        assert sum(groups) == count
        assert len(groups) <= 3, groups  # one group, or two when the first left before the others queued
        used = superuser.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'pooled-count'"
        ).fetchone()
        assert used is not None and used[0] <= pool_size + 2, used
        print(f"{count} live sessions: {used[0]} connections (pool_size {pool_size}); group sizes {groups}")
        for entry in entries:
            await sessions.detach(entry)
    for number in (0, count - 1):
        assert len((await store.load(f"s{number}")).events) == 16


async def test_a_group_commit_whose_answer_is_lost_counts_as_stored_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """The connection dies once the group's statement is sent: each batch is read back, none stored twice."""
    names = ("a", "b", "c")
    for name in names:
        await stored_session(store, name)
    with proxy_for(postgres_cluster) as proxy:
        proxied = PooledPostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions = SessionRegistry(proxied)
            entries = [sessions.enter(await sessions.prepare_resume(name)) for name in names]
            for entry in entries:
                one_turn(entry.session, 2)
            # The group commit is one statement (its own transaction): the connection closes once it is sent.
            dropped = proxy.drop_after(b"FOR SHARE OF le")
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                async with trio.open_nursery() as nursery:
                    for entry in entries:
                        nursery.start_soon(entry.session.flush)
            assert dropped.is_set()
            assert "group commit: the connection was lost" in caplog.text
            for entry in entries:
                assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
                one_turn(entry.session, 3)
                await entry.session.flush()
                await sessions.detach(entry)
    for entry in entries:
        assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)


async def test_a_worker_process_frozen_mid_group_commit_and_taken_over_never_appends_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    """Split brain after SIGSTOP inside a group commit: the worker's group statement has committed, its answer
    not read yet, when the worker is frozen; it loses its liveness lock, another worker takes the session and
    appends; thawed, the worker reads its answer and goes on: none of what it writes after reaches the log."""
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        argv = worker_argv(
            "hold", proxy.dsn(), schema, "s1", "--heartbeat=0.2", "--idle-session-timeout=1.0", "--pooled"
        )
        holder = await Worker.start(argv)
        workers.append(holder)
        await holder.until("ready")
        await holder.until("held")
        fired, release = proxy.hold_replies_after(b"FOR SHARE OF le")
        await holder.send({"followup": "from the worker about to freeze"})
        with trio.fail_after(WAIT):
            while not fired.is_set():
                await trio.sleep(0.005)
        holder.signal(signal.SIGSTOP)  # mid-group-commit: its statement sent (and committed), its answer held
        release.set()
        taker = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0)
        async with taker:
            sessions = SessionRegistry(taker)
            frozen = time.perf_counter()
            resumed = await sessions.prepare_resume("s1")
            print(f"a worker frozen mid-group-commit lost its session after {time.perf_counter() - frozen:.2f} s")
            entry = sessions.enter(resumed)
            one_turn(resumed, 9, "taken over")
            await resumed.flush()
            holder.signal(signal.SIGCONT)
            failed = await holder.until("store_error")
            assert "s1" in failed["store_error"]
            await holder.send({"followup": "again from the evicted worker"})
            failed = await holder.until("store_error")
            stored = (await store.load("s1")).events
            assert stored == tuple(resumed.events)
            await sessions.detach(entry)
        await holder.close()
    stored = (await store.load("s1")).events
    assert stored == tuple(resumed.events)
    texts = [e.text for e in stored if isinstance(e, ev.UserMessage)]
    assert "again from the evicted worker" not in texts and texts[-1] == "taken over"
