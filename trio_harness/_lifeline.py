"""The lifeline: every process the harness starts dies when the harness process dies, however it dies.

One watchdog process per harness process, started with the first command or
stdio MCP server it spawns (:func:`lifeline`), holds the read end of a pipe
whose write end only the harness process holds (close-on-exec, so no child
inherits it; a ``fork`` without ``exec`` closes it in the child).  Nothing is
ever written to the pipe: its end of file is the message.  The watchdog runs
this file as a script, in its own session, ignoring SIGINT, SIGTERM and SIGHUP,
so signals aimed at the harness's terminal or process group do not reach it.
While the harness lives the watchdog sleeps in ``read``; it costs no wakeup per
command.

Two marks make a process ours:

* **its group**: the harness registers each process group it spawns (a bash
  command, an MCP server) in a registry file shared with the watchdog (an
  anonymous ``memfd``, a slot per group: its number and the clock tick right
  after its leader was spawned) and clears the slot once the group is gone;
* **a token in its environment**: every spawned process gets
  ``TRIO_HARNESS_LIFELINE=<token>`` (appended to an inherited value, ``a:b``, so a
  harness run by another harness's command stays the outer one's too); its
  children inherit it, also the ones that leave the group (``setsid``).

When the pipe reaches end of file (the harness process ended: exit, signal,
``exec``), the watchdog reads the registry and SIGKILLs every registered group
that is still ours and every process in it, every process whose environment
carries the token, and every process in the session or group such a process
leads; it scans again until :data:`_QUIET_PASSES` passes in a row find nobody
(at most :data:`_KILL_BOUND` seconds), then exits.  Each pass looks at the pids
that were not there in the previous one first: a process that keeps replacing
itself with a new session (``setsid -f "$0"`` as its last word) is seen while it
still runs, and one pass that happens to miss it does not end the hunt.
SIGKILL of a sandbox's outer ``bwrap`` and its PID 1 (both in the registered
group) ends the sandbox's PID namespace.

It never signals a process that is not ours: a process is signalled through a
pidfd opened *before* the check that made it a candidate, so a pid reused in
between is never hit; a registered group counts only while its leader's pid is
free (a group's number cannot be reused while any member lives) or holds a
process started before the group was registered.  What escapes: a process that
both left the group and was started with an environment without the token
(``env -i`` after ``setsid``), a process whose environment the watchdog may not
read (another user's), and everything when the watchdog itself is SIGKILLed
first.  If the watchdog dies while the harness lives, the next spawn starts
another (with a warning), which reads the same registry.

The harness side costs the token in the child's environment, one ``pwrite`` of
16 bytes per group started and one per group gone, and a ``waitpid`` check of
the watchdog per spawn.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Mapping

ENV_NAME = "TRIO_HARNESS_LIFELINE"
"""The environment variable carrying the tokens of the harness processes a process belongs to."""

# Seconds the watchdog keeps killing after the harness died, and the alarm past which it gives up.
_KILL_BOUND = 1.5
_ALARM = 5
# Pause between two kill passes, and how many passes in a row must find nobody before the watchdog stops.
_PASS_PAUSE = 0.01
_QUIET_PASSES = 3
# The signals a terminal or a kill of the harness's process group would send the watchdog too.
_IGNORED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# A registry slot: the group's number and the clock tick (CLOCK_BOOTTIME, as /proc's start times) after its spawn.
_SLOT = struct.Struct("qq")
_TICKS = os.sysconf("SC_CLK_TCK")

_ENV_NAME_B = ENV_NAME.encode()

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
        self._slots: dict[int, int] = {}  # pgid -> slot in the registry
        self._free: list[int] = []
        self._registry = _registry_file()
        self._fd = -1
        self.watchdog_pid: int | None = None
        try:
            self._start()
        except BaseException:
            os.close(self._registry)
            raise

    def _start(self) -> None:
        read_end, write_end = os.pipe()  # both close-on-exec
        try:
            os.set_inheritable(read_end, True)
            os.set_inheritable(self._registry, True)
            script = os.path.abspath(__file__)
            argv = [sys.executable, "-I", "-S", script, str(read_end), str(self._registry), self.token]
            actions = [(os.POSIX_SPAWN_OPEN, fd, os.devnull, os.O_RDWR, 0) for fd in (0, 1, 2)]
            # Without an outer harness's token, so that harness's watchdog leaves this one to its work.
            env = {name: value for name, value in os.environ.items() if name != ENV_NAME}
            # Blocked from the start, then ignored: the watchdog's own start-up is covered too.
            self.watchdog_pid = os.posix_spawn(
                sys.executable, argv, env, file_actions=actions, setsid=True, setsigmask=_IGNORED
            )
        except BaseException:
            os.close(write_end)
            raise
        finally:
            os.close(read_end)
            os.set_inheritable(self._registry, False)
        self._fd = write_end

    def healthy(self) -> bool:
        """Whether the watchdog runs (it is reaped here if it died)."""
        if self._fd < 0 or self.watchdog_pid is None:
            return False
        try:
            pid, _ = os.waitpid(self.watchdog_pid, os.WNOHANG)
        except ChildProcessError:  # reaped by someone else: gone too
            return False
        return pid == 0

    def revive(self) -> None:
        """Start another watchdog if this one died; it reads the same registry.

        Raises:
            OSError: the watchdog could not be started.
        """
        with self._lock:
            if self.healthy():
                return
            dead = self.watchdog_pid
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1
            self._start()
        _log.warning("the lifeline watchdog (pid %s) died; started another (pid %s)", dead, self.watchdog_pid)

    def env(self, base: Mapping[str, str]) -> dict[str, str]:
        """``base`` with the lifeline's token added."""
        env = dict(base)
        env[ENV_NAME] = self.value
        return env

    def own_env(self) -> dict[bytes, bytes] | dict[str, str]:
        """This process's environment with the token added, as bytes where CPython keeps it so.

        A spawn encodes a ``str`` environment item by item; the bytes copy
        halves what the environment costs a command.
        """
        data = getattr(os.environ, "_data", None)
        if isinstance(data, dict):
            raw: dict[bytes, bytes] = dict(data)
            raw[_ENV_NAME_B] = self.value.encode()
            return raw
        return self.env(os.environ)

    def register(self, pgid: int) -> None:
        """Kill the process group ``pgid`` (and everything in its session) if this process dies.

        Call right after the group's leader was spawned, before it is reaped.
        """
        # A leader started after this instant is not the one registered (see _kill_ours).
        ticks = int(time.clock_gettime(time.CLOCK_BOOTTIME) * _TICKS) + 1
        with self._lock:
            slot = self._slots.get(pgid)
            if slot is None:
                slot = self._free.pop() if self._free else len(self._slots)
                self._slots[pgid] = slot
            self._write(slot, pgid, ticks)

    def unregister(self, pgid: int) -> None:
        """Forget the group ``pgid`` (call once it is gone)."""
        with self._lock:
            slot = self._slots.pop(pgid, None)
            if slot is not None:
                self._write(slot, 0, 0)
                self._free.append(slot)

    def close(self) -> None:
        """Close the pipe: the watchdog acts as if this process had died (for tests)."""
        with self._lock:
            if self._fd >= 0:
                os.close(self._fd)
                self._fd = -1

    def _write(self, slot: int, pgid: int, ticks: int) -> None:
        try:
            os.pwrite(self._registry, _SLOT.pack(pgid, ticks), slot * _SLOT.size)
        except OSError as exc:  # the group runs already; its processes still carry the token
            _log.error("the lifeline registry could not be written (group %d): %s", pgid, exc)


