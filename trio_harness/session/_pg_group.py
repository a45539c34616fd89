"""The pooled store's group commit: flushes of different sessions ready at once share one transaction.

A :class:`GroupCommitter` belongs to one
:class:`~trio_harness.session.PooledPostgresStore`.  Writers queue a
:class:`_Request` (their batch at the seqs they have when they queue it, the
mailbox rows to delete, their lease's epoch); one task takes what is queued
and sends it as **one statement** (its own transaction), up to ``pool_size -
1`` of them at once: the leases still held by this worker at that epoch are
locked ``FOR SHARE``, the batches of those sessions inserted (each one row:
session/_pg_rows.py), their mailbox rows deleted, and the statement returns
the sessions whose lease held, with how many mailbox rows it deleted for
each.  Each of those had its whole batch stored, the others nothing
(fenced).

A queue that reaches ``_EAGER`` requests is sent at once by the submit that
made it so (:meth:`GroupCommitter._launch`: an idle pooled connection lent
without waiting, the statement handed to libpq with no schedule point), so a
thousand flushes of one scheduler batch do not all queue before the first
statement starts.  The statements are sent and read from the Trio thread
(session/_pg_wire.py's ``begin`` and ``finish``), not a worker thread: a
thread would wait for the interpreter lock as long as the Trio thread is
busy queueing (up to the interpreter's switch interval, 5 ms), so a
statement sent early would not start early.

Bounds and unknown outcomes: a request still unsent after ``2 *
write_timeout + 1`` seconds is abandoned (it fails, nothing stored; the
committer never sends it); a sent one is settled: a lost connection, maybe
during COMMIT, is resolved by reading back what is stored once the lost
transaction has ended on the server (:meth:`GroupCommitter._resolve`: the
group's lease rows taken ``FOR UPDATE``, which waits for the lost
statement's ``FOR SHARE``; no server process id is used, so this holds
behind a transaction-pooling proxy too); when even that fails the outcome is
unknown and the writer reads back its own batch (``_store_own``) before it
sends those seqs again.  A submitter parks until its request is settled (its cancellation
waits for that, as a shielded wait would); the bounds are kept by one watch
task (:meth:`GroupCommitter._watch`), not by a cancel scope per flush, which
cost a third of a flush's Python time.
"""

from __future__ import annotations

import collections
import itertools
import logging
import math
import struct
from collections.abc import Awaitable, Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import SessionStoreError
from ._pg_rows import lines_between
from ._pg_schema import _psycopg
from ._pg_threads import _Pool
from ._pg_wire import (
    BINARY_FORMAT,
    ELEMENT_LENGTH,
    INT8_OID,
    TEXT_ARRAY_OID,
    TEXT_FORMAT,
    TEXT_OID,
    _Exchange,
    begin,
    finish,
    prefixed_text_array,
    text_array,
)

if TYPE_CHECKING:
    import psycopg

    from ._pg_pooled import PooledPostgresStore

log = logging.getLogger("trio_harness.session.postgres")

# Most sessions one group commit carries; fewest a long queue is split into (each group a statement).
_GROUP_MAX = 2000
_GROUP_MIN = 64
# A queue this long is sent at once by the flush that made it so, when a pooled connection is idle: a thousand
# flushes queued in one scheduler batch do not all queue before the first statement starts (it runs meanwhile).
_EAGER = 256
# Fewest requests the watch's list holds before it drops the settled ones behind an unsettled one.
_COMPACT_MIN = 1024

_INT8_ARRAY_OID = 1016
_GROUP_TYPES = (
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
    TEXT_OID,
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
    _INT8_ARRAY_OID,
    TEXT_ARRAY_OID,
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
)
_GROUP_FORMATS = (BINARY_FORMAT, BINARY_FORMAT, TEXT_FORMAT, *(BINARY_FORMAT,) * 6)
_EMPTY_ARRAY = struct.Struct("!iiI")  # no dimensions, no nulls, element type


def _texts(items: Sequence[str], encoding: str) -> bytes:
    """A ``text[]`` in the binary format (an empty one has no dimensions)."""
    return text_array(items, encoding) if items else _EMPTY_ARRAY.pack(0, 0, TEXT_OID)


