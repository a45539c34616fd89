"""The lifeline: nothing the harness starts outlives the harness process, however it dies.

Real processes throughout: the harness runs as a subprocess (``trio-harness run``,
``trio-harness acp``, a Python program using the library), its model starts a
background bash command leaving a TERM-ignoring grandchild, a process that left
the group (``setsid``) and one that cleared its environment (``env -i``), and a
stdio MCP server with a child of its own that ignores SIGTERM.  The harness is
then killed; every one of those processes must be gone within 2 s.

The bash processes are found by a marker in their command line (``sleep
1001.<N>``), which also works for processes inside the sandbox's PID namespace.
Waits run on the real clock, each bounded.
"""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
import trio
from _acp_clients import open_server
from _util import WAIT, group_alive, read_line

from trio_harness import BashError, _lifeline
from trio_harness.bash import BashRequest, BashRuntimeOptions, SandboxUnavailableError, open_bash_executor

SERVERS = Path(__file__).resolve().parent / "mcp_servers"
# What the issue asks: everything gone within 2 s of the harness dying.
DEADLINE = 2.0


# ------------------------------------------------------------------ helpers


def marker() -> str:
    """A number no other test's processes use, for ``sleep`` command lines."""
    return str(secrets.randbelow(10**9))


def background_command(mark: str) -> str:
    """A command that leaves three kinds of stragglers and then waits for them."""
    return (
        f"(trap '' TERM; exec sleep 1001.{mark}) & "  # a grandchild ignoring SIGTERM, in the group
        f"setsid sleep 1002.{mark} & "  # one that left the group (and session)
        f"env -i sleep 1003.{mark} & "  # one without the harness's environment, in the group
        "echo started; wait"
    )


def marked(mark: str) -> dict[int, str]:
    """Live (non-zombie) processes whose command line carries ``mark``: pid -> command line."""
    found: dict[int, str] = {}
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/cmdline", "rb") as f:
                cmdline = f.read().replace(b"\0", b" ").decode(errors="replace")
            with open(f"/proc/{name}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        if cmdline.startswith("sleep 100") and f".{mark}" in cmdline and stat[stat.rindex(")") + 2] not in "ZX":
            found[int(name)] = cmdline.strip()
    return found


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def mcp_server(record: Path) -> dict[str, Any]:
    """The stdio test server: a child of its own (``sleep 300``), SIGTERM and end of input ignored."""
    return {"command": sys.executable, "args": [str(SERVERS / "calc_server.py"), "--record", str(record), "--child"]}


def server_pid(record: Path) -> int | None:
    lines = record.read_text(encoding="utf-8").splitlines() if record.exists() else []
    pids = [int(line.split()[1]) for line in lines if line.startswith("pid ")]
    return pids[0] if pids else None


def bash_call(mark: str) -> dict[str, Any]:
    arguments = {"command": background_command(mark), "run_in_background": True, "description": "stragglers"}
    return {"name": "bash", "arguments": arguments}


async def wait_started(mark: str, record: Path | None, process: trio.Process, log: Path) -> int | None:
    """Wait until the three bash stragglers run (and the MCP server with its child); return the server's pid."""
    deadline = trio.current_time() + WAIT
    while True:
        pid = server_pid(record) if record is not None else None
        running = marked(mark)
        if len(running) == 3 and (record is None or (pid is not None and group_alive(pid))):
            return pid
        if process.poll() is not None or trio.current_time() > deadline:
            said = log.read_text(errors="replace") if log.exists() else ""
            raise AssertionError(f"not started: {running}, MCP server {pid}; the harness said: {said}")
        await trio.sleep(0.02)


async def assert_all_gone(mark: str, server: int | None) -> None:
    """Every marked process and the MCP server's group are gone within DEADLINE of now."""
    started = time.monotonic()
    while True:
        left = marked(mark)
        server_left = server is not None and group_alive(server)
        if not left and not server_left:
            return
        if time.monotonic() - started > DEADLINE:
            for pid in left:  # do not leave them to the next test
                os.kill(pid, signal.SIGKILL)
            if server is not None:
                os.killpg(server, signal.SIGKILL)
            raise AssertionError(f"still running {DEADLINE} s after the harness died: {left}, MCP group {server_left}")
        await trio.sleep(0.02)


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}