def _registry_file() -> int:
    """An anonymous file shared with the watchdog: one slot per registered group."""
    if hasattr(os, "memfd_create"):
        with contextlib.suppress(OSError):
            return os.memfd_create("trio-harness-lifeline", os.MFD_CLOEXEC)
    with tempfile.TemporaryFile() as f:
        return os.dup(f.fileno())


_default: Lifeline | None = None
_default_lock = threading.Lock()


def lifeline() -> Lifeline:
    """The process's lifeline, its watchdog started on first use (and again if it died).

    Raises:
        OSError: the watchdog could not be started.
    """
    global _default
    current = _default
    if current is not None and current.healthy():
        return current
    with _default_lock:
        if _default is None:
            _default = Lifeline()
        else:
            _default.revive()
        return _default


def forget_group(pgid: int) -> None:
    """Tell the process's lifeline, if it was started, that the group ``pgid`` is gone."""
    if _default is not None:
        _default.unregister(pgid)


def _forget_in_child() -> None:
    """After ``fork``: the child neither holds the parent's lifeline open nor writes to its registry."""
    global _default, _default_lock
    _default_lock = threading.Lock()
    if _default is not None:
        for fd in (_default._fd, _default._registry):
            with contextlib.suppress(OSError):
                os.close(fd)
        _default._fd = _default._registry = -1
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


