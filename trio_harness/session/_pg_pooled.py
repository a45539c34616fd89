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
  held; each of those had its whole batch stored, the others nothing;
* a flush carrying large images (their blobs, session/_blobs.py), the first
  flush of a new session and the flush after one whose outcome is unknown
  commit in a transaction of their own instead (:func:`_store_own`): fenced
  by the lease the same way, idempotent, so a lost or cancelled commit is
  found stored, never repeated.

Takes, ``save`` and forks share the session's advisory lock key with the
per-session mode (:mod:`._pg_leases`), so both modes may use one schema.

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
import math
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, TypeVar

import attrs
import trio

from .._errors import (
    SessionError,
    SessionExistsError,
    SessionLockedError,
    SessionStoreError,
)
from ._blobs import IMAGE_EVENTS, externalize, insert_blobs
from ._codec import encode_event, encode_header
from ._events import Event, InboxMessage, SessionHeader
from ._flush_lock import FlushLock
from ._persistence import LoadedSession
from ._pg_group import GroupCommitter, _Request
from ._pg_leases import take_lease
from ._pg_mail import mail_loop
from ._pg_rows import each_event, select_from
from ._pg_schema import _lock_key, _psycopg, _scalar
from ._pg_threads import _call, worth_retrying
from ._pg_writer import claim_mail
from ._postgres import PostgresStore, redact_dsn
from ._session import SessionWriter, validate_session_id

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("trio_harness.session.postgres")

T = TypeVar("T")


class _NotPinned(SessionStoreError):
    """The direct URL goes through a transaction pooler: the liveness lock is not this worker's alone."""


