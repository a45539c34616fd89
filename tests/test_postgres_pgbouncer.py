"""The PostgreSQL store behind a real PgBouncer, and the pooled store's direct URL (``direct_dsn``).

The pooled store's shared connections go through PgBouncer in ``pool_mode =
transaction`` (tests/_postgres.py starts one on a loopback port), its
liveness-lock and LISTEN connections straight to the server: sessions are
created, turned, posted to and taken over after ``kill -9`` of their worker,
while PgBouncer's ``SHOW SERVERS`` shows its few server connections shared by
more clients; a group commit whose connection to PgBouncer is lost while its
server transaction runs on is read back once that transaction ends (not by the
backend pid, which is PgBouncer's), stored once.  A direct URL that goes through the transaction pooler is
refused, naming the URL; the per-session mode behind it is shown to fail.
Real cluster, real PgBouncer, real processes, real clock.
"""

from __future__ import annotations

import logging
import signal
import time
from collections.abc import AsyncIterator, Iterator
from typing import Any

import psycopg
import pytest
import trio
from _postgres import (
    Cluster,
    PgBouncer,
    admin,
    events_stored,
    flush_noting,
    pgbouncer_for,
    postgres_cluster,
    schema,
    store,
    worker_argv,
)
from _util import WAIT
from test_postgres_store import Worker, one_turn, stored_session

from trio_harness import SessionLockedError, SessionStoreError, open_harness
from trio_harness.model import ScriptedModel
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_group
from trio_harness.session import _events as ev
from trio_harness.session._pg_threads import _shut_socket

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

BOUNCER_POOL = 2  # server connections PgBouncer shares among all its clients


@pytest.fixture
def bouncer(postgres_cluster: Cluster) -> Iterator[PgBouncer]:
    with pgbouncer_for(postgres_cluster, pool_mode="transaction", pool_size=BOUNCER_POOL) as running:
        yield running


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            await worker.kill()


def direct(cluster: Cluster, name: str) -> str:
    return cluster.dsn() + f"&application_name={name}"


async def start_worker(
    started: list[Worker], bouncer: PgBouncer, schema: str, command: str, session_id: str, name: str, *options: str
) -> Worker:
    """A pooled worker process whose shared pool goes through ``bouncer``, its direct connections to the server."""
    argv = worker_argv(
        command,
        bouncer.dsn(application_name=name),
        schema,
        session_id,
        "--pooled",
        f"--direct-dsn={direct(bouncer.cluster, name + '-direct')}",
        *options,
    )
    worker = await Worker.start(argv)
    started.append(worker)
    await worker.until("ready")
    return worker


def direct_connections(conn: psycopg.Connection[Any]) -> dict[str, int]:
    rows = conn.execute(
        "SELECT application_name, count(*) FROM pg_stat_activity WHERE application_name LIKE 'bounced-%-direct' "
        "GROUP BY application_name"
    ).fetchall()
    return {str(name): int(count) for name, count in rows}


def texts(events: Any) -> list[str]:
    return [e.text for e in events if isinstance(e, ev.UserMessage)]


# ------------------------------------------------------------------ through PgBouncer


