"""The bash sandbox (docs/sandbox.rst), with the real ``bwrap`` and real processes.

Without bubblewrap these tests skip, naming the package, unless ``CI`` is
set: then they fail (``.ci/run`` installs bubblewrap when it is missing).
The only real-clock pauses are polls while waiting for a real process to
change state.  Paths that must be read-only inside the sandbox are made under
``/var/tmp``: everything under ``/tmp`` is replaced by the sandbox's private
``/tmp``, so a write there would fail for another reason.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import NEEDS_BUBBLEWRAP, wait_until

from trio_harness import BashRuntimeOptions, BashToolOptions, ScriptedModel
from trio_harness.bash import (
    BashError,
    BashExecutor,
    BashProcess,
    BashRequest,
    SandboxPolicy,
    SandboxUnavailableError,
    open_bash_executor,
)
from trio_harness.bash._process import group_alive, open_group, reap_unsupervised, signal_group
from trio_harness.bash._sandbox import open_sandbox
from trio_harness.bash._sandbox_hold import Hold
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

pytestmark = NEEDS_BUBBLEWRAP

BOUND = 20.0


# ------------------------------------------------------------------ helpers


def members(pgid: int) -> dict[int, bytes]:
    """The group's running (non-zombie) members, pid -> command line."""
    found: dict[int, bytes] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
            cmdline = Path(f"/proc/{name}/cmdline").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            found[int(name)] = cmdline.replace(b"\0", b" ").strip()
    return found


def running(pid: int) -> bool:
    try:
        data = Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False
    return data[data.rfind(b")") + 2 :].split()[0] not in (b"Z", b"X")


def ignores_sigterm(pid: int) -> bool:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("SigIgn:"):
            return bool(int(line.split()[1], 16) & (1 << (signal.SIGTERM - 1)))
    raise AssertionError(f"no SigIgn line for {pid}")


async def read_until(process: BashProcess, text: str) -> str:
    seen = ""
    with trio.fail_after(BOUND):
        while text not in seen:
            seen += process.read_output()
            await trio.sleep(0.01)
    return seen


