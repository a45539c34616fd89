"""What only the PostgreSQL store promises: one live writer across processes, eviction, remote inboxes.

Real worker processes (``tests/_postgres.py``) hold sessions; the test kills,
freezes and races them.  The store-independent promises are in
``tests/test_store_conformance.py``.  See docs/postgres.rst.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import attrs
import psycopg
import pytest
import trio
import trio.testing
from _pg_modes import MODES, make, options
from _postgres import Cluster, admin, postgres_cluster, schema, store, worker_argv
from _util import WAIT, LineProcess

from trio_harness import (
    ModelSettings,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
    open_harness,
)
from trio_harness._cli import main as cli_main
from trio_harness.model import ScriptedModel
from trio_harness.session import (
    PooledPostgresStore,
    PostgresStore,
    Session,
    SessionEntry,
    SessionHeader,
    SessionRegistry,
)
from trio_harness.session import _events as ev
from trio_harness.session._events import Event, InboxMessage
from trio_harness.session._pg_schema import SCHEMA_VERSION, _lock_key
from trio_harness.session._pg_threads import _call

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest


def one_turn(session: Session, number: int, text: str = "do it") -> None:
    message_id = f"m{number}-{text}"
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage(message_id, text),))
    session.append(ev.TurnStart, turn=number)
    session.append(ev.StepStart, turn=number, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=(message_id,), outcome="claimed", turn=number)
    session.append(ev.UserMessage, turn=number, step=1, message_id=message_id, text=text)
    session.append(ev.AssistantMessage, turn=number, step=1, text="done")
    session.append(ev.StepEnd, turn=number, step=1)
    session.append(ev.TurnEnd, turn=number, reason="completed")


async def stored_session(persistence: PostgresStore, session_id: str, turns: int = 1) -> tuple[Event, ...]:
    store = SessionRegistry(persistence)
    session = await store.prepare_new(session_id, cwd="/work")
    entry = store.enter(session)
    for number in range(1, turns + 1):
        one_turn(session, number)
    await store.detach(entry)
    return tuple(session.events)


def backend_pid(entry: SessionEntry) -> int:
    """The server process of a live session's writer connection."""
    conn = entry.writer._conn  # type: ignore[attr-defined]
    assert conn is not None
    pid: int = conn.info.backend_pid
    return pid


# ------------------------------------------------------------------ worker processes


@attrs.define
class Worker(LineProcess):
    """A worker process (tests/_postgres.py) and its JSON lines."""

    async def until(self, key: str) -> dict[str, Any]:
        """The next line holding ``key`` (earlier lines are dropped)."""
        while True:
            line = await self.line()
            if key in line:
                return line

    async def send(self, value: object) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(json.dumps(value).encode() + b"\n")

    async def close(self) -> int:
        """Close stdin and wait for a clean exit."""
        assert self.process.stdin is not None
        await self.process.stdin.aclose()
        with trio.fail_after(WAIT):
            return await self.process.wait()

    def signal(self, number: int) -> None:
        os.kill(self.process.pid, number)

    async def kill(self) -> None:
        if self.process.poll() is None:
            self.signal(signal.SIGCONT)
            self.signal(signal.SIGKILL)
        with trio.CancelScope(shield=True):
            await self.process.wait()


