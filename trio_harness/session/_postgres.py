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

The driver is the synchronous psycopg 3 run on worker threads
(``trio.to_thread.run_sync``): psycopg's asyncio connection does not run under
Trio.  Every call is cancellation-safe: a cancelled caller stops waiting; a
job whose thread had not begun is dropped; otherwise the statement is
cancelled on the server (``cancel_safe``, the socket shut when the server does
not act on it), the thread waited for and the transaction rolled back, so
nothing cancelled is half-committed.  A live session's statements are bounded
by ``write_timeout``.

One live writer per session: a writer holds a session-level advisory lock on a
connection of its own, taken by :meth:`PostgresStore.resume` before the
log is read and by the first flush of a new session, and sends every append of
that session over the same connection.  Losing the connection loses the lock
and the ability to write together; the primary key ``(session_id, seq)``
refuses any batch of a writer that lost its lock to another one.  A writer's
connection is kept alive by a heartbeat and killed by the server when it stops
(``idle_session_timeout``), so a frozen worker loses its sessions within a
bounded time and a killed one at once.

Messages posted to a session (:meth:`PostgresStore.post`) are a mailbox
row plus ``pg_notify`` in one transaction; the worker holding the session
listens on a dedicated connection, takes the rows and splices them into the
agent's inbox, deleting them in the transaction that stores the splice.
"""

from __future__ import annotations

import builtins
import functools
import hashlib
import json
import logging
import math
import os
import re
import select
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator, Sequence
from contextlib import AsyncExitStack, asynccontextmanager, contextmanager
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

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
from ._codec import decode_event, decode_header, decode_inbox_message, encode_event, encode_header, encode_inbox_message
from ._events import Event, InboxMessage, SessionHeader
from ._persistence import LoadedSession
from ._session import SessionWriter, validate_session_id

if TYPE_CHECKING:
    from types import TracebackType

    import psycopg

__all__ = ["SCHEMA_VERSION", "PostgresStore", "redact_dsn"]

log = logging.getLogger("trio_harness.session.postgres")

SCHEMA_VERSION = 1
"""The version of the tables this store writes (kept in ``schema_version``)."""

T = TypeVar("T")

_INSTALL_HINT = "install the PostgreSQL extra: pip install 'trio-harness[postgres]'"
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


def _quote(identifier: str) -> str:
    return '"' + identifier.replace('"', '""') + '"'


def _lock_key(schema: str, session_id: str) -> int:
    """The advisory lock key of a session: 64 bits of a hash of schema and id."""
    digest = hashlib.blake2b(f"{schema}\x00{session_id}".encode(), digest_size=8, person=b"th-session").digest()
    return int.from_bytes(digest, "big", signed=True)


def _scalar(conn: psycopg.Connection[Any], query: str, params: Sequence[Any] | None = None) -> Any:
    """(worker thread) The first column of the first row ``query`` returns."""
    row = conn.execute(query, params).fetchone()
    if row is None:
        raise SessionStoreError(f"PostgreSQL returned no row for {query!r}")
    return row[0]


class _Tainted(Exception):
    """A connection about to take a session's lock already holds an advisory lock (it must not lock re-entrantly)."""


def _try_lock(conn: psycopg.Connection[Any], key: int) -> bool:
    """(worker thread) Take the session-level advisory lock ``key`` if it is free.

    Advisory locks are re-entrant within a connection, so a connection that
    holds any already would "take" a session it holds and keep it after one
    unlock: it is refused with :exc:`_Tainted` (the caller closes it).
    """
    row = conn.execute(
        "SELECT CASE WHEN EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND pid = pg_backend_pid()) "
        "THEN NULL ELSE pg_try_advisory_lock(%s) END",
        (key,),
    ).fetchone()
    if row is None or row[0] is None:
        raise _Tainted
    return bool(row[0])


def _quiet(conn: psycopg.Connection[Any]) -> bool:
    """Whether an idle connection's socket has nothing to read.

    An idle connection is sent nothing, so anything readable is the server
    closing it (``pg_terminate_backend``, a restart, an idle timeout): its
    farewell message or the end of the stream.  Checked without a round trip.
    """
    try:
        poller = select.poll()
        poller.register(conn.pgconn.socket, select.POLLIN | select.POLLPRI)
        return not poller.poll(0)
    except Exception:  # closed or unusable
        return False


def _execute(conn: psycopg.Connection[Any], query: str) -> Callable[[], None]:
    """A thread job running ``query`` on ``conn``."""

    def run() -> None:
        conn.execute(query)

    return run


def _psycopg() -> Any:
    try:
        import psycopg
    except ImportError as exc:  # pragma: no cover - the extra is installed wherever tests run
        raise SessionStoreError(f"the PostgreSQL store needs the psycopg driver: {_INSTALL_HINT}") from exc
    return psycopg


# ---------------------------------------------------------------- threads


