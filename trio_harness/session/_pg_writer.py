"""The writer of a live session in PostgreSQL: its lock, flushes, retakes and mail.

One live writer per session: a writer holds a session-level advisory lock on a
connection of its own, taken by ``PostgresStore.resume`` before the log
is read and by ``PostgresStore.open_writer`` for a new session (its
claim: same-id creates are arbitrated there, before the creator runs
anything; a first flush whose claim was lost with its connection takes the
lock again), and sends every append of that session over the same connection.  Losing the connection loses the lock
and the ability to write together; the primary key ``(session_id, seq)``
refuses any batch of a writer that lost its lock to another one.  A flush
whose connection died (maybe during COMMIT) takes the session again on a new
connection and compares what is stored before it retries; events committed
without sync that the server lost meanwhile are stored again.  A flush whose
outcome stayed unknown leaves it to the next retake (a flush's or a
heartbeat's): stored events that begin the pending batch are its own, and so
are the mailbox deletes it finds made (:meth:`_PgWriter._reattach`); a first
flush in doubt finds its own header and events the same way
(:meth:`_PgWriter._create`).

The writer sends its appends through :mod:`._pg_wire` (one prepared
statement, its own transaction, from the Trio thread), and its other
statements (the first flush, retakes, an append that deletes delivered mail,
heartbeats, mailbox reads) through :mod:`._pg_threads`.  It knows its store
only as :class:`_WriterStore` (the store, :mod:`._postgres`, builds on this
module, never the other way).
"""

from __future__ import annotations

import functools
import logging
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import attrs
import trio

from .._errors import EventDecodeError, SessionError, SessionExistsError, SessionStoreError
from ._blobs import IMAGE_EVENTS, externalize, insert_blobs
from ._codec import decode_inbox_message, encode_event
from ._events import Event, InboxMessage, SessionHeader
from ._pg_leases import _check_tainted, _lock_holder, _Tainted, _try_lock, lease_held
from ._pg_mail import mail_loop
from ._pg_rows import each_event, lines_between, select_from
from ._pg_schema import _lock_key, _psycopg, _scalar, _Sql
from ._pg_threads import _call, _execute
from ._pg_wire import BINARY_FORMAT, INT8_OID, TEXT_ARRAY_OID, TEXT_FORMAT, TEXT_OID, text_array
from ._pg_wire import _statement as _wire_statement

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("trio_harness.session.postgres")

T = TypeVar("T")


class _MailTaken(Exception):
    def __init__(self, missing: int) -> None:
        super().__init__(f"{missing} mailbox rows are gone")
        self.missing = missing


class _WriterStore(Protocol):
    """What a writer uses of its store (``PostgresStore``)."""

    schema: str
    heartbeat: float | None
    release_timeout: float
    write_timeout: float
    _sql: _Sql
    # The writers holding their session, by session id: a writer adds itself once it holds a new session.
    _writers: dict[str, _PgWriter]

    @property
    def location(self) -> str: ...

    async def _connect(self) -> psycopg.Connection[Any]: ...

    async def _take_writer_connection(self) -> psycopg.Connection[Any]: ...

    def _pool_give_back(self, conn: psycopg.Connection[Any]) -> None: ...

    async def _give_back_locked(self, conn: psycopg.Connection[Any], key: int | None) -> None: ...

    def _configure_writer(self, conn: psycopg.Connection[Any]) -> None: ...

    def _error(self, exc: BaseException, what: str, *, session_id: str | None = None) -> SessionStoreError: ...

    def _start_heartbeat(self, writer: _PgWriter) -> None: ...

    def _start_mail(self, writer: _PgWriter) -> None: ...


