"""Pooled mode of the PostgreSQL store: connections per worker, leases with an epoch fence, group commit.

:class:`PooledPostgresStore` holds its sessions without a connection each:

* the worker holds one **liveness lock** (a session-level advisory lock keyed
  by its random worker id) on a direct connection of its own, kept alive by
  the heartbeat and dropped by the server after ``idle_session_timeout``;
* a live session is a **lease** row ``(session_id, worker_id, worker_key,
  epoch)``: taking a session (``resume``, or the claim of a new one) is one
  statement that bumps the epoch, allowed only when the row names no worker or
  a worker whose liveness lock is free (``pg_locks``); releasing it clears the
  worker and keeps the epoch (epochs never repeat);
* every append and mailbox delete joins the writer's lease ``(worker, epoch)``
  ``FOR SHARE`` in the same statement: a writer whose lease was taken (even
  one that was frozen and resumed) writes nothing, and a takeover waits for an
  append that locked the lease to finish before it reads the log;
* flushes of different sessions ready at once share one transaction and one
  statement (**group commit**): the statement returns the sessions whose lease
  held; each of those had its whole batch stored, the others nothing.

A worker uses its ``pool_size`` shared connections, the liveness connection
and the mailbox listener: at most ``pool_size + 2`` whatever the number of its
sessions.  The shared ones use no named prepared statements
(``prepare_threshold=None``), so ``dsn`` may go through a transaction-pooling
proxy; the liveness and LISTEN connections need session state, so they use
``direct_dsn`` (the server, or a session-pooling proxy).  A ``direct_dsn``
found to go through a transaction pooler is refused (``_check_pinned``).
"""

from __future__ import annotations

import functools
import logging
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import (
    SessionError,
    SessionExistsError,
    SessionLockedError,
    SessionStoreError,
)
from ._codec import encode_event, encode_header
from ._events import Event, InboxMessage, SessionHeader
from ._persistence import LoadedSession
from ._pg_group import GroupCommitter, _Request
from ._pg_schema import _lock_key, _psycopg, _scalar
from ._pg_threads import _call
from ._pg_writer import claim_mail
from ._postgres import PostgresStore, redact_dsn
from ._session import SessionWriter, validate_session_id

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("trio_harness.session.postgres")


def _lease_tables(s: str) -> list[str]:
    return [
        f"CREATE TABLE IF NOT EXISTS {s}.leases (session_id text PRIMARY KEY, worker_id text, "
        "worker_key bigint, epoch bigint NOT NULL)",
    ]


def _free_clause(alias: str) -> str:
    """True when the lease row ``alias`` names no worker, or one whose liveness lock nobody holds."""
    return (
        f"({alias}.worker_id IS NULL OR NOT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' "
        "AND granted AND objsubid = 1 AND database = (SELECT oid FROM pg_database WHERE datname = current_database()) "
        f"AND classid::bigint = (({alias}.worker_key >> 32) & 4294967295) "
        f"AND objid::bigint = ({alias}.worker_key & 4294967295)))"
    )


class _NotPinned(SessionStoreError):
    """The direct URL goes through a transaction pooler: the liveness lock is not this worker's alone."""


