"""The ``pids`` cgroups that bound a sandboxed command's processes when the harness runs as root
(``RLIMIT_NPROC`` does not bind root): one parent per sandbox, one cgroup per command, removed once that
command ended; the cgroups a dead harness left are swept, never a live one's (see :func:`sweep_stale`)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import secrets

import attrs

from .._errors import BashError
from ._sandbox_hold import Hold

log = logging.getLogger("trio_harness.bash")


class CgroupError(BashError):
    """A cgroup could not be made; the sandbox raises it as a ``SandboxUnavailableError``."""


@attrs.define(eq=False)
class ProcessBound:
    """Per-command ``pids`` cgroups under one parent cgroup of this sandbox (root only).

    A command's cgroup is made when its command line is built and joined after it is spawned, so it is
    removed only once that command ended: :meth:`new` ties :meth:`end` to the command's :class:`Hold`, which
    the executor releases when the command's process group is gone (never when another command starts).
    One still busy then (a process of the sandbox exiting a moment later) is tried again at the next
    command and at :meth:`close`; one that cannot be removed is logged.
    """

    parent: str
    limit: int
    _live: set[str] = attrs.field(factory=set)  # cgroups of commands that have not ended
    _ended: list[str] = attrs.field(factory=list)  # cgroups of ended commands, not removed yet
    _counter: int = 0
    _closed: bool = False

    @property
    def cgroups(self) -> tuple[str, ...]:
        """The cgroups made and not removed yet: those of running commands, then those of ended ones."""
        return (*sorted(self._live), *self._ended)

    def new(self, hold: Hold) -> str:
        """A fresh cgroup for one command, removed when ``hold`` is released; returns its ``cgroup.procs`` path.

        Raises:
            SandboxUnavailableError: the cgroup could not be made or bounded.
        """
        self._remove_ended()
        self._counter += 1
        path = os.path.join(self.parent, f"c{self._counter}")
        try:
            os.mkdir(path)
            with open(os.path.join(path, "pids.max"), "w") as file:
                file.write(str(self.limit))
        except OSError as exc:
            with contextlib.suppress(OSError):
                os.rmdir(path)
            raise CgroupError(
                f"the bash sandbox could not create the pids cgroup {path!r} bounding the command's processes: "
                f"{exc}; or set the sandbox policy's max_processes=None"
            ) from exc
        self._live.add(path)
        try:
            hold.after(lambda: self.end(path))
        except BaseException:
            self.end(path)
            raise
        return os.path.join(path, "cgroup.procs")

    def end(self, path: str) -> None:
        """The command of the cgroup ``path`` ended (its processes are gone): remove the cgroup (idempotent)."""
        if path in self._live:
            self._live.discard(path)
            self._ended.append(path)
        self._remove_ended(last=self._closed)
        if self._closed and not self._live:
            self._remove_parent()  # the last command still running at close ended

    def _remove_ended(self, *, last: bool = False) -> None:
        """Remove the cgroups of ended commands; one still holding processes stays for the next try, unless
        ``last`` (then it is logged)."""
        left = []
        for path in self._ended:
            try:
                os.rmdir(path)
            except FileNotFoundError:
                log.warning("the pids cgroup %r of an ended command was already gone (removed by someone else)", path)
            except OSError as exc:
                if exc.errno == errno.EBUSY and not last:
                    left.append(path)  # a process of the ended sandbox still exiting
                else:
                    log.warning("the bash sandbox could not remove the pids cgroup %r: %s", path, exc)
        self._ended = left

    def _remove_parent(self) -> None:
        try:
            os.rmdir(self.parent)
        except FileNotFoundError:
            pass
        except OSError as exc:
            log.warning("the bash sandbox could not remove its pids cgroup %r: %s", self.parent, exc)

    def close(self) -> None:
        """Remove the cgroups of ended commands, the empty ones of the others, and the parent (idempotent); a
        command still running removes its own when it ends, and the parent with it; log what stays."""
        self._closed = True
        self._remove_ended(last=True)
        for path in sorted(self._live):  # no command joins one now: an empty one's command is gone
            try:
                os.rmdir(path)
            except FileNotFoundError:
                pass
            except OSError as exc:
                if exc.errno == errno.EBUSY:
                    continue  # still running: removed when it ends
                log.warning("the bash sandbox could not remove the pids cgroup %r: %s", path, exc)
            self._live.discard(path)
        if not self._live:
            self._remove_parent()


def _started(pid: int) -> str | None:
    """When process ``pid`` started (clock ticks after boot, telling it from a later process given the same
    pid), or None when no process has that pid."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            stat_line = file.read()
    except OSError:
        return None
    fields = stat_line[stat_line.rfind(b")") + 2 :].split()
    return fields[19].decode() if len(fields) > 19 else None