@pytest.fixture(params=MODES)
async def either(
    request: pytest.FixtureRequest, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> AsyncIterator[PostgresStore]:
    """An open store of each mode on the (checked) schema of ``store``."""
    persistence = make(request.param, postgres_cluster.dsn(), schema)
    async with persistence:
        yield persistence


def mode_of(persistence: PostgresStore) -> str:
    return "pooled" if isinstance(persistence, PooledPostgresStore) else "per-session"


@pytest.fixture
async def workers() -> AsyncIterator[list[Worker]]:
    started: list[Worker] = []
    try:
        yield started
    finally:
        for worker in started:
            await worker.kill()


async def start_worker(
    started: list[Worker], cluster: Cluster, schema: str, command: str, session_id: str, *options: str
) -> Worker:
    worker = await Worker.start(worker_argv(command, cluster.dsn(), schema, session_id, *options))
    started.append(worker)
    await worker.until("ready")
    return worker


# ------------------------------------------------------------------ one live writer across processes


async def test_two_worker_processes_racing_for_one_session_exactly_one_wins(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    for round_number in range(3):
        session_id = f"contested-{round_number}"
        await stored_session(store, session_id)
        racers = [await start_worker(workers, postgres_cluster, schema, "race", session_id) for _ in range(2)]
        for racer in racers:
            await racer.send("go")
        results = [await racer.until("won") for racer in racers]
        assert sorted(result["won"] for result in results) == [False, True], results
        loser = next(result for result in results if not result["won"])
        assert loser["error"] == "SessionLockedError" and loser["locked"] is True
        for racer in racers:
            assert await racer.close() == 0
        workers.clear()


async def test_kill_9_of_the_holder_frees_the_session_at_once_for_another_worker(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    events = await stored_session(store, "s1")
    holder = await start_worker(workers, postgres_cluster, schema, "hold", "s1")
    await holder.until("held")
    with pytest.raises(SessionLockedError, match="live on another worker"):
        await SessionRegistry(store).prepare_resume("s1")
    taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0)
    async with taker:
        holder.signal(signal.SIGKILL)
        killed = time.perf_counter()
        resumed = await SessionRegistry(taker).prepare_resume("s1")
        took = time.perf_counter() - killed
        await holder.kill()
        assert tuple(resumed.events) == events
        print(f"takeover after kill -9: {took * 1000:.1f} ms")
        assert took < 1.0  # the goal is < 100 ms (bench/bench_store.py measures it); 1 s bounds a loaded machine


async def test_a_frozen_holder_is_evicted_within_its_idle_timeout_and_can_never_append_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    await stored_session(store, "s1")
    holder = await start_worker(
        workers, postgres_cluster, schema, "hold", "s1", "--heartbeat=0.2", "--idle-session-timeout=1.0"
    )
    held = await holder.until("held")
    with pytest.raises(SessionLockedError):
        await SessionRegistry(store).prepare_resume("s1")
    taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0)
    async with taker:
        sessions = SessionRegistry(taker)
        holder.signal(signal.SIGSTOP)
        frozen = time.perf_counter()
        resumed = await sessions.prepare_resume("s1")
        evicted = time.perf_counter() - frozen
        print(f"a frozen holder lost the session after {evicted:.2f} s (idle_session_timeout 1.0 s)")
        assert evicted < 1.0 + 1.0
        entry = sessions.enter(resumed)
        one_turn(resumed, 2, "taken over")
        await resumed.flush()
        holder.signal(signal.SIGCONT)
        # The thawed holder runs a turn: none of it may reach the stored log.
        await holder.send({"followup": "from the evicted worker"})
        failed = await holder.until("store_error")
        assert "s1" in failed["store_error"]
        await sessions.detach(entry)
        await holder.close()
    stored = (await store.load("s1")).events
    assert stored == tuple(resumed.events)
    texts = [e.text for e in stored if isinstance(e, ev.UserMessage)]
    assert texts == ["do it", "taken over"]
    assert held["events"] <= len(stored)


async def test_an_idle_holder_keeps_its_session_past_the_idle_timeout_through_its_heartbeat(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    quick = PostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=0.1, idle_session_timeout=0.5)
    async with quick:
        sessions = SessionRegistry(quick)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        pid = backend_pid(entry)
        await trio.sleep(1.5)  # the server's timer is real time: three idle timeouts pass
        with pytest.raises(SessionLockedError):
            await SessionRegistry(store).prepare_resume("s1")
        one_turn(entry.session, 2)
        await entry.session.flush()
        assert backend_pid(entry) == pid  # the same connection: never dropped, never taken again
        await sessions.detach(entry)


async def test_an_unsynced_flush_is_made_durable_by_the_next_synced_one_even_without_new_events(
    store: PostgresStore,
) -> None:
    sessions = SessionRegistry(store)
    entry = sessions.enter(await sessions.prepare_new("s1"))
    one_turn(entry.session, 1)
    await entry.session.flush()
    one_turn(entry.session, 2)
    writer: Any = entry.writer
    await entry.session.flush(sync=False)  # committed with synchronous_commit off
    assert writer._unsynced
    assert (await store.load("s1")).events == tuple(entry.session.events)
    await entry.session.flush()  # nothing new: one more commit, which waits for the WAL up to it
    assert not writer._unsynced
    await entry.session.flush()  # synced already: nothing to do
    await sessions.detach(entry)


# ------------------------------------------------------------------ lost locks in one process


@pytest.mark.parametrize("taker_still_holds", [True, False])
async def test_a_writer_whose_connection_was_killed_cannot_append_after_another_took_the_session(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, taker_still_holds: bool
) -> None:
    await stored_session(store, "s1")
    first = SessionRegistry(store)
    entry = first.enter(await first.prepare_resume("s1"))
    with admin(postgres_cluster) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid(entry),))
    taker = PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=10.0)
    async with taker:
        second = SessionRegistry(taker)
        taken = second.enter(await second.prepare_resume("s1"))
        one_turn(taken.session, 2, "the taker's turn")
        await taken.session.flush()
        if not taker_still_holds:
            await second.detach(taken)
        one_turn(entry.session, 2, "the stale writer's turn")
        with pytest.raises(SessionStoreError, match="cannot be written") as caught:
            await entry.session.flush()
        assert ("live on another worker" in str(caught.value)) is taker_still_holds
        with pytest.raises(SessionStoreError):  # and never again
            await entry.session.flush()
        stored = (await store.load("s1")).events
        assert stored == tuple(taken.session.events)
        if taker_still_holds:
            await second.detach(taken)
    with pytest.raises(SessionStoreError):
        await first.detach(entry)