@attrs.define(eq=False)
class _Job(Generic[T]):
    """A blocking function run on a worker thread that the caller may stop waiting for.

    :meth:`drop` and :meth:`run` decide under a lock which comes first: a job
    dropped before its thread began never runs (Trio may refuse to start a
    thread for a cancelled caller, or start it late), and a job that began
    runs to its end, which the caller then waits for.
    """

    fn: Callable[[], T]
    done: threading.Event = attrs.field(factory=threading.Event)
    # [value] once fn returned.
    value: list[T] = attrs.field(factory=list)
    error: BaseException | None = None
    started: bool = False
    dropped: bool = False
    _guard: threading.Lock = attrs.field(factory=threading.Lock)

    def run(self) -> None:
        with self._guard:
            if self.dropped:
                return
            self.started = True
        try:
            self.value.append(self.fn())
        except BaseException as exc:
            self.error = exc
        finally:
            self.done.set()

    def drop(self) -> bool:
        """Forget the job if its thread has not begun it; True when dropped."""
        with self._guard:
            if not self.started:
                self.dropped = True
            return self.dropped

    def result(self) -> T:
        if self.error is not None:
            raise self.error
        return self.value[0]


# Seconds a cancelled call waits for the server to cancel its statement
# before it shuts the connection's socket (the backend is stopped, the
# network gone): a cancelled caller is never held longer than about this.
_CANCEL_GRACE = 2.0


def _cancel_statement(conn: psycopg.Connection[Any]) -> None:
    try:
        conn.cancel_safe(timeout=_CANCEL_GRACE)
    except Exception as exc:  # the statement may have finished, or the server is gone
        log.debug("cancelling a statement failed: %s", exc)


def _shut_socket(conn: psycopg.Connection[Any]) -> None:
    """Shut the connection's socket, so a thread blocked on it returns (the connection is broken after)."""
    try:
        fd = conn.pgconn.socket
    except Exception:  # closed already
        return
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError as exc:
        log.debug("shutting a connection's socket failed: %s", exc)
    finally:
        sock.close()


async def _call(conn: psycopg.Connection[Any], fn: Callable[[], T], *, settle: Callable[[T], None] | None = None) -> T:
    """Run ``fn`` (which uses ``conn``) on a worker thread, cancellation-safely.

    A cancelled caller stops waiting at once.  A job whose thread had not
    begun is dropped (it never runs) and the cancellation raised at once.
    Otherwise the statement is cancelled on the server, the thread waited for
    (shielded) and its transaction rolled back by ``fn``'s own ``with
    conn.transaction()``; a server that does not act on the cancel within
    ``_CANCEL_GRACE`` seconds has the connection's socket shut under it, which
    ends the thread (and leaves the connection broken).  If ``fn`` completed
    anyway (the cancel came too late), ``settle`` gets its result before the
    cancellation propagates, so a committed write is never mistaken for a
    failed one.
    """
    job: _Job[T] = _Job(fn)
    try:
        await trio.to_thread.run_sync(job.run, abandon_on_cancel=True)
    except trio.Cancelled:
        if job.drop():
            raise
        with trio.CancelScope(shield=True):
            if not job.done.is_set():
                await trio.to_thread.run_sync(_cancel_statement, conn)
                if not await trio.to_thread.run_sync(job.done.wait, _CANCEL_GRACE):
                    log.warning("PostgreSQL did not cancel a statement within %g s: shutting its socket", _CANCEL_GRACE)
                    _shut_socket(conn)
                    await trio.to_thread.run_sync(job.done.wait)
        if job.error is None and settle is not None:
            settle(job.result())
        raise
    return job.result()


# ---------------------------------------------------------------- statements


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
        ]

    @property
    def insert_session(self) -> str:
        """The session row; returns a row only when it was inserted (the id was free)."""
        return (
            f"INSERT INTO {self.s}.sessions (id, header, created_at, parent_session) VALUES (%s, %s, %s, %s) "
            "ON CONFLICT (id) DO NOTHING RETURNING 1"
        )

    @property
    def insert_events(self) -> str:
        return (
            f"INSERT INTO {self.s}.events (session_id, seq, body) "
            "SELECT %s, %s + o - 1, b FROM unnest(%s::text[]) WITH ORDINALITY AS t(b, o)"
        )


# ---------------------------------------------------------------- the pool


@attrs.define(eq=False)
class _Pool:
    """At most ``size`` shared connections (reads, lists, forks, posts), plus writers' own.

    A writer takes a connection for as long as it holds its session and gives
    it back when closed; the pool keeps up to ``size`` idle connections.
    """

    store: PostgresStore
    size: int
    _idle: list[tuple[psycopg.Connection[Any], float]] = attrs.field(factory=list, init=False)
    _slots: trio.Semaphore = attrs.field(init=False)
    closed: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        self._slots = trio.Semaphore(self.size)

    @asynccontextmanager
    async def connection(self) -> AsyncIterator[psycopg.Connection[Any]]:
        async with self._slots:
            conn = await self.take()
            try:
                yield conn
            finally:
                self.give_back(conn)

    async def take(self) -> psycopg.Connection[Any]:
        while self._idle:
            conn, since = self._idle.pop()
            if conn.closed or conn.broken or not _quiet(conn):
                conn.close()
                continue
            if trio.current_time() - since > self.store.probe_after:
                # Idle a while: the server may have dropped it meanwhile.
                try:
                    await _call(conn, _execute(conn, "SELECT 1"))
                except _psycopg().Error:
                    conn.close()
                    continue
            return conn
        return await self.store._connect()

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        pg = _psycopg()
        usable = (
            not self.closed
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == pg.pq.TransactionStatus.IDLE
            and len(self._idle) < self.size
        )
        if usable:
            self._idle.append((conn, trio.current_time()))
        else:
            conn.close()

    def close(self) -> None:
        self.closed = True
        while self._idle:
            conn, _ = self._idle.pop()
            conn.close()


