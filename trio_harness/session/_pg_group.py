"""The pooled store's group commit: flushes of different sessions ready at once share one transaction.

A :class:`GroupCommitter` belongs to one
:class:`~trio_harness.session.PooledPostgresStore`.  Writers queue a
:class:`_Request` (their batch, the mailbox rows to delete, their lease's
epoch); one task takes everything queued and sends it as **one statement**
(its own transaction): the leases still held by this worker at that epoch are
locked ``FOR SHARE``, the events of those sessions inserted, their mailbox rows
deleted, and the statement returns the sessions whose lease held.  Each of
those had its whole batch stored, the others nothing (fenced).  A lost
connection, maybe during COMMIT, is resolved by reading back what is stored
once the lost server process is gone.
"""

from __future__ import annotations

import collections
import functools
import itertools
import logging
import struct
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import SessionStoreError
from ._pg_schema import _psycopg
from ._pg_threads import _call
from ._pg_wire import BINARY_FORMAT, INT8_OID, TEXT_ARRAY_OID, TEXT_FORMAT, TEXT_OID, text_array

if TYPE_CHECKING:
    import psycopg

    from ._pg_pooled import PooledPostgresStore

log = logging.getLogger("trio_harness.session.postgres")

# Most sessions one group commit carries.
_GROUP_MAX = 2000

_INT8_ARRAY_OID = 1016
_GROUP_TYPES = (
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
    TEXT_OID,
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
    TEXT_ARRAY_OID,
    TEXT_ARRAY_OID,
    _INT8_ARRAY_OID,
)
_GROUP_FORMATS = (
    BINARY_FORMAT,
    BINARY_FORMAT,
    TEXT_FORMAT,
    BINARY_FORMAT,
    BINARY_FORMAT,
    BINARY_FORMAT,
    BINARY_FORMAT,
    BINARY_FORMAT,
)
_EMPTY_ARRAY = struct.Struct("!iiI")  # no dimensions, no nulls, element type


def _texts(items: Sequence[str], encoding: str) -> bytes:
    """A ``text[]`` in the binary format (an empty one has no dimensions)."""
    return text_array(items, encoding) if items else _EMPTY_ARRAY.pack(0, 0, TEXT_OID)


def _int8s(values: Sequence[int]) -> bytes:
    """An ``int8[]`` in the binary format."""
    if not values:
        return _EMPTY_ARRAY.pack(0, 0, INT8_OID)
    head = struct.pack("!iiIii", 1, 0, INT8_OID, len(values), 1)
    return head + struct.pack("!" + "iq" * len(values), *itertools.chain.from_iterable((8, v) for v in values))


@attrs.define(eq=False)
class _Request:
    """One writer's flush waiting for a group commit."""

    writer: Any
    lines: list[str]
    acks: list[int]
    sync: bool
    done: trio.Event = attrs.field(factory=trio.Event)
    # True: stored; False: fenced (the lease was taken); an exception: failed.
    outcome: bool | BaseException | None = None