async def claim_new(store: _WriterStore, session_id: str) -> psycopg.Connection[Any]:
    """Take the advisory lock of a session to create on a writer connection; the id must not be stored.

    The claim of ``PostgresStore.open_writer``: returns the connection
    holding the lock (configured as a writer's).

    Raises:
        SessionExistsError: the lock is held elsewhere (the id is being
            created, or is live, on another worker), or the id is stored.
        SessionStoreError: PostgreSQL cannot be reached or used.
    """
    conn = await store._take_writer_connection()
    key, sql, pg = _lock_key(store.schema, session_id), store._sql, _psycopg()
    locked = False
    tainted, deadline = 0, trio.current_time() + _RETAKE_WAIT
    try:
        while True:
            try:
                locked = await _call(conn, functools.partial(_try_lock, conn, key, sql, session_id))
            except _Tainted:
                conn.close()
                tainted += 1
                _check_tainted(store.location, session_id, tainted, deadline)
                conn = await store._connect()
                continue
            except BaseException as exc:
                # Whether this connection holds the lock is unknown: closed, never pooled.
                conn.close()
                if isinstance(exc, pg.Error):
                    raise store._error(exc, f"claim session {session_id!r}", session_id=session_id) from exc
                raise
            break
        if not locked:
            raise SessionExistsError(
                f"session {session_id!r} already exists: it is being created, or is live, on another worker "
                f"(its lock in {store.location} is held); use another id, or resume it once it is stored"
            )
        if session_id in store._writers:  # claimed in this process while we waited
            raise SessionExistsError(
                f"session {session_id!r} already exists: it is being created or is live in this process"
            )

        def stored() -> bool:
            store._configure_writer(conn)
            return conn.execute(f"SELECT 1 FROM {sql.s}.sessions WHERE id = %s", (session_id,)).fetchone() is not None

        try:
            found = await _call(conn, stored)
        except pg.Error as exc:
            raise store._error(exc, f"look up session {session_id!r}", session_id=session_id) from exc
        if found:
            raise SessionExistsError(f"session {session_id!r} is already stored in {store.location}; resume it instead")
    except BaseException:
        with trio.CancelScope(shield=True):
            await store._give_back_locked(conn, key if locked else None)
        raise
    return conn


# The parameters of an append (session id, first seq, bodies): their types and formats.
_APPEND_TYPES = (TEXT_OID, INT8_OID, TEXT_ARRAY_OID)
_APPEND_FORMATS = (TEXT_FORMAT, TEXT_FORMAT, BINARY_FORMAT)

# Seconds a writer retaking its session waits for the server to drop its
# previous connection (which may still hold the lock) before the flush fails.
_RETAKE_WAIT = 1.0