def _encoded(elements: list[bytes], count: int) -> bytes:
    """A ``text[]`` of ``count`` elements, each already length-prefixed in ``elements`` (joined as they are)."""
    if not count:
        return _EMPTY_ARRAY.pack(0, 0, TEXT_OID)
    return prefixed_text_array(elements, count)


def _int8s(values: Sequence[int]) -> bytes:
    """An ``int8[]`` in the binary format."""
    if not values:
        return _EMPTY_ARRAY.pack(0, 0, INT8_OID)
    head = struct.pack("!iiIii", 1, 0, INT8_OID, len(values), 1)
    return head + struct.pack("!" + "iq" * len(values), *itertools.chain.from_iterable((8, v) for v in values))


def _stay_parked(_: object) -> trio.lowlevel.Abort:
    """A parked submitter is not woken by its cancellation: its request is settled first (bounded, see below)."""
    return trio.lowlevel.Abort.FAILED


class _NotSent(SessionStoreError):
    """A group statement that was never sent: its parameters could not be built (nothing stored)."""


@attrs.define(eq=False)
class _Request:
    """One writer's flush waiting for a group commit.

    Its seqs are fixed when it is made (``first``): a request is sent at
    those or not at all, so one that commits late can only meet the same
    batch (stored once: the primary key) never land at later seqs.
    """

    writer: Any
    lines: list[str]
    acks: list[int]
    sync: bool
    sid: str = attrs.field(init=False)
    first: int = attrs.field(init=False)
    epoch: int = attrs.field(init=False)
    # The parked task of its submitter, rescheduled once it is settled; when its bound runs out (see ``submit``).
    task: trio.lowlevel.Task | None = None
    deadline: float = math.inf
    settled: bool = False
    # True: stored; False: fenced (the lease was taken); an exception: failed (``unknown``: maybe stored).
    outcome: bool | BaseException | None = None
    unknown: bool = False
    # Its statement was handed to a connection: it may commit, so it is settled (waited for, or read back).
    sent: bool = False
    # A statement of it was lost on its way (its connection dropped, nothing found stored, sent again): that
    # statement may still reach the server and commit it, so a later failure leaves its outcome unknown.
    lost: bool = False
    # Its submitter gave up on it: the committer never sends it.
    abandoned: bool = False
    # Of its acks, how many mailbox rows were already gone (stored: another holder delivered them).
    gone: int = 0

    def __attrs_post_init__(self) -> None:
        self.sid, self.first, self.epoch = self.writer.header.id, self.writer._stored, self.writer._epoch

    @trio.lowlevel.enable_ki_protection
    def settle(self, outcome: bool | BaseException, *, unknown: bool = False) -> None:
        if not self.settled:
            self.settled = True
            self.outcome, self.unknown = outcome, unknown
            if self.task is not None:
                trio.lowlevel.reschedule(self.task)


@attrs.define(eq=False)
class _Launched:
    """A group sent by :meth:`GroupCommitter._launch`: its lent connection, its committer slot, its statement.

    The connection goes back as soon as the statement is done (a read-back
    or a retry takes one of its own: with ``pool_size`` 1 it needs this
    one), closed by the pool if the statement was not read to its end; the
    slot, once the group is settled, passes on as a dispatched group's does
    (:meth:`GroupCommitter._pass_slot`).
    """

    pool: _Pool
    slots: trio.Semaphore
    conn: psycopg.Connection[Any]
    # The statement under way (session/_pg_wire.py).
    statement: _Exchange
    returned: bool = False

    def give_back_connection(self) -> None:
        if not self.returned:
            self.returned = True
            self.pool.give_back_lent(self.conn)


