"""The mail loop of a live PostgreSQL session, both modes (session/_pg_mail.py): no failure is only logged.

* the mailbox cannot be read (a store error): the messages stay in it and the
  delivery is tried again, backing off, until it succeeds — without another
  post to wake it;
* an agent that raises something else than a ``HarnessError`` for a posted
  message (a bug): the exception ends the store's service, raised out of
  ``async with store``, instead of a log line while the message blocks the
  mailbox.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest
import trio
from _pg_modes import MODES, make
from _postgres import Cluster, admin, postgres_cluster, schema, store
from test_postgres_store import stored_session

from trio_harness.events import InboxMessage
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_pooled
from trio_harness.session import _events as ev

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

WITHIN = 30.0


def flat(error: BaseException) -> list[BaseException]:
    """``error`` and what it groups, flattened."""
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in flat(inner)]
    return [error]


@pytest.mark.parametrize("mode", MODES)
async def test_a_mailbox_that_cannot_be_read_is_read_again_until_the_messages_are_delivered(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, caplog: pytest.LogCaptureFixture
) -> None:
    await stored_session(store, "s1")
    message = InboxMessage("m1", "posted before the mailbox broke")
    holder = make(mode, postgres_cluster.dsn(), schema)
    async with holder:
        sessions = SessionRegistry(holder)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        await holder.post("s1", message)
        # The mailbox cannot be read (the table is gone: an error of the statement, the connection stays).
        postgres_cluster.psql(f"ALTER TABLE {schema}.mailbox RENAME TO mailbox_away")
        delivered: list[str] = []

        def deliver(message: InboxMessage) -> None:
            delivered.append(message.id)
            entry.session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(message,))

        with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
            sessions.receive(entry, deliver)
            with trio.fail_after(WITHIN):
                while not any("delivering posted messages failed" in r.getMessage() for r in caplog.records):
                    await trio.sleep(0.02)
        assert delivered == []
        # Readable again: nothing is posted, nothing wakes the session; only the retry delivers.
        postgres_cluster.psql(f"ALTER TABLE {schema}.mailbox_away RENAME TO mailbox")
        with trio.fail_after(WITHIN):
            while not delivered or await store.pending_mail("s1"):
                await trio.sleep(0.02)
        assert delivered == ["m1"]
        await sessions.detach(entry)
    assert [type(e).__name__ for e in (await store.load("s1")).events][-1] == "InboxSpliced"


@pytest.mark.parametrize("mode", MODES)
async def test_an_agent_failing_on_a_posted_message_ends_the_service_with_its_error(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    holder = make(mode, postgres_cluster.dsn(), schema)

    def deliver(message: InboxMessage) -> None:
        raise ValueError(f"this agent cannot take {message.id}")

    async def hold() -> None:
        async with holder:
            sessions = SessionRegistry(holder)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            sessions.receive(entry, deliver)
            await holder.post("s1", InboxMessage("m1", "not for this agent"))
            await trio.sleep(WITHIN)  # cancelled by the failure; reaching the end is the test failing

    with pytest.raises(BaseException) as raised:
        await hold()
    errors = [e for e in flat(raised.value) if not isinstance(e, trio.Cancelled)]
    assert [str(e) for e in errors] == ["this agent cannot take m1"]
    assert [message.id for message in await store.pending_mail("s1")] == ["m1"]  # kept for the next holder


async def test_a_mailbox_read_overlapping_the_flush_that_deletes_a_taken_row_does_not_take_it_again(
    postgres_cluster: Cluster, schema: str, store: PostgresStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Found by the fleet test: after a takeover, a resume's delivery and the mail loop read the mailbox at
    # once; the first spliced the message and its flush deleted the row while the second read (its snapshot
    # older than the delete) was still running, and the commit had forgotten the row was taken: spliced twice.
    await stored_session(store, "s1")
    holder = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    real_rows = _pg_pooled._mailbox_rows
    read, gate = threading.Event(), threading.Event()
    held: list[str] = []

    def rows(conn: Any, *args: Any) -> Any:  # on the read's thread
        result = real_rows(conn, *args)
        if held == ["hold"]:
            held.append("read")
            read.set()
            gate.wait(WITHIN)  # the rows are read: the answer is held back while the test goes on
        return result

    monkeypatch.setattr(_pg_pooled, "_mailbox_rows", rows)
    async with holder:
        sessions = SessionRegistry(holder)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        writer: Any = entry.writer
        await holder.post("s1", InboxMessage("m1", "posted once"))
        [(mail_id, message)] = await writer.take_mail()
        assert message.id == "m1"
        second: list[list[tuple[int, InboxMessage]]] = []
        flushed = trio.Event()

        async def take_again() -> None:
            second.append(await writer.take_mail())

        async def splice_and_flush() -> None:
            entry.session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(message,))
            writer.ack_mail([mail_id])
            await entry.session.flush()
            flushed.set()

        held.append("hold")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(take_again)
            assert await trio.to_thread.run_sync(read.wait, WITHIN)
            nursery.start_soon(splice_and_flush)
            # The flush either commits (deleting the row) or waits for the read to end: either way, go on.
            with trio.fail_after(WITHIN):
                while not flushed.is_set() and not writer._lock.statistics().tasks_waiting:
                    await trio.sleep(0.01)
            gate.set()
        assert second == [[]]  # taken once: the second read does not hand the row out again
        assert await store.pending_mail("s1") == []
        await sessions.detach(entry)
    splices = [e for e in (await store.load("s1")).events if isinstance(e, ev.InboxSpliced) and message in e.inserted]
    assert len(splices) == 1


@pytest.mark.parametrize("mode", MODES)
async def test_a_mailbox_row_that_is_no_message_is_removed_with_a_trace_in_the_session(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with admin(postgres_cluster) as conn:  # as a newer trio-harness, or a hand, might write one
        row = conn.execute(
            f"INSERT INTO {schema}.mailbox (session_id, body) VALUES ('s1', '{{\"v\": 99}}') RETURNING id"
        ).fetchone()
    assert row is not None
    holder = make(mode, postgres_cluster.dsn(), schema)
    async with holder:
        sessions = SessionRegistry(holder)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        await holder.post("s1", InboxMessage("m1", "a message after it"))
        delivered: list[str] = []

        def deliver(message: InboxMessage) -> None:
            delivered.append(message.id)
            entry.session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(message,))

        sessions.receive(entry, deliver)
        with trio.fail_after(WITHIN):
            while not delivered or await mailbox_count(postgres_cluster, schema):
                await trio.sleep(0.02)
        assert delivered == ["m1"]  # the message behind it is not held up
        await sessions.detach(entry)
    refused = [e for e in (await store.load("s1")).events if isinstance(e, ev.ControlRefused)]
    assert [(e.message_id, e.kind) for e in refused] == [(f"mailbox row {row[0]}", "unknown")]
    assert "no message or control this trio-harness can read" in refused[0].reason


async def mailbox_count(cluster: Cluster, schema: str) -> int:
    """The rows of the mailbox, messages or not (``pending_mail`` refuses a row that is none)."""

    def count() -> int:
        with admin(cluster) as conn:
            found = conn.execute(f"SELECT count(*) FROM {schema}.mailbox").fetchone()
        return int(found[0]) if found else -1

    return await trio.to_thread.run_sync(count)
