"""Races of a pooled worker's takes (session/_pg_pooled.py): with the heartbeat's retry of a failed release, and
with the server still committing a take whose connection was lost.

Real cluster; the TCP proxy of tests/_postgres.py loses a connection right after its COMMIT is sent, and a
deferred constraint trigger holds that COMMIT on the server (a real lock wait).
"""

from __future__ import annotations

import logging
from typing import Any

import psycopg
import pytest
import trio
from _pg_modes import a_release_that_timed_out, leases_of
from _postgres import Cluster, admin, postgres_cluster, proxy_for, schema, store
from test_postgres_store import one_turn, stored_session

from trio_harness import SessionError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry
from trio_harness.session._pg_schema import _lock_key

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

WITHIN = 30.0


async def test_a_resume_while_the_heartbeat_retries_the_release_waits_for_it_instead_of_being_refused(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    await stored_session(store, "s1")
    async with a_release_that_timed_out(postgres_cluster, schema, caplog, release_timeout=2.0) as timed_out:
        first, sessions = timed_out.store, timed_out.sessions
        with trio.fail_after(WITHIN):  # the heartbeat's retry, in flight (waiting for the lock)
            while "s1" not in first._taking:
                await trio.sleep(0.01)

        def resume_waits() -> bool:
            releasing = first._releasing.get("s1")
            return releasing is not None and releasing.statistics().tasks_waiting > 0

        async def unlock_once_the_resume_waits() -> None:
            with trio.move_on_after(WITHIN):
                while not resume_waits():
                    await trio.sleep(0.01)
            timed_out.unlock()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(unlock_once_the_resume_waits)
            # Not "already live in this process": the session is only being released; the resume takes it.
            again = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(again.session, 2)
        await sessions.detach(again)
        assert first._unreleased == {}
    assert len((await store.load("s1")).events) == len(again.session.events)


# ------------------------------------------------------------------ a take whose connection is lost mid-COMMIT


def _commit_gate(superuser: psycopg.Connection[Any], schema: str) -> None:
    """Hold every COMMIT of a lease change on the server until the gate lock (GATE) is let go.

    A deferred constraint trigger runs inside COMMIT, with the transaction's
    locks held (the session's advisory lock of a take among them): the COMMIT
    of a take waits there for the admin's lock, after which it commits.
    """
    superuser.execute(
        f'CREATE FUNCTION "{schema}".commit_gate() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN '
        f"PERFORM pg_advisory_lock_shared({GATE[0]}, {GATE[1]}); "
        f"PERFORM pg_advisory_unlock_shared({GATE[0]}, {GATE[1]}); RETURN NULL; END $$"
    )
    superuser.execute(
        f'CREATE CONSTRAINT TRIGGER commit_gate AFTER INSERT OR UPDATE ON "{schema}".leases '
        f'DEFERRABLE INITIALLY DEFERRED FOR EACH ROW EXECUTE FUNCTION "{schema}".commit_gate()'
    )


GATE = (4242, 28)  # a two-key advisory lock: never a session's (those have one bigint key)


def _waiting_for(superuser: psycopg.Connection[Any], key: int) -> bool:
    """Whether a server process waits for the advisory lock ``key`` (not granted yet)."""
    row = superuser.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND NOT granted AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
    ).fetchone()
    return row is not None and row[0] > 0