# ------------------------------------------------------------------ the command line and ACP


async def test_cli_run_killed_with_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    mark = marker()
    record = tmp_path / "record.txt"
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"tool_calls": [bash_call(mark)]}, {"hang": True}]}))
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {"calc": mcp_server(record)}}))
    stderr = tmp_path / "run.stderr"
    argv = [sys.executable, "-m", "trio_harness", "run", "go", "--model", f"scripted:{script}"]
    argv += ["--store", str(tmp_path / "store"), "--yes", "--mcp-config", str(config)]
    with stderr.open("wb") as err:
        process = await trio.lowlevel.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=tmp_path, env=cli_env()
        )
    try:
        server = await wait_started(mark, record, process, stderr)
    finally:
        process.kill()
        await process.wait()
    await assert_all_gone(mark, server)


async def test_acp_killed_with_sigkill_leaves_no_process_behind(tmp_path: Path) -> None:
    mark = marker()
    record = tmp_path / "record.txt"
    server_config = {"name": "calc", "env": [], **mcp_server(record)}
    responses: list[dict[str, Any]] = [{"tool_calls": [bash_call(mark)]}, {"hang": True}]
    async with open_server(tmp_path, responses, extra=("--yes",)) as client:
        await client.initialize()
        new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": [server_config]})
        await client.send(client.prompt(new["sessionId"], "go"))
        try:
            server = await wait_started(mark, record, client.process, tmp_path / "script.stderr")
        finally:
            client.process.kill()
            await client.process.wait()
    await assert_all_gone(mark, server)


# ------------------------------------------------------------------ the library

LIBRARY_PROGRAM = """
import signal
import sys
import trio
from trio_harness import BashRuntimeOptions, BashToolOptions, McpStdioServer, ScriptedModel, open_harness

signal.signal(signal.SIGINT, signal.default_int_handler)  # even when started with SIGINT ignored

mark, record, server, sandbox = sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4] == "1"

async def main():
    model = ScriptedModel([{"tool_calls": [CALL]}, {"hang": True}])
    mcp = McpStdioServer(name="calc", command=sys.executable, args=(server, "--record", record, "--child"))
    async with open_harness(
        model=model,
        bash_options=BashRuntimeOptions(sandbox=sandbox),
        bash_tool_options=BashToolOptions(requires_approval=False),
        mcp_servers=[] if sandbox else [mcp],
    ) as harness, harness.agents.open() as agent:
        agent.followup("go")
        await trio.sleep_forever()

trio.run(main)
"""


async def run_library(tmp_path: Path, mark: str, record: Path, *, sandbox: bool) -> trio.Process:
    program = tmp_path / "program.py"
    program.write_text(LIBRARY_PROGRAM.replace("CALL", repr(bash_call(mark))), encoding="utf-8")
    stderr = tmp_path / "program.stderr"
    argv = [sys.executable, str(program), mark, str(record), str(SERVERS / "calc_server.py"), "1" if sandbox else "0"]
    with stderr.open("wb") as err:
        return await trio.lowlevel.open_process(argv, stdin=subprocess.DEVNULL, stdout=err, stderr=err, cwd=tmp_path)


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT], ids=lambda s: s.name)
async def test_a_library_harness_killed_leaves_no_process_behind(tmp_path: Path, sig: signal.Signals) -> None:
    """SIGKILL and SIGTERM end the program at once; SIGINT runs the graceful teardown first."""
    mark = marker()
    record = tmp_path / "record.txt"
    process = await run_library(tmp_path, mark, record, sandbox=False)
    try:
        server = await wait_started(mark, record, process, tmp_path / "program.stderr")
        process.send_signal(sig)
        with trio.fail_after(WAIT):
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    await assert_all_gone(mark, server)


async def bwrap_works(tmp_path: Path) -> bool:
    try:
        async with open_bash_executor(BashRuntimeOptions(sandbox=True)):
            return True
    except SandboxUnavailableError:
        return False


