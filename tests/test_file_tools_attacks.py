"""Attacks on the file tools by a model that injects its own calls: memory bombs, races, paths (docs/tools.rst)."""

from __future__ import annotations

import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
import trio
from _util import NEEDS_BUBBLEWRAP
from test_file_tools import call, results, run_calls

from trio_harness import BashRuntimeOptions, BashToolOptions, ScriptedModel, allow_all
from trio_harness.agents import ToolSet
from trio_harness.bash import BashRequest, SandboxPolicy, open_bash_executor
from trio_harness.testing import open_test_harness
from trio_harness.tools import FileToolOptions, FileToolsPlugin
from trio_harness.tools._files_fs import FileToolError, PathRules, _read_local, _write_local, resolve_path


async def test_an_edit_or_write_past_the_file_limit_is_refused_before_it_is_built(tmp_path: Path) -> None:
    """replace_all of one common character by a long text would build gigabytes in memory; refused at once."""
    (tmp_path / "a.txt").write_text("a" * 50_000)
    options = FileToolOptions(max_file_bytes=100_000)
    _, bomb, big, fits = await run_calls(
        tmp_path,
        [call("read_file", path="a.txt")],
        [call("edit_file", path="a.txt", old_text="a", new_text="b" * 1000, replace_all=True)],
        [call("write_file", path="new.txt", content="x" * 100_001)],
        [call("edit_file", path="a.txt", old_text="a" * 50_000, new_text="c" * 100_000)],
        file_tool_options=options,
    )
    assert bomb.is_error and "would be 50000000 bytes, more than the 100000-byte limit" in bomb.content
    assert (tmp_path / "a.txt").read_text() == "c" * 100_000  # the last edit, just at the limit
    assert big.is_error and "100001 bytes" in big.content and not (tmp_path / "new.txt").exists()
    assert not fits.is_error


def test_a_directory_swapped_for_a_symlink_after_the_check_is_not_followed(tmp_path: Path) -> None:
    """The path was resolved and checked with ``d`` a directory; then ``d`` became a link to a secret place."""
    secret = tmp_path / "secret"
    secret.mkdir()
    (secret / "key").write_text("s3cret\n")
    (secret / "bashrc").write_text("keep\n")
    (tmp_path / "d").symlink_to(secret)  # what _read_local / _write_local get is the path resolved before
    with pytest.raises(FileToolError, match="changed while it was opened"):
        _read_local(str(tmp_path / "d" / "key"), 1000)
    with pytest.raises(FileToolError, match="changed while it was opened"):
        _write_local(str(tmp_path / "d" / "bashrc"), "evil\n")
    assert (secret / "bashrc").read_text() == "keep\n"
    assert sorted(p.name for p in secret.iterdir()) == ["bashrc", "key"]  # no temporary file either


def test_a_new_file_gets_the_umask_mode_and_the_umask_is_never_changed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reading the umask sets it for every thread (a store making a directory then would get 0o777)."""
    old = os.umask(0o027)
    try:

        def no_umask(mask: int) -> int:
            raise AssertionError("os.umask called while other threads run")

        monkeypatch.setattr(os, "umask", no_umask)
        _write_local(str(tmp_path / "new.txt"), "x\n")
        (tmp_path / "kept.txt").write_text("y\n")
        (tmp_path / "kept.txt").chmod(0o604)
        _write_local(str(tmp_path / "kept.txt"), "z\n")
    finally:
        monkeypatch.undo()
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "new.txt").stat().st_mode) == 0o640
    assert stat.S_IMODE((tmp_path / "kept.txt").stat().st_mode) == 0o604
    assert (tmp_path / "kept.txt").read_text() == "z\n"


async def test_proc_and_credential_paths_are_never_read_even_without_a_sandbox(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Reads never ask: without this, read_file took ~/.ssh/id_rsa where ``cat`` in bash is asked about."""
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text("PRIVATE KEY\n")
    (home / ".aws").mkdir()
    (home / ".aws" / "credentials").write_text("aws_secret_access_key = AKIA\n")
    monkeypatch.setenv("HOME", str(home))
    work = tmp_path / "work"
    work.mkdir()
    (work / "keys").symlink_to(home / ".ssh")  # a link in the project does not open the way
    (work / "status").symlink_to(f"/proc/{os.getpid()}/status")
    found = await run_calls(
        work,
        [
            call("read_file", path="~/.ssh/id_rsa"),
            call("read_file", path="keys/id_rsa"),
            call("read_file", path=str(home / ".aws" / "credentials")),
            call("read_file", path="/proc/self/status"),
            call("read_file", path="status"),
            call("read_file", path="/proc/1/status"),
        ],
        [call("write_file", path="~/.ssh/authorized_keys", content="ssh-ed25519 AAAA attacker\n")],
    )
    for result in found:
        assert result.is_error and "hidden by the file tools" in result.content, result.content
        assert "PRIVATE" not in result.content and "AKIA" not in result.content and "VmRSS" not in result.content
    assert sorted(p.name for p in (home / ".ssh").iterdir()) == ["id_rsa"]