@attrs.define(eq=False, repr=False)
class PooledPostgresStore(PostgresStore):
    """:class:`PostgresStore` in pooled mode: O(1) connections per worker, leases, group commit.

    The same tables (``leases`` included, created by ``check()``: a schema
    it did not upgrade is refused when the service opens), the same
    protocol; a live session holds a lease row instead of a connection, so
    a worker uses at most ``pool_size + 2`` connections.  It may share a
    schema with per-session workers: each refuses the sessions the other
    holds (session/_pg_leases.py).  Every flush commits synchronously
    (``sync=False`` is not distinguished: group
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
    """This worker's random id, named by the leases of the sessions it holds (a new one every time the store opens).

    A lease the worker could not release (see ``release_timeout``) is free
    once its liveness lock is gone, when the store closes; opened again, the
    store is a new worker, so such a lease never comes back to life."""
    _live: psycopg.Connection[Any] | None = attrs.field(default=None, init=False)
    # The server process of the liveness connection (holding the lock), checked by every heartbeat.
    _live_pid: int = attrs.field(default=0, init=False)
    _group: GroupCommitter = attrs.field(init=False)
    # The ids a resume or a create of this process is taking (or a retried release is releasing): one at a time.
    _taking: set[str] = attrs.field(factory=set, init=False)
    # Leases of this worker whose release failed (by session id: their epoch, None when unknown), retried by the
    # heartbeat: until then the session looks live here to other workers.
    _unreleased: dict[str, int | None] = attrs.field(factory=dict, init=False)
    # The ids whose release the heartbeat is retrying right now (in _taking too): a take of this process waits for it.
    _releasing: dict[str, trio.Event] = attrs.field(factory=dict, init=False)
    _beat_scope: trio.CancelScope | None = attrs.field(default=None, init=False)

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
                    # The heartbeat stops first (it would take the liveness lock again on a new connection,
                    # left open), then the writers release their leases while the lock still holds them.
                    if self._beat_scope is not None:
                        self._beat_scope.cancel()
                        self._beat_scope = None
                    with trio.CancelScope(shield=True):
                        for writer in list(self._writers.values()):
                            await writer.aclose()
                    if self._live is not None:
                        self._live.close()
                        self._live = None

    async def _start_liveness(self) -> None:
        # A new worker for every opening: the leases a closed opening left unreleased name its id, whose liveness
        # lock went with it (they are free), and must stay free: with the same id they would be live again.
        self.worker_id = uuid.uuid4().hex
        self._unreleased.clear()
        # The leases table is the migration's (version 3): a schema ``check()`` did not upgrade is refused, naming it.
        await self._run("check the session tables", self._tables.check_version, retry=True)
        self._live = await self._lock_liveness()
        assert self._nursery is not None
        scope = self._beat_scope = trio.CancelScope()

        async def beat() -> None:
            with scope:
                await self._beat()

        self._nursery.start_soon(beat, name="postgres worker liveness")
        self._group.starting()
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
        """Keep the liveness connection active; retake the lock on a new one when it was lost; retry releases.

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
                await self._retry_releases()
                continue
            if pid != self._live_pid:
                raise self._not_pinned(
                    f"the liveness connection now reaches server process {pid}, not {self._live_pid} (the lock's)"
                )
            await self._retry_releases()

    # ------------------------------------------------------------ leases

    async def _run_settled(
        self,
        what: str,
        fn: Callable[[psycopg.Connection[Any]], T],
        settle: Callable[[T], None],
        *,
        again: Callable[[psycopg.Connection[Any]], T] | None = None,
    ) -> T:
        """``fn(conn)`` (an idempotent transaction) on a pooled connection, bounded by ``write_timeout``.

        Run once more on a new connection when the connection was lost (it
        may have committed: ``fn`` finds its own work done), as ``again``
        when given (a variant that knows the lost attempt may still be
        running on the server).  A caller
        cancelled after ``fn`` completed gets ``settle(result)`` before the
        cancellation, so a commit is never mistaken for a failure.

        Raises:
            SessionStoreError: the statement failed, or was not answered in time
                (cancelled; whether it committed is then unknown).
        """
        pg = _psycopg()
        pool = self._require_pool()
        for attempt in (1, 2):
            finished: list[T] = []
            run = fn if attempt == 1 or again is None else again

            def on_settle(value: T, finished: list[T] = finished) -> None:
                finished.append(value)
                settle(value)

            async with pool.connection() as conn:
                try:
                    with trio.move_on_after(self.write_timeout):
                        return await _call(conn, functools.partial(run, conn), settle=on_settle)
                except pg.Error as exc:
                    if attempt == 1 and (conn.broken or conn.closed):
                        log.warning("cannot %s yet: the connection was lost (%s); trying again", what, exc)
                        continue
                    raise self._error(exc, what) from exc
                if finished:
                    return finished[0]
                conn.close()
            raise SessionStoreError(
                f"cannot {what} in {self.location}: PostgreSQL did not answer within {self.write_timeout:g} s "
                "(write_timeout); the statement was cancelled",
                path=self.location,
            )
        raise AssertionError("unreachable")

    async def _run_locked(
        self,
        what: str,
        lock: FlushLock,
        body: Callable[[psycopg.Connection[Any]], Awaitable[T]],
        *,
        retry: bool = False,
    ) -> T:
        """``body(conn)`` on a pooled connection with ``lock`` held, retried as :meth:`_run` retries ``fn``.

        The lock is never held while waiting for the pool: its holder (a
        writer's flush) would wait for it meanwhile, and may itself be waiting
        for a pooled connection.  Nor is a connection held while waiting for
        the lock (the two would wait for each other; with ``pool_size`` 1
        until a bound ends it): a connection taken while the lock is busy goes
        back, and once the lock is free again ``body`` runs on an idle one, or
        the wait for the pool starts over.  The connection always goes back,
        whatever ends ``body``.  ``body``'s ``psycopg.Error`` on a lost
        connection is retried once (on a new connection, the lock taken
        again) when ``retry`` (reads), or when nothing of the statement was
        sent; any other ``psycopg.Error`` is raised as a store error.
        """
        pg = _psycopg()
        for attempt in (1, 2):
            async with self._lent_locked(lock) as conn:
                try:
                    return await body(conn)
                except pg.Error as exc:
                    if attempt == 1 and worth_retrying(conn, exc, retry=retry):
                        continue
                    raise self._error(exc, what) from exc
        raise AssertionError("unreachable")

    @asynccontextmanager
    async def _lent_locked(self, lock: FlushLock) -> AsyncIterator[psycopg.Connection[Any]]:
        """A pooled connection, with ``lock`` held (see :meth:`_run_locked`): never one waited for holding the other."""
        pool = self._require_pool()
        while True:
            async with pool.connection() as conn:
                try:
                    lock.acquire_nowait()  # fair: refused while others wait for the lock too
                except trio.WouldBlock:
                    pass
                else:
                    try:
                        yield conn
                    finally:
                        lock.release()
                    return
            # The lock is busy (a flush, which may need a connection): wait for it with none, then take an idle one.
            async with lock:
                lent = pool.lend_nowait()
                if lent is not None:
                    try:
                        yield lent
                    finally:
                        pool.give_back_lent(lent)
                    return

    async def _take_lease(self, session_id: str) -> int | None:
        """Take the session's lease (bump its epoch) if it is free; its epoch, or None when held.

        A take cancelled after it committed (or whose outcome is unknown)
        gives the lease back: a lease of this worker that no writer holds
        would keep the session from every other worker while this one lives.
        A take whose connection was lost (maybe during its COMMIT) runs again
        on a new connection, waiting for the session's lock, which the lost
        take holds until it ends on the server (:func:`take_lease`'s
        ``wait``): a lost take that committed is then found (the lease names
        this worker, no writer of this process holds it) and taken again, one
        that did not is redone; never refused because of itself.  Refused
        after that wait, the session is left to the heartbeat's releases
        (:meth:`_retry_releases`), in case the lost take commits later still.
        """
        taken: list[int] = []

        def settle(epoch: int | None) -> None:
            if epoch is not None:
                taken.append(epoch)

        sql, worker_id, worker_key = self._sql, self.worker_id, self.worker_key
        rerun: list[bool] = []

        def again(conn: psycopg.Connection[Any]) -> int | None:
            rerun.append(True)
            return take_lease(conn, sql, session_id, worker_id, worker_key, wait=self.write_timeout / 2)

        try:
            epoch = await self._run_settled(
                f"take session {session_id!r}",
                lambda conn: take_lease(conn, sql, session_id, worker_id, worker_key),
                settle,
                again=again,
            )
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._release_lease(session_id, taken[0] if taken else None)
            raise
        if epoch is not None:
            self._unreleased.pop(session_id, None)  # a lease of ours left unreleased: taken again
        elif rerun and session_id not in self._unreleased:
            # Refused after waiting write_timeout / 2 for the lock: were the lost take still running (its server
            # process frozen) and to commit, its lease would be ours with no writer; the heartbeat releases it.
            self._unreleased[session_id] = None
        return epoch

    async def _release_lease(self, session_id: str, epoch: int | None) -> None:
        """Release this worker's lease of the session (``epoch`` None: whatever its epoch); never raises.

        A release that fails or is not answered within ``release_timeout``
        is kept and retried by the heartbeat (:meth:`_retry_releases`) until
        it succeeds, with a warning; the lease goes anyway when this worker
        stops (its liveness lock with it).
        """
        if self._pool is None:
            return  # the service is closed: the liveness lock is gone, and every lease of this worker is free
        s = self._sql.s
        query = f"UPDATE {s}.leases SET worker_id = NULL WHERE session_id = %s AND worker_id = %s"
        params: tuple[object, ...] = (session_id, self.worker_id)
        if epoch is not None:
            query, params = query + " AND epoch = %s", (*params, epoch)
        reason = f"PostgreSQL did not answer within {self.release_timeout:g} s (release_timeout)"
        try:
            with trio.move_on_after(self.release_timeout):
                await self._run(f"release session {session_id!r}", lambda conn: conn.execute(query, params))
                if self._unreleased.get(session_id, epoch) == epoch:
                    self._unreleased.pop(session_id, None)
                return
        except SessionStoreError as exc:
            reason = str(exc)
        self._unreleased[session_id] = epoch
        log.warning(
            "session %r: releasing its lease failed (%s); trying again every %g s (other workers find the "
            "session live until then, or until this worker stops)",
            session_id,
            reason,
            self.heartbeat or 1.0,
        )

    async def _retry_releases(self) -> None:
        for session_id, epoch in list(self._unreleased.items()):
            if session_id in self._writers or session_id in self._taking:
                self._unreleased.pop(session_id, None)  # taken again by this worker meanwhile
                continue
            self._taking.add(session_id)
            done = self._releasing[session_id] = trio.Event()
            try:
                await self._release_lease(session_id, epoch)
            finally:
                self._taking.discard(session_id)
                del self._releasing[session_id]
                done.set()

    async def _claim_in_process(self, session_id: str, error: Callable[[str], SessionError]) -> None:
        # A release the heartbeat retries ends within release_timeout: the session is not live here, only going.
        while (releasing := self._releasing.get(session_id)) is not None:
            await releasing.wait()
        if session_id in self._writers or session_id in self._taking:
            raise error(f"session {session_id!r} is already live, or being created or resumed, in this process")
        self._taking.add(session_id)

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        session_id = validate_session_id(header.id)
        self._require_pool()
        try:
            line = encode_header(header)
        except (TypeError, ValueError) as exc:
            raise SessionError(f"the header of session {session_id!r} cannot be stored: {exc}") from exc
        await self._claim_in_process(session_id, SessionExistsError)
        try:
            epoch = await self._take_lease(session_id)
            if epoch is None:
                raise SessionExistsError(
                    f"session {session_id!r} already exists: it is being created, or is live, on another worker "
                    f"(its lease or lock in {self.location} is held); use another id, or resume it once it is stored"
                )
            try:
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
        finally:
            self._taking.discard(session_id)
        return writer

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        validate_session_id(session_id)
        await self._claim_in_process(session_id, functools.partial(SessionLockedError, path=self.location))
        try:
            deadline = trio.current_time() + self.lock_timeout
            delay = 0.005
            while (epoch := await self._take_lease(session_id)) is None:
                remaining = deadline - trio.current_time()
                if remaining <= 0:
                    raise SessionLockedError(
                        f"session {session_id!r} is live on another worker (its lease or lock in {self.location} "
                        "is held); stop it there, or wait until that worker is gone (a dead worker releases it at "
                        f"once, a frozen one within {self.idle_session_timeout} s)",
                        path=self.location,
                    )
                await trio.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.05)
            try:
                loaded = await self.load(session_id)
            except BaseException:
                with trio.CancelScope(shield=True):
                    await self._release_lease(session_id, epoch)
                raise
            writer = _PooledWriter(self, loaded.header, header_line=None, stored=len(loaded.events), epoch=epoch)
            self._writers[session_id] = writer  # type: ignore[assignment]
        finally:
            self._taking.discard(session_id)
        return loaded, writer


