"""The pooled PostgreSQL store (PooledPostgresStore) under the faults its design adds.

A pooled worker has no connection per session: its sessions hang on one
liveness lock, its leases' epochs and the group commit.  So the faults are:
the worker frozen in the middle of a group commit while another worker takes
its session (it must never commit again); its liveness connection, a pool
connection running a group commit, or its listener terminated by
``pg_terminate_backend``; a resume cancelled while its lease statement's
answer is held back; a pool backend frozen (``SIGSTOP``) under a group
commit.  Real cluster (tests/_postgres.py), real clock, the TCP proxy of
tests/_postgres.py for held answers.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import psycopg
import pytest
import trio
from _pg_modes import leases_of
from _postgres import (
    Cluster,
    admin,
    events_stored,
    flush_noting,
    postgres_cluster,
    proxy_for,
    schema,
    store,
    superuser,
    until,
)
from _util import WAIT
from test_postgres_store import one_turn, stored_session

from trio_harness import SessionLockedError, SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_group
from trio_harness.session import _events as ev

__all__ = ["postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest


def live_pid(pooled: PooledPostgresStore) -> int:
    assert pooled._live is not None
    pid: int = pooled._live.info.backend_pid
    return pid


def terminate(superuser: psycopg.Connection[Any], pid: int) -> None:
    """End a server process and wait (bounded) until it is gone."""
    superuser.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))


def texts(events: tuple[ev.Event, ...]) -> list[str]:
    return [e.text for e in events if isinstance(e, ev.UserMessage)]


# ------------------------------------------------------------------ split brain mid-group-commit


@pytest.mark.parametrize("frozen", ["before its statement is sent", "after its statement committed"])
async def test_a_worker_frozen_mid_group_commit_and_taken_over_never_commits_again(
    frozen: str,
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The worker stops inside a group commit; its liveness lock goes (as a frozen worker's does after
    ``idle_session_timeout``); another worker takes the session and appends; the first one thaws."""
    await stored_session(store, "s1")
    gate, reached = trio.Event(), trio.Event()
    real_run = _pg_group.GroupCommitter._run_group

    async def stopped_run(self: Any, *args: Any) -> Any:
        if not reached.is_set():  # the first group commit (the first worker's) stops here, unsent
            reached.set()
            await gate.wait()
        return await real_run(self, *args)

    with proxy_for(postgres_cluster) as proxy:
        first = PooledPostgresStore(proxy.dsn(), schema=schema, heartbeat=10.0, idle_session_timeout=None)
        async with first:
            sessions = SessionRegistry(first)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            one_turn(entry.session, 2, "the first worker's turn")
            outcome: list[BaseException | None] = []

            if frozen == "before its statement is sent":
                monkeypatch.setattr(_pg_group.GroupCommitter, "_run_group", stopped_run)
                held = None
            else:
                fired, held = proxy.hold_replies_after(b"FOR SHARE OF le")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush_noting, entry, outcome)
                if held is None:
                    with trio.fail_after(WAIT):
                        await reached.wait()
                else:
                    await until(fired.is_set, "the group commit was sent")
                    length = len(entry.session)
                    await until(lambda: stored_count(superuser, schema) == length, "the group commit committed")
                terminate(superuser, live_pid(first))  # its liveness lock is free: the worker looks dead
                async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0) as second:
                    taken = SessionRegistry(second)
                    other = taken.enter(await taken.prepare_resume("s1"))
                    one_turn(other.session, 3, "the second worker's turn")
                    await other.session.flush()
                    # The first worker thaws: its group commit goes on.
                    if held is None:
                        gate.set()
                    else:
                        held.set()
                    with trio.fail_after(WAIT):
                        while not outcome:
                            await trio.sleep(0.005)
                    if held is None:  # sent after the takeover: fenced, nothing stored
                        assert isinstance(outcome[0], SessionStoreError), outcome
                        assert "lease was taken" in str(outcome[0])
                    else:  # committed before the takeover, which read it: stored, once
                        assert outcome == [None]
                        assert texts(tuple(other.session.events))[:2] == ["do it", "the first worker's turn"]
                    # Its liveness lock back, the first worker still never commits again.
                    if first._live is not None:
                        first._live.close()
                    first._live = await first._lock_liveness()
                    one_turn(entry.session, 4, "the first worker again")
                    with pytest.raises(SessionStoreError, match="lease was taken"):
                        await entry.session.flush()
                    stored = (await store.load("s1")).events
                    assert stored == tuple(other.session.events)
                    await taken.detach(other)
            with pytest.raises(SessionStoreError):
                await sessions.detach(entry)
    stored = (await store.load("s1")).events
    expected = ["do it", "the second worker's turn"]
    if frozen == "after its statement committed":
        expected.insert(1, "the first worker's turn")
    assert texts(stored) == expected


