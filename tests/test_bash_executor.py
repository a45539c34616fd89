"""Tests of the bash executor, with real subprocesses (no mocks).

Every wait is bounded.  The only real-clock pauses are polls while waiting for
a real process to produce output or to disappear.  Orphaned group members are
reparented to init, which may take a moment to reap their zombies; so "nothing
of the group survives" is checked in two steps: no member is running (right
away, modulo a short poll), and ``os.killpg(pgid, 0)`` raises
ProcessLookupError (once init has reaped them).
"""

from __future__ import annotations

import contextlib
import math
import os
import signal
import stat
from collections.abc import AsyncIterator, Mapping
from pathlib import Path

import pytest
import trio
from _util import WAIT, wait_until

from trio_harness._errors import BashError as BaseBashError
from trio_harness._errors import HarnessError
from trio_harness.bash import (
    BashError,
    BashExecutor,
    BashProcess,
    BashProcessNotFoundError,
    BashRequest,
    BashResult,
    BashRuntimeOptions,
    open_bash_executor,
)
from trio_harness.bash._render import render_result

# ------------------------------------------------------------------ helpers


def running_members(pgid: int) -> list[int]:
    """Pids of the group's members that are not zombies."""
    members = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            data = Path(f"/proc/{name}/stat").read_bytes()
        except OSError:
            continue
        fields = data[data.rfind(b")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            members.append(int(name))
    return members


def group_exists(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    return True


async def assert_group_gone(pgid: int) -> None:
    """Nothing of the group runs now, and the group disappears once init reaps zombies."""
    await wait_until(lambda: not running_members(pgid), bound=5.0)
    await wait_until(lambda: not group_exists(pgid))  # init may reap orphaned zombies late
    with pytest.raises(ProcessLookupError):
        os.killpg(pgid, 0)


async def read_pid_file(path: Path) -> int:
    await wait_until(lambda: path.exists() and path.read_text().endswith("\n"))
    return int(path.read_text())


@pytest.fixture
async def executor(tmp_path: Path) -> AsyncIterator[BashExecutor]:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.5)) as ex:
        yield ex


def request(
    command: str,
    *,
    timeout: float | None = None,
    owner: str | None = None,
    env: Mapping[str, str] | None = None,
) -> BashRequest:
    return BashRequest(command, timeout=timeout, owner=owner, env=env)


async def start(ex: BashExecutor, command: str, *, owner: str | None = None) -> BashProcess:
    return await ex.start(ex.resolve(request(command, owner=owner)))


async def run(
    ex: BashExecutor,
    command: str,
    *,
    timeout: float | None = None,
    env: Mapping[str, str] | None = None,
) -> BashResult:
    return await ex.run(ex.resolve(request(command, timeout=timeout, env=env)))


# ------------------------------------------------------------------ resolve


def test_bash_error_is_a_harness_error() -> None:
    assert BashError is BaseBashError
    assert issubclass(BashError, HarnessError)
    assert issubclass(BashProcessNotFoundError, BashError)
    assert issubclass(BashProcessNotFoundError, KeyError)


async def test_resolve_defaults(executor: BashExecutor) -> None:
    spec = executor.resolve(BashRequest("echo hi"))
    assert spec.command == "echo hi"
    assert spec.workdir == os.getcwd()
    assert spec.timeout == executor.default_timeout == 120.0
    assert spec.owner is None
    assert spec.env is None


async def test_resolve_normalises_workdir_and_caps_timeout(
    executor: BashExecutor, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path)
    spec = executor.resolve(BashRequest("pwd", workdir="sub", timeout=10_000, owner=""))
    assert spec.workdir == str(tmp_path / "sub")
    assert os.path.isabs(spec.workdir)
    assert spec.timeout == executor.max_timeout == 600.0
    assert spec.owner == ""
    result = await executor.run(spec)
    assert result.stdout == f"{tmp_path / 'sub'}\n"


@pytest.mark.parametrize("command", ["", "   ", " \n\t "])
async def test_resolve_rejects_empty_command(executor: BashExecutor, command: str) -> None:
    with pytest.raises(BashError, match=r"command must be a non-empty shell command, got '"):
        executor.resolve(BashRequest(command))


async def test_resolve_rejects_missing_workdir(executor: BashExecutor, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    with pytest.raises(BashError, match=rf"workdir '{missing}' does not exist"):
        executor.resolve(BashRequest("true", workdir=str(missing)))


async def test_resolve_rejects_file_as_workdir(executor: BashExecutor, tmp_path: Path) -> None:
    file = tmp_path / "file.txt"
    file.write_text("x")
    with pytest.raises(BashError, match=rf"workdir '{file}' is not a directory"):
        executor.resolve(BashRequest("true", workdir=str(file)))


@pytest.mark.parametrize(("timeout", "shown"), [(0, "0"), (-1.5, "-1.5"), (math.nan, "nan")])
async def test_resolve_rejects_non_positive_timeout(executor: BashExecutor, timeout: float, shown: str) -> None:
    with pytest.raises(BashError, match=rf"timeout must be a positive number of seconds, got {shown}"):
        executor.resolve(BashRequest("true", timeout=timeout))


async def test_resolve_rejects_bad_env(executor: BashExecutor) -> None:
    with pytest.raises(BashError, match=r"env name 'A=B' is not a valid variable name"):
        executor.resolve(BashRequest("true", env={"A=B": "x"}))


async def test_env_is_set_on_top_of_inherited(executor: BashExecutor) -> None:
    result = await run(executor, 'echo "$HARNESS_TEST_VAR:${PATH:+has-path}"', env={"HARNESS_TEST_VAR": "v1"})
    assert result.stdout == "v1:has-path\n"


async def test_open_rejects_bad_settings(tmp_path: Path) -> None:
    with pytest.raises(BashError, match=r"tail_bytes must be a positive integer, got 0"):
        async with open_bash_executor(BashRuntimeOptions(tail_bytes=0)):
            pass  # pragma: no cover
    with pytest.raises(BashError, match=r"spill_dir '.*nope' is not an existing directory"):
        async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path / "nope"))):
            pass  # pragma: no cover