@pytest.mark.parametrize("take", ["create", "resume"])
async def test_a_take_whose_connection_is_lost_mid_commit_is_found_and_leaves_no_stray_lease(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, take: str
) -> None:
    """The take's COMMIT is held on the server (the lock of the session still held by it) while its connection
    is lost: the take run again on a new connection waits for it, finds the lease it committed, and takes it."""
    if take == "resume":
        await stored_session(store, "s1")
    superuser = admin(postgres_cluster)
    try:
        _commit_gate(superuser, schema)
        key = _lock_key(schema, "s1")
        with proxy_for(postgres_cluster) as proxy:
            pooled = PooledPostgresStore(proxy.dsn(), direct_dsn=postgres_cluster.dsn(), schema=schema)
            async with pooled:
                sessions = SessionRegistry(pooled)
                superuser.execute("SELECT pg_advisory_lock(%s, %s)", GATE)
                gated = True
                fired = proxy.drop_after(b"COMMIT")  # the take's: its connection closed once COMMIT is sent
                outcome: list[Any] = []

                async def open_it() -> None:
                    try:
                        if take == "create":
                            outcome.append(await sessions.prepare_new("s1", cwd="/w"))
                        else:
                            outcome.append(await sessions.prepare_resume("s1"))
                    except SessionError as exc:
                        outcome.append(exc)

                try:
                    async with trio.open_nursery() as nursery:
                        nursery.start_soon(open_it)
                        with trio.fail_after(WITHIN):
                            while not fired.is_set():
                                await trio.sleep(0.005)
                            # The lost take is inside its COMMIT (at the gate), holding the session's lock; the
                            # take run again waits for that lock (or, refused, has given up already).
                            while not outcome and not _waiting_for(superuser, key):
                                await trio.sleep(0.005)
                        superuser.execute("SELECT pg_advisory_unlock(%s, %s)", GATE)  # the lost COMMIT completes
                        gated = False
                finally:
                    if gated:
                        superuser.execute("SELECT pg_advisory_unlock(%s, %s)", GATE)
                (session,) = outcome
                assert not isinstance(session, BaseException), session
                entry = sessions.enter(session)
                one_turn(session, 1)
                await sessions.detach(entry)
                assert pooled._unreleased == {}
                assert leases_of(superuser, schema, pooled.worker_id) == []  # no stray lease of this worker
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:  # free for another worker
            others = SessionRegistry(other)
            await others.detach(others.enter(await others.prepare_resume("s1")))
    finally:
        superuser.close()


# ------------------------------------------------------------------ the same store opened again


def _lock_gone(superuser: psycopg.Connection[Any], key: int) -> bool:
    row = superuser.execute(
        "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
    ).fetchone()
    return row == (0,)


async def test_a_lease_left_unreleased_stays_free_when_the_same_store_opens_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    """A lease whose release failed is free once the store closes (its liveness lock gone); the store opened
    again is a new worker (a new worker_id), so the lease does not come back to life under its new lock."""
    await stored_session(store, "s1")
    # No heartbeat within the test: nothing retries the failed release meanwhile.
    pooled = PooledPostgresStore(
        postgres_cluster.dsn(), schema=schema, release_timeout=0.5, heartbeat=3600, idle_session_timeout=None
    )
    superuser = admin(postgres_cluster)
    try:
        async with pooled:
            first_id, first_key = pooled.worker_id, pooled.worker_key
            sessions = SessionRegistry(pooled)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            superuser.execute("BEGIN")
            superuser.execute(f"LOCK TABLE {schema}.leases IN EXCLUSIVE MODE")  # the release waits, then gives up
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                await sessions.detach(entry)
            assert "releasing its lease failed" in caplog.text
            assert set(pooled._unreleased) == {"s1"}
        superuser.execute("COMMIT")
        assert leases_of(superuser, schema, first_id) == ["s1"]  # left behind, free: its worker's lock is gone
        with trio.fail_after(WITHIN):
            while not _lock_gone(superuser, first_key):  # the server ends the closed liveness connection
                await trio.sleep(0.01)
        async with pooled:
            assert pooled.worker_id != first_id and pooled.worker_key != first_key
            assert pooled._unreleased == {}
            # Another worker takes the session at once (lock_timeout 0: no waiting for a release).
            async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
                others = SessionRegistry(other)
                await others.detach(others.enter(await others.prepare_resume("s1")))
            # And so does this one, as the new worker it is.
            again = sessions.enter(await sessions.prepare_resume("s1"))
            await sessions.detach(again)
            assert leases_of(superuser, schema, pooled.worker_id) == []
    finally:
        if superuser.info.transaction_status != 0:
            superuser.execute("COMMIT")
        superuser.close()
