"""The PostgreSQL store under faults: cancellations at every point, frozen backends, restarts, lost answers.

Faults come from the real server and a real network path: ``SIGSTOP`` of a
backend process, ``pg_terminate_backend``, server restarts (on a cluster of
this module's own, so the shared one is never restarted), and a TCP proxy on
127.0.0.1 (``tests/_postgres.py``'s :class:`Proxy`) that drops a connection
right after forwarding a ``COMMIT`` (the server commits, the answer is lost)
or holds a connection's answers back.  See docs/postgres.rst.

A test whose guarantee holds in both modes of the store runs in both
(``mode``: tests/_pg_modes.py); the pooled mode's own faults (its liveness
connection, its group commit) are in tests/test_postgres_pooled_faults.py.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from pathlib import Path

import psycopg
import pytest
import trio
from _pg_modes import MODES, make
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

from trio_harness import SessionLockedError, SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionEntry, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.session._events import InboxMessage
from trio_harness.session._pg_schema import _quote as quote

# The fixtures, imported for pytest; and stored_session, which tests/test_image_blobs.py imports from here.
__all__ = ["own_cluster", "postgres_cluster", "schema", "store", "stored_session"]

ROOT = Path(__file__).resolve().parent.parent


def backend_pid(entry: SessionEntry) -> int:
    conn = entry.writer._conn  # type: ignore[attr-defined]
    assert conn is not None
    pid: int = conn.info.backend_pid
    return pid


async def wait_for(event: threading.Event) -> None:
    with trio.fail_after(WAIT):
        while not event.is_set():
            await trio.sleep(0.005)


def advisory_locks(cluster: Cluster) -> int:
    return int(cluster.psql("SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted").strip())


# ------------------------------------------------------------------ 8: cancelled calls

CANCELLED_CALLS = """
import sys, trio
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session._events import InboxMessage, TurnStart

async def main(dsn, schema, mode):
    store = (PooledPostgresStore if mode == "pooled" else PostgresStore)(dsn, schema=schema)
    await store.check()
    async with store:
        sessions = SessionRegistry(store)
        for other in ("s2", "s3"):
            await sessions.detach(sessions.enter(await sessions.prepare_new(other)))
        entry = sessions.enter(await sessions.prepare_new("s1"))
        await entry.session.flush()

        async def resume():
            loaded, writer = await store.resume("s2")
            await writer.aclose()

        calls = {
            "list": store.list,
            "load": lambda: store.load("s1"),
            "exists": lambda: store.exists("s1"),
            "pending_mail": lambda: store.pending_mail("s1"),
            "post": lambda: store.post("s1", InboxMessage("m1", "hi")),
            "resume": resume,
            "flush": entry.session.flush,
        }
        for name, call in calls.items():
            for number in range(20):
                if name == "flush":
                    entry.session.append(TurnStart, turn=number + 1)
                with trio.move_on_after(1e-6):
                    await call()
            print(name, flush=True)
        await sessions.detach(entry)
    print("done", flush=True)

trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
"""


@pytest.mark.parametrize("mode", MODES)
def test_a_store_call_cancelled_before_its_thread_began_returns_at_once(
    mode: str, postgres_cluster: Cluster, schema: str
) -> None:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    try:
        result = subprocess.run(
            [sys.executable, "-c", CANCELLED_CALLS, postgres_cluster.dsn(), schema, mode],
            capture_output=True,
            text=True,
            env=env,
            timeout=30,
            check=False,
        )
    except subprocess.TimeoutExpired as exc:
        raise AssertionError(f"a cancelled store call hung; the calls that returned: {exc.stdout!r}") from None
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["list", "load", "exists", "pending_mail", "post", "resume", "flush", "done"]


# ------------------------------------------------------------------ 9: locks never leak into the pool


async def cancel_once_locked(proxy: Proxy, cluster: Cluster, call: Callable[[], Awaitable[object]]) -> None:
    """Run ``call`` and cancel it once its ``pg_try_advisory_lock`` is taken on the server, its answer held back."""
    fired, release = proxy.hold_replies_after(b"pg_try_advisory_lock")
    scope = trio.CancelScope()

    async def run() -> None:
        with scope:
            await call()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        await wait_for(fired)
        with trio.fail_after(WAIT):
            while advisory_locks(cluster) == 0:
                await trio.sleep(0.005)
        scope.cancel()  # the lock is taken on the server, its answer still held
        await trio.sleep(0.1)
        release.set()
    assert scope.cancelled_caught


async def test_a_resume_cancelled_while_taking_the_lock_leaves_the_session_free(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = PostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            await proxied.load("s1")  # a pooled connection
            # The lock is taken on the server; its answer is held back while the caller is cancelled.
            await cancel_once_locked(proxy, postgres_cluster, lambda: SessionRegistry(proxied).prepare_resume("s1"))
            # Another worker takes the session: no pooled connection kept the lock.
            taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=3.0)
            async with taker:
                sessions = SessionRegistry(taker)
                entry = sessions.enter(await sessions.prepare_resume("s1"))
                await sessions.detach(entry)
            await proxied.load("s1")  # and the store still works


async def test_a_flush_cancelled_while_retaking_its_session_leaves_the_session_free(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = PostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions = SessionRegistry(proxied)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            with admin(postgres_cluster) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid(entry),))
            with trio.fail_after(WAIT):
                while advisory_locks(postgres_cluster) != 0:
                    await trio.sleep(0.005)
            one_turn(entry.session, 2)
            await cancel_once_locked(proxy, postgres_cluster, entry.session.flush)
            taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=3.0)
            async with taker:
                other = SessionRegistry(taker)
                taken = other.enter(await other.prepare_resume("s1"))
                await other.detach(taken)
            await sessions.detach(entry)  # nobody took it meanwhile: the writer takes it again
            assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_connection_that_holds_an_advisory_lock_is_never_used_to_take_a_session(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    sessions = SessionRegistry(store)
    async with store._require_pool().connection() as conn:  # a pooled connection that holds some lock
        conn.execute("SELECT pg_advisory_lock(42)")
        tainted = conn.info.backend_pid
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    assert backend_pid(entry) != tainted and conn.closed
    await sessions.detach(entry)
    assert advisory_locks(postgres_cluster) == 0  # released whole: nothing re-entrant was left behind


# ------------------------------------------------------------------ 11: dead pooled connections


@pytest.mark.parametrize("mode", MODES)
async def test_pooled_connections_killed_by_the_server_are_not_handed_out_again(
    mode: str, postgres_cluster: Cluster, schema: str
) -> None:
    store = make(mode, postgres_cluster.dsn(), schema)
    await store.check()
    async with store:
        await _killed_pooled_connections(postgres_cluster, store)


async def _killed_pooled_connections(postgres_cluster: Cluster, store: PostgresStore) -> None:
    await stored_session(store, "s1")
    async with trio.open_nursery() as nursery:  # several pooled connections
        for _ in range(3):
            nursery.start_soon(store.load, "s1")
    pids = [conn.info.backend_pid for conn, _ in store._require_pool()._idle]
    assert pids
    with admin(postgres_cluster) as conn:
        for pid in pids:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
    sessions = SessionRegistry(store)
    message_id = await sessions.post("s1", "after the kill")
    assert [message.id for message in await store.pending_mail("s1")] == [message_id]
    assert await store.exists("s1")


@pytest.mark.parametrize("mode", MODES)
async def test_after_a_server_restart_posts_and_turns_go_on(own_cluster: Cluster, mode: str) -> None:
    persistence = make(mode, own_cluster.dsn(), fresh_schema())
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        await stored_session(persistence, "s2")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s2"))
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(persistence.load, "s1")
        await trio.to_thread.run_sync(own_cluster.restart)
        message_id = await sessions.post("s1", "after the restart")
        assert [message.id for message in await persistence.pending_mail("s1")] == [message_id]
        one_turn(entry.session, 2)
        await entry.session.flush()
        await sessions.detach(entry)
        assert (await persistence.load("s2")).events == tuple(entry.session.events)


# ------------------------------------------------------------------ 10: a crash loses unsynced commits


async def test_events_a_crash_lost_after_an_unsynced_flush_are_put_back_on_retake(
    own_cluster: Cluster, caplog: pytest.LogCaptureFixture
) -> None:
    persistence = PostgresStore(own_cluster.dsn(), schema=fresh_schema())
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        restored: list[tuple[str, object]] = []
        sessions.bus.on("session/restored", lambda notice: restored.append((notice.subject.id, notice.data["events"])))
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        synced = len(entry.session)
        one_turn(entry.session, 2, "unsynced")
        await entry.session.flush(sync=False)
        await trio.to_thread.run_sync(own_cluster.restart, "immediate")  # a crash: the unsynced commit is lost
        lost = await persistence.load("s1")
        assert len(lost.events) == synced, "the crash did not lose the unsynced commit: the test proves nothing"
        one_turn(entry.session, 3, "after the crash")
        with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
            await entry.session.flush()
        assert "lost the last 5 events committed without sync" in caplog.text
        assert restored == [("s1", 5)]  # the application hears of it, not only the log
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        await sessions.detach(entry)


# ------------------------------------------------------------------ 12, 13: lost COMMIT acknowledgements


@pytest.mark.parametrize("mode", MODES)
async def test_a_first_flush_whose_commit_answer_is_lost_counts_as_stored(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    with proxy_for(postgres_cluster) as proxy:
        proxied = make(mode, proxy.dsn(), schema)
        async with proxied:
            sessions = SessionRegistry(proxied)
            entry = sessions.enter(await sessions.prepare_new("s1"))
            one_turn(entry.session, 1)
            dropped = proxy.drop_after(b"COMMIT")
            await entry.session.flush()
            assert dropped.is_set()
            assert (await store.load("s1")).events == tuple(entry.session.events)
            one_turn(entry.session, 2)
            await entry.session.flush()
            await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


@pytest.mark.parametrize("mode", MODES)
async def test_a_post_whose_commit_answer_is_lost_returns_and_is_delivered_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = make(mode, proxy.dsn(), schema)
        async with proxied:
            dropped = proxy.drop_after(b"COMMIT")
            message_id = await SessionRegistry(proxied).post("s1", "once")
            assert dropped.is_set()
    assert [message.id for message in await store.pending_mail("s1")] == [message_id]


@pytest.mark.parametrize("mode", MODES)
async def test_a_retried_post_of_a_delivered_message_is_not_delivered_again(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    holder = make(mode, postgres_cluster.dsn(), schema)
    async with holder:
        await _retried_post(mode, postgres_cluster, schema, store, holder)


async def _retried_post(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, holder: PostgresStore
) -> None:
    await stored_session(store, "s1")
    sessions = SessionRegistry(holder)
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    delivered: list[str] = []

    def deliver(message: InboxMessage) -> None:
        delivered.append(message.id)
        entry.session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(message,))

    sessions.receive(entry, deliver)
    with proxy_for(postgres_cluster) as proxy:
        proxied = make(mode, proxy.dsn(), schema)
        async with proxied:
            message = InboxMessage(f"msg-{uuid.uuid4().hex}", "once")
            await proxied.post("s1", message)
            with trio.fail_after(WAIT):  # delivered, stored and removed from the mailbox
                while await store.pending_mail("s1") or not delivered:
                    await trio.sleep(0.01)
            # The same post again, as the store retries it after losing its answer.
            dropped = proxy.drop_after(b"pg_notify")
            await proxied.post("s1", message)
            assert dropped.is_set()
    await trio.sleep(0.2)
    assert delivered == [message.id]
    assert await store.pending_mail("s1") == []
    await sessions.detach(entry)


# ------------------------------------------------------------------ 14: encodings


async def test_a_database_that_is_not_utf8_is_refused_by_check(postgres_cluster: Cluster) -> None:
    database = f"latin_{uuid.uuid4().hex[:8]}"
    postgres_cluster.psql(f"CREATE DATABASE {database} TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'")
    persistence = PostgresStore(postgres_cluster.dsn(database), schema=fresh_schema())
    with pytest.raises(SessionStoreError, match="has the encoding LATIN1; the session store needs UTF8"):
        await persistence.check()


@pytest.mark.parametrize("mode", MODES)
async def test_any_exception_of_a_writer_is_a_store_error(mode: str, postgres_cluster: Cluster) -> None:
    database = f"latin_{uuid.uuid4().hex[:8]}"
    postgres_cluster.psql(f"CREATE DATABASE {database} TEMPLATE template0 ENCODING 'LATIN1' LOCALE 'C'")
    persistence = make(mode, postgres_cluster.dsn(database), fresh_schema())
    with psycopg.connect(postgres_cluster.dsn(database), autocommit=True) as conn:
        persistence._tables.migrate_from(conn, 0)  # the tables, made past check()'s refusal
    async with persistence:
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_new("s1"))
        one_turn(entry.session, 1, "\N{CHECK MARK} not in LATIN1")
        with pytest.raises(SessionStoreError, match="UnicodeEncodeError"):
            await entry.session.flush()
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)


# ------------------------------------------------------------------ 15: a server that does not answer


async def test_a_flush_to_a_frozen_backend_fails_within_the_write_timeout_and_dispose_returns(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=0.5)
    async with persistence:
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        pid = backend_pid(entry)
        thawed = threading.Event()

        def thaw() -> None:  # bounds the test when the flush never returns
            if not thawed.wait(20):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGCONT)

        watchdog = threading.Thread(target=thaw, daemon=True)
        os.kill(pid, signal.SIGSTOP)
        watchdog.start()
        try:
            one_turn(entry.session, 2)
            started = time.perf_counter()
            with pytest.raises(SessionStoreError, match=r"did not answer .* within 0.5 s \(write_timeout\)"):
                await entry.session.flush()
            took = time.perf_counter() - started
            print(f"a flush to a frozen backend failed after {took:.2f} s")
            assert took < 8.0
            started = time.perf_counter()
            # Disposing retries the flush: the stopped backend still holds the lock, so it fails, and returns.
            with pytest.raises(SessionStoreError, match="still held by this writer's previous connection"):
                await sessions.detach(entry)
            assert time.perf_counter() - started < 8.0
        finally:
            thawed.set()
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGCONT)
            watchdog.join()
    taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0)
    async with taker:  # thawed, the backend finds its socket shut and exits, releasing the session
        other = SessionRegistry(taker)
        taken = other.enter(await other.prepare_resume("s1"))
        await other.detach(taken)


# ------------------------------------------------------------------ 17: privileges on a fresh database


async def test_a_role_without_create_on_a_fresh_database_is_told_to_grant_create_on_it(
    postgres_cluster: Cluster,
) -> None:
    suffix = uuid.uuid4().hex[:8]
    database, role = f"fresh_{suffix}", f"app_{suffix}"
    postgres_cluster.psql(f"CREATE DATABASE {database}")
    postgres_cluster.psql(f"CREATE ROLE {role} LOGIN")
    persistence = PostgresStore(postgres_cluster.dsn(database, user=role), schema=fresh_schema())
    with pytest.raises(SessionStoreError, match=f'GRANT CREATE ON DATABASE "{database}" TO "{role}"'):
        await persistence.check()
    postgres_cluster.psql(f'GRANT CREATE ON DATABASE "{database}" TO "{role}"')
    await persistence.check()


# ------------------------------------------------------------------ a terminated listener


@pytest.mark.parametrize("mode", MODES)
async def test_a_terminated_listener_reconnects_and_posts_are_delivered_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    holder = make(mode, postgres_cluster.dsn(), schema)
    async with holder:
        sessions = SessionRegistry(holder)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        delivered: list[str] = []

        def deliver(message: InboxMessage) -> None:
            delivered.append(message.id)
            entry.session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(message,))

        sessions.receive(entry, deliver)
        listen = f"LISTEN {quote(holder._sql.channel)}"

        def listener() -> int | None:
            with admin(postgres_cluster) as conn:
                row = conn.execute("SELECT pid FROM pg_stat_activity WHERE query = %s", (listen,)).fetchone()
            return None if row is None else int(row[0])

        first = await SessionRegistry(store).post("s1", "before")
        with trio.fail_after(WAIT):
            while (pid := listener()) is None or delivered != [first]:
                await trio.sleep(0.01)
        with admin(postgres_cluster) as conn:
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (pid,))
        # Posted while nobody listens (NOTIFY is not durable): the reconnected listener's rescan finds it.
        during = await SessionRegistry(store).post("s1", "while the listener is down")
        with trio.fail_after(WAIT):
            while (new := listener()) is None or new == pid:
                await trio.sleep(0.01)
        after = await SessionRegistry(store).post("s1", "after")
        with trio.fail_after(WAIT):
            while len(delivered) < 3 or await store.pending_mail("s1"):
                await entry.session.flush()
                await trio.sleep(0.01)
        assert delivered == [first, during, after]
        await sessions.detach(entry)
    inserted = [m.id for e in (await store.load("s1")).events if isinstance(e, ev.InboxSpliced) for m in e.inserted]
    assert inserted[-3:] == [first, during, after]


# ------------------------------------------------------------------ the pooled mode across restarts and crashes


async def test_after_a_server_restart_a_pooled_worker_holds_its_sessions_again(own_cluster: Cluster) -> None:
    """The restart drops the liveness connection: the heartbeat takes the lock again, and others are refused."""
    schema_name = fresh_schema()
    persistence = PooledPostgresStore(own_cluster.dsn(), schema=schema_name, heartbeat=0.1, idle_session_timeout=1.0)
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        old = persistence._live
        await trio.to_thread.run_sync(own_cluster.restart)
        with trio.fail_after(WAIT):
            while persistence._live is old or persistence._live is None:
                await trio.sleep(0.01)
        async with PooledPostgresStore(own_cluster.dsn(), schema=schema_name) as other:
            with pytest.raises(SessionLockedError):
                await other.resume("s1")
        one_turn(entry.session, 2)
        await entry.session.flush()
        await sessions.detach(entry)
        assert (await persistence.load("s1")).events == tuple(entry.session.events)


async def test_a_pooled_flush_without_sync_survives_a_crash(own_cluster: Cluster) -> None:
    """The pooled mode commits every flush synchronously (group commit pays for it): a crash loses none."""
    persistence = PooledPostgresStore(own_cluster.dsn(), schema=fresh_schema())
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2, "unsynced")
        await entry.session.flush(sync=False)
        await trio.to_thread.run_sync(own_cluster.restart, "immediate")  # a crash
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
        one_turn(entry.session, 3, "after the crash")
        await entry.session.flush()
        await sessions.detach(entry)
        assert (await persistence.load("s1")).events == tuple(entry.session.events)
