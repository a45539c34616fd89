"""A statement sent from Trio's own thread: libpq's nonblocking interface, waited for with Trio's I/O.

The group commit's statement (session/_pg_group.py) does not go through a
worker thread: :func:`send` hands it to libpq from synchronous code (no
schedule point, no thread: the server starts on it while the other flushes of
the scheduler batch still queue), and :func:`outcome` reads its result,
waiting on the connection's socket with ``trio.lowlevel.wait_readable`` /
``wait_writable``, as psycopg's own generators ask (``psycopg.generators``:
the C implementation when psycopg's binary package is installed).

A worker thread would have to take the GIL from the Trio thread to start the
statement; while the Trio thread is busy (a thousand flushes queueing) that
takes up to the interpreter's switch interval (5 ms), so a statement sent
early did not start early.

A caller cancelled while it waits (its bound ran out, the store closes)
first has the statement cancelled on the server, as :func:`._pg_threads._call`
does, and waits up to ``_CANCEL_GRACE`` seconds for it to end, so a
statement stuck on a lock does not go on holding its locks; the transaction
is rolled back unless it had reached its COMMIT (the caller treats the
outcome as unknown, as for any lost connection).  A connection whose
statement was not read to its end is left mid-statement: whoever holds it
closes it (the pool does: it is not idle).
"""

from __future__ import annotations

import contextlib
import functools
import select
from collections.abc import Generator, Sequence
from typing import TYPE_CHECKING, Any

import trio

from ._pg_schema import _psycopg
from ._pg_threads import _CANCEL_GRACE, _cancel_statement

if TYPE_CHECKING:
    import psycopg
    from psycopg import pq

_READ, _WRITE = select.POLLIN | select.POLLPRI | select.POLLERR | select.POLLHUP, select.POLLOUT


@functools.cache
def _generators() -> Any:
    from psycopg import generators

    return generators


def send(
    conn: psycopg.Connection[Any],
    query: bytes,
    params: Sequence[bytes],
    types: Sequence[int],
    formats: Sequence[int],
) -> Generator[Any, Any, list[pq.abc.PGresult]]:
    """Send ``query`` on ``conn`` now (a libpq unnamed statement, its result in the text format).

    As much of it as the socket takes is written before this returns; the
    rest is written by :func:`outcome`, which the returned generator is for.
    Raises ``psycopg.OperationalError`` when libpq could not take the
    statement (nothing of it reached the server: the connection is broken or
    busy).
    """
    pgconn = conn.pgconn
    pgconn.send_query_params(query, params, param_types=types, param_formats=formats)
    return _generators().execute(pgconn)  # type: ignore[no-any-return]


async def outcome(conn: psycopg.Connection[Any], gen: Generator[Any, Any, list[pq.abc.PGresult]]) -> pq.abc.PGresult:
    """The result of the statement :func:`send` sent on ``conn``: its rows, or its error raised.

    Raises ``psycopg.OperationalError`` when the connection failed on the
    way (the statement's outcome is unknown); a statement the server refused
    raises its ``psycopg.Error``.
    """
    pg = _psycopg()
    fd = conn.pgconn.socket
    try:
        results = await _drive(gen, fd)
    except trio.Cancelled:
        with trio.CancelScope(shield=True):
            await trio.to_thread.run_sync(_cancel_statement, conn)
            with trio.move_on_after(_CANCEL_GRACE), contextlib.suppress(pg.Error):
                await _drive(gen, fd)  # to its end: the server's answer to the cancel (or its result)
        raise
    encoding = conn.info.encoding
    for result in results:
        if result.status != pg.pq.ExecStatus.TUPLES_OK:
            raise pg.errors.error_from_result(result, encoding=encoding)
    if len(results) != 1:
        raise pg.OperationalError(f"the statement returned {len(results)} results instead of one")
    return results[0]


async def _drive(gen: Generator[Any, Any, list[pq.abc.PGresult]], fd: int) -> list[pq.abc.PGresult]:
    """Run psycopg's generator to its end, waiting on the socket ``fd`` as it asks; its results."""
    gen_module = _generators()
    try:
        wait = next(gen)  # the first step writes what is left of the statement (send wrote what the socket took)
        while True:
            if wait == gen_module.WAIT_R:
                await trio.lowlevel.wait_readable(fd)
            elif wait == gen_module.WAIT_W:
                await trio.lowlevel.wait_writable(fd)
            else:  # both: libpq still writes the statement and may have to read (a notice, an early error)
                await _readable_or_writable(fd)
            wait = gen.send(_ready(fd))
    except StopIteration as stop:
        return stop.value  # type: ignore[no-any-return]


def _ready(fd: int) -> int:
    """What the socket is ready for now (psycopg's ``Ready``: a read and a write bit)."""
    poller = select.poll()
    poller.register(fd, _READ | _WRITE)
    events = 0
    for _, mask in poller.poll(0):
        events |= mask
    gen = _generators()
    return (int(gen.READY_R) if events & _READ else 0) | (int(gen.READY_W) if events & _WRITE else 0)


async def _readable_or_writable(fd: int) -> None:
    async with trio.open_nursery() as nursery:

        async def wait(ready: Any) -> None:
            await ready(fd)
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait, trio.lowlevel.wait_readable)
        nursery.start_soon(wait, trio.lowlevel.wait_writable)