async def test_a_sandboxed_command_goes_with_a_killed_harness(tmp_path: Path) -> None:
    if not await bwrap_works(tmp_path):
        pytest.skip("bubblewrap cannot run here")
    mark = marker()
    process = await run_library(tmp_path, mark, tmp_path / "record.txt", sandbox=True)
    try:
        await wait_started(mark, None, process, tmp_path / "program.stderr")
    finally:
        process.kill()
        await process.wait()
    await assert_all_gone(mark, None)


# ------------------------------------------------------------------ the watchdog


@contextmanager
def spawned(
    argv: list[str], env: dict[str, str] | None = None, new_session: bool = True
) -> Iterator[subprocess.Popen[bytes]]:
    process = subprocess.Popen(argv, env=env, start_new_session=new_session)
    try:
        yield process
    finally:
        process.kill()
        process.wait()


def start_time(pid: int) -> int:
    stat = _lifeline._stat(pid)
    assert stat is not None
    return stat[3]


async def wait_dead(process: subprocess.Popen[bytes]) -> int:
    with trio.fail_after(WAIT):
        while process.poll() is None:
            await trio.sleep(0.01)
    return process.returncode


async def test_the_watchdog_kills_only_what_is_ours() -> None:
    token = secrets.token_hex(16)
    env = dict(os.environ)
    with (
        spawned(["sleep", "300"], env={**env, "TRIO_HARNESS_LIFELINE": f"other:{token}"}) as with_token,
        spawned(["sleep", "300"]) as registered,
        spawned(["sleep", "300"]) as plain,
        spawned(["sleep", "300"], env={**env, "TRIO_HARNESS_LIFELINE": "other", "X": token}) as other_token,
        spawned(["sleep", "300"], env={**env, "TRIO_HARNESS_LIFELINE": token[:-1]}) as prefix,
        spawned(["sleep", "300"]) as reused,
    ):
        # ``reused`` stands for a group's pid taken by another process after the
        # harness registered it: that process started after the registration.
        groups = {registered.pid: start_time(registered.pid), reused.pid: start_time(reused.pid) - 1}
        _lifeline._kill_ours(token.encode(), groups)
        assert await wait_dead(with_token) == -signal.SIGKILL
        assert await wait_dead(registered) == -signal.SIGKILL
        for process in (plain, other_token, prefix, reused):
            assert process.poll() is None, process.args


async def test_a_lifeline_kills_its_groups_and_tokens_when_closed_and_not_before() -> None:
    line = _lifeline.Lifeline()
    watchdog = line.watchdog_pid
    assert watchdog is not None and alive(watchdog)
    group = "trap '' TERM; sleep 300 & exec sleep 300"
    with (
        spawned(["sh", "-c", group]) as leader,
        spawned(["sh", "-c", group]) as forgotten,
        spawned(["sleep", "300"], env=line.env({"PATH": os.environ["PATH"]})) as token_only,
        spawned(["sleep", "300"]) as unrelated,
    ):
        line.register(leader.pid)
        line.register(forgotten.pid)
        line.unregister(forgotten.pid)
        # The watchdog ignores the signals a terminal or a process-group kill sends the harness.
        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            os.kill(watchdog, sig)
        await trio.sleep(0.2)
        assert alive(watchdog)
        assert all(p.poll() is None for p in (leader, forgotten, token_only, unrelated))
        line.close()
        assert await wait_dead(leader) == -signal.SIGKILL
        assert await wait_dead(token_only) == -signal.SIGKILL
        with trio.fail_after(WAIT):
            while group_alive(leader.pid) or alive(watchdog):
                await trio.sleep(0.01)
        assert os.waitpid(watchdog, 0)[1] == 0
        assert forgotten.poll() is None and group_alive(forgotten.pid)
        assert unrelated.poll() is None
        os.killpg(forgotten.pid, signal.SIGKILL)