def _kill_ours(token: bytes, groups: Mapping[int, int], bound: float = _KILL_BOUND) -> None:
    """Kill every process that is ours (see the module docstring) until none is left or ``bound`` passed.

    ``groups`` maps each registered group to the clock tick after its leader was spawned.
    """
    me = os.getpid()
    # A registered group is ours while its leader's pid is free (the number cannot be
    # reused while any member lives), or holds a process started before it was registered.
    leaders: set[int] = set()
    for pgid, ticks in groups.items():
        now = _stat(pgid)
        if now is None or now[3] <= ticks:
            leaders.add(pgid)

    def in_group(pid: int) -> bool:
        stat = _stat(pid)
        return stat is not None and (stat[1] in leaders or stat[2] in leaders)

    def has_token(pid: int) -> bool:
        return _has_token(pid, token)

    # This runs in the watchdog process, which has no Trio loop: the real clock is the one to use.
    deadline = time.monotonic() + bound
    seen: set[int] = set()
    quiet = 0
    while True:
        for pgid in leaders:
            with contextlib.suppress(OSError):
                os.killpg(pgid, signal.SIGKILL)
        found = False
        pids = list(_pids())
        # New pids first: a process that hands over to a new one (fork, setsid, exit)
        # is caught while it lives, before the scan of the others gives it time to go.
        fresh = [pid for pid in pids if pid not in seen]
        known = [pid for pid in pids if pid in seen]
        seen = set(pids)
        for pid in fresh + known:
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
        quiet = 0 if found else quiet + 1
        if quiet >= _QUIET_PASSES or time.monotonic() >= deadline:
            return
        time.sleep(_PASS_PAUSE)


def _read_registry(fd: int) -> dict[int, int]:
    data = bytearray()
    while chunk := os.pread(fd, 1 << 16, len(data)):
        data += chunk
    groups: dict[int, int] = {}
    for offset in range(0, len(data) - _SLOT.size + 1, _SLOT.size):
        pgid, ticks = _SLOT.unpack_from(data, offset)
        if pgid > 0:
            groups[pgid] = ticks
    return groups


def _watch(fd: int, registry: int, token: str) -> None:
    """The watchdog: wait for end of file on the pipe, then kill what is ours and exit."""
    for sig in _IGNORED:
        signal.signal(sig, signal.SIG_IGN)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, _IGNORED)
    keep = sorted((fd, registry))
    os.closerange(3, keep[0])
    os.closerange(keep[0] + 1, keep[1])
    os.closerange(keep[1] + 1, 1 << 16)
    while os.read(fd, 4096):  # nothing is written; end of file is the message
        pass
    signal.alarm(_ALARM)  # never linger, whatever /proc does
    _kill_ours(token.encode(), _read_registry(registry))


if __name__ == "__main__":
    _watch(int(sys.argv[1]), int(sys.argv[2]), sys.argv[3])
