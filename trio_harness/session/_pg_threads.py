"""Synchronous psycopg 3 on Trio's worker threads, cancellation-safely, and a pool of its connections.

psycopg's asyncio connection does not run under Trio, so every statement is a
blocking call run by ``trio.to_thread.run_sync``.  A thread cannot be
interrupted, so a cancelled call (:func:`_call`) stops waiting at once; a job
whose thread had not begun is dropped (it never runs); otherwise the
statement is cancelled on the server (``cancel_safe``, the socket shut when
the server does not act on it), the thread waited for (shielded) and the
transaction rolled back, so nothing cancelled is half-committed.

Nothing here knows of sessions: the session store (:mod:`._postgres`) and
its writers (:mod:`._pg_writer`) build on it.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
import select
import socket
import threading
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Generic, TypeVar

import attrs
import trio

if TYPE_CHECKING:
    import psycopg

log = logging.getLogger("trio_harness.session.postgres")

T = TypeVar("T")


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
    # Set in Trio once the thread of a job begun by _start_call is done with it.
    arrived: trio.Event | None = None

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


def worth_retrying(conn: psycopg.Connection[Any], exc: BaseException, *, retry: bool) -> bool:
    """Whether a statement that failed with ``exc`` is to be run once more on a new connection.

    Only when ``conn`` was lost; then always when ``retry`` (reads), else
    only when nothing of it reached the server (sending it failed).
    """
    return (conn.broken or conn.closed) and (retry or str(exc).startswith("sending"))


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
    return await _wait(conn, job, functools.partial(trio.to_thread.run_sync, job.run, abandon_on_cancel=True), settle)


def _start_call(fn: Callable[[], T]) -> _Job[T]:
    """Begin ``fn`` on a worker thread now, from synchronous code in Trio; await it with :func:`_await_call`.

    For a caller that must not reach a schedule point before the statement
    is under way (a group commit sent by the flush that filled it, while the
    other flushes of its batch are still queueing).
    """
    job: _Job[T] = _Job(fn)
    arrived = trio.Event()
    token = trio.lowlevel.current_trio_token()

    def deliver(_: object) -> None:
        with contextlib.suppress(trio.RunFinishedError):
            token.run_sync_soon(arrived.set)

    job.arrived = arrived
    trio.lowlevel.start_thread_soon(job.run, deliver, name="trio_harness postgres statement")
    return job


async def _await_call(conn: psycopg.Connection[Any], job: _Job[T]) -> T:
    """The result of a job begun by :func:`_start_call`, waited for as :func:`_call` waits (cancellation-safely)."""
    assert job.arrived is not None
    return await _wait(conn, job, job.arrived.wait, None)


async def _wait(
    conn: psycopg.Connection[Any],
    job: _Job[T],
    run: Callable[[], Awaitable[object]],
    settle: Callable[[T], None] | None,
) -> T:
    try:
        await run()
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


async def _open_connection(connect: Callable[[], psycopg.Connection[Any]]) -> psycopg.Connection[Any]:
    """A new connection made by ``connect`` on a worker thread.

    A cancelled caller stops waiting at once (the thread is abandoned);
    whichever side comes second closes the connection: the thread if the
    caller left first, the caller if the thread had already handed it over
    (Trio then drops the result).
    """
    lock = threading.Lock()
    abandoned = False
    handed: list[psycopg.Connection[Any]] = []

    def run() -> psycopg.Connection[Any] | None:
        conn = connect()
        with lock:
            if abandoned:
                conn.close()
                return None
            handed.append(conn)
        return conn

    try:
        conn = await trio.to_thread.run_sync(run, abandon_on_cancel=True)
    except BaseException:
        with lock:
            abandoned = True
            leftover = list(handed)
        for made in leftover:
            made.close()
        raise
    assert conn is not None
    return conn


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


# ---------------------------------------------------------------- the pool


@attrs.define(eq=False)
class _Pool:
    """Up to ``size`` idle connections kept for reuse, and at most ``size`` lent at once by :meth:`connection`.

    A connection taken with :meth:`take` instead (one held for long, as a
    session's writer holds its own) does not count against ``size``; it is
    given back with :meth:`give_back`, which keeps it only when it is idle,
    healthy and there is room.  A connection idle for more than
    ``probe_after`` seconds is probed with a round trip before reuse.
    """

    connect: Callable[[], Awaitable[psycopg.Connection[Any]]]
    size: int
    probe_after: float
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

    def lend_nowait(self) -> psycopg.Connection[Any] | None:
        """A connection lent as :meth:`connection` lends one, without waiting: None unless one is idle and fresh.

        Fresh: used within ``probe_after`` and quiet (no probe needed).  Give
        it back with :meth:`give_back_lent`.
        """
        try:
            self._slots.acquire_nowait()
        except trio.WouldBlock:
            return None
        if self._idle:
            conn, since = self._idle[-1]
            if trio.current_time() - since <= self.probe_after and not (conn.closed or conn.broken) and _quiet(conn):
                self._idle.pop()
                return conn
        self._slots.release()
        return None

    def give_back_lent(self, conn: psycopg.Connection[Any]) -> None:
        """Give back a connection :meth:`lend_nowait` lent."""
        try:
            self.give_back(conn)
        finally:
            self._slots.release()

    async def take(self) -> psycopg.Connection[Any]:
        import psycopg

        while self._idle:
            conn, since = self._idle.pop()
            if conn.closed or conn.broken or not _quiet(conn):
                conn.close()
                continue
            if trio.current_time() - since > self.probe_after:
                # Idle a while: the server may have dropped it meanwhile.
                try:
                    await _call(conn, _execute(conn, "SELECT 1"))
                except psycopg.Error:
                    conn.close()
                    continue
            return conn
        return await self.connect()

    def give_back(self, conn: psycopg.Connection[Any]) -> None:
        import psycopg

        usable = (
            not self.closed
            and not conn.closed
            and not conn.broken
            and conn.info.transaction_status == psycopg.pq.TransactionStatus.IDLE
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
