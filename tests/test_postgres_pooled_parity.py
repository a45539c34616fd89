"""The pooled PostgreSQL store at parity with the per-session one (docs/postgres.rst, "the pooled mode").

Large images stored as blobs and fenced; ``save`` and forks into an id a
pooled worker is creating refused; both modes on one schema, each refusing
the sessions the other holds (a race of both, a frozen pooled holder, a
per-session writer retaking after a pooled one took its session); and the
failures that must not be silent or leave a lease behind: a take cancelled
after it committed, a release that timed out, a writer broken for another
reason than fencing, a mailbox read that failed once, a first flush
cancelled after it committed, a group commit that never answered.  Real
cluster (tests/_postgres.py), real clock, bounded waits.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import time
from typing import Any

import attrs
import psycopg
import pytest
import trio
from _pg_modes import MODES, a_release_that_timed_out, make
from _postgres import Cluster, admin, postgres_cluster, proxy_for, schema, store, superuser
from test_images import png
from test_postgres_store import backend_pid, one_turn, stored_session

from trio_harness import Image, SessionExistsError, SessionLockedError, SessionStoreError
from trio_harness.events import MAX_INLINE_IMAGE_BYTES, ImagePart, InboxMessage
from trio_harness.session import PooledPostgresStore, PostgresStore, Session, SessionRegistry, _pg_leases, _pg_pooled
from trio_harness.session import _events as ev
from trio_harness.session._codec import encode_header
from trio_harness.session._pg_group import GroupCommitter

__all__ = ["postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest

BIG = Image(png(300, 300, seed=11), "image/png")
BIG_SHA = hashlib.sha256(BIG.data).hexdigest()
OTHER = Image(png(300, 300, seed=12), "image/png")
assert len(BIG.data) > MAX_INLINE_IMAGE_BYTES and len(OTHER.data) > MAX_INLINE_IMAGE_BYTES


def image_turn(session: Session, number: int, text: str = "look", image: Image = BIG) -> None:
    """A turn whose message holds ``image`` (above the inline limit): in the inbox splice and the user message."""
    message_id = f"m{number}-{text}"
    part = ImagePart.of(image)
    inserted = (InboxMessage(message_id, text, images=(part,)),)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=inserted)
    session.append(ev.TurnStart, turn=number)
    session.append(ev.StepStart, turn=number, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=(message_id,), outcome="claimed", turn=number)
    session.append(ev.UserMessage, turn=number, step=1, message_id=message_id, text=text, images=(part,))
    session.append(ev.AssistantMessage, turn=number, step=1, text="seen")
    session.append(ev.StepEnd, turn=number, step=1)
    session.append(ev.TurnEnd, turn=number, reason="completed")


def blobs_of(conn: psycopg.Connection[Any], schema: str, session_id: str) -> list[str]:
    rows = conn.execute(f"SELECT sha256 FROM {schema}.blobs WHERE session_id = %s", (session_id,)).fetchall()
    return [row[0] for row in rows]


def longest_line(conn: psycopg.Connection[Any], schema: str, session_id: str) -> int:
    row = conn.execute(  # a row holds one line, or a group-committed flush's lines
        f"SELECT max(length(line)) FROM {schema}.events, unnest(string_to_array(body, E'\\n')) AS line "
        "WHERE session_id = %s",
        (session_id,),
    ).fetchone()
    assert row is not None
    return int(row[0])


def texts(events: tuple[ev.Event, ...]) -> list[str]:
    return [e.text for e in events if isinstance(e, ev.UserMessage)]


async def eventually(predicate: Any, what: str, within: float = 10.0) -> None:
    """Wait (polling, bounded) until ``predicate()`` holds."""
    with trio.fail_after(within):
        while not predicate():
            await trio.sleep(0.02)


# ------------------------------------------------------------------ 1: large images by reference


async def test_a_pooled_session_stores_large_images_as_blobs_and_resumes_them_inline(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    async with pooled:
        sessions = SessionRegistry(pooled)
        session = await sessions.prepare_new("img", cwd="/w")
        entry = sessions.enter(session)
        image_turn(session, 1)
        await session.flush()  # the first flush: the session's row, its blob and its events in one transaction
        one_turn(session, 2)
        await session.flush()  # no blob: the group commit
        assert sum(pooled._group._groups) >= 1
        await sessions.detach(entry)
        assert blobs_of(superuser, schema, "img") == [BIG_SHA]
        assert longest_line(superuser, schema, "img") < MAX_INLINE_IMAGE_BYTES  # the lines hold references only
        stored = (await store.load("img")).events
        assert [e.images[0].by_reference for e in stored if isinstance(e, ev.UserMessage) and e.images] == [True]
        resumed = await sessions.prepare_resume("img")  # read back inline, as appended
        assert tuple(resumed.events) == tuple(session.events)
        entry = sessions.enter(resumed)
        image_turn(resumed, 3, "again")  # a resumed session's flush with a blob (the same image: one row)
        await resumed.flush()
        await sessions.detach(entry)
    assert blobs_of(superuser, schema, "img") == [BIG_SHA]
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as other:
        again = SessionRegistry(other)
        final = await again.prepare_resume("img")
        assert tuple(final.events) == tuple(resumed.events)
        assert texts(tuple(final.events)) == ["look", "do it", "again"]
        await again.discard(final)


async def test_a_fenced_pooled_writer_stores_no_blob_and_no_event(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    first = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=10.0, idle_session_timeout=None)
    async with first:
        sessions = SessionRegistry(first)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        assert first._live is not None
        superuser.execute("SELECT pg_terminate_backend(%s)", (first._live.info.backend_pid,))  # its liveness goes
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=5.0) as second:
            taken = SessionRegistry(second)
            other = taken.enter(await taken.prepare_resume("s1"))
            image_turn(entry.session, 2, "from the fenced worker", OTHER)
            with pytest.raises(SessionStoreError, match="lease was taken"):
                await entry.session.flush()
            assert blobs_of(superuser, schema, "s1") == []
            image_turn(other.session, 2, "second worker")
            await other.session.flush()
            await taken.detach(other)
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)
    assert texts((await store.load("s1")).events) == ["do it", "second worker"]
    assert blobs_of(superuser, schema, "s1") == [BIG_SHA]  # the holder's; none of the fenced writer's


async def test_a_blob_flush_whose_commit_answer_is_lost_is_stored_once(
    postgres_cluster: Cluster,
    schema: str,
    store: PostgresStore,
    caplog: pytest.LogCaptureFixture,
    superuser: psycopg.Connection[Any],
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        async with PooledPostgresStore(proxy.dsn(), schema=schema) as pooled:
            sessions = SessionRegistry(pooled)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            image_turn(entry.session, 2)
            dropped = proxy.drop_after(b"COMMIT")  # the blob's transaction commits; its answer never comes
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                await entry.session.flush()
            assert dropped.is_set()
            assert "the connection was lost" in caplog.text
            stored = (await store.load("s1")).events  # its images by reference, each once
            assert [e.seq for e in stored] == [e.seq for e in entry.session.events]
            one_turn(entry.session, 3)
            await entry.session.flush()
            await sessions.detach(entry)
    assert blobs_of(superuser, schema, "s1") == [BIG_SHA]
    reader = SessionRegistry(store)
    loaded = await reader.prepare_resume("s1")
    assert tuple(loaded.events) == tuple(entry.session.events)
    await reader.discard(loaded)


# ------------------------------------------------------------------ 2: save and fork against leases


@pytest.mark.parametrize("mode", MODES)
async def test_save_and_fork_into_an_id_a_pooled_worker_is_creating_are_refused(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    source = await stored_session(store, "source")
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as creator:
        sessions = SessionRegistry(creator)
        session = await sessions.prepare_new("child", cwd="/w")  # its lease is held; nothing is stored yet
        entry = sessions.enter(session)
        async with make(mode, postgres_cluster.dsn(), schema) as other:
            with pytest.raises(SessionExistsError, match="being created, or is live"):
                await SessionRegistry(other).fork("source", len(source), "child")
            header = attrs.evolve((await other.load("source")).header, id="child")
            with pytest.raises(SessionExistsError, match="another worker is creating it"):
                await other.save(header, source)
            assert not await other.exists("child")
        one_turn(session, 1, "the creator's")
        await session.flush()  # the creator's first flush stores the id
        await sessions.detach(entry)
        # Once it is released, a fork into a free id goes on as before.
        await SessionRegistry(creator).fork("child", len(session.events), "grandchild")
    assert texts((await store.load("child")).events) == ["the creator's"]
    assert (await store.load("grandchild")).events == tuple(session.events)


# ------------------------------------------------------------------ 3: both modes on one schema


@pytest.mark.parametrize("holder_mode", MODES)
async def test_a_session_held_in_one_mode_is_refused_to_the_other(
    holder_mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    taker_mode = next(mode for mode in MODES if mode != holder_mode)
    await stored_session(store, "s1")
    async with (
        make(holder_mode, postgres_cluster.dsn(), schema) as holder,
        make(taker_mode, postgres_cluster.dsn(), schema) as taker,
    ):
        held, taking = SessionRegistry(holder), SessionRegistry(taker)
        entry = held.enter(await held.prepare_resume("s1"))
        created = held.enter(await held.prepare_new("fresh", cwd="/w"))  # being created: not stored yet
        with pytest.raises(SessionLockedError, match="live on another worker"):
            await taking.prepare_resume("s1")
        with pytest.raises(SessionExistsError, match="on another worker"):
            await taking.prepare_new("fresh", cwd="/w")
        one_turn(entry.session, 2, holder_mode)
        await entry.session.flush()
        one_turn(created.session, 1, holder_mode)
        await created.session.flush()
        await held.detach(entry)
        await held.detach(created)
        # Released: the other mode takes them now.
        for session_id in ("s1", "fresh"):
            again = taking.enter(await taking.prepare_resume(session_id))
            one_turn(again.session, 3, taker_mode)
            await again.session.flush()
            await taking.detach(again)
    assert texts((await store.load("s1")).events) == ["do it", holder_mode, taker_mode]
    assert texts((await store.load("fresh")).events) == [holder_mode, taker_mode]


async def test_takes_of_both_modes_racing_for_a_session_leave_exactly_one_holder(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    rounds = 12
    for number in range(rounds):
        await stored_session(store, f"race-{number}")
    async with (
        PostgresStore(postgres_cluster.dsn(), schema=schema) as per_session,
        PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled,
    ):
        racers: dict[str, PostgresStore] = {"per-session": per_session, "pooled": pooled}
        wins = {"per-session": 0, "pooled": 0}
        for number in range(rounds * 2):
            creating = number >= rounds  # the second half race to create a new id
            session_id = f"new-{number}" if creating else f"race-{number}"
            writers: dict[str, Any] = {}

            async def take(
                name: str, session_id: str = session_id, creating: bool = creating, writers: dict[str, Any] = writers
            ) -> None:
                persistence = racers[name]
                try:
                    if creating:
                        sessions = SessionRegistry(persistence)
                        session = await sessions.prepare_new(session_id, cwd="/w")
                        writers[name] = (sessions, session)
                    else:
                        _, writer = await persistence.resume(session_id)
                        writers[name] = writer
                except (SessionLockedError, SessionExistsError):
                    pass

            async with trio.open_nursery() as nursery:
                for name in racers:
                    nursery.start_soon(take, name)
            assert len(writers) == 1, (session_id, sorted(writers))
            for name, won in writers.items():
                wins[name] += 1
                if creating:
                    sessions, session = won
                    await sessions.discard(session)
                else:
                    await won.aclose()
        print(f"wins over {rounds * 2} races: {wins}")


async def test_a_frozen_pooled_holder_is_fenced_by_a_per_session_takeover(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    first = PooledPostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=10.0, idle_session_timeout=None)
    async with first:
        sessions = SessionRegistry(first)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        assert first._live is not None
        superuser.execute("SELECT pg_terminate_backend(%s)", (first._live.info.backend_pid,))
        async with PostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=5.0) as second:
            taken = SessionRegistry(second)
            other = taken.enter(await taken.prepare_resume("s1"))  # its lease is free: fenced (epoch bumped)
            one_turn(other.session, 2, "per-session")
            await other.session.flush()
            one_turn(entry.session, 2, "pooled")
            with pytest.raises(SessionStoreError, match="lease was taken"):
                await entry.session.flush()
            await taken.detach(other)
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)
    assert texts((await store.load("s1")).events) == ["do it", "per-session"]


async def test_a_per_session_writer_that_lost_its_connection_finds_a_pooled_worker_took_the_session(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    async with PostgresStore(postgres_cluster.dsn(), schema=schema, heartbeat=None, idle_session_timeout=None) as p:
        sessions = SessionRegistry(p)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        superuser.execute("SELECT pg_terminate_backend(%s, 5000)", (backend_pid(entry),))
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=5.0) as q:
            taking = SessionRegistry(q)
            other = taking.enter(await taking.prepare_resume("s1"))
            one_turn(entry.session, 2, "lost its connection")
            with pytest.raises(SessionStoreError, match="live on another worker") as failed:
                await entry.session.flush()
            assert "previous connection" not in str(failed.value)
            one_turn(other.session, 2, "pooled")
            await other.session.flush()
            await taking.detach(other)
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)
    assert texts((await store.load("s1")).events) == ["do it", "pooled"]


# ------------------------------------------------------------------ 4: failures that leave nothing behind


async def test_a_create_cancelled_after_its_lease_was_taken_gives_the_lease_back(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _pg_leases.take_lease

    def slow(*args: Any) -> int | None:
        epoch = real(*args)  # committed
        time.sleep(0.5)  # (worker thread) the caller is cancelled meanwhile
        return epoch

    monkeypatch.setattr(_pg_pooled, "take_lease", slow)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as first:
        with trio.move_on_after(0.2) as scope:
            await SessionRegistry(first).prepare_new("x", cwd="/w")
        assert scope.cancelled_caught
        monkeypatch.undo()
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as second:
            sessions = SessionRegistry(second)
            session = await sessions.prepare_new("x", cwd="/w")  # the lease was given back
            entry = sessions.enter(session)
            one_turn(session, 1)
            await sessions.detach(entry)
    assert (await store.load("x")).events == tuple(session.events)


async def test_a_release_that_timed_out_is_retried_so_another_worker_can_take_the_session(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    await stored_session(store, "s1")
    async with a_release_that_timed_out(postgres_cluster, schema, caplog, release_timeout=0.3) as timed_out:
        first = timed_out.store
        assert first._unreleased == {"s1": timed_out.entry.writer._epoch}  # type: ignore[attr-defined]
        timed_out.unlock()
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, lock_timeout=5.0) as second:
            started = time.perf_counter()
            taken = SessionRegistry(second)
            other = taken.enter(await taken.prepare_resume("s1"))  # the first worker still lives
            print(f"taken {time.perf_counter() - started:.2f} s after the release was retried")
            await taken.detach(other)
        assert first._unreleased == {}


async def test_a_writer_broken_by_a_stored_id_still_releases_its_lease(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, superuser: psycopg.Connection[Any]
) -> None:
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as first:
        sessions = SessionRegistry(first)
        session = await sessions.prepare_new("dup", cwd="/w")
        entry = sessions.enter(session)
        behind = encode_header(attrs.evolve(session.header, cwd="/elsewhere"))
        superuser.execute(  # stored behind the store's back (no lease, no lock)
            f"INSERT INTO {schema}.sessions (id, header, created_at) VALUES ('dup', %s, 0)", (behind,)
        )
        one_turn(session, 1)
        with pytest.raises(SessionStoreError, match="already stored"):
            await session.flush()
        with pytest.raises(SessionStoreError):
            await sessions.detach(entry)
        async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as second:
            _, writer = await second.resume("dup")  # the broken writer's lease was released
            await writer.aclose()


async def test_a_mailbox_read_that_failed_is_tried_again_without_another_post(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await stored_session(store, "s1")
    real = _pg_pooled._PooledWriter.take_mail
    # More failures than wake-ups (the receive, the listener's first rescan): only a retry delivers.
    failures = [SessionStoreError("the mailbox could not be read (a test fault)") for _ in range(3)]

    async def failing_once(self: Any) -> Any:
        if failures:
            raise failures.pop()
        return await real(self)

    monkeypatch.setattr(_pg_pooled._PooledWriter, "take_mail", failing_once)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        await pooled.post("s1", InboxMessage("p1", "posted while nobody listened"))
        got: list[str] = []
        sessions.receive(entry, lambda message: got.append(message.text))
        await eventually(lambda: got == ["posted while nobody listened"], "the delivery")
        assert failures == []
        await eventually(lambda: not entry.writer._acks, "the mailbox delete")  # type: ignore[attr-defined]
        await sessions.detach(entry)
    assert await store.pending_mail("s1") == []


async def test_a_first_flush_cancelled_after_it_committed_counts_as_stored(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = _pg_pooled._store_own

    def slow(*args: Any) -> str:
        outcome = real(*args)  # committed
        time.sleep(0.5)
        return outcome

    monkeypatch.setattr(_pg_pooled, "_store_own", slow)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        session = await sessions.prepare_new("c", cwd="/w")
        entry = sessions.enter(session)
        one_turn(session, 1)
        writer = entry.writer
        with trio.move_on_after(0.2) as scope:
            await writer.flush()
        assert scope.cancelled_caught
        monkeypatch.undo()
        assert writer._header_line is None and writer._stored == len(session.events)  # type: ignore[attr-defined]
        one_turn(session, 2)
        await session.flush()
        await sessions.detach(entry)
    assert (await store.load("c")).events == tuple(session.events)


async def test_a_group_commit_that_never_sends_fails_its_flushes_and_never_commits_later_at_a_new_seq(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The committer hangs before it sends anything: each flush fails, saying nothing was stored; the writer
    stays usable (its lease still its own), and no abandoned request is ever sent (tests/test_postgres_group.py
    has the cases of a request that is sent)."""
    await stored_session(store, "s1")

    async def hang(self: GroupCommitter, group: Any, **kwargs: Any) -> None:
        await trio.sleep_forever()

    monkeypatch.setattr(GroupCommitter, "_commit_group", hang)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=0.2) as pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        with pytest.raises(SessionStoreError, match=r"was not sent within 1\.4 s .*nothing of it was stored"):
            await entry.session.flush()
        assert len((await store.load("s1")).events) == 8
        # The next flush commits in a transaction of its own (it reads back what is stored first): both turns.
        one_turn(entry.session, 3)
        await entry.session.flush()
        await sessions.detach(entry)
    assert (await store.load("s1")).events == tuple(entry.session.events)


