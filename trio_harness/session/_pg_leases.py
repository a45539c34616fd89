"""Leases of the pooled PostgreSQL store, and how both modes respect them on one schema.

A pooled worker holds a live session as a ``leases`` row (``_pg_pooled``); a
per-session worker holds it as the session's advisory lock on a connection of
its own (``_pg_writer``).  Both modes may share a schema (a fleet moving from
one mode to the other runs both for a while): each mode's take refuses a
session the other holds, race-free, because both take the **same advisory
lock key** of the session, in different scopes:

* a pooled take is one transaction that first takes the session's lock at
  transaction level (``pg_try_advisory_xact_lock``, refused while a
  per-session writer holds it at session level), then upserts the lease;
* a per-session take takes the lock at session level, then, in a later
  statement (a snapshot taken after the lock), checks the lease
  (:func:`fence_lease`): a lease held by a live pooled worker refuses the
  take (the lock is given back); a free one has its epoch bumped, so the
  pooled writer that held it (frozen, its liveness lock lost) is fenced.

Either the per-session lock came first (the pooled take's transaction-level
try is refused), or the pooled take's transaction committed before the lock
was taken (the check, later, sees the lease): the two can never both hold the
session.  ``save`` and ``copy_prefix`` into a new id (:func:`claim_new_id`)
take the same lock at transaction level and check the lease the same way, in
the transaction that stores the id: an id a pooled worker is creating (its
lease held, nothing stored yet) is refused, and a pooled take waits for (or is
refused by) the storing transaction, then finds the id stored.

The per-session take itself (:func:`_try_lock`) is here too, with its refusal
of a connection that holds advisory locks already (:func:`_check_tainted`).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import trio

from .._errors import SessionStoreError
from ._pg_schema import _lock_key, _psycopg, _scalar, _Sql

if TYPE_CHECKING:
    import psycopg


def free_clause(alias: str) -> str:
    """True when the lease row ``alias`` names no worker, or one whose liveness lock nobody holds."""
    return (
        f"({alias}.worker_id IS NULL OR NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
        "AND granted AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND classid::bigint = (({alias}.worker_key >> 32) & 4294967295) "
        f"AND objid::bigint = ({alias}.worker_key & 4294967295)))"
    )


def take_statement(s: str) -> str:
    """The pooled take's upsert (parameters: session id, worker id, worker key, worker id): its new epoch, or no row.

    Allowed when the lease is free, or names this worker: its process never
    has two writers of one session, so such a row is a lease of this worker
    that was not released (a release that failed, a take whose answer was
    lost), taken again here.
    """
    return (
        f"INSERT INTO {s}.leases AS leases (session_id, worker_id, worker_key, epoch) VALUES (%s, %s, %s, 1) "
        "ON CONFLICT (session_id) DO UPDATE SET worker_id = EXCLUDED.worker_id, "
        "worker_key = EXCLUDED.worker_key, epoch = leases.epoch + 1 "
        f"WHERE leases.worker_id = %s OR {free_clause('leases')} RETURNING epoch"
    )


def take_lease(
    conn: psycopg.Connection[Any],
    sql: _Sql,
    session_id: str,
    worker_id: str,
    worker_key: int,
    *,
    wait: float | None = None,
) -> int | None:
    """(worker thread) The pooled take, one transaction: the lease's new epoch, or None when the session is held.

    Held: by a per-session writer (the session's advisory lock; also a
    ``save`` or fork storing the id right now), or by another live pooled worker.

    ``wait`` (seconds): the take run again after its connection was lost.
    The lost take may still be running on the server (until its COMMIT
    ends), holding the session's lock: this one waits up to ``wait``
    seconds for the lock instead of trying it once, so it runs after the
    lost one and finds its lease (the row names this worker: taken again),
    never refusing a session that the lost take committed to this worker.
    A lock still held after ``wait`` seconds is a refusal.
    """
    key = _lock_key(sql.schema, session_id)
    try:
        with conn.transaction():
            if wait is None:
                if not _scalar(conn, "SELECT pg_try_advisory_xact_lock(%s)", (key,)):
                    return None
            else:
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{max(1, math.ceil(wait * 1000))}ms",))
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (key,))
            row = conn.execute(take_statement(sql.s), (session_id, worker_id, worker_key, worker_id)).fetchone()
    except _psycopg().errors.LockNotAvailable:
        if wait is None:
            raise
        return None
    return None if row is None else int(row[0])


def _has_leases(conn: psycopg.Connection[Any], sql: _Sql) -> bool:
    """(worker thread) Whether the schema has a ``leases`` table.

    Created by ``check()`` since version 3 (session/_pg_schema.py); a
    per-session store opened on an older schema without ``check()`` finds
    none (and no pooled worker can have used it: a pooled store refuses it).
    """
    return _scalar(conn, "SELECT to_regclass(%s) IS NOT NULL", (f"{sql.s}.leases",)) is True


def fence_lease(conn: psycopg.Connection[Any], sql: _Sql, session_id: str) -> bool:
    """(worker thread, the session's advisory lock held) Whether a live pooled worker holds the session's lease.

    When it does not, a lease row left by a pooled worker has its epoch bumped
    (and names no worker), so that worker's writer, were it only frozen,
    never writes the session again.  Run after the lock is taken, in a
    statement of its own (its snapshot sees every pooled take that committed
    before the lock).  One statement: the row is locked ``FOR UPDATE`` (after
    any append holding it ``FOR SHARE``) and updated when free.  While the
    lock is held no take can make a free lease held (a take needs the lock),
    so the only change the row may see meanwhile is a release: at worst a
    lease released during the statement is reported held, a refusal.
    """
    if not _has_leases(conn, sql):
        return False
    s = sql.s
    row = conn.execute(
        f"WITH cur AS (SELECT le.session_id, {free_clause('le')} AS free FROM {s}.leases le "
        "WHERE le.session_id = %s FOR UPDATE), "
        f"fenced AS (UPDATE {s}.leases l SET worker_id = NULL, worker_key = NULL, epoch = l.epoch + 1 FROM cur "
        "WHERE l.session_id = cur.session_id AND cur.free RETURNING 1) "
        "SELECT coalesce(bool_or(NOT cur.free), false) FROM cur",
        (session_id,),
    ).fetchone()
    return row is not None and bool(row[0])


def lease_held(conn: psycopg.Connection[Any], sql: _Sql, session_id: str) -> bool:
    """(worker thread) Whether a live pooled worker holds the session's lease (a read, nothing changed)."""
    if not _has_leases(conn, sql):
        return False
    row = conn.execute(
        f"SELECT NOT {free_clause('le')} FROM {sql.s}.leases le WHERE le.session_id = %s", (session_id,)
    ).fetchone()
    return row is not None and bool(row[0])


def claim_new_id(conn: psycopg.Connection[Any], sql: _Sql, session_id: str) -> bool:
    """(worker thread, in the transaction storing a new session: ``save``, ``copy_prefix``) Whether the id is free.

    Not free while a writer holds it or creates it: a per-session one (its
    advisory lock), or a live pooled one (its lease).  The lock is taken for
    the transaction, so neither mode takes the id before it is stored.
    """
    if not _scalar(conn, "SELECT pg_try_advisory_xact_lock(%s)", (_lock_key(sql.schema, session_id),)):
        return False
    return not fence_lease(conn, sql, session_id)


# ---------------------------------------------------------------- the per-session take


class _Tainted(Exception):
    """A connection about to take a session's lock already holds an advisory lock (it must not lock re-entrantly)."""


# Connections in a row a take may find holding advisory locks already (tainted) before it fails.  A
# connection of its own (a new server session) holds none, so finding it again means the connections
# share their server sessions: a transaction-pooling proxy.  Past the take's deadline the second one fails it.
_TAINTED_LIMIT = 3


def _check_tainted(location: str, session_id: str, tainted: int, deadline: float) -> None:
    """Fail a take that met ``tainted`` connections in a row already holding advisory locks, once too many.

    Raises:
        SessionStoreError: ``_TAINTED_LIMIT`` of them, or two once ``deadline`` passed; naming the likely cause.
    """
    if tainted < _TAINTED_LIMIT and (tainted < 2 or trio.current_time() < deadline):
        return
    raise SessionStoreError(
        f"cannot take the lock of session {session_id!r} in {location}: {tainted} connections in a row "
        "reached a server session already holding advisory locks it did not take; the per-session mode keeps "
        "each session's lock on a connection of its own (session state), so it cannot run behind a "
        "transaction-pooling proxy (such as PgBouncer with pool_mode = transaction), which shares server "
        "sessions among its clients: connect it to the server or to a session-pooling proxy, or use "
        "PooledPostgresStore (whose shared pool may go through a transaction pooler)",
        path=location,
        session_id=session_id,
    )


def _try_lock(conn: psycopg.Connection[Any], key: int, sql: _Sql, session_id: str) -> bool:
    """(worker thread) Take the session-level advisory lock ``key`` of ``session_id`` if it is free.

    Advisory locks are re-entrant within a connection, so a connection that
    holds any already would "take" a session it holds and keep it after one
    unlock: it is refused with :exc:`_Tainted` (the caller closes it).  A
    session whose lease a live pooled worker holds is refused too (the lock
    given back), and a free lease fenced (:func:`._pg_leases.fence_lease`).
    """
    row = conn.execute(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) "
        "THEN NULL ELSE pg_try_advisory_lock(%s) END",
        (key,),
    ).fetchone()
    if row is None or row[0] is None:
        raise _Tainted
    if row[0] and fence_lease(conn, sql, session_id):
        conn.execute("SELECT pg_advisory_unlock(%s)", (key,))
        return False
    return bool(row[0])


def _lock_holder(conn: psycopg.Connection[Any], key: int) -> int | None:
    """(worker thread) The server process holding the session-level advisory lock ``key``; None if it is free."""
    row = conn.execute(
        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
        "AND classid::bigint = %s AND objid::bigint = %s",
        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
    ).fetchone()
    return None if row is None else int(row[0])
