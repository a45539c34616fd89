"""The group commit's statements sent and read from the Trio thread (session/_pg_wire.py), and its slots.

Real cluster (tests/_postgres.py).  A statement larger than the socket takes
at once is written as the socket drains; one libpq could not take on a
connection lost while idle goes out on another; a settled group's slot goes
to what queued meanwhile before the flushes it woke run.
"""

from __future__ import annotations

from typing import Any

import psycopg
import pytest
import trio
from _postgres import Cluster, events_stored, postgres_cluster, schema, store, superuser
from _util import WAIT
from test_postgres_group import flush_at_once
from test_postgres_store import one_turn, stored_session

from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_group
from trio_harness.session import _events as ev

__all__ = ["postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest


async def stored_sessions(store: PostgresStore, count: int) -> list[str]:
    """``count`` sessions ``s0``, ``s1``, ... stored with one turn each (:func:`stored_session`): their ids."""
    names = [f"s{number}" for number in range(count)]
    for name in names:
        await stored_session(store, name)
    return names


async def test_a_group_statement_larger_than_the_socket_takes_is_written_as_it_drains_and_stored_whole(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Forty flushes of half a megabyte each: one statement of 20 MB, far more than a socket's buffer."""
    waits: list[int] = []
    real_wait_writable = trio.lowlevel.wait_writable

    async def wait_writable(fd: Any) -> None:
        waits.append(fd)
        await real_wait_writable(fd)

    monkeypatch.setattr(trio.lowlevel, "wait_writable", wait_writable)
    names = await stored_sessions(store, 40)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in names]
        for number, entry in enumerate(entries):
            entry.session.append(ev.AssistantMessage, turn=2, step=1, text=f"{number} " + "x" * 500_000)
        assert list((await flush_at_once(entries)).values()) == [None] * 40
        assert sum(pooled._group._groups) == 40
        assert waits, "the statement went out in one write: not the case this test is for"
        for entry in entries:
            assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
            await sessions.detach(entry)


@pytest.mark.parametrize("sent_by", ["committer", "flush"])
async def test_a_group_libpq_could_not_take_on_a_connection_lost_while_idle_goes_out_on_another(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    sent_by: str,
) -> None:
    """The first send finds its connection gone (closed under it): nothing reached the server, so the group
    is sent on a new connection and the flush succeeds, its batch stored once."""
    if sent_by == "flush":
        monkeypatch.setattr(_pg_group, "_EAGER", 1)
    real_begin = _pg_group.begin  # type: ignore[attr-defined]
    sends: list[Any] = []

    def begin(conn: Any, send: Any) -> Any:
        sends.append(conn)
        if len(sends) == 1:
            conn.close()  # as if the server had dropped it while it was idle in the pool
        return real_begin(conn, send)

    monkeypatch.setattr(_pg_group, "begin", begin)
    await stored_session(store, "s1")
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        with trio.fail_after(WAIT):
            await entry.session.flush()
        assert len(sends) == 2 and sends[0] is not sends[1]
        assert events_stored(superuser, schema, "s1") == len(entry.session.events)
        await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_settled_groups_slot_goes_to_what_queued_before_the_flushes_it_woke_run(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """One slot (``pool_size`` 2): the first flush of a batch goes out alone (eager, at once), the others
    queue behind it.  Once it is settled the others are sent before its flush returns, every round (released
    to the committer's dispatch instead, the slot would be taken after the woken flushes ran, or before, as
    the scheduler's batch falls)."""
    monkeypatch.setattr(_pg_group, "_EAGER", 1)
    log: list[tuple[str, Any]] = []
    real_send = _pg_group.GroupCommitter._send

    def send(self: Any, sent: Any, conn: Any) -> Any:
        log.append(("send", sorted(request.sid for request in sent)))
        return real_send(self, sent, conn)

    monkeypatch.setattr(_pg_group.GroupCommitter, "_send", send)
    names = await stored_sessions(store, 6)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=2)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in names]

        async def flush(entry: Any) -> None:
            await entry.session.flush()
            log.append(("done", entry.session.header.id))

        for round_number in range(2, 10):
            log.clear()
            for entry in entries:
                one_turn(entry.session, round_number)
            with trio.fail_after(WAIT):
                async with trio.open_nursery() as nursery:
                    for entry in entries:
                        nursery.start_soon(flush, entry)
            sends = [sids for kind, sids in log if kind == "send"]
            assert len(sends) == 2 and len(sends[0]) == 1 and len(sends[1]) == 5, log
            first_done = next(index for index, (kind, _) in enumerate(log) if kind == "done")
            assert log.index(("send", sends[1])) < first_done, log
        for entry in entries:
            assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
            await sessions.detach(entry)


async def test_a_batch_that_cannot_be_encoded_in_a_long_queue_is_encoded_again_a_bounded_number_of_times(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """300 flushes at once, one of them not encodable (injected): the eager send that meets it stops eager
    sends until the committer takes the queue (which sends the refused group's batches one by one), instead
    of every later submit encoding the whole queue again on the Trio thread."""
    real = _pg_group.GroupCommitter._params
    encoded: list[int] = []

    def params(self: Any, group: Any, encoding: str) -> Any:
        encoded.append(len(group))
        if any(request.sid == "s0" for request in group):
            raise ValueError("this batch cannot be encoded")
        return real(self, group, encoding)

    monkeypatch.setattr(_pg_group.GroupCommitter, "_params", params)
    names = await stored_sessions(store, 300)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in names]
        for entry in entries:
            one_turn(entry.session, 2)
        failed = {name: outcome for name, outcome in (await flush_at_once(entries)).items() if outcome is not None}
        assert list(failed) == ["s0"] and "could not be encoded" in str(failed["s0"]), failed
        assert sum(encoded) < 4 * len(names), encoded  # each batch encoded a few times at most, not once a submit
        monkeypatch.setattr(_pg_group.GroupCommitter, "_params", real)
        for entry in entries:
            await sessions.detach(entry)
    for entry in entries:  # the bad batch stayed buffered and was stored by the detach, once
        assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