# ------------------------------------------------------------------ run


async def test_run_collects_stdout_stderr_and_exit_code(executor: BashExecutor) -> None:
    with trio.fail_after(WAIT):
        result = await run(executor, "echo out; echo err >&2; exit 3")
    assert result == BashResult(
        stdout="out\n",
        stderr="err\n",
        exit_code=3,
        signal=None,
        timed_out=False,
        stdout_dropped=0,
        stderr_dropped=0,
        timeout=120.0,
    )
    assert render_result(result) == "out\n[stderr]\nerr\n[exit code: 3]"


async def test_run_success_renders_plain_output(executor: BashExecutor) -> None:
    with trio.fail_after(WAIT):
        result = await run(executor, "printf 'a\\nb'")
        empty = await run(executor, "true")
    assert result.exit_code == 0
    assert render_result(result) == "a\nb"
    assert render_result(empty) == "(no output)"


async def test_run_reports_death_by_signal(executor: BashExecutor) -> None:
    with trio.fail_after(WAIT):
        result = await run(executor, "echo before; kill -TERM $$; echo after")
    assert result.exit_code is None
    assert result.signal == signal.SIGTERM
    assert render_result(result) == "before\n[killed by signal SIGTERM]"


async def test_run_keeps_bounded_tails(tmp_path: Path) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 2001))
    async with open_bash_executor(BashRuntimeOptions(tail_bytes=100, spill_dir=str(tmp_path))) as ex:
        with trio.fail_after(WAIT):
            result = await run(ex, "seq 1 2000; seq 1 2000 >&2")
    assert result.stdout == expected[-100:]
    assert result.stderr == expected[-100:]
    assert result.stdout_dropped == result.stderr_dropped == len(expected) - 100
    rendered = render_result(result)
    dropped = len(expected) - 100
    assert rendered.startswith(f"[output truncated: {dropped} earlier bytes of stdout not shown]\n")
    assert f"[stderr]\n[output truncated: {dropped} earlier bytes of stderr not shown]\n" in rendered


async def test_run_timeout_kills_the_whole_group(executor: BashExecutor, tmp_path: Path) -> None:
    pid_file = tmp_path / "pgid"
    with trio.fail_after(WAIT):
        result = await run(executor, f"echo $$ > {pid_file}; sleep 300 & sleep 300 & wait", timeout=2.0)
    assert result.timed_out
    assert result.exit_code is None
    assert result.signal == signal.SIGTERM
    assert render_result(result) == "(no output)\n[killed by signal SIGTERM]\n[timed out after 2s]"
    await assert_group_gone(int(pid_file.read_text()))