async def test_a_dead_watchdog_is_replaced_by_the_next_spawn(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    line = _lifeline.Lifeline()
    monkeypatch.setattr(_lifeline, "_default", line)
    first = line.watchdog_pid
    assert first is not None
    with spawned(["sh", "-c", "sleep 300 & exec sleep 300"]) as leader:
        line.register(leader.pid)
        os.kill(first, signal.SIGKILL)
        with trio.fail_after(WAIT):
            while alive(first):
                await trio.sleep(0.01)
        async with open_bash_executor() as executor:  # a spawn notices and starts another watchdog
            assert (await executor.run(executor.resolve(BashRequest("echo ok")))).stdout == "ok\n"
        assert line.watchdog_pid not in (None, first)
        assert f"the lifeline watchdog (pid {first}) died; started another" in caplog.text
        line.close()  # the new watchdog knows the group registered before it started
        assert await wait_dead(leader) == -signal.SIGKILL
        with trio.fail_after(WAIT):
            while group_alive(leader.pid):
                await trio.sleep(0.01)


async def test_a_watchdog_that_cannot_start_fails_the_command_with_a_clear_error(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(_lifeline, "_default", None)
    monkeypatch.setattr(sys, "executable", str(tmp_path / "no-python"))
    async with open_bash_executor() as executor:
        with pytest.raises(BashError, match=r"could not start the lifeline watchdog .*no-python"):
            await executor.run(executor.resolve(BashRequest("true")))
    assert _lifeline._default is None


FORKING_PROGRAM = """
import os, subprocess, sys, time
from trio_harness import _lifeline

line = _lifeline.lifeline()
group = subprocess.Popen(["sleep", "300"], env=line.env(os.environ), start_new_session=True)
line.register(group.pid)
child = os.fork()
if child == 0:  # a fork without exec, as multiprocessing's "fork" makes: it must not hold the lifeline open
    time.sleep(300)
    os._exit(0)
print(group.pid, child, flush=True)
time.sleep(300)
"""


async def test_a_fork_without_exec_does_not_hold_the_lifeline_open(tmp_path: Path) -> None:
    program = tmp_path / "forking.py"
    program.write_text(FORKING_PROGRAM, encoding="utf-8")
    process = await trio.lowlevel.open_process([sys.executable, str(program)], stdout=subprocess.PIPE)
    assert process.stdout is not None
    forked: list[int] = []
    try:
        line = await read_line(process.stdout, "the program")
        group, child = (int(word) for word in line.split())
        forked.append(child)
        process.kill()
        await process.wait()
        started = time.monotonic()
        while group_alive(group):
            assert time.monotonic() - started < DEADLINE, "the forked child kept the watchdog waiting"
            await trio.sleep(0.02)
        assert alive(child)  # not ours to kill: it carries no token and leads no registered group
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
        await process.stdout.aclose()
        for pid in forked:
            os.kill(pid, signal.SIGKILL)


HOPPING_COMMAND = """#!/bin/bash
[ -e "$HOP_STOP" ] && exit 0
echo $$ >> "$HOP_BEAT"
setsid -f "$0"
"""


async def test_a_process_hopping_to_new_sessions_does_not_outrun_the_watchdog(tmp_path: Path) -> None:
    """Each hop starts its successor in a new session and exits: at any instant one hop runs, with the token."""
    hop, beat, stop = tmp_path / "hop.sh", tmp_path / "beat", tmp_path / "stop"
    hop.write_text(HOPPING_COMMAND, encoding="utf-8")
    hop.chmod(0o755)
    line = _lifeline.Lifeline()
    assert line.watchdog_pid is not None
    env = line.env({**os.environ, "HOP_BEAT": str(beat), "HOP_STOP": str(stop)})
    try:
        with spawned([str(hop)], env=env) as first:
            line.register(first.pid)
            with trio.fail_after(WAIT):
                while not beat.exists() or len(beat.read_text().split()) < 20:  # it hops
                    await trio.sleep(0.01)
            line.close()
            with trio.fail_after(WAIT):
                while os.waitpid(line.watchdog_pid, os.WNOHANG)[0] == 0:
                    await trio.sleep(0.01)
            last = beat.read_text()
            await trio.sleep(0.3)  # a hop takes a few milliseconds: a live chain would have moved on
            assert beat.read_text() == last, "a hop outlived the watchdog"
    finally:
        stop.touch()  # ends a chain that escaped, at its next hop
