"""Store calls cancelled at every checkpoint, in both modes of the PostgreSQL store.

Each call (``open_writer``, ``resume``, ``flush``, ``aclose``, ``post``) runs
again and again, cancelled after its first, second, third... step (a Trio
instrument counts the calling task's steps and cancels its scope at the
chosen one), until it completes uncancelled.  After every cancelled run the
session is free or stored consistently: another worker can take it, this
worker holds no stray lease or lock, the stored log has no duplicate event
and the cancelled writer's next flush stores the rest exactly once.  Real
cluster (tests/_postgres.py), real clock.
"""

from __future__ import annotations

import functools
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import psycopg
import pytest
import trio
from _pg_modes import MODES, leases_of, make
from _postgres import Cluster, admin, postgres_cluster, schema, store
from test_postgres_store import one_turn, stored_session

from trio_harness.session import PooledPostgresStore, PostgresStore, SessionHeader, SessionRegistry
from trio_harness.session._events import InboxMessage

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

# More steps than any of the calls takes (a bound, so a call that never completes fails the test).
MOST_STEPS = 400


@attrs.define(eq=False)
class _CancelAt(trio.abc.Instrument):
    """Cancels ``scope`` once ``task`` has run ``at`` steps (each step ends at a checkpoint)."""

    task: trio.lowlevel.Task
    scope: trio.CancelScope
    at: int
    steps: int = 0

    def after_task_step(self, task: trio.lowlevel.Task) -> None:
        if task is self.task:
            self.steps += 1
            if self.steps == self.at:
                self.scope.cancel()


async def run_cancelled_at(step: int, call: Callable[[], Awaitable[Any]]) -> tuple[bool, Any]:
    """Run ``call`` in this task, cancelled after its ``step``-th step: ``(completed, result)``."""
    scope = trio.CancelScope()
    instrument = _CancelAt(trio.lowlevel.current_task(), scope, step)
    result: list[Any] = []
    if step == 0:  # cancelled before it began
        scope.cancel()
    trio.lowlevel.add_instrument(instrument)
    try:
        with scope:
            result.append(await call())
    finally:
        trio.lowlevel.remove_instrument(instrument)
    return bool(result), result[0] if result else None


async def every_cancel_point(
    call: Callable[[int], Awaitable[Any]],
    after: Callable[[int, bool, Any], Awaitable[None]],
    before: Callable[[int], Awaitable[None]] | None = None,
) -> int:
    """``call(n)`` cancelled at its step n = 0 (before it began), 1, 2, ... until it completes.

    ``after(n, completed, result)`` checks each run.

    ``before(n)``, when given, runs first, uncancelled.
    """
    for step in range(MOST_STEPS):
        if before is not None:
            await before(step)
        completed, result = await run_cancelled_at(step, functools.partial(call, step))
        await after(step, completed, result)
        if completed:
            return step
    raise AssertionError(f"the call was still cancelled after {MOST_STEPS} steps")


@pytest.fixture
def watcher(postgres_cluster: Cluster) -> Any:
    conn = admin(postgres_cluster)
    try:
        yield conn
    finally:
        conn.close()


async def held_by(mine: PostgresStore, watcher: psycopg.Connection[Any], schema: str) -> list[str]:
    """What this worker still holds on the server once nothing of it is live.

    Pooled: the sessions its leases name (released before the call returned).
    Per-session: the advisory locks of its connections; a connection whose
    lock was unknown is closed, and the server lets go of its lock once it
    notices, so that is waited for (bounded).
    """
    if isinstance(mine, PooledPostgresStore):
        return leases_of(watcher, schema, mine.worker_id)
    count = 0
    with trio.move_on_after(5.0):
        while True:
            row = watcher.execute(
                "SELECT count(*) FROM pg_locks l JOIN pg_stat_activity a ON a.pid = l.pid "
                "WHERE l.locktype = 'advisory' AND l.granted AND a.application_name = 'trio-harness'"
            ).fetchone()
            count = int(row[0]) if row else 0
            if count == 0:
                break
            await trio.sleep(0.005)
    return ["advisory lock"] * count


async def free_for_another_worker(other: PostgresStore, session_id: str) -> None:
    """Another worker takes ``session_id`` (waiting up to its lock_timeout) and lets it go."""
    _, writer = await other.resume(session_id)
    await writer.aclose()


@pytest.mark.parametrize("mode", MODES)
async def test_open_writer_cancelled_at_every_checkpoint_leaves_the_id_free(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, watcher: psycopg.Connection[Any]
) -> None:
    mine = make(mode, postgres_cluster.dsn(), schema)
    other = make(mode, postgres_cluster.dsn(), schema)
    async with mine, other:

        async def call(step: int) -> Any:
            return await mine.open_writer(SessionHeader(id=f"new-{step}", cwd="/w", created_at=1.0))

        async def after(step: int, completed: bool, writer: Any) -> None:
            if completed:
                await writer.aclose()
            assert mine._writers == {}
            assert await held_by(mine, watcher, schema) == [], f"cancelled at step {step}"
            assert not await store.exists(f"new-{step}")
            # The id is free: another worker claims it, stores it and lets it go.
            claimed = await other.open_writer(SessionHeader(id=f"new-{step}", cwd="/w", created_at=1.0))
            await claimed.aclose()

        steps = await every_cancel_point(call, after)
    print(f"{mode}: open_writer cancelled at each of its {steps} steps")