async def test_pooled_workers_behind_a_transaction_pooler_turn_post_and_take_over_after_kill_9(
    postgres_cluster: Cluster, bouncer: PgBouncer, schema: str, workers: list[Worker]
) -> None:
    main = PooledPostgresStore(
        bouncer.dsn(application_name="bounced-test"),
        direct_dsn=direct(postgres_cluster, "bounced-test-direct"),
        schema=schema,
        lock_timeout=10.0,
    )
    model = ScriptedModel([{"text": f"taken over {n}"} for n in range(10)])
    superuser = admin(postgres_cluster)
    try:
        # open_harness runs check(): the migration goes through PgBouncer (a transaction-level lock).
        async with open_harness(model=model, store=main, builtin_tools=False) as harness:
            holders = [
                await start_worker(workers, bouncer, schema, "hold", f"s{n}", f"bounced-w{n}", "--create")
                for n in range(3)
            ]
            for holder in holders:
                await holder.until("held")
                await holder.send({"followup": "hello"})
            for holder in holders:
                assert (await holder.until("turn_end"))["turn_end"] == "completed"
            await harness.sessions.post("s0", "posted from afar", mode="followup")
            assert (await holders[0].until("message"))["message"] == "posted from afar"
            assert (await holders[0].until("turn_end"))["turn_end"] == "completed"

            # Each worker's two direct connections (liveness, LISTEN) reach the server; its pool, PgBouncer.
            direct_now = direct_connections(superuser)
            assert all(direct_now.get(f"bounced-w{n}-direct") == 2 for n in range(3)), direct_now
            servers = [row for row in bouncer.show("SERVERS") if row["database"] == "postgres"]
            clients = [row for row in bouncer.show("CLIENTS") if row["database"] == "postgres"]
            print(f"PgBouncer: {len(clients)} clients on {len(servers)} server connections; direct: {direct_now}")
            assert len(servers) <= BOUNCER_POOL < len(clients), (servers, clients)
            assert {row["remote_pid"] for row in servers} <= {
                str(pid)
                for (pid,) in superuser.execute(
                    "SELECT pid FROM pg_stat_activity WHERE backend_type = 'client backend'"
                ).fetchall()
            }

            # kill -9 of s0's worker: the test's worker takes s0 over, with everything stored and posted.
            holders[0].signal(signal.SIGKILL)
            killed = time.perf_counter()
            async with await harness.agents.resume("s0") as agent:
                took = time.perf_counter() - killed
                print(f"takeover through PgBouncer after kill -9: {took * 1000:.1f} ms")
                assert texts(agent.session.events) == ["hello", "posted from afar"]
                claimed = trio.Event()

                def on_event(event: ev.Event) -> None:
                    if isinstance(event, ev.UserMessage) and event.text == "posted to the taker":
                        claimed.set()

                agent.session.observe(on_event)
                await harness.sessions.post("s0", "posted to the taker", mode="followup")  # through its LISTEN
                with trio.fail_after(30):
                    await claimed.wait()
                await agent.when_idle()
                agent.followup("after the takeover")
                await agent.when_idle()
            await holders[0].kill()
            stored = await main.load("s0")
            assert texts(stored.events) == ["hello", "posted from afar", "posted to the taker", "after the takeover"]
            ends = [e.reason for e in stored.events if isinstance(e, ev.TurnEnd)]
            assert ends == ["completed"] * 4, ends

            # The other workers carried on: a post reaches s1's worker, its turn is stored.
            await harness.sessions.post("s1", "still there?", mode="followup")
            assert (await holders[1].until("message"))["message"] == "still there?"
            assert (await holders[1].until("turn_end"))["turn_end"] == "completed"
            for holder in holders[1:]:
                assert await holder.close() == 0
        async with PostgresStore(postgres_cluster.dsn(), schema=schema) as plain:
            assert texts((await plain.load("s1")).events) == ["hello", "still there?"]
            assert texts((await plain.load("s2")).events) == ["hello"]
    finally:
        superuser.close()