@attrs.define(eq=False)
class GroupCommitter:
    """The group-commit queue of one pooled store, and the task that empties it."""

    store: PooledPostgresStore
    _pending: list[_Request] = attrs.field(factory=list, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    # The sizes of the group commits sent (their number of sessions), the last 1,000 (tests and benches).
    _groups: collections.deque[int] = attrs.field(factory=lambda: collections.deque(maxlen=1000), init=False)

    async def submit(self, request: _Request) -> None:
        """Queue ``request`` for the next group commit and wait (shielded, bounded) for its outcome."""
        if self.store._nursery is None:
            self.store._require_pool()
        self._pending.append(request)
        self._wake.set()
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.store.write_timeout * 2 + 1):
                await request.done.wait()
        if not request.done.is_set():
            request.outcome = SessionStoreError(
                f"the group commit of session {request.writer.header.id!r} did not finish within "
                f"{self.store.write_timeout * 2 + 1:g} s in {self.store.location}",
                path=self.store.location,
                session_id=request.writer.header.id,
            )

    async def run(self) -> None:
        while True:
            await self._wake.wait()
            self._wake = trio.Event()
            while self._pending:
                group, self._pending = self._pending[:_GROUP_MAX], self._pending[_GROUP_MAX:]
                self._groups.append(len(group))
                await self._commit_group(group)

    def _group_statement(self) -> bytes:
        """The group commit: one statement (its own transaction); the sessions whose lease held, written whole."""
        s = self.store._sql.s
        return (
            f"WITH l AS (SELECT le.session_id FROM {s}.leases le JOIN unnest($1::text[], $2::int8[]) AS w(sid, epoch) "
            "ON le.session_id = w.sid AND le.epoch = w.epoch WHERE le.worker_id = $3 FOR SHARE OF le), "
            f"e AS (INSERT INTO {s}.events (session_id, seq, body) SELECT t.sid, t.seq, t.body "
            "FROM unnest($4::text[], $5::int8[], $6::text[]) AS t(sid, seq, body) JOIN l ON l.session_id = t.sid "
            "RETURNING 1), "
            f"m AS (DELETE FROM {s}.mailbox mb USING unnest($7::text[], $8::int8[]) AS a(sid, id), l "
            "WHERE mb.session_id = a.sid AND mb.id = a.id AND l.session_id = a.sid RETURNING 1) "
            "SELECT session_id FROM l"
        ).encode()

    def _params(self, group: Sequence[_Request], encoding: str) -> list[bytes]:
        sids: list[str] = []
        seqs: list[int] = []
        bodies: list[str] = []
        ack_sids: list[str] = []
        ack_ids: list[int] = []
        for request in group:
            sid, first = request.writer.header.id, request.writer._stored
            sids += [sid] * len(request.lines)
            seqs += range(first, first + len(request.lines))
            bodies += request.lines
            ack_sids += [sid] * len(request.acks)
            ack_ids += request.acks
        return [
            _texts([r.writer.header.id for r in group], encoding),
            _int8s([r.writer._epoch for r in group]),
            self.store.worker_id.encode(encoding),
            _texts(sids, encoding),
            _int8s(seqs),
            _texts(bodies, encoding),
            _texts(ack_sids, encoding),
            _int8s(ack_ids),
        ]

    async def _commit_group(self, group: list[_Request]) -> None:
        pg = _psycopg()
        query = self._group_statement()

        def work(conn: psycopg.Connection[Any]) -> set[str]:
            # libpq's unnamed statement (no session state: a transaction-pooling proxy may sit between),
            # its arrays in the binary format: psycopg's adaptation of thousands of strings costs more
            # than the server's work.
            encoding = conn.info.encoding
            result = conn.pgconn.exec_params(query, self._params(group, encoding), _GROUP_TYPES, _GROUP_FORMATS)
            if result.status != pg.pq.ExecStatus.TUPLES_OK:
                raise pg.errors.error_from_result(result, encoding=encoding)
            return {bytes(result.get_value(row, 0) or b"").decode(encoding) for row in range(result.ntuples)}

        try:
            written, pid = await self._run_group(work)
            if written is None:  # the connection was lost, maybe during COMMIT: read back what is stored
                written = await self._resolve(group, pid)
        except BaseException as exc:
            if isinstance(exc, pg.Error) and len(group) > 1 and not isinstance(exc, pg.OperationalError):
                for request in group:  # one session's bad batch must not fail the others
                    await self._commit_group([request])
                return
            for request in group:
                request.outcome = exc if isinstance(exc, Exception) else SessionStoreError(str(exc))
                request.done.set()
            if not isinstance(exc, Exception):
                raise
            return
        for request in group:
            if not request.done.is_set():
                request.outcome = request.writer.header.id in written
                request.done.set()

    async def _resolve(self, group: list[_Request], pid: int) -> set[str]:
        """After a lost group commit: the sessions whose batch is stored; the others are committed again.

        The lost connection's server process ``pid`` may still be finishing
        the transaction: the outcome is read only once that process is gone
        (waited for up to ``write_timeout``, else the group fails: unknown).
        """
        s = self.store._sql.s
        deadline = trio.current_time() + self.store.write_timeout
        while await self.store._run(
            "look for a lost connection's server process",
            lambda conn: conn.execute("SELECT 1 FROM pg_stat_activity WHERE pid = %s", (pid,)).fetchone() is not None,
            retry=True,
        ):
            if trio.current_time() >= deadline:
                raise SessionStoreError(
                    f"a group commit lost its connection and its server process {pid} has not ended within "
                    f"{self.store.write_timeout:g} s in {self.store.location}: whether it committed is unknown",
                    path=self.store.location,
                )
            await trio.sleep(0.01)
        firsts = [(r.writer.header.id, r.writer._stored) for r in group if r.lines]

        def counts(conn: psycopg.Connection[Any]) -> dict[str, int]:
            found: dict[str, int] = {}
            for sid, first in firsts:
                row = conn.execute(
                    f"SELECT count(*) FROM {s}.events WHERE session_id = %s AND seq >= %s", (sid, first)
                ).fetchone()
                found[sid] = int(row[0]) if row else 0
            return found

        found = await self.store._run("read back a lost group commit", counts, retry=True)
        written = {r.writer.header.id for r in group if r.lines and found.get(r.writer.header.id) == len(r.lines)}
        again = [r for r in group if r.writer.header.id not in written]
        for request in again:
            if request.lines and found.get(request.writer.header.id):
                request.outcome = False  # another writer appended: the lease was taken
                request.done.set()
        retry = [r for r in again if not r.done.is_set()]
        if retry:
            log.warning(
                "a group commit of %d sessions lost its connection; committing %d again", len(group), len(retry)
            )
            await self._commit_group(retry)
        return written

    async def _run_group(self, work: Callable[[psycopg.Connection[Any]], set[str]]) -> tuple[set[str] | None, int]:
        """One group transaction: the sessions written, or None when the connection was lost; its server process."""
        pg = _psycopg()
        pool = self.store._require_pool()
        async with pool.connection() as conn:
            pid = conn.info.backend_pid
            try:
                with trio.fail_after(self.store.write_timeout):
                    return await _call(conn, functools.partial(work, conn)), pid
            except (pg.Error, trio.TooSlowError) as exc:
                if isinstance(exc, pg.Error) and not (conn.broken or conn.closed):
                    raise
                log.warning("group commit: the connection was lost (%s)", exc)
                conn.close()
        return None, pid