def stored_count(superuser: psycopg.Connection[Any], schema: str) -> int:
    return events_stored(superuser, schema, "s1")


# ------------------------------------------------------------------ terminated backends


async def test_a_terminated_liveness_connection_is_taken_again_and_the_sessions_carry_on(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=0.1, idle_session_timeout=1.0)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        old = pooled._live
        terminate(superuser, live_pid(pooled))
        await until(lambda: pooled._live is not old and pooled._live is not None, "the liveness lock taken again")
        # Held again: another worker cannot take the session; this one appends.
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
            with pytest.raises(SessionLockedError):
                await other.resume("s1")
        one_turn(entry.session, 2)
        await entry.session.flush()
        assert (await store.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)
    assert leases_of(superuser, schema, pooled.worker_id) == []


async def test_a_pool_connection_terminated_under_a_group_commit_is_resolved_and_stored_once(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    caplog: pytest.LogCaptureFixture,
) -> None:
    for name in ("a", "b"):
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        for entry in entries:
            one_turn(entry.session, 2)
        last = len(entries[1].session) - 1
        with admin(postgres_cluster) as blocker:
            # An uncommitted row with session b's last seq: the group's INSERT waits for it.
            blocker.execute("BEGIN")
            blocker.execute(f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('b', %s, 'x')", (last,))
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                async with trio.open_nursery() as nursery:
                    for entry in entries:
                        nursery.start_soon(entry.session.flush)
                    waiting: list[int] = []

                    def group_waits() -> bool:
                        rows = superuser.execute(
                            "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                            "AND query LIKE '%%FOR SHARE OF le%%'"
                        ).fetchall()
                        waiting[:] = [row[0] for row in rows]
                        return bool(waiting)

                    await until(group_waits, "the group commit waits on the row")
                    terminate(superuser, waiting[0])  # rolled back on the server; the worker sees its connection lost
                    blocker.execute("ROLLBACK")
        assert "group commit: the connection was lost" in caplog.text
        for entry in entries:
            assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
            one_turn(entry.session, 3)
            await entry.session.flush()
            await sessions.detach(entry)
    for entry in entries:
        assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)


# ------------------------------------------------------------------ cancelled takes


async def test_a_resume_cancelled_while_its_lease_answer_is_held_leaves_the_session_free(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = PooledPostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            await proxied.load("s1")
            # The take is one transaction (the session's advisory lock, then the lease): its COMMIT
            # is the first one sent from here on, and its answer is held.
            fired, release = proxy.hold_replies_after(b"COMMIT")
            scope = trio.CancelScope()

            async def resume() -> None:
                with scope:
                    await SessionRegistry(proxied).prepare_resume("s1")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(resume)
                await until(fired.is_set, "the lease transaction's COMMIT was sent")
                await until(lambda: leases_of(superuser, schema, proxied.worker_id) == ["s1"], "the lease taken")
                scope.cancel()  # the lease is taken on the server, its answer still held
                await trio.sleep(0.1)
                release.set()
            assert scope.cancelled_caught
            assert leases_of(superuser, schema, proxied.worker_id) == []
            assert proxied._writers == {}
            async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as taker:  # free at once
                sessions = SessionRegistry(taker)
                await sessions.detach(sessions.enter(await sessions.prepare_resume("s1")))


# ------------------------------------------------------------------ a frozen pool backend


FROZEN = ["idle", "holding its locks"]


@asynccontextmanager
async def frozen_group_commit(
    postgres_cluster: Cluster, schema: str, superuser: psycopg.Connection[Any], frozen: str
) -> AsyncIterator[tuple[PooledPostgresStore, SessionRegistry, Any]]:
    """A live session whose flush met a frozen pool backend, settled within its bounds; the backend thawed, gone.

    ``idle``: frozen before it read the group statement (it holds no lock): the read-back finds nothing
    stored and nothing to wait for, the batch is sent again on a new connection and stored (the flush
    succeeds); the thawed backend's copy meets it at the primary key.  ``holding its locks``: frozen inside
    the statement, the lease row held ``FOR SHARE`` (waiting on an uncommitted row at the session's next
    seq, rolled back once it is frozen): the read-back waits for the lock at most ``write_timeout``, the
    outcome is unknown, the flush fails saying so; thawed, the backend ends its transaction (whole).
    Yields the open store, its registry and the entry.
    """
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=1, write_timeout=0.5)
    async with pooled:
        with admin(postgres_cluster) as blocker:
            yield await _freeze_a_group_commit(pooled, superuser, blocker, schema, frozen)


