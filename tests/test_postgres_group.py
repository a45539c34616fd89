"""The pooled store's group commit (session/_pg_group.py): its bounds, unknown outcomes and mailbox deletes.

Real cluster (tests/_postgres.py).  The clock is a :class:`trio.testing.MockClock`
running at the real rate (the statements need real time) that the tests jump
past the bounds, so no test waits for a timeout: a flush held in the queue by
a pool the test keeps busy, a group held on a row lock of an uncommitted
transaction, a mailbox row deleted behind the writer's back.
"""

from __future__ import annotations

import logging
import types
from typing import Any

import psycopg
import pytest
import trio
import trio.testing
from _postgres import (
    Cluster,
    admin,
    clock,
    events_stored,
    flush_noting,
    postgres_cluster,
    schema,
    store,
    superuser,
    until,
)
from _util import WAIT
from test_postgres_store import one_turn, stored_session

from trio_harness import SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_group
from trio_harness.session._events import InboxMessage

__all__ = ["clock", "postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest

WRITE_TIMEOUT = 10.0
BOUND = 2 * WRITE_TIMEOUT + 1  # how long a flush may wait in the queue


async def flush_at_once(entries: list[Any]) -> dict[str, BaseException | None]:
    """Flush the entries' sessions at once (one scheduler batch): by session id, None or the store error."""
    noted: dict[str, list[BaseException | None]] = {entry.session.header.id: [] for entry in entries}
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(flush_noting, entry, noted[entry.session.header.id])
    return {session_id: outcome for session_id, (outcome,) in noted.items()}


def count(superuser: psycopg.Connection[Any], schema: str, session_id: str) -> int:
    return events_stored(superuser, schema, session_id)


async def test_a_flush_still_queued_past_its_bound_fails_unsent_and_is_never_sent_later(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    clock: trio.testing.MockClock,
) -> None:
    """The pool's one connection is busy: the committer holds one flush (taken from the queue, not sent), the
    other waits in the queue.  Past the bound both fail, saying nothing was stored; neither is ever sent (the
    committer drops a request its submitter gave up on), and the writers carry on."""
    for name in ("a", "b"):
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=1, write_timeout=WRITE_TIMEOUT)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        errors: list[BaseException] = []

        async def flush(entry: Any) -> None:
            try:
                await entry.session.flush()
            except SessionStoreError as exc:
                errors.append(exc)

        async with pooled._require_pool().connection():  # the committer waits for it
            async with trio.open_nursery() as nursery:
                for entry in entries:
                    one_turn(entry.session, 2)
                    nursery.start_soon(flush, entry)
                await trio.testing.wait_all_tasks_blocked()
                assert not errors
                clock.jump(BOUND + 1)
            assert len(errors) == 2, errors
            for error in errors:
                assert f"was not sent within {BOUND:g} s" in str(error)
                assert "nothing of it was stored" in str(error)
        # The connection is free: the committer has the abandoned request, and drops it.
        await trio.testing.wait_all_tasks_blocked()
        assert list(pooled._group._groups) == []
        for name in ("a", "b"):
            assert count(superuser, schema, name) == 8
        for entry in entries:
            one_turn(entry.session, 3)
            await entry.session.flush()
            assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
            await sessions.detach(entry)


