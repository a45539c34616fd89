"""Races between a pooled worker's takes and the heartbeat's retry of a failed release (session/_pg_pooled.py)."""

from __future__ import annotations

import pytest
import trio
from _pg_modes import a_release_that_timed_out
from _postgres import Cluster, postgres_cluster, schema, store
from test_postgres_store import one_turn, stored_session

from trio_harness.session import PostgresStore

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