async def test_run_cancellation_kills_the_group(executor: BashExecutor, tmp_path: Path) -> None:
    pid_file = tmp_path / "pgid"
    finished = False

    async def runner(scope: trio.CancelScope) -> None:
        nonlocal finished
        with scope:
            await run(executor, f"echo $$ > {pid_file}; sleep 300 & sleep 300 & wait")
            finished = True

    scope = trio.CancelScope()
    with trio.fail_after(WAIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(runner, scope)
            pgid = await read_pid_file(pid_file)
            await wait_until(lambda: len(running_members(pgid)) >= 3)
            scope.cancel()
    assert not finished
    assert scope.cancelled_caught
    await assert_group_gone(pgid)


# ------------------------------------------------------------------ start / read_output


async def test_start_reads_are_incremental_and_consuming(executor: BashExecutor, tmp_path: Path) -> None:
    go = tmp_path / "go"
    proc = await start(executor, f"echo one; while [ ! -e {go} ]; do sleep 0.01; done; echo two")
    assert proc.id == "proc-1"
    running_at_start = proc.running
    assert running_at_start
    with trio.fail_after(WAIT):
        await wait_until(lambda: proc.stdout_bytes == 4)
        assert proc.read_output() == "one\n"
        assert proc.read_output() == ""
        go.touch()
        facts = await proc.wait()
    assert facts.exit_code == 0
    assert not facts.killed
    assert not proc.running
    assert proc.exit == facts
    assert proc.read_output() == "two\n"
    assert proc.read_output() == ""


async def test_start_stderr_marker(executor: BashExecutor) -> None:
    proc = await start(executor, "printf out; echo err >&2")
    with trio.fail_after(WAIT):
        await proc.wait()
    assert proc.read_output() == "out\n[stderr]\nerr\n"
    assert proc.read_output() == ""


async def test_start_only_stderr_has_marker(executor: BashExecutor) -> None:
    proc = await start(executor, "echo err >&2")
    with trio.fail_after(WAIT):
        await proc.wait()
    assert proc.read_output() == "[stderr]\nerr\n"


async def test_utf8_char_split_across_chunks_is_held_back(executor: BashExecutor, tmp_path: Path) -> None:
    go = tmp_path / "go"
    # "€" is e2 82 ac: the first two bytes arrive, then, later, the last one.
    proc = await start(executor, f"printf 'a\\342\\202'; while [ ! -e {go} ]; do sleep 0.01; done; printf '\\254b'")
    with trio.fail_after(WAIT):
        await wait_until(lambda: proc.stdout_bytes == 3)
        assert proc.read_output() == "a"
        assert proc.read_output() == ""
        go.touch()
        await proc.wait()
    assert proc.read_output() == "€b"


async def test_incomplete_utf8_at_eof_is_replaced(executor: BashExecutor) -> None:
    proc = await start(executor, "printf 'x\\342\\202'")
    with trio.fail_after(WAIT):
        await proc.wait()
    assert proc.read_output() == "x\ufffd"


async def test_lossy_read_with_small_tail_keeps_utf8_boundaries(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(tail_bytes=4, spill_dir=str(tmp_path))) as ex:
        proc = await start(ex, "printf '€€€€'")
        with trio.fail_after(WAIT):
            await proc.wait()
        # The tail holds ac e2 82 ac: the orphan continuation byte is dropped too.
        assert proc.read_output() == (f"[output truncated: 9 bytes not shown; full stdout in {proc.stdout_path}]\n€")
        assert Path(proc.stdout_path).read_text() == "€€€€"


async def test_lossy_read_names_spill_file_with_full_stream(tmp_path: Path) -> None:
    expected = "".join(f"{i}\n" for i in range(1, 20001))
    async with open_bash_executor(BashRuntimeOptions(tail_bytes=1024, spill_dir=str(tmp_path))) as ex:
        proc = await start(ex, "seq 1 20000; echo done >&2")
        with trio.fail_after(WAIT):
            await proc.wait()
        assert proc.stdout_bytes == len(expected)
        dropped = len(expected) - 1024
        assert proc.read_output() == (
            f"[output truncated: {dropped} bytes not shown; full stdout in {proc.stdout_path}]\n"
            + expected[-1024:]
            + "[stderr]\ndone\n"
        )
        assert Path(proc.stdout_path).read_text() == expected
        assert Path(proc.stderr_path).read_text() == "done\n"
        assert Path(proc.stdout_path).parent == tmp_path


async def test_spill_files_are_private_and_removed_on_release(executor: BashExecutor) -> None:
    proc = await start(executor, "echo hi")
    for path in (proc.stdout_path, proc.stderr_path):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    with trio.fail_after(WAIT):
        await proc.wait()
    assert Path(proc.stdout_path).read_text() == "hi\n"
    proc.release()
    assert not os.path.exists(proc.stdout_path)
    assert not os.path.exists(proc.stderr_path)
    assert proc.read_output() == "hi\n"  # what is in memory stays readable
    with pytest.raises(BashProcessNotFoundError):
        executor.get(proc.id)


async def test_spill_files_removed_on_executor_exit(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.5)) as ex:
        done = await start(ex, "echo hi")
        running = await start(ex, "sleep 300")
        with trio.fail_after(WAIT):
            await done.wait()
        paths = [done.stdout_path, done.stderr_path, running.stdout_path, running.stderr_path]
        assert all(os.path.exists(p) for p in paths)
    assert not any(os.path.exists(p) for p in paths)
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ kill / exit