async def test_a_lost_connection_is_taken_again_when_nobody_took_the_session(
    postgres_cluster: Cluster, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    sessions = SessionRegistry(store)
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    with admin(postgres_cluster) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid(entry),))
    one_turn(entry.session, 2)
    await entry.session.flush()  # reconnects, takes the session again, stores the batch
    assert (await store.load("s1")).events == tuple(entry.session.events)
    with pytest.raises(SessionLockedError):  # held again
        await SessionRegistry(store).prepare_resume("s1")
    await sessions.detach(entry)


async def test_a_batch_committed_before_the_connection_died_is_not_stored_twice(
    postgres_cluster: Cluster, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    sessions = SessionRegistry(store)
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    writer: Any = entry.writer
    one_turn(entry.session, 2)
    before = writer._stored
    pending = list(writer._buffer)
    await entry.session.flush()
    # As if the connection died during COMMIT: the writer does not know the
    # batch is stored, and holds it again.
    writer._stored, writer._buffer = before, pending
    with admin(postgres_cluster) as conn:
        conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid(entry),))
    await entry.session.flush()  # finds the batch stored, byte for byte
    assert (await store.load("s1")).events == tuple(entry.session.events)
    assert writer._stored == len(entry.session.events) and writer._buffer == []
    await sessions.detach(entry)


