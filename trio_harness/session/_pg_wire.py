"""One statement sent through libpq from the Trio thread itself: no worker thread, cancellation-safely.

A checkpoint is one small statement whose cost is mostly the way to the
server and back; run as psycopg's blocking transaction (``BEGIN``, ``SET
LOCAL``, ``INSERT``, ``COMMIT`` in a pipeline) on a worker thread
(:mod:`._pg_threads`) it paid two thread hops and psycopg's transaction
machinery, several times the round trip itself.  :func:`_statement` sends one
statement prepared on the connection (parsed and planned once), its own
implicit transaction, through libpq's non-blocking API
(``psycopg.pq.PGconn``: ``send_query_prepared``, ``flush``,
``consume_input``, ``is_busy``, ``get_result``) and waits on the
connection's socket with ``trio.lowlevel.wait_readable`` / ``wait_writable``.

Cancellation keeps :func:`._pg_threads._call`'s contract: a caller cancelled
before the statement is sent sends nothing; once it is sent, the statement
is cancelled on the server, its answer waited for (shielded, at most
``_CANCEL_GRACE`` seconds, after which the socket is shut and the connection
is broken), and ``settle`` is called when it completed anyway, so a committed
statement is never mistaken for a failed one.  A statement that failed (on
the server, or because the connection was lost) raises the psycopg error
psycopg itself would raise; whether a statement whose connection was lost
committed is for the caller to find out (the connection is broken then).

The caller owns the connection meanwhile (a session's writer, under its
lock; the group committer, a pooled connection it was lent): nothing else
may use it, on any thread, until the call returns.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import weakref
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ._pg_schema import _psycopg
from ._pg_threads import _CANCEL_GRACE, _cancel_statement, _shut_socket

if TYPE_CHECKING:
    import psycopg
    from psycopg.pq.abc import PGresult

log = logging.getLogger("trio_harness.session.postgres")

TEXT_OID = 25
INT8_OID = 20
TEXT_ARRAY_OID = 1009
TEXT_FORMAT = 0
BINARY_FORMAT = 1

_ARRAY_HEADER = struct.Struct("!iiIii")  # dimensions, has-nulls flag, element type, length, lower bound
ELEMENT_LENGTH = struct.Struct("!i")  # an array element's length, before its bytes


def text_array(items: Sequence[str], encoding: str) -> bytes:
    """``items`` as a one-dimensional ``text[]`` in PostgreSQL's binary format (no nulls)."""
    parts = [_ARRAY_HEADER.pack(1, 0, TEXT_OID, len(items), 1)]
    for item in items:
        data = item.encode(encoding)
        parts.append(ELEMENT_LENGTH.pack(len(data)))
        parts.append(data)
    return b"".join(parts)


def prefixed_text_array(elements: list[bytes], count: int) -> bytes:
    """A one-dimensional ``text[]`` of ``count`` elements (at least one) in the binary format, from
    ``elements``: the elements already encoded, each after its :data:`ELEMENT_LENGTH` (joined as they are)."""
    return _ARRAY_HEADER.pack(1, 0, TEXT_OID, count, 1) + b"".join(elements)


class _Exchange:
    """One statement's way through libpq: its sending, then its results until the connection is ready again."""

    def __init__(self, conn: psycopg.Connection[Any]) -> None:
        self.pgconn = conn.pgconn
        self.fd = self.pgconn.socket
        self.sent = False
        self.polled = False
        self.done = False
        self.results: list[PGresult] = []

    def advance(self) -> bool:
        """Progress as far as possible without blocking; True once every result is in.

        Raises:
            psycopg.OperationalError: the connection was lost.
        """
        pgconn = self.pgconn
        if not self.sent:
            if pgconn.flush():
                pgconn.consume_input()  # what the server said meanwhile (a notice), so it never waits on us
                return False
            self.sent = True
            if not self.polled:
                return False  # just sent: nothing can be there yet; wait until the socket is readable
        pgconn.consume_input()
        while not pgconn.is_busy():
            result = pgconn.get_result()
            if result is None:
                self.done = True
                return True
            self.results.append(result)
        return False

    def poll(self) -> bool:
        """:meth:`advance`, reading whatever is there even right after sending (for a cancelled caller)."""
        self.polled = True
        return self.advance()

    async def run(self) -> None:
        while not self.advance():
            if self.sent:
                await trio.lowlevel.wait_readable(self.fd)
            else:
                await trio.lowlevel.wait_writable(self.fd)

    @property
    def succeeded(self) -> bool:
        pq = _psycopg().pq
        ok = (pq.ExecStatus.COMMAND_OK, pq.ExecStatus.TUPLES_OK)
        return self.done and all(result.status in ok for result in self.results)


async def _exchange(
    conn: psycopg.Connection[Any], send: Callable[[], None], *, settle: Callable[[None], None] | None = None
) -> None:
    """``send()`` one request on ``conn``'s libpq connection and wait for all its results, cancellation-safely.

    Raises:
        psycopg.Error: the server refused the request (nothing of it took
            effect), or the connection was lost (the connection is broken).
        trio.Cancelled: after ``settle`` when the request completed anyway.
    """
    await trio.lowlevel.checkpoint_if_cancelled()  # a cancelled caller sends nothing
    await finish(conn, begin(conn, send), settle=settle)


