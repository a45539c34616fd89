"""The PostgreSQL session store: one live writer per session across machines.

Sessions live in three tables of one schema (``trio_harness`` by default),
created and versioned by the store itself (:meth:`PostgresStore.check`
migrates, idempotently, under a transaction-level advisory lock)::

    sessions (id text primary key, header text, created_at, parent_session)
    events   (session_id text, seq bigint, body text, primary key (session_id, seq))
    mailbox  (id bigint identity primary key, session_id text, body text, posted_at)
    schema_version (version integer primary key, applied_at)

``body`` and ``header`` hold the codec's exact JSON lines as text, so reads are
byte-exact and the strict codec still validates them.

The driver is the synchronous psycopg 3 run on worker threads, every call
cancellation-safe (:mod:`._pg_threads`: psycopg's asyncio connection does not
run under Trio); a live session's appends (its checkpoints) are instead one
prepared statement each, sent through libpq's non-blocking API from the Trio
thread (:mod:`._pg_wire`), with the same cancellation contract.  A live session's statements are bounded by
``write_timeout``.

One live writer per session (:mod:`._pg_writer`): a writer holds a
session-level advisory lock on a connection of its own, taken by
:meth:`PostgresStore.resume` before the log is read and by the first
flush of a new session, and sends every append of that session over the same
connection.  A writer's connection is kept alive by a heartbeat and killed by
the server when it stops (``idle_session_timeout``), so a frozen worker loses
its sessions within a bounded time and a killed one at once.

Messages posted to a session (:meth:`PostgresStore.post`) are a mailbox
row plus ``pg_notify`` in one transaction; the worker holding the session
listens on a dedicated connection, takes the rows and splices them into the
agent's inbox, deleting them in the transaction that stores the splice.
"""

from __future__ import annotations

import builtins
import functools
import itertools
import json
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final, TypeVar

import attrs
import trio

from .._errors import (
    EventDecodeError,
    SessionCorruptError,
    SessionError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
    UnsupportedFormatError,
)
from .._redact import redact_urls
from ._blobs import copy_blobs, encode_stored, insert_blobs, select_blob
from ._codec import decode_header, decode_inbox_message, encode_header, encode_inbox_message
from ._events import Event, InboxMessage, SessionHeader
from ._persistence import LoadedSession
from ._pg_leases import _check_tainted, _Tainted, _try_lock, claim_new_id
from ._pg_rows import copy_prefix_statement, decode_stored, each_event, select_from, select_page
from ._pg_schema import _lock_key, _psycopg, _quote, _scalar, _Sql, _Tables
from ._pg_threads import _call, _execute, _open_connection, _Pool, worth_retrying
from ._pg_writer import _PgWriter, claim_new
from ._session import SessionWriter, validate_session_id

if TYPE_CHECKING:
    from types import TracebackType

    import psycopg


log = logging.getLogger("trio_harness.session.postgres")

T = TypeVar("T")

# Connection failures no retry can fix: a wrong URL, role, password or database.
_PERMANENT = (
    "does not exist",
    "authentication failed",
    "no pg_hba.conf entry",
    "permission denied",
    "invalid",
    "password",
    "unsupported",
    "not supported",
)
_MAX_IDENTIFIER = 63

# libpq connection parameters that hold no credential: shown in messages (where the server is).
_PLAIN_PARAMETERS: Final = frozenset(
    {
        "host",
        "hostaddr",
        "port",
        "dbname",
        "user",
        "connect_timeout",
        "application_name",
        "sslmode",
        "target_session_attrs",
    }
)


def redact_dsn(dsn: str) -> str:
    """``dsn`` for messages and logs: its password and the values of query parameters
    other than :data:`_PLAIN_PARAMETERS` ``***`` (see :func:`~trio_harness._redact.redact_urls`),
    and a ``password=`` keyword's value too."""
    redacted = redact_urls(dsn, keep_user=True, keep_query=_PLAIN_PARAMETERS)
    return re.sub(r"(?i)(password\s*=\s*)('[^']*'|[^&\s]*)", r"\1***", redacted)


class _ShortPrefix(Exception):
    """A fork found fewer stored events than its boundary (the transaction rolls back)."""


# ---------------------------------------------------------------- the store


