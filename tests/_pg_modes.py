"""The two modes of the PostgreSQL store, for tests parametrized over both.

``per-session``: :class:`~trio_harness.session.PostgresStore` (a connection and
an advisory lock per live session); ``pooled``:
:class:`~trio_harness.session.PooledPostgresStore` (a liveness lock per worker,
leases with an epoch fence, group commit).
"""

from __future__ import annotations

from typing import Any

from trio_harness.session import PooledPostgresStore, PostgresStore

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
