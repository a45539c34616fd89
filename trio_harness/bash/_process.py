"""Process groups: spawning a command as a group leader, signalling and supervising the group.

Every command runs as ``[shell, "-c", command]`` in a new session, so it leads
its own process group (pgid == pid) and the whole group is signalled at once.
A :class:`ProcessGroup` pumps both pipes into :class:`~._output.OutputStream`
tails, reaps the leader, and stops what is left of the group: SIGTERM, then,
``grace_period`` seconds later, SIGKILL if anything of it still runs.  Whether
anything still runs is read from ``/proc`` (:func:`group_alive`), because
orphaned members may linger as zombies that do not count.

Processes that leave the group (``setsid``, job control) are beyond reach while
the harness runs; if one of them keeps an output pipe open, the pipe is
abandoned shortly after the group is gone.

Every group is registered with the process's lifeline (:mod:`.._lifeline`)
from its spawn until it is settled, and every command carries the lifeline's
token in its environment: if the harness process dies, its watchdog SIGKILLs
the group and every process that kept the token, group-leavers included.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import subprocess
from collections.abc import Callable, Mapping, Sequence
from signal import SIGKILL, SIGTERM
from typing import cast

import attrs
import trio

from .._errors import BashError
from .._lifeline import forget_group, lifeline
from ._output import OutputStream
from ._records import ExitFacts

__all__ = [
    "REAP_BOUND",
    "ProcessGroup",
    "group_alive",
    "kill_group_after",
    "open_group",
    "reap_unsupervised",
    "signal_group",
    "terminate_group",
]

# Size of one read from a pipe.
_CHUNK = 256 * 1024
# Capacity asked for the stdout pipe (Linux F_SETPIPE_SZ): fewer wakeups per byte.
# Kept moderate because pipe pages count against a per-user soft limit.
_PIPE_SIZE = 256 * 1024
# Longest pause between two checks of whether a process group is still alive.
_MAX_POLL = 0.1
# Upper bound on reaping a SIGKILLed leader during a hard (cancelled) teardown.
REAP_BOUND = 5.0
# Shortest time granted to drain the pipes once the group is gone.
_MIN_DRAIN = 0.5


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group; a group that is gone (or not ours) is ignored."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def group_alive(pgid: int) -> bool:
    """Whether any process of the group is alive (zombies waiting to be reaped do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # The group exists, but orphaned members may be zombies that init has not
    # reaped yet; only a member that still runs counts.
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


async def kill_group_after(pgid: int, grace_period: float) -> None:
    """Wait up to ``grace_period`` for the process group to be gone, then SIGKILL what is left.

    Cancelled while waiting, it SIGKILLs the group at once: no grace is left to give.
    """
    try:
        with trio.move_on_after(grace_period):
            delay = 0.005
            while group_alive(pgid):
                await trio.sleep(delay)
                delay = min(delay * 2, _MAX_POLL)
            return
    except BaseException:
        signal_group(pgid, SIGKILL)
        raise
    signal_group(pgid, SIGKILL)


async def terminate_group(pgid: int, grace_period: float) -> None:
    """SIGTERM what is left of the process group, SIGKILL it after ``grace_period`` (see :func:`kill_group_after`)."""
    if not group_alive(pgid):
        return
    signal_group(pgid, SIGTERM)
    await kill_group_after(pgid, grace_period)


async def open_group(argv: Sequence[str], cwd: str, env: Mapping[str, str] | None) -> trio.Process:
    """Spawn ``argv`` as the leader of a new session and process group, both outputs piped.

    The group is registered with the lifeline; ``env`` (``None``: this
    process's environment) gets the lifeline's token.

    Raises:
        OSError: the program could not be started.
        BashError: the lifeline's watchdog could not be started.
    """
    try:
        line = lifeline()
    except OSError as exc:
        raise BashError(
            f"could not start the lifeline watchdog that kills commands if the harness dies: {exc}"
        ) from exc
    process = await trio.lowlevel.open_process(
        list(argv),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=cwd,
        # subprocess takes bytes names and values too; Trio's annotation names str only.
        env=cast("Mapping[str, str]", line.own_env()) if env is None else line.env(env),
        start_new_session=True,
    )
    line.register(process.pid)
    if isinstance(process.stdout, trio.lowlevel.FdStream):
        with contextlib.suppress(OSError):
            fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
    return process


async def reap_unsupervised(process: trio.Process) -> None:
    """SIGKILL the group of a process nobody will supervise, reap it (bounded) and close its pipes."""
    signal_group(process.pid, SIGKILL)
    with trio.CancelScope(shield=True):
        with trio.move_on_after(REAP_BOUND):
            await process.wait()
        forget_group(process.pid)
        if process.stdout is not None:
            await trio.aclose_forcefully(process.stdout)
        if process.stderr is not None:
            await trio.aclose_forcefully(process.stderr)


@attrs.define(eq=False)
class ProcessGroup:
    """The live machinery of one spawned command (foreground or background).

    :meth:`supervise` runs in the executor's nursery; escalations to SIGKILL
    are started there too.  ``done`` is set once the leader is reaped and the
    output is complete; ``settled`` once, in addition, no escalation is
    pending (then ``on_settled`` is called, once).
    """

    command: str
    process: trio.Process
    out_pipe: trio.abc.ReceiveStream
    err_pipe: trio.abc.ReceiveStream
    stdout: OutputStream
    stderr: OutputStream
    grace_period: float
    nursery: trio.Nursery
    on_settled: Callable[[ProcessGroup], None]
    done: trio.Event = attrs.field(factory=trio.Event)
    settled: trio.Event = attrs.field(factory=trio.Event)
    pipes_closed: trio.Event = attrs.field(factory=trio.Event)
    exit: ExitFacts | None = None
    leader_rc: int | None = None
    killed: bool = False
    kill_reason: str | None = None
    terminating: bool = False
    escalating: bool = False
    open_pipes: int = 2

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self, reason: str | None) -> None:
        """Record a kill request (while the leader runs) and stop the group (idempotent)."""
        if self.leader_rc is None and not self.killed:
            self.killed = True
            self.kill_reason = reason
        self.terminate()

    def terminate(self) -> None:
        """SIGTERM the group now and SIGKILL it after the grace period (once)."""
        if self.terminating:
            return
        self.terminating = True
        if self.leader_rc is not None and not group_alive(self.pid):
            return
        signal_group(self.pid, SIGTERM)
        self.escalating = True
        try:
            self.nursery.start_soon(self._escalate)
        except RuntimeError:  # the executor's nursery is gone: no grace left to give
            self.escalating = False
            signal_group(self.pid, SIGKILL)

    async def _escalate(self) -> None:
        try:
            await kill_group_after(self.pid, self.grace_period)
        finally:
            self.escalating = False
            self._check_settled()

    async def supervise(self) -> None:
        """Pump both pipes, reap the leader, stop the rest of the group, then finish."""
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self._pump, self.out_pipe, self.stdout)
                pumps.start_soon(self._pump, self.err_pipe, self.stderr)
                self.leader_rc = await self.process.wait()
                if group_alive(self.pid):
                    self.terminate()
                await self._await_pipes()
                pumps.cancel_scope.cancel()
        finally:
            if self.leader_rc is None:  # cancelled before the leader was reaped
                signal_group(self.pid, SIGKILL)
                with trio.CancelScope(shield=True), trio.move_on_after(REAP_BOUND):
                    self.leader_rc = await self.process.wait()
            self._finish()

    async def _await_pipes(self) -> None:
        """Wait for EOF on both pipes; abandon them shortly after the group is gone."""
        delay = 0.01
        while not self.pipes_closed.is_set():
            with trio.move_on_after(delay):
                await self.pipes_closed.wait()
            delay = min(delay * 2, _MAX_POLL)
            if not self.pipes_closed.is_set() and not group_alive(self.pid):
                # Whoever still holds a pipe is outside the group; give the pipes
                # a moment to drain, then stop listening.
                with trio.move_on_after(max(self.grace_period, _MIN_DRAIN)):
                    await self.pipes_closed.wait()
                return

    async def _pump(self, pipe: trio.abc.ReceiveStream, sink: OutputStream) -> None:
        try:
            while True:
                chunk = await pipe.receive_some(_CHUNK)
                if not chunk:
                    break
                sink.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            sink.eof = True
            sink.close_spill()
            self.open_pipes -= 1
            if self.open_pipes == 0:
                self.pipes_closed.set()
            await trio.aclose_forcefully(pipe)

    def _finish(self) -> None:
        rc = self.leader_rc
        self.exit = ExitFacts(
            exit_code=rc if rc is not None and rc >= 0 else None,
            signal=-rc if rc is not None and rc < 0 else None,
            killed=self.killed,
            kill_reason=self.kill_reason,
        )
        self.stdout.eof = self.stderr.eof = True
        self.stdout.close_spill()
        self.stderr.close_spill()
        self.done.set()
        self._check_settled()

    def _check_settled(self) -> None:
        if self.done.is_set() and not self.escalating and not self.settled.is_set():
            forget_group(self.pid)
            self.settled.set()
            self.on_settled(self)