@attrs.define(eq=False, repr=False)
class PooledPostgresStore(PostgresStore):
    """:class:`PostgresStore` in pooled mode: O(1) connections per worker, leases, group commit.

    The same tables (plus ``leases``, created by the service when missing),
    the same protocol; a live session holds a lease row instead of a
    connection, so a worker uses at most ``pool_size + 2`` connections.  Every
    flush commits synchronously (``sync=False`` is not distinguished: group
    commit pays for it).  Opt-in while the per-session mode stays the default.

    Args:
        direct_dsn: the URL of the two connections that keep session state,
            the worker's liveness lock (an advisory lock) and the mailbox
            listener (``LISTEN``): the server itself or a session-pooling
            proxy, never a transaction pooler (refused when detected).
            Default: ``dsn``.  The ``pool_size`` shared connections use
            ``dsn``, which may go through a transaction-pooling proxy
            (PgBouncer's ``pool_mode = transaction``).

    The other arguments are :class:`PostgresStore`'s.
    """

    direct_dsn: str | None = attrs.field(default=None, kw_only=True)
    worker_id: str = attrs.field(factory=lambda: uuid.uuid4().hex, init=False)
    """This worker's random id, named by the leases of the sessions it holds."""
    _live: psycopg.Connection[Any] | None = attrs.field(default=None, init=False)
    # The server process of the liveness connection (holding the lock), checked by every heartbeat.
    _live_pid: int = attrs.field(default=0, init=False)
    _beat_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _group: GroupCommitter = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        direct = self.direct_dsn
        if direct is None:
            return
        if not isinstance(direct, str):
            raise TypeError(f"direct_dsn must be a str, got {type(direct).__name__}")
        pg = _psycopg()
        try:
            pg.conninfo.conninfo_to_dict(direct)
        except pg.Error as exc:
            raise SessionStoreError(
                f"the PostgreSQL direct connection URL (direct_dsn) {redact_dsn(direct)!r} cannot be parsed: "
                f"{redact_dsn(str(exc).strip())}; use postgresql://USER@HOST:PORT/DATABASE",
                path=redact_dsn(direct),
            ) from None
        self._session_dsn = direct

    def __repr__(self) -> str:
        direct = "" if self.direct_dsn is None else f", direct_dsn={redact_dsn(self.direct_dsn)!r}"
        return f"PooledPostgresStore({redact_dsn(self.dsn)!r}{direct}, schema={self.schema!r})"

    @_group.default
    def _new_group(self) -> GroupCommitter:
        return GroupCommitter(self)

    @property
    def worker_key(self) -> int:
        """The advisory lock key of this worker's liveness lock (a hash of schema and :attr:`worker_id`)."""
        return _lock_key(self.schema, "\x00worker\x00" + self.worker_id)

    async def _connect(self, dsn: str | None = None) -> psycopg.Connection[Any]:
        conn = await super()._connect(dsn)
        conn.prepare_threshold = None  # unnamed statements only: a transaction-pooling proxy may sit between
        return conn

    @asynccontextmanager
    async def open_service(self) -> AsyncIterator[PostgresStore]:
        async with super().open_service() as store:
            if self._depth == 0 and self._live is None:
                await self._start_liveness()
            try:
                yield store
            finally:
                if self._depth == 0:
                    # The heartbeat stops first, or it would take the lock again on a new connection.
                    self._beat_scope.cancel()
                    if self._live is not None:
                        self._live.close()
                        self._live = None

    async def _start_liveness(self) -> None:
        sql = self._sql
        await self._run("create the lease table", lambda conn: [conn.execute(q) for q in _lease_tables(sql.s)])
        self._live = await self._lock_liveness()
        assert self._nursery is not None
        self._beat_scope = trio.CancelScope()

        async def beat() -> None:
            with self._beat_scope:
                await self._beat()

        self._nursery.start_soon(beat, name="postgres worker liveness")
        self._nursery.start_soon(self._group.run, name="postgres group commit")

    async def _lock_liveness(self) -> psycopg.Connection[Any]:
        """A new direct connection holding this worker's liveness lock (dropped by the server once silent)."""
        conn = await self._connect(self._session_dsn)
        key = self.worker_key

        def lock() -> int:
            self._configure_writer(conn)
            return int(_scalar(conn, "SELECT pg_backend_pid() FROM pg_advisory_lock(%s)", (key,)))

        try:
            with self._translated("take this worker's liveness lock"):
                pid = await _call(conn, lock)
            if pid != conn.info.backend_pid:  # a proxy between: it must keep this server process for us
                await self._check_pinned(pid)
        except BaseException:
            conn.close()
            raise
        self._live_pid = pid
        return conn

    def _not_pinned(self, why: str) -> _NotPinned:
        where = redact_dsn(self._session_dsn or self.dsn)
        return _NotPinned(
            f"the direct connection URL {where!r} of {self!r} goes through a transaction-pooling proxy ({why}): "
            "the worker's liveness lock (an advisory lock) and the mailbox listener (LISTEN) would be shared "
            "with other clients, so sessions could be held twice; give direct_dsn the server's URL or a "
            "session-pooling proxy's (only dsn, the shared pool, may go through a transaction pooler)",
            path=self.location,
        )

    async def _check_pinned(self, pid: int) -> None:
        """Refuse a direct URL through a transaction pooler: a second connection must not reach server process ``pid``.

        Behind a transaction pooler, the server process that just took the
        liveness lock is idle in the pooler's pool and handed to the next
        client (PgBouncer reuses the most recent one first); behind a session
        pooler it stays ours.  The heartbeat checks the process too.
        """
        probe = await self._connect(self._session_dsn)
        try:
            with self._translated("check the direct connection"):
                other = int(await _call(probe, lambda: _scalar(probe, "SELECT pg_backend_pid()")))
        finally:
            probe.close()
        if other == pid:
            raise self._not_pinned(f"a second connection reached server process {pid}, which holds the lock")

    async def _beat(self) -> None:
        """Keep the liveness connection active; retake the lock on a new one when it was lost.

        While the lock is free another worker may take this worker's sessions;
        their writers are then fenced (their epochs are stale), the others
        carry on once the lock is held again.
        """
        period = self.heartbeat or 1.0
        pg = _psycopg()
        while True:
            await trio.sleep(period)
            conn = self._live
            try:
                if conn is None or conn.broken or conn.closed:
                    self._live = await self._lock_liveness()
                    log.warning("worker %s: liveness lock taken again on a new connection", self.worker_id)
                    continue
                with trio.fail_after(self.write_timeout):
                    pid = await _call(conn, functools.partial(_scalar, conn, "SELECT pg_backend_pid()"))
            except _NotPinned:
                raise  # fails the service: the lock does not protect this worker's sessions
            except (pg.Error, SessionStoreError, trio.TooSlowError) as exc:
                log.warning("worker %s: liveness heartbeat failed (%s)", self.worker_id, exc)
                if conn is not None and self._live is conn:
                    conn.close()
                continue
            if pid != self._live_pid:
                raise self._not_pinned(
                    f"the liveness connection now reaches server process {pid}, not {self._live_pid} (the lock's)"
                )

    # ------------------------------------------------------------ leases

    async def _take_lease(self, session_id: str) -> int | None:
        """Take the session's lease (bump its epoch) if it is free; its epoch, or None when held."""
        s = self._sql.s
        query = (
            f"INSERT INTO {s}.leases AS leases (session_id, worker_id, worker_key, epoch) VALUES (%s, %s, %s, 1) "
            "ON CONFLICT (session_id) DO UPDATE SET worker_id = EXCLUDED.worker_id, "
            "worker_key = EXCLUDED.worker_key, epoch = leases.epoch + 1 "
            f"WHERE {_free_clause('leases')} RETURNING epoch"
        )
        params = (session_id, self.worker_id, self.worker_key)

        def work(conn: psycopg.Connection[Any]) -> int | None:
            row = conn.execute(query, params).fetchone()
            return None if row is None else int(row[0])

        return await self._run(f"take session {session_id!r}", work)

    async def _release_lease(self, session_id: str, epoch: int) -> None:
        s = self._sql.s
        await self._run(
            f"release session {session_id!r}",
            lambda conn: conn.execute(
                f"UPDATE {s}.leases SET worker_id = NULL WHERE session_id = %s AND worker_id = %s AND epoch = %s",
                (session_id, self.worker_id, epoch),
            ),
        )

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
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
        epoch = await self._take_lease(session_id)
        if epoch is None:
            raise SessionExistsError(
                f"session {session_id!r} already exists: it is being created, or is live, on another worker "
                f"(its lease in {self.location} is held); use another id, or resume it once it is stored"
            )
        try:
            if session_id in self._writers:
                raise SessionExistsError(
                    f"session {session_id!r} already exists: it is being created or is live in this process"
                )
            if await self.exists(session_id):
                raise SessionExistsError(
                    f"session {session_id!r} is already stored in {self.location}; resume it instead"
                )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._release_lease(session_id, epoch)
            raise
        writer = _PooledWriter(self, header, header_line=line, stored=0, epoch=epoch)
        self._writers[session_id] = writer  # type: ignore[assignment]
        return writer

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        validate_session_id(session_id)
        if session_id in self._writers:
            raise SessionLockedError(
                f"session {session_id!r} is already live or being resumed in this process; dispose its agent first",
                path=self.location,
            )
        deadline = trio.current_time() + self.lock_timeout
        delay = 0.005
        while (epoch := await self._take_lease(session_id)) is None:
            remaining = deadline - trio.current_time()
            if remaining <= 0:
                raise SessionLockedError(
                    f"session {session_id!r} is live on another worker (its lease in {self.location} is held); "
                    "stop it there, or wait until that worker is gone (a dead worker releases it at once, "
                    f"a frozen one within {self.idle_session_timeout} s)",
                    path=self.location,
                )
            await trio.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)
        try:
            if session_id in self._writers:
                raise SessionLockedError(
                    f"session {session_id!r} is already live or being resumed in this process; dispose its agent first",
                    path=self.location,
                )
            loaded = await self.load(session_id)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._release_lease(session_id, epoch)
            raise
        writer = _PooledWriter(self, loaded.header, header_line=None, stored=len(loaded.events), epoch=epoch)
        self._writers[session_id] = writer  # type: ignore[assignment]
        return loaded, writer