@pytest.mark.parametrize("through", ["pgbouncer", "server"])
async def test_a_group_commit_lost_while_its_transaction_runs_on_is_read_back_once_it_ends_and_stored_once(
    postgres_cluster: Cluster,
    bouncer: PgBouncer,
    schema: str,
    store: PostgresStore,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    through: str,
) -> None:
    """The group's INSERT waits on an uncommitted row with the session's next seq; its client connection is
    shut under it, and its server transaction runs on.  Behind the transaction pooler the connection's backend
    pid is PgBouncer's, not a server process: the read-back must not take "no such process" for "ended" (it
    used to read back at once, find nothing and send the batch again, which met the original at the primary
    key).  It waits for the lost statement's lease locks instead: once the row's transaction rolls back the
    original commits, the read-back finds the batch, and the flush succeeds with it stored once, sent once."""
    await stored_session(store, "s1")
    dsn = bouncer.dsn(application_name="lost-group") if through == "pgbouncer" else postgres_cluster.dsn()
    pooled = PooledPostgresStore(
        dsn, direct_dsn=direct(postgres_cluster, "lost-group-direct"), schema=schema, write_timeout=30.0
    )
    conns: list[Any] = []
    original = _pg_group.GroupCommitter._send

    def recording(self: Any, sent: Any, conn: Any) -> Any:
        conns.append(conn)
        return original(self, sent, conn)

    monkeypatch.setattr(_pg_group.GroupCommitter, "_send", recording)
    superuser = admin(postgres_cluster)

    def waiting(fragment: str) -> bool:
        return bool(
            superuser.execute(
                "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE %s",
                (f"%{fragment}%",),
            ).fetchall()
        )

    async def until(predicate: Any, what: str) -> None:
        with trio.fail_after(30):
            while not predicate():
                assert "again" not in caplog.text, f"sent again before the lost transaction ended ({what})"
                await trio.sleep(0.005)  # polled: the server's waits show only in pg_stat_activity

    try:
        async with pooled:
            sessions = SessionRegistry(pooled)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            one_turn(entry.session, 2)
            finished: list[BaseException | None] = []

            with admin(postgres_cluster) as blocker, caplog.at_level(logging.INFO, "trio_harness.session.postgres"):
                blocker.execute("BEGIN")
                last = len(entry.session.events) - 1  # the key of the batch's row (session/_pg_rows.py)
                blocker.execute(f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('s1', %s, 'x')", (last,))
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(flush_noting, entry, finished)
                    await until(lambda: waiting("FOR SHARE OF le"), "the group commit waits on the row")
                    assert len(conns) == 1
                    _shut_socket(conns[0])  # the client side is lost; the server transaction runs on
                    await until(lambda: "the connection was lost" in caplog.text, "the loss is seen")
                    await until(lambda: waiting("FOR UPDATE"), "the read-back waits for the lost statement's locks")
                    assert waiting("FOR SHARE OF le") and finished == []
                    blocker.execute("ROLLBACK")  # the lost transaction goes on and commits
            assert finished == [None], finished
            assert "again" not in caplog.text and len(conns) == 1  # read back as stored, never sent again
            assert (await store.load("s1")).events == tuple(entry.session.events)
            one_turn(entry.session, 3)
            await entry.session.flush()
            await sessions.detach(entry)
        assert (await store.load("s1")).events == tuple(entry.session.events)
        stored = events_stored(superuser, schema, "s1")
        assert stored == len(entry.session.events), stored
    finally:
        superuser.close()


# ------------------------------------------------------------------ direct_dsn


@pytest.mark.parametrize("explicit", [False, True])
async def test_a_direct_url_through_a_transaction_pooler_is_refused_naming_it(
    postgres_cluster: Cluster, bouncer: PgBouncer, schema: str, store: PostgresStore, explicit: bool
) -> None:
    """The liveness lock and LISTEN must not share a server process with other clients: refused, not corrupted."""
    through = bouncer.dsn(application_name="refused")
    pooled = PooledPostgresStore(through, direct_dsn=through if explicit else None, schema=schema)
    with pytest.raises(SessionStoreError, match="goes through a transaction-pooling proxy") as caught:
        async with pooled:
            pass
    assert f"127.0.0.1:{bouncer.port}" in str(caught.value) and "direct_dsn" in str(caught.value)
    assert pooled._live is None and pooled._pool is None


async def test_a_direct_url_through_a_session_pooler_is_accepted(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    with pgbouncer_for(postgres_cluster, pool_mode="session", pool_size=4) as session_pooler:
        through = session_pooler.dsn(application_name="session-pooled")
        pooled = PooledPostgresStore(through, direct_dsn=through, schema=schema)
        async with pooled:
            assert pooled._live is not None and pooled._live_pid != pooled._live.info.backend_pid  # behind a proxy
            sessions = SessionRegistry(pooled)
            entry = sessions.enter(await sessions.prepare_new("s1", cwd="/w"))
            one_turn(entry.session, 1)
            await entry.session.flush()
            async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
                with pytest.raises(SessionLockedError):
                    await other.resume("s1")
            await sessions.detach(entry)
    assert len((await store.load("s1")).events) == 8


async def test_the_direct_url_holds_the_liveness_lock_and_the_listener_and_the_pool_uses_the_main_url(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    superuser = admin(postgres_cluster)
    pooled = PooledPostgresStore(
        postgres_cluster.dsn() + "&application_name=main-url",
        direct_dsn=postgres_cluster.dsn() + "&application_name=direct-url",
        schema=schema,
    )
    try:
        async with pooled:
            await stored_session(pooled, "s1")
            sessions = SessionRegistry(pooled)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            writer: Any = entry.writer
            writer.receive(_nothing)  # starts the mailbox listener
            listening = (
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'direct-url' AND query LIKE 'LISTEN%%'"
            )
            with trio.fail_after(30):
                while superuser.execute(listening).fetchone() != (1,):
                    await trio.sleep(0.01)  # bounded: the listener connects on its own task
            rows = dict(
                superuser.execute(
                    "SELECT application_name, count(*) FROM pg_stat_activity "
                    "WHERE application_name IN ('main-url', 'direct-url') GROUP BY application_name"
                ).fetchall()
            )
            assert rows["direct-url"] == 2 and 1 <= rows["main-url"] <= pooled.pool_size, rows
            assert pooled._live is not None
            locks = superuser.execute(
                "SELECT a.application_name FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.classid::bigint = %s AND l.objid::bigint = %s",
                ((pooled.worker_key >> 32) & 0xFFFFFFFF, pooled.worker_key & 0xFFFFFFFF),
            ).fetchall()
            assert locks == [("direct-url",)]
            await sessions.detach(entry)
    finally:
        superuser.close()


async def _nothing() -> None:
    pass


def test_a_direct_url_is_validated_like_the_main_one_and_never_shows_its_password() -> None:
    with pytest.raises(SessionStoreError, match="direct connection URL") as caught:
        PooledPostgresStore("postgresql://app@db/sessions", direct_dsn="postgresql://app:s3cret@[::1/db")
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    with pytest.raises(SessionStoreError, match="cannot be parsed") as main_url:
        PooledPostgresStore("postgresql://app:s3cret@[::1/db")
    assert "s3cret" not in str(main_url.value)  # it was in psycopg's part of the message
    with pytest.raises(TypeError, match="direct_dsn must be a str"):
        PooledPostgresStore("postgresql://app@db/sessions", direct_dsn=b"postgresql://db")  # type: ignore[arg-type]
    shown = repr(PooledPostgresStore("postgresql://app@db/x", direct_dsn="postgresql://app:s3cret@direct/x"))
    assert "s3cret" not in shown and "direct_dsn='postgresql://app:***@direct/x'" in shown


async def test_closing_a_pooled_store_leaves_no_liveness_connection_behind(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """The heartbeat stops before the liveness connection closes (it used to take the lock again meanwhile)."""
    superuser = admin(postgres_cluster)
    name = "closing-" + schema
    pooled = PooledPostgresStore(
        postgres_cluster.dsn() + f"&application_name={name}", schema=schema, heartbeat=0.02, idle_session_timeout=0.1
    )
    try:
        async with pooled:
            sessions = SessionRegistry(pooled)
            for number in range(150):  # closing releases each lease: the heartbeat runs meanwhile
                entry = sessions.enter(await sessions.prepare_new(f"s{number}", cwd="/w"))
                one_turn(entry.session, 1)
                await entry.session.flush()
        assert pooled._live is None

        def left() -> int:
            row = superuser.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = %s", (name,)
            ).fetchone()
            return int(row[0]) if row else 0

        # Every connection is closed on the client side; each server process leaves pg_stat_activity as it exits,
        # a moment later (under load, after this line): polled, bounded, so one left open still fails the test.
        with trio.move_on_after(WAIT):
            while left():
                await trio.sleep(0.01)
        assert left() == 0
    finally:
        superuser.close()


async def test_a_liveness_connection_no_longer_on_the_locks_server_process_fails_the_service(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """What the heartbeat sees behind a transaction pooler that the opening probe missed: the service fails."""
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=0.05, idle_session_timeout=None)
    failures: list[BaseException] = []
    try:
        async with pooled:
            assert pooled._live is not None and pooled._live_pid == pooled._live.info.backend_pid
            pooled._live_pid = -1  # as if the pooler now served the connection with another server process
            with trio.fail_after(30):
                await trio.sleep_forever()
    except BaseExceptionGroup as group:
        failures = [exc for exc in group.exceptions if isinstance(exc, SessionStoreError)]
    assert len(failures) == 1, failures
    assert "transaction-pooling proxy" in str(failures[0]) and "not -1 (the lock's)" in str(failures[0])


async def test_a_direct_url_that_cannot_connect_fails_the_opening_naming_it(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    pooled = PooledPostgresStore(postgres_cluster.dsn(), direct_dsn=postgres_cluster.dsn("no_such_db"), schema=schema)
    with pytest.raises(SessionStoreError, match="'no_such_db' does not exist") as caught:
        async with pooled:
            pass
    assert "dbname=no_such_db" in str(caught.value) or "/no_such_db" in str(caught.value)


# ------------------------------------------------------------------ the per-session mode behind a transaction pooler


async def test_the_per_session_mode_behind_a_transaction_pooler_fails_in_bounded_time_naming_it(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """A session's lock stays on PgBouncer's one server connection, which every other client then reaches:
    a resume (or a claim) finds each new connection holding advisory locks already, and fails saying why
    (it used to take new connections forever)."""
    await stored_session(store, "s1")
    await stored_session(store, "s2")
    with pgbouncer_for(postgres_cluster, pool_mode="transaction", pool_size=1) as bouncer:
        async with PostgresStore(bouncer.dsn(), schema=schema) as bounced:
            sessions = SessionRegistry(bounced)
            with trio.fail_after(60):  # bounded: a few connections, not a deadline of the store
                entry = sessions.enter(await sessions.prepare_resume("s1"))  # its lock on the server connection
                with pytest.raises(SessionStoreError, match="transaction-pooling proxy") as resumed:
                    await sessions.prepare_resume("s2")
                with pytest.raises(SessionStoreError, match="transaction-pooling proxy"):
                    await sessions.prepare_new("s3", cwd="/w")
                await sessions.detach(entry)
    assert "pool_mode = transaction" in str(resumed.value) and "'s2'" in str(resumed.value)
    assert "PooledPostgresStore" in str(resumed.value)
