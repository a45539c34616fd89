"""A live session's appends on PostgreSQL (its checkpoints): one prepared statement each, sent from the Trio thread.

``session/_pg_wire.py`` sends an append through libpq's non-blocking API
and waits on the socket from the Trio thread; the statement is its own
transaction (``synchronous_commit`` off for it alone without sync).  These
tests hold it to the writer's contract: no worker thread, one commit per
flush, a synced flush survives a crash, a lost or held answer (the TCP proxy
of ``tests/_postgres.py``) and a cancellation leave the writer knowing what is
stored, and a statement deallocated behind its back is prepared again.

The pooled mode (:class:`~trio_harness.session.PooledPostgresStore`) appends
by group commit on shared connections: its tests here hold it to the same
contract where it applies (a synced flush survives a crash; a flush whose
answer is held knows it committed) and to its own (no prepared statement is
left on a shared connection).
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import pytest
import trio
from _pg_modes import MODES, make
from _postgres import (
    Cluster,
    admin,
    events_stored,
    fresh_schema,
    postgres_cluster,
    proxy_for,
    running_cluster,
    schema,
    store,
)
from _util import WAIT

from trio_harness.session import PooledPostgresStore, PostgresStore, Session, SessionEntry, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.session._pg_threads import _call

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest


@pytest.fixture(scope="module")
def crashing_cluster() -> Iterator[Cluster]:
    """A cluster of this module's own, crashed by a test; its WAL writer sleeps (unsynced commits stay in memory)."""
    with running_cluster(settings=["wal_writer_delay=10000ms", "autovacuum=off"]) as cluster:
        yield cluster


def some_events(session: Session, text: str, count: int = 3) -> None:
    for _ in range(count):
        session.append(ev.AssistantMessage, turn=1, step=1, text=text)


async def live(persistence: PostgresStore, session_id: str = "s1") -> tuple[SessionRegistry, SessionEntry]:
    sessions = SessionRegistry(persistence)
    entry = sessions.enter(await sessions.prepare_new(session_id))
    some_events(entry.session, "first")
    await entry.session.flush()  # the first flush stores the session (on a worker thread)
    return sessions, entry


def writer_conn(entry: SessionEntry) -> Any:
    conn = entry.writer._conn  # type: ignore[attr-defined]
    assert conn is not None
    return conn


def next_xid(conn: Any) -> int:
    row = conn.execute("SELECT pg_snapshot_xmax(pg_current_snapshot())::text::bigint").fetchone()
    return int(row[0])