def _pid_namespace() -> str:
    """This process's PID namespace (the inode of ``/proc/self/ns/pid``): pids name processes only in it."""
    try:
        return str(os.stat("/proc/self/ns/pid").st_ino)
    except OSError:
        return "0"


def _parent_name(token: str) -> str:
    """The name of this process's parent cgroup: ``trio-harness-<pid namespace>-<pid>-<start>-<token>``, by
    which :func:`_sweep_stale` tells a live harness's cgroups (never touched) from a dead one's."""
    pid = os.getpid()
    return f"trio-harness-{_pid_namespace()}-{pid}-{_started(pid) or 0}-{token}"


def pids_hierarchy() -> str | None:
    """The mount point of a writable cgroup hierarchy with the ``pids`` controller, or None."""
    try:
        with open("/proc/self/mountinfo") as file:
            lines = file.read().splitlines()
    except OSError:
        return None
    v2 = None
    for line in lines:
        fields, _, tail = line.partition(" - ")
        parts, rest = fields.split(), tail.split()
        if len(parts) < 5 or len(rest) < 3:
            continue
        point = parts[4].replace("\\040", " ")
        if rest[0] == "cgroup" and "pids" in rest[2].split(",") and os.access(point, os.W_OK):
            return point
        if rest[0] == "cgroup2" and v2 is None:
            with contextlib.suppress(OSError), open(os.path.join(point, "cgroup.subtree_control")) as control:
                if "pids" in control.read().split() and os.access(point, os.W_OK):
                    v2 = point
    return v2


def sweep_stale(base: str) -> list[str]:
    """Remove the cgroups harnesses left when they died without closing their sandbox (``kill -9``): only
    those named by :func:`_parent_name` in this PID namespace whose process is gone (no process with that
    pid, or one started at another time).  Never a live harness's (of this process or another), nor one of
    another PID namespace, nor one in the old naming (``trio-harness-<pid>-<token>``, which cannot tell).

    Returns:
        The cgroups removed.
    """
    removed: list[str] = []
    try:
        names = os.listdir(base)
    except OSError as exc:
        log.warning("the bash sandbox could not list %r to remove cgroups dead harnesses left: %s", base, exc)
        return removed
    namespace = _pid_namespace()
    for name in names:
        parts = name.split("-")
        if len(parts) != 6 or parts[:2] != ["trio", "harness"] or not all(part.isdigit() for part in parts[2:5]):
            continue
        if parts[2] != namespace or _started(int(parts[3])) == parts[4]:
            continue
        path = os.path.join(base, name)
        try:
            for child in os.listdir(path):
                if os.path.isdir(os.path.join(path, child)):
                    os.rmdir(os.path.join(path, child))
            os.rmdir(path)
        except FileNotFoundError:
            continue  # another harness swept it meanwhile
        except OSError as exc:
            busy = exc.errno == errno.EBUSY
            log.log(
                logging.INFO if busy else logging.WARNING,
                "the bash sandbox left the pids cgroup %r of a harness that is gone: %s",
                path,
                "a command it started still runs there" if busy else exc,
            )
            continue
        removed.append(path)
    return removed


def open_bound(base: str, limit: int) -> ProcessBound:
    """Make this sandbox's parent cgroup under ``base`` (named by :func:`_parent_name`)."""
    parent = os.path.join(base, _parent_name(secrets.token_hex(4)))
    try:
        os.mkdir(parent)
        control = os.path.join(parent, "cgroup.subtree_control")
        if os.path.exists(control):  # cgroup v2: the commands' cgroups below it get pids.max
            with open(control, "w") as file:
                file.write("+pids")
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.rmdir(parent)
        raise CgroupError(
            f"the bash sandbox could not create the pids cgroup {parent!r}: {exc}; "
            "or set the sandbox policy's max_processes=None"
        ) from exc
    return ProcessBound(parent, limit)
