"""Escapes from the bash sandbox, tried for real: run in the test process (as root in CI) and as ``nobody``.

Usage::

    python _sandbox_attacks.py WORKDIR OUTSIDE [NAME ...]

``WORKDIR`` is the commands' writable directory and ``OUTSIDE`` a host
directory outside ``/tmp`` (visible, read-only, inside the sandbox); both
must be writable by the user running this.  Prints one JSON object: for each
attack, ``{"escaped": bool, "evidence": str}``, where ``escaped`` is decided
outside the sandbox (a file appeared on the host, a listener was reached, a
secret was printed).  :func:`run_attacks` is the same thing for a test.

The attacks stay harmless where a sandbox fails open: the fork bomb forks at
most 510 processes, each sleeping 3 s; the network attacks dial listeners this
process opened on 127.0.0.1 and in ``OUTSIDE``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import trio

from trio_harness.bash import (
    BashError,
    BashExecutor,
    BashRequest,
    BashRuntimeOptions,
    SandboxPolicy,
    open_bash_executor,
)

SECRET = "hunter2-secret"
MAX_PROCESSES = 32

_BOMB = """
import os, time
def bomb(depth):
    for _ in range(2):
        if depth == 0:
            return
        try:
            pid = os.fork()
        except OSError:
            print("refused", flush=True)
            continue
        if pid == 0:
            print("forked", flush=True)
            bomb(depth - 1)
            time.sleep(3)
            os._exit(0)
