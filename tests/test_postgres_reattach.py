"""A per-session PostgreSQL writer taking its session again after a flush whose outcome it never learnt.

A flush whose connection is lost around COMMIT, times out (``write_timeout``)
or is cancelled may have committed; its batch goes back to the buffer, more
events are written, and the next flush (or a heartbeat) takes the session
again on a new connection.  What is stored then is a prefix of what the
writer still has to store, and the mailbox rows it deleted in that
transaction are gone: none of that is another writer's doing.  The faults
come from a real server behind ``tests/_postgres.py``'s TCP proxy (replies
held back after the commit went through) and from a real crash of a
cluster of this module's own.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import uuid
from collections.abc import AsyncIterator
from typing import Any

import pytest
import trio
from _postgres import (
    Cluster,
    Proxy,
    admin,
    fresh_schema,
    one_turn,
    own_cluster,
    postgres_cluster,
    proxy_for,
    schema,
    store,
    stored_session,
)
from _util import WAIT

from trio_harness import SessionStoreError
from trio_harness.session import PostgresStore, SessionEntry, SessionRegistry, _pg_leases, _pg_writer
from trio_harness.session._pg_schema import _lock_key
from trio_harness.session._pg_writer import _PgWriter

__all__ = ["own_cluster", "postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

# No heartbeat: only the flushes of a test take the session again (the idle timeout needs one).
NO_HEARTBEAT: dict[str, Any] = {"heartbeat": None, "idle_session_timeout": None}


def writer_of(entry: SessionEntry) -> _PgWriter:
    writer = entry.writer
    assert isinstance(writer, _PgWriter)
    return writer


def marker() -> str:
    return f"marker-{uuid.uuid4().hex}"


def mailbox_rows(cluster: Cluster, schema: str, session_id: str = "s1") -> int:
    with admin(cluster) as conn:
        row = conn.execute(f"SELECT count(*) FROM {schema}.mailbox WHERE session_id = %s", (session_id,)).fetchone()
    assert row is not None
    count: int = row[0]
    return count


async def flush_whose_answer_is_held(entry: SessionEntry) -> int:
    """A flush whose statement the server ran while its answer never came: it times out, outcome unknown.

    Returns the server process of the dropped connection: it holds the
    session's lock until it ends (see :func:`until_gone`).
    """
    with pytest.raises(SessionStoreError, match=r"within 0.5 s \(write_timeout\)"):
        await entry.session.flush()
    writer = writer_of(entry)
    assert writer._conn is None
    assert writer._pid != 0, "the writer never held the session's lock"
    return writer._pid


@contextlib.asynccontextmanager
async def behind_a_proxy(
    cluster: Cluster, schema: str, *, new: bool = False, heartbeat: float | None = None
) -> AsyncIterator[tuple[Proxy, SessionEntry]]:
    """Session ``s1`` live for the block on a store that reaches ``cluster`` through a :class:`Proxy`.

    The session is resumed (``new``: created); the store's ``write_timeout``
    is 0.5 s; it has no heartbeat (and so no idle timeout) unless
    ``heartbeat`` gives one (with the default idle timeout).  The session is
    detached at the end of the block (not when the block fails).
    """
    settings = {"heartbeat": heartbeat} if heartbeat is not None else NO_HEARTBEAT
    with proxy_for(cluster) as proxy:
        async with PostgresStore(proxy.dsn(), schema=schema, write_timeout=0.5, **settings) as proxied:
            sessions = SessionRegistry(proxied)
            session = await (sessions.prepare_new("s1") if new else sessions.prepare_resume("s1"))
            entry = sessions.enter(session)
            yield proxy, entry
            await sessions.detach(entry)


async def until_gone(cluster: Cluster, pid: int) -> None:
    """Poll ``pg_stat_activity`` (real time, bounded by :data:`WAIT`) until server process ``pid`` has left it."""
    deadline = trio.current_time() + WAIT
    while True:
        with admin(cluster) as conn:
            if conn.execute("SELECT count(*) FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() == (0,):
                return
        assert trio.current_time() < deadline, f"server process {pid} still in pg_stat_activity after {WAIT} s"
        await trio.sleep(0.02)


async def test_a_flush_after_one_whose_commit_was_unanswered_stores_the_rest_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    async with behind_a_proxy(postgres_cluster, schema) as (proxy, entry):
        text = marker()
        one_turn(entry.session, 2, text)
        fired, _ = proxy.hold_replies_after(text.encode())
        old = await flush_whose_answer_is_held(entry)
        assert fired.is_set()
        # The server committed the batch: it is stored though the writer never heard so.
        assert (await store.load("s1")).events == tuple(entry.session.events)
        one_turn(entry.session, 3)  # more events behind the batch of unknown outcome
        await until_gone(postgres_cluster, old)  # its lock is free: the retake need not wait for it
        await entry.session.flush()
        assert (await store.load("s1")).events == tuple(entry.session.events)
        one_turn(entry.session, 4)
        await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_heartbeat_retake_after_a_flush_of_unknown_outcome_keeps_the_session(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    async with behind_a_proxy(postgres_cluster, schema, heartbeat=0.1) as (proxy, entry):
        writer = writer_of(entry)
        text = marker()
        one_turn(entry.session, 2, text)
        proxy.hold_replies_after(text.encode())
        await flush_whose_answer_is_held(entry)
        one_turn(entry.session, 3)
        with trio.fail_after(WAIT):  # the heartbeat takes the session again
            while writer._conn is None and writer._broken is None:
                await trio.sleep(0.02)
        assert writer._broken is None
        assert len(writer._buffer) == 5  # turn 2 counts as stored; turn 3 is left to the next flush
        await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_mailbox_delete_whose_commit_was_unanswered_is_not_taken_for_a_takeover(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with admin(postgres_cluster) as conn:  # a row that is no message: removed without an event
        conn.execute(f"INSERT INTO {schema}.mailbox (session_id, body) VALUES ('s1', 'not a message')")
    async with behind_a_proxy(postgres_cluster, schema) as (proxy, entry):
        writer = writer_of(entry)
        assert await writer.take_mail() == []
        assert writer._acks
        assert writer._conn is not None
        old = writer._conn.info.backend_pid
        fired, _ = proxy.hold_replies_after(b"COMMIT")
        with pytest.raises(SessionStoreError, match=r"within 0.5 s \(write_timeout\)"):
            await writer.flush()
        assert fired.is_set()
        assert mailbox_rows(postgres_cluster, schema) == 0  # the delete committed
        # The old connection still holds the session's lock until its server process ends (the proxy
        # closed its socket, the server notices in its own time): the retake would wait only 1 s for it.
        await until_gone(postgres_cluster, old)
        await writer.flush()  # nothing left to delete: no "taken by another writer"
        assert writer._acks == []
        one_turn(entry.session, 2)
        await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_mail_deleted_by_an_unsynced_commit_the_crash_kept_is_not_deleted_again(
    own_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    schema = fresh_schema()
    persistence = PostgresStore(own_cluster.dsn(), schema=schema, **NO_HEARTBEAT)
    await persistence.check()
    async with persistence:
        sessions = SessionRegistry(persistence)
        # The WAL writer may still flush the last commit before the crash (rarely): then the crash
        # proves nothing, and the scenario runs again on another session.
        for attempt in range(3):
            sid = f"s{attempt}"
            await stored_session(persistence, sid)
            entry = sessions.enter(await sessions.prepare_resume(sid))
            writer = writer_of(entry)
            with admin(own_cluster) as conn:
                conn.execute(f"INSERT INTO {schema}.mailbox (session_id, body) VALUES (%s, 'not a message')", (sid,))
            assert await writer.take_mail() == []  # acked: deleted with the next batch
            one_turn(entry.session, 2, "kept")
            await entry.session.flush(sync=False)  # events and the delete, committed without sync
            kept = len(entry.session)
            with admin(own_cluster) as conn:  # another connection's synced commit: the WAL up to here reaches disk
                conn.execute("SELECT pg_logical_emit_message(true, 'test', '')")
            one_turn(entry.session, 3, "lost")
            await entry.session.flush(sync=False)
            await trio.to_thread.run_sync(own_cluster.restart, "immediate")
            survived = len((await persistence.load(sid)).events)
            if survived == kept:
                break
            await sessions.detach(entry)
        assert survived == kept, f"the crash kept {survived} events, not {kept}: it did not lose only the last commit"
        assert mailbox_rows(own_cluster, schema, sid) == 0  # the delete survived with its events
        one_turn(entry.session, 4)
        with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
            await entry.session.flush()
        assert "lost the last 5 events committed without sync" in caplog.text
        assert writer._broken is None
        assert (await persistence.load(sid)).events == tuple(entry.session.events)
        await sessions.detach(entry)


async def test_mail_deleted_by_an_unsynced_commit_the_crash_lost_is_deleted_again(own_cluster: Cluster) -> None:
    schema = fresh_schema()
    persistence = PostgresStore(own_cluster.dsn(), schema=schema, **NO_HEARTBEAT)
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        writer = writer_of(entry)
        synced = len(entry.session)
        with admin(own_cluster) as conn:
            conn.execute(f"INSERT INTO {schema}.mailbox (session_id, body) VALUES ('s1', 'not a message')")
        assert await writer.take_mail() == []
        await writer.flush(sync=False)  # the delete alone, committed without sync
        await trio.to_thread.run_sync(own_cluster.restart, "immediate")
        assert len((await persistence.load("s1")).events) == synced
        assert mailbox_rows(own_cluster, schema) == 1, "the crash kept the delete: the test proves nothing"
        one_turn(entry.session, 2)
        await entry.session.flush()
        assert mailbox_rows(own_cluster, schema) == 0
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


async def test_a_synced_flush_with_nothing_new_makes_the_unsynced_commits_durable(own_cluster: Cluster) -> None:
    persistence = PostgresStore(own_cluster.dsn(), schema=fresh_schema(), **NO_HEARTBEAT)
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        await entry.session.flush(sync=False)
        await entry.session.flush()  # nothing new: a sync point
        await trio.to_thread.run_sync(own_cluster.restart, "immediate")
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


async def test_a_flush_after_a_first_flush_whose_commit_was_unanswered_creates_nothing_twice(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    async with behind_a_proxy(postgres_cluster, schema, new=True) as (proxy, entry):
        one_turn(entry.session, 1)
        fired, _ = proxy.hold_replies_after(b"COMMIT")
        old = await flush_whose_answer_is_held(entry)
        assert fired.is_set()
        assert (await store.load("s1")).events == tuple(entry.session.events)  # created, unknown to it
        one_turn(entry.session, 2)
        await until_gone(postgres_cluster, old)  # its lock is free: the retake need not wait for it
        await entry.session.flush()  # not "already stored": the stored session is its own
        assert (await store.load("s1")).events == tuple(entry.session.events)
        one_turn(entry.session, 3)
        await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_first_flush_retried_with_nothing_new_after_an_unanswered_commit_is_stored_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    async with behind_a_proxy(postgres_cluster, schema, new=True) as (proxy, entry):
        one_turn(entry.session, 1)
        proxy.hold_replies_after(b"COMMIT")
        old = await flush_whose_answer_is_held(entry)
        await until_gone(postgres_cluster, old)  # its lock is free: the retake need not wait for it
        await entry.session.flush()  # the same batch again
        one_turn(entry.session, 2)
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_first_flush_waits_for_its_frozen_previous_connection_and_says_so(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=0.5, **NO_HEARTBEAT)
    async with persistence:
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_new("s1"))
        writer = writer_of(entry)
        assert writer._conn is not None
        pid = writer._conn.info.backend_pid  # the claim's connection, which holds the session's lock
        one_turn(entry.session, 1)
        os.kill(pid, signal.SIGSTOP)
        try:
            await flush_whose_answer_is_held(entry)  # nothing reached the frozen backend
            # Its lock is still held by the frozen backend: not "already stored", a wait that says why.
            with pytest.raises(
                SessionStoreError, match=rf"still held by this writer's previous connection \(server process {pid}\)"
            ):
                await entry.session.flush()
        finally:
            os.kill(pid, signal.SIGCONT)
        await until_gone(postgres_cluster, pid)  # the thawed backend finds its client gone and ends, releasing the lock
        await entry.session.flush()
        one_turn(entry.session, 2)
        await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_batch_of_unknown_outcome_found_stored_without_sync_is_put_back_when_a_crash_loses_it(
    own_cluster: Cluster,
) -> None:
    schema = fresh_schema()
    await PostgresStore(own_cluster.dsn(), schema=schema).check()
    with proxy_for(own_cluster) as proxy:
        persistence = PostgresStore(proxy.dsn(), schema=schema, write_timeout=0.5, **NO_HEARTBEAT)
        async with persistence:
            sessions = SessionRegistry(persistence)
            # The WAL writer may flush the unsynced commits before the crash (rarely): that run proves
            # nothing, and the scenario runs again on another session.
            for attempt in range(3):
                sid = f"s{attempt}"
                await stored_session(persistence, sid)
                entry = sessions.enter(await sessions.prepare_resume(sid))
                synced = len(entry.session)
                one_turn(entry.session, 2, "unsynced")
                await entry.session.flush(sync=False)
                text = marker()
                one_turn(entry.session, 3, text)
                proxy.hold_replies_after(text.encode())
                with pytest.raises(SessionStoreError, match=r"within 0.5 s \(write_timeout\)"):
                    await entry.session.flush(sync=False)  # committed without sync, unknown to the writer
                one_turn(entry.session, 4)
                await entry.session.flush(sync=False)  # turn 3 found stored: counted as unsynced with turn 2
                assert (await persistence.load(sid)).events == tuple(entry.session.events)
                await trio.to_thread.run_sync(own_cluster.restart, "immediate")
                if len((await persistence.load(sid)).events) == synced:
                    break
                await sessions.detach(entry)
            assert len((await persistence.load(sid)).events) == synced, "the crash lost nothing: proves nothing"
            one_turn(entry.session, 5)
            await entry.session.flush()  # turns 2, 3 and 4 are put back in front of turn 5
            assert (await persistence.load(sid)).events == tuple(entry.session.events)
            await sessions.detach(entry)


@pytest.mark.parametrize("delay", [0.0, 0.002, 0.01, 0.05])
async def test_a_retake_cancelled_anywhere_leaves_the_next_flush_storing_each_event_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, delay: float
) -> None:
    await stored_session(store, "s1")
    async with behind_a_proxy(postgres_cluster, schema) as (proxy, entry):
        text = marker()
        one_turn(entry.session, 2, text)
        proxy.hold_replies_after(text.encode())
        await flush_whose_answer_is_held(entry)
        one_turn(entry.session, 3)
        with trio.move_on_after(delay):  # cancelled wherever the retake is by then
            await entry.session.flush()
        assert writer_of(entry)._broken is None
        one_turn(entry.session, 4)
        await entry.session.flush()
    assert (await store.load("s1")).events == tuple(entry.session.events)


def connection_of(writer: _PgWriter) -> Any:
    return writer._conn


async def test_a_first_flush_whose_lock_goes_free_before_its_holder_is_looked_up_tries_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The claim's connection is lost (the heartbeat drops it); the first flush takes the lock again, finds it
    held, and by the time it looks the holder up the lock is free: it tries again (it used to refuse the id)."""
    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=0.05)
    superuser = admin(postgres_cluster)
    try:
        async with persistence:
            sessions = SessionRegistry(persistence)
            entry = sessions.enter(await sessions.prepare_new("s1"))
            writer = writer_of(entry)
            assert writer._conn is not None
            superuser.execute("SELECT pg_terminate_backend(%s, 5000)", (writer._conn.info.backend_pid,))
            with trio.fail_after(WAIT):
                while connection_of(writer) is not None:  # the heartbeat found the claim's connection lost
                    await trio.sleep(0.01)
            key = _lock_key(schema, "s1")
            superuser.execute("SELECT pg_advisory_lock(%s)", (key,))  # someone holds it for a moment
            real_holder = _pg_leases._lock_holder
            looked_up: list[int | None] = []

            def holder_after_it_went_free(conn: Any, lock: int) -> int | None:
                if not looked_up:
                    superuser.execute("SELECT pg_advisory_unlock(%s)", (lock,))  # between the try and the look-up
                looked_up.append(real_holder(conn, lock))
                return looked_up[-1]

            monkeypatch.setattr(_pg_writer, "_lock_holder", holder_after_it_went_free)  # as _create calls it
            one_turn(entry.session, 1)
            await entry.session.flush()
            assert looked_up[0] is None  # the race happened: the try was refused, the look-up found no holder
            await sessions.detach(entry)
        assert (await store.load("s1")).events == tuple(entry.session.events)
    finally:
        superuser.close()