@pytest.mark.parametrize("mode", MODES)
async def test_resume_cancelled_at_every_checkpoint_leaves_the_session_free(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, watcher: psycopg.Connection[Any]
) -> None:
    events = await stored_session(store, "s1")
    mine = make(mode, postgres_cluster.dsn(), schema)
    other = make(mode, postgres_cluster.dsn(), schema, lock_timeout=5.0)
    async with mine, other:

        async def call(step: int) -> Any:
            return await mine.resume("s1")

        async def after(step: int, completed: bool, result: Any) -> None:
            if completed:
                loaded, writer = result
                assert loaded.events == events
                await writer.aclose()
            assert mine._writers == {}
            assert await held_by(mine, watcher, schema) == [], f"cancelled at step {step}"
            await free_for_another_worker(other, "s1")

        steps = await every_cancel_point(call, after)
    assert (await store.load("s1")).events == events
    print(f"{mode}: resume cancelled at each of its {steps} steps")


@pytest.mark.parametrize("mode", MODES)
async def test_a_flush_cancelled_at_every_checkpoint_stores_whole_batches_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, watcher: psycopg.Connection[Any]
) -> None:
    await stored_session(store, "s1")
    mine = make(mode, postgres_cluster.dsn(), schema)
    async with mine:
        sessions = SessionRegistry(mine)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        session = entry.session

        async def call(step: int) -> None:
            one_turn(session, step + 1, f"turn {step}")
            await session.flush()

        async def after(step: int, completed: bool, result: Any) -> None:
            stored = (await store.load("s1")).events
            # A prefix of the session, each event once (load refuses a gap; equality refuses a duplicate).
            assert stored == tuple(session.events)[: len(stored)], f"cancelled at step {step}"
            if not completed:
                await session.flush()  # the rest, once
            assert (await store.load("s1")).events == tuple(session.events), f"cancelled at step {step}"

        steps = await every_cancel_point(call, after)
        await sessions.detach(entry)
        assert await held_by(mine, watcher, schema) == []
    print(f"{mode}: flush cancelled at each of its {steps} steps")


@pytest.mark.parametrize("mode", MODES)
async def test_aclose_cancelled_at_every_checkpoint_still_releases_the_session(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, watcher: psycopg.Connection[Any]
) -> None:
    events = await stored_session(store, "s1")
    mine = make(mode, postgres_cluster.dsn(), schema)
    other = make(mode, postgres_cluster.dsn(), schema, lock_timeout=5.0)
    async with mine, other:
        writers: list[Any] = []

        async def before(step: int) -> None:
            writers.append((await mine.resume("s1"))[1])

        async def call(step: int) -> None:
            await writers[-1].aclose()

        async def after(step: int, completed: bool, result: Any) -> None:
            assert mine._writers == {}, f"cancelled at step {step}"
            assert await held_by(mine, watcher, schema) == [], f"cancelled at step {step}"
            await free_for_another_worker(other, "s1")

        steps = await every_cancel_point(call, after, before)
    assert (await store.load("s1")).events == events
    print(f"{mode}: aclose cancelled at each of its {steps} steps")


@pytest.mark.parametrize("mode", MODES)
async def test_a_post_cancelled_at_every_checkpoint_is_stored_at_most_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    mine = make(mode, postgres_cluster.dsn(), schema)
    posted: list[str] = []
    async with mine:

        async def call(step: int) -> None:
            await mine.post("s1", InboxMessage(f"p{step}", f"post {step}"))

        async def after(step: int, completed: bool, result: Any) -> None:
            pending = [message.id for message in await store.pending_mail("s1")]
            assert len(pending) == len(set(pending)), pending
            if completed:
                posted.append(f"p{step}")
            assert set(posted) <= set(pending)
            assert set(pending) <= {f"p{n}" for n in range(1, step + 1)}

        await every_cancel_point(call, after)
    assert posted


@pytest.mark.parametrize("mode", MODES)
async def test_a_first_flush_cancelled_at_every_checkpoint_stores_the_session_once(
    mode: str, postgres_cluster: Cluster, schema: str, store: PostgresStore, watcher: psycopg.Connection[Any]
) -> None:
    mine = make(mode, postgres_cluster.dsn(), schema)
    async with mine:
        sessions = SessionRegistry(mine)
        entries: list[Any] = []

        async def before(step: int) -> None:
            entries.append(sessions.enter(await sessions.prepare_new(f"new-{step}", cwd="/w")))
            one_turn(entries[-1].session, 1)

        async def call(step: int) -> None:
            await entries[-1].session.flush()

        async def after(step: int, completed: bool, result: Any) -> None:
            session = entries[-1].session
            if await store.exists(f"new-{step}"):
                stored = (await store.load(f"new-{step}")).events
                assert stored == tuple(session.events)[: len(stored)], f"cancelled at step {step}"
            one_turn(session, 2)  # more events before the next flush: it stores the rest, once
            await session.flush()
            assert (await store.load(f"new-{step}")).events == tuple(session.events), f"cancelled at step {step}"
            await sessions.detach(entries[-1])

        steps = await every_cancel_point(call, after, before)
        assert await held_by(mine, watcher, schema) == []
    print(f"{mode}: a first flush cancelled at each of its {steps} steps")