async def test_a_closing_store_leaves_no_liveness_connection_behind_and_opens_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    """The heartbeat stops before the liveness lock goes: it used to take the lock again while writers closed."""
    await stored_session(store, "s1")
    pooled = PooledPostgresStore(
        postgres_cluster.dsn(), schema=schema, heartbeat=0.05, idle_session_timeout=None, release_timeout=0.5
    )
    async with pooled:
        _, writer = await pooled.resume("s1")
        locker = admin(postgres_cluster)
        try:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {schema}.leases IN EXCLUSIVE MODE")  # the closing writer's release waits
        except BaseException:
            locker.close()
            raise
    try:
        assert pooled._live is None  # no connection taken again during the close
    finally:
        locker.execute("COMMIT")
        locker.close()
    assert writer._closed  # type: ignore[attr-defined]
    async with pooled:  # open again: its liveness lock and group commit run anew
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        await entry.session.flush()
        await sessions.detach(entry)
    assert len((await store.load("s1")).events) == 16


async def test_a_mailbox_read_is_bounded_by_the_write_timeout(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema, write_timeout=0.5) as pooled:
        _, writer = await pooled.resume("s1")
        locker = admin(postgres_cluster)
        try:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {schema}.mailbox IN ACCESS EXCLUSIVE MODE")  # the read waits
            with trio.fail_after(5):
                with pytest.raises(SessionStoreError, match=r"did not answer within 0.5 s \(write_timeout\)"):
                    await writer.take_mail()  # type: ignore[attr-defined]
        finally:
            locker.execute("COMMIT")
            locker.close()
        assert await writer.take_mail() == []  # type: ignore[attr-defined]
        await writer.aclose()


