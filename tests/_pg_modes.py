"""The two modes of the PostgreSQL store, for tests parametrized over both.

``per-session``: :class:`~trio_harness.session.PostgresStore` (a connection and
an advisory lock per live session); ``pooled``:
:class:`~trio_harness.session.PooledPostgresStore` (a liveness lock per worker,
leases with an epoch fence, group commit).
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from typing import TYPE_CHECKING, Any

import attrs
import pytest
from _postgres import Cluster, admin

from trio_harness.session import PooledPostgresStore, PostgresStore, SessionEntry, SessionRegistry

if TYPE_CHECKING:
    import psycopg

MODES = ["per-session", "pooled"]


def make(mode: str, dsn: str, schema: str, **settings: Any) -> PostgresStore:
    """A store of ``mode`` (not open yet)."""
    cls = PooledPostgresStore if mode == "pooled" else PostgresStore
    return cls(dsn, schema=schema, **settings)


def options(mode: str) -> tuple[str, ...]:
    """The command-line options of a worker process (tests/_postgres.py) of ``mode``."""
    return ("--pooled",) if mode == "pooled" else ()


def leases_of(conn: Any, schema: str, worker_id: str) -> list[str]:
    """The sessions whose lease names ``worker_id`` (a pooled worker), read on an admin connection."""
    rows = conn.execute(
        f'SELECT session_id FROM "{schema}".leases WHERE worker_id = %s ORDER BY session_id', (worker_id,)
    ).fetchall()
    return [row[0] for row in rows]


@attrs.define(eq=False)
class TimedOutRelease:
    """A pooled worker whose release of a session timed out (see :func:`a_release_that_timed_out`)."""

    store: PooledPostgresStore
    sessions: SessionRegistry
    # The detached session (its lease not released yet).
    entry: SessionEntry
    # An admin connection in a transaction that holds the leases table locked.
    locker: psycopg.Connection[Any]

    def unlock(self) -> None:
        """End the locker's transaction: the leases table is free again (once; then a no-op)."""
        if self.locker.info.transaction_status != 0:  # still in the transaction
            self.locker.execute("COMMIT")


@contextlib.asynccontextmanager
async def a_release_that_timed_out(
    cluster: Cluster, schema: str, caplog: pytest.LogCaptureFixture, *, release_timeout: float, session_id: str = "s1"
) -> AsyncIterator[TimedOutRelease]:
    """A pooled worker (open for the block) that resumed the stored ``session_id`` and detached it
    while another connection held the leases table locked: the release timed out (and said so in a
    warning).  The table stays locked until :meth:`TimedOutRelease.unlock` (at the latest, the end
    of the block); the worker's heartbeat (every 0.2 s) retries the release.
    """
    first = PooledPostgresStore(
        cluster.dsn(), schema=schema, release_timeout=release_timeout, heartbeat=0.2, idle_session_timeout=1.0
    )
    async with first:
        sessions = SessionRegistry(first)
        entry = sessions.enter(await sessions.prepare_resume(session_id))
        locker = admin(cluster)
        timed_out = TimedOutRelease(first, sessions, entry, locker)
        try:
            locker.execute("BEGIN")
            locker.execute(f"LOCK TABLE {schema}.leases IN EXCLUSIVE MODE")  # every release waits, then times out
            with caplog.at_level(logging.WARNING, logger="trio_harness.session.postgres"):
                await sessions.detach(entry)
            assert "releasing its lease failed" in caplog.text
            yield timed_out
        finally:
            timed_out.unlock()
            locker.close()
