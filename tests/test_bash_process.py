"""Tests of process-group handling with real processes: spawning a group leader, signalling, the /proc scan.

The supervision of a whole command (pumps, escalation, pipes held outside the
group) is tested through the executor in ``test_bash_executor.py``.  The only
real-clock pauses are polls while waiting for a real process to change state.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

import pytest
import trio
from _util import WAIT, wait_until

from trio_harness.bash._process import (
    group_alive,
    kill_group_after,
    open_group,
    reap_unsupervised,
    signal_group,
    terminate_group,
)


def state(pid: int) -> bytes:
    data = Path(f"/proc/{pid}/stat").read_bytes()
    return data[data.rfind(b")") + 2 :].split()[0]


async def test_open_group_leads_a_new_session_and_group(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "read line; echo got:$line; echo err >&2"], str(tmp_path), None)
    try:
        assert os.getpgid(process.pid) == process.pid
        assert os.getsid(process.pid) == process.pid
        assert process.stdout is not None
        assert process.stderr is not None
        with trio.fail_after(WAIT):
            assert await process.wait() == 0
            assert await process.stdout.receive_some() == b"got:\n"  # stdin is /dev/null
            assert await process.stderr.receive_some() == b"err\n"
    finally:
        await reap_unsupervised(process)


async def test_open_group_sets_cwd_and_env(tmp_path: Path) -> None:
    env = {**os.environ, "GROUP_TEST_VAR": "v"}
    process = await open_group(["/bin/sh", "-c", 'echo "$PWD $GROUP_TEST_VAR"'], str(tmp_path), env)
    assert process.stdout is not None
    with trio.fail_after(WAIT):
        await process.wait()
        assert await process.stdout.receive_some() == f"{tmp_path} v\n".encode()
    await reap_unsupervised(process)


async def test_group_alive_ignores_zombies(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "exit 0"], str(tmp_path), None)
    try:
        # Not reaped yet: the leader is a zombie, still a member of its group.
        await wait_until(lambda: state(process.pid) == b"Z")
        os.killpg(process.pid, 0)  # the group exists...
        assert not group_alive(process.pid)  # ...but nothing of it runs
    finally:
        await reap_unsupervised(process)
    assert not group_alive(process.pid)


async def test_signal_group_reaches_every_member(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "sleep 300 & echo $!; wait"], str(tmp_path), None)
    assert process.stdout is not None
    with trio.fail_after(WAIT):
        child = int(await process.stdout.receive_some())
    assert group_alive(process.pid)
    signal_group(process.pid, signal.SIGKILL)
    with trio.fail_after(WAIT):
        assert await process.wait() == -signal.SIGKILL
    await wait_until(lambda: not group_alive(process.pid))
    assert not os.path.exists(f"/proc/{child}") or state(child) in (b"Z", b"X")
    await reap_unsupervised(process)


async def test_signal_group_of_a_gone_group_is_ignored(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "exit 0"], str(tmp_path), None)
    await reap_unsupervised(process)
    signal_group(process.pid, signal.SIGTERM)  # nothing raised
    assert not group_alive(process.pid)


async def test_reap_unsupervised_kills_reaps_and_closes_pipes(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "sleep 300"], str(tmp_path), None)
    with trio.fail_after(WAIT):
        await reap_unsupervised(process)
    assert process.returncode == -signal.SIGKILL
    assert process.stdout is not None
    with pytest.raises(trio.ClosedResourceError):
        await process.stdout.receive_some()


async def test_terminate_group_gives_the_group_its_grace_then_sigkills_what_is_left(tmp_path: Path) -> None:
    # The leader exits on SIGTERM; its child ignores it and is SIGKILLed once the grace period is over.
    script = "(trap '' TERM; echo ready; exec sleep 300) & wait"
    process = await open_group(["/bin/sh", "-c", script], str(tmp_path), None)
    assert process.stdout is not None
    try:
        with trio.fail_after(WAIT):
            assert await process.stdout.receive_some() == b"ready\n"
            start = trio.current_time()
            await terminate_group(process.pid, 0.2)
            assert trio.current_time() - start >= 0.2
            assert await process.wait() == -signal.SIGTERM
        await wait_until(lambda: not group_alive(process.pid))
    finally:
        await reap_unsupervised(process)


async def test_terminate_group_of_a_gone_group_does_nothing(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "exit 0"], str(tmp_path), None)
    await reap_unsupervised(process)
    with trio.fail_after(WAIT):
        await terminate_group(process.pid, 300)  # returns at once: nothing to wait for


async def test_kill_group_after_sigkills_at_once_when_cancelled(tmp_path: Path) -> None:
    process = await open_group(["/bin/sh", "-c", "sleep 300"], str(tmp_path), None)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(kill_group_after, process.pid, 300)
            await trio.testing.wait_all_tasks_blocked()
            nursery.cancel_scope.cancel()
        with trio.fail_after(WAIT):
            assert await process.wait() == -signal.SIGKILL
    finally:
        await reap_unsupervised(process)