async def _freeze_a_group_commit(
    pooled: PooledPostgresStore,
    superuser: psycopg.Connection[Any],
    blocker: psycopg.Connection[Any],
    schema: str,
    frozen: str,
) -> tuple[PooledPostgresStore, SessionRegistry, Any]:
    sessions = SessionRegistry(pooled)
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    (pid,) = [conn.info.backend_pid for conn, _ in pooled._require_pool()._idle]
    thawed = threading.Event()

    def thaw() -> None:  # bounds the test when the flush never returns
        if not thawed.wait(20):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)

    def holding() -> bool:
        row = superuser.execute(
            "SELECT 1 FROM pg_stat_activity WHERE pid = %s AND wait_event_type = 'Lock' AND query LIKE %s",
            (pid, "%FOR SHARE OF le%"),
        ).fetchone()
        return row is not None

    outcome: list[BaseException | None] = []

    watchdog = threading.Thread(target=thaw, daemon=True)
    watchdog.start()
    try:
        one_turn(entry.session, 2)
        started = trio.current_time()
        async with trio.open_nursery() as nursery:
            if frozen == "idle":
                os.kill(pid, signal.SIGSTOP)
                nursery.start_soon(flush_noting, entry, outcome)
            else:
                blocker.execute("BEGIN")
                last = len(entry.session.events) - 1  # the key of the batch's row (session/_pg_rows.py)
                blocker.execute(f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('s1', %s, 'x')", (last,))
                nursery.start_soon(flush_noting, entry, outcome)
                await until(holding, "the group statement waits, holding the lease row")
                os.kill(pid, signal.SIGSTOP)
                blocker.execute("ROLLBACK")
        took = trio.current_time() - started
        print(f"a group commit to a frozen ({frozen}) backend settled after {took:.2f} s (write_timeout 0.5 s)")
        assert took < 8.0
        if frozen == "idle":
            assert outcome == [None]  # sent again: the lost statement had taken no lock
        else:
            (error,) = outcome
            assert error is not None and "whether it committed is unknown" in str(error), outcome
    finally:
        thawed.set()
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
        watchdog.join()
    await until(
        lambda: superuser.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is None,
        "the thawed backend is gone",
    )
    return pooled, sessions, entry


@pytest.mark.parametrize("frozen", FROZEN)
async def test_a_group_commit_to_a_frozen_backend_settles_within_its_bounds_and_stores_whole_batches(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any], frozen: str
) -> None:
    await stored_session(store, "s1")
    async with frozen_group_commit(postgres_cluster, schema, superuser, frozen) as (pooled, _, entry):
        # Thawed, the backend may have run the statement it had received: the batch is stored whole or not at all.
        stored = (await store.load("s1")).events
        assert stored in (tuple(entry.session.events), tuple(entry.session.events)[: len(stored)])
        assert len(stored) in (len(entry.session.events), len(entry.session.events) - 8)
        if frozen == "idle":
            assert stored == tuple(entry.session.events)  # by the statement sent again, once
        assert leases_of(superuser, schema, pooled.worker_id) == ["s1"]  # still its session


@pytest.mark.parametrize("frozen", FROZEN)
async def test_after_a_group_commit_to_a_frozen_backend_the_next_flush_stores_the_batch_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any], frozen: str
) -> None:
    await stored_session(store, "s1")
    async with frozen_group_commit(postgres_cluster, schema, superuser, frozen) as (_, sessions, entry):
        await entry.session.flush()
        assert (await store.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


async def test_a_resume_whose_lease_answer_is_lost_leaves_the_session_free_or_held_by_its_writer(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    """The lease statement commits, its answer is lost with the connection: no stray lease is left behind."""
    events = await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = PooledPostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            await proxied.load("s1")
            dropped = proxy.drop_after(b"leases AS leases")
            try:
                loaded, writer = await proxied.resume("s1")
            except SessionStoreError:
                assert dropped.is_set()
                assert leases_of(superuser, schema, proxied.worker_id) == []  # free
            else:
                assert dropped.is_set() and loaded.events == events
                assert leases_of(superuser, schema, proxied.worker_id) == ["s1"]  # held by its writer
                await writer.aclose()
            # Either way this worker can take it again, and so can another once it is let go.
            loaded, writer = await proxied.resume("s1")
            await writer.aclose()
            async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
                loaded, writer = await other.resume("s1")
                await writer.aclose()