@attrs.define(eq=False)
class _PgWriter:
    store: _WriterStore
    header: SessionHeader
    # The encoded header of a new session, stored by its first flush; None once stored.
    _header_line: str | None = attrs.field(alias="header_line")
    # How many events are stored (the seq of the next one to store).
    _stored: int = attrs.field(alias="stored")
    # The connection holding the session's advisory lock; None before the
    # first flush of a new session, and after the connection was lost.
    _conn: psycopg.Connection[Any] | None = attrs.field(default=None, alias="conn")
    _buffer: list[str] = attrs.field(factory=list, init=False)
    # The image blobs the buffered lines reference, and those of the flush under way (session/_blobs.py).
    _blobs: dict[str, bytes] = attrs.field(factory=dict, init=False)
    _flushing_blobs: dict[str, bytes] = attrs.field(factory=dict, init=False)
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
    # A first flush (the session's create) whose outcome is unknown: it may have committed.
    _create_doubt: bool = attrs.field(default=False, init=False)
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
    # Mailbox rows that are no message (their id and why), acked: the registry logs them in the session.
    unreadable: list[tuple[int, str]] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        self._synced = self._stored
        if self._conn is not None:
            self._pid = self._conn.info.backend_pid

    @property
    def _key(self) -> int:
        return _lock_key(self.store.schema, self.header.id)

    def write(self, event: Event) -> None:
        if type(event) in IMAGE_EVENTS:
            event = externalize(event, self._blobs)
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
            self._buffer, self._flushing_blobs, self._blobs = [], self._blobs, {}
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
                    if committed:
                        return
                    # An earlier first flush of unknown outcome had stored the session and part of lines.
                elif self._conn is None:
                    await self._reattach(lines, acks)
                    if not self._to_send(lines, acks, sync):
                        settle(None)
                        return
                await self._append(lines, acks, sync, settle, reconnect=True)
            except BaseException as exc:
                if not committed:
                    self._buffer[:0] = lines
                    self._blobs = {**self._flushing_blobs, **self._blobs}
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
                self._flushing_blobs = {}  # stored, or back in self._blobs

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
        return await self._bounded(conn, lambda on_settle: _call(conn, fn, settle=on_settle), settle=settle)

    async def _bounded(
        self,
        conn: psycopg.Connection[Any],
        run: Callable[[Callable[[T], None]], Awaitable[T]],
        *,
        settle: Callable[[T], None] | None = None,
    ) -> T:
        """``run(on_settle)`` (a cancellation-safe call on ``conn``) bounded by ``write_timeout``, as :meth:`_timed`."""
        finished: list[T] = []

        def on_settle(value: T) -> None:
            finished.append(value)
            if settle is not None:
                settle(value)

        timeout = self.store.write_timeout
        with trio.move_on_after(timeout):
            return await run(on_settle)
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
        then count as committed by the lost connection.  A first flush whose
        outcome stayed unknown (it timed out, was cancelled, or lost three
        connections) leaves that doubt to the next flush, which counts a
        stored header equal to ours, and stored events that begin its batch,
        as committed by it: the session counts as created, those events leave
        ``lines`` (the caller appends the rest) and ``settle`` is not called.
        """
        assert self._header_line is not None
        header_line, header = self._header_line, self.header
        store, sql = self.store, self.store._sql
        key, first = self._key, self._stored
        pg = _psycopg()
        maybe_committed = self._create_doubt
        previous, deadline = self._pid, trio.current_time() + _RETAKE_WAIT
        attempts = 0  # connections lost
        tainted = 0  # connections in a row found holding advisory locks already
        fresh = False
        while True:
            if self._conn is None:
                self._conn = await (store._connect() if fresh else store._take_writer_connection())
                fresh = True
            conn = self._conn

            def work(conn: psycopg.Connection[Any] = conn, ours: bool = maybe_committed) -> tuple[str, int]:
                if not self._held:
                    if not _try_lock(conn, key, sql, header.id):
                        holder = _lock_holder(conn, key)
                        if holder is None:
                            if lease_held(conn, sql, header.id):
                                return "locked", -1  # a pooled worker holds its lease (session/_pg_leases.py)
                            return "free", 0  # the lock went free since the try: try again
                        return "locked", holder  # (found: the lock's holder)
                    self._held, self._pid = True, conn.info.backend_pid
                    store._configure_writer(conn)
                with conn.transaction():
                    row = conn.execute(
                        sql.insert_session,
                        (header.id, header_line, header.created_at, header.parent_session),
                    ).fetchone()
                    if row is None:
                        found = self._stored_as(conn, header_line, first, lines) if ours else None
                        return ("exists", 0) if found is None else ("created", found)
                    insert_blobs(conn, sql.s, header.id, self._flushing_blobs)  # before the events, one transaction
                    conn.execute(sql.insert_events, (header.id, first, lines), binary=True)
                return "created", len(lines)

            # Until this attempt's outcome is known, it may have committed.
            self._create_doubt = True
            try:
                outcome, found = await self._timed(
                    conn, work, settle=lambda result: self._created(result, lines, settle)
                )
            except _Tainted:
                self._create_doubt = maybe_committed
                self._drop_connection()
                tainted += 1
                _check_tainted(store.location, header.id, tainted, deadline)
                continue
            except pg.Error as exc:
                if not (conn.broken or conn.closed):
                    self._create_doubt = maybe_committed  # refused: rolled back
                    raise
                self._drop_connection()
                attempts += 1
                if attempts >= 3:
                    raise
                # Maybe during COMMIT: find out on a new connection.
                maybe_committed = True
                log.warning("session %r: the connection was lost while storing it (%s); reconnecting", header.id, exc)
                continue
            except BaseException:
                if conn.broken or conn.closed:
                    self._drop_connection()  # maybe committed: the next flush finds out
                elif self._header_line is not None:
                    self._create_doubt = maybe_committed  # cancelled and rolled back
                raise
            tainted = 0
            if outcome == "free" or (outcome == "locked" and maybe_committed and found == previous):
                # The lock went free between the try and the look-up of its holder, or the lost connection
                # may hold it still, until the server notices it is gone: try again.
                self._create_doubt = maybe_committed
                await self._release_connection()
                if trio.current_time() >= deadline and not maybe_committed:
                    outcome = "locked"  # freed and taken again by others all along: refused
                    break
                if trio.current_time() >= deadline:
                    raise SessionStoreError(
                        f"session {header.id!r} cannot be stored in {store.location} yet: its lock is still held "
                        f"by this writer's previous connection (server process {previous}), which the server has "
                        "not closed; the next flush tries again",
                        path=store.location,
                        session_id=header.id,
                    )
                await trio.sleep(0.02)
                continue
            break
        if outcome == "created":
            self._created((outcome, found), lines, settle)
            return
        self._create_doubt = maybe_committed and outcome == "locked"  # "exists": not ours, certainly
        # Refused: give the connection (and the lock, if taken) back; nothing was stored.
        await self._release_connection()
        raise SessionExistsError(
            f"session {header.id!r} is already stored in {store.location}"
            + (" (another worker is creating or holding it)" if outcome == "locked" else "")
        )

    def _stored_as(self, conn: psycopg.Connection[Any], header_line: str, first: int, lines: list[str]) -> int | None:
        """(worker thread) How many of ``lines`` are stored, if the stored session is ours: this header, and
        events that begin ``lines``; None otherwise."""
        sql, sid = self.store._sql, self.header.id
        row = conn.execute(f"SELECT header FROM {sql.s}.sessions WHERE id = %s", (sid,)).fetchone()
        if row is None or row[0] != header_line:
            return None
        bodies = [line for _, line in each_event(conn.execute(select_from(sql.s), (sid, 0)))]
        return len(bodies) if first == 0 and bodies == lines[: len(bodies)] else None

    def _created(self, result: tuple[str, int], lines: list[str], settle: Callable[[object], None]) -> None:
        outcome, found = result
        if outcome != "created" or self._header_line is None:
            return
        self._header_line = None
        self._create_doubt = False
        if found == len(lines):
            settle(None)
        else:
            # Stored by a first flush whose outcome was unknown, with a synchronous commit; the rest is appended.
            self._stored = self._synced = self._stored + found
            del lines[:found]
        self.store._writers[self.header.id] = self
        self.store._start_heartbeat(self)

    async def _append(
        self, lines: list[str], acks: list[int], sync: bool, settle: Callable[[object], None], *, reconnect: bool
    ) -> None:
        conn = self._conn
        assert conn is not None
        sql, sid, first = self.store._sql, self.header.id, self._stored

        def work() -> None:  # (worker thread) with mailbox deletes or image blobs: one transaction, several statements
            with conn.transaction():
                if not sync and not self._flushing_blobs:  # a blob's commit is durable: no retake loses it
                    conn.execute("SET LOCAL synchronous_commit TO off")
                if acks:
                    deleted = conn.execute(
                        f"DELETE FROM {sql.s}.mailbox WHERE session_id = %s AND id = ANY(%s)", (sid, acks)
                    ).rowcount
                    if deleted != len(acks):
                        raise _MailTaken(len(acks) - deleted)
                if lines:
                    insert_blobs(conn, sql.s, sid, self._flushing_blobs)  # before the events that reference them
                    conn.execute(sql.insert_events, (sid, first, lines), binary=True)

        run: Callable[[Callable[[None], None]], Awaitable[None]]
        types: Sequence[int]
        formats: Sequence[int]
        if acks or (lines and self._flushing_blobs):  # blobs go with their events
            run = lambda on_settle: _call(conn, work, settle=on_settle)  # noqa: E731
        else:
            # A checkpoint: one statement, its own transaction, sent from this thread (see _pg_wire).
            if lines:
                encoding = conn.info.encoding
                query = sql.append_events(sync=sync)
                params = [sid.encode(encoding), b"%d" % first, text_array(lines, encoding)]
                types, formats = _APPEND_TYPES, _APPEND_FORMATS
            else:  # only make earlier unsynced commits durable
                query, params, types, formats = sql.sync_point, [], (), ()
            run = lambda on_settle: _wire_statement(conn, query, params, types, formats, settle=on_settle)  # noqa: E731
        pg = _psycopg()
        try:
            await self._bounded(conn, run, settle=settle)
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
            await self._reattach(lines, acks)
            if self._to_send(lines, acks, sync):
                await self._append(lines, acks, sync, settle, reconnect=False)
            else:
                settle(None)
            return
        settle(None)

    def _to_send(self, lines: list[str], acks: list[int], sync: bool) -> bool:
        """Whether a flush still has something to commit after a retake settled what was stored."""
        return bool(lines or acks or (sync and self._unsynced))

    async def _reattach(self, lines: list[str], acks: list[int]) -> None:
        """Take the session again after its connection was lost, and settle what the lost connection stored.

        ``lines`` are the events to store next (from seq ``_stored`` on) and
        ``acks`` the mailbox rows to delete with them; both are updated in
        place to what is still to commit:

        * events stored after ``_stored`` that are a prefix of ``lines`` were
          committed by a flush whose outcome was unknown (its connection was
          lost around COMMIT, it timed out or was cancelled): they count as
          stored (committed without a known sync, so kept as unsynced until
          the next synced commit) and leave ``lines``;
        * events committed without sync that the server lost meanwhile (it
          crashed or restarted) are put back in front of ``lines``, with a
          warning saying so;
        * of the mailbox rows this writer deletes (the pending acks, and those
          committed without sync), the ones gone from the mailbox were deleted
          by a commit of this writer (no other writer appended: the events
          say so) and leave ``acks``; the unsynced ones still there were lost
          with their commit and are deleted again.

        Raises:
            SessionStoreError: the session was taken over meanwhile (this
                writer is broken from now on), PostgreSQL cannot be reached,
                or the lock is still held by this writer's previous connection
                (the next flush tries again).
        """
        store, sql, sid, key, stored = self.store, self.store._sql, self.header.id, self._key, self._stored
        synced, unsynced = self._synced, list(self._unsynced_lines)
        pending = list(lines)
        ours = sorted({*self._acks, *self._unsynced_acks})
        previous = self._pid
        deadline = trio.current_time() + _RETAKE_WAIT
        tainted = 0  # connections in a row found holding advisory locks already
        while True:
            conn = await store._take_writer_connection() if tainted == 0 else await store._connect()

            def work(conn: psycopg.Connection[Any] = conn) -> tuple[str, int, set[int]]:
                if not _try_lock(conn, key, sql, sid):
                    holder = _lock_holder(conn, key)
                    if holder is None and lease_held(conn, sql, sid):
                        return "locked", 0, set()  # a pooled worker took it (session/_pg_leases.py)
                    # No holder: the lock went free since the try (the previous connection just ended): retry.
                    return ("previous" if holder is None or holder == previous else "locked"), 0, set()
                store._configure_writer(conn)
                count = _scalar(
                    conn, f"SELECT coalesce(max(seq) + 1, 0) FROM {sql.s}.events WHERE session_id = %s", (sid,)
                )
                if count == stored:
                    outcome = "missing"
                elif synced <= count < stored and self._bodies(conn, synced, count) == unsynced[: count - synced]:
                    outcome = "lost"
                elif (
                    stored < count <= stored + len(pending)
                    and self._bodies(conn, stored, count) == pending[: count - stored]
                ):
                    outcome = "stored"
                else:
                    conn.execute("SELECT pg_advisory_unlock_all()")
                    return "diverged", count, set()
                present = {
                    mail_id
                    for (mail_id,) in conn.execute(
                        f"SELECT id FROM {sql.s}.mailbox WHERE session_id = %s AND id = ANY(%s)", (sid, ours)
                    )
                }
                return outcome, count, present

            try:
                outcome, count, present = await self._timed(conn, work)
            except _Tainted:
                conn.close()
                tainted += 1
                _check_tainted(store.location, sid, tainted, deadline)
                continue
            except BaseException:
                # Cancelled or failed while taking the lock: whether it holds the
                # lock is unknown, so the connection is closed (never pooled).
                conn.close()
                raise
            tainted = 0
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
        # From here on no await: the writer's state and the flush's batch change together.
        if outcome == "stored":
            # A flush whose outcome was unknown committed these: stored, maybe without sync.
            done = count - stored
            log.info("session %r: %d events of a flush whose outcome was unknown are stored", sid, done)
            self._unsynced_lines += lines[:done]
            self._stored = count
            self._unsynced = True
            del lines[:done]
        elif outcome == "lost":
            lost = unsynced[count - synced :]
            log.warning(
                "session %r: PostgreSQL lost the last %d events committed without sync (the server crashed or "
                "restarted); storing them again",
                sid,
                len(lost),
            )
            self._stored = count
            self._unsynced_lines = unsynced[: count - synced]
            lines[:0] = lost
            if self.on_restored is not None:
                self.on_restored(len(lost))
        self._settle_acks(acks, present, ours)
        self.wake_mail()  # what was posted meanwhile

    def _settle_acks(self, acks: list[int], present: set[int], ours: list[int]) -> None:
        """After a retake: the mailbox rows of ``ours`` still ``present`` are deleted (again) with the next batch.

        A pending ack whose row is gone was committed by a flush whose outcome
        was unknown (deleted in the transaction of its events, or alone):
        kept as committed without sync.  An unsynced ack whose row is back
        was lost with its commit (the server crashed): acked again.
        """
        checked = set(ours)
        gone = [mail_id for mail_id in self._acks if mail_id in checked and mail_id not in present]
        again = [mail_id for mail_id in self._unsynced_acks if mail_id in present]
        if gone:
            self._acks[:] = [mail_id for mail_id in self._acks if mail_id not in gone]
            acks[:] = [mail_id for mail_id in acks if mail_id not in gone]
            self._unsynced_acks += gone
            self._unsynced = True
        if again:
            self._unsynced_acks = [mail_id for mail_id in self._unsynced_acks if mail_id not in again]
            acks[:0] = [mail_id for mail_id in again if mail_id not in acks]
            self._acks[:0] = [mail_id for mail_id in again if mail_id not in self._acks]

    def _bodies(self, conn: psycopg.Connection[Any], start: int, end: int) -> list[str]:
        """(worker thread) The stored bodies of seqs ``start`` to ``end - 1``."""
        return lines_between(conn.execute(select_from(self.store._sql.s), (self.header.id, start)), start, end)

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
                if self._closed or self._broken is not None:
                    return
                if self._header_line is not None and self._conn is None:
                    continue  # a claim lost with its connection: the first flush takes the session
                try:
                    conn = self._conn
                    if conn is None:
                        # The buffer may start with a batch whose flush had an unknown outcome: the retake
                        # settles it (and puts back what the server lost); the next flush stores the rest.
                        pending, self._buffer = self._buffer, []
                        try:
                            await self._reattach(pending, list(self._acks))
                        finally:
                            self._buffer[:0] = pending
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
        """Deliver on every wake (session/_pg_mail.py: a store failure is tried again, anything else raised)."""
        await mail_loop(self.header.id, self._next_mail, lambda: self._mail_wake.set())

    async def _next_mail(self) -> Callable[[], Awaitable[None]] | None:
        await self._mail_wake.wait()
        self._mail_wake = trio.Event()
        return None if self._closed else self._on_mail

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
        return claim_mail(sid, rows, self._taken, self._acks, self.unreadable)

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
                    log.warning(
                        "session %r: closed while a statement still runs; its lock goes with the connection",
                        self.header.id,
                    )
            finally:
                if acquired:
                    self._lock.release()
                if self.store._writers.get(self.header.id) is self:
                    del self.store._writers[self.header.id]


def claim_mail(
    sid: str,
    rows: Sequence[tuple[int, str]],
    taken: set[int],
    acks: list[int],
    unreadable: list[tuple[int, str]],
) -> list[tuple[int, InboxMessage]]:
    """The mailbox ``rows`` not ``taken`` yet, decoded and marked taken.

    A row that is no message (written by a newer trio-harness, or by hand)
    is acked (removed with the next flush) and added to ``unreadable`` with
    why: the registry logs it in the session (``control/refused``, kind
    ``unknown``) in that flush, so the row never goes without a trace.
    """
    mail: list[tuple[int, InboxMessage]] = []
    for mail_id, body in rows:
        if mail_id in taken:
            continue
        taken.add(mail_id)
        try:
            message = decode_inbox_message(body)
        except EventDecodeError as exc:
            log.error("session %r: mailbox row %d is not a message (%s); removing it", sid, mail_id, exc)
            acks.append(mail_id)
            unreadable.append((mail_id, str(exc)))
            continue
        mail.append((mail_id, message))
    return mail
