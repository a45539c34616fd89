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

import pytest
import trio
from _pg_modes import MODES, make
from _postgres import Cluster, postgres_cluster, schema, store
from test_postgres_store import stored_session

from trio_harness.events import InboxMessage
from trio_harness.session import PostgresStore, SessionRegistry
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