async def test_the_flush_after_one_of_unknown_outcome_finds_what_it_stored_instead_of_failing_on_it(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await stored_session(store, "s1")
    real = GroupCommitter._commit_group

    async def answer_lost(self: GroupCommitter, group: Any) -> None:
        await real(self, group)  # committed...
        for request in group:  # ...but reported failed, as a commit whose answer was lost may be
            request.outcome = SessionStoreError("the group commit's answer was lost (a test fault)")

    monkeypatch.setattr(GroupCommitter, "_commit_group", answer_lost)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        one_turn(entry.session, 2)
        with pytest.raises(SessionStoreError, match="answer was lost"):
            await entry.session.flush()
        monkeypatch.undo()
        one_turn(entry.session, 3)
        await entry.session.flush()  # its own transaction: the batch found stored, the rest added
        await sessions.detach(entry)
    stored = (await store.load("s1")).events
    assert stored == tuple(entry.session.events)
    assert texts(stored) == ["do it"] * 3


async def test_a_take_whose_commit_answer_is_lost_is_taken_again_not_refused_as_held_by_another_worker(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    with proxy_for(postgres_cluster) as proxy:
        async with PooledPostgresStore(proxy.dsn(), schema=schema) as pooled:
            sessions = SessionRegistry(pooled)
            dropped = proxy.drop_after(b"COMMIT")  # the take's transaction commits; its answer never comes
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                session = await sessions.prepare_new("x", cwd="/w")  # the lease names this worker: taken again
            assert dropped.is_set()
            assert "cannot take session 'x' yet: the connection was lost" in caplog.text
            entry = sessions.enter(session)
            one_turn(session, 1)
            await sessions.detach(entry)
    assert (await store.load("x")).events == tuple(session.events)


@pytest.mark.parametrize("saver_mode", MODES)
async def test_a_save_racing_a_pooled_create_of_the_same_id_leaves_exactly_one_of_them(
    saver_mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    source = await stored_session(store, "source")
    header = (await store.load("source")).header
    async with (
        PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as creator,
        make(saver_mode, postgres_cluster.dsn(), schema) as saver,
    ):
        sessions = SessionRegistry(creator)
        outcomes = {"created": 0, "saved": 0}
        for number in range(12):
            session_id = f"contested-{number}"
            won: dict[str, Any] = {}

            async def create(session_id: str = session_id, won: dict[str, Any] = won) -> None:
                with contextlib.suppress(SessionExistsError):
                    won["created"] = await sessions.prepare_new(session_id, cwd="/w")

            async def save(session_id: str = session_id, won: dict[str, Any] = won) -> None:
                with contextlib.suppress(SessionExistsError):
                    await saver.save(attrs.evolve(header, id=session_id), source)
                    won["saved"] = True

            async with trio.open_nursery() as nursery:
                nursery.start_soon(create)
                nursery.start_soon(save)
            assert len(won) == 1, (session_id, sorted(won))
            if "created" in won:
                entry = sessions.enter(won["created"])
                one_turn(entry.session, 1, "created")
                await sessions.detach(entry)  # its first flush stores the id: nobody stored it meanwhile
                assert texts((await store.load(session_id)).events) == ["created"]
            else:
                assert (await store.load(session_id)).events == source
            outcomes[next(iter(won))] += 1
        print(f"save ({saver_mode}) racing a pooled create, 12 rounds: {outcomes}")