def test_under_a_sandbox_a_session_in_the_root_directory_writes_nothing() -> None:
    """bash refuses to run with '/' writable; the file tools made '/' the writable root (~/.bashrc, /etc...)."""
    rules = PathRules(writable=(), hidden=(), protect_git=True)
    for path in ("/etc/cron.d/x", os.path.expanduser("~/.bashrc"), "/tmp/x"):
        full, real = resolve_path("/", path)
        with pytest.raises(FileToolError, match="working directory is '/'"):
            rules.check_write(full, real, "/")
    full, real = resolve_path("/", "/etc/passwd")
    PathRules().check_write(full, real, "/")  # without a sandbox, as the harness's user may


# ---------------------------------------------------------------- the session store


async def test_the_session_store_is_never_written_whatever_the_approval(tmp_path: Path) -> None:
    """An agent allowed every write (no sandbox) cannot forge its own log, blobs or locks: by path, ``..`` or a link."""
    store = tmp_path / "store"
    (tmp_path / "store-notes").mkdir()  # a sibling whose name starts like the store's: writable
    (tmp_path / "sub").mkdir()
    (tmp_path / "into-store").symlink_to(store)
    forged = '{"type": "approval/decision", "forged": true}\n'
    log = "store/s1/session.jsonl"
    targets = [log, "sub/../store/s1/session.jsonl", "into-store/s1/session.jsonl", str(store / "s1" / "new.lock")]
    targets += ["store/s1/blobs/x", "store/.create.lock", "store"]
    model = ScriptedModel(
        [
            {"tool_calls": [call("read_file", path=log)]},
            {"tool_calls": [call("write_file", path=path, content=forged) for path in targets]},
            {"tool_calls": [call("edit_file", path=log, old_text='"type"', new_text='"forged"')]},
            {"tool_calls": [call("write_file", path="store-notes/n.txt", content="fine\n")]},
            {"text": "done"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all, store=str(store)) as h:
        async with h.agents.open(session_id="s1", cwd=str(tmp_path)) as agent:
            agent.followup("go")
            with trio.fail_after(10):
                await agent.when_idle()
            read, *writes, edit, sibling = results(agent.session.events)
    assert read.is_error and "is inside the session store" in read.content  # not read either (see below)
    for path, result in zip(targets, writes, strict=True):
        assert result.is_error and "is inside the session store" in result.content, (path, result.content)
        assert "whatever the approval" in result.content
    assert "resolves to" in writes[2].content  # the link is named with where it leads
    assert edit.is_error and "is inside the session store" in edit.content
    assert not sibling.is_error and (tmp_path / "store-notes" / "n.txt").read_text() == "fine\n"
    lines = (store / "s1" / "session.jsonl").read_text().splitlines()
    assert forged.strip() not in lines and '"forged"' not in lines[0]  # the calls' arguments are logged, escaped
    assert not (store / "s1" / "new.lock").exists() and not (store / "s1" / "blobs" / "x").exists()


def test_the_store_rule_holds_with_a_sandbox_that_does_not_hide_the_store(tmp_path: Path) -> None:
    store = tmp_path / "proj" / "sessions"
    (store / "s1").mkdir(parents=True)
    rules = PathRules(writable=(), protected=(str(store),))
    full, real = resolve_path(str(tmp_path / "proj"), "sessions/s1/session.jsonl")
    rules.check_read(full, real, str(tmp_path / "proj"))  # readable: hide_sessions=False asked for that
    with pytest.raises(FileToolError, match="is inside the session store"):
        rules.check_write(full, real, str(tmp_path / "proj"))
    full, real = resolve_path(str(tmp_path / "proj"), "other.txt")
    rules.check_write(full, real, str(tmp_path / "proj"))


def test_git_hooks_and_configuration_of_submodules_and_worktrees_are_read_only(tmp_path: Path) -> None:
    """Git runs what they name outside the sandbox: a write there is code execution on the user's next git."""
    cwd = tmp_path / "proj"
    (cwd / ".git" / "modules" / "sub").mkdir(parents=True)
    (cwd / "sub").mkdir()
    (cwd / "sub" / ".git").write_text("gitdir: ../.git/modules/sub\n")
    rules = PathRules(writable=(), protect_git=True)

    def write(path: str) -> None:
        full, real = resolve_path(str(cwd), path)
        rules.check_write(full, real, str(cwd))

    for path in (
        ".git/hooks/pre-commit",
        ".git/config",
        ".git/config.worktree",
        ".git/modules/sub/hooks/post-checkout",
        ".git/modules/sub/config",
        ".git/modules/a/b/config",  # a submodule named a/b
        ".git/modules/sub/modules/inner/hooks/pre-push",
        ".git/modules/sub/config.worktree",
        ".git/worktrees/w/config.worktree",
        ".git/worktrees/w/commondir",
        "sub/.git",  # a submodule's checkout: its .git file names the git directory
        ".git",  # a .git file here would name a git directory the model made
        "vendor/lib/.git/hooks/post-merge",  # a nested repository
        "sub/../.git/modules/sub/config",
    ):
        with pytest.raises(FileToolError, match=r"read-only in the sandbox \(git's hooks and configuration"):
            write(path)
    write(".git/COMMIT_EDITMSG")  # the rest of the repository is writable, as for commands
    write("src/config")
    write(".github/hooks/x")
    PathRules(writable=(), protect_git=False).check_write(*resolve_path(str(cwd), ".git/modules/sub/config"), str(cwd))


def test_git_hooks_and_configuration_are_matched_whatever_their_case(tmp_path: Path) -> None:
    """On a case-insensitive file system (vfat, ext4 casefold) .GIT/HOOKS is git's .git/hooks."""
    cwd = tmp_path / "proj"
    (cwd / ".git" / "hooks").mkdir(parents=True)
    (cwd / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    rules = PathRules(writable=(), protect_git=True)
    for path in (
        ".GIT/hooks/pre-commit",
        ".Git/HOOKS/post-checkout",
        ".git/CONFIG",
        ".GIT",
        "sub/.GiT/Config.Worktree",
    ):
        with pytest.raises(FileToolError, match=r"read-only in the sandbox \(git's hooks and configuration"):
            rules.check_write(*resolve_path(str(cwd), path), str(cwd))
    rules.check_write(*resolve_path(str(cwd), ".GIT/COMMIT_EDITMSG"), str(cwd))


@NEEDS_BUBBLEWRAP
async def test_under_a_sandbox_the_agents_own_spill_files_are_read_but_not_the_rest_of_tmp(tmp_path: Path) -> None:
    """The truncation notice of a background command names its spill file in the host's /tmp: readable, by the
    agent that started it only; the rest of the host's /tmp (other sessions' spill files) stays unread."""
    work = Path(tempfile.mkdtemp(prefix="trio-harness-files-", dir="/var/tmp"))
    other = Path(tempfile.mkstemp(prefix="trio-harness-bash-proc-1-", suffix=".stdout")[1])  # another harness's
    try:
        options = BashRuntimeOptions(sandbox=SandboxPolicy(), tail_bytes=1024, grace_period=0.5)
        async with open_bash_executor(options) as executor:
            process = await executor.start(
                executor.resolve(BashRequest("head -c 5000 /dev/zero | tr '\\0' x", workdir=str(work), owner="a1"))
            )
            with trio.fail_after(20):
                await process.wait()
            notice = process.read_output()
            assert f"full stdout in {process.stdout_path}" in notice, notice
            plugin = FileToolsPlugin(ToolSet(), executor)
            for path in (process.stdout_path, process.stderr_path):
                plugin._rules("a1").check_read(*resolve_path(str(work), path), str(work))
            for reader, path in (("a2", process.stdout_path), ("a1", str(other)), ("a1", "/tmp/krb5cc_0")):
                with pytest.raises(FileToolError, match=r"its /tmp and /dev are private"):
                    plugin._rules(reader).check_read(*resolve_path(str(work), path), str(work))
            spilled = process.stdout_path
            process.release()
            with pytest.raises(FileToolError, match=r"its /tmp and /dev are private"):
                plugin._rules("a1").check_read(*resolve_path(str(work), spilled), str(work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        other.unlink()


def test_git_hooks_and_configuration_behind_symbolic_links_are_read_only(tmp_path: Path) -> None:
    """A .git that is a link (or one whose hooks and config are links) is protected where the links lead."""
    cwd, shared, linked = tmp_path / "proj", tmp_path / "shared", tmp_path / "linked"
    meta = cwd / "meta"  # the git directory .git links to, under a name without .git
    (meta / "hooks").mkdir(parents=True)
    (meta / "modules" / "m").mkdir(parents=True)
    (meta / "HEAD").write_text("ref: refs/heads/main\n")
    (meta / "config").write_text("")
    (cwd / ".git").symlink_to("meta")
    (cwd / "gitdirs" / "w").mkdir(parents=True)  # a linked worktree's git directory, named by a .git file
    (cwd / "gitdirs" / "w" / "HEAD").write_text("ref: refs/heads/w\n")
    (cwd / "gitdirs" / "w" / "commondir").write_text("../../meta\n")
    (linked / ".git").parent.mkdir()
    (linked / ".git").write_text("gitdir: ../proj/gitdirs/w\n")
    (shared / "hooks").mkdir(parents=True)  # hooks and config of another repository, as links (git-new-workdir)
    (shared / "config").write_text("")
    other = cwd / "other"
    (other / ".git").mkdir(parents=True)
    (other / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (other / ".git" / "hooks").symlink_to(shared / "hooks")
    (other / ".git" / "config").symlink_to(shared / "config")
    rules = PathRules(writable=(str(shared), str(other), str(linked)), protect_git=True)

    def write(path: str) -> None:
        full, real = resolve_path(str(cwd), path)
        rules.check_write(full, real, str(cwd))

    for path in (
        ".git/hooks/pre-commit",
        "meta/hooks/pre-commit",
        "meta/config",
        ".git/config",
        "meta/config.worktree",
        "meta/modules/m/config",
        "meta/modules/m/hooks/post-checkout",
        "gitdirs/w/config.worktree",
        "gitdirs/w/commondir",
        "gitdirs/w/hooks/x",
        "other/.git/hooks/pre-commit",
        str(shared / "hooks" / "pre-push"),
        str(shared / "config"),
        "other/.git/config",
    ):
        with pytest.raises(FileToolError, match=r"read-only in the sandbox \(git's hooks and configuration"):
            write(path)
    write("meta/COMMIT_EDITMSG")  # the rest of the git directory is writable, as for commands
    write("meta/objects/ab/cdef")
    write(str(shared / "notes.txt"))
    PathRules(writable=(), protect_git=False).check_write(*resolve_path(str(cwd), "meta/config"), str(cwd))


# ---------------------------------------------------------------- what the sandbox hides from commands


async def test_the_session_store_is_never_read_by_path_dotdot_or_link(tmp_path: Path) -> None:
    """Reads never ask: without this, read_file gave the model other sessions' transcripts (no sandbox needed)."""
    store = tmp_path / "store"
    (store / "other").mkdir(parents=True)
    (store / "other" / "session.jsonl").write_text('{"type": "session", "secret": "hunter2"}\n')
    (tmp_path / "store-notes").mkdir()
    (tmp_path / "store-notes" / "n.txt").write_text("fine\n")
    (tmp_path / "sub").mkdir()
    (tmp_path / "into-store").symlink_to(store)
    (tmp_path / "log").symlink_to(store / "other" / "session.jsonl")
    targets = ["store/other/session.jsonl", "sub/../store/other/session.jsonl", "into-store/other/session.jsonl"]
    targets += ["log", str(store / "other" / "session.jsonl"), "store/.create.lock"]
    model = ScriptedModel(
        [
            {"tool_calls": [call("read_file", path=path) for path in targets]},
            {"tool_calls": [call("read_file", path="store-notes/n.txt")]},
            {"text": "done"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all, store=str(store)) as h:
        async with h.agents.open(session_id="s1", cwd=str(tmp_path)) as agent:
            agent.followup("go")
            with trio.fail_after(10):
                await agent.when_idle()
            *reads, sibling = results(agent.session.events)
    for path, result in zip(targets, reads, strict=True):
        assert result.is_error and "is inside the session store" in result.content, (path, result.content)
        assert "cannot be read" in result.content and "hunter2" not in result.content
    assert "resolves to" in reads[2].content and "resolves to" in reads[3].content
    assert not sibling.is_error and "fine" in sibling.content


def test_under_a_sandbox_the_hosts_tmp_and_dev_are_not_read(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sandboxed command has a private /tmp and /dev: the host's (other programs' files, /dev/shm) stay unread."""
    cwd = tmp_path / "proj"  # under /tmp, as a session may be: its own directory is the real one
    (cwd / "a.txt").parent.mkdir()
    extra = tmp_path / "extra"  # a writable path of the policy: real inside too
    rules = PathRules(writable=(str(extra),))
    for path in (str(cwd / "a.txt"), str(extra / "b.txt")):
        rules.check_read(*resolve_path(str(cwd), path), str(cwd))
    for path in (str(tmp_path / "other.txt"), "/tmp/krb5cc_0", "/dev/shm/key", "../other.txt"):
        with pytest.raises(FileToolError, match=r"is hidden by the sandbox \(its /tmp and /dev are private"):
            rules.check_read(*resolve_path(str(cwd), path), str(cwd))
    PathRules().check_read(*resolve_path(str(cwd), "/dev/shm/key"), str(cwd))  # no sandbox: as bash would
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(FileToolError, match="hidden by the file tools"):
        PathRules().check_read(*resolve_path(str(cwd), "~/.pgpass"), str(cwd))  # the PostgreSQL store's password


@NEEDS_BUBBLEWRAP
async def test_the_file_tools_read_no_more_than_a_sandboxed_command_sees(tmp_path: Path) -> None:
    """The same hidden paths for read_file as for ``cat`` in the sandbox: the store, the host's /tmp and /dev/shm."""
    work = Path(tempfile.mkdtemp(prefix="trio-harness-files-", dir="/var/tmp"))
    shm = Path(tempfile.mkstemp(prefix="trio-harness-files-", dir="/dev/shm")[1])
    try:
        store = work / "store"
        (store / "other").mkdir(parents=True)
        (store / "other" / "session.jsonl").write_text("hunter2\n")
        host_tmp = tmp_path / "host.txt"
        host_tmp.write_text("hunter2\n")
        shm.write_text("hunter2\n")
        (work / "mine.txt").write_text("mine\n")
        paths = [str(store / "other" / "session.jsonl"), str(host_tmp), str(shm)]
        command = "cat " + " ".join(paths) + " mine.txt"
        model = ScriptedModel(
            [
                {"tool_calls": [call("read_file", path=path) for path in [*paths, "mine.txt"]]},
                {"tool_calls": [call("bash", command=command)]},
                {"text": "done"},
            ]
        )
        async with open_test_harness(
            model,
            builtin_tools=["files", "bash", "tasks"],
            approver=allow_all,
            store=str(store),
            bash_options=BashRuntimeOptions(sandbox=SandboxPolicy()),
            bash_tool_options=BashToolOptions(requires_approval=False),
        ) as h:
            async with h.agents.open(session_id="s1", cwd=str(work)) as agent:
                agent.followup("go")
                with trio.fail_after(20):
                    await agent.when_idle()
                *reads, mine, cat = results(agent.session.events)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shm.unlink()
    for result in reads:
        assert result.is_error and "hidden by the sandbox" in result.content and "hunter2" not in result.content
    assert "the sandbox hides the session store" in reads[0].content, reads[0].content
    assert "its /tmp and /dev are private" in reads[1].content and "its /tmp and /dev are private" in reads[2].content
    assert not mine.is_error and "mine" in mine.content
    assert "hunter2" not in cat.content and "mine" in cat.content  # what the command saw: the same


@pytest.mark.skipif(shutil.which("git") is None and not os.environ.get("CI"), reason="git is not installed")
def test_git_directories_are_found_where_git_resolves_their_relative_paths(tmp_path: Path) -> None:
    """A .git link to a .git file: the path it names is relative to the link's directory (not the file's);
    a commondir's, of a .git file's git directory or of a .git directory, relative to that git directory."""
    cwd, elsewhere, other = tmp_path / "proj", tmp_path / "elsewhere", tmp_path / "other"
    for bare in (cwd / "meta", cwd / "common", other / "common"):
        subprocess.run(["git", "init", "-q", "--bare", str(bare)], check=True)
    (cwd / "meta" / "commondir").write_text("../common\n")
    elsewhere.mkdir()
    (elsewhere / "dotgit").write_text("gitdir: meta\n")
    (cwd / ".git").symlink_to(elsewhere / "dotgit")
    (other / ".git").mkdir()
    (other / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (other / ".git" / "commondir").write_text("../common\n")
    for repo, hooks in ((cwd, cwd / "common" / "hooks"), (other, other / "common" / "hooks")):  # as git says
        said = subprocess.run(["git", "-C", str(repo), "rev-parse", "--git-path", "hooks"], capture_output=True)
        assert said.stdout.decode().strip() == str(hooks), said
    rules = PathRules(writable=(str(other),), protect_git=True)
    for path in (
        "meta/config",
        "meta/hooks/pre-commit",
        "common/config",
        "common/hooks/pre-commit",
        str(other / "common" / "config"),
        str(other / "common" / "hooks" / "pre-commit"),
    ):
        with pytest.raises(FileToolError, match=r"read-only in the sandbox \(git's hooks and configuration"):
            rules.check_write(*resolve_path(str(cwd), path), str(cwd))
    rules.check_write(*resolve_path(str(cwd), "common/description"), str(cwd))