def _positive(name: str, value: float | None, *, optional: bool = False) -> None:
    if value is None and optional:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0 or math.isinf(value):
        raise ValueError(f"{name} must be a positive number of seconds, got {value!r}")


@attrs.define(eq=False, repr=False)
class PostgresStore:
    """Sessions stored in PostgreSQL, shared by workers on many machines.

    Use it through ``open_harness(store="postgresql://...")`` (or pass an
    instance), or open it yourself: ``async with PostgresStore(dsn) as
    store:``.  Reads and writes need it open (its service runs the writers'
    heartbeats and the mailbox listener); :meth:`check` does not.

    Args:
        dsn: a libpq connection URL or string (``postgresql://user@host/db``).
        schema: the schema holding the store's tables (created if missing).
        pool_size: connections shared by reads, lists, forks and posts; each
            live session holds one more connection of its own (its lock).
        lock_timeout: seconds :meth:`resume` keeps trying to take a session
            that another worker holds before it raises
            :exc:`SessionLockedError` (0: refuse at once).
        heartbeat: seconds between the statements that keep a live session's
            connection active (None: no heartbeat; then ``idle_session_timeout``
            must be None too).
        idle_session_timeout: seconds of silence after which the server drops
            a live session's connection, releasing the session (a frozen
            worker loses its sessions after at most this long).  None: never.
        connect_timeout: seconds spent connecting, retries with backoff
            included, before a connection failure is reported.
        release_timeout: seconds a closing writer waits to release its
            session before it drops the connection instead (which releases it
            too).
        write_timeout: seconds a live session's statement (a flush, a
            heartbeat, a mailbox read) may take before it is cancelled, its
            connection dropped and the call failed with
            :exc:`SessionStoreError` (a stopped backend, a paused machine, a
            long table lock).

    Raises:
        SessionStoreError: the DSN cannot be parsed, or psycopg is not installed.
        ValueError: a setting is out of range.
    """

    dsn: str
    schema: str = "trio_harness"
    pool_size: int = 4
    lock_timeout: float = 0.0
    heartbeat: float | None = 0.4
    idle_session_timeout: float | None = 2.0
    connect_timeout: float = 10.0
    release_timeout: float = 5.0
    write_timeout: float = 10.0
    # Seconds an idle pooled connection may rest before it is probed on reuse.
    probe_after: float = attrs.field(default=30.0, init=False)
    _sql: _Sql = attrs.field(init=False)
    _tables: _Tables = attrs.field(init=False)
    # The shared connections (reads, lists, forks, posts); writers take their own from it and give them back.
    _pool: _Pool | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _depth: int = attrs.field(default=0, init=False)
    _exit_stacks: list[AsyncExitStack] = attrs.field(factory=list, init=False)
    # Writers of this object holding their session, by session id.
    _writers: dict[str, _PgWriter] = attrs.field(factory=dict, init=False)
    _listening: bool = attrs.field(default=False, init=False)
    _checked: bool = attrs.field(default=False, init=False)
    _session_dsn: str | None = attrs.field(default=None, init=False)  # the listener's URL (None: dsn)

    def __attrs_post_init__(self) -> None:
        pg = _psycopg()
        if not isinstance(self.dsn, str):
            raise TypeError(f"dsn must be a str, got {type(self.dsn).__name__}")
        try:
            pg.conninfo.conninfo_to_dict(self.dsn)
        except pg.Error as exc:
            raise SessionStoreError(
                f"the PostgreSQL connection URL {redact_dsn(self.dsn)!r} cannot be parsed: "
                f"{redact_dsn(str(exc).strip())}; use postgresql://USER@HOST:PORT/DATABASE",
                path=redact_dsn(self.dsn),
            ) from None
        schema = self.schema
        if not isinstance(schema, str) or not schema or "\x00" in schema or len(schema.encode()) > _MAX_IDENTIFIER:
            raise ValueError(f"schema must be a PostgreSQL identifier of 1 to {_MAX_IDENTIFIER} bytes, got {schema!r}")
        if isinstance(self.pool_size, bool) or not isinstance(self.pool_size, int) or self.pool_size < 1:
            raise ValueError(f"pool_size must be a positive int, got {self.pool_size!r}")
        if (
            isinstance(self.lock_timeout, bool)
            or not isinstance(self.lock_timeout, int | float)
            or self.lock_timeout < 0
        ):
            raise ValueError(f"lock_timeout must be a number of seconds >= 0, got {self.lock_timeout!r}")
        _positive("heartbeat", self.heartbeat, optional=True)
        _positive("idle_session_timeout", self.idle_session_timeout, optional=True)
        _positive("connect_timeout", self.connect_timeout)
        _positive("release_timeout", self.release_timeout)
        _positive("write_timeout", self.write_timeout)
        if self.idle_session_timeout is not None and (
            self.heartbeat is None or self.heartbeat * 2 > self.idle_session_timeout
        ):
            raise ValueError(
                f"heartbeat ({self.heartbeat!r} s) must be at most half of idle_session_timeout "
                f"({self.idle_session_timeout!r} s), or the server drops live sessions between heartbeats"
            )
        self._sql = _Sql(schema)
        self._tables = _Tables(self._sql, self.location)

    def __repr__(self) -> str:
        return f"PostgresStore({redact_dsn(self.dsn)!r}, schema={self.schema!r})"

    @property
    def location(self) -> str:
        """Where the sessions are, for messages: the URL without its password, and the schema."""
        return f"{redact_dsn(self.dsn)} (schema {self.schema})"

    # ------------------------------------------------------------ service

    async def __aenter__(self) -> PostgresStore:
        stack = AsyncExitStack()
        await stack.enter_async_context(self.open_service())
        self._exit_stacks.append(stack)
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> bool | None:
        return await self._exit_stacks.pop().__aexit__(exc_type, exc, tb)

    @asynccontextmanager
    async def open_service(self) -> AsyncIterator[PostgresStore]:
        """Run the store's service for the block: its pool, heartbeats and mailbox listener.

        Opening it again while it is open is allowed; the outermost opening
        owns the service.  On exit every writer still open releases its
        session and every connection is closed.
        """
        if self._nursery is not None:
            self._depth += 1
            try:
                yield self
            finally:
                self._depth -= 1
            return
        body_error: BaseException | None = None
        unwrapped: BaseException | None = None
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                pool = self._pool = _Pool(self._connect, self.pool_size, self.probe_after)
                try:
                    yield self
                except BaseException as exc:
                    body_error = exc
                    raise
                finally:
                    with trio.CancelScope(shield=True):
                        for writer in list(self._writers.values()):
                            await writer.aclose()
                    pool.close()
                    self._pool = None
                    self._nursery = None
                    self._listening = False
                    nursery.cancel_scope.cancel()
        except BaseExceptionGroup as group:
            # The block's own exception comes back wrapped by the nursery: give
            # the caller what it raised when nothing else failed.
            if body_error is None or len(group.exceptions) != 1 or group.exceptions[0] is not body_error:
                raise
            unwrapped = body_error
        if unwrapped is not None:
            raise unwrapped

    def _require_pool(self) -> _Pool:
        if self._pool is None or self._nursery is None:
            raise SessionStoreError(
                f"{self!r} is not open: use `async with` on it, or pass it to open_harness (which opens it)",
                path=self.location,
            )
        return self._pool

    def _start_heartbeat(self, writer: _PgWriter) -> None:
        if self.heartbeat is None or self._nursery is None or writer._heartbeat_scope is not None:
            return
        scope = writer._heartbeat_scope = trio.CancelScope()

        async def beat() -> None:
            with scope:
                await writer._heartbeat()

        self._nursery.start_soon(beat, name=f"postgres heartbeat {writer.header.id}")

    def _start_mail(self, writer: _PgWriter) -> None:
        nursery = self._nursery
        if nursery is None or writer._mail_scope is not None:
            return
        scope = writer._mail_scope = trio.CancelScope()

        async def deliver() -> None:
            with scope:
                await writer._mail_loop()

        nursery.start_soon(deliver, name=f"postgres mail {writer.header.id}")
        if not self._listening:
            self._listening = True
            nursery.start_soon(self._listen, name="postgres mailbox listener")

    # ------------------------------------------------------------ connections

    async def _connect(self, dsn: str | None = None) -> psycopg.Connection[Any]:
        """A new connection (to ``dsn``, default the store's), retried with backoff while the failure may pass.

        Raises:
            SessionStoreError: naming the problem (a missing database or role,
                refused authentication, or the server unreachable for
                ``connect_timeout`` seconds).
        """
        pg = _psycopg()
        deadline = trio.current_time() + self.connect_timeout
        delay = 0.05
        while True:
            try:
                return await self._connect_once(dsn)
            except pg.Error as exc:
                reason = str(exc).strip()
                if any(mark in reason for mark in _PERMANENT) or trio.current_time() + delay > deadline:
                    raise self._connect_error(reason, dsn) from exc
                log.info("cannot connect to %s yet (%s); retrying in %.2f s", self.location, reason, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _connect_once(self, dsn: str | None = None) -> psycopg.Connection[Any]:
        pg = _psycopg()
        params = pg.conninfo.conninfo_to_dict(dsn := dsn or self.dsn)
        kwargs: dict[str, Any] = {"autocommit": True}
        for name, value in (
            ("connect_timeout", max(2, math.ceil(self.connect_timeout))),  # per attempt; a DSN's own value wins
            ("application_name", "trio-harness"),
            ("keepalives", 1),
            ("keepalives_idle", 5),
            ("keepalives_interval", 2),
            ("keepalives_count", 3),
        ):
            if name not in params:
                kwargs[name] = value
        return await _open_connection(lambda: pg.connect(dsn, **kwargs))

    def _connect_error(self, reason: str, dsn: str | None = None) -> SessionStoreError:
        params: dict[str, Any] = _psycopg().conninfo.conninfo_to_dict(dsn := dsn or self.dsn)
        where = redact_dsn(dsn)
        database = params.get("dbname") or params.get("user") or "?"
        if "database" in reason and "does not exist" in reason:
            message = (
                f"the PostgreSQL database {database!r} does not exist ({where}): create it "
                f"(createdb {database}) or fix the database in the URL"
            )
        elif "role" in reason and "does not exist" in reason:
            message = f"the PostgreSQL role in {where} does not exist: create it or fix the user in the URL"
        elif "authentication failed" in reason or "password" in reason:
            message = f"PostgreSQL refused the login of {where}: check the user and password (or PGPASSWORD)"
        elif "pg_hba.conf" in reason or "permission denied" in reason:
            message = f"PostgreSQL does not let {where} connect: grant the role CONNECT, or allow it in pg_hba.conf"
        else:
            message = f"cannot connect to PostgreSQL at {where} (retried for {self.connect_timeout:g} s)"
        return SessionStoreError(f"{message}; the server said: {reason}", path=self.location)

    def _error(self, exc: BaseException, what: str, *, session_id: str | None = None) -> SessionStoreError:
        """A psycopg error as a :exc:`SessionStoreError` a user can act on."""
        pg = _psycopg()
        reason = str(exc).strip()
        if isinstance(exc, pg.errors.InsufficientPrivilege):
            message = (
                f"cannot {what} in {self.location}: permission denied ({reason}); grant the role USAGE on the "
                f"schema and SELECT, INSERT, DELETE on its tables (GRANT USAGE ON SCHEMA {_quote(self.schema)} TO ...; "
                f"GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {_quote(self.schema)} TO ...)"
            )
        elif isinstance(exc, pg.errors.UndefinedTable | pg.errors.UndefinedColumn | pg.errors.InvalidSchemaName):
            why = "missing, or older than this trio-harness"
            message = f"cannot {what} in {self.location}: the store's tables are {why} ({reason}); run check() first"
        elif isinstance(exc, pg.OperationalError):
            message = f"cannot {what} in {self.location}: the connection to PostgreSQL failed ({reason})"
        else:
            message = f"cannot {what} in {self.location}: {reason}"
        return SessionStoreError(message, path=self.location, session_id=session_id)

    async def _take_writer_connection(self) -> psycopg.Connection[Any]:
        return await self._require_pool().take()

    def _pool_give_back(self, conn: psycopg.Connection[Any]) -> None:
        if self._pool is None:
            conn.close()
        else:
            self._pool.give_back(conn)

    def _configure_writer(self, conn: psycopg.Connection[Any]) -> None:
        """(worker thread) Let the server drop this connection, and its lock, once it falls silent."""
        if self.idle_session_timeout is None:
            return
        timeout = f"{math.ceil(self.idle_session_timeout * 1000)}ms"
        conn.execute(
            "SELECT set_config('idle_session_timeout', %s, false), "
            "set_config('idle_in_transaction_session_timeout', %s, false)",
            (timeout, timeout),
        )

    @contextmanager
    def _translated(self, what: str, session_id: str | None = None) -> Iterator[None]:
        pg = _psycopg()
        try:
            yield
        except pg.Error as exc:
            raise self._error(exc, what, session_id=session_id) from exc

    async def _run(self, what: str, fn: Callable[[psycopg.Connection[Any]], T], *, retry: bool = False) -> T:
        """``fn(conn)`` on a pooled connection, once more on a new one if the connection was lost.

        ``retry`` (for reads): whenever it was lost; otherwise only when the
        statement failed before anything of it reached the server (sending
        it failed).
        """
        pg = _psycopg()
        pool = self._require_pool()
        for attempt in (1, 2):
            async with pool.connection() as conn:
                try:
                    return await _call(conn, functools.partial(fn, conn))
                except pg.Error as exc:
                    if attempt == 1 and worth_retrying(conn, exc, retry=retry):
                        continue
                    raise self._error(exc, what) from exc
        raise AssertionError("unreachable")

    # ------------------------------------------------------------ protocol

    async def check(self) -> None:
        """Connect, and create or upgrade the store's tables (idempotent; safe to run from many workers at once).

        Raises:
            SessionStoreError: the server cannot be reached, the database or
                role does not exist, the login is refused, the role may not
                create or use the tables, or the tables were written by a newer
                version of trio-harness.
        """
        if self._pool is not None and self._checked:
            await self._run("check the store", self._tables.check_version, retry=True)
            return
        conn = await self._connect()
        try:
            with self._translated("create the session tables"):
                await _call(conn, lambda: self._tables.migrate(conn))
        finally:
            conn.close()
        self._checked = True

    async def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored."""
        validate_session_id(session_id)
        sql = self._sql

        def work(conn: psycopg.Connection[Any]) -> bool:
            row = conn.execute(f"SELECT 1 FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone()
            return row is not None

        return await self._run(f"look up session {session_id!r}", work, retry=True)

    async def read_blob(self, session_id: str, sha256: str) -> bytes:
        """The checked bytes of the image blob ``sha256`` of the session (a row of ``blobs``, session/_blobs.py)."""
        work = select_blob(self._sql.s, session_id, sha256, f"{self.location} blobs {sha256}")
        return await self._run(f"read an image of {session_id!r}", work, retry=True)

    async def list(self) -> list[SessionHeader]:
        """The headers of every stored session, oldest first (then by id); undecodable ones are logged and skipped."""
        sql = self._sql

        def work(conn: psycopg.Connection[Any]) -> list[tuple[str, str]]:
            return conn.execute(
                f'SELECT id, header FROM {sql.s}.sessions ORDER BY created_at, id COLLATE "C"'
            ).fetchall()

        headers = []
        for session_id, line in await self._run("list the sessions", work, retry=True):
            try:
                headers.append(decode_header(line))
            except SessionError as exc:
                log.warning("skipping session %r in %s: its header cannot be read: %s", session_id, self.location, exc)
        return headers

    async def load(self, session_id: str) -> LoadedSession:
        """Read a stored session (read-only: it may be live elsewhere).

        Raises:
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: a stored event cannot be decoded, or the
                sequence has a gap.
            SessionStoreError: PostgreSQL cannot be reached or used.
        """
        validate_session_id(session_id)
        return await self._run(
            f"read session {session_id!r}", lambda conn: self._read(conn, session_id, snapshot=True), retry=True
        )

    def _read(self, conn: psycopg.Connection[Any], session_id: str, *, snapshot: bool) -> LoadedSession:
        """(worker thread) Read and decode a session."""
        sql = self._sql

        def select() -> tuple[tuple[str] | None, list[tuple[int, int, str]]]:
            row = conn.execute(f"SELECT header FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone()
            if row is None:
                return None, []
            return row, conn.execute(select_from(sql.s), (session_id, 0)).fetchall()

        if snapshot:  # header and events as of one moment, whole batches only
            with conn.transaction():
                conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ, READ ONLY")
                row, rows = select()
        else:  # the caller holds the session: nobody appends meanwhile
            row, rows = select()
        if row is None:
            raise SessionNotFoundError(f"no stored session {session_id!r} in {self.location}")
        where = f"{self.location}, session {session_id!r}"
        try:
            header = decode_header(row[0])
        except UnsupportedFormatError:
            raise
        except EventDecodeError as exc:
            raise SessionCorruptError(f"{where}: the header cannot be read: {exc}", path=where, line=1) from exc
        if header.id != session_id:
            raise SessionCorruptError(f"{where}: the header names session {header.id!r}", path=where, line=1)
        events: list[Event] = []
        for index, (seq, body) in enumerate(each_event(rows, where=where)):
            if seq != index:
                raise SessionCorruptError(
                    f"{where}: event seq {index} is missing (the next stored one is {seq})", path=where, line=index + 2
                )
            events.append(decode_stored(seq, body, where))
        return LoadedSession(header=header, events=tuple(events))

    async def events_since(self, session_id: str, seq: int, limit: int = 500) -> builtins.list[Event]:
        """The stored events of a session from ``seq`` on, at most ``limit`` (one indexed read; for ``follow``)."""
        params = {"sid": session_id, "start": seq, "limit": limit}
        query = select_page(self._sql.s)  # about ``limit`` events, however many a row holds
        rows = await self._run(
            f"read session {session_id!r}", lambda conn: conn.execute(query, params).fetchall(), retry=True
        )
        where = f"{self.location}, session {session_id!r}"
        return [
            decode_stored(at, body, where) for at, body in itertools.islice(each_event(rows, seq, where=where), limit)
        ]

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        """Claim the id of a new session and return its writer; its first flush stores it.

        The claim is the session's advisory lock, taken on the writer's own
        connection (it is held from then on, and the first flush stores the
        session over it); the id must not be stored.  The writer closed before
        any flush releases it and leaves nothing behind.

        Raises:
            SessionExistsError: the id is stored, or another worker (or this
                process) is creating it or holds it.
            SessionError: the header cannot be encoded.
            SessionStoreError: the store is not open, or PostgreSQL cannot be
                reached or used.
        """
        session_id = validate_session_id(header.id)
        self._require_pool()
        try:
            line = encode_header(header)
        except (TypeError, ValueError) as exc:
            raise SessionError(f"the header of session {session_id!r} cannot be stored: {exc}") from exc
        if session_id in self._writers:
            raise SessionExistsError(
                f"session {session_id!r} already exists: it is being created or is live in this process"
            )
        conn = await claim_new(self, session_id)
        writer = _PgWriter(self, header, header_line=line, stored=0, conn=conn)
        writer._held = True
        self._writers[session_id] = writer
        self._start_heartbeat(writer)
        return writer

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        """Take the session's lock on a connection of its own, then read it.

        Waits up to ``lock_timeout`` seconds for a holder to let go.

        Raises:
            SessionLockedError: the session is live on another worker (or in
                this process).
            SessionNotFoundError: nothing is stored under this id.
            SessionCorruptError: a stored event cannot be decoded.
            SessionStoreError: PostgreSQL cannot be reached or used.
        """
        validate_session_id(session_id)
        if session_id in self._writers:
            raise SessionLockedError(
                f"session {session_id!r} is already live or being resumed in this process; dispose its agent first",
                path=self.location,
            )
        conn = await self._take_writer_connection()
        key = _lock_key(self.schema, session_id)
        deadline = trio.current_time() + self.lock_timeout
        delay = 0.005
        locked = False
        tainted = 0  # connections found holding advisory locks already (session/_pg_leases.py)
        try:
            while True:
                try:
                    with self._translated(f"take session {session_id!r}"):
                        locked = await _call(conn, functools.partial(_try_lock, conn, key, self._sql, session_id))
                except _Tainted:
                    conn.close()
                    tainted += 1
                    _check_tainted(self.location, session_id, tainted, deadline)
                    conn = await self._connect()
                    continue
                except BaseException:
                    # Cancelled or failed while taking the lock: whether this
                    # connection holds it is unknown, so it is closed, never pooled.
                    conn.close()
                    raise
                if locked:
                    break
                remaining = deadline - trio.current_time()
                if remaining <= 0:
                    raise SessionLockedError(
                        f"session {session_id!r} is live on another worker (its lock in {self.location} is held); "
                        "stop it there, or wait until that worker is gone (a dead worker releases it at once, "
                        f"a frozen one within {self.idle_session_timeout} s)",
                        path=self.location,
                    )
                await trio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.05)
            if session_id in self._writers:  # taken in this process while we waited
                raise SessionLockedError(
                    f"session {session_id!r} is already live or being resumed in this process; dispose its agent first",
                    path=self.location,
                )

            def read() -> LoadedSession:
                self._configure_writer(conn)
                return self._read(conn, session_id, snapshot=False)

            with self._translated(f"read session {session_id!r}"):
                loaded = await _call(conn, read)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._give_back_locked(conn, key if locked else None)
            raise
        writer = _PgWriter(self, loaded.header, header_line=None, stored=len(loaded.events), conn=conn)
        writer._held = True
        self._writers[session_id] = writer
        self._start_heartbeat(writer)
        return loaded, writer

    async def _give_back_locked(self, conn: psycopg.Connection[Any], key: int | None) -> None:
        """Unlock (when ``key`` is given) and return a writer's connection; drop it if that fails."""
        if conn.closed or conn.broken:
            conn.close()
            return

        def work() -> None:
            if key is not None:
                conn.execute("SELECT pg_advisory_unlock_all()")
            conn.execute(
                "SELECT set_config('idle_session_timeout', '0', false), "
                "set_config('idle_in_transaction_session_timeout', '0', false)"
            )

        try:
            with trio.move_on_after(self.release_timeout) as timeout:
                await _call(conn, work)
        except _psycopg().Error:
            conn.close()
            return
        if timeout.cancelled_caught:
            conn.close()  # the server releases the lock with the connection
            return
        self._pool_give_back(conn)

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        """Store a complete new session at once (one transaction).

        Raises:
            SessionExistsError: a session with this id is already stored.
        """
        validate_session_id(header.id)
        sql = self._sql
        header_line = encode_header(header)
        lines, blobs = encode_stored(events)

        def work(conn: psycopg.Connection[Any]) -> str:
            with conn.transaction():
                if not claim_new_id(conn, sql, header.id):
                    return "claimed"  # another writer is creating (or holds) it: its lock or lease
                row = conn.execute(
                    sql.insert_session,
                    (header.id, header_line, header.created_at, header.parent_session),
                ).fetchone()
                if row is None:
                    return "exists"
                if lines:
                    insert_blobs(conn, sql.s, header.id, blobs)
                    conn.execute(sql.insert_events, (header.id, 0, lines), binary=True)
            return "stored"

        outcome = await self._run(f"store session {header.id!r}", work)
        if outcome != "stored":
            raise SessionExistsError(
                f"session {header.id!r} "
                + ("is already stored" if outcome == "exists" else "already exists: another worker is creating it")
                + f" in {self.location}"
            )

    async def copy_prefix(self, source: str, boundary: int, child: SessionHeader) -> bool:
        """Fork on the server: store ``child`` holding ``source``'s first ``boundary`` stored events.

        Returns:
            False (storing nothing) when fewer than ``boundary`` events of
            ``source`` are stored (the rest is still only in a live session's
            memory): the caller then saves the events it has.

        Raises:
            SessionExistsError: ``child`` is already stored.
        """
        validate_session_id(child.id)
        sql = self._sql
        header_line = encode_header(child)

        def work(conn: psycopg.Connection[Any]) -> str:
            try:
                with conn.transaction():
                    if not claim_new_id(conn, sql, child.id):
                        return "claimed"  # another writer is creating (or holds) it: its lock or lease
                    row = conn.execute(
                        sql.insert_session,
                        (child.id, header_line, child.created_at, child.parent_session),
                    ).fetchone()
                    if row is None:
                        return "exists"
                    params = {"child": child.id, "source": source, "boundary": boundary}
                    copied = _scalar(conn, copy_prefix_statement(sql.s), params)
                    if copied != boundary:
                        raise _ShortPrefix
                    conn.execute(copy_blobs(sql.s), (child.id, source))
            except _ShortPrefix:
                return "short"  # rolled back: fewer events of the source are stored
            return "copied"

        outcome = await self._run(f"fork session {source!r} into {child.id!r}", work)
        if outcome in ("exists", "claimed"):
            why = "is already stored" if outcome == "exists" else "is being created, or is live, on a worker"
            raise SessionExistsError(f"cannot fork into {child.id!r}: that session {why} in {self.location}")
        return outcome == "copied"

    # ------------------------------------------------------------ mailbox

    async def post(self, session_id: str, message: InboxMessage) -> None:
        """Store ``message`` in the session's mailbox and notify the worker holding it (one transaction).

        The holder splices it into its agent's inbox within milliseconds; if
        nobody holds the session it is delivered when the session is next
        resumed.  Exactly once, in the order of the posts.

        Raises:
            SessionNotFoundError: nothing is stored under this id.
            SessionStoreError: PostgreSQL cannot be reached or used.
        """
        validate_session_id(session_id)
        sql = self._sql
        body = encode_inbox_message(message)  # every field: origin and settings too

        # The message id as it appears in a stored JSON line (a quoted string).
        needle = json.dumps(message.id)
        retried = False

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                if conn.execute(f"SELECT 1 FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone() is None:
                    return False
                if retried and _scalar(
                    conn,
                    f"SELECT EXISTS (SELECT 1 FROM {sql.s}.mailbox WHERE session_id = %s AND strpos(body, %s) > 0) "
                    f"OR EXISTS (SELECT 1 FROM {sql.s}.events WHERE session_id = %s AND strpos(body, %s) > 0)",
                    (session_id, needle, session_id, needle),
                ):
                    return True  # the lost connection committed it: posted (and maybe delivered) once
                conn.execute(f"INSERT INTO {sql.s}.mailbox (session_id, body) VALUES (%s, %s)", (session_id, body))
                conn.execute("SELECT pg_notify(%s, %s)", (sql.channel, session_id))
            return True

        pg = _psycopg()
        pool = self._require_pool()
        what = f"post a message to session {session_id!r}"
        while True:
            async with pool.connection() as conn:
                try:
                    found = await _call(conn, functools.partial(work, conn))
                except pg.Error as exc:
                    if retried or not (conn.broken or conn.closed):
                        raise self._error(exc, what) from exc
                    # Lost, maybe during COMMIT: look for the message before posting it again.
                    log.warning("posting to session %r: the connection was lost (%s); retrying", session_id, exc)
                    retried = True
                    continue
            break
        if not found:
            raise SessionNotFoundError(f"no stored session {session_id!r} in {self.location} to post to")

    async def pending_mail(self, session_id: str) -> builtins.list[InboxMessage]:
        """The messages posted to a session and not delivered yet, oldest first."""
        validate_session_id(session_id)
        sql = self._sql

        def work(conn: psycopg.Connection[Any]) -> list[tuple[str]]:
            return conn.execute(
                f"SELECT body FROM {sql.s}.mailbox WHERE session_id = %s ORDER BY id", (session_id,)
            ).fetchall()

        messages = []
        for (body,) in await self._run(f"read the mailbox of session {session_id!r}", work, retry=True):
            messages.append(decode_inbox_message(body))
        return messages

    async def _listen(self) -> None:
        """LISTEN for posts on a dedicated connection; wake the writers they are for.

        Reconnects with backoff; after every (re)connection every receiving
        writer rescans its mailbox, since NOTIFY is not durable.
        """
        pg = _psycopg()
        delay = 0.05
        while True:
            try:
                conn = await self._connect(self._session_dsn)
            except SessionStoreError as exc:
                log.warning("mailbox listener: %s; retrying in %.2f s", exc, delay)
                await trio.sleep(delay)
                delay = min(delay * 2, 2.0)
                continue
            fd: int | None = None
            try:
                await _call(conn, _execute(conn, f"LISTEN {_quote(self._sql.channel)}"))
                fd = conn.fileno()
                delay = 0.05
                for writer in list(self._writers.values()):
                    writer.wake_mail()
                while True:
                    await trio.lowlevel.wait_readable(fd)
                    for note in conn.notifies(timeout=0):
                        woken = self._writers.get(note.payload)
                        if woken is not None:
                            woken.wake_mail()
            except pg.Error as exc:
                log.warning("mailbox listener of %s lost its connection (%s); reconnecting", self.location, exc)
            finally:
                if fd is not None:
                    trio.lowlevel.notify_closing(fd)
                conn.close()
            await trio.sleep(delay)
            delay = min(delay * 2, 2.0)
