"""The bash sandbox against someone who controls the commands (docs/sandbox.rst, "Threat model").

Every attack of ``_sandbox_attacks.py`` runs for real, in this process (as
root in CI) and as the unprivileged user ``nobody``; whether it escaped is
decided outside the sandbox.  Then the defaults: hidden credentials and
session store, read-only ``.git`` hooks and config, the ``/tmp`` cap, the
unix-socket switch, and the probe that refuses a sandbox which keeps
capabilities or runs without its filter.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _sandbox_attacks import ATTACKS, SECRET, run_attacks
from _util import NEEDS_BUBBLEWRAP

import trio_harness
from trio_harness import BashRuntimeOptions, BashToolOptions, ScriptedModel
from trio_harness.bash import (
    BashError,
    BashExecutor,
    BashRequest,
    SandboxPolicy,
    SandboxUnavailableError,
    open_bash_executor,
)
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

pytestmark = NEEDS_BUBBLEWRAP

NOBODY = 65534
AS_ROOT = os.geteuid() == 0


def _host_dir(prefix: str) -> Path:
    # Outside /tmp, so it is visible inside the sandbox (its /tmp is private).
    return Path(tempfile.mkdtemp(prefix=prefix, dir="/var/tmp"))


@pytest.fixture
def outside() -> Iterator[Path]:
    path = _host_dir("trio-harness-escape-out-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def work() -> Iterator[Path]:
    path = _host_dir("trio-harness-escape-work-")
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


async def run(executor: BashExecutor, command: str, workdir: Path, **request: Any) -> Any:
    return await executor.run(executor.resolve(BashRequest(command, workdir=str(workdir), **request)))


# ------------------------------------------------------------------ the attacks


@pytest.mark.parametrize("name", list(ATTACKS))
async def test_the_attack_is_refused(name: str, work: Path, outside: Path) -> None:
    results = await run_attacks(work, outside, [name])
    assert not results[name]["escaped"], results[name]["evidence"]


def _as_nobody(*argv: str) -> list[str]:
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups", "--", *argv]


def _interpreter_for_nobody() -> tuple[str, str]:
    """A Python that a process running as nobody can start, and the site directory to add for it.

    The harness nobody runs starts its lifeline watchdog with its own interpreter
    (``sys.executable``), so nobody must be able to execute it from a process of
    its own.  ``setpriv`` itself can exec an interpreter whose path nobody cannot
    traverse (a pyenv Python under root's 0700 home, as on CI); then this
    falls back to the system's Python 3 of the same minor version with this
    environment's site-packages, which hold only pure-Python or same-ABI packages.
    """
    check = 'exec "$0" -c "import sys; print(sys.version_info[:2])"'
    site = next((path for path in sys.path if path.endswith("site-packages")), "")
    for candidate, extra in ((sys.executable, ""), ("/usr/bin/python3", site)):
        done = subprocess.run(_as_nobody("/bin/sh", "-c", check, candidate), capture_output=True, text=True)
        if done.returncode == 0 and done.stdout.strip() == str(tuple(sys.version_info[:2])):
            return candidate, extra
    return sys.executable, ""


def _unprivileged_namespaces_work() -> str | None:
    """None when ``nobody`` can run bwrap here; else why not."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "bubblewrap is not installed (apt-get install bubblewrap)"
    probe = subprocess.run(
        _as_nobody(bwrap, "--unshare-user", "--ro-bind", "/", "/", "true"), capture_output=True, text=True, check=False
    )
    if probe.returncode != 0:
        return f"unprivileged user namespaces do not work here: bwrap as nobody said {probe.stderr.strip()!r}"
    return None


async def test_the_attacks_are_refused_for_an_unprivileged_user() -> None:
    if AS_ROOT:
        why = _unprivileged_namespaces_work()
        if why is not None and not os.environ.get("CI"):
            pytest.skip(why)
    work = _host_dir("trio-harness-nobody-work-")
    outside = _host_dir("trio-harness-nobody-out-")
    try:
        if AS_ROOT:
            for path in (work, outside):
                os.chown(path, NOBODY, NOBODY)
        tests = Path(__file__).parent
        package_root = Path(trio_harness.__file__).parent.parent
        python, site = _interpreter_for_nobody() if AS_ROOT else (sys.executable, "")
        argv = [python, str(tests / "_sandbox_attacks.py"), str(work), str(outside)]
        env = {
            **os.environ,
            "PYTHONPATH": ":".join(filter(None, [str(package_root), str(tests), site])),
            "HOME": str(outside),
        }
        if AS_ROOT:
            imports = subprocess.run(
                _as_nobody(python, "-c", "import _sandbox_attacks"), env=env, capture_output=True, text=True
            )
            if imports.returncode != 0:
                why = f"nobody cannot run this interpreter and checkout: {imports.stderr.strip()[-500:]}"
                if not os.environ.get("CI"):
                    pytest.skip(why)
                raise AssertionError(why + " (make the checkout and the virtual environment readable by nobody)")
        with trio.fail_after(120):
            done = await trio.run_process(
                _as_nobody(*argv) if AS_ROOT else argv, capture_stdout=True, capture_stderr=True, env=env, check=False
            )
        assert done.returncode == 0, done.stderr.decode()
        results = json.loads(done.stdout)
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(outside, ignore_errors=True)
    assert set(results) == set(ATTACKS)
    escaped = {name: result["evidence"] for name, result in results.items() if result["escaped"]}
    assert escaped == {}


async def test_a_hidden_path_moved_or_replaced_on_the_host_refuses_commands(work: Path, outside: Path) -> None:
    (work / "conf").mkdir()
    (work / "conf" / "secret.env").write_text(SECRET)
    (work / "token").write_text(SECRET)
    (outside / "key").write_text(SECRET)  # outside every writable directory: no command could move it
    policy = SandboxPolicy(hidden=[str(work / "conf" / "secret.env"), str(work / "token"), str(outside / "key")])
    async with open_bash_executor(BashRuntimeOptions(sandbox=policy, grace_period=0.5)) as executor:
        assert (await run(executor, f"cat token conf/secret.env {outside}/key", work)).stdout == ""
        (outside / "key").unlink()  # the user removed it: commands go on
        assert (await run(executor, "true", work)).exit_code == 0
        (outside / "key").write_text(SECRET)  # and it is hidden again when it is back
        assert (await run(executor, f"cat {outside}/key", work)).stdout == ""
        # An editor's atomic save puts a new inode at the same path: still hidden.
        (work / "token.new").write_text(SECRET + "2")
        os.replace(work / "token.new", work / "token")
        again = await run(executor, "cat token", work)
        assert SECRET not in again.stdout and "Permission denied" in again.stderr

        (work / "conf").rename(work / "conf.moved")
        with pytest.raises(BashError, match=r"hidden path .*conf/secret.env' was moved or removed"):
            await run(executor, "cat conf.moved/secret.env", work)
        (work / "conf.moved").rename(work / "conf")
        assert (await run(executor, "cat conf/secret.env", work)).stdout == ""

        (work / "token").rename(work / "token.real")
        (work / "token").symlink_to("token.real")
        with pytest.raises(BashError, match=r"token' was a file and is now a symlink"):
            await run(executor, "cat token.real", work)


# ------------------------------------------------------------------ the defaults


async def test_credentials_in_home_are_hidden_by_default(
    work: Path, outside: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = outside
    for name in (".ssh/id_ed25519", ".gnupg/private-keys-v1.d/k.key", ".aws/credentials", ".config/gcloud/adc.json"):
        (home / name).parent.mkdir(parents=True, exist_ok=True)
        (home / name).write_text(SECRET)
    (home / ".netrc").write_text(SECRET)
    (home / ".pgpass").write_text(SECRET)
    (home / ".bashrc").write_text("visible")
    monkeypatch.setenv("HOME", str(home))
    read = (
        "cat ~/.ssh/id_ed25519 ~/.gnupg/private-keys-v1.d/k.key ~/.aws/credentials ~/.config/gcloud/adc.json ~/.netrc"
        " ~/.pgpass"
    )
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        hidden = await run(executor, f"{read}; cat ~/.bashrc; head -c 5 /etc/shadow", work)
        assert SECRET not in hidden.stdout and hidden.stdout == "visible"
        assert "Permission denied" in hidden.stderr  # ~/.netrc and /etc/shadow: unreadable files
    async with open_bash_executor(
        BashRuntimeOptions(sandbox=SandboxPolicy(hide_defaults=False), grace_period=0.5)
    ) as executor:
        shown = await run(executor, read, work)
        assert shown.stdout == SECRET * 6


async def test_the_session_store_is_hidden_from_the_bash_tool(tmp_path: Path, outside: Path) -> None:
    store = outside / "store"
    (store / "other-session").mkdir(parents=True)
    (store / "other-session" / "log.jsonl").write_text(SECRET)
    command = f"echo entries: $(ls -A {store} | wc -l); cat {store}/other-session/log.jsonl"
    outputs = []
    for policy in (SandboxPolicy(), SandboxPolicy(hide_sessions=False)):
        model = ScriptedModel([{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}, {"text": "ok"}])
        async with open_test_harness(
            model,
            store=str(store),
            builtin_tools=["bash", "tasks"],
            bash_options=BashRuntimeOptions(sandbox=policy),
            bash_tool_options=BashToolOptions(requires_approval=False),
        ) as harness:
            async with harness.agents.open(cwd=str(tmp_path)) as agent:
                agent.followup("look")
                await agent.when_idle()
                (result,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
                outputs.append(result.content)
    assert SECRET not in outputs[0] and "entries: 0\n" in outputs[0], outputs[0]
    assert SECRET in outputs[1], outputs[1]


async def test_a_session_store_not_hidden_is_still_read_only(work: Path) -> None:
    """hide_sessions=False shows the store to commands, never lets them rewrite it (forged history), even in cwd."""
    store = work / "sessions"
    command = (
        "cat sessions/s1/session.jsonl > /dev/null && echo READ; echo forged >> sessions/s1/session.jsonl;"
        " touch sessions/s1/new.lock; mv sessions moved; rm -rf sessions/s1; ls sessions"
    )
    model = ScriptedModel([{"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}, {"text": "ok"}])
    async with open_test_harness(
        model,
        store=str(store),
        builtin_tools=["bash", "tasks"],
        bash_options=BashRuntimeOptions(sandbox=SandboxPolicy(hide_sessions=False)),
        bash_tool_options=BashToolOptions(requires_approval=False),
    ) as harness:
        async with harness.agents.open(session_id="s1", cwd=str(work)) as agent:
            await agent.session.flush()  # the log exists before the command runs
            agent.followup("look")
            await agent.when_idle()
            (result,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
    assert "READ" in result.content and "Read-only file system" in result.content, result.content
    lines = (store / "s1" / "session.jsonl").read_text().splitlines()
    assert "forged" not in lines and not (store / "s1" / "new.lock").exists() and not (work / "moved").exists()


@pytest.mark.skipif(shutil.which("git") is None and not os.environ.get("CI"), reason="git is not installed")
async def test_git_hooks_and_config_are_read_only(work: Path) -> None:
    subprocess.run(["git", "init", "-q", str(work)], check=True)
    config = (work / ".git" / "config").read_text()
    shutil.rmtree(work / ".git" / "hooks")  # a repository without a hooks directory gets one, while a command runs
    attack = (
        "echo 'touch pwned' > .git/hooks/pre-commit; printf '[core]\\n\\tfsmonitor = touch pwned\\n' >> .git/config;"
        " mv .git .git.moved; mv .git/hooks .git/hooks.moved"
    )
    commit = "git -c user.name=a -c user.email=a@b commit -q --allow-empty -m work && git log --format=%s"
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        refused = await run(executor, attack, work)
        assert refused.stderr.count("Read-only file system") == 2, refused.stderr
        assert refused.stderr.count("Device or resource busy") == 2, refused.stderr
        assert not (work / ".git" / "hooks" / "pre-commit").exists()
        assert (work / ".git" / "config").read_text() == config
        assert (work / ".git").is_dir() and not (work / ".git.moved").exists()
        committed = await run(executor, commit, work)  # the repository still works
        assert (committed.exit_code, committed.stdout) == (0, "work\n"), committed.stderr
        assert not (work / ".git" / "hooks").exists()  # made for each command, removed after it
    async with open_bash_executor(
        BashRuntimeOptions(sandbox=SandboxPolicy(protect_git=False), grace_period=0.5)
    ) as executor:
        allowed = await run(executor, "mkdir .git/hooks && echo 'exit 0' > .git/hooks/pre-commit", work)
        assert allowed.exit_code == 0 and (work / ".git" / "hooks" / "pre-commit").exists()


async def test_tmp_has_a_size_cap(work: Path) -> None:
    async with open_bash_executor(
        BashRuntimeOptions(sandbox=SandboxPolicy(tmp_size=1 << 20), grace_period=0.5)
    ) as executor:
        full = await run(executor, "head -c 2000000 /dev/zero > /tmp/big", work)
        assert full.exit_code != 0 and "No space left on device" in full.stderr
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        size = await run(executor, "df -k --output=size /tmp | tail -1", work)
        assert int(size.stdout) == 1 << 20  # KiB: 1 GiB by default
    with pytest.raises(BashError, match="tmp_size must be a positive integer"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(tmp_size=0))):
            pass
    with pytest.raises(BashError, match="max_processes must be at least 8"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(max_processes=2))):
            pass


def _python_seen_inside() -> str:
    """An interpreter path the sandbox can see: its /tmp is private, so a checkout (and its virtual
    environment) under /tmp is not there; the interpreter a virtual environment links to usually is."""
    for candidate in (os.path.realpath(sys.executable), "/usr/bin/python3"):
        if not candidate.startswith(("/tmp/", tempfile.gettempdir() + os.sep)) and os.access(candidate, os.X_OK):
            return candidate
    raise AssertionError(f"no Python outside /tmp to run inside the sandbox (this one is {sys.executable})")


async def test_unix_sockets_follow_the_policy(work: Path, outside: Path) -> None:
    path = outside / "agent.sock"
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    listener.listen(8)
    listener.setblocking(False)
    python = _python_seen_inside()
    connect = f"{python} -c 'import socket; socket.socket(socket.AF_UNIX).connect(\"{path}\")'"
    pair = f"{python} -c 'import socket; a, b = socket.socketpair(); a.send(b\"ok\"); print(b.recv(2))'"

    def accepted() -> int:
        count = 0
        while True:
            try:
                conn, _ = listener.accept()
            except BlockingIOError:
                return count
            conn.close()
            count += 1

    try:
        cases = [
            (SandboxPolicy(), False),
            (SandboxPolicy(unix_sockets=True), True),
            (SandboxPolicy(network=True), True),
            (SandboxPolicy(network=True, unix_sockets=False), False),
            (SandboxPolicy(unix_sockets=True, hidden=[str(path)]), False),
        ]
        for policy, reachable in cases:
            async with open_bash_executor(BashRuntimeOptions(sandbox=policy, grace_period=0.5)) as executor:
                result = await run(executor, connect, work)
                assert (result.exit_code == 0, accepted()) == (reachable, int(reachable)), (policy, result)
                if not reachable and not policy.allows_unix_sockets:
                    assert "Operation not permitted" in result.stderr
                assert (await run(executor, pair, work)).stdout == "b'ok'\n"  # socketpair stays allowed
    finally:
        listener.close()


# ------------------------------------------------------------------ the probe


def _bwrap_without(tmp_path: Path, option: str) -> str:
    """A bwrap that drops ``option`` and its argument from its command line, then runs the real one."""
    real = shutil.which("bwrap")
    assert real is not None
    script = tmp_path / f"bwrap-without{option}"
    script.write_text(
        "#!/bin/sh\n"
        'for a; do shift; if [ -n "$skip" ]; then skip=; continue; fi\n'
        f'if [ "$a" = {option} ]; then skip=1; continue; fi; set -- "$@" "$a"; done\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


@pytest.mark.skipif(not AS_ROOT, reason="only a bwrap run by root keeps capabilities to drop")
async def test_the_probe_refuses_a_sandbox_that_keeps_capabilities(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError, match=r"still has capabilities \(CapEff 000001ff"):
        async with open_bash_executor(
            BashRuntimeOptions(sandbox=SandboxPolicy(bwrap=_bwrap_without(tmp_path, "--cap-drop")))
        ):
            raise AssertionError("opened a sandbox with capabilities")


async def test_the_probe_refuses_a_sandbox_without_its_filter(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError, match=r"runs without the seccomp filter \(Seccomp 0\)"):
        async with open_bash_executor(
            BashRuntimeOptions(sandbox=SandboxPolicy(bwrap=_bwrap_without(tmp_path, "--seccomp")))
        ):
            raise AssertionError("opened a sandbox without its filter")


def test_a_linked_worktrees_git_directory_in_a_writable_path_is_protected_too(tmp_path: Path) -> None:
    """The .git file of the writable directory names a git directory (and a common one) another writable path holds."""
    from _sandbox_attacks import _git_layout

    from trio_harness.bash._sandbox_git import git_binds
    from trio_harness.bash._sandbox_hold import Hold

    _git_layout(tmp_path)
    linked, git = str(tmp_path / "linked"), tmp_path / ".git"
    pinned: list[str] = []

    def pin(directory: str) -> list[str]:
        pinned.append(directory)
        return []

    hold = Hold()
    binds = git_binds(linked, [linked, str(tmp_path)], pin, hold=hold)
    read_only = {binds[i + 1] for i, arg in enumerate(binds) if arg == "--ro-bind"}
    assert read_only == {
        f"{linked}/.git",
        str(git / "worktrees" / "w" / "commondir"),
        str(git / "worktrees" / "w" / "config.worktree"),  # made: extensions.worktreeConfig is on
        str(git / "hooks"),  # made, as it was missing
        str(git / "commondir"),  # made, as it was missing: '.'
        str(git / "config"),
        str(git / "config.worktree"),  # made
    }
    assert (git / "worktrees" / "w" / "config.worktree").read_text() == ""
    assert (git / "commondir").read_text() == ".\n"
    assert pinned == [str(git / "worktrees" / "w"), str(git)]
    assert hold.release() == []
    made = ("worktrees/w/config.worktree", "hooks", "commondir", "config.worktree")
    assert not any((git / name).exists() for name in made)
    # Outside every writable path, the git directory it names is read-only anyway: only the file is bound.
    hold = Hold()
    assert git_binds(linked, [linked], pin, hold=hold) == ["--ro-bind", f"{linked}/.git", f"{linked}/.git"]
    assert hold.release() == []


@pytest.mark.skipif(shutil.which("git") is None and not os.environ.get("CI"), reason="git is not installed")
def test_a_linked_worktrees_common_directory_and_checkout_are_found_as_git_finds_them(tmp_path: Path) -> None:
    """A linked worktree's commondir names its common git directory relative to its own git directory (git
    takes hooks and config from there, whichever repository lists it), and its gitdir file names its checkout's
    .git file (relative to it too, as git 2.48's worktree.useRelativePaths writes it): both protected."""
    from trio_harness.bash._sandbox_git import git_binds
    from trio_harness.bash._sandbox_hold import Hold

    main, other = tmp_path / "main", tmp_path / "other.git"
    subprocess.run(["git", "init", "-q", str(main)], check=True)
    commit = ["git", "-C", str(main), "-c", "user.name=a", "-c", "user.email=a@b", "commit", "-q", "--allow-empty"]
    subprocess.run([*commit, "-m", "a"], check=True)
    subprocess.run(["git", "-C", str(main), "worktree", "add", "-q", "wt"], check=True, capture_output=True)
    entry = main / ".git" / "worktrees" / "wt"
    (entry / "gitdir").write_text("../../../wt/.git\n")
    shutil.copytree(main / ".git", other)  # a copy of the repository, whose hooks git now runs in wt
    (entry / "commondir").write_text("../../../../other.git\n")
    said = subprocess.run(["git", "-C", str(main / "wt"), "rev-parse", "--git-path", "hooks"], capture_output=True)
    assert said.stdout.decode().strip() == str(other / "hooks"), said
    hold = Hold()
    binds = git_binds(str(main), [str(main), str(tmp_path)], lambda directory: [], hold=hold)
    hold.release()
    read_only = {binds[i + 1] for i, arg in enumerate(binds) if arg == "--ro-bind"}
    assert {str(other / "hooks"), str(other / "config"), str(main / "wt" / ".git")} <= read_only, read_only
    # Outside every writable path the common directory is read-only anyway: not bound.
    hold = Hold()
    binds = git_binds(str(main), [str(main)], lambda directory: [], hold=hold)
    hold.release()
    assert not any(path.startswith(str(other)) for path in binds)


@pytest.mark.skipif(shutil.which("git") is None and not os.environ.get("CI"), reason="git is not installed")
async def test_a_git_file_is_read_as_git_reads_it(work: Path) -> None:
    """Git takes what follows 'gitdir: ' as it is: 'gitdir:  meta' names ' meta', missing (a command could make
    it), though meta is a git directory."""
    subprocess.run(["git", "init", "-q", "--bare", str(work / "meta")], check=True)
    (work / ".git").write_text("gitdir:  meta\n")
    said = subprocess.run(["git", "-C", str(work), "rev-parse", "--git-dir"], capture_output=True, text=True)
    assert f"not a git repository: {work}/ meta" in said.stderr, said
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        with pytest.raises(BashError, match=r"names the git directory ' meta' \(.*/ meta\), which is not a git"):
            await run(executor, "git init -q --bare ' meta'", work)
    assert not (work / " meta").exists()


async def test_a_git_link_a_command_could_replace_refuses_commands_until_it_is_a_file(work: Path) -> None:
    """A symbolic link cannot be a mount point: a .git link in the writable directory is refused, with the fix."""
    (work / "meta" / "hooks").mkdir(parents=True)
    (work / "meta" / "HEAD").write_text("ref: refs/heads/main\n")
    (work / ".git").symlink_to("meta")
    fix = f"echo 'gitdir: {work}/meta' > {work}/.git"
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        with pytest.raises(BashError, match=r"\.git' is a symbolic link \(to 'meta'\) that git follows") as refused:
            await run(executor, "touch ran", work)
        assert fix in str(refused.value)
        with pytest.raises(BashError, match=r"symbolic link \(to 'meta'\)"):
            await executor.start(executor.resolve(BashRequest("touch ran", workdir=str(work))))
        assert not (work / "ran").exists()
        (work / ".git").unlink()
        subprocess.run(fix, shell=True, check=True)  # the fix as the message gives it
        assert (await run(executor, "touch ran; echo x > meta/hooks/pre-commit", work)).exit_code != 0
        assert (work / "ran").exists() and not (work / "meta" / "hooks" / "pre-commit").exists()
    # The policy's writable paths are checked when the executor opens.
    (work / ".git").unlink()
    (work / ".git").symlink_to("meta")
    with pytest.raises(BashError, match=r"is a symbolic link \(to 'meta'\)"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(writable=[str(work)]))):
            raise AssertionError("opened")


async def test_a_git_link_outside_the_writable_directory_is_followed_and_checked(work: Path, outside: Path) -> None:
    """A link no command can change is allowed (what it leads to is protected); replaced on the host, or held
    by a later command's writable directory, it refuses commands."""
    (work / "real" / "meta" / "hooks").mkdir(parents=True)
    (work / "real" / "meta" / "HEAD").write_text("ref: refs/heads/main\n")
    (outside / "lnk").symlink_to(work / "real")
    (work / ".git").write_text(f"gitdir: {outside}/lnk/meta\n")
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        assert (await run(executor, "echo x > real/meta/hooks/pre-commit || echo refused", work)).stdout == "refused\n"
        with pytest.raises(BashError, match=r"writable directory '.*' holds it"):
            await run(executor, "true", outside)  # it could replace the link
        (outside / "lnk").unlink()
        (outside / "lnk").symlink_to(work)
        with pytest.raises(BashError, match=r"lnk' was a symbolic link to '.*real', .* now points to"):
            await run(executor, "true", work)
        (outside / "lnk").unlink()
        (outside / "lnk").symlink_to(work / "real")  # as it was: commands run again
        assert (await run(executor, "true", work)).exit_code == 0
    assert not (work / "real" / "meta" / "hooks" / "pre-commit").exists()


async def test_a_git_file_naming_a_missing_git_directory_is_refused(work: Path) -> None:
    (work / ".git").write_text("gitdir: gd\n")
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        with pytest.raises(BashError, match=r"names the git directory 'gd' \(.*/gd\), which is not a git directory"):
            await run(executor, "git init -q --bare gd", work)
    assert not (work / "gd").exists()


async def test_a_hook_that_is_a_link_has_its_script_read_only(work: Path) -> None:
    (work / ".git" / "hooks").mkdir(parents=True)
    (work / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (work / "tools").mkdir()
    (work / "tools" / "pre-commit").write_text("#!/bin/sh\n")
    (work / ".git" / "hooks" / "pre-commit").symlink_to("../../tools/pre-commit")
    async with open_bash_executor(BashRuntimeOptions(sandbox=True, grace_period=0.5)) as executor:
        done = await run(executor, "echo 'touch pwned' >> tools/pre-commit; mv tools tools2; rm tools/pre-commit", work)
        assert done.exit_code != 0
    assert (work / "tools" / "pre-commit").read_text() == "#!/bin/sh\n"