class _Diverged(Exception):
    """Events stored from the batch's first seq on are not the batch (the transaction rolls back)."""


def _store_own(
    conn: psycopg.Connection[Any], writer: _PooledWriter, lines: list[str], blobs: dict[str, bytes], acks: list[int]
) -> str:
    """(worker thread) One writer's flush in a transaction of its own, fenced by its lease; idempotent.

    The first flush of a new session (its row), a flush carrying image blobs
    (inserted before the events that reference them), and the flush after
    one whose outcome is unknown.  Its lease row is locked ``FOR UPDATE``,
    which waits for a lost statement of the session still running (a group
    commit holds it ``FOR SHARE``, as a lost run of this does); then what is
    stored from the first seq on is read: its own earlier commit (the same
    header, bodies that begin the batch) is kept and only the rest inserted,
    one row per event (session/_pg_rows.py: a group's lost statement that
    arrives later still meets them at its batch's last seq).  Nobody else
    writes the session while the lease is held.  Returns ``stored``,
    ``fenced`` (the lease was taken: nothing written), ``exists`` (another
    session is stored under the id) or ``diverged``.
    """
    store, header = writer.store, writer.header
    sql, sid, first = store._sql, header.id, writer._stored
    s = sql.s
    try:
        with conn.transaction():
            # A worker frozen inside this transaction must not hold the lease row (a takeover waits for it) for long;
            # nor may its wait for the row (a lost statement's) outlive the flush's bound, should the cancel be lost.
            bound = f"{math.ceil(store.write_timeout * 1000)}ms"
            conn.execute(
                "SELECT set_config('idle_in_transaction_session_timeout', %s, true), "
                "set_config('lock_timeout', %s, true)",
                (bound, bound),
            )
            held = conn.execute(
                f"SELECT 1 FROM {s}.leases WHERE session_id = %s AND worker_id = %s AND epoch = %s FOR UPDATE",
                (sid, store.worker_id, writer._epoch),
            ).fetchone()
            if held is None:
                return "fenced"
            line = writer._header_line
            if line is not None:
                params = (sid, line, header.created_at, header.parent_session)
                if conn.execute(sql.insert_session, params).fetchone() is None:
                    row = conn.execute(f"SELECT header FROM {s}.sessions WHERE id = %s", (sid,)).fetchone()
                    if row is None or row[0] != line:
                        return "exists"
            insert_blobs(conn, s, sid, blobs)  # before the events that reference them
            if lines:
                stored = [line for _, line in each_event(conn.execute(select_from(s), (sid, first)), first)]
                if stored != lines[: len(stored)]:
                    raise _Diverged
                if len(stored) < len(lines):
                    conn.execute(sql.insert_events, (sid, first + len(stored), lines[len(stored) :]), binary=True)
            if acks:
                conn.execute(f"DELETE FROM {s}.mailbox WHERE session_id = %s AND id = ANY(%s)", (sid, acks))
    except _Diverged:
        return "diverged"
    return "stored"