bomb(8)
"""

_TIOCSTI = """
import fcntl, os, termios
main, tty = os.openpty()
fcntl.ioctl(tty, termios.TIOCSTI, b"x")
print("INJECTED")
"""

_UNIX = """
import socket, sys
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.connect(sys.argv[1])
s.sendall(b"hello")
print("CONNECTED")
"""

_EVIL_HOP = (
    "rm hop && mkdir -p evil/meta/hooks && echo 'ref: refs/heads/main' > evil/meta/HEAD &&"
    " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > evil/meta/config && ln -s evil hop"
)

# A git directory of the command's own whose config runs its code on the host's next git status.
_EVIL_COMMON = (
    "mkdir -p evil/objects evil/refs evil/hooks && printf '[core]\\n\\tfsmonitor = touch pwned\\n' > evil/config"
)

# name -> commands (run one after the other in WORKDIR); {outside}, {port}, {python} are filled in.
ATTACKS: dict[str, list[str]] = {
    "write outside": ["echo pwned > {outside}/written"],
    "remount / read-write": ["mount -o remount,rw / ; echo pwned > {outside}/remounted"],
    "umount a hidden path's cover": [
        "umount {outside}/secrets; umount {outside}/token; umount -l {outside}/secrets;"
        " cat {outside}/secrets/key {outside}/token"
    ],
    "umount /proc and nsenter the host's network": [
        "umount /proc || umount -l /proc; for p in /proc/[0-9]*; do"
        " nsenter --net=$p/ns/net bash -c 'echo hi > /dev/tcp/127.0.0.1/{port}' 2>/dev/null && break; done"
    ],
    "remount /dev/pts": [
        "mount -t devpts -o remount,mode=666,ptmxmode=666 devpts /dev/pts && echo MOUNTED;"
        " mount -t devpts -o newinstance devpts /dev/pts && echo MOUNTED"
    ],
    "TIOCSTI into a terminal": ["{python} -c '" + _TIOCSTI + "'"],
    "a new user namespace": [
        "unshare --user --map-root-user --mount sh -c 'mount -t tmpfs x {outside} && echo MOUNTED'"
    ],
    "connect to a unix socket on the read-only root": ["{python} -c '" + _UNIX + "' {outside}/agent.sock"],
    "rename a hidden path's parent": ["mv conf1 conf1.moved", "cat conf1.moved/secret.env conf1/secret.env"],
    "swap a symlinked ancestor of a hidden path": ["rm link && mkdir link", "cat real/secret.env"],
    "hard-link a hidden file": ["ln conf2/secret.env stolen; cp conf2/secret.env copied", "cat stolen copied"],
    "leave the process bound's cgroup": [
        "for f in /sys/fs/cgroup/pids/cgroup.procs /sys/fs/cgroup/cgroup.procs; do"
        " echo $$ > $f 2>/dev/null && echo ESCAPED; done"
    ],
    "fork bomb": ["{python} -c '" + _BOMB + "'"],
    "write a submodule's git hooks and config": [
        "echo 'touch pwned' > .git/modules/sub/hooks/post-checkout;"
        " echo 'touch pwned' > .git/modules/a/b/hooks/pre-commit;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/modules/sub/config;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/modules/sub/modules/inner/config",
        "mv .git/modules/sub .git/modules/sub.moved; mv .git/modules .git/modules.moved; mv .git/modules/a .git/a;"
        " rm -rf .git/modules/sub/modules/inner",
    ],
    "write git's per-worktree config": [
        "printf '[core]\\n\\thooksPath = /var/tmp\\n' > .git/config.worktree;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > .git/worktrees/w/config.worktree;"
        " echo {outside} > .git/worktrees/w/commondir; mv .git/worktrees/w .git/worktrees/w2"
    ],
    "rewrite a submodule checkout's .git file": ["echo 'gitdir: ../evil' > sub/.git; mv sub/.git sub/git; mv sub sub2"],
    "rewrite a linked worktree's .git file": ["echo 'gitdir: ../evil' > .git; mv .git git; rm -f .git"],
    # From the main worktree: .git/worktrees/w/gitdir names it (relative to .git/worktrees/w, as git reads it).
    "rewrite a linked worktree's .git file from the main worktree": [
        "echo 'gitdir: ../evil' > linked/.git; mv linked/.git linked/git; mv linked linked.moved"
    ],
    # The store is visible (hide_sessions=False) in the writable directory: still never writable.
    "forge the session log": [
        'echo \'{{"type": "approval/decided"}}\' >> sessions/s1/session.jsonl; touch sessions/s1/x.lock;'
        " mv sessions sessions.moved; rm -rf sessions/s1"
    ],
    # .git is a symbolic link to a git directory in the writable directory (as its own name, or through the link).
    "write through a symlinked .git": [
        "echo 'touch pwned' > .git/hooks/pre-commit; echo 'touch pwned' > meta/hooks/post-checkout;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/config;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> meta/config;"
        " mv meta/hooks meta/hooks.moved; mv meta meta.moved",
    ],
    # A git directory whose hooks and config are symbolic links (git-new-workdir makes such).
    "write through symlinked hooks and config": [
        "echo 'touch pwned' > .git/hooks/pre-commit; echo 'touch pwned' > shared/hooks/pre-push;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/config;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> shared/config;"
        " mv shared/hooks shared/hooks.moved; mv shared shared.moved",
    ],
    # A symbolic link cannot be a mount point: the command can replace it, and the next command must not run.
    "replace a symlinked .git": [
        "rm .git && mkdir .git && printf '[core]\\n\\tfsmonitor = touch pwned\\n' > .git/config",
        "echo RAN",
    ],
    "replace symlinked hooks": [
        "rm .git/hooks && mkdir .git/hooks && echo 'touch pwned' > .git/hooks/post-checkout",
        "echo RAN",
    ],
    # A link further along the way git goes (.git -> hop/meta, hop -> real): replacing it redirects git.
    "replace a link in a symlinked .git's chain": [_EVIL_HOP, "echo RAN"],
    "replace a link in the path a .git file names": [_EVIL_HOP, "echo RAN"],
    "replace a link on the way to symlinked hooks": [
        "rm lnk && mkdir -p evil/shared/hooks && echo 'touch pwned' > evil/shared/hooks/pre-commit && ln -s evil lnk",
        "echo RAN",
    ],
    # A .git file naming a git directory that is not there: the command makes it.
    "create the missing git directory a .git file names": [
        "mkdir -p gd/hooks && echo 'ref: refs/heads/main' > gd/HEAD &&"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > gd/config",
        "echo RAN",
    ],
    # In the background, swapped while the host runs git, put back before any check ('&': started, not run).
    "swap a symlinked .git in the background and put it back": [
        "&rm .git && mkdir -p evil/hooks && echo 'ref: refs/heads/main' > evil/HEAD &&"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > evil/config && ln -s evil .git && touch swapped &&"
        " until [ -e go ]; do sleep 0.05; done; rm .git && ln -s meta .git",
    ],
    # A submodule's git directory that is a symbolic link (git follows it).
    # A .git directory whose commondir names another git directory (relative to .git): git uses its hooks
    # and config.
    "write the common git directory a .git directory's commondir names": [
        "echo 'touch pwned' > shared/hooks/pre-commit;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> shared/config; mv shared shared.moved"
    ],
    "write through a symlinked submodule git directory": [
        "printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/modules/sub/config;"
        " echo 'touch pwned' > .git/modules/sub/hooks/pre-commit",
        "rm .git/modules/sub && mkdir -p evil/hooks && echo 'ref: refs/heads/main' > evil/HEAD &&"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > evil/config && ln -s ../../evil .git/modules/sub",
    ],
    # A link outside the writable directory (which no command can change) leading into it: allowed, and
    # the git directory it leads to is read-only.
    "write through a link outside the writable directory": [
        "echo 'touch pwned' > .git/hooks/pre-commit; echo 'touch pwned' > real/meta/hooks/post-checkout;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> real/meta/config;"
        " mv real/meta/hooks real/meta/hooks.moved; mv real/meta real/meta.moved; mv real real.moved",
    ],
    # Real repositories (REAL_GIT_ATTACKS), judged by the host's git status running the command's code.
    # A .git directory has no commondir: one naming a git directory of the command's makes git take that
    # one's config (core.fsmonitor) and hooks.
    "give a repository's .git a commondir": [
        _EVIL_COMMON + "; echo ../evil > .git/commondir; rm -f .git/commondir; mv .git/commondir commondir.moved;"
        " echo ../evil > .git/commondir"
    ],
    "give a submodule's git directory a commondir": [
        _EVIL_COMMON + "; echo ../../../evil > .git/modules/sub/commondir; rm -f .git/modules/sub/commondir;"
        " echo ../../../evil > .git/modules/sub/commondir"
    ],
    # From a process the command leaves running (out of its process group), once the command has ended.
    "give a repository's .git a commondir once the command ended": [
        _EVIL_COMMON + "; setsid timeout 20 sh -c 'until echo ../evil > .git/commondir; do :; done'"
        " < /dev/null > /dev/null 2>&1 & sleep 0.2"
    ],
    # extensions.worktreeConfig is on, and the repository has no config.worktree.
    "give a repository a config.worktree": [
        "printf '[core]\\n\\tfsmonitor = touch pwned\\n' > .git/config.worktree; rm -f .git/config.worktree;"
        " printf '[core]\\n\\tfsmonitor = touch pwned\\n' > .git/config.worktree"
    ],
}

# The attacks on real repositories made by git, and the directory each runs in (its writable directory).
REAL_GIT_ATTACKS = {
    "give a repository's .git a commondir": "realgit",
    "give a submodule's git directory a commondir": "realgit",
    "give a repository's .git a commondir once the command ended": "realgit",
    "give a repository a config.worktree": "realwt",
}

# The attacks on git's links, and the directory each runs in (its writable directory).
CHAIN_ATTACKS = {
    "replace a link in a symlinked .git's chain": "chain",
    "replace a link in the path a .git file names": "chainfile",
    "replace a link on the way to symlinked hooks": "hookchain",
    "create the missing git directory a .git file names": "missing",
    "swap a symlinked .git in the background and put it back": "bgswap",
    "write through a symlinked submodule git directory": "modlink",
    "write the common git directory a .git directory's commondir names": "commondir",
    "write through a link outside the writable directory": "viaoutside",
}

# The attacks run in a directory below WORKDIR (their writable directory), by name.
ATTACK_WORKDIRS = {
    "rewrite a linked worktree's .git file": "linked",
    "write through a symlinked .git": "linkgit",
    "write through symlinked hooks and config": "linkparts",
    "replace a symlinked .git": "linkgit",
    "replace symlinked hooks": "linkparts",
    **CHAIN_ATTACKS,
    **REAL_GIT_ATTACKS,
}

_LOG = '{"type": "session", "id": "s1"}\n'
_MODULE_CONFIG = "[core]\n\trepositoryformatversion = 0\n\tworktree = ../../../sub\n"
_GITFILE = "gitdir: ../.git/modules/sub\n"


def _git_layout(workdir: Path) -> None:
    """A repository with submodules (one named a/b, one nested), a linked worktree, worktreeConfig on."""
    git = workdir / ".git"
    for gitdir, config in (
        (git, "[core]\n\trepositoryformatversion = 1\n[extensions]\n\tworktreeConfig = true\n"),
        (git / "modules" / "sub", _MODULE_CONFIG),
        (git / "modules" / "a" / "b", "[core]\n\trepositoryformatversion = 0\n"),
        (git / "modules" / "sub" / "modules" / "inner", "[core]\n\trepositoryformatversion = 0\n"),
    ):
        gitdir.mkdir(parents=True)
        (gitdir / "HEAD").write_text("ref: refs/heads/main\n")
        (gitdir / "config").write_text(config)
    (workdir / "sub").mkdir()
    (workdir / "sub" / ".git").write_text(_GITFILE)
    (git / "worktrees" / "w").mkdir(parents=True)
    (git / "worktrees" / "w" / "HEAD").write_text("ref: refs/heads/w\n")
    (git / "worktrees" / "w" / "commondir").write_text("../..\n")
    (git / "worktrees" / "w" / "gitdir").write_text("../../../linked/.git\n")
    (workdir / "linked").mkdir()
    (workdir / "linked" / ".git").write_text(f"gitdir: {git / 'worktrees' / 'w'}\n")


_FSMONITOR = "fsmonitor"


def _link_layout(workdir: Path) -> None:
    """``linkgit``: a ``.git`` that is a symbolic link to ``meta``; ``linkparts``: a ``.git`` whose
    ``hooks`` and ``config`` are symbolic links into ``shared`` (both in the writable directory)."""
    meta = workdir / "linkgit" / "meta"
    (meta / "hooks").mkdir(parents=True)
    (meta / "HEAD").write_text("ref: refs/heads/main\n")
    (meta / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (workdir / "linkgit" / ".git").symlink_to("meta")
    parts = workdir / "linkparts"
    (parts / "shared" / "hooks").mkdir(parents=True)
    (parts / "shared" / "config").write_text("[core]\n\trepositoryformatversion = 0\n")
    (parts / ".git").mkdir()
    (parts / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (parts / ".git" / "hooks").symlink_to("../shared/hooks")
    (parts / ".git" / "config").symlink_to("../shared/config")


def _links_written(workdir: Path) -> str:
    """What of :func:`_link_layout` a command changed (empty: nothing)."""
    changed = []
    for directory in (workdir / "linkgit" / "meta", workdir / "linkparts" / "shared"):
        hooks = directory / "hooks"
        if not hooks.is_dir():
            changed.append(f"{hooks.relative_to(workdir)} is gone")
        else:
            changed += [f"{path.relative_to(workdir)} was made" for path in hooks.iterdir()]
        try:
            config = (directory / "config").read_text()
        except OSError as exc:
            config = repr(exc)
        if _FSMONITOR in config or "repositoryformatversion" not in config:
            changed.append(f"{(directory / 'config').relative_to(workdir)}: {config!r}")
    return "; ".join(changed)


def _gitdir(path: Path, config: str = "[core]\n\trepositoryformatversion = 0\n") -> None:
    (path / "hooks").mkdir(parents=True)
    (path / "HEAD").write_text("ref: refs/heads/main\n")
    (path / "config").write_text(config)


def _chain_layout(workdir: Path, outside: Path) -> None:
    """The layouts of :data:`CHAIN_ATTACKS`: links git follows, in the writable directory or outside it."""
    chain = workdir / "chain"
    _gitdir(chain / "real" / "meta")
    (chain / "hop").symlink_to("real")
    (chain / ".git").symlink_to("hop/meta")
    chainfile = workdir / "chainfile"
    _gitdir(chainfile / "real" / "meta")
    (chainfile / "hop").symlink_to("real")
    (chainfile / ".git").write_text("gitdir: hop/meta\n")
    hookchain = workdir / "hookchain"
    _gitdir(hookchain / ".git")
    (hookchain / ".git" / "hooks").rmdir()
    (hookchain / "store" / "shared" / "hooks").mkdir(parents=True)
    (hookchain / "lnk").symlink_to("store")
    (hookchain / ".git" / "hooks").symlink_to("../lnk/shared/hooks")
    (workdir / "missing").mkdir()
    (workdir / "missing" / ".git").write_text("gitdir: gd\n")
    _gitdir(workdir / "bgswap" / "meta")
    (workdir / "bgswap" / ".git").symlink_to("meta")
    modlink = workdir / "modlink"
    _gitdir(modlink / ".git")
    _gitdir(modlink / "elsewhere" / "sub")
    (modlink / ".git" / "modules").mkdir()
    (modlink / ".git" / "modules" / "sub").symlink_to("../../elsewhere/sub")
    commondir = workdir / "commondir"
    _gitdir(commondir / "shared")
    for part in ("objects", "refs"):  # what git looks for in the common directory
        (commondir / "shared" / part).mkdir()
    (commondir / ".git").mkdir()
    (commondir / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (commondir / ".git" / "commondir").write_text("../shared\n")
    viaoutside = workdir / "viaoutside"
    _gitdir(viaoutside / "real" / "meta")
    (outside / "lnk").symlink_to(viaoutside / "real")
    (viaoutside / ".git").write_text(f"gitdir: {outside / 'lnk' / 'meta'}\n")


# The host's git, as a user would run it, but without their configuration.
_GIT_ENV = {"GIT_CONFIG_NOSYSTEM": "1", "GIT_CONFIG_GLOBAL": os.devnull, "GIT_TERMINAL_PROMPT": "0"}


def _git(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    identity = ["-c", "user.name=a", "-c", "user.email=a@b", "-c", "init.defaultBranch=main"]
    return subprocess.run(
        ["git", *identity, *argv], cwd=cwd, env={**os.environ, **_GIT_ENV}, capture_output=True, text=True
    )


def _real_git_layout(workdir: Path) -> None:
    """``realgit``: a repository made by git with a submodule ``sub`` (``.git/modules/sub``), neither with a
    commondir; ``realwt``: one with extensions.worktreeConfig on and no config.worktree."""
    for step, where in (
        (["init", "-q", "sublib"], workdir),
        (["commit", "-q", "--allow-empty", "-m", "lib"], workdir / "sublib"),
        (["init", "-q", "realgit"], workdir),
        (["-c", "protocol.file.allow=always", "submodule", "add", "-q", "../sublib", "sub"], workdir / "realgit"),
        (["commit", "-q", "-m", "sub"], workdir / "realgit"),
        (["init", "-q", "realwt"], workdir),
        (["config", "extensions.worktreeConfig", "true"], workdir / "realwt"),
        (["commit", "-q", "--allow-empty", "-m", "wt"], workdir / "realwt"),
    ):
        done = _git(*step, cwd=where)
        if done.returncode != 0:
            raise RuntimeError(f"git {' '.join(step)} failed in {where}: {done.stderr}")
    for gitdir in (workdir / "realgit" / ".git", workdir / "realgit" / ".git" / "modules" / "sub"):
        assert not (gitdir / "commondir").exists()
    assert not (workdir / "realwt" / ".git" / "config.worktree").exists()


async def _real_git_ran(workdir: Path, name: str) -> str:
    """What the host's git status ran of a command's code in the repository of the attack ``name`` ('': nothing),
    once the parts the sandbox made for the command are gone (a process left running may strike then)."""
    base = workdir / REAL_GIT_ATTACKS[name]
    commondir = base / ".git" / "commondir"
    with trio.move_on_after(10):
        while commondir.is_file() and commondir.read_bytes() == b".\n":
            await trio.sleep(0.05)  # removed once the command's processes are all gone: a real process's progress
    said = []
    for where in (base, base / "sub"):
        if where.is_dir():
            done = _git("status", "--porcelain", cwd=where)
            said.append(f"git status in {where.name}: exit {done.returncode} {done.stderr.strip()}")
    ran = [str(path.relative_to(base)) for path in base.rglob("pwned")]
    return f"ran: {ran} ({'; '.join(said)})" if ran else ""


def _hostile(gitdir: Path) -> str:
    """What in the git directory ``gitdir`` (as the host's git would find it) a command planted, or ''."""
    found = []
    hooks = gitdir / "hooks"
    if hooks.is_dir():
        found += [f"{path} was made" for path in hooks.iterdir()]
    try:
        config = (gitdir / "config").read_text()
    except OSError as exc:
        config = repr(exc)
    if _FSMONITOR in config or "repositoryformatversion" not in config:
        found.append(f"{gitdir / 'config'}: {config!r}")
    return "; ".join(found)


def _chain_hostile(workdir: Path, name: str) -> str:
    """What the host's git would now run in the layout of the chain attack ``name``, or ''."""
    base = workdir / CHAIN_ATTACKS[name]
    if name == "create the missing git directory a .git file names":
        return _hostile(base / "gd") if (base / "gd").exists() else ""
    if name == "replace a link on the way to symlinked hooks":
        hooks = Path(os.path.realpath(base / ".git" / "hooks"))
        return "; ".join(f"{path} was made" for path in hooks.iterdir()) if hooks.is_dir() else ""
    if name == "write through a symlinked submodule git directory":
        return _hostile(Path(os.path.realpath(base / ".git" / "modules" / "sub")))
    if name == "replace a link in the path a .git file names":
        return _hostile(Path(os.path.realpath(base / "hop" / "meta")))
    if name == "write the common git directory a .git directory's commondir names":
        shared = base / "shared"
        return _hostile(shared) if shared.is_dir() else f"{shared} is gone"
    if name == "write through a link outside the writable directory":
        return _hostile(base / "real" / "meta")
    return _hostile(Path(os.path.realpath(base / ".git")))


def _log_intact(workdir: Path) -> bool:
    log = workdir / "sessions" / "s1" / "session.jsonl"
    return log.is_file() and log.read_text() == _LOG and not (workdir / "sessions" / "s1" / "x.lock").exists()


def _git_written(workdir: Path) -> str:
    """What of :func:`_git_layout` a command changed (empty: nothing)."""
    git = workdir / ".git"
    changed = [
        str(path.relative_to(workdir))
        for path in (
            git / "modules" / "sub" / "hooks" / "post-checkout",
            git / "modules" / "a" / "b" / "hooks" / "pre-commit",
        )
        if path.exists()
    ]
    # A rename across the binds fails (EBUSY), or mv copies (EXDEV) and cannot remove the original.
    changed += [
        f"{path.relative_to(workdir)} is gone"
        for path in (
            git / "modules" / "sub" / "config",
            git / "modules" / "a" / "b" / "config",
            git / "worktrees" / "w",
        )
        if not path.exists()
    ]
    for path, text in (
        (git / "modules" / "sub" / "config", _MODULE_CONFIG),
        (git / "modules" / "sub" / "modules" / "inner" / "config", "[core]\n\trepositoryformatversion = 0\n"),
        (git / "config.worktree", ""),  # created empty (worktreeConfig is on) by a command in the repository
        (git / "worktrees" / "w" / "config.worktree", ""),
        (git / "worktrees" / "w" / "commondir", "../..\n"),
        (workdir / "sub" / ".git", _GITFILE),
        (workdir / "linked" / ".git", f"gitdir: {git / 'worktrees' / 'w'}\n"),
    ):
        try:
            found = path.read_text()
        except FileNotFoundError:
            found = "" if path.name == "config.worktree" else "(gone)"
        except OSError as exc:
            found = repr(exc)
        if found != text:
            changed.append(f"{path.relative_to(workdir)}: {found!r}")
    return "; ".join(changed)


async def _in_background(executor: BashExecutor, command: str, where: Path, name: str, workdir: Path) -> str:
    """Start ``command`` in the background; once it says ``swapped`` (a file), look at what the host's git
    would run, then let it put things back (``go``) and wait for it."""
    process = await executor.start(executor.resolve(BashRequest(command, workdir=str(where))))
    with trio.fail_after(20):
        while process.running and not (where / "swapped").exists():
            await trio.sleep(0.05)  # a real process's progress: there is nothing to wait on
    hostile = _chain_hostile(workdir, name)
    (where / "go").touch()
    with trio.fail_after(20):
        await process.wait()
    return f"background: {process.read_output()}" + (f"\nHOSTILE while it ran: {hostile}" if hostile else "")


def prepare(workdir: Path, outside: Path) -> SandboxPolicy:
    """Plant the secrets the attacks go for; return the policy they run under."""
    (outside / "secrets").mkdir()
    (outside / "secrets" / "key").write_text(SECRET)
    (outside / "token").write_text(SECRET)
    for name in ("conf1", "conf2", "real"):
        (workdir / name).mkdir()
        (workdir / name / "secret.env").write_text(SECRET)
    (workdir / "link").symlink_to("real")
    _git_layout(workdir)
    _link_layout(workdir)
    _chain_layout(workdir, outside)
    _real_git_layout(workdir)
    (workdir / "sessions" / "s1").mkdir(parents=True)
    (workdir / "sessions" / "s1" / "session.jsonl").write_text(_LOG)
    hidden = [
        outside / "secrets",
        outside / "token",
        workdir / "conf1" / "secret.env",
        workdir / "conf2" / "secret.env",
        workdir / "link" / "secret.env",
    ]
    fields: dict[str, Any] = {"hidden": [str(path) for path in hidden], "hide_sessions": False}
    if "max_processes" in attrs.fields_dict(SandboxPolicy):  # absent from older versions, to compare
        fields["max_processes"] = MAX_PROCESSES
    return SandboxPolicy(**fields)


async def run_attacks(workdir: Path, outside: Path, names: list[str] | None = None) -> dict[str, dict[str, Any]]:
    """Run the attacks (all, or ``names``); return, for each, whether it escaped and the evidence."""
    policy = prepare(workdir, outside)
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    tcp.setblocking(False)
    unix = socket.socket(socket.AF_UNIX)
    unix.bind(str(outside / "agent.sock"))
    unix.listen(8)
    unix.setblocking(False)
    values = {"outside": str(outside), "port": tcp.getsockname()[1], "python": sys.executable}

    def reached(listener: socket.socket) -> bool:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return False
        conn.close()
        return True

    checks: dict[str, Callable[[str], bool]] = {
        "write outside": lambda out: (outside / "written").exists(),
        "remount / read-write": lambda out: (outside / "remounted").exists(),
        "umount a hidden path's cover": lambda out: SECRET in out,
        "umount /proc and nsenter the host's network": lambda out: reached(tcp),
        "remount /dev/pts": lambda out: "MOUNTED" in out,
        "TIOCSTI into a terminal": lambda out: "INJECTED" in out,
        "a new user namespace": lambda out: "MOUNTED" in out,
        "connect to a unix socket on the read-only root": lambda out: reached(unix) or "CONNECTED" in out,
        "rename a hidden path's parent": lambda out: SECRET in out,
        "swap a symlinked ancestor of a hidden path": lambda out: SECRET in out,
        "hard-link a hidden file": lambda out: SECRET in out,
        "leave the process bound's cgroup": lambda out: "ESCAPED" in out,
        "fork bomb": lambda out: out.count("forked") >= MAX_PROCESSES,
        "write a submodule's git hooks and config": lambda out: bool(_git_written(workdir)),
        "write git's per-worktree config": lambda out: bool(_git_written(workdir)),
        "rewrite a submodule checkout's .git file": lambda out: bool(_git_written(workdir)),
        "rewrite a linked worktree's .git file": lambda out: bool(_git_written(workdir)),
        "rewrite a linked worktree's .git file from the main worktree": lambda out: bool(_git_written(workdir)),
        "forge the session log": lambda out: not _log_intact(workdir),
        "write through a symlinked .git": lambda out: bool(_links_written(workdir)),
        "write through symlinked hooks and config": lambda out: bool(_links_written(workdir)),
        # The replacement itself cannot be stopped (a symbolic link is no mount point): the next command is.
        "replace a symlinked .git": lambda out: "RAN" in out,
        "replace symlinked hooks": lambda out: "RAN" in out,
        **{name: lambda out: "HOSTILE" in out or "RAN" in out for name in CHAIN_ATTACKS},
        **{name: lambda out: "HOST GIT RAN" in out for name in REAL_GIT_ATTACKS},
    }
    results: dict[str, dict[str, Any]] = {}
    try:
        options = BashRuntimeOptions(sandbox=policy, grace_period=0.5)
        async with open_bash_executor(options, session_root=str(workdir / "sessions")) as executor:
            # A Python that runs inside (a virtual environment under /root does not, for nobody),
            # so the Python attacks are really tried.
            for candidate in dict.fromkeys([sys.executable, "/usr/bin/python3", shutil.which("python3") or ""]):
                check = f"{candidate} -c 'import fcntl, socket, termios; print(\"ok\")'"
                if candidate and (await executor.run(executor.resolve(BashRequest(check)))).stdout == "ok\n":
                    values["python"] = candidate
                    break
            else:
                raise RuntimeError("no Python interpreter runs inside the sandbox: the attacks cannot be tried")
            for name in names or list(ATTACKS):
                evidence = []
                where = workdir / ATTACK_WORKDIRS.get(name, "")
                for template in ATTACKS[name]:
                    command = template.format(**values)
                    try:
                        if command.startswith("&"):
                            evidence.append(await _in_background(executor, command[1:], where, name, workdir))
                            continue
                        result = await executor.run(
                            executor.resolve(BashRequest(command, workdir=str(where), timeout=20))
                        )
                    except BashError as exc:
                        evidence.append(f"refused to run: {exc}")
                        continue
                    evidence.append(f"exit {result.exit_code}\n{result.stdout}{result.stderr}")
                    if name in CHAIN_ATTACKS and (hostile := _chain_hostile(workdir, name)):
                        evidence.append(f"HOSTILE: {hostile}")
                    if name in REAL_GIT_ATTACKS and (ran := await _real_git_ran(workdir, name)):
                        evidence.append(f"HOST GIT RAN: {ran}")
                out = "\n".join(evidence)
                if name in ATTACK_WORKDIRS or "git" in name:
                    out += f"\nchanged: {_git_written(workdir)}"
                if "symlink" in name:
                    out += f"\nlinks changed: {_links_written(workdir)}"
                results[name] = {"escaped": checks[name](out), "evidence": out[-3000:]}
    finally:
        tcp.close()
        unix.close()
    return results


if __name__ == "__main__":
    workdir, outside, *names = sys.argv[1:]
    os.umask(0o022)
    print(json.dumps(trio.run(run_attacks, Path(workdir), Path(outside), names or None)))