# ---------------------------------------------------------------- the writer

# Seconds a writer retaking its session waits for the server to drop its
# previous connection (which may still hold the lock) before the flush fails.
_RETAKE_WAIT = 1.0


@attrs.define(eq=False)
class _PgWriter:
    store: PostgresStore
    header: SessionHeader
    # The encoded header of a new session, stored by its first flush; None once stored.
    _header_line: str | None = attrs.field(alias="header_line")
    # How many events are stored (the seq of the next one to store).
    _stored: int = attrs.field(alias="stored")
    # The connection holding the session's advisory lock; None before the
    # first flush of a new session, and after the connection was lost.
    _conn: psycopg.Connection[Any] | None = attrs.field(default=None, alias="conn")
    _buffer: list[str] = attrs.field(factory=list, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Why this writer may not append any more (it lost its session), once it may not.
    _broken: str | None = attrs.field(default=None, init=False)
    # A flush(sync=False) committed without waiting for the WAL to reach disk.
    _unsynced: bool = attrs.field(default=False, init=False)
    # How many events were stored as of the last synced commit, and the lines
    # and mailbox deletes committed without sync since (a crash may lose them).
    _synced: int = attrs.field(default=0, init=False)
    _unsynced_lines: list[str] = attrs.field(factory=list, init=False)
    _unsynced_acks: list[int] = attrs.field(factory=list, init=False)
    # The server process of the connection that last held the lock.
    _pid: int = attrs.field(default=0, init=False)
    # True once this writer held the lock: a lost connection then needs a re-take.
    _held: bool = attrs.field(default=False, init=False)
    _last_used: float = attrs.field(factory=trio.current_time, init=False)
    # Told how many events a retake stored again after the server lost them (SessionRegistry sets it:
    # the ``session/restored`` notice); None: only the log warning says so.
    on_restored: Callable[[int], None] | None = attrs.field(default=None, init=False)
    # Background work of this writer in the store's service: heartbeat, mail delivery.
    _heartbeat_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _mail_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    # Mail: the delivery callback, the wake-up, the rows taken but not yet
    # deleted, and those delivered (deleted with the next batch).
    _on_mail: Callable[[], Awaitable[None]] | None = attrs.field(default=None, init=False)
    _mail_wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _taken: set[int] = attrs.field(factory=set, init=False)
    _acks: list[int] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        self._synced = self._stored
        if self._conn is not None:
            self._pid = self._conn.info.backend_pid

    @property
    def _key(self) -> int:
        return _lock_key(self.store.schema, self.header.id)

    def write(self, event: Event) -> None:
        self._buffer.append(encode_event(event))

    # ------------------------------------------------------------ flush

    async def flush(self, *, sync: bool = True) -> None:
        async with self._lock:
            if not self._buffer and not self._acks and not (sync and self._unsynced):
                return
            if self._closed or self._broken is not None:
                reason = "its writer is closed" if self._closed else self._broken
                raise SessionStoreError(
                    f"cannot store {len(self._buffer)} events of session {self.header.id!r} "
                    f"in {self.store.location}: {reason}",
                    path=self.store.location,
                    session_id=self.header.id,
                )
            lines, acks = self._buffer, list(self._acks)
            self._buffer = []
            committed = False

            def settle(_: object) -> None:
                nonlocal committed
                if committed:
                    return
                committed = True
                self._committed(lines, acks, sync)

            try:
                if self._header_line is not None:
                    await self._create(lines, settle)
                else:
                    if self._conn is None and await self._reattach(lines, acks, settle):
                        return
                    await self._append(lines, acks, sync, settle, reconnect=True)
            except BaseException as exc:
                if not committed:
                    self._buffer[:0] = lines
                if isinstance(exc, SessionError):
                    raise
                if isinstance(exc, _psycopg().Error):
                    raise self._failure(exc, "store the events of") from exc
                if isinstance(exc, Exception):  # whatever it is, the caller gets a store error
                    raise SessionStoreError(
                        f"cannot store the events of session {self.header.id!r} in {self.store.location}: "
                        f"{type(exc).__name__}: {exc}",
                        path=self.store.location,
                        session_id=self.header.id,
                    ) from exc
                raise
            finally:
                self._last_used = trio.current_time()

    def _committed(self, lines: list[str], acks: list[int], sync: bool) -> None:
        self._stored += len(lines)
        for mail_id in acks:
            self._acks.remove(mail_id)
        if sync:
            # Durable now, and with it every unsynced commit before.
            self._synced = self._stored
            for mail_id in [*self._unsynced_acks, *acks]:
                self._taken.discard(mail_id)
            self._unsynced_lines, self._unsynced_acks = [], []
            self._unsynced = False
        elif lines or acks:
            # Kept until a synced commit: a server crash may lose them (put back on retake).
            self._unsynced_lines += lines
            self._unsynced_acks += acks
            self._unsynced = True

    async def _timed(
        self, conn: psycopg.Connection[Any], fn: Callable[[], T], *, settle: Callable[[T], None] | None = None
    ) -> T:
        """``_call`` bounded by ``write_timeout``.

        A statement the server does not answer in time is cancelled (and the
        socket shut, see :func:`_call`); the connection is dropped and the
        call fails with :exc:`SessionStoreError`.  A statement that completed
        anyway returns its result (``settle`` is for outer cancellations).
        """
        finished: list[T] = []

        def on_settle(value: T) -> None:
            finished.append(value)
            if settle is not None:
                settle(value)

        timeout = self.store.write_timeout
        with trio.move_on_after(timeout):
            return await _call(conn, fn, settle=on_settle)
        if finished:
            return finished[0]
        if self._conn is conn:
            self._drop_connection()
        else:
            conn.close()
        raise SessionStoreError(
            f"PostgreSQL did not answer a statement of session {self.header.id!r} within {timeout:g} s "
            f"(write_timeout) in {self.store.location}: the statement was cancelled and the connection dropped; "
            "the next flush takes the session again on a new connection",
            path=self.store.location,
            session_id=self.header.id,
        )

    async def _create(self, lines: list[str], settle: Callable[[object], None]) -> None:
        """The first flush: take the session's lock, store the header and the batch together.

        A connection lost during the transaction (its COMMIT unanswered) is
        replaced within the flush; a stored header and batch equal to ours
        then count as committed by the lost connection.
        """
        assert self._header_line is not None
        header_line, header = self._header_line, self.header
        store, sql = self.store, self.store._sql
        key, first = self._key, self._stored
        pg = _psycopg()
        maybe_committed = False
        attempts = 0
        while True:
            attempts += 1
            if self._conn is None:
                self._conn = await (store._connect() if attempts > 1 else store._take_writer_connection())
            conn = self._conn

            def work(conn: psycopg.Connection[Any] = conn, ours: bool = maybe_committed) -> str:
                if not self._held:
                    if not _try_lock(conn, key):
                        return "locked"
                    self._held = True
                    store._configure_writer(conn)
                with conn.transaction():
                    row = conn.execute(
                        sql.insert_session,
                        (header.id, header_line, header.created_at, header.parent_session),
                    ).fetchone()
                    if row is None:
                        return "created" if ours and self._stored_as(conn, header_line, first, lines) else "exists"
                    conn.execute(sql.insert_events, (header.id, first, lines), binary=True)
                return "created"

            try:
                outcome = await self._timed(conn, work, settle=lambda result: self._created(result, settle))
            except _Tainted:
                self._drop_connection()
                continue
            except pg.Error as exc:
                if not (conn.broken or conn.closed):
                    raise
                self._drop_connection()
                if attempts >= 3:
                    raise
                # Maybe during COMMIT: find out on a new connection.
                maybe_committed = True
                log.warning("session %r: the connection was lost while storing it (%s); reconnecting", header.id, exc)
                continue
            except BaseException:
                if conn.broken or conn.closed:
                    self._drop_connection()
                raise
            if outcome == "locked" and maybe_committed and attempts < 3:
                # The lost connection may hold the lock still, until the server notices it is gone.
                await self._release_connection()
                await trio.sleep(0.05 * attempts)
                continue
            break
        if outcome == "created":
            self._pid = conn.info.backend_pid
            self._created(outcome, settle)
            return
        # Refused: give the connection (and the lock, if taken) back; nothing was stored.
        await self._release_connection()
        raise SessionExistsError(
            f"session {header.id!r} is already stored in {store.location}"
            + (" (another worker is creating or holding it)" if outcome == "locked" else "")
        )

    def _stored_as(self, conn: psycopg.Connection[Any], header_line: str, first: int, lines: list[str]) -> bool:
        """(worker thread) Whether the stored session has exactly this header and these events."""
        sql, sid = self.store._sql, self.header.id
        row = conn.execute(f"SELECT header FROM {sql.s}.sessions WHERE id = %s", (sid,)).fetchone()
        if row is None or row[0] != header_line:
            return False
        bodies = [
            body
            for (body,) in conn.execute(f"SELECT body FROM {sql.s}.events WHERE session_id = %s ORDER BY seq", (sid,))
        ]
        return first == 0 and bodies == lines

    def _created(self, outcome: str, settle: Callable[[object], None]) -> None:
        if outcome != "created" or self._header_line is None:
            return
        self._header_line = None
        settle(None)
        self.store._writers[self.header.id] = self
        self.store._start_heartbeat(self)

    async def _append(
        self, lines: list[str], acks: list[int], sync: bool, settle: Callable[[object], None], *, reconnect: bool
    ) -> None:
        conn = self._conn
        assert conn is not None
        sql, sid, first = self.store._sql, self.header.id, self._stored

        def work() -> None:
            if acks:
                with conn.transaction():
                    if not sync:
                        conn.execute("SET LOCAL synchronous_commit TO off")
                    deleted = conn.execute(
                        f"DELETE FROM {sql.s}.mailbox WHERE session_id = %s AND id = ANY(%s)", (sid, acks)
                    ).rowcount
                    if deleted != len(acks):
                        raise _MailTaken(len(acks) - deleted)
                    if lines:
                        conn.execute(sql.insert_events, (sid, first, lines), binary=True)
                return
            with conn.pipeline(), conn.transaction():
                if not sync:
                    conn.execute("SET LOCAL synchronous_commit TO off")
                if lines:
                    conn.execute(sql.insert_events, (sid, first, lines), binary=True)
                else:  # only make earlier unsynced commits durable: a commit with an xid waits for the WAL
                    conn.execute("SELECT pg_current_xact_id()")

        pg = _psycopg()
        try:
            await self._timed(conn, work, settle=settle)
        except pg.errors.UniqueViolation as exc:
            raise self._lost(
                f"events from seq {first} on are already stored by another writer: this writer lost the session "
                "(it was resumed on another worker)"
            ) from exc
        except _MailTaken as exc:
            raise self._lost(f"{exc.missing} posted messages it delivered were taken by another writer") from None
        except pg.Error as exc:
            if not (conn.broken or conn.closed):
                raise
            # The connection died, maybe during COMMIT: take the session again
            # on a new connection and find out whether the batch is stored.
            self._drop_connection()
            if not reconnect:
                raise
            log.warning("session %r: the connection to PostgreSQL was lost (%s); reconnecting", sid, exc)
            if await self._reattach(lines, acks, settle):
                return
            await self._append(lines, acks, sync, settle, reconnect=False)
            return
        settle(None)

    async def _reattach(self, lines: list[str], acks: list[int], settle: Callable[[object], None]) -> bool:
        """Take the session again after its connection was lost; True when ``lines`` turned out stored.

        Events committed without sync that the server lost meanwhile (it
        crashed or restarted) are put back in front of ``lines`` (and the
        mailbox rows they removed are removed again with them), with a
        warning saying so.

        Raises:
            SessionStoreError: the session was taken over meanwhile (this
                writer is broken from now on), PostgreSQL cannot be reached,
                or the lock is still held by this writer's previous connection
                (the next flush tries again).
        """
        store, sql, sid, key, stored = self.store, self.store._sql, self.header.id, self._key, self._stored
        synced, unsynced = self._synced, list(self._unsynced_lines)
        previous = self._pid
        deadline = trio.current_time() + _RETAKE_WAIT
        while True:
            conn = await store._take_writer_connection()

            def work(conn: psycopg.Connection[Any] = conn) -> tuple[str, int]:
                if not _try_lock(conn, key):
                    holder = conn.execute(
                        "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted AND objsubid = 1 "
                        "AND classid::bigint = %s AND objid::bigint = %s",
                        ((key >> 32) & 0xFFFFFFFF, key & 0xFFFFFFFF),
                    ).fetchone()
                    return ("previous" if holder is not None and holder[0] == previous else "locked"), 0
                store._configure_writer(conn)
                count = _scalar(
                    conn, f"SELECT coalesce(max(seq) + 1, 0) FROM {sql.s}.events WHERE session_id = %s", (sid,)
                )
                if count == stored:
                    return "missing", count
                if synced <= count < stored and self._bodies(conn, synced, count) == unsynced[: count - synced]:
                    return "lost", count
                if lines and count == stored + len(lines) and self._bodies(conn, stored, count) == lines:
                    return "stored", count
                conn.execute("SELECT pg_advisory_unlock_all()")
                return "diverged", count

            try:
                outcome, count = await self._timed(conn, work)
            except _Tainted:
                conn.close()
                continue
            except BaseException:
                # Cancelled or failed while taking the lock: whether it holds the
                # lock is unknown, so the connection is closed (never pooled).
                conn.close()
                raise
            if outcome != "previous":
                break
            store._pool_give_back(conn)
            if trio.current_time() >= deadline:
                raise SessionStoreError(
                    f"session {sid!r} cannot be taken again in {store.location} yet: its lock is still held by "
                    f"this writer's previous connection (server process {previous}), which the server has not "
                    "closed; the next flush tries again",
                    path=store.location,
                    session_id=sid,
                )
            await trio.sleep(0.02)
        if outcome == "locked":
            store._pool_give_back(conn)
            raise self._lost("the session is live on another worker (it took the session after this one lost it)")
        if outcome == "diverged":
            await store._give_back_locked(conn, None)  # unlocked already; its writer settings are reset
            raise self._lost("another writer appended to the session after this one lost it")
        self._conn, self._held, self._pid = conn, True, conn.info.backend_pid
        log.info("session %r: taken again after a lost connection", sid)
        if outcome == "lost":
            lost = unsynced[count - synced :]
            lost_acks = list(self._unsynced_acks)
            log.warning(
                "session %r: PostgreSQL lost the last %d events committed without sync (the server crashed or "
                "restarted); storing them again",
                sid,
                len(lost),
            )
            self._stored = count
            self._unsynced_lines = unsynced[: count - synced]
            self._unsynced_acks = []
            lines[:0] = lost
            acks[:0] = [mail_id for mail_id in lost_acks if mail_id not in acks]
            self._acks[:0] = [mail_id for mail_id in lost_acks if mail_id not in self._acks]
            if self.on_restored is not None:
                self.on_restored(len(lost))
        self.wake_mail()  # what was posted meanwhile
        if outcome == "stored":
            settle(None)
            return True
        return False

    def _bodies(self, conn: psycopg.Connection[Any], start: int, end: int) -> list[str]:
        """(worker thread) The stored bodies of seqs ``start`` to ``end - 1``."""
        sql = self.store._sql
        return [
            body
            for (body,) in conn.execute(
                f"SELECT body FROM {sql.s}.events WHERE session_id = %s AND seq >= %s AND seq < %s ORDER BY seq",
                (self.header.id, start, end),
            )
        ]

    def _lost(self, reason: str) -> SessionStoreError:
        self._broken = f"{reason}; resume the session to continue from what is stored"
        return SessionStoreError(
            f"session {self.header.id!r} cannot be written in {self.store.location}: {self._broken}",
            path=self.store.location,
            session_id=self.header.id,
        )

    def _failure(self, exc: BaseException, what: str) -> SessionStoreError:
        return self.store._error(exc, f"{what} session {self.header.id!r}", session_id=self.header.id)

    def _drop_connection(self) -> None:
        """Close the connection: the server releases the session's lock with it."""
        conn, self._conn = self._conn, None
        self._held = False
        if conn is not None:
            conn.close()

    async def _release_connection(self) -> None:
        """Give the session back (unlock) and the connection to the pool; closing it if that fails."""
        conn, self._conn = self._conn, None
        held, self._held = self._held, False
        if conn is not None:
            await self.store._give_back_locked(conn, self._key if held else None)

    # ------------------------------------------------------------ heartbeat

    async def _heartbeat(self) -> None:
        """Keep the lock's connection busy enough that the server does not evict it."""
        period = self.store.heartbeat
        assert period is not None
        while True:
            await trio.sleep(period)
            if self._lock.locked() or trio.current_time() - self._last_used < period / 2:
                continue
            async with self._lock:
                if self._closed or self._broken is not None or self._header_line is not None:
                    return
                try:
                    conn = self._conn
                    if conn is None:
                        lost: list[str] = []
                        await self._reattach(lost, [], lambda _: None)
                        self._buffer[:0] = lost  # put back by the retake: stored by the next flush
                    else:
                        await self._timed(conn, _execute(conn, "SELECT 1"))
                except SessionStoreError as exc:
                    log.warning("session %r: %s", self.header.id, exc)
                except _psycopg().Error as exc:
                    if self._conn is not None and (self._conn.broken or self._conn.closed):
                        self._drop_connection()
                    log.warning("session %r: heartbeat failed (%s); taking the session again", self.header.id, exc)
                finally:
                    self._last_used = trio.current_time()

    # ------------------------------------------------------------ mail

    def receive(self, on_mail: Callable[[], Awaitable[None]]) -> None:
        """Call ``on_mail`` whenever messages may be waiting for this session (now, and on notifications)."""
        self._on_mail = on_mail
        self.store._start_mail(self)
        self._mail_wake.set()

    def wake_mail(self) -> None:
        if self._on_mail is not None:
            self._mail_wake.set()

    async def _mail_loop(self) -> None:
        while True:
            await self._mail_wake.wait()
            self._mail_wake = trio.Event()
            on_mail = self._on_mail
            if on_mail is None or self._closed:
                return
            try:
                await on_mail()
            except Exception:
                # The messages stay in the mailbox (delivered on the next wake or resume).
                log.exception("session %r: delivering posted messages failed", self.header.id)

    async def take_mail(self) -> list[tuple[int, InboxMessage]]:
        """The messages posted to this session and not yet taken, oldest first.

        They stay in the mailbox until :meth:`ack_mail` hands them to the
        flush that stores their splice (or :meth:`release_mail` gives them up).
        """
        async with self._lock:
            conn = self._conn
            if conn is None or self._closed or self._broken is not None:
                return []
            sql, sid = self.store._sql, self.header.id
            try:
                rows = await self._timed(
                    conn,
                    lambda: conn.execute(
                        f"SELECT id, body FROM {sql.s}.mailbox WHERE session_id = %s ORDER BY id", (sid,)
                    ).fetchall(),
                )
            except _psycopg().Error as exc:
                if not (conn.broken or conn.closed):
                    raise self._failure(exc, "read the mailbox of") from exc
                # The next flush or heartbeat takes the session again (or finds it
                # lost); the messages wait in the mailbox meanwhile.
                self._drop_connection()
                log.warning("session %r: the connection was lost while reading its mailbox (%s)", sid, exc)
                return []
            finally:
                self._last_used = trio.current_time()
        mail: list[tuple[int, InboxMessage]] = []
        for mail_id, body in rows:
            if mail_id in self._taken:
                continue
            self._taken.add(mail_id)
            try:
                message = decode_inbox_message(body)
            except EventDecodeError as exc:
                log.error("session %r: mailbox row %d is not a message (%s); removing it", sid, mail_id, exc)
                self._acks.append(mail_id)
                continue
            mail.append((mail_id, message))
        return mail

    def ack_mail(self, mail_ids: Sequence[int]) -> None:
        """These messages were spliced into the inbox: delete them with the next flush's batch."""
        self._acks.extend(mail_ids)

    def release_mail(self, mail_ids: Sequence[int]) -> None:
        """These messages were not delivered: leave them for a later take (or the next resume)."""
        for mail_id in mail_ids:
            self._taken.discard(mail_id)

    # ------------------------------------------------------------ close

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffer = []
        self._on_mail = None
        for scope in (self._heartbeat_scope, self._mail_scope):
            if scope is not None:
                scope.cancel()
        with trio.CancelScope(shield=True):
            acquired = False
            with trio.move_on_after(self.store.release_timeout):
                await self._lock.acquire()
                acquired = True
            try:
                if acquired:
                    await self._release_connection()
                else:
                    # A statement still hangs on the connection (the network is
                    # gone): it cannot be closed under that thread; the server
                    # drops it, and the session's lock, when it notices.
                    log.warning("session %r: closed while a statement still runs; its lock goes with the connection")
            finally:
                if acquired:
                    self._lock.release()
                if self.store._writers.get(self.header.id) is self:
                    del self.store._writers[self.header.id]


class _ShortPrefix(Exception):
    """A fork found fewer stored events than its boundary (the transaction rolls back)."""


class _MailTaken(Exception):
    def __init__(self, missing: int) -> None:
        super().__init__(f"{missing} mailbox rows are gone")
        self.missing = missing


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
    _pool: _Pool | None = attrs.field(default=None, init=False)
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _depth: int = attrs.field(default=0, init=False)
    _exit_stacks: list[AsyncExitStack] = attrs.field(factory=list, init=False)
    # Writers of this object holding their session, by session id.
    _writers: dict[str, _PgWriter] = attrs.field(factory=dict, init=False)
    _listening: bool = attrs.field(default=False, init=False)
    _checked: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        pg = _psycopg()
        if not isinstance(self.dsn, str):
            raise TypeError(f"dsn must be a str, got {type(self.dsn).__name__}")
        try:
            pg.conninfo.conninfo_to_dict(self.dsn)
        except pg.Error as exc:
            raise SessionStoreError(
                f"the PostgreSQL connection URL {redact_dsn(self.dsn)!r} cannot be parsed: {str(exc).strip()}; "
                "use postgresql://USER@HOST:PORT/DATABASE",
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
                pool = self._pool = _Pool(self, self.pool_size)
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

    async def _connect(self) -> psycopg.Connection[Any]:
        """A new connection, retried with backoff while the failure may pass.

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
                return await self._connect_once()
            except pg.Error as exc:
                reason = str(exc).strip()
                if any(mark in reason for mark in _PERMANENT) or trio.current_time() + delay > deadline:
                    raise self._connect_error(reason) from exc
                log.info("cannot connect to %s yet (%s); retrying in %.2f s", self.location, reason, delay)
            await trio.sleep(delay)
            delay = min(delay * 2, 1.0)

    async def _connect_once(self) -> psycopg.Connection[Any]:
        pg = _psycopg()
        params = pg.conninfo.conninfo_to_dict(self.dsn)
        kwargs: dict[str, Any] = {"autocommit": True}
        kwargs.setdefault("connect_timeout", max(2, math.ceil(self.connect_timeout)))
        for name, value in (
            ("application_name", "trio-harness"),
            ("keepalives", 1),
            ("keepalives_idle", 5),
            ("keepalives_interval", 2),
            ("keepalives_count", 3),
        ):
            if name not in params:
                kwargs[name] = value
        # A cancelled caller stops waiting at once (the thread is abandoned); whichever side
        # comes second closes the connection: the thread if the caller left first, the
        # caller if the thread had already handed it over (Trio then drops the result).
        lock = threading.Lock()
        abandoned = False
        handed: list[psycopg.Connection[Any]] = []

        def connect() -> psycopg.Connection[Any] | None:
            conn: psycopg.Connection[Any] = pg.connect(self.dsn, **kwargs)
            with lock:
                if abandoned:
                    conn.close()
                    return None
                handed.append(conn)
            return conn

        try:
            conn = await trio.to_thread.run_sync(connect, abandon_on_cancel=True)
        except BaseException:
            with lock:
                abandoned = True
                leftover = list(handed)
            for made in leftover:
                made.close()
            raise
        assert conn is not None
        return conn

    def _connect_error(self, reason: str) -> SessionStoreError:
        params: dict[str, Any] = _psycopg().conninfo.conninfo_to_dict(self.dsn)
        where = redact_dsn(self.dsn)
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
        elif isinstance(exc, pg.errors.UndefinedTable | pg.errors.InvalidSchemaName):
            message = f"cannot {what} in {self.location}: the store's tables are missing ({reason}); run check() first"
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
                    lost = conn.broken or conn.closed
                    unsent = str(exc).startswith("sending")
                    if attempt == 1 and lost and (retry or unsent):
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
            await self._run("check the store", self._check_version, retry=True)
            return
        conn = await self._connect()
        try:
            with self._translated("create the session tables"):
                await _call(conn, lambda: self._migrate(conn))
        finally:
            conn.close()
        self._checked = True

    def _check_version(self, conn: psycopg.Connection[Any]) -> None:
        version = _scalar(conn, f"SELECT coalesce(max(version), 0) FROM {self._sql.s}.schema_version")
        if version != SCHEMA_VERSION:
            raise self._version_error(version)

    def _version_error(self, version: int) -> SessionStoreError:
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

    def _migrate(self, conn: psycopg.Connection[Any]) -> None:
        """(worker thread) Bring the schema to :data:`SCHEMA_VERSION`."""
        pg = _psycopg()
        sql = self._sql
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
            self._check_privileges(conn)
            return
        if version > SCHEMA_VERSION:
            raise self._version_error(version)
        try:
            self._migrate_from(conn, version)
        except pg.errors.InsufficientPrivilege as exc:
            schema_exists = conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone()
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
        self._check_privileges(conn)

    def _migrate_from(self, conn: psycopg.Connection[Any], version: int) -> None:
        """(worker thread) Create or upgrade the tables from ``version``, in one transaction."""
        sql = self._sql
        with conn.transaction():
            # One migrating worker at a time; the others find the work done.
            conn.execute("SELECT pg_advisory_xact_lock(%s)", (_lock_key(self.schema, "\x00migrate"),))
            if not conn.execute("SELECT 1 FROM pg_namespace WHERE nspname = %s", (self.schema,)).fetchone():
                conn.execute(f"CREATE SCHEMA {sql.s}")
            conn.execute(
                f"CREATE TABLE IF NOT EXISTS {sql.s}.schema_version (version integer PRIMARY KEY, "
                "applied_at timestamptz NOT NULL DEFAULT now())"
            )
            version = _scalar(conn, f"SELECT coalesce(max(version), 0) FROM {sql.s}.schema_version")
            if version > SCHEMA_VERSION:
                raise self._version_error(version)
            for number, statements in enumerate(sql.migrations(), start=1):
                if number <= version:
                    continue
                for statement in statements:
                    conn.execute(statement)
                conn.execute(f"INSERT INTO {sql.s}.schema_version (version) VALUES (%s)", (number,))
                log.info("%s: session tables migrated to version %d", self.location, number)

    def _check_privileges(self, conn: psycopg.Connection[Any]) -> None:
        s = self.schema
        needed = [
            ("sessions", "SELECT"),
            ("sessions", "INSERT"),
            ("events", "SELECT"),
            ("events", "INSERT"),
            ("mailbox", "SELECT"),
            ("mailbox", "INSERT"),
            ("mailbox", "DELETE"),
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
                f"(GRANT SELECT, INSERT, DELETE ON ALL TABLES IN SCHEMA {_quote(s)} TO <role>)",
                path=self.location,
            )

    async def exists(self, session_id: str) -> bool:
        """Whether a session with this id is stored."""
        validate_session_id(session_id)
        sql = self._sql

        def work(conn: psycopg.Connection[Any]) -> bool:
            row = conn.execute(f"SELECT 1 FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone()
            return row is not None

        return await self._run(f"look up session {session_id!r}", work, retry=True)

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

        def select() -> tuple[tuple[str] | None, list[tuple[int, str]]]:
            row = conn.execute(f"SELECT header FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone()
            if row is None:
                return None, []
            query = f"SELECT seq, body FROM {sql.s}.events WHERE session_id = %s ORDER BY seq"
            return row, conn.execute(query, (session_id,)).fetchall()

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
        for index, (seq, body) in enumerate(rows):
            if seq != index:
                raise SessionCorruptError(
                    f"{where}: event seq {index} is missing (the next stored one is {seq})", path=where, line=index + 2
                )
            try:
                event = decode_event(body)
                if event.seq != seq:
                    raise EventDecodeError(f"the event says seq {event.seq} but is stored as seq {seq}")
            except EventDecodeError as exc:
                raise SessionCorruptError(f"{where}: event seq {seq}: {exc}", path=where, line=index + 2) from exc
            events.append(event)
        return LoadedSession(header=header, events=tuple(events))

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        """A writer for a new session; its first flush takes the session's lock and stores it.

        Raises:
            SessionError: the header cannot be encoded.
            SessionStoreError: the store is not open.
        """
        validate_session_id(header.id)
        self._require_pool()
        try:
            line = encode_header(header)
        except (TypeError, ValueError) as exc:
            raise SessionError(f"the header of session {header.id!r} cannot be stored: {exc}") from exc
        return _PgWriter(self, header, header_line=line, stored=0)

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
        try:
            while True:
                try:
                    with self._translated(f"take session {session_id!r}"):
                        locked = await _call(conn, functools.partial(_try_lock, conn, key))
                except _Tainted:
                    conn.close()
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
        lines = [encode_event(event) for event in events]

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                row = conn.execute(
                    sql.insert_session,
                    (header.id, header_line, header.created_at, header.parent_session),
                ).fetchone()
                if row is None:
                    return False
                if lines:
                    conn.execute(sql.insert_events, (header.id, 0, lines), binary=True)
            return True

        if not await self._run(f"store session {header.id!r}", work):
            raise SessionExistsError(f"session {header.id!r} is already stored in {self.location}")

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
                    row = conn.execute(
                        sql.insert_session,
                        (child.id, header_line, child.created_at, child.parent_session),
                    ).fetchone()
                    if row is None:
                        return "exists"
                    copied = conn.execute(
                        f"INSERT INTO {sql.s}.events (session_id, seq, body) SELECT %s, seq, body "
                        f"FROM {sql.s}.events WHERE session_id = %s AND seq < %s",
                        (child.id, source, boundary),
                    ).rowcount
                    if copied != boundary:
                        raise _ShortPrefix
            except _ShortPrefix:
                return "short"  # rolled back: fewer events of the source are stored
            return "copied"

        outcome = await self._run(f"fork session {source!r} into {child.id!r}", work)
        if outcome == "exists":
            raise SessionExistsError(
                f"cannot fork into {child.id!r}: that session is already stored in {self.location}"
            )
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
                conn = await self._connect()
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