@attrs.define(eq=False)
class _PooledWriter:
    store: PooledPostgresStore
    header: SessionHeader
    _header_line: str | None = attrs.field(alias="header_line")
    _stored: int = attrs.field(alias="stored")
    _epoch: int = attrs.field(alias="epoch")
    _buffer: list[str] = attrs.field(factory=list, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _broken: str | None = attrs.field(default=None, init=False)
    _mail_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _on_mail: Callable[[], Awaitable[None]] | None = attrs.field(default=None, init=False)
    _mail_wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _taken: set[int] = attrs.field(factory=set, init=False)
    _acks: list[int] = attrs.field(factory=list, init=False)

    def write(self, event: Event) -> None:
        self._buffer.append(encode_event(event))

    def _error(self, reason: str) -> SessionStoreError:
        return SessionStoreError(
            f"cannot store the events of session {self.header.id!r} in {self.store.location}: {reason}",
            path=self.store.location,
            session_id=self.header.id,
        )

    async def flush(self, *, sync: bool = True) -> None:
        async with self._lock:
            if not self._buffer and not self._acks:
                return
            if self._closed or self._broken is not None:
                raise self._error("its writer is closed" if self._closed else self._broken or "")
            lines, acks = self._buffer, list(self._acks)
            self._buffer = []
            try:
                if self._header_line is not None:
                    outcome: bool | BaseException | None = await self._create(lines)
                else:
                    request = _Request(self, lines, acks, sync)
                    await self.store._group.submit(request)
                    outcome = request.outcome
            except BaseException:
                self._buffer[:0] = lines
                raise
            if outcome is True:
                self._stored += len(lines)
                for mail_id in acks:
                    self._acks.remove(mail_id)
                    self._taken.discard(mail_id)
                return
            self._buffer[:0] = lines
            if outcome is False:
                self._broken = (
                    "this writer lost the session (its lease was taken by another worker); "
                    "resume the session to continue from what is stored"
                )
                raise self._error(self._broken)
            if isinstance(outcome, SessionStoreError):
                raise outcome
            if isinstance(outcome, _psycopg().Error):
                raise self.store._error(outcome, f"store the events of session {self.header.id!r}") from outcome
            raise self._error(f"{type(outcome).__name__}: {outcome}") from outcome

    async def _create(self, lines: list[str]) -> bool:
        """The first flush of a new session: its row and batch in one transaction, fenced by the lease."""
        store, sql, header, line = self.store, self.store._sql, self.header, self._header_line
        s = sql.s

        def work(conn: psycopg.Connection[Any]) -> bool:
            with conn.transaction():
                held = conn.execute(
                    f"SELECT 1 FROM {s}.leases WHERE session_id = %s AND worker_id = %s AND epoch = %s FOR SHARE",
                    (header.id, store.worker_id, self._epoch),
                ).fetchone()
                if held is None:
                    return False
                if (
                    conn.execute(
                        sql.insert_session, (header.id, line, header.created_at, header.parent_session)
                    ).fetchone()
                    is None
                ):
                    raise SessionExistsError(f"session {header.id!r} is already stored in {store.location}")
                if lines:
                    conn.execute(sql.insert_events, (header.id, 0, lines), binary=True)
            return True

        try:
            stored = await store._run(f"store session {header.id!r}", work)
        except SessionExistsError as exc:
            self._broken = str(exc)
            raise self._error(str(exc)) from exc
        if stored:
            self._header_line = None
        return stored

    # ------------------------------------------------------------ mail

    def receive(self, on_mail: Callable[[], Awaitable[None]]) -> None:
        self._on_mail = on_mail
        self.store._start_mail(self)  # type: ignore[arg-type]
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
                log.exception("session %r: delivering posted messages failed", self.header.id)

    async def take_mail(self) -> list[tuple[int, InboxMessage]]:
        if self._closed or self._broken is not None:
            return []
        s, sid = self.store._sql.s, self.header.id
        rows = await self.store._run(
            f"read the mailbox of session {sid!r}",
            lambda conn: conn.execute(
                f"SELECT id, body FROM {s}.mailbox WHERE session_id = %s ORDER BY id", (sid,)
            ).fetchall(),
            retry=True,
        )
        return claim_mail(sid, rows, self._taken, self._acks)

    def ack_mail(self, mail_ids: Sequence[int]) -> None:
        self._acks.extend(mail_ids)

    def release_mail(self, mail_ids: Sequence[int]) -> None:
        for mail_id in mail_ids:
            self._taken.discard(mail_id)

    # ------------------------------------------------------------ close

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        self._buffer = []
        self._on_mail = None
        if self._mail_scope is not None:
            self._mail_scope.cancel()
        with trio.CancelScope(shield=True):
            try:
                async with self._lock:
                    if self._broken is None and self.store._pool is not None:
                        with trio.move_on_after(self.store.release_timeout):
                            await self.store._release_lease(self.header.id, self._epoch)
            except SessionStoreError as exc:
                log.warning(
                    "session %r: releasing its lease failed (%s); a takeover finds it free once this worker is gone",
                    self.header.id,
                    exc,
                )
            finally:
                writers: dict[str, object] = self.store._writers  # type: ignore[assignment]
                if writers.get(self.header.id) is self:
                    del writers[self.header.id]