@pytest.fixture
def outside() -> Iterator[Path]:
    """A host directory outside /tmp (so it is visible, read-only, inside the sandbox)."""
    path = Path(tempfile.mkdtemp(prefix="trio-harness-sandbox-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


@asynccontextmanager
async def sandboxed(**options: Any) -> AsyncIterator[BashExecutor]:
    policy = options.pop("policy", SandboxPolicy())
    async with open_bash_executor(
        BashRuntimeOptions(sandbox=policy, grace_period=options.pop("grace_period", 0.5), **options)
    ) as executor:
        yield executor


async def run(executor: BashExecutor, command: str, workdir: Path, **request: Any) -> Any:
    return await executor.run(executor.resolve(BashRequest(command, workdir=str(workdir), **request)))


# ------------------------------------------------------------------ file system


async def test_writes_inside_the_working_directory_succeed_and_outside_fail(tmp_path: Path, outside: Path) -> None:
    work = tmp_path / "work"
    work.mkdir()
    async with sandboxed() as executor:
        inside = await run(executor, "echo kept > inside.txt && cat inside.txt", work)
        assert (inside.exit_code, inside.stdout, inside.stderr) == (0, "kept\n", "")
        assert (work / "inside.txt").read_text() == "kept\n"

        refused = await run(executor, f"echo lost > {outside}/outside.txt", work)
        assert refused.exit_code != 0
        assert "Read-only file system" in refused.stderr  # the model reads why
        assert not (outside / "outside.txt").exists()

        # Beside the working directory under /tmp lies the private /tmp: a write
        # there may succeed, but never reaches the host.
        await run(executor, f"echo lost > {tmp_path}/sibling.txt", work)
        assert not (tmp_path / "sibling.txt").exists()


async def test_writable_dir_not_workdir_decides_what_is_writable(tmp_path: Path, outside: Path) -> None:
    async with sandboxed() as executor:
        spec = executor.resolve(BashRequest("touch kept", workdir=str(outside), writable_dir=str(tmp_path)))
        assert spec.writable_dir == str(tmp_path)
        result = await executor.run(spec)
        assert result.exit_code != 0 and "Read-only file system" in result.stderr
        assert not (outside / "kept").exists()
        result = await run(executor, f"touch {tmp_path}/kept", outside, writable_dir=str(tmp_path))
        assert result.exit_code == 0, result
        assert (tmp_path / "kept").exists()
        with pytest.raises(BashError, match="writable_dir"):
            executor.resolve(BashRequest("true", workdir=str(outside), writable_dir=str(tmp_path / "missing")))
        with pytest.raises(BashError, match="cannot make '/' writable"):
            executor.resolve(BashRequest("true", workdir="/"))
        with pytest.raises(BashError, match="cannot make '/' writable"):
            executor.resolve(BashRequest("true", workdir=str(outside), writable_dir="/"))
    with pytest.raises(BashError, match="cannot make '/' writable"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(writable=["/"]))):
            pass
    async with open_bash_executor() as executor:  # without a sandbox it is ignored
        assert executor.resolve(BashRequest("true", writable_dir=str(tmp_path / "missing"))).writable_dir is None


async def test_tmp_is_private_to_each_command(tmp_path: Path) -> None:
    name = f"trio-harness-leak-{os.getpid()}-{id(tmp_path)}"
    async with sandboxed() as executor:
        wrote = await run(executor, f"echo secret > /tmp/{name} && cat /tmp/{name}", tmp_path)
        assert (wrote.exit_code, wrote.stdout) == (0, "secret\n")
        assert not Path("/tmp", name).exists()
        again = await run(executor, f"test ! -e /tmp/{name}", tmp_path)
        assert again.exit_code == 0


async def test_extra_writable_and_hidden_paths(tmp_path: Path, outside: Path) -> None:
    extra = outside / "extra"
    extra.mkdir()
    secret_dir = outside / "secrets"
    secret_dir.mkdir()
    (secret_dir / "key").write_text("hunter2")
    secret_file = outside / "token"
    secret_file.write_text("t0ken")
    policy = SandboxPolicy(writable=[str(extra)], hidden=(str(secret_dir), str(secret_file), str(outside / "absent")))
    async with sandboxed(policy=policy) as executor:
        result = await run(executor, f"echo more > {extra}/f && ls -A {secret_dir}", tmp_path)
        assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")  # an empty directory
        assert (extra / "f").read_text() == "more\n"
        assert (secret_dir / "key").read_text() == "hunter2"  # hidden, not touched
        result = await run(executor, f"cat {secret_file}", tmp_path)
        assert result.exit_code != 0 and "Permission denied" in result.stderr  # an unreadable file
        assert "t0ken" not in result.stdout

    with pytest.raises(BashError, match="does not exist"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(writable=str(outside / "missing")))):
            pass


async def test_environment_passes_through(tmp_path: Path) -> None:
    async with sandboxed() as executor:
        result = await run(executor, 'echo "$SANDBOX_VAR $HOME"', tmp_path, env={"SANDBOX_VAR": "v"})
        assert result.stdout == f"v {os.environ.get('HOME', '')}\n"


# ------------------------------------------------------------------ network


async def test_network_is_refused_by_default_and_allowed_by_the_policy(tmp_path: Path) -> None:
    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    listener = listeners[0]
    port = listener.socket.getsockname()[1]
    command = f"exec 3<>/dev/tcp/127.0.0.1/{port} && echo hello >&3"
    received: list[bytes] = []
    async with listener:
        async with sandboxed() as executor:
            refused = await run(executor, command, tmp_path)
        assert refused.exit_code != 0
        assert "Connection refused" in refused.stderr

        async def serve_one() -> None:
            stream = await listener.accept()
            async with stream:
                while data := await stream.receive_some():
                    received.append(data)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(serve_one)
            async with sandboxed(policy=SandboxPolicy(network=True)) as executor:
                allowed = await run(executor, command, tmp_path)
            assert (allowed.exit_code, allowed.stderr) == (0, "")
            with trio.fail_after(BOUND):
                while b"".join(received) != b"hello\n":
                    await trio.sleep(0.01)
    assert b"".join(received) == b"hello\n"