async def test_fork_copies_the_events_on_the_server(
    either: PostgresStore, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    events = await stored_session(either, "parent", turns=2)

    async def no_save(self: object, header: object, events: object) -> None:
        raise AssertionError("the events were sent back to the server")

    monkeypatch.setattr(PostgresStore, "save", no_save)
    child = await SessionRegistry(either).fork("parent", len(events) // 2, "child")
    assert (await store.load("child")).events == events[: len(events) // 2]
    assert child.seed_length == len(events) // 2


# ------------------------------------------------------------------ cancellation


async def test_a_flush_cancelled_mid_transaction_is_rolled_back_and_the_connection_stays_usable(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    sessions = SessionRegistry(store)
    entry = sessions.enter(await sessions.prepare_resume("s1"))
    first_new = len(entry.session)
    pid = backend_pid(entry)
    one_turn(entry.session, 2)
    with admin(postgres_cluster) as blocker, admin(postgres_cluster) as watcher:
        # An uncommitted row with the batch's last seq: the batch's INSERT waits for it.
        blocker.execute("BEGIN")
        blocker.execute(
            f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('s1', %s, 'x')",
            (len(entry.session) - 1,),
        )
        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(entry.session.flush)
                with trio.fail_after(WAIT):  # until the server shows the INSERT waiting on the row
                    while not await trio.to_thread.run_sync(
                        lambda: (
                            watcher.execute(
                                "SELECT wait_event_type = 'Lock' FROM pg_stat_activity WHERE pid = %s", (pid,)
                            ).fetchone()
                            == (True,)
                        )
                    ):
                        await trio.sleep(0.005)
                scope.cancel()
        assert scope.cancelled_caught
        # Rolled back: nothing of the batch is stored, and the server is not running it any more.
        stored = (await store.load("s1")).events
        assert len(stored) == first_new
        state = watcher.execute("SELECT state FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone()
        assert state == ("idle",)
        blocker.execute("ROLLBACK")
    await entry.session.flush()  # the same connection stores the batch now
    assert backend_pid(entry) == pid
    assert (await store.load("s1")).events == tuple(entry.session.events)
    await sessions.detach(entry)


async def test_a_call_cancelled_after_its_statement_completed_reports_the_result_to_settle(
    postgres_cluster: Cluster,
) -> None:
    started, release = threading.Event(), threading.Event()
    settled: list[int] = []
    with admin(postgres_cluster) as conn:

        def job() -> int:
            started.set()
            release.wait()
            return 42

        with trio.CancelScope() as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(lambda: _call(conn, job, settle=settled.append))
                await trio.to_thread.run_sync(started.wait)
                scope.cancel()
                release.set()
        assert scope.cancelled_caught
        assert settled == [42]


@pytest.mark.parametrize("order", ["cancelled while connecting", "cancelled after the thread connected"])
async def test_a_connect_cancelled_at_any_point_leaves_no_connection_open(
    postgres_cluster: Cluster, schema: str, order: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema)
    real = trio.to_thread.run_sync
    made: list[psycopg.Connection[Any]] = []
    real_connect = psycopg.connect

    def connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = real_connect(*args, **kwargs)
        made.append(conn)
        if order == "cancelled while connecting":
            trio.from_thread.run_sync(scope.cancel)  # the caller leaves before the thread hands it over
        return conn

    async def run_sync(fn: Any, *args: Any, **kwargs: Any) -> Any:
        result = await real(fn, *args, **kwargs)
        if order == "cancelled after the thread connected":
            # Trio drops an abandoned thread's result when the cancel wins the race with its
            # report: force that order.
            scope.cancel()
            await trio.lowlevel.checkpoint()
        return result

    monkeypatch.setattr(psycopg, "connect", connect)
    monkeypatch.setattr(trio.to_thread, "run_sync", run_sync)
    with trio.CancelScope() as scope:
        await persistence._connect_once()
    monkeypatch.undo()
    assert scope.cancelled_caught
    (conn,) = made
    with trio.fail_after(WAIT):
        while not conn.closed:  # the abandoned thread closes it after the caller left
            await trio.sleep(0.01)


# ------------------------------------------------------------------ clear errors


async def test_a_bad_dsn_is_refused_at_construction_without_its_password() -> None:
    with pytest.raises(SessionStoreError, match="cannot be parsed") as caught:
        PostgresStore("host=x password=s3cret bogus")
    assert "s3cret" not in str(caught.value)


async def test_a_missing_database_is_named_with_what_to_do(postgres_cluster: Cluster) -> None:
    persistence = PostgresStore(postgres_cluster.dsn(dbname="no_such_db"))
    with pytest.raises(SessionStoreError, match=r"database 'no_such_db' does not exist.*createdb no_such_db"):
        await persistence.check()


async def test_a_missing_role_is_named(postgres_cluster: Cluster) -> None:
    persistence = PostgresStore(postgres_cluster.dsn(user="nobody_here"))
    with pytest.raises(SessionStoreError, match=r"role .* does not exist"):
        await persistence.check()


async def test_connection_settings_of_the_dsn_win_over_the_store_defaults(postgres_cluster: Cluster) -> None:
    persistence = PostgresStore(postgres_cluster.dsn() + "&connect_timeout=7&application_name=mine")
    conn = await persistence._connect_once()
    try:
        parameters = conn.info.get_parameters()
        assert parameters["connect_timeout"] == "7" and parameters["application_name"] == "mine"
    finally:
        conn.close()
    conn = await PostgresStore(postgres_cluster.dsn(), connect_timeout=30.0)._connect_once()
    try:
        assert conn.info.get_parameters()["connect_timeout"] == "30"  # per attempt, from the store's setting
    finally:
        conn.close()


async def test_an_unreachable_server_is_retried_with_backoff_then_reported_without_the_password(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    dsn = f"postgresql://someone:s3cret@/db?host={tmp_path}&port=5999"
    persistence = PostgresStore(dsn, connect_timeout=3.0)
    with pytest.raises(SessionStoreError, match=r"cannot connect to PostgreSQL .* \(retried for 3 s\)") as caught:
        await persistence.check()
    assert "s3cret" not in str(caught.value) and "***" in str(caught.value)
    assert trio.current_time() >= 2.0  # it kept trying, on Trio's clock


@pytest.mark.parametrize("mode", MODES)
async def test_a_role_without_privileges_is_told_what_to_grant(
    mode: str, postgres_cluster: Cluster, schema: str
) -> None:
    role = f"lowly_{schema}"
    postgres_cluster.psql(f"CREATE ROLE {role} LOGIN")
    try:
        # It may not create the tables...
        with pytest.raises(SessionStoreError, match="permission denied"):
            await PostgresStore(postgres_cluster.dsn(user=role), schema=schema).check()
        # ...and once an owner created them, it may not use them until granted.
        await PostgresStore(postgres_cluster.dsn(), schema=schema).check()
        postgres_cluster.psql(f"GRANT USAGE ON SCHEMA {schema} TO {role}")
        postgres_cluster.psql(f"GRANT SELECT ON {schema}.schema_version TO {role}")
        with pytest.raises(SessionStoreError, match=r"lacks SELECT on sessions.*GRANT SELECT, INSERT, DELETE"):
            await PostgresStore(postgres_cluster.dsn(user=role), schema=schema).check()
        postgres_cluster.psql(f"GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        # Both modes take sessions through the leases (a pooled take upserts one, a per-session take fences it).
        with pytest.raises(SessionStoreError, match=rf"lacks UPDATE on leases;.*GRANT UPDATE ON \"{schema}\".leases"):
            await make(mode, postgres_cluster.dsn(user=role), schema).check()
        postgres_cluster.psql(f"GRANT UPDATE ON {schema}.leases TO {role}")
        limited = make(mode, postgres_cluster.dsn(user=role), schema)
        await limited.check()
        async with limited:
            events = await stored_session(limited, "by-the-limited-role")
            assert (await limited.load("by-the-limited-role")).events == events
    finally:
        postgres_cluster.psql(f"DROP OWNED BY {role}; DROP ROLE {role}")


@pytest.mark.parametrize("mode", MODES)
async def test_using_a_store_that_is_not_open_says_how_to_open_it(
    mode: str, postgres_cluster: Cluster, schema: str
) -> None:
    persistence = make(mode, postgres_cluster.dsn(), schema)
    await persistence.check()  # needs no service
    with pytest.raises(SessionStoreError, match="is not open: use `async with`"):
        await persistence.list()
    with pytest.raises(SessionStoreError, match="is not open: use `async with`"):
        await persistence.open_writer(SessionHeader(id="s1", created_at=1.0))
    with pytest.raises(SessionStoreError, match="is not open: use `async with`"):
        await persistence.resume("s1")


# ------------------------------------------------------------------ schema


async def test_the_migration_is_idempotent_versioned_and_safe_from_many_workers_at_once(
    postgres_cluster: Cluster, schema: str
) -> None:
    async with trio.open_nursery() as nursery:
        for _ in range(5):
            nursery.start_soon(PostgresStore(postgres_cluster.dsn(), schema=schema).check)
    await PostgresStore(postgres_cluster.dsn(), schema=schema).check()
    rows = postgres_cluster.psql(f"SELECT version FROM {schema}.schema_version")
    assert rows.split() == [str(version) for version in range(1, SCHEMA_VERSION + 1)]  # one row per migration
    postgres_cluster.psql(f"INSERT INTO {schema}.schema_version (version) VALUES ({SCHEMA_VERSION + 1})")
    with pytest.raises(SessionStoreError, match="newer trio-harness"):
        await PostgresStore(postgres_cluster.dsn(), schema=schema).check()


@pytest.mark.parametrize("leases", ["without", "with"])
async def test_a_version_2_schema_gets_its_leases_from_check_and_a_pooled_store_refuses_it_until_then(
    leases: str, postgres_cluster: Cluster, schema: str
) -> None:
    owner = make("per-session", postgres_cluster.dsn(), schema)
    await owner.check()
    async with owner:
        events = await stored_session(owner, "kept")
    # Back to version 2, as an older trio-harness left it: no leases table, or the one its pooled workers created.
    postgres_cluster.psql(f"DELETE FROM {schema}.schema_version WHERE version >= 3")
    postgres_cluster.psql(f"ALTER TABLE {schema}.events DROP COLUMN n")
    if leases == "without":
        postgres_cluster.psql(f"DROP TABLE {schema}.leases")
    else:
        postgres_cluster.psql(f"INSERT INTO {schema}.leases VALUES ('kept', NULL, NULL, 7)")
    pooled = make("pooled", postgres_cluster.dsn(), schema)
    with pytest.raises(SessionStoreError, match="are at version 2; run check"):
        async with pooled:
            pass
    await pooled.check()
    rows = postgres_cluster.psql(f"SELECT version FROM {schema}.schema_version ORDER BY version")
    assert rows.split() == ["1", "2", "3", "4"]
    async with pooled:
        loaded, writer = await pooled.resume("kept")
        assert loaded.events == events
        await writer.aclose()
    epochs = postgres_cluster.psql(f"SELECT epoch FROM {schema}.leases WHERE session_id = 'kept'")
    assert epochs.split() == ["8" if leases == "with" else "1"]  # an old lease row kept: epochs never repeat


async def test_settings_out_of_range_are_refused(postgres_cluster: Cluster) -> None:
    with pytest.raises(ValueError, match="heartbeat"):
        PostgresStore(postgres_cluster.dsn(), heartbeat=1.5, idle_session_timeout=2.0)
    with pytest.raises(ValueError, match="pool_size"):
        PostgresStore(postgres_cluster.dsn(), pool_size=0)
    with pytest.raises(ValueError, match="schema"):
        PostgresStore(postgres_cluster.dsn(), schema="")


async def test_shared_connections_stay_within_the_pool_size(postgres_cluster: Cluster, schema: str) -> None:
    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=2)
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        peak = 0
        with admin(postgres_cluster) as conn:

            async def load() -> None:
                nonlocal peak
                await persistence.load("s1")
                count = conn.execute(
                    "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'trio-harness' "
                    "AND datname = 'postgres' AND pid <> pg_backend_pid()"
                ).fetchone()
                assert count is not None
                peak = max(peak, count[0])

            before = conn.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE application_name = 'trio-harness'"
            ).fetchone()
            async with trio.open_nursery() as nursery:
                for _ in range(10):
                    nursery.start_soon(load)
        assert before is not None
        assert peak <= before[0] + 2


# ------------------------------------------------------------------ remote inbox


async def test_posted_messages_reach_a_live_agent_once_and_in_order(
    either: PostgresStore, store: PostgresStore
) -> None:
    async with open_harness(model=ScriptedModel([]), store=either, builtin_tools=False) as harness:
        async with harness.agents.open(session_id="agent") as agent:
            spliced: list[str] = []
            ids: list[str] = []
            done = trio.Event()

            def watch(event: Event) -> None:
                if isinstance(event, ev.InboxSpliced):
                    spliced.extend(message.id for message in event.inserted)
                    if len(spliced) == 21:
                        done.set()

            agent.session.observe(watch)
            ids.append(agent.inject("stored before the posts"))
            await agent.session.flush()
            ids += [await harness.sessions.post("agent", f"note {n}", mode="inject") for n in range(20)]
            with trio.fail_after(WAIT):
                await done.wait()
            await agent.session.flush()  # after the flush that removes them from the mailbox (or as it)
            assert spliced == ids
            assert await store.pending_mail("agent") == []
    stored = (await store.load("agent")).events
    inserted = [m.id for e in stored if isinstance(e, ev.InboxSpliced) for m in e.inserted]
    assert inserted == ids


async def test_a_posted_message_keeps_every_field_and_old_mailbox_rows_still_read(
    store: PostgresStore, postgres_cluster: Cluster, schema: str
) -> None:
    await stored_session(store, "mail")
    notice = InboxMessage("m1", "task done", "inject", origin="task-notice", settings=ModelSettings(temperature=0.2))
    await store.post("mail", notice)
    with admin(postgres_cluster) as conn:  # a row as the previous release wrote it
        conn.execute(
            f'INSERT INTO "{schema}".mailbox (session_id, body) VALUES (%s, %s)',
            ("mail", json.dumps({"id": "m2", "text": "hi", "mode": "followup"})),
        )
    assert await store.pending_mail("mail") == [notice, InboxMessage("m2", "hi", "followup")]


async def test_posting_to_an_unknown_session_is_refused(either: PostgresStore) -> None:
    with pytest.raises(SessionNotFoundError):
        await either.post("nobody", InboxMessage("m1", "hi"))


@pytest.mark.parametrize("mode", MODES)
async def test_remote_delivery_across_two_processes(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    await stored_session(store, "remote")
    holder = await start_worker(workers, postgres_cluster, schema, "hold", "remote", *options(mode))
    await holder.until("held")
    poster = SessionRegistry(store)  # this process holds nothing: the worker does
    texts = ["first", "second", "third"]
    posted_at: list[float] = []
    for text in texts:
        posted_at.append(time.perf_counter())
        await poster.post("remote", text)
    received = []
    for _ in texts:
        line = await holder.until("message")
        received.append((line["message"], time.perf_counter()))
    assert [text for text, _ in received] == texts
    print(f"{mode}: post to wake-up (first message): {(received[0][1] - posted_at[0]) * 1000:.1f} ms")
    assert await holder.close() == 0
    stored = (await store.load("remote")).events
    claimed = [e.text for e in stored if isinstance(e, ev.UserMessage)]
    assert claimed == ["do it", *texts]
    assert await store.pending_mail("remote") == []


async def test_a_message_posted_to_a_holder_that_crashes_is_delivered_once_on_resume(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, either: PostgresStore, workers: list[Worker]
) -> None:
    await stored_session(store, "fragile")
    holder = await start_worker(workers, postgres_cluster, schema, "hold", "fragile", *options(mode_of(either)))
    await holder.until("held")
    holder.signal(signal.SIGSTOP)  # it cannot take the message...
    await SessionRegistry(store).post("fragile", "are you there?")
    await holder.kill()  # ...and dies with it posted, undelivered
    assert [m.text for m in await store.pending_mail("fragile")] == ["are you there?"]
    for attempt in range(2):
        model = ScriptedModel([{"text": "yes"}])
        async with open_harness(model=model, store=either, builtin_tools=False) as harness:
            async with harness.agents.open(session_id="fragile", resume=True) as agent:
                if attempt == 0:
                    done = trio.Event()

                    def on_event(event: Event, done: trio.Event = done) -> None:
                        if isinstance(event, ev.TurnEnd):
                            done.set()

                    agent.session.observe(on_event)
                    with trio.fail_after(WAIT):
                        await done.wait()
                await agent.when_idle()
                texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
                assert texts == ["do it", "are you there?"]  # once, also after the second resume
    assert await store.pending_mail("fragile") == []


async def test_a_holder_that_loses_its_session_while_taking_a_post_does_not_act_on_it(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, either: PostgresStore
) -> None:
    # The holder reads a posted message from the mailbox, then loses the
    # session before the transaction that stores the splice and deletes the
    # mail commits; the next holder takes the session and the message.  Only
    # one of them may act on it: one model request in all.
    await stored_session(store, "contested")

    def steal(conn: psycopg.Connection[Any], entry: SessionEntry) -> None:
        if isinstance(either, PooledPostgresStore):
            assert either._live is not None
            conn.execute("SELECT pg_terminate_backend(%s, 5000)", (either._live.info.backend_pid,))
            conn.execute("SELECT pg_advisory_lock(4242)")  # the thief's liveness lock
            conn.execute(
                f'UPDATE "{schema}".leases SET worker_id = %s, worker_key = 4242, epoch = epoch + 1 '
                "WHERE session_id = 'contested'",
                ("thief",),
            )
        else:
            conn.execute("SELECT pg_terminate_backend(%s)", (backend_pid(entry),))
            conn.execute("SELECT pg_advisory_lock(%s)", (_lock_key(schema, "contested"),))

    thief: list[psycopg.Connection[Any]] = []
    model_a = ScriptedModel([{"text": "the stale holder's answer"}])
    model_b = ScriptedModel([{"text": "the answer"}])
    lost: list[SessionStoreError] = []
    try:
        async with open_harness(model=model_a, store=either, builtin_tools=False) as harness_a:
            async with harness_a.agents.open(session_id="contested", resume=True) as agent_a:
                entry = harness_a.sessions._live["contested"]
                spliced = trio.Event()

                def lose_the_session(event: Event) -> None:
                    if isinstance(event, ev.InboxSpliced) and event.inserted and not thief:
                        # Between the splice and its commit: the connection dies
                        # and another worker takes the session's lock (pooled:
                        # the liveness connection dies and another worker takes the lease).
                        conn = psycopg.connect(postgres_cluster.dsn(), autocommit=True)
                        thief.append(conn)
                        steal(conn, entry)
                        spliced.set()

                agent_a.session.observe(lose_the_session)
                await SessionRegistry(store).post("contested", "only once, please")
                with trio.fail_after(WAIT):
                    await spliced.wait()
                with pytest.raises(SessionStoreError):  # queued behind the delivery's flush, which failed too
                    await agent_a.session.flush()
                await agent_a.when_idle()
                assert agent_a.status == "idle"
    except* SessionStoreError as group:  # the stale holder's final flush fails, and says so
        lost += [exc for exc in group.exceptions if isinstance(exc, SessionStoreError)]
    finally:
        for conn in thief:  # the other worker gives the session up (unlocked before its backend goes away)
            if isinstance(either, PooledPostgresStore):
                conn.execute(f'UPDATE "{schema}".leases SET worker_id = NULL WHERE worker_id = %s', ("thief",))
            conn.execute("SELECT pg_advisory_unlock_all()")
            conn.close()
    assert lost and all(exc.session_id == "contested" for exc in lost)
    assert model_a.requests == []  # the stale holder did not act on the message
    async with open_harness(model=model_b, store=either, builtin_tools=False) as harness_b:
        async with harness_b.agents.open(session_id="contested", resume=True) as agent_b:
            with trio.fail_after(WAIT):
                while not model_b.requests or agent_b.status != "idle":
                    await trio.sleep(0.01)
    assert len(model_b.requests) == 1
    stored = (await store.load("contested")).events
    assert [e.text for e in stored if isinstance(e, ev.UserMessage)] == ["do it", "only once, please"]
    assert await store.pending_mail("contested") == []


# ------------------------------------------------------------------ selection by URL


def test_the_command_line_lists_and_shows_sessions_of_a_postgresql_store(
    postgres_cluster: Cluster, schema: str, capsys: pytest.CaptureFixture[str]
) -> None:
    dsn = postgres_cluster.dsn()

    async def fill() -> None:
        # open_harness(store=URL) selects the store by its URL (schema trio_harness).
        async with open_harness(model=ScriptedModel([{"text": "hello there"}]), store=dsn) as harness:
            async with harness.agents.open(session_id=f"cli-{schema}") as agent:
                agent.followup("hi from the cli test")
                await agent.when_idle()

    trio.run(fill)
    assert cli_main(["sessions", "list", "--store", dsn]) == 0
    listing = capsys.readouterr().out
    assert f"cli-{schema}" in listing and "hi from the cli test" in listing
    assert cli_main(["sessions", "show", f"cli-{schema}", "--store", dsn]) == 0
    shown = capsys.readouterr().out
    assert "hello there" in shown
    assert cli_main(["sessions", "show", "missing-one", "--store", dsn]) == 2


@pytest.mark.parametrize("mode", MODES)
async def test_posts_from_several_workers_across_killed_holders_are_delivered_exactly_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, workers: list[Worker]
) -> None:
    """Three workers post while the session's holder is killed (``kill -9``) twice and taken over each time."""
    await stored_session(store, "hub")
    posters = [make(mode, postgres_cluster.dsn(), schema) for _ in range(3)]
    posted: list[str] = []
    stop = trio.Event()

    async def post_from(number: int, poster: PostgresStore) -> None:
        # Posting all along: while a holder lives, while it is dead, while the next one takes over.
        sessions = SessionRegistry(poster)
        n = 0
        while not stop.is_set() or n < 3:
            posted.append(await sessions.post("hub", f"worker {number} message {n}"))
            n += 1
            await trio.sleep(0.2)

    holder_options = ("--lock-timeout=20", *options(mode))
    async with posters[0], posters[1], posters[2]:
        holder = await start_worker(workers, postgres_cluster, schema, "hold", "hub", *holder_options)
        await holder.until("held")
        async with trio.open_nursery() as nursery:
            for number, poster in enumerate(posters):
                nursery.start_soon(post_from, number, poster)
            for _ in range(2):  # kill the holder once it took a message; the next one takes over
                await holder.until("message")
                holder.signal(signal.SIGKILL)
                await holder.kill()
                holder = await start_worker(workers, postgres_cluster, schema, "hold", "hub", *holder_options)
                await holder.until("held")
            stop.set()
        print(f"{mode}: {len(posted)} messages posted from 3 workers across 2 killed holders")

        def inserted(events: tuple[Event, ...]) -> list[str]:
            return [m.id for e in events if isinstance(e, ev.InboxSpliced) for m in e.inserted if m.id in posted]

        with trio.fail_after(WAIT):  # the last holder takes every message and stores its splice
            while len(inserted((await store.load("hub")).events)) < len(posted) or await store.pending_mail("hub"):
                await trio.sleep(0.05)
        assert await holder.close() == 0
    stored = inserted((await store.load("hub")).events)
    assert sorted(stored) == sorted(posted)  # each once: none lost with a killed holder, none spliced twice
    assert await store.pending_mail("hub") == []