async def test_each_flush_is_one_commit_of_one_prepared_statement_sent_without_a_worker_thread(
    postgres_cluster: Cluster, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions, entry = await live(store)
    threads: list[object] = []
    run_sync = trio.to_thread.run_sync

    async def counted(fn: Any, *args: Any, **kwargs: Any) -> Any:
        threads.append(fn)
        return await run_sync(fn, *args, **kwargs)

    with admin(postgres_cluster) as watcher:
        before = next_xid(watcher)
        monkeypatch.setattr(trio.to_thread, "run_sync", counted)
        for number in range(5):
            some_events(entry.session, f"step {number}")
            await entry.session.flush(sync=number % 2 == 0)
        monkeypatch.undo()
        assert threads == []
        assert next_xid(watcher) - before == 5  # one write transaction per flush, nothing else
    conn = writer_conn(entry)
    names = await _call(
        conn, lambda: conn.execute("SELECT name FROM pg_prepared_statements WHERE name LIKE 'th_%'").fetchall()
    )
    assert len(names) == 2  # the synced append and the unsynced one, each prepared once
    assert (await store.load("s1")).events == tuple(entry.session.events)
    await sessions.detach(entry)


@pytest.mark.parametrize("mode", MODES)
async def test_a_synced_flush_survives_a_crash_and_makes_the_unsynced_one_before_it_durable(
    mode: str, crashing_cluster: Cluster
) -> None:
    persistence = make(mode, crashing_cluster.dsn(), fresh_schema())
    await persistence.check()
    async with persistence:
        sessions, entry = await live(persistence)
        some_events(entry.session, "unsynced")
        await entry.session.flush(sync=False)
        some_events(entry.session, "synced")
        await entry.session.flush()
        await trio.to_thread.run_sync(crashing_cluster.restart, "immediate")
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        some_events(entry.session, "after the crash")
        await entry.session.flush()  # the writer takes its session again on a new connection
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


async def test_a_flush_whose_answer_is_lost_finds_its_batch_stored_and_stores_it_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    with proxy_for(postgres_cluster) as proxy:
        proxied = PostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions, entry = await live(proxied)
            some_events(entry.session, "prepares the statement")
            await entry.session.flush()
            dropped = proxy.drop_after(b"th_")  # the next append's Bind names its prepared statement
            some_events(entry.session, "its answer is lost")
            await entry.session.flush()
            assert dropped.is_set()
            assert (await store.load("s1")).events == tuple(entry.session.events)
            some_events(entry.session, "after")
            await entry.session.flush()
            await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


@pytest.mark.parametrize("released", ["before the writer sees the cancel", "after the server-side cancel"])
async def test_a_flush_cancelled_after_its_commit_knows_it_committed(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, released: str
) -> None:
    with proxy_for(postgres_cluster) as proxy, admin(postgres_cluster) as watcher:
        proxied = PostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions, entry = await live(proxied)
            some_events(entry.session, "prepares the statement")
            await entry.session.flush()
            fired, release = proxy.hold_replies_after(b"th_")
            some_events(entry.session, "committed, its answer held")
            length = len(entry.session)
            timer = threading.Timer(0.3, release.set)
            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(entry.session.flush)
                    with trio.fail_after(WAIT):  # until the server committed the batch
                        while events_stored(watcher, schema, "s1") != length:
                            await trio.sleep(0.005)
                    assert fired.is_set()
                    scope.cancel()
                    if released == "before the writer sees the cancel":
                        release.set()
                    else:
                        timer.start()
            timer.cancel()
            assert scope.cancelled_caught
            writer: Any = entry.writer
            assert writer._stored == length and writer._buffer == []  # the writer knows: nothing to retry
            await entry.session.flush()
            assert (await store.load("s1")).events == tuple(entry.session.events)
            await sessions.detach(entry)


async def test_a_prepared_statement_deallocated_behind_the_writer_is_prepared_again(store: PostgresStore) -> None:
    sessions, entry = await live(store)
    some_events(entry.session, "prepares the statement")
    await entry.session.flush()
    conn = writer_conn(entry)
    await _call(conn, lambda: conn.execute("DEALLOCATE ALL"))
    some_events(entry.session, "after DEALLOCATE ALL")
    await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)
    await sessions.detach(entry)


# ------------------------------------------------------------------ the pooled mode's appends: group commits


async def test_pooled_flushes_leave_no_prepared_statement_on_the_shared_connections(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """Unnamed statements only (a transaction-pooling proxy may sit between): nothing to deallocate behind them."""
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=1)
    async with pooled:
        sessions, entry = await live(pooled)
        for number in range(3):
            some_events(entry.session, f"step {number}")
            await entry.session.flush(sync=number % 2 == 0)
        ((conn, _),) = pooled._require_pool()._idle
        assert await _call(conn, lambda: conn.execute("SELECT name FROM pg_prepared_statements").fetchall()) == []
        await _call(conn, lambda: conn.execute("DEALLOCATE ALL"))  # as a proxy's other client might
        some_events(entry.session, "after DEALLOCATE ALL")
        await entry.session.flush()
        assert (await store.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


@pytest.mark.parametrize("released", ["before the writer sees the cancel", "after a while"])
async def test_a_pooled_flush_cancelled_while_its_group_commit_answer_is_held_knows_it_committed(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, released: str
) -> None:
    with proxy_for(postgres_cluster) as proxy, admin(postgres_cluster) as watcher:
        proxied = PooledPostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions, entry = await live(proxied)
            fired, release = proxy.hold_replies_after(b"FOR SHARE OF le")
            some_events(entry.session, "committed, its answer held")
            length = len(entry.session)
            timer = threading.Timer(0.3, release.set)
            flushed: list[bool] = []

            async def flush() -> None:
                await entry.session.flush()
                flushed.append(True)

            with trio.CancelScope() as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flush)
                    with trio.fail_after(WAIT):  # until the server committed the batch
                        while events_stored(watcher, schema, "s1") != length:
                            await trio.sleep(0.005)
                    assert fired.is_set()
                    scope.cancel()
                    if released == "before the writer sees the cancel":
                        release.set()
                    else:
                        timer.start()
            timer.cancel()
            # The group commit is shielded (bounded by write_timeout): the cancelled flush waited for its outcome.
            assert flushed == [True]
            writer: Any = entry.writer
            assert writer._stored == length and writer._buffer == []  # the writer knows: nothing to retry
            some_events(entry.session, "after")
            await entry.session.flush()
            assert (await store.load("s1")).events == tuple(entry.session.events)
            await sessions.detach(entry)
