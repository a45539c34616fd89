"""The opt-in bash sandbox: a policy record and the bubblewrap (``bwrap``) command line it becomes.

With a :class:`SandboxPolicy` on the executor, every command runs as
``/bin/sh -c <join the process bound> bwrap <policy> -- shell -c command``
(the ``sh`` execs ``bwrap``, so ``bwrap`` keeps the shell's pid): the whole
file system read-only (``--ro-bind / /``), a fresh ``/dev`` and ``/proc``, a
private, size-capped ``/tmp``, the command's writable directory (by default
its working directory) and the policy's extra paths writable, hidden paths
covered, its own PID and IPC namespaces, no network (``--unshare-net``)
unless the policy allows it, no capabilities (``--cap-drop ALL``, which
matters when the harness runs as root), and a seccomp filter
(:mod:`._seccomp`) that refuses mounts, new user namespaces, io_uring, the
keyring, terminal injection and, without network, unix sockets.  The
environment passes through unchanged.

Hidden paths stay hidden whatever commands do (docs/sandbox.rst, "Threat
model"): each is resolved (symlinks followed) and recorded (device, inode,
type) the first time it is seen; every directory between a writable
directory and a hidden path inside it is bound onto itself, so renaming it
fails (``EBUSY``) inside every sandbox; and a command is refused to start
when a recorded hidden path is gone or was replaced by a symlink or a thing
of another type.

The number of processes (threads included) a command may run is bounded:
as root with a ``pids`` cgroup of its own (:mod:`._sandbox_cgroup`; ``RLIMIT_NPROC`` does not bind root), which a
helper of the ``sh`` moves ``bwrap`` and its sandbox child into while the
sandbox waits (``--block-fd``, see ``_JOIN``); otherwise with
``RLIMIT_NPROC`` set inside the sandbox's user namespace, where it counts
only the sandbox's processes.

Process groups (docs/bash.rst "Process groups", docs/sandbox.rst): ``bwrap``
is the group leader the executor spawns, and everything inside the sandbox
stays in that group (no ``--new-session``, which would move the command into a
group the executor does not signal; the executor's own new session already
keeps the command away from any terminal).  ``--die-with-parent`` is not used
either: Trio spawns processes from a worker thread, and the parent-death signal
follows the *thread*, which retires after a few idle seconds and would SIGKILL
every sandbox it started.  SIGTERM of the group ends the outer ``bwrap`` and
reaches every process inside (the sandbox's PID 1 ignores it); the sandbox's
PID 1 keeps the group alive while anything inside runs, so the SIGKILL after
the grace period always comes, and SIGKILL of PID 1 ends the whole namespace.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._errors import BashError
from .._util import is_positive_int
from ._sandbox_cgroup import CgroupError, ProcessBound, open_bound, pids_hierarchy, sweep_stale
from ._sandbox_git import git_binds
from ._sandbox_hold import Hold, release_when_gone
from ._seccomp import UnsupportedArchitectureError, build_filter

INSTALL_HINT = (
    "install bubblewrap (Debian/Ubuntu: apt-get install bubblewrap; Fedora: dnf install bubblewrap; "
    "Arch: pacman -S bubblewrap), or run without the sandbox"
)
_NAMESPACE_HINT = (
    "bubblewrap could not create its namespaces: run as root, or allow unprivileged user namespaces "
    "(sysctl kernel.unprivileged_userns_clone=1 and user.max_user_namespaces > 0; on Ubuntu 24.04 and "
    "later kernel.apparmor_restrict_unprivileged_userns=0); a container must be allowed to create "
    "namespaces; or run without the sandbox"
)
# Hidden under every sandbox unless the policy's hide_defaults is False: credentials
# in the home directory (~/.pgpass: the PostgreSQL store's password, for libpq), and
# the password hashes a command run as root could read.
DEFAULT_HIDDEN = (
    "~/.ssh",
    "~/.gnupg",
    "~/.aws",
    "~/.config/gcloud",
    "~/.netrc",
    "~/.pgpass",
    "/etc/shadow",
    "/etc/gshadow",
)
# Bound, in seconds, on the probe run when the executor opens.
_PROBE_BOUND = 30.0
# Bytes of the probe's standard error quoted in an error message.
_PROBE_QUOTE = 2000
# The smallest process bound: sh/bwrap, the sandbox's PID 1 and the shell, with room to run one command.
_MIN_PROCESSES = 8
# The size, in bytes, of the tmpfs covering a hidden directory (it is read-only and empty).
_COVER_SIZE = 4096
# The descriptor bwrap reads the seccomp filter from.
_FILTER_FD = 3
# The shell that joins the process bound and execs bwrap (outside), or sets the
# bound and execs the command (inside); POSIX sh, so dash where /bin/sh is dash.
_SH = "/bin/sh"
# The descriptor the sandbox waits on, as root, until it is inside its pids cgroup.
_BLOCK_FD = 4
# Run by root: a helper moves bwrap and its sandbox child into the command's pids
# cgroup while bwrap builds the sandbox (the move waits for an RCU grace period of
# the kernel, a few milliseconds, which overlaps bwrap's set-up instead of adding
# to it), then lets the sandbox go on through the FIFO bwrap blocks on
# (--block-fd).  The sandbox child blocks before it starts anything, so every
# process of the command is born inside the cgroup.  $$ is bwrap's pid (the sh
# execs it); the helper is also bwrap's child, so two children means the sandbox
# child is there (the children file ends without a newline, so read fails yet sets k).
# A helper that cannot join says so and kills bwrap's process group (the sandbox
# child too: it would read the end of the FIFO and go on; bwrap leads its group,
# whose id is $$: the executor and the probe spawn it in a session of its own; were
# it not, only bwrap is killed): no command runs unbounded.
_JOIN = """c={procs} f={fifo}
(exec 5>"$f"; rm -f "$f"
no() {{ echo "the bash sandbox killed the command before it ran: $1" >&2
kill -s KILL -- -$$ 2>/dev/null || kill -KILL $$; exit 1; }}
echo $$ > "$c" || no "it could not join its pids cgroup ($c)"
n=0
while [ -d /proc/$$ ] && [ $n -lt 100000 ]; do
k=; read -r k < /proc/$$/task/$$/children
set -- $k; [ $# -ge 2 ] && break; n=$((n+1)); done
[ $# -ge 2 ] || no "its sandbox did not start"
for p in $k; do echo $p > "$c" 2>/dev/null; done
printf x >&5) &
exec "$@" {filter_fd}< {filter} {block_fd}< "$f"
"""
# Reads the sandboxed shell's credentials and limits at open (see _check_probe).
_PROBE = (
    "for f in /proc/self/status /proc/self/limits /proc/self/cgroup; do "
    "while IFS= read -r l; do printf '%s\\n' \"$l\"; done < $f; done"
)


class SandboxUnavailableError(BashError):
    """The bash sandbox cannot run here: ``bwrap`` is missing, or cannot create its namespaces.

    Raised when the executor opens (and when a sandboxed command cannot be
    started); the message names the cause and how to fix it.  There is never a
    silent fall-back to running without the sandbox, nor to a weaker one.
    """


def _paths(value: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    if isinstance(value, str | os.PathLike):
        return (os.fspath(value),)
    return tuple(os.fspath(item) for item in value)


@attrs.frozen
class SandboxPolicy:
    """What a sandboxed bash command may do (``BashRuntimeOptions(sandbox=SandboxPolicy())``).

    Always writable: the command's writable directory (the session's working
    directory for the ``bash`` tool; otherwise the command's working directory).
    Always private: ``/tmp`` (an empty ``tmpfs`` for each command).  Everything
    else is read-only.  Never: capabilities, mounts, new user namespaces,
    io_uring.  See docs/sandbox.rst.

    Attributes:
        network: allow network access (default: none, not even loopback to the host).
        unix_sockets: allow unix sockets (``socket(AF_UNIX)``); then every
            socket file the command can see can be connected to.  None (the
            default) follows ``network``: refused without network, allowed with it.
        writable: extra paths (directories or files) the command may write; they must exist.
        hidden: paths covered inside the sandbox, on top of the defaults, e.g.
            ``"~/.kube"``: a directory by an empty one, a file by an unreadable
            one (reads fail with "Permission denied"); a path that does not
            exist is skipped.  A hidden path wins over a writable one.
        hide_defaults: also hide ``DEFAULT_HIDDEN`` (``~/.ssh``,
            ``~/.gnupg``, ``~/.aws``, ``~/.config/gcloud``, ``~/.netrc``,
            ``~/.pgpass``, ``/etc/shadow``, ``/etc/gshadow``).
        hide_sessions: also hide the session store's root (the executor's
            ``session_root``; the harness passes its JSONL store's root).
            Hidden or not, it is never writable.
        protect_git: make git's hooks and configuration in each writable
            directory read-only: ``.git/hooks``, ``.git/config``,
            ``.git/config.worktree``, those of submodules (``.git/modules``)
            and linked worktrees, and a ``.git`` file (hooks and configured
            commands run outside the sandbox on the user's next ``git``);
            where a ``hooks`` or ``config`` is a symbolic link, at the place
            it leads to.  A command is refused when a symbolic link git
            follows to them lies in a writable directory (a command could
            replace it: a ``.git`` that is a link, say), or when a ``.git``
            file names a missing git directory there (docs/sandbox.rst, "Git").
        tmp_size: the size cap of ``/tmp``, in bytes; None for the kernel's
            default (half the memory).
        max_processes: how many processes (threads included) a command may
            run at once; None for no bound.
        bwrap: the bubblewrap executable, a name looked up on ``PATH`` or a path.
    """

    network: bool = False
    unix_sockets: bool | None = None
    writable: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    hidden: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    hide_defaults: bool = True
    hide_sessions: bool = True
    protect_git: bool = True
    tmp_size: int | None = 1 << 30
    max_processes: int | None = 1024
    bwrap: str = "bwrap"

    @property
    def allows_unix_sockets(self) -> bool:
        """Whether commands may create unix sockets (``unix_sockets``, or ``network`` when that is None)."""
        return self.network if self.unix_sockets is None else self.unix_sockets


def to_policy(value: SandboxPolicy | Mapping[str, Any] | bool | None) -> SandboxPolicy | None:
    """``value`` as a policy: a record as is, a dict of its fields, True for the defaults, False/None for none."""
    if value is None or value is False:
        return None
    if value is True:
        return SandboxPolicy()
    if isinstance(value, SandboxPolicy):
        return value
    if isinstance(value, Mapping):
        return SandboxPolicy(**value)
    raise TypeError(f"sandbox must be a SandboxPolicy, a dict of its fields, True or None, got {value!r}")


def describe_sandbox(policy: SandboxPolicy) -> str:
    """The paragraph the ``bash`` tool's description gains when its executor is sandboxed."""
    writable = "the session's working directory (the default workdir)"
    if policy.writable:
        writable += " and " + ", ".join(policy.writable)
    text = f" Commands run in a sandbox: only {writable} can be written; the rest of the file system is read-only"
    hidden = (["credential files such as ~/.ssh"] if policy.hide_defaults else []) + list(policy.hidden)
    if hidden:
        text += " and " + ", ".join(hidden) + " are hidden"
    if policy.protect_git:
        text += "; git's hooks and configuration (.git/hooks, .git/config and those of submodules) are read-only"
    text += (
        "; /tmp is private to each command and emptied when it ends; "
        + ("network access is allowed" if policy.network else "there is no network access")
        + ("" if policy.allows_unix_sockets else " and unix sockets cannot be created")
        + ". A write elsewhere fails with 'Read-only file system': do not retry it, write inside the "
        "working directory instead."
    )
    return text


@attrs.define
class _Seen:
    """A hidden path as first seen: where it resolved to, and what it was."""

    real: str
    dev: int
    ino: int
    kind: int  # stat.S_IFMT of the mode


def _under(path: str, root: str) -> bool:
    return path != root and path.startswith(root.rstrip("/") + "/")


def _kind_name(kind: int) -> str:
    return "directory" if kind == stat.S_IFDIR else "symlink" if kind == stat.S_IFLNK else "file"


@attrs.define(eq=False)
class Sandbox:
    """A checked policy: ``bwrap`` found, every path made absolute, the filter and the process bound ready.

    Built by :func:`open_sandbox` when the executor opens; :meth:`close` when it closes.

    Attributes:
        policy: the policy.
        bwrap: the bubblewrap executable (absolute).
        writable: the policy's extra writable paths (resolved).
        hidden: every path hidden (defaults, session root, the policy's), absolute, symlinks not followed.
        as_root: whether the harness runs as root (uid 0).
        read_only: paths read-only even inside a writable directory: the session store's root when
            it is not hidden (``hide_sessions=False``), so no command rewrites the harness's own logs.
    """

    policy: SandboxPolicy
    bwrap: str
    writable: tuple[str, ...]
    hidden: tuple[str, ...]
    as_root: bool
    read_only: tuple[str, ...] = attrs.field(default=(), kw_only=True)
    _filter_dir: str = attrs.field(repr=False)
    _bound: ProcessBound | None = attrs.field(repr=False)
    _seen: dict[str, _Seen] = attrs.field(factory=dict, repr=False)
    # Every writable directory a command of this sandbox has had: what commands could change.
    _roots: set[str] = attrs.field(factory=set, repr=False)
    # The symbolic links git's protection followed in a writable directory (path -> target when first seen).
    _links: dict[str, str] = attrs.field(factory=dict, repr=False)

    @property
    def _filter_path(self) -> str:
        return os.path.join(self._filter_dir, "seccomp.bpf")

    def close(self) -> None:
        """Remove the filter file and the process bound's cgroups (idempotent)."""
        shutil.rmtree(self._filter_dir, ignore_errors=True)
        if self._bound is not None:
            self._bound.close()

    def covered(self, roots: Iterable[str] = ()) -> list[tuple[str, int]]:
        """The hidden paths to cover now, resolved, with their kind; records what is new.

        Args:
            roots: the writable directories of the command about to start.

        Raises:
            BashError: a hidden path seen before, inside a directory some
                command could write, is gone, or was replaced by a symlink or
                by a thing of another type (its content may now be elsewhere,
                visible).  One outside every such directory, which no command
                could have moved, is forgotten until it reappears.
        """
        self._roots.update(roots)
        for path in self.hidden:
            real = os.path.realpath(path)
            if real in self._seen:
                continue
            try:
                info = os.lstat(real)
            except OSError:
                continue  # not there: nothing to hide (yet)
            self._seen[real] = _Seen(real, info.st_dev, info.st_ino, stat.S_IFMT(info.st_mode))
        covers = []
        for seen in list(self._seen.values()):
            writable = any(seen.real == root or _under(seen.real, root) for root in self._roots)
            try:
                info = os.lstat(seen.real)
            except OSError:
                if not writable:
                    del self._seen[seen.real]
                    continue
                raise BashError(
                    f"the sandbox refuses to run: hidden path {seen.real!r} was moved or removed since the "
                    "sandbox first hid it, so its content may now be visible elsewhere; put it back, "
                    "or open the harness again"
                ) from None
            kind = stat.S_IFMT(info.st_mode)
            if kind != seen.kind and not writable:
                del self._seen[seen.real]
                continue  # recorded anew by the next command
            if kind != seen.kind:
                raise BashError(
                    f"the sandbox refuses to run: hidden path {seen.real!r} was a {_kind_name(seen.kind)} and "
                    f"is now a {_kind_name(kind)} (replaced since the sandbox first hid it, so its content may "
                    "now be visible elsewhere); put it back, or open the harness again"
                )
            # The same path holding a new inode (an editor's atomic save) is hidden as it is.
            seen.dev, seen.ino = info.st_dev, info.st_ino
            covers.append((seen.real, kind))
        return covers

    def check_links(self, ran: str | None = None, roots: Sequence[str] = ()) -> None:
        """Refuse to go on when a symbolic link git follows (outside the writable directories of the command
        that followed it) was replaced, or lies in a writable directory of the command about to start.

        The first line is :func:`~._sandbox_git.git_binds`, which refuses a command when such a link lies in one
        of its writable directories; this one catches a link another command's repository follows that this
        command could replace, and one replaced on the host.

        Args:
            ran: the command that just ended, when checking after it (else: before the next one).
            roots: the writable directories of the command about to start.

        Raises:
            BashError: naming the link and what it was.
        """
        head = (
            "the sandbox refuses to run"
            if ran is None
            else f"the command {ran!r} ended, and the sandbox refuses every further command"
        )
        for path, target in self._links.items():
            root = next((root for root in roots if _under(path, root)), None)
            if root is not None:
                raise BashError(
                    f"{head}: {path!r} is a symbolic link (to {target!r}) that git follows to reach a "
                    f"repository's hooks and configuration, and the command's writable directory {root!r} holds "
                    "it, so the command could replace it and point git at files of its own, which git would run "
                    "outside the sandbox; replace the link with what it leads to (resolved), or run the command "
                    "with a writable directory that does not hold it"
                )
            try:
                now: str | None = os.readlink(path)
            except OSError:
                now = None
            if now != target:
                what = "is gone or no longer a symbolic link" if now is None else f"now points to {now!r}"
                raise BashError(
                    f"{head}: {path!r} was a symbolic link to {target!r}, which git follows "
                    f"to a repository's hooks and configuration, and {what} (a git directory of someone else's "
                    "may now be there, whose hooks and configuration git would run); review what it leads to "
                    "and make it as it was, or open the harness again"
                )

    def argv(self, command: Sequence[str], *, workdir: str, writable_dir: str | None, hold: Hold) -> list[str]:
        """The command line that runs ``command`` in ``workdir`` inside the sandbox.

        Args:
            command: the command to run inside (``[shell, "-c", command]``).
            workdir: its working directory (absolute).
            writable_dir: a directory it may write besides the policy's paths, or None.
            hold: holds the parts of git directories made for the command; the caller releases it once
                the command's processes are all gone, or when this raises (:mod:`._sandbox_hold`).

        Raises:
            BashError: a hidden path was moved or replaced (see :meth:`covered`), a symbolic
                link git's protection follows was (see :meth:`check_links`), or a part of a git
                directory to make for the command could not be made.
            SandboxUnavailableError: ``bwrap`` is gone, or the command's cgroup could not be created.
        """
        policy = self.policy
        if not os.access(self.bwrap, os.X_OK):  # sh would only say "not found" on the command's stderr
            raise SandboxUnavailableError(
                f"could not start the bash sandbox: {self.bwrap!r} is gone or not executable; {INSTALL_HINT}"
            )
        roots = [os.path.realpath(writable_dir)] if writable_dir is not None else []
        roots += [path for path in self.writable if path not in roots]
        covers = self.covered(roots)
        self.check_links(roots=roots)
        argv = [self.bwrap, "--ro-bind", "/", "/", "--dev", "/dev", "--proc", "/proc"]
        if policy.tmp_size is not None:
            argv += ["--size", str(policy.tmp_size)]
        argv += ["--tmpfs", "/tmp", "--unshare-pid", "--unshare-ipc", "--cap-drop", "ALL"]
        if not self.as_root:
            argv += ["--unshare-user", "--disable-userns"]
        if not policy.network:
            argv.append("--unshare-net")
        argv += ["--seccomp", str(_FILTER_FD)]
        # Binds come after the private /tmp, so a writable directory under /tmp
        # (a test's tmp_path) is the real one; hidden paths come last and win.
        for path in roots:
            argv += ["--bind", path, path]
        pinned: set[str] = set(roots)

        def pin(directory: str) -> list[str]:
            """Bind ``directory`` and every directory above it up to its writable roots onto themselves
            (a mount point cannot be renamed or removed)."""
            binds: list[str] = []
            for root in roots:
                chain = []
                ancestor = directory
                while _under(ancestor, root) and ancestor not in chain:
                    chain.append(ancestor)
                    ancestor = os.path.dirname(ancestor)
                for path in reversed(chain):
                    if path not in pinned:
                        pinned.add(path)
                        binds += ["--bind", path, path]
            return binds

        for real, _kind in covers:
            argv += pin(os.path.dirname(real))
        for path in self.read_only:  # the session store, when it is not hidden: read-only even where writable
            real = os.path.realpath(path)
            if os.path.lexists(real) and any(_under(real, root) for root in roots):
                argv += [*pin(os.path.dirname(real)), "--ro-bind", real, real]
                pinned.add(real)  # nothing below it is bound writable again
        if policy.protect_git:
            links: dict[str, str] = {}
            for root in roots:
                argv += git_binds(root, roots, pin, links, hold=hold)
            for path, target in links.items():
                self._links.setdefault(path, target)
        for real, kind in covers:
            if kind == stat.S_IFDIR:
                argv += ["--perms", "0555", "--size", str(_COVER_SIZE), "--tmpfs", real]
            else:
                argv += ["--ro-bind", "/dev/null", real]
        argv += ["--chdir", workdir, "--"]
        inner = list(command)
        if self._bound is None and policy.max_processes is not None:
            # Inside the sandbox's user namespace, RLIMIT_NPROC counts only its processes.
            limit = str(policy.max_processes)
            script = f'ulimit -u {limit} 2>/dev/null || ulimit -p {limit} || exit 125; exec "$@"'
            inner = [_SH, "-c", script, "sh", *inner]
        if self._bound is None:
            outer = f'exec "$@" {_FILTER_FD}< {shlex.quote(self._filter_path)}'
        else:
            try:
                procs = self._bound.new(hold)
            except CgroupError as exc:
                raise SandboxUnavailableError(str(exc)) from exc
            fifo = os.path.join(self._filter_dir, f"go-{os.path.basename(os.path.dirname(procs))}")
            with contextlib.suppress(FileNotFoundError):
                os.unlink(fifo)  # a command that never started left it
            os.mkfifo(fifo, 0o600)
            argv[1:1] = ["--block-fd", str(_BLOCK_FD)]
            outer = _JOIN.format(
                procs=shlex.quote(procs),
                fifo=shlex.quote(fifo),
                filter=shlex.quote(self._filter_path),
                filter_fd=_FILTER_FD,
                block_fd=_BLOCK_FD,
            )
        return [_SH, "-c", outer, "sh", *argv, *inner]


def _check(
    policy: SandboxPolicy, session_root: str | None
) -> tuple[str, tuple[str, ...], tuple[str, ...], tuple[str, ...]]:
    if not sys.platform.startswith("linux"):
        raise SandboxUnavailableError(
            f"the bash sandbox needs Linux (it runs commands under bubblewrap); this is {sys.platform!r}"
        )
    found = shutil.which(policy.bwrap)
    if found is None:
        where = "" if os.sep in policy.bwrap else " on PATH"
        raise SandboxUnavailableError(
            f"the bash sandbox needs bubblewrap, but {policy.bwrap!r} was not found{where}: {INSTALL_HINT}"
        )
    for name in ("tmp_size", "max_processes"):
        value = getattr(policy, name)
        if value is not None and not is_positive_int(value):
            raise BashError(f"sandbox {name} must be a positive integer or None, got {value!r}")
    if policy.max_processes is not None and policy.max_processes < _MIN_PROCESSES:
        raise BashError(
            f"sandbox max_processes must be at least {_MIN_PROCESSES} (the sandbox itself runs 3), "
            f"got {policy.max_processes!r}"
        )
    writable: list[str] = []
    for path in policy.writable:
        full = os.path.realpath(os.path.expanduser(path))
        if not os.path.exists(full):
            raise BashError(f"sandbox writable path {path!r} does not exist; create it or remove it from the policy")
        if full == "/":
            raise BashError("a sandbox cannot make '/' writable (that is the whole file system); run without one")
        writable.append(full)
    hidden = list(DEFAULT_HIDDEN) if policy.hide_defaults else []
    if policy.hide_sessions and session_root is not None:
        hidden.append(session_root)
    hidden += policy.hidden
    absolute = tuple(dict.fromkeys(os.path.abspath(os.path.expanduser(path)) for path in hidden))
    # Not hidden, the store is still never writable (a command rewriting its logs could forge its history).
    read_only = () if session_root is None or policy.hide_sessions else (os.path.abspath(session_root),)
    return os.path.abspath(found), tuple(writable), absolute, read_only


async def open_sandbox(policy: SandboxPolicy, shell: str, *, session_root: str | None = None) -> Sandbox:
    """Check ``policy``, prepare its filter and process bound, and prove with one real run that it holds.

    The caller closes the result (:meth:`Sandbox.close`).

    Args:
        policy: the policy.
        shell: the shell commands run in.
        session_root: the session store's root, hidden unless ``policy.hide_sessions`` is False.

    Raises:
        SandboxUnavailableError: not Linux, ``bwrap`` not found, no seccomp
            filter for this machine, no way to bound processes, or the probe
            failed or found the sandboxed shell with capabilities, without the
            filter or without the bound; the message says what to do.
        BashError: a setting of the policy is invalid.
    """
    bwrap, writable, hidden, read_only = _check(policy, session_root)
    try:
        program = build_filter(unix_sockets=policy.allows_unix_sockets)
    except UnsupportedArchitectureError as exc:
        raise SandboxUnavailableError(f"{exc}, so the sandbox cannot run here; run without the sandbox") from exc
    as_root = os.geteuid() == 0
    bound = None
    if as_root and policy.max_processes is not None:
        base = pids_hierarchy()
        if base is None:
            raise SandboxUnavailableError(
                "the bash sandbox bounds the processes of a command run as root with a pids cgroup "
                "(RLIMIT_NPROC does not bind root), and no writable cgroup hierarchy with the pids controller "
                "is mounted here; mount one, or set the sandbox policy's max_processes=None"
            )
        sweep_stale(base)
        try:
            bound = open_bound(base, policy.max_processes)
        except CgroupError as exc:
            raise SandboxUnavailableError(str(exc)) from exc
    filter_dir = tempfile.mkdtemp(prefix="trio-harness-sandbox-")
    sandbox = Sandbox(
        policy=policy,
        bwrap=bwrap,
        writable=writable,
        hidden=hidden,
        as_root=as_root,
        read_only=read_only,
        filter_dir=filter_dir,
        bound=bound,
    )
    try:
        _write(sandbox._filter_path, program)
        await _probe(sandbox, shell)
    except BaseException:
        sandbox.close()
        raise
    return sandbox


def _write(path: str, data: bytes) -> None:
    with open(path, "wb") as file:
        file.write(data)


async def _probe(sandbox: Sandbox, shell: str) -> None:
    hold = Hold()
    results: list[subprocess.CompletedProcess[bytes]] = []
    pgid: int | None = None

    async def run(task_status: trio.TaskStatus[trio.Process] = trio.TASK_STATUS_IGNORED) -> None:
        options: dict[str, Any] = {"capture_stdout": True, "capture_stderr": True, "check": False}
        results.append(await trio.run_process(probe, start_new_session=True, task_status=task_status, **options))

    try:
        probe = sandbox.argv([shell, "-c", _PROBE], workdir="/", writable_dir=None, hold=hold)
        with trio.move_on_after(_PROBE_BOUND) as bound:
            async with trio.open_nursery() as nursery:
                pgid = (await nursery.start(run)).pid  # it leads a group of its own
    except OSError as exc:
        raise SandboxUnavailableError(
            f"the bash sandbox cannot start {sandbox.bwrap!r}: {exc}; {INSTALL_HINT}"
        ) from exc
    finally:
        # The probe is the harness's own script: nothing of it touches git's files; its pids cgroup goes once
        # the sandbox's PID 1, which outlives bwrap a moment, is gone too.
        if pgid is not None:
            if not results:  # it did not finish: what is left of its sandbox
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(pgid, signal.SIGKILL)
            with trio.CancelScope(shield=True):
                await release_when_gone(hold, pgid)
        hold.release()
    if bound.cancelled_caught or not results:
        raise SandboxUnavailableError(
            f"the bash sandbox probe ({sandbox.bwrap!r}) did not finish in {_PROBE_BOUND:g} s"
        )
    result = results[0]
    if result.returncode != 0:
        said = result.stderr.decode("utf-8", "replace").strip()[:_PROBE_QUOTE]
        if any(word in said.lower() for word in ("namespace", "not permitted", "permission denied")):
            hint = _NAMESPACE_HINT
        else:
            hint = f"check that {sandbox.bwrap!r} is bubblewrap and that {shell!r} runs, or run without the sandbox"
        raise SandboxUnavailableError(
            f"the bash sandbox does not work here: {sandbox.bwrap!r} exited with {result.returncode} "
            f"running {shell!r} ({said or 'no error message'}); {hint}"
        )
    _check_probe(sandbox, result.stdout.decode("utf-8", "replace"))


def _check_probe(sandbox: Sandbox, report: str) -> None:
    """Refuse a sandbox whose shell kept a capability, runs without the filter, or without the process bound."""
    fields: dict[str, str] = {}
    limits = ""
    cgroups = []
    for line in report.splitlines():
        key, sep, value = line.partition(":")
        if sep and key in ("CapEff", "CapPrm", "Seccomp", "NoNewPrivs"):
            fields[key] = value.strip()
        elif line.startswith("Max processes"):
            limits = line
        elif line[:1].isdigit() and line.count(":") >= 2:
            cgroups.append(line.split(":", 2)[2])
    problems = []
    for key in ("CapEff", "CapPrm"):
        if fields.get(key) is None or int(fields[key], 16) != 0:
            problems.append(f"it still has capabilities ({key} {fields.get(key, 'unknown')})")
    if fields.get("Seccomp") != "2":
        problems.append(f"it runs without the seccomp filter (Seccomp {fields.get('Seccomp', 'unknown')})")
    if fields.get("NoNewPrivs") != "1":
        problems.append("setuid programs would regain privileges (NoNewPrivs is not set)")
    limit = sandbox.policy.max_processes
    if limit is not None:
        if sandbox._bound is not None:
            parent = "/" + os.path.basename(sandbox._bound.parent)
            if not any(path.startswith(parent + "/") for path in cgroups):
                problems.append(f"it is not in its pids cgroup under {sandbox._bound.parent!r}")
        elif limits.split()[2:4] != [str(limit), str(limit)]:
            problems.append(f"its process bound is not set ({limits.strip() or 'no Max processes line'})")
    if problems:
        raise SandboxUnavailableError(
            f"the bash sandbox does not hold here: the probe run under {sandbox.bwrap!r} found that "
            + "; ".join(problems)
            + f"; check that {sandbox.bwrap!r} is bubblewrap 0.8 or later, or run without the sandbox"
        )