@pytest.mark.parametrize("sent_by", ["committer", "flush"])
async def test_a_group_already_sent_when_its_flush_reaches_the_bound_is_waited_for_and_stored_once(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    clock: trio.testing.MockClock,
    caplog: pytest.LogCaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    sent_by: str,
) -> None:
    """The group's INSERT waits on an uncommitted row with the session's next seq.  Past both bounds (the
    flush's and the statement's) the flush does not give up on a sent group (it might commit later): the
    statement is cancelled, the group read back (nothing stored) and sent again, and the flush returns
    once that commits.  The same whether the committer sent the group or the flush that filled it did
    (``_launch``, here with a group of one)."""
    if sent_by == "flush":
        monkeypatch.setattr(_pg_group, "_EAGER", 1)
    await stored_session(store, "s1")
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=WRITE_TIMEOUT)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        finished: list[BaseException | None] = []

        def waiting() -> bool:
            return bool(
                superuser.execute(
                    "SELECT 1 FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE '%%FOR SHARE OF le%%'"
                ).fetchall()
            )

        with admin(postgres_cluster) as blocker, caplog.at_level(logging.WARNING, "trio_harness.session.postgres"):
            blocker.execute("BEGIN")
            # At the batch's last seq: the group stores the batch as one row, keyed so (session/_pg_rows.py).
            last = len(entry.session.events) - 1
            blocker.execute(f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('s1', %s, 'x')", (last,))
            async with trio.open_nursery() as nursery:
                nursery.start_soon(flush_noting, entry, finished)
                await until(waiting, "the group commit waits on the row")
                clock.jump(BOUND + 1)
                await until(lambda: "committing 1 again" in caplog.text, "the group read back and sent again")
                await until(waiting, "the group commit, sent again, waits on the row")
                await trio.testing.wait_all_tasks_blocked()
                assert finished == []  # still waiting for its group
                blocker.execute("ROLLBACK")
        assert finished == [None]
        assert (await store.load("s1")).events == tuple(entry.session.events)
        one_turn(entry.session, 3)
        await entry.session.flush()
        await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_an_acknowledged_mailbox_row_already_gone_fails_the_flush_loudly(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    """The writer delivered a message; before its flush deletes the mailbox row, the row is gone (as if
    another holder of the session had delivered it).  The flush stores its events but fails, naming it;
    the writer takes nothing more."""
    await stored_session(store, "s1")
    await store.post("s1", InboxMessage("m-late", "hello"))
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        writer: Any = entry.writer  # the pooled writer (its mailbox methods)
        taken = await writer.take_mail()
        assert [message.id for _, message in taken] == ["m-late"]
        writer.ack_mail([mail_id for mail_id, _ in taken])
        one_turn(entry.session, 2)
        superuser.execute(f"DELETE FROM {schema}.mailbox WHERE session_id = 's1'")
        with pytest.raises(SessionStoreError, match="mailbox rows of messages it delivered were already deleted"):
            await entry.session.flush()
        assert (await store.load("s1")).events == tuple(entry.session.events)  # stored, once
        one_turn(entry.session, 3)
        with pytest.raises(SessionStoreError, match="resume the session"):
            await entry.session.flush()
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)
    # Its lease was released: another worker resumes the session at once.
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
        loaded, resumed = await other.resume("s1")
        assert len(loaded.events) == 16
        await resumed.aclose()


async def test_a_queue_that_reaches_the_eager_size_is_sent_by_the_flush_that_filled_it(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Seven flushes queued in one scheduler batch, the eager size three: the third flush sends the queue
    at once (a group of three, sent while the batch is still queueing; the sixth does too when another
    pooled connection is idle); the rest goes out with the committer, after the batch (without the eager
    send: one group of seven).  Every batch is stored once, in order."""
    monkeypatch.setattr(_pg_group, "_EAGER", 3)
    names = [f"e{number}" for number in range(7)]
    for name in names:
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=4)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in names]
        pooled._group._groups.clear()
        for entry in entries:
            one_turn(entry.session, 2)
        async with trio.open_nursery() as nursery:
            for entry in entries:
                nursery.start_soon(entry.session.flush)
        groups = list(pooled._group._groups)
        assert groups[0] == 3 and sum(groups) == 7, groups
        for entry in entries:
            assert (await store.load(entry.session.header.id)).events == tuple(entry.session.events)
            await sessions.detach(entry)
    for name in names:
        assert count(superuser, schema, name) == 16


async def test_a_flush_submitted_after_the_store_closed_fails_at_once_unsent(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """Once the committer has stopped (its store closed), a request is refused at once, never parked."""
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        await trio.testing.wait_all_tasks_blocked()
    writer = types.SimpleNamespace(header=types.SimpleNamespace(id="late"), _stored=0, _epoch=1)
    request = _pg_group._Request(writer, ["{}"], [], True)
    with trio.fail_after(WAIT), pytest.raises(SessionStoreError, match=r"have stopped .* nothing of it was stored"):
        await pooled._group.submit(request)


def test_the_watch_keeps_no_more_than_about_twice_its_unsettled_requests() -> None:
    """One request stays unsettled while thousands behind it settle: the watch's list is compacted now and
    then, so it stays near twice the unsettled ones (or the minimum), not one entry per flush since."""

    async def main() -> None:
        committer = _pg_group.GroupCommitter(types.SimpleNamespace(write_timeout=10.0))  # type: ignore[arg-type]
        writer = types.SimpleNamespace(header=types.SimpleNamespace(id="s"), _stored=0, _epoch=1)
        stuck = _pg_group._Request(writer, [], [], True)
        committer._track(stuck)
        longest = 0
        for _ in range(10 * _pg_group._COMPACT_MIN):
            request = _pg_group._Request(writer, [], [], True)
            committer._track(request)
            request.settle(True)
            longest = max(longest, len(committer._waiting))
        assert not stuck.settled
        assert longest <= _pg_group._COMPACT_MIN + 1
        assert committer._waiting[0] is stuck

    trio.run(main)


@pytest.mark.parametrize("sent_by", ["committer", "flush"])
async def test_one_sessions_bad_batch_fails_its_flush_alone_and_the_rest_of_its_group_is_stored(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    sent_by: str,
) -> None:
    """Two flushes in one group, one batch holding a line PostgreSQL refuses (a NUL byte): the group fails,
    each request is committed again alone, so only the bad one fails.  With one pooled connection, also when
    the flush that filled the queue sent the group (it gives its connection back before the retries, which
    need it: no deadlock)."""
    if sent_by == "flush":
        monkeypatch.setattr(_pg_group, "_EAGER", 2)
    for name in ("a", "b"):
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, pool_size=1, write_timeout=WRITE_TIMEOUT)
    async with pooled:
        sessions = SessionRegistry(pooled)
        good, bad = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        for entry in (good, bad):
            one_turn(entry.session, 2)
        bad_writer: Any = bad.writer
        bad_writer._buffer.append("\x00")
        outcomes = await flush_at_once([good, bad])
        assert outcomes["a"] is None
        assert isinstance(outcomes["b"], SessionStoreError) and "0x00" in str(outcomes["b"]), outcomes
        assert pooled._group._groups[0] == 2
        bad_writer._buffer.remove("\x00")
        for entry in (good, bad):
            await sessions.detach(entry)
    assert count(superuser, schema, "a") == 16
    assert count(superuser, schema, "b") == 16


@pytest.mark.parametrize("sent_by", ["committer", "flush"])
async def test_a_batch_that_cannot_be_encoded_fails_its_flush_alone_as_not_sent(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    monkeypatch: pytest.MonkeyPatch,
    sent_by: str,
) -> None:
    """Of two flushes in one group, one cannot be encoded (injected: the codec escapes what UTF-8 cannot
    hold, so this is a guard), so the group's arrays cannot be built and nothing is sent.  The other flush
    is stored; the bad one alone fails, saying nothing of it was sent (not "unknown"), whichever way the
    group was sent."""
    real = _pg_group.GroupCommitter._params
    tried: list[int] = []  # the sizes of the groups whose arrays were built (or failed to be)

    def params(self: Any, group: Any, encoding: str) -> Any:
        tried.append(len(group))
        if any(request.sid == "b" for request in group):
            raise ValueError("this batch cannot be encoded")
        return real(self, group, encoding)

    monkeypatch.setattr(_pg_group.GroupCommitter, "_params", params)
    if sent_by == "flush":
        monkeypatch.setattr(_pg_group, "_EAGER", 2)
    for name in ("a", "b"):
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        good, bad = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        one_turn(good.session, 2)
        one_turn(bad.session, 2)
        outcomes = await flush_at_once([good, bad])
        assert outcomes["a"] is None, outcomes
        error = outcomes["b"]
        assert isinstance(error, SessionStoreError), outcomes
        assert "could not be encoded" in str(error) and "nothing of it was sent" in str(error)
        assert tried[0] == 2  # one group of both first, never sent (its arrays are built before it is)
        assert list(pooled._group._groups) == [1]  # then each alone: only the good one sent
        monkeypatch.setattr(_pg_group.GroupCommitter, "_params", real)
        for entry in (good, bad):  # the bad batch is still buffered: stored now, once
            await sessions.detach(entry)
    assert count(superuser, schema, "a") == 16
    assert count(superuser, schema, "b") == 16


@pytest.mark.parametrize("found", ["the batch", "other bodies"])
async def test_a_retry_of_a_lost_group_that_meets_committed_rows_at_its_seqs_is_read_back_never_failed(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    found: str,
) -> None:
    """A lost group statement that reached the server only after its read-back (delayed on its way) commits
    before the retry: the retry (``again``, two sessions) meets its rows at the primary key, each request is
    sent again alone, and the one met is read back again: stored when the rows are its batch, fenced when
    they are another writer's, never a failure naming a duplicate key; the other is stored by its retry."""
    for name in ("a", "b"):
        await stored_session(store, name)
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=WRITE_TIMEOUT)
    async with pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        requests = []
        for entry in entries:
            one_turn(entry.session, 2)
            writer: Any = entry.writer
            requests.append(_pg_group._Request(writer, list(writer._buffer), [], True))
        met = requests[0].lines if found == "the batch" else [f"other {n}" for n in range(len(requests[0].lines))]
        superuser.cursor().executemany(
            f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('a', %s, %s)",
            [(8 + n, body) for n, body in enumerate(met)],
        )
        with trio.fail_after(WAIT):
            await pooled._group._commit_group(requests, again=True)
        assert [(r.settled, r.outcome, r.unknown) for r in requests] == [
            (True, found == "the batch", False),
            (True, True, False),
        ]
    assert count(superuser, schema, "a") == 16 and count(superuser, schema, "b") == 16
    rows = superuser.execute(f"SELECT body FROM {schema}.events WHERE session_id = 'a' AND seq >= 8 ORDER BY seq")
    assert [body for (body,) in rows.fetchall()] == met
