"""The parts of git directories the sandbox creates for a command, held while it runs and removed after it.

A bind mount cannot cover a path that does not exist, and git honours files a git directory need not have:
a ``commondir`` (absent in a repository's ``.git``) makes git take hooks and configuration from the git
directory it names, ``config.worktree`` is read when ``extensions.worktreeConfig`` is on, and ``hooks`` holds
the hooks.  A command that could create one would make the host's next ``git`` run its code.  So for the
duration of each sandboxed command ``_sandbox_git`` creates each missing one on the host, as git treats its
absence (``commondir``: ``.`` and a line end, the git directory itself; ``config.worktree``: empty; ``hooks``:
an empty directory), binds it read-only, and the :class:`Hold` removes it once the last command holding it
ended (docs/sandbox.rst, "Git").

Commands may run at once in the same repository (background commands, several executors, several harness
processes), so what is created is shared:

* in this process a registry counts the commands holding each part this process created (its device and
  inode), and the last to let go removes it;
* every command also holds an open descriptor on each part with a shared ``flock`` lock, and the remover
  takes the lock exclusively (without waiting) before it removes: a part another process's command holds is
  left in place (harmless: git works with it; this process removes it after a later command of its own);
* a part found changed when it would be removed (another inode, other content, a directory no longer empty:
  the host changed it, since the command could not) is left in place and logged;
* a part that was there when the command started, and not made by this process, is never removed.

After a ``kill -9`` of the harness the parts it made stay behind; they are harmless (git reads them as their
absence) and a later harness leaves them alone.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import stat
import threading
from collections.abc import Callable

import attrs
import trio

from .._errors import BashError
from ._process import group_alive

log = logging.getLogger("trio_harness.bash")

# How often to try for the shared lock while another process removes the part (it holds it for microseconds).
_LOCK_TRIES = 1000
# How often to start over when the part is removed between its creation and the lock.
_TRIES = 8
# How long to wait for a command's processes to be gone before letting go of its parts (seconds).
_GONE_BOUND = 10.0
_MAX_POLL = 0.25
# File systems where flock(2) does not work: the parts are held without a lock, and never removed.
_NO_LOCKS = frozenset((errno.ENOLCK, errno.EINVAL, errno.EOPNOTSUPP, errno.ENOSYS))


@attrs.define(eq=False)
class _Made:
    """A part this process created: where, what it holds (None: a directory), its inode, how many commands hold it."""

    path: str
    content: bytes | None
    dev: int
    ino: int
    holders: int = 0


_registry_lock = threading.Lock()
_registry: dict[str, _Made] = {}


def _refuse(path: str, why: str, exc: OSError, doing: str = "create") -> BashError:
    return BashError(
        f"the sandbox refuses to run: it could not {doing} {path!r} ({exc.strerror or exc}), which it makes for "
        f"each command and binds read-only so that a command cannot create it ({why}, and would run what a "
        "command put there outside the sandbox); make the git directory writable by the harness's user, or "
        "keep it out of the sandbox's writable paths"
    )


def _lock_shared(fd: int, path: str) -> bool:
    """Take the shared lock on ``fd``; False when the file system has none (``flock`` unsupported)."""
    for _ in range(_LOCK_TRIES):
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return True
        except BlockingIOError:
            os.sched_yield()  # another process is removing it, under its exclusive lock
        except OSError as exc:
            if exc.errno in _NO_LOCKS:
                return False
            raise
    raise BashError(
        f"the sandbox refuses to run: {path!r}, which it makes for each command, stays locked by another "
        "process removing it; try again"
    )


# Errors of a directory this user may not write into (nor may a command of the same user, with no more rights).
_UNWRITABLE = frozenset({errno.EACCES, errno.EPERM, errno.EROFS})


@attrs.define(eq=False)
class Hold:
    """What one command holds of the parts of git directories the sandbox made for it (see the module), and
    what else the sandbox made for it alone and removes after it (its ``pids`` cgroup: :meth:`after`).

    :meth:`ensure` while its command line is built, :meth:`release` once its processes are all gone
    (idempotent; :func:`release_when_gone` waits for that).
    """

    _fds: list[int] = attrs.field(factory=list)
    _made: list[tuple[_Made, int]] = attrs.field(factory=list)
    _paths: set[str] = attrs.field(factory=set)
    _after: list[Callable[[], None]] = attrs.field(factory=list)
    released: bool = False

    @property
    def empty(self) -> bool:
        """Whether it holds nothing (no sandbox, or no repository in the command's writable directories and
        no cgroup of its own)."""
        return not self._fds and not self._after

    def after(self, undo: Callable[[], None]) -> None:
        """Run ``undo`` when the hold is released (once the command's processes are all gone), after the parts
        are let go; ``undo`` reports its own failures (it must not raise)."""
        if self.released:
            raise BashError("the sandbox's hold was already released")
        self._after.append(undo)

    def ensure(self, path: str, content: bytes | None, why: str) -> None:
        """Hold ``path`` while the command runs, created (a file holding ``content``, or a directory when None)
        when it is missing.  Every command holds every such part that is as a harness makes it, made by it or
        not: one another command (of this process or another) made would otherwise be removed when that one
        ends.  One that is not (a commondir naming another directory, a hooks directory with hooks) no
        harness removes: it is not held (one descriptor less per git directory).

        Args:
            path: the part (absolute).
            content: what a created file holds, or None for a directory.
            why: why git would honour it, for the message.

        Raises:
            BashError: it could not be created or opened (the command must not run unprotected).
        """
        if self.released:
            raise BashError(f"the sandbox's hold on {path!r} was already released")
        if path in self._paths:
            return  # once per command (two writable directories may hold the same repository)
        for _ in range(_TRIES):
            created = self._create(path, content, why)
            if created is None:
                return  # the command cannot make it either: nothing to hold
            # Whatever it is (a fifo opens without waiting); a symbolic link is the caller's to follow.
            flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK | os.O_NOCTTY
            try:
                fd = os.open(path, flags)
            except FileNotFoundError:
                continue  # removed meanwhile by another process's command that ended: again
            except PermissionError as exc:
                if created:
                    raise _refuse(path, why, exc, "open") from exc
                return  # not made by a harness (what one makes, everyone may read): nothing to hold
            except OSError as exc:
                raise _refuse(path, why, exc, "open") from exc
            try:
                if not created and not _as_made(fd, content):
                    os.close(fd)  # no harness would remove it (the user's, or changed): nothing to hold
                    return
                locked = _lock_shared(fd, path)
                info = os.fstat(fd)
                now = os.lstat(path)
            except FileNotFoundError:
                os.close(fd)
                continue
            except OSError as exc:
                os.close(fd)
                raise _refuse(path, why, exc, "lock") from exc
            except BaseException:
                os.close(fd)
                raise
            if (info.st_dev, info.st_ino) != (now.st_dev, now.st_ino):
                os.close(fd)
                continue  # removed and made again meanwhile: hold the one there now
            if created:
                try:
                    _as_git_makes(fd, path, directory=content is None)
                except OSError as exc:
                    os.close(fd)
                    with contextlib.suppress(OSError):
                        (os.rmdir if content is None else os.unlink)(path)
                    raise _refuse(path, why, exc, "set the mode and owner of") from exc
            self._fds.append(fd)
            self._paths.add(path)
            with _registry_lock:
                entry = _registry.get(path)
                if created and locked:
                    entry = _registry[path] = _Made(path, content, info.st_dev, info.st_ino)
                elif created or entry is None or (entry.dev, entry.ino) != (info.st_dev, info.st_ino):
                    entry = None  # not made by this process (or never removed: no lock to share it with)
                if entry is not None:
                    entry.holders += 1
                    self._made.append((entry, fd))
            return
        raise BashError(
            f"the sandbox refuses to run: {path!r}, which it makes for each command, was removed again and "
            "again while it made it; try again"
        )

    @staticmethod
    def _create(path: str, content: bytes | None, why: str) -> bool | None:
        """Make ``path``: True when made, False when it was there; None when its directory refuses this user
        (permissions, an immutable directory, a read-only file system).  The command runs as the same user
        with no more rights (as root, without capabilities), so it cannot make it either.

        Raises:
            BashError: it could not be made for another reason (a full disk, an I/O error): the command is
                refused rather than run unprotected.
        """
        try:
            if content is None:
                os.mkdir(path, 0o755)
            else:
                fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                try:
                    if os.write(fd, content) != len(content):
                        raise OSError(errno.EIO, "a short write")
                except OSError:
                    os.unlink(path)  # never left half made: git stops on an empty commondir
                    raise
                finally:
                    os.close(fd)
        except FileExistsError:
            return False
        except OSError as exc:
            if exc.errno in _UNWRITABLE:
                return None
            raise _refuse(path, why, exc) from exc
        return True

    def release(self) -> list[str]:
        """Let go of the parts; remove those this process made that no command holds any more.

        Returns:
            What was left in place that would have been removed, and why (each also logged).
        """
        if self.released:
            return []
        self.released = True
        kept: list[str] = []
        try:
            with _registry_lock:
                for entry, fd in self._made:
                    entry.holders -= 1
                    if entry.holders == 0:
                        kept += _remove(entry, fd)
        finally:
            for fd in self._fds:
                os.close(fd)
            self._fds.clear()
            self._made.clear()
            undo, self._after = self._after, []
            for step in undo:
                step()
        for line in kept:
            log.warning("%s", line)
        return kept


def _as_made(fd: int, content: bytes | None) -> bool:
    """Whether the part open at ``fd`` is as a harness makes it (and would remove it): an empty directory, or
    a regular file holding ``content``."""
    info = os.fstat(fd)
    if content is None:
        return stat.S_ISDIR(info.st_mode) and not os.listdir(fd)
    return stat.S_ISREG(info.st_mode) and info.st_size == len(content) and os.pread(fd, len(content) + 1, 0) == content


def _as_git_makes(fd: int, path: str, *, directory: bool) -> None:
    """Give a part made for a command the mode git gives it whatever the umask (readable by everyone: a user
    whose git cannot read a commondir is stopped, "failed to read"), and, made by root, the owner and group of
    the git directory holding it (so its user may change or remove it as the rest)."""
    os.fchmod(fd, 0o755 if directory else 0o644)
    if os.geteuid() == 0:
        parent = os.stat(os.path.dirname(path))
        if (parent.st_uid, parent.st_gid) != (0, 0):
            os.fchown(fd, parent.st_uid, parent.st_gid)


def _remove(entry: _Made, fd: int) -> list[str]:
    """Remove ``entry`` (held by no command of this process) unless another process holds it or it changed."""
    path = entry.path
    if _registry.get(path) is not entry:
        return []  # replaced by a newer one (this was removed on the host, and made again)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        log.info("the sandbox leaves %r, which it made, in place for now: another process's command holds it", path)
        return []  # left for this process's next command there to remove
    try:
        now: os.stat_result | None = os.lstat(path)
    except FileNotFoundError:
        now = None
    except OSError as exc:
        del _registry[path]
        return [f"the sandbox left {path!r}, which it made for its commands, in place: {exc}"]
    del _registry[path]
    if now is None:
        return []  # removed on the host
    if (now.st_dev, now.st_ino) != (entry.dev, entry.ino):
        return [f"the sandbox left {path!r} in place: it made it for its commands, and it was replaced since"]
    try:
        if entry.content is None:
            os.rmdir(path)
        else:
            found = os.pread(fd, len(entry.content) + 1, 0)
            if found != entry.content:
                return [
                    f"the sandbox left {path!r} in place: it made it for its commands holding "
                    f"{entry.content!r}, and it holds {found[:80]!r} now"
                ]
            os.unlink(path)
    except OSError as exc:
        if exc.errno in (errno.ENOTEMPTY, errno.EEXIST):
            return [f"the sandbox left {path!r} in place: it made it empty for its commands, and it is not now"]
        return [f"the sandbox could not remove {path!r}, which it made for its commands: {exc}"]
    return []


def made_here() -> dict[str, int]:
    """The parts this process made and has not removed, and how many commands hold each (for tests)."""
    with _registry_lock:
        return {path: entry.holders for path, entry in _registry.items()}


async def release_when_gone(hold: Hold, pgid: int) -> None:
    """Release ``hold`` once no process of the command's group (``pgid``, holding the sandbox's PID 1, whose
    end takes every process of the sandbox with it) runs; after a bound, or cancelled, keep holding what is
    still running (the parts stay: harmless) and log it."""
    delay = 0.005
    with trio.move_on_after(_GONE_BOUND):
        try:
            while group_alive(pgid):
                await trio.sleep(delay)
                delay = min(delay * 2, _MAX_POLL)
        finally:
            if not group_alive(pgid):
                hold.release()
    if not hold.released:
        log.warning("the sandbox keeps the parts it made for the command of group %d: it still runs", pgid)
