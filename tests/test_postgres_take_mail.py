"""A pooled writer's mailbox read (``_PooledWriter.take_mail``) and the pool: the writer's lock is not held meanwhile.

The read takes the writer's lock (a flush deleting mailbox rows must not
overlap it, tests/test_postgres_mail.py) only once it has a pooled
connection, and holds no connection while it waits for the lock: a flush of
the session, which holds the lock and may need a connection itself, is not
kept waiting behind a read that waits for the pool (with ``pool_size`` 1 the
two would wait for each other until a bound ended it).  Whatever ends the
read (its bound, a cancellation while it waits for the pool or while its
statement runs, a lost connection) its connection goes back to the pool.

Real cluster (tests/_postgres.py); the clock is a :class:`trio.testing.MockClock`
at the real rate (the statements need real time) that a test jumps past the
bound instead of waiting for it.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from _postgres import Cluster, admin, clock, postgres_cluster, schema, store, superuser, until
from _util import WAIT
from test_postgres_store import one_turn, stored_session

from trio_harness import SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session._events import InboxMessage

__all__ = ["clock", "postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest

WRITE_TIMEOUT = 2 * WAIT  # no bound ends a test here unless it jumps the clock past it


def reading(superuser: psycopg.Connection[Any], schema: str) -> list[int]:
    """The server processes whose mailbox read waits for a lock."""
    rows = superuser.execute(
        "SELECT pid FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s AND query LIKE %s",
        ("SELECT id, body FROM %.mailbox WHERE session_id%", f"%{schema}%"),
    ).fetchall()
    return [pid for (pid,) in rows]


def pool_whole(pooled: PooledPostgresStore) -> None:
    """Nothing lent: the pool's one slot is free, its connection idle and usable (or none kept)."""
    pool = pooled._require_pool()
    assert pool._slots.value == pool.size == 1
    assert all(not (conn.closed or conn.broken) for conn, _ in pool._idle)


@contextlib.asynccontextmanager
async def one_slot(
    cluster: Cluster, schema: str, store: PostgresStore
) -> AsyncIterator[tuple[PooledPostgresStore, Any]]:
    """A pooled store of one connection holding session ``s1`` live, message ``m1`` posted to it: the
    pooled store and the session's entry (detached after the test, unless its writer was closed)."""
    await stored_session(store, "s1")
    pooled = PooledPostgresStore(cluster.dsn(), schema=schema, pool_size=1, write_timeout=WRITE_TIMEOUT)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        await pooled.post("s1", InboxMessage("m1", "posted"))
        yield pooled, entry
        writer: Any = entry.writer  # the pooled writer
        if not writer._closed:
            await sessions.detach(entry)


def ids(mail: list[tuple[int, InboxMessage]]) -> list[str]:
    return [message.id for _, message in mail]


async def test_a_read_waiting_for_the_pool_leaves_the_lock_to_the_sessions_flush(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    """The pool's only connection is held by another: the read waits for it without the writer's lock, so a
    flush of the session takes the lock (and waits for a connection too).  Once the connection is free the
    read gets it first, finds the lock busy and gives it back; the flush commits, then the read runs."""
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        done: list[object] = []

        async def take() -> None:
            done.append(ids(await writer.take_mail()))

        async def flush() -> None:
            await entry.session.flush()
            done.append("flushed")

        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                async with pooled._require_pool().connection():  # another's statement
                    nursery.start_soon(take)
                    await trio.testing.wait_all_tasks_blocked()
                    assert not writer._lock.locked(), "the read holds the writer's lock while it waits for the pool"
                    one_turn(entry.session, 2)
                    nursery.start_soon(flush)
                    await trio.testing.wait_all_tasks_blocked()
                    assert writer._lock.locked()  # by the flush, waiting for the pool too
                    assert done == []
        assert done == ["flushed", ["m1"]]
        pool_whole(pooled)
        assert len((await store.load("s1")).events) == 16


async def test_a_read_cancelled_while_it_waits_for_the_pool_takes_nothing_and_leaves_the_pool_whole(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        with trio.fail_after(WAIT):
            async with pooled._require_pool().connection():
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(writer.take_mail)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.cancel_scope.cancel()
            pool_whole(pooled)
            assert not writer._lock.locked()
            assert ids(await writer.take_mail()) == ["m1"]  # not taken by the first
        pool_whole(pooled)


async def test_a_read_cancelled_while_its_statement_runs_gives_its_connection_back(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        with admin(postgres_cluster) as locker:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {schema}.mailbox IN ACCESS EXCLUSIVE MODE")  # the read waits
            async with trio.open_nursery() as nursery:
                nursery.start_soon(writer.take_mail)
                await until(lambda: reading(superuser, schema), "the read waits for the table")
                assert writer._lock.locked()  # held while the statement runs
                nursery.cancel_scope.cancel()
            assert reading(superuser, schema) == []  # cancelled on the server
            pool_whole(pooled)
            assert len(pooled._require_pool()._idle) == 1  # kept for reuse: the cancelled read left it idle
            assert not writer._lock.locked()
            locker.execute("COMMIT")
        with trio.fail_after(WAIT):
            assert ids(await writer.take_mail()) == ["m1"]


async def test_a_read_whose_connection_is_lost_is_read_again_on_a_new_one(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        taken: list[list[str]] = []

        async def take() -> None:
            taken.append(ids(await writer.take_mail()))

        with admin(postgres_cluster) as locker:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {schema}.mailbox IN ACCESS EXCLUSIVE MODE")
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take)
                await until(lambda: reading(superuser, schema), "the read waits for the table")
                [first] = reading(superuser, schema)
                superuser.execute("SELECT pg_terminate_backend(%s, 5000)", (first,))
                await until(lambda: reading(superuser, schema) not in ([], [first]), "the read is sent again")
                assert taken == []
                locker.execute("COMMIT")
        assert taken == [["m1"]]
        pool_whole(pooled)


async def test_a_read_still_waiting_for_the_pool_at_the_write_timeout_fails_saying_so(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, clock: trio.testing.MockClock
) -> None:
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        failed: list[SessionStoreError] = []

        async def take() -> None:
            with pytest.raises(SessionStoreError) as raised:
                await writer.take_mail()
            failed.append(raised.value)

        async with pooled._require_pool().connection():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(take)
                await trio.testing.wait_all_tasks_blocked()
                clock.jump(WRITE_TIMEOUT + 1)
        [error] = failed
        assert f"within {WRITE_TIMEOUT:g} s (write_timeout), or no pooled connection was free" in str(error)
        assert error.session_id == "s1"
        pool_whole(pooled)
        assert not writer._lock.locked()
        with trio.fail_after(WAIT):
            assert ids(await writer.take_mail()) == ["m1"]


async def test_a_read_of_a_writer_closed_while_it_waited_for_the_pool_returns_nothing(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    async with one_slot(postgres_cluster, schema, store) as (pooled, entry):
        writer = entry.writer
        taken: list[object] = []

        async def take() -> None:
            taken.append(await writer.take_mail())

        with trio.fail_after(WAIT):
            async with trio.open_nursery() as nursery:
                async with pooled._require_pool().connection():
                    nursery.start_soon(take)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.start_soon(writer.aclose)  # its release of the lease waits for the pool too
                    await trio.testing.wait_all_tasks_blocked()
        assert taken == [[]]
        assert writer._closed
        pool_whole(pooled)
    assert [message.id for message in await store.pending_mail("s1")] == ["m1"]