# ------------------------------------------------------------------ process groups


async def test_the_proc_scan_sees_the_sandbox_after_bwrap_exits(tmp_path: Path) -> None:
    """bwrap leads the group; what runs inside keeps the group alive until SIGKILL ends it."""
    sandbox = await open_sandbox(SandboxPolicy(), "/bin/bash")
    argv = sandbox.argv(
        ["/bin/bash", "-c", "(trap '' TERM; exec sleep 300) & echo started"],
        workdir=str(tmp_path),
        writable_dir=str(tmp_path),
        hold=Hold(),  # no repository: nothing made
    )
    process = await open_group(argv, str(tmp_path), None)
    try:
        assert process.stdout is not None
        with trio.fail_after(BOUND):
            assert await process.stdout.receive_some() == b"started\n"
            assert await process.wait() == 0  # bwrap reports the shell's exit
        # The subshell may not have exec'd sleep yet when bwrap exits: wait for it (bounded).
        await wait_until(lambda: b"sleep 300" in members(process.pid).values())
        inside = members(process.pid)
        assert group_alive(process.pid)
        signal_group(process.pid, signal.SIGTERM)  # ignored by the sleep and by the sandbox's PID 1
        with trio.move_on_after(0.3):
            await wait_until(lambda: not group_alive(process.pid))
        assert group_alive(process.pid)
        signal_group(process.pid, signal.SIGKILL)
        await wait_until(lambda: not group_alive(process.pid))
        assert not any(running(pid) for pid in inside)
    finally:
        await reap_unsupervised(process)
        sandbox.close()


async def test_kill_leaves_nothing_including_a_grandchild_that_ignores_sigterm(tmp_path: Path) -> None:
    async with sandboxed(grace_period=0.5) as executor:
        spec = executor.resolve(
            BashRequest("(trap '' TERM; exec sleep 300) & sleep 300 & echo ready; wait", workdir=str(tmp_path))
        )
        process = await executor.start(spec)
        await read_until(process, "ready")
        await wait_until(lambda: len(members(process.pid)) >= 5)  # bwrap, its PID 1, bash, two sleeps
        inside = members(process.pid)
        stubborn = [pid for pid, cmd in inside.items() if cmd == b"sleep 300" and ignores_sigterm(pid)]
        assert len(stubborn) == 1, inside
        process.kill("test")
        with trio.fail_after(BOUND):
            facts = await process.wait()
        assert facts.killed and facts.kill_reason == "test"
        assert facts.signal == signal.SIGTERM  # bwrap itself died of the SIGTERM
        await wait_until(lambda: not any(running(pid) for pid in inside))
        assert not group_alive(process.pid)


async def test_sigterm_gives_the_command_its_grace_period(tmp_path: Path) -> None:
    """SIGTERM is not turned into an immediate SIGKILL of the sandbox: a trap still runs."""
    async with sandboxed(grace_period=10.0) as executor:
        command = "trap 'sleep 0.2; echo cleaned up; exit 3' TERM; echo ready; sleep 300 & wait"
        process = await executor.start(executor.resolve(BashRequest(command, workdir=str(tmp_path))))
        await read_until(process, "ready")
        process.kill()
        with trio.fail_after(BOUND):
            await process.wait()
        assert "cleaned up" in process.read_output()