async def test_kill_leaves_nothing_of_the_group(executor: BashExecutor) -> None:
    proc = await start(executor, "sleep 300 & sleep 300 & wait")
    pgid = proc.pid
    with trio.fail_after(WAIT):
        await wait_until(lambda: len(running_members(pgid)) >= 3)
        proc.kill("no longer needed")
        proc.kill("again")  # idempotent
        facts = await proc.wait()
    assert facts.killed
    assert facts.kill_reason == "no longer needed"
    assert facts.signal == signal.SIGTERM
    assert facts.exit_code is None
    await assert_group_gone(pgid)
    proc.kill()  # after exit: nothing to do, nothing raised
    assert proc.exit == facts


async def test_sigterm_ignored_is_escalated_to_sigkill(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.2)) as ex:
        proc = await start(ex, "trap '' TERM; echo ready; sleep 300 & sleep 300; wait")
        with trio.fail_after(WAIT):
            await wait_until(lambda: proc.stdout_bytes == 6 and len(running_members(proc.pid)) >= 3)
            proc.kill()
            facts = await proc.wait()
        assert facts.signal == signal.SIGKILL
        assert facts.killed
        assert facts.kill_reason is None
        await assert_group_gone(proc.pid)


async def test_leftover_group_members_are_killed_when_leader_exits(
    executor: BashExecutor,
) -> None:
    proc = await start(executor, "sleep 300 & echo started")
    with trio.fail_after(WAIT):
        facts = await proc.wait()
    assert facts.exit_code == 0
    assert not facts.killed
    assert proc.read_output() == "started\n"
    await assert_group_gone(proc.pid)


async def test_pipe_held_outside_the_group_is_abandoned(executor: BashExecutor) -> None:
    # setsid moves the sleep out of the group: it cannot be signalled as part of
    # it, and it keeps stdout open.  wait() must still return.
    proc = await start(
        executor,
        "setsid sleep 300 & echo $!; "
        # Exit only once the sleep has its own session (field 6 of stat).
        'while [ "$(cut -d\' \' -f6 /proc/$!/stat)" != "$!" ]; do sleep 0.01; done',
    )
    escaped = 0
    try:
        with trio.fail_after(WAIT):
            facts = await proc.wait()
        escaped = int(proc.read_output())
        assert facts.exit_code == 0
        os.kill(escaped, 0)  # still alive: the pipe was abandoned, not closed by its death
        await assert_group_gone(proc.pid)
    finally:
        if escaped:
            with contextlib.suppress(ProcessLookupError):
                os.kill(escaped, signal.SIGKILL)