@attrs.define(eq=False)
class GroupCommitter:
    """The group-commit queue of one pooled store, and the task that empties it.

    Up to ``pool_size - 1`` groups are in flight at once (one connection is
    left for the rest of the store's work): the queue that builds up while
    they run goes out as the next group.
    """

    store: PooledPostgresStore
    _pending: list[_Request] = attrs.field(factory=list, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    # Every request submitted and maybe not settled, oldest first (their deadlines in order); those sent that
    # outlived theirs, waited for once more (session/_pg_group.py's watch).
    _waiting: collections.deque[_Request] = attrs.field(factory=collections.deque, init=False)
    _late: collections.deque[_Request] = attrs.field(factory=collections.deque, init=False)
    _watch_wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _compact_at: int = attrs.field(default=_COMPACT_MIN, init=False)
    # The committer is not running (not started yet, or the store closed): a submit fails at once.
    _stopped: bool = attrs.field(default=True, init=False)
    # While it runs: its groups' nursery, and its slots (groups in flight at once: pool_size - 1).
    _nursery: trio.Nursery | None = attrs.field(default=None, init=False)
    _slots: trio.Semaphore | None = attrs.field(default=None, init=False)
    # A queued batch could not be encoded (_NotSent): no eager sends until the committer has taken the queue
    # (it sends the batches of a refused group one by one), or every submit would encode the whole queue again.
    _eager_refused: bool = attrs.field(default=False, init=False)
    # The sizes of the group commits sent (their number of sessions), the last 1,000 (tests and benches).
    _groups: collections.deque[int] = attrs.field(factory=lambda: collections.deque(maxlen=1000), init=False)

    def submit(self, request: _Request) -> Awaitable[object]:
        """Queue ``request`` for the next group commit; await what this returns to wait for its outcome.

        Not a coroutine function: the request is queued when this is called
        and the caller's ``await`` is the park itself (one frame fewer on the
        path a thousand flushes take at once).  Await it at once.

        The wait is bounded and not cancellable.  A request not sent within
        ``2 * write_timeout + 1`` seconds leaves the queue and fails (nothing of it is stored); one already sent is
        waited for: the committer settles it within about ``2 *
        write_timeout`` (its statement's bound, then the read-back of a lost
        one).  Should even that wait end, its outcome is unknown (the writer
        reads back what is stored before it sends those seqs again).  The
        bounds are kept by the committer's watch (:meth:`_watch`), so a
        submitter only parks: no cancel scope per flush.
        """
        if self._stopped:
            raise SessionStoreError(
                f"the group commits of {self.store.location} have stopped (the store is closing): the flush of "
                f"session {request.sid!r} was not sent, nothing of it was stored",
                path=self.store.location,
                session_id=request.sid,
            )
        if self.store._nursery is None:
            self.store._require_pool()
        self._queue(request)
        return trio.lowlevel.wait_task_rescheduled(_stay_parked)  # noqa: ASYNC105 (awaited by the caller: see above)

    @trio.lowlevel.enable_ki_protection  # queued and parked, or neither: a queued request's task is parked
    def _queue(self, request: _Request) -> None:
        request.task = trio.lowlevel.current_task()
        self._track(request)
        self._pending.append(request)
        if len(self._pending) >= _EAGER:
            self._launch()
        self._wake.set()

    def _track(self, request: _Request) -> None:
        """Give ``request`` its bound and put it under the watch."""
        request.deadline = trio.current_time() + self._limit()
        waiting = self._waiting
        while waiting and waiting[0].settled:
            waiting.popleft()
        if not waiting:
            self._watch_wake.set()
        elif len(waiting) >= self._compact_at:
            # Settled requests behind an unsettled one are dropped now and then: at most about twice the
            # unsettled ones (or 1,024) are kept, whatever the rate of flushes.
            self._waiting = waiting = collections.deque(r for r in waiting if not r.settled)
            self._compact_at = max(_COMPACT_MIN, 2 * len(waiting))
        waiting.append(request)

    @trio.lowlevel.enable_ki_protection  # sent, marked sent and handed to a task, or none of it
    def _launch(self, *, holding: bool = False) -> bool:
        """Send the queue as a group now, with no schedule point, when a slot and a connection are free.

        From the submit that made the queue long, or from a group just
        settled (``holding`` its slot, which goes to this group: see
        :meth:`_pass_slot`).  True when sent; anything failing here leaves
        the queue as it was (the committer sends it)."""
        slots, nursery, pool = self._slots, self._nursery, self.store._pool
        if not self._pending or slots is None or nursery is None or pool is None or self._eager_refused:
            return False
        if slots.value == 0 and not holding:
            return False
        conn = pool.lend_nowait()
        if conn is None:
            return False
        group = self._pending[:_GROUP_MAX]
        try:
            statement = self._send(group, conn)
        except Exception as exc:  # nothing sent: the queue as it was (the committer sends it, and reports this)
            log.warning("group commit: its statement could not be sent early (%s)", exc)
            pool.give_back_lent(conn)
            self._eager_refused = isinstance(exc, _NotSent)
            return False
        launched = _Launched(pool, slots, conn, statement)
        # From here on nothing can fail: the slot is free or held (checked above), the nursery open (run() runs).
        if not holding:
            slots.acquire_nowait()
        del self._pending[:_GROUP_MAX]
        self._mark_sent(group)  # queued, so neither abandoned (the watch drops those) nor settled
        nursery.start_soon(self._commit_launched, group, launched)
        return True

    async def _commit_launched(self, group: list[_Request], launched: _Launched) -> None:
        """Settle a group :meth:`_launch` sent; then its slot is passed on (:meth:`_pass_slot`)."""
        try:
            await self._commit_group(group, launched=launched)
            launched.give_back_connection()
        except BaseException:
            try:
                launched.give_back_connection()
            finally:
                launched.slots.release()
            raise
        self._pass_slot(launched.slots)

    def _pass_slot(self, slots: trio.Semaphore) -> None:
        """A group is settled: its slot goes to what queued meanwhile, sent now, or back to ``slots``.

        Now, before the flushes it woke run: released, the slot would go to
        the committer's dispatch, which runs after them (a few milliseconds
        for a thousand).
        """
        passed = False
        try:
            # Not while the store closes (the committer's tasks are cancelled): what is queued stays unsent.
            if not self._stopped and trio.current_effective_deadline() != -math.inf:
                passed = self._launch(holding=True)
        finally:
            if not passed:
                slots.release()

    def starting(self) -> None:
        """The store opens: submits are taken again (queued until :meth:`run` starts)."""
        self._stopped = False

    def _limit(self) -> float:
        """Seconds a request may wait to be sent; a sent one, that again to be settled."""
        return self.store.write_timeout * 2 + 1

    async def _watch(self) -> None:
        """Keep the requests' bounds: fail those unsent in time; settle as unknown those sent and not settled."""
        late = self._late
        while True:
            waiting = self._waiting  # replaced when compacted
            for queue in (waiting, late):
                while queue and queue[0].settled:
                    queue.popleft()
            if not waiting and not late:
                self._watch_wake = trio.Event()
                await self._watch_wake.wait()
                continue
            await trio.sleep_until(min(queue[0].deadline for queue in (waiting, late) if queue))
            self._expire(trio.current_time())

    @trio.lowlevel.enable_ki_protection  # a request taken off a list is settled or put on the other
    def _expire(self, now: float) -> None:
        store, limit, waiting, late = self.store, self._limit(), self._waiting, self._late
        abandoned = False
        while waiting and waiting[0].deadline <= now:
            request = waiting.popleft()
            if request.settled:
                continue
            if request.sent:  # it may commit: waited for once more (from now), then its outcome is unknown
                request.deadline = now + limit
                late.append(request)
                continue
            abandoned = request.abandoned = True
            self._settle_unsent(request, limit)
        while late and late[0].deadline <= now:
            request = late.popleft()
            if request.settled:
                continue
            request.abandoned = True  # never sent again by a retry
            if not request.sent:  # its group failed unsent and it was still waiting for its turn alone
                self._settle_unsent(request, 2 * limit)
                continue
            request.settle(
                SessionStoreError(
                    f"the group commit of session {request.sid!r} did not finish within {2 * limit:g} s in "
                    f"{store.location}: whether it committed is unknown",
                    path=store.location,
                    session_id=request.sid,
                ),
                unknown=True,
            )
        if abandoned:
            self._pending = [r for r in self._pending if not r.abandoned]

    def _settle_unsent(self, request: _Request, limit: float) -> None:
        if request.lost:
            why = (
                "its group lost its connection and it was not sent again within "
                f"{limit:g} s: whether the lost statement committed it is unknown"
            )
        else:
            why = (
                f"it was not sent within {limit:g} s (the group commits ahead of it in {self.store.location} "
                "did not finish): nothing of it was stored; flush again"
            )
        request.settle(
            SessionStoreError(
                f"the flush of session {request.sid!r} failed: {why}", path=self.store.location, session_id=request.sid
            ),
            unknown=request.lost,
        )

    async def run(self) -> None:
        slots = self._slots = trio.Semaphore(max(1, self.store.pool_size - 1))

        async def commit(group: list[_Request]) -> None:
            try:
                await self._commit_group(group)
            except BaseException:
                slots.release()
                raise
            self._pass_slot(slots)

        self._stopped = False
        try:
            async with trio.open_nursery() as nursery:
                self._nursery = nursery
                nursery.start_soon(self._watch)
                await self._dispatch(nursery, slots, commit)
        finally:
            # The store is closing: its groups in flight settled their requests; the queued ones were never sent.
            self._stopped = True
            self._nursery = self._slots = None
            for request in (*self._waiting, *self._late):
                if not request.settled:  # (the lists keep settled ones too: no error built for those)
                    request.settle(self._stopped_error(request), unknown=request.sent or request.lost)
            self._waiting.clear()
            self._late.clear()
            self._pending.clear()

    async def _dispatch(
        self, nursery: trio.Nursery, slots: trio.Semaphore, commit: Callable[[list[_Request]], Awaitable[None]]
    ) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                await slots.acquire()
                # A long queue is split between the connections free now: their groups run at once.
                size = max(_GROUP_MIN, -(-len(self._pending) // (slots.value + 1)))
                size = min(size, _GROUP_MAX)
                group, self._pending = self._pending[:size], self._pending[size:]
                self._eager_refused = False
                if not group:
                    slots.release()
                    break
                nursery.start_soon(commit, group)

    def _group_statement(self) -> bytes:
        """The group commit: one statement (its own transaction); the sessions whose lease held, written whole.

        Each batch is one row (session/_pg_rows.py: keyed by its last seq).
        With each session, how many of its mailbox rows the statement deleted.
        """
        s = self.store._sql.s
        return (
            f"WITH l AS (SELECT le.session_id FROM {s}.leases le JOIN unnest($1::text[], $2::int8[]) AS w(sid, epoch) "
            "ON le.session_id = w.sid AND le.epoch = w.epoch WHERE le.worker_id = $3 FOR SHARE OF le), "
            f"e AS (INSERT INTO {s}.events (session_id, seq, n, body) SELECT t.sid, t.seq, t.n, t.body "
            "FROM unnest($4::text[], $5::int8[], $6::int8[], $7::text[]) AS t(sid, seq, n, body) "
            "JOIN l ON l.session_id = t.sid RETURNING 1), "
            f"m AS (DELETE FROM {s}.mailbox mb USING unnest($8::text[], $9::int8[]) AS a(sid, id), l "
            "WHERE mb.session_id = a.sid AND mb.id = a.id AND l.session_id = a.sid RETURNING mb.session_id) "
            "SELECT l.session_id, coalesce(d.n, 0) FROM l LEFT JOIN "
            "(SELECT session_id, count(*) AS n FROM m GROUP BY session_id) d ON d.session_id = l.session_id"
        ).encode()

    def _params(self, group: Sequence[_Request], encoding: str) -> list[bytes]:
        """The group statement's parameters, its arrays built in the binary format here (one pass per array)."""
        length = ELEMENT_LENGTH.pack
        sids: list[bytes] = []  # each batch's session id (encoded once per request)
        lasts: list[int] = []
        counts: list[int] = []
        bodies: list[bytes] = []
        ack_sids: list[bytes] = []
        ack_ids: list[int] = []
        for request in group:
            data = request.sid.encode(encoding)
            element = length(len(data)) + data
            if request.lines:
                count = len(request.lines)
                sids.append(element)
                lasts.append(request.first + count - 1)
                counts.append(count)
                body = "\n".join(request.lines).encode(encoding)
                bodies += (length(len(body)), body)
            if request.acks:
                ack_sids.append(element * len(request.acks))
                ack_ids += request.acks
        rows = len(lasts)
        return [
            _texts([r.sid for r in group], encoding),
            _int8s([r.epoch for r in group]),
            self.store.worker_id.encode(encoding),
            _encoded(sids, rows),
            _int8s(lasts),
            _int8s(counts),
            _encoded(bodies, rows),
            _encoded(ack_sids, len(ack_ids)),
            _int8s(ack_ids),
        ]

    def _send(self, sent: list[_Request], conn: psycopg.Connection[Any]) -> _Exchange:
        """Send the group statement of the requests ``sent`` on ``conn`` now (session/_pg_wire.py's ``begin``).

        libpq's unnamed statement (no session state: a transaction-pooling
        proxy may sit between), its arrays in the binary format: psycopg's
        adaptation of thousands of strings costs more than the server's work.
        Raises :class:`_NotSent` for a batch the server's encoding cannot
        hold, ``psycopg.OperationalError`` when libpq could not take it:
        either way nothing was sent.
        """
        encoding = conn.info.encoding
        try:
            params = self._params(sent, encoding)
        except Exception as exc:  # e.g. an event the database's encoding cannot hold: nothing was sent
            raise _NotSent(
                f"a batch of the group could not be encoded for the server ({type(exc).__name__}: {exc}): "
                "nothing of it was sent"
            ) from exc
        query = self._group_statement()
        return begin(conn, lambda: conn.pgconn.send_query_params(query, params, _GROUP_TYPES, _GROUP_FORMATS))

    async def _written(self, conn: psycopg.Connection[Any], statement: _Exchange) -> dict[str, int]:
        """The sessions whose lease held, with how many of their mailbox rows were deleted."""
        results = await finish(conn, statement)
        if len(results) != 1:
            raise _psycopg().OperationalError(f"the group statement returned {len(results)} results, not one")
        (result,) = results
        encoding = conn.info.encoding
        return {
            bytes(result.get_value(row, 0) or b"").decode(encoding): int(result.get_value(row, 1) or b"0")
            for row in range(result.ntuples)
        }

    def _mark_sent(self, sent: list[_Request]) -> None:
        for request in sent:
            request.sent = True
        self._groups.append(len(sent))

    def _unmark_sent(self, sent: list[_Request]) -> None:
        for request in sent:
            request.sent = False
        self._groups.pop()

    async def _commit_group(
        self,
        group: list[_Request],
        *,
        again: bool = False,
        launched: _Launched | None = None,
    ) -> None:
        """Send ``group`` (its requests not abandoned) and settle every request of it.

        ``again``: a retry after a lost connection whose group was read back
        (nothing of these stored): a second loss fails them; a retry that
        meets rows at its seqs (the lost statement committed them after the
        read-back, or another writer did: either way committed now) is read
        back again.  ``launched``: the group was sent already
        (:meth:`_launch`: all of it, on that connection, that statement), this
        waits for it.
        """
        pg = _psycopg()
        sent: list[_Request] = list(group) if launched is not None else []
        try:
            written = await self._run_group(group, sent, launched)
            if written is None:  # the connection was lost, maybe during COMMIT: read back what is stored
                await self._resolve(sent, again)
                return
        except BaseException as exc:
            # Refused (nothing stored): a batch that could not be encoded, or a statement the server failed.
            refused = isinstance(exc, _NotSent) or (
                isinstance(exc, pg.Error) and not isinstance(exc, pg.OperationalError)
            )
            if refused and len(sent) > 1:
                for request in sent:  # nothing of the group was stored: each waits for its own turn unsent
                    request.sent = False
                for request in sent:  # one session's bad batch must not fail the others
                    if not request.settled and not request.abandoned:
                        await self._commit_group([request], again=again)
                return
            if again and sent and isinstance(exc, pg.errors.UniqueViolation):
                await self._resolve(sent, again)  # the rows met are committed: stored (ours) or fenced (not)
                return
            for request in group:
                # A statement that failed, or never reached the server, stored nothing; a cancelled one maybe did.
                unknown = (request.sent and not refused) or request.lost
                request.settle(exc if isinstance(exc, Exception) else self._stopped_error(request), unknown=unknown)
            if not isinstance(exc, Exception):
                raise
            return
        for request in sent:
            deleted = written.get(request.sid)
            if deleted is not None:
                request.gone = len(request.acks) - deleted
            request.settle(deleted is not None)

    def _stopped_error(self, request: _Request) -> SessionStoreError:
        maybe = request.sent or request.lost
        what = "whether it committed is unknown" if maybe else "it was not sent, nothing of it stored"
        return SessionStoreError(
            f"the group commits of {self.store.location} stopped (the store closed) before the flush "
            f"of session {request.sid!r} was settled: {what}",
            path=self.store.location,
            session_id=request.sid,
        )

    def _read_back(self, group: list[_Request]) -> Callable[[psycopg.Connection[Any]], dict[str, list[str]]]:
        """(for a worker thread) Once the lost transaction of ``group`` has ended: what is stored at its seqs.

        One transaction: this worker's lease rows of the group's sessions are
        locked ``FOR UPDATE`` first (waiting at most ``write_timeout``:
        ``lock_timeout``), which waits for the ``FOR SHARE`` the lost group
        statement holds on them until its transaction ends; then the bodies
        stored at each request's seqs are read (a later statement: it sees
        what the lost transaction committed).  A lease row the lost statement
        locked and that changed since (taken over, released, deleted) was
        changed by a transaction that waited for it just the same; one it
        did not lock had nothing of it written (its lease did not hold).
        """
        s, worker = self.store._sql.s, self.store.worker_id
        sids = sorted({r.sid for r in group})
        batches = [r for r in group if r.lines]
        timeout = f"{max(1, math.ceil(self.store.write_timeout * 1000))}ms"

        def read_back(conn: psycopg.Connection[Any]) -> dict[str, list[str]]:
            with conn.transaction():
                conn.execute("SELECT set_config('lock_timeout', %s, true)", (timeout,))
                conn.execute(
                    f"SELECT 1 FROM {s}.leases WHERE session_id = ANY(%s) AND worker_id = %s "
                    "ORDER BY session_id FOR UPDATE",
                    (sids, worker),
                ).fetchall()
                rows = conn.execute(
                    f"SELECT e.session_id, e.seq, e.n, e.body FROM {s}.events e "
                    "JOIN unnest(%s::text[], %s::int8[], %s::int8[]) AS r(sid, first, n) "
                    "ON e.session_id = r.sid AND e.seq >= r.first AND e.seq - e.n + 1 < r.first + r.n "
                    "ORDER BY e.session_id, e.seq",
                    ([r.sid for r in batches], [r.first for r in batches], [len(r.lines) for r in batches]),
                ).fetchall()
            by_session: dict[str, list[tuple[int, int, str]]] = {}
            for sid, seq, n, body in rows:
                by_session.setdefault(sid, []).append((seq, n, body))
            return {
                r.sid: lines_between(by_session[r.sid], r.first, r.first + len(r.lines))
                for r in batches
                if r.sid in by_session
            }

        return read_back

    async def _resolve(self, group: list[_Request], again: bool) -> None:
        """After a lost group commit: settle each request from what is stored; commit again what is not (once).

        The lost statement may still be running on the server (waiting on a
        lock, or in its COMMIT); behind a transaction-pooling proxy the
        connection's server process is not known (the backend pid it reports
        is the proxy's), so the lost transaction is waited for through the
        locks it holds, not by process: the read-back (:meth:`_read_back`)
        first takes the group's lease rows ``FOR UPDATE``, granted once the
        lost transaction has ended, whatever server process ran it.  The
        wait is bounded (``write_timeout`` in all): a server process frozen
        with the locks leaves the group's outcome unknown (each writer reads
        back its own before it sends again).  A lost statement that reached
        the server only after the read-back (delayed on its way) meets the
        retry at the primary key: whichever comes second fails, and a retry
        failing so is read back again (:meth:`_commit_group`), so the batch
        is stored once and reported so.
        """
        if not group:
            return
        store = self.store
        found: dict[str, list[str]] | None = None
        with trio.move_on_after(store.write_timeout):
            try:
                found = await store._run("read back a lost group commit", self._read_back(group), retry=True)
            except SessionStoreError as exc:
                log.warning("a lost group commit could not be read back (%s)", exc)
        if found is None:
            error = SessionStoreError(
                f"a group commit lost its connection and could not be read back within {store.write_timeout:g} s "
                f"(its transaction may still be running, holding its sessions' leases) in {store.location}: "
                "whether it committed is unknown",
                path=store.location,
            )
            for request in group:
                request.settle(error, unknown=True)
            return
        retry: list[_Request] = []
        for request in group:
            stored = found.get(request.sid, [])
            if not request.lines:  # mail deletes only: nothing shows whether they committed
                request.settle(
                    SessionStoreError(
                        f"the group commit of session {request.sid!r} lost its connection: whether its mailbox "
                        f"deletes committed is unknown in {store.location}",
                        path=store.location,
                        session_id=request.sid,
                    ),
                    unknown=True,
                )
            elif stored == request.lines:
                request.settle(True)
            elif stored:
                request.settle(False)  # another writer appended there: the lease was taken
            elif again or request.abandoned:
                request.settle(
                    SessionStoreError(
                        f"the group commit of session {request.sid!r} lost its connection twice in {store.location}: "
                        "nothing of it was found stored (a lost statement still on its way to the server may yet "
                        "commit it); flush again",
                        path=store.location,
                        session_id=request.sid,
                    ),
                    unknown=True,
                )
            else:
                request.sent, request.lost = False, True
                retry.append(request)
        if retry:
            log.warning(
                "a group commit of %d sessions lost its connection; committing %d again", len(group), len(retry)
            )
            await self._commit_group(retry, again=True)

    async def _run_group(
        self, group: list[_Request], sent: list[_Request], launched: _Launched | None
    ) -> dict[str, int] | None:
        """One group transaction: what it returned, or None when the connection was lost.

        Once it has a connection, the requests of ``group`` not abandoned are
        marked sent and put in ``sent`` (the others are dropped: never sent).
        A ``launched`` group is under way already (``sent`` is all of it).
        """
        if launched is not None:  # its connection is given back as soon as its statement is done
            try:
                return await self._outcome(launched.conn, launched.statement)
            finally:
                launched.give_back_connection()
        pg = _psycopg()
        for attempt in (1, 2):
            async with self.store._require_pool().connection() as conn:
                sent[:] = [r for r in group if not r.abandoned and not r.settled]
                if not sent:
                    return {}
                self._mark_sent(sent)  # first: an interrupt after the send must not leave them "not sent"
                try:
                    statement = self._send(sent, conn)
                except BaseException as exc:  # nothing of it was sent
                    self._unmark_sent(sent)
                    if not isinstance(exc, pg.OperationalError) or attempt == 2 or not (conn.broken or conn.closed):
                        raise
                    conn.close()  # lost while idle in the pool: once more on a new connection
                    continue
                return await self._outcome(conn, statement)
        raise AssertionError("unreachable")

    async def _outcome(self, conn: psycopg.Connection[Any], statement: _Exchange) -> dict[str, int] | None:
        """The group ``statement`` sent on ``conn``, bounded: what it returned; None: the connection was lost."""
        pg = _psycopg()
        try:
            with trio.fail_after(self.store.write_timeout):
                return await self._written(conn, statement)
        except (pg.Error, trio.TooSlowError) as exc:
            if isinstance(exc, pg.Error) and not (conn.broken or conn.closed):
                raise
            log.warning("group commit: the connection was lost (%s)", exc)
            conn.close()
        return None