async def test_a_process_that_leaves_the_group_still_dies_with_the_sandbox(tmp_path: Path) -> None:
    async with sandboxed(grace_period=0.2) as executor:
        command = "setsid bash -c 'exec sleep 301' & echo ready; wait"
        process = await executor.start(executor.resolve(BashRequest(command, workdir=str(tmp_path))))
        await read_until(process, "ready")

        def escaped() -> list[int]:
            found = []
            for name in os.listdir("/proc"):
                if name.isdigit() and running(int(name)):
                    try:
                        if Path(f"/proc/{name}/cmdline").read_bytes() == b"sleep\x00301\x00":
                            found.append(int(name))
                    except OSError:
                        continue
            return found

        await wait_until(lambda: bool(escaped()))
        (pid,) = escaped()
        assert pid not in members(process.pid)  # it left the group...
        process.kill()
        with trio.fail_after(BOUND):
            await process.wait()
        await wait_until(lambda: not running(pid))  # ...but not the sandbox


async def test_a_background_command_outlives_the_thread_that_spawned_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Trio spawns from a worker thread; bwrap's --die-with-parent would kill the sandbox when it retires."""
    monkeypatch.setattr(trio._core._thread_cache, "IDLE_TIMEOUT", 0.05)

    def workers() -> list[str]:
        import threading

        return [t.name for t in threading.enumerate() if t.name.startswith("Trio thread")]

    async with sandboxed() as executor:
        process = await executor.start(executor.resolve(BashRequest("echo ready; sleep 300", workdir=str(tmp_path))))
        await read_until(process, "ready")
        await wait_until(lambda: not workers())  # every worker thread has retired
        with trio.move_on_after(0.5):
            await process.wait()
        assert process.running, process.exit
        process.kill()
        with trio.fail_after(BOUND):
            await process.wait()


# ------------------------------------------------------------------ executor promises


async def test_exit_codes_foreground_background_and_owner(tmp_path: Path) -> None:
    async with sandboxed() as executor:
        assert (await run(executor, "exit 7", tmp_path)).exit_code == 7
        # bwrap passes on exit statuses only: a shell killed by signal N reports 128 + N.
        signalled = await run(executor, "kill -TERM $$", tmp_path)
        assert (signalled.exit_code, signalled.signal) == (128 + signal.SIGTERM, None)
        timed = await run(executor, "sleep 30", tmp_path, timeout=0.3)
        assert timed.timed_out

        spec = executor.resolve(BashRequest("echo out; echo err >&2; exit 5", workdir=str(tmp_path), owner="agent-1"))
        process = await executor.start(spec)
        assert executor.owner_of(process.id) == "agent-1"
        with trio.fail_after(BOUND):
            facts = await process.wait()
        assert (facts.exit_code, facts.killed) == (5, False)
        assert process.read_output() == "out\n[stderr]\nerr\n"
        assert executor.owner_of(process.id) == "agent-1"


async def test_background_output_tail_and_spill(tmp_path: Path) -> None:
    async with sandboxed(tail_bytes=1024, spill_dir=str(tmp_path)) as executor:
        work = tmp_path / "work"
        work.mkdir()
        process = await executor.start(executor.resolve(BashRequest("seq 1 20000; echo done >&2", workdir=str(work))))
        with trio.fail_after(BOUND):
            assert (await process.wait()).exit_code == 0
        text = process.read_output()
        assert "[output truncated: " in text and process.stdout_path in text
        assert text.endswith("20000\n[stderr]\ndone\n")
        expected = "".join(f"{n}\n" for n in range(1, 20001))
        assert Path(process.stdout_path).read_text() == expected
        assert Path(process.stderr_path).read_text() == "done\n"
        # The spill files are the executor's, outside the sandbox: the command cannot reach them.
        peek = await run(executor, f"cat {process.stdout_path}", work)
        assert peek.exit_code != 0
        await process.aclose()
        assert not os.path.exists(process.stdout_path)


# ------------------------------------------------------------------ unavailable


async def test_a_missing_bwrap_is_a_clear_error_at_open(tmp_path: Path) -> None:
    with pytest.raises(SandboxUnavailableError) as caught:
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(bwrap=str(tmp_path / "no-bwrap")))):
            raise AssertionError("opened without bwrap")
    message = str(caught.value)
    assert "no-bwrap" in message and "not found" in message
    assert "apt-get install bubblewrap" in message

    missing = BashRuntimeOptions(sandbox=SandboxPolicy(bwrap=str(tmp_path / "no-bwrap")))
    with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap"):
        async with open_test_harness(bash_options=missing):
            raise AssertionError("opened without bwrap")