def begin(conn: psycopg.Connection[Any], send: Callable[[], None]) -> _Exchange:
    """``send()`` one request on ``conn``'s libpq connection now, from synchronous code (no schedule point).

    As much of it as the socket takes is written before this returns (libpq
    flushes as it goes); :func:`finish` writes the rest and reads the results.

    Raises:
        psycopg.Error: the connection is closed or not idle, or libpq could
            not take the request: nothing of it reached the server.
    """
    pg = _psycopg()
    if conn.closed or conn.broken:
        raise pg.OperationalError("the connection is closed")
    pgconn = conn.pgconn
    if pgconn.transaction_status != pg.pq.TransactionStatus.IDLE:
        status = pg.pq.TransactionStatus(pgconn.transaction_status).name
        raise pg.InterfaceError(f"a statement sent on a connection that is {status}, not idle")
    pgconn.nonblocking = 1
    exchange = _Exchange(conn)  # first: once sent, nothing may fail as if it had not been
    send()
    return exchange


async def finish(
    conn: psycopg.Connection[Any], exchange: _Exchange, *, settle: Callable[[None], None] | None = None
) -> list[PGresult]:
    """Wait for the results of the request :func:`begin` sent, cancellation-safely (see the module): them.

    Raises:
        psycopg.Error: the server refused the request (nothing of it took
            effect), or the connection was lost (the connection is broken).
        trio.Cancelled: after ``settle`` when the request completed anyway.
    """
    pg = _psycopg()
    try:
        await exchange.run()
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            try:
                if not exchange.poll():
                    await trio.to_thread.run_sync(_cancel_statement, conn)
                    with trio.move_on_after(_CANCEL_GRACE) as grace:
                        await exchange.run()
                    if grace.cancelled_caught:
                        log.warning(
                            "PostgreSQL did not cancel a statement within %g s: shutting its socket", _CANCEL_GRACE
                        )
                        _shut_socket(conn)
                        await exchange.run()  # ends at once: the connection is broken
            except pg.Error as exc:  # lost: whether it took effect is for the caller to find out
                log.debug("a cancelled statement's connection failed: %s", exc)
        if exchange.succeeded and settle is not None:
            settle(None)
        raise
    for result in exchange.results:
        if result.status not in (pg.pq.ExecStatus.COMMAND_OK, pg.pq.ExecStatus.TUPLES_OK):
            raise pg.errors.error_from_result(result, encoding=conn.info.encoding)
    return exchange.results


# The statements prepared on each connection (by name), by this module: a
# prepared statement skips the server's parsing and planning, half the cost
# of a small INSERT's round trip.
_prepared: weakref.WeakKeyDictionary[psycopg.Connection[Any], set[bytes]] = weakref.WeakKeyDictionary()


def _statement_name(query: bytes) -> bytes:
    return b"th_" + hashlib.blake2b(query, digest_size=12).hexdigest().encode()


async def _prepare(conn: psycopg.Connection[Any], name: bytes, query: bytes, types: Sequence[int]) -> None:
    names = _prepared.setdefault(conn, set())
    try:
        await _exchange(conn, lambda: conn.pgconn.send_prepare(name, query, types), settle=lambda _: names.add(name))
    except _psycopg().errors.DuplicatePreparedStatement:
        pass  # prepared by a call cancelled before it knew
    names.add(name)


async def _statement(
    conn: psycopg.Connection[Any],
    query: bytes,
    params: Sequence[bytes | None],
    types: Sequence[int],
    formats: Sequence[int],
    *,
    settle: Callable[[None], None] | None = None,
) -> None:
    """Run one statement (no rows wanted) on ``conn`` in its own implicit transaction, from the Trio thread.

    On a connection in autocommit mode, outside a transaction, the statement
    commits by itself (at the protocol's sync, before the server says it is
    ready again): success means committed.  The statement is prepared on the
    connection the first time (one more round trip, once per connection),
    and again if it was deallocated meanwhile (psycopg's ``DEALLOCATE ALL``
    after a rollback).

    Raises:
        psycopg.Error: the statement failed (not committed), or the
            connection was lost (maybe committed: the connection is broken).
        trio.Cancelled: after ``settle`` when the statement completed anyway.
    """
    name = _statement_name(query)
    for attempt in (1, 2):
        if name not in _prepared.get(conn, ()):
            await _prepare(conn, name, query, types)
        try:
            await _exchange(
                conn,
                lambda: conn.pgconn.send_query_prepared(name, params, param_formats=formats, result_format=TEXT_FORMAT),
                settle=settle,
            )
        except _psycopg().errors.InvalidSqlStatementName:  # refused at bind: nothing ran
            _prepared.get(conn, set()).discard(name)
            if attempt == 2:
                raise
            continue
        return
