"""The store's tables: their statements, their versions, and the check that creates or upgrades them.

:data:`SCHEMA_VERSION` names the tables' version, kept in ``schema_version``;
:meth:`_Tables.migrate` brings a schema to it, idempotently, under a
transaction-level advisory lock, so many workers may run it at once.  The
writer (:mod:`._pg_writer`) and the store (:mod:`._postgres`) build their
statements on :class:`_Sql`.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._errors import SessionStoreError
from ._blobs import blobs_table

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("trio_harness.session.postgres")

SCHEMA_VERSION = 4
"""The version of the tables this store writes (kept in ``schema_version``; 2 added ``blobs``, 3 ``leases``,
4 the events' ``n``: a row holds a group-committed flush, session/_pg_rows.py)."""

# How long an upgrade waits for a table it alters, and how often it tries (see _Tables.migrate_retried).
_ALTER_WAIT = 1.0
_ALTER_TRIES = 10

_INSTALL_HINT = "install the PostgreSQL extra: pip install 'trio-harness[postgres]'"


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _lock_key(schema: str, session_id: str) -> int:
    """The advisory lock key of a session: 64 bits of a hash of schema and id."""
    digest = hashlib.blake2b(f"{schema}\x00{session_id}".encode(), digest_size=8, person=b"th-session").digest()
    return int.from_bytes(digest, "big", signed=True)


def lease_table(s: str) -> str:
    """The statement creating the ``leases`` table of the schema ``s`` (quoted), if missing (session/_pg_leases.py).

    ``IF NOT EXISTS``: a pooled worker of an older trio-harness created it
    itself when it opened a version-2 schema.
    """
    return (
        f"CREATE TABLE IF NOT EXISTS {s}.leases (session_id text PRIMARY KEY, worker_id text, "
        "worker_key bigint, epoch bigint NOT NULL)"
    )


def _scalar(conn: psycopg.Connection[Any], query: str, params: Sequence[Any] | Mapping[str, Any] | None = None) -> Any:
    """(worker thread) The first column of the first row ``query`` returns."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise SessionStoreError(f"PostgreSQL returned no row for {query!r}")
    return row[0]


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
        raise SessionStoreError(f"the PostgreSQL store needs the psycopg driver: {_INSTALL_HINT}") from exc
    return psycopg


@attrs.frozen
class _Sql:
    """Every statement of the store, with its schema quoted in."""

    schema: str

    @property
    def s(self) -> str:
        return _quote(self.schema)

    @property
    def channel(self) -> str:
        # pg_notify channels are at most 63 bytes: a fixed-length name per schema.
        return "th_mail_" + hashlib.blake2b(self.schema.encode(), digest_size=8).hexdigest()

    def migrations(self) -> list[list[str]]:
        s = self.s
        return [
            [
                f"CREATE TABLE {s}.sessions (id text PRIMARY KEY, header text NOT NULL, "
                "created_at double precision NOT NULL, parent_session text, "
                "stored_at timestamptz NOT NULL DEFAULT now())",
                f'CREATE INDEX sessions_created_at ON {s}.sessions (created_at, id COLLATE "C")',
                f"CREATE TABLE {s}.events (session_id text NOT NULL, seq bigint NOT NULL, body text NOT NULL, "
                "PRIMARY KEY (session_id, seq))",
                f"CREATE TABLE {s}.mailbox (id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY, "
                "session_id text NOT NULL, body text NOT NULL, posted_at timestamptz NOT NULL DEFAULT now())",
                f"CREATE INDEX mailbox_session ON {s}.mailbox (session_id, id)",
            ],
            [blobs_table(s)],  # large message images by reference (session/_blobs.py)
            [lease_table(s)],  # the pooled mode's leases, respected by both modes (session/_pg_leases.py)
            # How many events a row holds, its key the last one's seq (session/_pg_rows.py); every older row holds one.
            [f"ALTER TABLE {s}.events ADD COLUMN IF NOT EXISTS n integer NOT NULL DEFAULT 1"],
        ]

    @property
    def insert_session(self) -> str:
        """The session row; returns a row only when it was inserted (the id was free)."""
        return (
            f"INSERT INTO {self.s}.sessions (id, header, created_at, parent_session) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING RETURNING 1"
        )

    def append_events(self, *, sync: bool) -> bytes:
        """A batch of events as one statement, its own transaction: ``$1`` session id, ``$2`` first seq, ``$3`` bodies.

        Without ``sync`` the statement turns ``synchronous_commit`` off for
        its own (implicit) transaction, whose commit then does not wait for
        the WAL to reach the disk; with it, the server's setting holds.
        """
        query = (
            f"INSERT INTO {self.s}.events (session_id, seq, body) "
            "SELECT $1, $2 + o - 1, b FROM unnest($3::text[]) WITH ORDINALITY AS t(b, o)"
        )
        if not sync:
            query += " WHERE set_config('synchronous_commit', 'off', true) IS NOT NULL"
        return query.encode()

    # A transaction whose commit waits for the WAL up to it (and all before): it must take a transaction
    # id *and* write WAL (a transactional logical message, ignored by everyone), or the server commits it
    # without flushing (``pg_current_xact_id()`` alone took an id but wrote nothing: an unsynced commit
    # before it stayed in memory).
    sync_point = b"SELECT pg_logical_emit_message(true, 'trio_harness', '')"

    @property
    def insert_events(self) -> str:
        return (
            f"INSERT INTO {self.s}.events (session_id, seq, body) "
            "SELECT %s, %s + o - 1, b FROM unnest(%s::text[]) WITH ORDINALITY AS t(b, o)"
        )


@attrs.frozen
class _Tables:
    """Creating, upgrading and checking the tables of one schema (every method runs on a worker thread)."""

    sql: _Sql
    # Where the tables are, for messages.
    location: str

    def check_version(self, conn: psycopg.Connection[Any]) -> None:
        """(worker thread) Raise, naming ``check()`` or an upgrade, unless the tables are at :data:`SCHEMA_VERSION`."""
        pg = _psycopg()
        try:
            version = _scalar(conn, f"SELECT coalesce(max(version), 0) FROM {self.sql.s}.schema_version")
        except (pg.errors.UndefinedTable, pg.errors.InvalidSchemaName):
            version = 0  # never checked: no tables at all
        if version != SCHEMA_VERSION:
            raise self.version_error(version)

    def version_error(self, version: int) -> SessionStoreError:
        if version > SCHEMA_VERSION:
            return SessionStoreError(
                f"the session tables in {self.location} are at version {version}, written by a newer "
                f"trio-harness (this one knows versions up to {SCHEMA_VERSION}); upgrade trio-harness",
                path=self.location,
            )
        return SessionStoreError(
            f"the session tables in {self.location} are at version {version}; run check() to upgrade them",
            path=self.location,
        )

    def migrate(self, conn: psycopg.Connection[Any]) -> None:
        """(worker thread) Bring the schema to :data:`SCHEMA_VERSION`."""
        pg = _psycopg()
        sql = self.sql
        if conn.info.server_version < 140000:
            raise SessionStoreError(
                f"{self.location} runs PostgreSQL {conn.info.server_version // 10000}; the session store needs "
                "PostgreSQL 14 or newer (idle_session_timeout evicts frozen workers)",
                path=self.location,
            )
        database, role, encoding = conn.execute(
            "SELECT current_database(), current_user, pg_encoding_to_char(encoding) FROM pg_database "
            "WHERE datname = current_database()"
        ).fetchone() or ("?", "?", "?")
        if encoding != "UTF8":
            raise SessionStoreError(
                f"the PostgreSQL database {database!r} of {self.location} has the encoding {encoding}; the session "
                "store needs UTF8 (its events hold any Unicode text): use a database created with "
                f"CREATE DATABASE ... ENCODING 'UTF8' TEMPLATE template0",
                path=self.location,
            )
        try:
            version = _scalar(conn, f"SELECT coalesce(max(version), 0) FROM {sql.s}.schema_version")
        except (pg.errors.UndefinedTable, pg.errors.InvalidSchemaName):
            version = 0
        if version == SCHEMA_VERSION:
            self.check_privileges(conn)
            return
        if version > SCHEMA_VERSION:
            raise self.version_error(version)
        try:
            self.migrate_retried(conn, version)
        except pg.errors.InsufficientPrivilege as exc:
            if "must be owner" in str(exc):  # ALTER TABLE (version 4): only the table's owner may
                raise SessionStoreError(
                    f"the session tables in {self.location} are at version {version} and only the owner of their "
                    f"tables may upgrade them ({str(exc).strip()}): run check() once as that role, or make the "
                    f"role of this store their owner (ALTER TABLE {sql.s}.events OWNER TO {_quote(role)})",
                    path=self.location,
                ) from exc
            schema_exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (sql.schema,)).fetchone()
            grant = (
                f"GRANT CREATE ON SCHEMA {sql.s} TO {_quote(role)}"
                if schema_exists
                else f"GRANT CREATE ON DATABASE {_quote(database)} TO {_quote(role)}"
            )
            raise SessionStoreError(
                f"the role {role!r} may not create the session tables in {self.location} "
                f"({str(exc).strip()}): run {grant}, or let an owner run the first check()",
                path=self.location,
            ) from exc
        self.check_privileges(conn)

    def migrate_retried(self, conn: psycopg.Connection[Any], version: int) -> None:
        """(worker thread) :meth:`migrate_from`, tried again while a table it alters is in use.

        An upgrade that alters a table (version 4) waits at most
        ``_ALTER_WAIT`` for its lock, so the fleet's reads and writes queued
        behind it stall no longer than that; then it rolls back, lets them
        run for as long again, and tries again, ``_ALTER_TRIES`` times.
        """
        pg = _psycopg()
        for attempt in range(1, _ALTER_TRIES + 1):
            try:
                self.migrate_from(conn, version)
                return
            except pg.errors.LockNotAvailable as exc:
                if attempt == _ALTER_TRIES:
                    raise SessionStoreError(
                        f"cannot upgrade the session tables in {self.location}: their tables were in use by "
                        f"transactions that held them throughout {_ALTER_TRIES} tries of {_ALTER_WAIT:g} s each "
                        f"({str(exc).strip()}); run check() again once long transactions on them have ended",
                        path=self.location,
                    ) from exc
                log.warning("%s: the session tables are in use, their upgrade waits (%s)", self.location, exc)
                conn.execute("SELECT pg_sleep(%s)", (_ALTER_WAIT,))

    def migrate_from(self, conn: psycopg.Connection[Any], version: int) -> None:
        """(worker thread) Create or upgrade the tables from ``version``, in one transaction."""
        sql = self.sql
        with conn.transaction():
            # One migrating worker at a time; the others find the work done.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(sql.schema, "\x00migrate"),))
            # From here on, a lock the upgrade waits for (ALTER TABLE's) fails it after a while, rather than
            # queueing every statement of the fleet on that table behind it for as long as it waits.
            conn.execute("SELECT set_config('lock_timeout', %s, true)", (f"{round(_ALTER_WAIT * 1000)}ms",))
            if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (sql.schema,)).fetchone():
                conn.execute(f"CREATE SCHEMA {sql.s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {sql.s}.schema_version (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            version = _scalar(conn, f"SELECT coalesce(max(version), 0) FROM {sql.s}.schema_version")
            if version > SCHEMA_VERSION:
                raise self.version_error(version)
            for number, statements in enumerate(sql.migrations(), start=1):
                if number <= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"INSERT INTO {sql.s}.schema_version (version) VALUES (%s)", (number,))
                log.info("%s: session tables migrated to version %d", self.location, number)

    def check_privileges(self, conn: psycopg.Connection[Any]) -> None:
        s = self.sql.schema
        needed = [
            ("sessions", "SELECT"),
            ("sessions", "INSERT"),
            ("events", "SELECT"),
            ("events", "INSERT"),
            ("mailbox", "SELECT"),
            ("mailbox", "INSERT"),
            ("mailbox", "DELETE"),
            ("blobs", "SELECT"),
            ("blobs", "INSERT"),
            # Both modes take sessions through the leases (session/_pg_leases.py): a pooled take upserts its
            # lease, a per-session take fences a free one (FOR UPDATE, then UPDATE).
            ("leases", "SELECT"),
            ("leases", "INSERT"),
            ("leases", "UPDATE"),
        ]
        checks = ", ".join("has_table_privilege(%s, %s)" for _ in needed)
        params: list[str] = []
        for table, privilege in needed:
            params += [f"{_quote(s)}.{table}", privilege]
        row = conn.execute(f"SELECT {checks}", params).fetchone() or ()
        missing = [f"{privilege} on {table}" for (table, privilege), ok in zip(needed, row) if not ok]
        if missing:
            raise SessionStoreError(
                f"the role of {self.location} lacks {', '.join(missing)}; grant them "
                f"(GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {_quote(s)} TO <role>; "
                f"GRANT UPDATE ON {_quote(s)}.leases TO <role>)",
                path=self.location,
            )
