"""The lifeline: every process the harness starts dies when the harness process dies, however it dies.

One watchdog process per harness process, started with the first command or
stdio MCP server it spawns (:func:`lifeline`), holds the read end of a pipe
whose write end only the harness process holds (close-on-exec, so no child
inherits it; a ``fork`` without ``exec`` closes it in the child).  The watchdog
runs this file as a script, in its own session, ignoring SIGINT, SIGTERM and
SIGHUP, so signals aimed at the harness's terminal or process group do not reach
it.  While the harness lives the watchdog only reads the pipe.

Two marks make a process ours:

* **its group**: the harness registers each process group it spawns (a bash
  command, an MCP server: ``+PGID``) and forgets it once the group is gone
  (``-PGID``); the watchdog notes the leader's start time when told;
* **a token in its environment**: every spawned process gets
  ``TRIO_HARNESS_LIFELINE=<token>`` (appended to an inherited value, ``a:b``, so a
  harness run by another harness's command stays the outer one's too); its
  children inherit it, also the ones that leave the group (``setsid``).

When the pipe reaches end of file (the harness process ended: exit, signal,
``exec``), the watchdog SIGKILLs every registered group that is still ours and
every process in it, every process whose environment carries the token, and
every process in the session or group such a process leads; it scans again
until a pass finds nobody (at most :data:`_KILL_BOUND` seconds), then exits.
SIGKILL of a sandbox's outer ``bwrap`` and its PID 1 (both in the registered
group) ends the sandbox's PID namespace.

It never signals a process that is not ours: a process is signalled through a
pidfd opened *before* the check that made it a candidate, so a pid reused in
between is never hit; a registered group counts only while its leader's pid is
free (a group's number cannot be reused while any member lives) or still holds
the leader with the start time noted.  What escapes: a process that both left
the group and was started with an environment without the token (``env -i``
after ``setsid``), a process whose environment the watchdog may not read
(another user's), and everything when the watchdog itself is SIGKILLed first.

The harness side costs one small write to a pipe per group started and one per
group gone, and the token in the child's environment.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping

__all__ = ["ENV_NAME", "Lifeline", "forget_group", "lifeline"]

ENV_NAME = "TRIO_HARNESS_LIFELINE"
"""The environment variable carrying the tokens of the harness processes a process belongs to."""

# Seconds the watchdog keeps killing after the harness died, and the alarm past which it gives up.
_KILL_BOUND = 1.5
_ALARM = 5
# Pause between two kill passes.
_PASS_PAUSE = 0.01
# The signals a terminal or a kill of the harness's process group would send the watchdog too.
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

_log = logging.getLogger(__name__)


class Lifeline:
    """The harness side of one watchdog: registers groups, marks environments.

    Use :func:`lifeline` for the process's own; a separate instance (its own
    token and watchdog) is for tests.  Thread-safe.
    """

    def __init__(self, token: str | None = None) -> None:
        self.token = secrets.token_hex(16) if token is None else token
        inherited = os.environ.get(ENV_NAME)
        self.value = f"{inherited}:{self.token}" if inherited else self.token
        self._lock = threading.Lock()
        self._groups: set[int] = set()
        self._backlog = b""
        self._fd = -1
        self.watchdog_pid: int | None = None
        self._start()

    def _start(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec
        try:
            os.set_inheritable(read_end, True)
            argv = [sys.executable, "-I", "-S", os.path.abspath(__file__), str(read_end), self.token]
            null = os.devnull
            actions = [(os.POSIX_SPAWN_OPEN, fd, null, os.O_RDWR, 0) for fd in (0, 1, 2)]
            # Blocked from the start, then ignored: the watchdog's own start-up is covered too.
            self.watchdog_pid = os.posix_spawn(
                sys.executable, argv, os.environ, file_actions=actions, setsid=True, setsigmask=_IGNORED
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
        os.set_blocking(write_end, False)
        self._fd = write_end

    def env(self, base: Mapping[str, str] | None) -> dict[str, str]:
        """``base`` (``None``: this process's environment) with the lifeline's token added."""
        env = dict(os.environ if base is None else base)
        env[ENV_NAME] = self.value
        return env

    def register(self, pgid: int) -> None:
        """Kill the process group ``pgid`` (and everything in its session) if this process dies."""
        with self._lock:
            self._groups.add(pgid)
            self._send(b"+%d\n" % pgid)

    def unregister(self, pgid: int) -> None:
        """Forget the group ``pgid`` (call once it is gone)."""
        with self._lock:
            if pgid in self._groups:
                self._groups.discard(pgid)
                self._send(b"-%d\n" % pgid)

    def close(self) -> None:
        """Close the pipe: the watchdog acts as if this process had died (for tests)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    @property
    def broken(self) -> bool:
        """Whether the watchdog is gone and could not be replaced (nothing is covered any more)."""
        return self._fd < 0

    def revive(self) -> None:
        """Start a new watchdog after a failed replacement and tell it every group.

        Raises:
            OSError: the watchdog could not be started.
        """
        with self._lock:
            if self._fd < 0:
                self._start()
                self._send(b"".join(b"+%d\n" % pgid for pgid in sorted(self._groups)))

    def _send(self, message: bytes) -> None:
        if self._fd < 0:
            return
        data = self._backlog + message
        try:
            written = os.write(self._fd, data)
        except BlockingIOError:  # the watchdog is behind: keep the message for the next write
            written = 0
        except BrokenPipeError:
            self._replace()
            return
        self._backlog = data[written:]

    def _replace(self) -> None:
        """The watchdog died while this process lives: start another and tell it every group."""
        dead = self.watchdog_pid
        with contextlib.suppress(OSError):
            if dead is not None:
                os.waitpid(dead, os.WNOHANG)
        os.close(self._fd)
        self._fd = -1
        self._backlog = b""
        try:
            self._start()
        except OSError as exc:
            # The group that was being registered runs already; the next spawn
            # retries the start and fails if it cannot (lifeline()).
            _log.error("the lifeline watchdog (pid %s) died and no other could be started: %s", dead, exc)
            return
        _log.warning("the lifeline watchdog (pid %s) died; started another (pid %s)", dead, self.watchdog_pid)
        self._send(b"".join(b"+%d\n" % pgid for pgid in sorted(self._groups)))


_default: Lifeline | None = None
_default_lock = threading.Lock()


def lifeline() -> Lifeline:
    """The process's lifeline, its watchdog started on first use.

    Raises:
        OSError: the watchdog could not be started.
    """
    global _default
    current = _default
    if current is not None and not current.broken:
        return current
    with _default_lock:
        if _default is None:
            _default = Lifeline()
        elif _default.broken:
            _default.revive()
        return _default


def forget_group(pgid: int) -> None:
    """Tell the process's lifeline, if it was started, that the group ``pgid`` is gone."""
    if _default is not None:
        _default.unregister(pgid)


def _forget_in_child() -> None:
    """After ``fork``: the child neither holds the parent's lifeline open nor writes to it."""
    global _default, _default_lock
    _default_lock = threading.Lock()
    if _default is not None:
        with contextlib.suppress(OSError):
            os.close(_default._fd)
        _default._fd = -1
        _default = None


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_in_child)


