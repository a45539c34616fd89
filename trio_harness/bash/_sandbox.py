"""The opt-in bash sandbox: a policy record and the bubblewrap (``bwrap``) command line it becomes.

With a :class:`SandboxPolicy` on the executor, every command runs as
``bwrap <policy> -- shell -c command``: the whole file system read-only
(``--ro-bind / /``), a fresh ``/dev`` and ``/proc``, a private ``/tmp``
(``--tmpfs /tmp``), the command's writable directory (by default its working
directory) and the policy's extra paths writable, hidden paths covered by an
empty ``tmpfs``, its own PID and IPC namespaces, and no network
(``--unshare-net``) unless the policy allows it.  The environment passes
through unchanged.

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

import os
import shutil
import sys
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import attrs
import trio

from .._errors import BashError

__all__ = [
    "INSTALL_HINT",
    "Sandbox",
    "SandboxPolicy",
    "SandboxUnavailableError",
    "check_sandbox",
    "describe_sandbox",
    "probe_sandbox",
    "to_policy",
]

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
# Bound, in seconds, on the probe run when the executor opens.
_PROBE_BOUND = 30.0
# Bytes of the probe's standard error quoted in an error message.
_PROBE_QUOTE = 2000


class SandboxUnavailableError(BashError):
    """The bash sandbox cannot run here: ``bwrap`` is missing, or cannot create its namespaces.

    Raised when the executor opens (and when a sandboxed command cannot be
    started); the message names the cause and how to fix it.  There is never a
    silent fall-back to running without the sandbox.
    """


def _paths(value: str | os.PathLike[str] | Iterable[str | os.PathLike[str]]) -> tuple[str, ...]:
    if isinstance(value, str | os.PathLike):
        return (os.fspath(value),)
    return tuple(os.fspath(item) for item in value)


@attrs.frozen
class SandboxPolicy:
    """What a sandboxed bash command may do (``BashOptions(sandbox=SandboxPolicy())``).

    Always writable: the command's writable directory (the session's working
    directory for the ``bash`` tool; otherwise the command's working directory).
    Always private: ``/tmp`` (an empty ``tmpfs`` for each command).  Everything
    else is read-only.  See docs/sandbox.rst.

    Attributes:
        network: allow network access (default: none, not even loopback to the host).
        writable: extra paths (directories or files) the command may write; they must exist.
        hidden: paths covered inside the sandbox, e.g. ``"~/.ssh"``: a
            directory by an empty one, a file by an unreadable one (reads fail
            with "Permission denied"); a path that does not exist is skipped.
            A hidden path wins over a writable one.
        bwrap: the bubblewrap executable, a name looked up on ``PATH`` or a path.
    """

    network: bool = False
    writable: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    hidden: tuple[str, ...] = attrs.field(default=(), converter=_paths)
    bwrap: str = "bwrap"


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
    if policy.hidden:
        text += " and " + ", ".join(policy.hidden) + " are hidden"
    text += (
        "; /tmp is private to each command and emptied when it ends; "
        + ("network access is allowed" if policy.network else "there is no network access")
        + ". A write elsewhere fails with 'Read-only file system': do not retry it, write inside the "
        "working directory instead."
    )
    return text


@attrs.frozen
class Sandbox:
    """A checked policy: the ``bwrap`` executable found and every path made absolute.

    Built by :func:`check_sandbox` when the executor opens.
    """

    policy: SandboxPolicy
    bwrap: str
    writable: tuple[str, ...]
    hidden: tuple[str, ...]

    def argv(self, command: Sequence[str], *, workdir: str, writable_dir: str | None) -> list[str]:
        """The ``bwrap`` command line that runs ``command`` in ``workdir`` inside the sandbox.

        Args:
            command: the command to run inside (``[shell, "-c", command]``).
            workdir: its working directory (absolute).
            writable_dir: a directory it may write besides the policy's paths, or None.
        """
        argv = [
            self.bwrap,
            "--ro-bind", "/", "/",
            "--dev", "/dev",
            "--proc", "/proc",
            "--tmpfs", "/tmp",
            "--unshare-pid",
            "--unshare-ipc",
        ]  # fmt: skip
        if not self.policy.network:
            argv.append("--unshare-net")
        # Binds come after the private /tmp, so a writable directory under /tmp
        # (a test's tmp_path) is the real one; hidden paths come last and win.
        writable = [os.path.realpath(writable_dir)] if writable_dir is not None else []
        for path in (*writable, *self.writable):
            argv += ["--bind", path, path]
        for path in self.hidden:
            if os.path.isdir(path):
                argv += ["--tmpfs", path]
            elif os.path.lexists(path):
                argv += ["--ro-bind", "/dev/null", path]
        argv += ["--chdir", workdir, "--", *command]
        return argv


def check_sandbox(policy: SandboxPolicy) -> Sandbox:
    """Check ``policy``: find ``bwrap`` and make every path absolute.

    Raises:
        SandboxUnavailableError: not Linux, or ``bwrap`` not found; the message
            says how to install it.
        BashError: a writable path does not exist.
    """
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
    writable: list[str] = []
    for path in policy.writable:
        full = os.path.realpath(os.path.expanduser(path))
        if not os.path.exists(full):
            raise BashError(f"sandbox writable path {path!r} does not exist; create it or remove it from the policy")
        if full == "/":
            raise BashError("a sandbox cannot make '/' writable (that is the whole file system); run without one")
        writable.append(full)
    hidden = tuple(os.path.abspath(os.path.expanduser(path)) for path in policy.hidden)
    return Sandbox(policy=policy, bwrap=os.path.abspath(found), writable=tuple(writable), hidden=hidden)


async def probe_sandbox(sandbox: Sandbox, shell: str) -> None:
    """Prove, with one real run of ``shell`` inside the sandbox, that ``bwrap`` works here.

    Raises:
        SandboxUnavailableError: the probe could not start or failed (typically:
            namespaces cannot be created); the message says what to do.
    """
    probe = sandbox.argv([shell, "-c", "exit 0"], workdir="/", writable_dir=None)
    try:
        with trio.move_on_after(_PROBE_BOUND) as bound:
            result = await trio.run_process(probe, capture_stdout=True, capture_stderr=True, check=False)
    except OSError as exc:
        raise SandboxUnavailableError(
            f"the bash sandbox cannot start {sandbox.bwrap!r}: {exc}; {INSTALL_HINT}"
        ) from exc
    if bound.cancelled_caught:
        raise SandboxUnavailableError(
            f"the bash sandbox probe ({sandbox.bwrap!r}) did not finish in {_PROBE_BOUND:g} s"
        )
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
