"""The parts of git directories the sandbox makes for each command (docs/sandbox.rst, "Git"): a missing
``commondir`` (as ``.``), ``hooks`` and ``config.worktree``, bound read-only while the command runs and
removed after the last command holding them, with real repositories and sandboxed commands.

The attacks themselves (a command creating them, judged by the host's git) are in ``_sandbox_attacks.py``.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _sandbox_attacks import _git
from _util import NEEDS_BUBBLEWRAP, wait_until

from trio_harness.bash import BashError, BashExecutor, BashRequest, BashRuntimeOptions, open_bash_executor
from trio_harness.bash._process import open_group, signal_group
from trio_harness.bash._sandbox_git import git_binds
from trio_harness.bash._sandbox_hold import Hold, made_here, release_when_gone

pytestmark = [
    NEEDS_BUBBLEWRAP,
    pytest.mark.skipif(shutil.which("git") is None and not os.environ.get("CI"), reason="git is not installed"),
]

OPTIONS = BashRuntimeOptions(sandbox=True, grace_period=0.5)
# The host's git, from the sandbox too (its /tmp is private, HOME may be hidden).
INSIDE = "export GIT_CONFIG_NOSYSTEM=1 GIT_CONFIG_GLOBAL=/dev/null; G='git -c user.name=a -c user.email=a@b'; "


@pytest.fixture
def work() -> Iterator[Path]:
    # Outside /tmp, so it is visible inside the sandbox (its /tmp is private).
    path = Path(tempfile.mkdtemp(prefix="trio-harness-git-parts-", dir="/var/tmp"))
    try:
        yield path
    finally:
        git = path / "repo" / ".git"
        if git.is_dir():  # made unwritable by a test
            subprocess.run(["chattr", "-i", str(git)], capture_output=True, check=False)
            git.chmod(0o755)
        shutil.rmtree(path, ignore_errors=True)


def git_ok(*argv: str, cwd: Path) -> str:
    done = _git(*argv, cwd=cwd)
    assert done.returncode == 0, (argv, done.stderr)
    return done.stdout


def repository(path: Path, *, submodule: bool = False) -> Path:
    """A repository made by git at ``path`` (with a submodule ``sub`` when asked); its .git."""
    git_ok("init", "-q", str(path), cwd=path.parent)
    git_ok("commit", "-q", "--allow-empty", "-m", "first", cwd=path)
    if submodule:
        lib = path.parent / f"{path.name}-lib"
        git_ok("init", "-q", str(lib), cwd=path.parent)
        git_ok("commit", "-q", "--allow-empty", "-m", "lib", cwd=lib)
        git_ok("-c", "protocol.file.allow=always", "submodule", "add", "-q", str(lib), "sub", cwd=path)
        git_ok("commit", "-q", "-m", "sub", cwd=path)
    assert not (path / ".git" / "commondir").exists()
    return path / ".git"


async def run(executor: BashExecutor, command: str, workdir: Path) -> Any:
    return await executor.run(executor.resolve(BashRequest(command, workdir=str(workdir))))


async def start(executor: BashExecutor, command: str, workdir: Path) -> Any:
    return await executor.start(executor.resolve(BashRequest(command, workdir=str(workdir))))


async def test_a_missing_commondir_is_made_for_the_command_and_removed_after(work: Path) -> None:
    git = repository(work / "repo", submodule=True)
    attack = "echo ../evil > .git/commondir; echo ../evil > .git/modules/sub/commondir; rm .git/commondir"
    async with open_bash_executor(OPTIONS) as executor:
        seen = await run(executor, f"cat .git/commondir .git/modules/sub/commondir; {attack}", work / "repo")
        assert seen.stdout == ".\n.\n", seen
        assert seen.stderr.count("Read-only file system") == 2 and "Device or resource busy" in seen.stderr, seen
        # Removed once the command's processes are all gone (the sandbox's PID 1 may outlive bwrap a moment).
        await wait_until(lambda: made_here() == {})
        assert not (git / "commondir").exists() and not (git / "modules" / "sub" / "commondir").exists()
    assert git_ok("status", "--porcelain", cwd=work / "repo") == ""


async def test_git_works_inside_and_outside_while_two_commands_hold_the_commondir(work: Path) -> None:
    """Two background commands, and a foreground one from another executor, in one repository: the
    commondir the first made stays until the last ends, whichever ends first; git works meanwhile."""
    repo = work / "repo"
    git = repository(repo, submodule=True)
    commondir = git / "commondir"
    (git / "info" / "exclude").write_text("started*\n")  # what the commands write
    wait = "touch started{n}; until [ -e ../go{n} ]; do sleep 0.05; done; cat .git/commondir"
    async with open_bash_executor(OPTIONS) as executor, open_bash_executor(OPTIONS) as other:
        first = await start(executor, wait.format(n=1), repo)
        # Started: it holds the commondir
        await wait_until((repo / "started1").exists)
        second = await start(executor, wait.format(n=2), repo)
        await wait_until((repo / "started2").exists)
        assert commondir.read_text() == ".\n" and made_here() == {
            str(commondir): 2,
            str(git / "modules" / "sub" / "commondir"): 2,
        }
        # git on the host: the repository, its submodule, a new linked worktree
        assert git_ok("rev-parse", "--git-dir", "--git-common-dir", cwd=repo).split() == [".git", str(git)]
        git_ok("commit", "-q", "--allow-empty", "-m", "host", cwd=repo)
        assert git_ok("status", "--porcelain", cwd=repo / "sub") == ""
        git_ok("worktree", "add", "-q", str(work / "wt"), cwd=repo)
        assert git_ok("log", "--format=%s", cwd=work / "wt").split() == ["host", "sub", "first"]
        # git in the sandbox, from another executor
        inside = await run(
            other,
            INSIDE + "$G commit -q --allow-empty -m inside && $G log --format=%s && $G -C sub status --porcelain",
            repo,
        )
        assert (inside.exit_code, inside.stdout) == (0, "inside\nhost\nsub\nfirst\n"), inside
        await wait_until(lambda: made_here()[str(commondir)] == 2)  # the other executor's held it too, and let go
        assert commondir.read_text() == ".\n"
        (work / "go1").touch()  # the one that made it ends first
        await first.wait()
        output = first.read_output()
        assert output == ".\n", output
        await wait_until(lambda: made_here()[str(commondir)] == 1)
        assert commondir.read_text() == ".\n"
        (work / "go2").touch()
        await second.wait()
        await wait_until(lambda: made_here() == {})
        assert not commondir.exists()
    assert git_ok("log", "--format=%s", "-1", cwd=repo) == "inside\n"


async def test_the_parts_made_are_readable_whatever_the_umask_and_owned_as_their_git_directory(work: Path) -> None:
    """A commondir git cannot read stops git ("failed to read"): made 0644 (hooks 0755) under umask 077; made
    by root, owned as the git directory (its user can change or remove them)."""
    repo = work / "repo"
    git = repository(repo)
    git_ok("config", "extensions.worktreeConfig", "true", cwd=repo)
    shutil.rmtree(git / "hooks")
    owner = 65534 if os.geteuid() == 0 else os.geteuid()
    if os.geteuid() == 0:
        os.chown(git, owner, owner)
    previous = os.umask(0o077)
    try:
        async with open_bash_executor(OPTIONS) as executor:
            holder = await start(executor, "until [ -e ../go ]; do sleep 0.05; done", repo)
            modes = {name: os.stat(git / name) for name in ("commondir", "hooks", "config.worktree")}
            (work / "go").touch()
            await holder.wait()
            await wait_until(lambda: made_here() == {})
    finally:
        os.umask(previous)
    assert {name: oct(info.st_mode & 0o777) for name, info in modes.items()} == {
        "commondir": "0o644",
        "hooks": "0o755",
        "config.worktree": "0o644",
    }
    assert {info.st_uid for info in modes.values()} == {owner}


async def test_a_commondir_already_there_is_left_alone(work: Path) -> None:
    """A commondir of '.' that was there (as a harness killed by kill -9 leaves it) stays, and the git
    directory is protected as its own common directory: its hooks directory is made too."""
    git = repository(work / "repo")
    (git / "commondir").write_text(".\n")
    before = os.stat(git / "commondir")
    shutil.rmtree(git / "hooks")
    async with open_bash_executor(OPTIONS) as executor:
        attack = "echo 'touch pwned' > .git/hooks/post-commit; echo ../evil > .git/commondir; ls -a .git/hooks"
        seen = await run(executor, attack, work / "repo")
        assert seen.stdout == ".\n..\n" and seen.stderr.count("Read-only file system") == 2, seen
        await wait_until(lambda: made_here() == {})
    after = os.stat(git / "commondir")
    assert (after.st_ino, (git / "commondir").read_text()) == (before.st_ino, ".\n")
    assert not (git / "hooks").exists()
    git_ok("commit", "-q", "--allow-empty", "-m", "again", cwd=work / "repo")


async def test_a_commondir_another_process_holds_is_left_for_later(work: Path) -> None:
    """A command of another harness process holds it (a shared lock): left in place when this process's last
    command ends, and removed after this process's next command."""
    git = repository(work / "repo")
    commondir = git / "commondir"
    locker = (
        "import fcntl, os, sys; fd = os.open(sys.argv[1], os.O_RDONLY); fcntl.flock(fd, fcntl.LOCK_SH);"
        " print('held', flush=True); sys.stdin.read()"
    )
    async with open_bash_executor(OPTIONS) as executor:
        holder = await start(executor, "until [ -e ../go ]; do sleep 0.05; done", work / "repo")
        await wait_until(commondir.exists)
        other = subprocess.Popen(
            [sys.executable, "-c", locker, str(commondir)], stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        try:
            assert other.stdout is not None and other.stdout.readline() == b"held\n"
            (work / "go").touch()
            await holder.wait()
            await wait_until(lambda: made_here().get(str(commondir)) == 0)
            assert commondir.read_text() == ".\n"
        finally:
            other.communicate(b"")
        await run(executor, "true", work / "repo")
        await wait_until(lambda: made_here() == {})
        assert not commondir.exists()


async def test_parts_changed_on_the_host_are_left_and_logged(work: Path, caplog: pytest.LogCaptureFixture) -> None:
    repo = work / "repo"
    git = repository(repo)
    git_ok("config", "extensions.worktreeConfig", "true", cwd=repo)
    shutil.rmtree(git / "hooks")
    async with open_bash_executor(OPTIONS) as executor:
        holder = await start(executor, "until [ -e ../go ]; do sleep 0.05; done", repo)
        assert {name: (git / name).exists() for name in ("commondir", "hooks", "config.worktree")} == dict.fromkeys(
            ("commondir", "hooks", "config.worktree"), True
        )
        (git / "commondir.new").write_text(".\n")
        os.replace(git / "commondir.new", git / "commondir")  # another inode
        git_ok("config", "--worktree", "core.editor", "true", cwd=repo)  # written by git (its own lock, rename)
        (git / "hooks" / "pre-commit").write_text("#!/bin/sh\n")
        (work / "go").touch()
        with caplog.at_level(logging.WARNING, logger="trio_harness.bash"):
            await holder.wait()
            await wait_until(lambda: made_here() == {})
    kept = [record.getMessage() for record in caplog.records]
    assert sorted(kept) == sorted(
        [
            f"the sandbox left {str(git / 'commondir')!r} in place: it made it for its commands, and it was "
            "replaced since",
            f"the sandbox left {str(git / 'config.worktree')!r} in place: it made it for its commands, and it was "
            "replaced since",
            f"the sandbox left {str(git / 'hooks')!r} in place: it made it empty for its commands, and it is not now",
        ]
    ), kept
    assert (git / "commondir").read_text() == ".\n" and (git / "hooks" / "pre-commit").exists()
    assert "editor" in (git / "config.worktree").read_text()


async def test_a_part_this_user_may_not_make_the_command_may_not_make_either_and_it_runs(work: Path) -> None:
    """A git directory the harness's user cannot write into (immutable as root, read-only otherwise): the
    command, the same user with no more rights, cannot create a commondir there either, so it runs."""
    git = repository(work / "repo")
    if os.geteuid() == 0:
        made = subprocess.run(["chattr", "+i", str(git)], capture_output=True, text=True, check=False)
        if made.returncode != 0:
            pytest.skip(f"root cannot make {git} unwritable here: {made.stderr.strip()}")
    else:
        git.chmod(0o555)
    async with open_bash_executor(OPTIONS) as executor:
        result = await run(executor, "touch ran; echo . > .git/commondir || echo refused", work / "repo")
        assert "refused" in result.stdout, result
        assert (work / "repo" / "ran").exists()
    assert not (git / "commondir").exists()


async def test_a_part_that_cannot_be_made_for_another_reason_refuses_the_command(
    work: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A full disk (injected): the command is refused, naming the part, rather than run unprotected."""
    git = repository(work / "repo")
    real_open = os.open

    def full_open(path: Any, flags: int, *args: Any, **kwargs: Any) -> Any:
        if flags & os.O_CREAT and str(path).startswith(str(git)):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real_open(path, flags, *args, **kwargs)

    monkeypatch.setattr(os, "open", full_open)
    async with open_bash_executor(OPTIONS) as executor:
        with pytest.raises(BashError, match=rf"could not create {str(git / 'commondir')!r} \(.*\), which it makes"):
            await run(executor, "touch ran", work / "repo")
        assert not (work / "repo" / "ran").exists()


def test_the_git_directories_of_a_submodule_and_a_linked_worktree_get_one_too(work: Path) -> None:
    repo = work / "repo"
    git = repository(repo, submodule=True)
    git_ok("worktree", "add", "-q", "wt", cwd=repo)
    (git / "worktrees" / "wt" / "commondir").unlink()  # git takes the worktree's git directory for its own then
    said = _git("rev-parse", "--git-common-dir", cwd=repo / "wt")
    hold = Hold()
    binds = git_binds(str(repo), [str(repo)], lambda directory: [], hold=hold)
    read_only = {binds[i + 1] for i, arg in enumerate(binds) if arg == "--ro-bind"}
    made = [git / "commondir", git / "modules" / "sub" / "commondir", git / "worktrees" / "wt" / "commondir"]
    assert {str(path) for path in made} <= read_only, read_only
    assert [path.read_text() for path in made] == [".\n"] * 3
    assert _git("rev-parse", "--git-common-dir", cwd=repo / "wt").stdout == said.stdout  # as without one
    assert hold.release() == []
    assert not any(path.exists() for path in made)


_HARNESS = """
import sys, trio
from trio_harness.bash import BashRequest, BashRuntimeOptions, open_bash_executor

async def main():
    async with open_bash_executor(BashRuntimeOptions(sandbox=True)) as executor:
        await executor.start(executor.resolve(BashRequest("sleep 60", workdir=sys.argv[1])))
        print("started", flush=True)
        await trio.sleep_forever()

trio.run(main)
"""


async def test_a_harness_killed_while_a_command_runs_leaves_a_commondir_git_works_with(work: Path) -> None:
    repo = work / "repo"
    git = repository(repo)
    commondir = git / "commondir"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), *sys.path])}
    harness = subprocess.Popen([sys.executable, "-c", _HARNESS, str(repo)], stdout=subprocess.PIPE, env=env)
    try:
        assert harness.stdout is not None and harness.stdout.readline() == b"started\n"
        assert commondir.read_text() == ".\n"
    finally:
        harness.kill()  # SIGKILL: no cleanup runs (its lifeline ends the command)
        harness.wait()
        if harness.stdout is not None:
            harness.stdout.close()
    assert commondir.read_text() == ".\n"  # left behind, and harmless:
    git_ok("commit", "-q", "--allow-empty", "-m", "after", cwd=repo)
    assert git_ok("status", "--porcelain", cwd=repo) == ""
    async with open_bash_executor(OPTIONS) as executor:  # a later harness leaves it alone
        seen = await run(executor, "echo ../evil > .git/commondir; cat .git/commondir", repo)
        assert seen.stdout == ".\n" and "Read-only file system" in seen.stderr, seen
        await wait_until(lambda: made_here() == {})
    assert commondir.read_text() == ".\n"


async def test_a_hold_is_let_go_only_once_the_commands_group_is_gone(work: Path) -> None:
    """SIGKILLed, a sandbox's processes may run a moment longer: the parts stay until none of the group runs."""
    part = work / "commondir"
    hold = Hold()
    hold.ensure(str(part), b".\n", "a test")
    process = await open_group(["sleep", "30"], str(work), None)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_when_gone, hold, process.pid)
        await trio.testing.wait_all_tasks_blocked()
        assert not hold.released and part.read_text() == ".\n"
        signal_group(process.pid, signal.SIGKILL)
        await process.wait()
        await wait_until(lambda: hold.released)
    assert not part.exists() and made_here() == {}


def test_a_part_that_could_not_be_written_is_not_left_half_made(work: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """An empty commondir would stop git ("failed to read"): a failed write removes what was created."""

    def full(fd: int, data: bytes) -> int:
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    try:
        with pytest.raises(BashError, match=r"could not create '.*/commondir' \(No space left on device\)"):
            Hold().ensure(str(work / "commondir"), b".\n", "a test")
    finally:
        monkeypatch.undo()
    assert not (work / "commondir").exists() and made_here() == {}