async def test_a_bwrap_that_fails_its_probe_is_a_clear_error_at_open() -> None:
    with pytest.raises(SandboxUnavailableError, match=r"does not work here: '/bin/false' exited with 1"):
        async with open_bash_executor(BashRuntimeOptions(sandbox=SandboxPolicy(bwrap="/bin/false"))):
            raise AssertionError("opened with a failing bwrap")


async def test_a_bwrap_gone_after_open_is_a_clear_error_at_start(tmp_path: Path) -> None:
    real = shutil.which("bwrap")
    assert real is not None, "bubblewrap is not installed (apt-get install bubblewrap)"
    copy = tmp_path / "bwrap"
    shutil.copy(real, copy)
    async with sandboxed(policy=SandboxPolicy(bwrap=str(copy))) as executor:
        spec = executor.resolve(BashRequest("true", workdir=str(tmp_path)))
        assert (await executor.run(spec)).exit_code == 0
        copy.unlink()
        with pytest.raises(SandboxUnavailableError, match="apt-get install bubblewrap") as caught:
            await executor.start(spec)
        assert str(copy) in str(caught.value)
        with pytest.raises(SandboxUnavailableError):
            await executor.run(spec)
        assert executor.list() == []


# ------------------------------------------------------------------ the bash tool


def tool_results(session: Any) -> list[ev.ToolResult]:
    return [e for e in session.events if isinstance(e, ev.ToolResult)]


async def test_the_tool_says_it_is_sandboxed_and_writes_only_the_session_directory(
    tmp_path: Path, outside: Path
) -> None:
    calls = [
        {"name": "bash", "arguments": {"command": "echo a > made-here"}},
        {"name": "bash", "arguments": {"command": "echo b > made-there", "workdir": str(outside)}},
    ]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    unasked = BashToolOptions(requires_approval=False)
    sandboxed = BashRuntimeOptions(sandbox=True)
    async with open_test_harness(
        model, builtin_tools=["bash", "tasks"], bash_options=sandboxed, bash_tool_options=unasked
    ) as h:
        tool = h.tools.get("bash")
        assert tool is not None and "run in a sandbox" in tool.description
        async with h.agents.open(cwd=str(tmp_path)) as agent:
            agent.followup("go")
            await agent.when_idle()
            here, there = tool_results(agent.session)
        assert not here.is_error and (tmp_path / "made-here").read_text() == "a\n"
        assert there.is_error and "Read-only file system" in there.content  # the model's workdir is not writable
        assert not (outside / "made-there").exists()


async def test_the_tool_description_names_the_sandbox_only_when_it_is_on() -> None:
    from trio_harness.tools import BashToolPlugin

    hiding = BashRuntimeOptions(sandbox=SandboxPolicy(hidden=["~/.ssh"]))
    async with open_test_harness(builtin_tools=["tasks"], bash_options=hiding) as h:
        text = BashToolPlugin(h.bash, h.tasks, h.tools).tool().description
        assert "run in a sandbox" in text and "read-only" in text and "no network access" in text
        assert "~/.ssh" in text
    async with open_test_harness(builtin_tools=["tasks"]) as h:
        text = BashToolPlugin(h.bash, h.tasks, h.tools).tool().description
        assert "sandbox" not in text


def test_the_example_proves_no_network_with_a_listener_of_its_own(tmp_path: Path) -> None:
    example = Path(__file__).resolve().parent.parent / "examples" / "sandboxed_bash.py"
    done = subprocess.run([sys.executable, str(example)], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    dialled = re.search(r"exec 3<>/dev/tcp/([0-9.]+)/([0-9]+)", done.stdout)
    assert dialled is not None and dialled.group(1) == "127.0.0.1", done.stdout  # never an address off the machine
    assert f"the listener on 127.0.0.1:{dialled.group(2)} was never reached" in done.stdout