@attrs.define(eq=False)
class _PooledWriter:
    store: PooledPostgresStore
    header: SessionHeader
    # The encoded header of a new session, stored by its first flush; None once stored.
    _header_line: str | None = attrs.field(alias="header_line")
    # How many events are stored (the seq of the next one to store).
    _stored: int = attrs.field(alias="stored")
    _epoch: int = attrs.field(alias="epoch")
    _buffer: list[str] = attrs.field(factory=list, init=False)
    # The image blobs the buffered lines reference (session/_blobs.py).
    _blobs: dict[str, bytes] = attrs.field(factory=dict, init=False)
    _lock: FlushLock = attrs.field(factory=FlushLock, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Why this writer may not append any more, once it may not; _fenced: its lease was taken (it is not ours).
    _broken: str | None = attrs.field(default=None, init=False)
    _fenced: bool = attrs.field(default=False, init=False)
    # A flush failed (maybe committed): the next one runs in its own, idempotent, transaction.
    _uncertain: bool = attrs.field(default=False, init=False)
    _mail_scope: trio.CancelScope | None = attrs.field(default=None, init=False)
    _on_mail: Callable[[], Awaitable[None]] | None = attrs.field(default=None, init=False)
    _mail_wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _taken: set[int] = attrs.field(factory=set, init=False)
    _acks: list[int] = attrs.field(factory=list, init=False)
    # Mailbox rows that are no message (their id and why), acked: the registry logs them in the session.
    unreadable: list[tuple[int, str]] = attrs.field(factory=list, init=False)

    def write(self, event: Event) -> None:
        if type(event) in IMAGE_EVENTS:
            event = externalize(event, self._blobs)
        self._buffer.append(encode_event(event))

    def _error(self, reason: str) -> SessionStoreError:
        return SessionStoreError(
            f"cannot store the events of session {self.header.id!r} in {self.store.location}: {reason}",
            path=self.store.location,
            session_id=self.header.id,
        )

    def _lose(self, reason: str, *, fenced: bool = False) -> SessionStoreError:
        self._broken, self._fenced = f"{reason}; resume the session to continue from what is stored", fenced
        return self._error(self._broken)

    async def flush(self, *, sync: bool = True) -> None:
        await trio.lowlevel.checkpoint_if_cancelled()
        lock = self._lock
        try:
            # No schedule point when uncontended: a thousand sessions flushing at once each yield once (to wait
            # for their group commit) instead of twice.
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if not self._buffer and not self._acks:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return
            if self._closed or self._broken is not None:
                raise self._error("its writer is closed" if self._closed else self._broken or "")
            lines, acks, blobs = self._buffer, list(self._acks), self._blobs
            self._buffer, self._blobs = [], {}
            if self._header_line is not None or blobs or self._uncertain:
                outcome = await self._flush_alone(lines, acks, blobs)
            else:  # the usual flush: part of the next group commit (session/_pg_group.py)
                try:
                    request = _Request(self, lines, acks, sync)
                    await self.store._group.submit(request)
                    outcome = self._group_outcome(request)
                except BaseException as exc:
                    error = self._unstored(exc, lines, blobs)
                    if error is None:
                        raise
                    raise error from exc
                if outcome != "fenced":
                    self._committed(lines, acks)
            if outcome != "stored":
                raise self._not_stored(outcome, lines, blobs)
        finally:
            lock.release()

    def _not_stored(self, outcome: str, lines: list[str], blobs: dict[str, bytes]) -> SessionStoreError:
        """The error of a flush whose ``outcome`` was not ``stored``; this writer may not append any more."""
        if outcome == "mail gone":  # stored: never silent, and this writer no longer trusts its mailbox
            return self._lose(
                "its events are stored, but the mailbox rows of messages it delivered were already deleted "
                "(another holder of the session delivered them)"
            )
        self._buffer[:0] = lines
        self._blobs = {**blobs, **self._blobs}
        if outcome == "fenced":
            return self._lose("this writer lost the session (its lease was taken by another worker)", fenced=True)
        if outcome == "exists":
            return self._lose(f"another session {self.header.id!r} is already stored in {self.store.location}")
        return self._lose(
            f"the events stored from seq {self._stored} on are not this writer's (another writer stored them)"
        )

    async def _flush_alone(self, lines: list[str], acks: list[int], blobs: dict[str, bytes]) -> str:
        """The flush in a transaction of its own (:func:`_store_own`): a new session's first, one with image
        blobs, or the first after one whose outcome is unknown."""
        committed = False

        def settle(outcome: object) -> None:
            nonlocal committed
            if outcome == "stored" and not committed:
                committed = True
                self._committed(lines, acks)

        try:
            outcome = await self.store._run_settled(
                f"store the events of session {self.header.id!r}",
                lambda conn: _store_own(conn, self, lines, blobs, acks),
                settle,
            )
            settle("stored" if outcome == "mail gone" else outcome)
        except BaseException as exc:
            error = self._unstored(exc, lines, blobs, put_back=not committed)
            if error is None:
                raise
            raise error from exc
        return outcome

    def _unstored(
        self, exc: BaseException, lines: list[str], blobs: dict[str, bytes], *, put_back: bool = True
    ) -> SessionStoreError | None:
        """A flush failed (``exc``; its batch maybe committed): the error to raise instead, if not ``exc``.

        Unless it was committed after all (``put_back`` False), its lines and
        blobs go back into the buffer and the next flush reads back what is
        stored before it sends them again (``_uncertain``).
        """
        if put_back:
            self._buffer[:0] = lines
            self._blobs = {**blobs, **self._blobs}
            self._uncertain = True
        if isinstance(exc, Exception) and not isinstance(exc, SessionError):
            # e.g. an event the database's encoding cannot hold: the caller gets a store error
            return self._error(f"{type(exc).__name__}: {exc}")
        return None

    def _group_outcome(self, request: _Request) -> str:
        """What the group commit did with ``request`` (settled).

        ``stored``, ``fenced``, or ``mail gone`` (stored, but some of the
        acknowledged messages' mailbox rows were already deleted: another
        holder of the session delivered them); a failure is raised.  One
        whose outcome is unknown (the group may commit, or have committed)
        leaves the writer ``_uncertain`` (:meth:`_unstored`): its next flush
        reads back what is stored (:func:`_store_own`) before it sends those
        seqs again.
        """
        outcome = request.outcome
        if outcome is True:
            return "mail gone" if request.gone else "stored"
        if outcome is False:
            return "fenced"
        assert outcome is not None, "a group commit request returned unsettled"
        if isinstance(outcome, SessionStoreError):
            raise self._error(str(outcome)) from outcome
        if isinstance(outcome, _psycopg().Error):
            raise self.store._error(outcome, f"store the events of session {self.header.id!r}") from outcome
        raise self._error(f"{type(outcome).__name__}: {outcome}") from outcome

    def _committed(self, lines: list[str], acks: list[int]) -> None:
        self._stored += len(lines)
        self._header_line = None
        self._uncertain = False
        for mail_id in acks:
            self._acks.remove(mail_id)
            self._taken.discard(mail_id)

    # ------------------------------------------------------------ mail

    def receive(self, on_mail: Callable[[], Awaitable[None]]) -> None:
        self._on_mail = on_mail
        self.store._start_mail(self)  # type: ignore[arg-type]
        self._mail_wake.set()

    def wake_mail(self) -> None:
        if self._on_mail is not None:
            self._mail_wake.set()

    async def _mail_loop(self) -> None:
        """Deliver on every wake (session/_pg_mail.py: a store failure is tried again, anything else raised)."""
        await mail_loop(self.header.id, self._next_mail, lambda: self._mail_wake.set())

    async def _next_mail(self) -> Callable[[], Awaitable[None]] | None:
        await self._mail_wake.wait()
        self._mail_wake = trio.Event()
        return None if self._closed else self._on_mail

    async def take_mail(self) -> list[tuple[int, InboxMessage]]:
        """The messages posted to this session and not yet taken, oldest first (see the per-session writer's).

        Read under the writer's lock, as the per-session writer reads: a read
        overlapping a flush that deletes rows this writer took could return a
        row whose delete committed meanwhile (its snapshot is older), and the
        commit forgets the rows it deleted, so the row would be taken twice.
        The lock is taken only once a pooled connection is had
        (``store._run_locked``): the session's flushes do not wait for the pool
        behind the read.
        """
        store, sid, timeout = self.store, self.header.id, self.store.write_timeout

        async def read(conn: psycopg.Connection[Any]) -> list[tuple[int, InboxMessage]]:
            if self._closed or self._broken is not None:
                return []
            rows = await _call(conn, functools.partial(_mailbox_rows, conn, store._sql.s, sid))
            return claim_mail(sid, rows, self._taken, self._acks, self.unreadable)

        with trio.move_on_after(timeout):  # bounded, as a live session's statements are (the mail loop tries again)
            # A flush under way ends first (bounded too).
            return await store._run_locked(f"read the mailbox of session {sid!r}", self._lock, read, retry=True)
        raise SessionStoreError(
            f"cannot read the mailbox of session {sid!r} in {store.location}: PostgreSQL did not answer "
            f"within {timeout:g} s (write_timeout), or no pooled connection was free, or the flush of the session "
            "the read waited for did not end; the read was cancelled",
            path=store.location,
            session_id=sid,
        )

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
        self._buffer, self._blobs = [], {}
        self._on_mail = None
        if self._mail_scope is not None:
            self._mail_scope.cancel()
        with trio.CancelScope(shield=True):
            acquired = False
            with trio.move_on_after(self.store.release_timeout):
                await self._lock.acquire()  # a flush under way ends first (bounded: write_timeout)
                acquired = True
            try:
                # A lease taken by another worker is not ours to release; any other (a broken writer's too) is.
                # A flush still running when the wait ended is fenced by the release, or the release waits for it.
                if not self._fenced:
                    await self.store._release_lease(self.header.id, self._epoch)
            finally:
                if acquired:
                    self._lock.release()
                writers: dict[str, object] = self.store._writers  # type: ignore[assignment]
                if writers.get(self.header.id) is self:
                    del writers[self.header.id]


def _mailbox_rows(conn: psycopg.Connection[Any], schema: str, session_id: str) -> list[tuple[int, str]]:
    """The mailbox rows of the session, oldest first (a thread job of :meth:`_PooledWriter.take_mail`)."""
    return conn.execute(
        f"SELECT id, body FROM {schema}.mailbox WHERE session_id = %s ORDER BY id", (session_id,)
    ).fetchall()