async def test_executor_exit_kills_processes_and_grandchildren(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.5)) as ex:
        proc = await start(ex, "sleep 300 & echo $!; sleep 300 & echo $!; wait")
        simple = await start(ex, "sleep 300")
        with trio.fail_after(WAIT):
            await wait_until(lambda: Path(proc.stdout_path).read_text().count("\n") == 2)
            await wait_until(lambda: len(running_members(proc.pid)) >= 3)
        grandchildren = [int(line) for line in Path(proc.stdout_path).read_text().split()]
        assert len(grandchildren) == 2
        assert all(os.getpgid(pid) == proc.pid for pid in grandchildren)
    assert proc.exit is not None
    assert proc.exit.killed
    assert proc.exit.kill_reason == "executor closing"
    assert simple.exit is not None
    assert simple.exit.signal == signal.SIGTERM
    await assert_group_gone(proc.pid)
    await assert_group_gone(simple.pid)


async def test_cancelled_caller_still_tears_down(tmp_path: Path) -> None:
    procs: list[BashProcess] = []
    with trio.CancelScope() as scope:
        async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.5)) as ex:
            procs.append(await start(ex, "sleep 300 & sleep 300 & wait"))
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert procs[0].exit is not None
    assert procs[0].exit.killed
    assert list(tmp_path.iterdir()) == []
    await assert_group_gone(procs[0].pid)


async def test_body_exception_propagates_unwrapped(tmp_path: Path) -> None:
    procs: list[BashProcess] = []

    async def body() -> None:
        async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), grace_period=0.5)) as ex:
            procs.append(await start(ex, "sleep 300"))
            raise ValueError("from the body")

    with pytest.raises(ValueError, match="from the body"):
        await body()
    assert procs[0].exit is not None
    assert procs[0].exit.killed
    await assert_group_gone(procs[0].pid)


async def test_closed_executor_refuses_work(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path))) as ex:
        spec = ex.resolve(BashRequest("true"))
    with pytest.raises(BashError, match=r"the bash executor is closed; cannot start 'true'"):
        await ex.start(spec)
    with pytest.raises(BashError, match=r"the bash executor is closed; cannot run 'true'"):
        await ex.run(spec)


async def test_bad_shell_is_a_bash_error(tmp_path: Path) -> None:
    async with open_bash_executor(BashRuntimeOptions(spill_dir=str(tmp_path), shell=str(tmp_path / "nosh"))) as ex:
        with pytest.raises(BashError, match=r"could not start '.*nosh' in workdir"):
            await run(ex, "true")
        with pytest.raises(BashError, match=r"could not start"):
            await start(ex, "true")
    assert list(tmp_path.iterdir()) == []


# ------------------------------------------------------------------ registry


async def test_owner_of_get_list_release(executor: BashExecutor) -> None:
    alice = await start(executor, "true", owner="alice")
    empty = await start(executor, "true", owner="")
    nobody = await start(executor, "true")
    assert [p.id for p in executor.list()] == ["proc-1", "proc-2", "proc-3"]
    assert executor.get("proc-2") is empty
    assert executor.owner_of("proc-1") == "alice"
    assert executor.owner_of("proc-2") == ""
    assert executor.owner_of("proc-3") is None
    with trio.fail_after(WAIT):
        for proc in (alice, empty, nobody):
            await proc.wait()
    # Finished but not released: still known.
    assert executor.owner_of("proc-2") == ""
    with pytest.raises(BashProcessNotFoundError, match=r"no bash process with id 'proc-99'") as info:
        executor.owner_of("proc-99")
    assert str(info.value) == "no bash process with id 'proc-99'"
    empty.release()
    with pytest.raises(BashProcessNotFoundError, match=r"'proc-2'"):
        executor.owner_of("proc-2")
    assert [p.id for p in executor.list()] == ["proc-1", "proc-3"]


async def test_aclose_kills_waits_and_forgets(executor: BashExecutor) -> None:
    proc = await start(executor, "sleep 300")
    with trio.fail_after(WAIT):
        await proc.aclose()
    assert proc.exit is not None
    assert proc.exit.killed
    assert proc.exit.kill_reason == "released"
    assert not os.path.exists(proc.stdout_path)
    with pytest.raises(BashProcessNotFoundError):
        executor.owner_of(proc.id)
    await assert_group_gone(proc.pid)