# ------------------------------------------------------------------ the watchdog side


def _stat(pid: int) -> tuple[bytes, int, int, int] | None:
    """``(state, pgid, sid, start time)`` of ``pid`` from ``/proc``; None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rfind(b")") + 2 :].split()
    try:
        return fields[0], int(fields[2]), int(fields[3]), int(fields[19])
    except (IndexError, ValueError):
        return None


def _has_token(pid: int, token: bytes) -> bool:
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            environ = f.read()
    except OSError:
        return False
    key = ENV_NAME.encode() + b"="
    for entry in environ.split(b"\0"):
        if entry.startswith(key):
            return token in entry[len(key) :].split(b":")
    return False


def _pids() -> Iterator[int]:
    try:
        names = os.listdir("/proc")
    except OSError:
        return
    for name in names:
        if name.isdigit():
            yield int(name)


def _signal_checked(pid: int, ours: Callable[[int], bool]) -> None:
    """SIGKILL ``pid`` if ``ours(pid)``, asked once a pidfd to it is open, says it is ours."""
    pidfd = -1
    with contextlib.suppress(OSError):
        pidfd = os.pidfd_open(pid)
    try:
        if not ours(pid):
            return
        with contextlib.suppress(OSError):
            if pidfd >= 0:
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            else:  # no pidfds here: the check and the kill are as close as they can be
                os.kill(pid, signal.SIGKILL)
    finally:
        if pidfd >= 0:
            os.close(pidfd)


def _kill_ours(token: bytes, groups: Mapping[int, int | None], bound: float = _KILL_BOUND) -> None:
    """Kill every process that is ours (see the module docstring) until none is left or ``bound`` passed."""
    me = os.getpid()
    # A registered group is ours while its leader's pid is free, or still holds the leader noted.
    leaders: set[int] = set()
    for pgid, start in groups.items():
        now = _stat(pgid)
        if now is None or (start is not None and now[3] == start):
            leaders.add(pgid)

    def in_group(pid: int) -> bool:
        stat = _stat(pid)
        return stat is not None and (stat[1] in leaders or stat[2] in leaders)

    def has_token(pid: int) -> bool:
        return _has_token(pid, token)

    deadline = time.monotonic() + bound
    while True:
        for pgid in leaders:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        found = False
        for pid in _pids():
            if pid == me:
                continue
            stat = _stat(pid)
            if stat is None or stat[0] in (b"Z", b"X"):
                continue
            if stat[1] in leaders or stat[2] in leaders:
                found = True
                _signal_checked(pid, in_group)
            elif _has_token(pid, token):
                found = True
                # A process with the token leads only what descends from it: its session and group.
                if stat[2] == pid or stat[1] == pid:
                    leaders.add(pid)
                _signal_checked(pid, has_token)
        if not found or time.monotonic() >= deadline:
            return
        time.sleep(_PASS_PAUSE)


def _watch(fd: int, token: str) -> None:
    """The watchdog: follow registrations until end of file, then kill what is ours and exit."""
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
    os.closerange(3, fd)
    os.closerange(fd + 1, 1 << 16)
    groups: dict[int, int | None] = {}
    pending = b""
    while True:
        data = os.read(fd, 65536)
        if not data:
            break
        *lines, pending = (pending + data).split(b"\n")
        for line in lines:
            with contextlib.suppress(ValueError):
                pgid = int(line[1:])
                if line.startswith(b"+"):
                    stat = _stat(pgid)
                    groups[pgid] = None if stat is None else stat[3]
                elif line.startswith(b"-"):
                    groups.pop(pgid, None)
    signal.alarm(_ALARM)  # never linger, whatever /proc does
    _kill_ours(token.encode(), groups)


if __name__ == "__main__":
    _watch(int(sys.argv[1]), sys.argv[2])
