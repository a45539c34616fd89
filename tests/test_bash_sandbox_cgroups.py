"""The per-command ``pids`` cgroups that bound a sandboxed command's processes when the harness runs as root:
each made for one command, joined after it is spawned, removed only once that command ended; the cgroups a
dead harness left swept, a live one's never.
"""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import NEEDS_BUBBLEWRAP, wait_until

from trio_harness.bash import BashExecutor, BashRequest, BashRuntimeOptions, SandboxPolicy, open_bash_executor
from trio_harness.bash._sandbox_cgroup import _parent_name, _pid_namespace, _started, pids_hierarchy, sweep_stale
from trio_harness.bash._sandbox_hold import Hold

BASE = pids_hierarchy() if os.geteuid() == 0 else None
pytestmark = [
    NEEDS_BUBBLEWRAP,
    pytest.mark.skipif(os.geteuid() != 0, reason="per-command pids cgroups are made only when run as root"),
    pytest.mark.skipif(
        os.geteuid() == 0 and BASE is None,
        reason="no writable cgroup hierarchy with the pids controller is mounted here (cgroup v2 with pids "
        "in its subtree_control, or a v1 pids hierarchy)",
    ),
]

LIMIT = 64
OPTIONS = BashRuntimeOptions(sandbox=SandboxPolicy(max_processes=LIMIT), grace_period=0.5)


@pytest.fixture
def work() -> Iterator[Path]:
    # Outside /tmp, so it is visible inside the sandbox (its /tmp is private).
    path = Path(tempfile.mkdtemp(prefix="trio-harness-cgroups-", dir="/var/tmp"))
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def parent_of(executor: BashExecutor) -> str:
    sandbox = executor.checked_sandbox
    assert sandbox is not None and sandbox._bound is not None
    return sandbox._bound.parent


def cgroup_of(report: str) -> str:
    """The pids cgroup (a directory under BASE) named by a ``/proc/self/cgroup`` report."""
    assert BASE is not None
    v2 = os.path.exists(os.path.join(BASE, "cgroup.controllers"))
    for line in report.splitlines():
        _, controllers, path = line.split(":", 2)
        if (controllers == "") if v2 else ("pids" in controllers.split(",")):
            return os.path.join(BASE, path.lstrip("/"))
    raise AssertionError(f"no pids cgroup in {report!r}")


async def test_background_commands_started_back_to_back_each_run_bounded_in_their_own_cgroup(work: Path) -> None:
    """Four background commands started at once after one another, from each of two executors started
    concurrently: each joins a cgroup of its own (none removed before its command joined it), bounded by
    pids.max, while the others run; each cgroup goes once its command ended, the parents when the
    executors close."""
    command = "cat /proc/self/cgroup; until [ -e ../go ]; do sleep 0.05; done; echo ran"
    workdir, go = work / "w", work / "go"
    workdir.mkdir()
    procs: dict[str, list[Any]] = {"a": [], "b": []}
    parents = {}
    async with open_bash_executor(OPTIONS) as first, open_bash_executor(OPTIONS) as second:

        async def start_four(name: str, executor: BashExecutor) -> None:
            parents[name] = parent_of(executor)
            for _ in range(4):
                spec = executor.resolve(BashRequest(command, workdir=str(workdir)))
                procs[name].append(await executor.start(spec))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(start_four, "a", first)
            nursery.start_soon(start_four, "b", second)
        every = procs["a"] + procs["b"]
        await wait_until(lambda: all(p.stdout_bytes > 0 or not p.running for p in every))
        seen = set()
        for name, started in procs.items():
            for process in started:
                assert process.running, (process.exit, process.read_output())
                cgroup = cgroup_of(process.read_output())
                assert os.path.dirname(cgroup) == parents[name], (cgroup, parents)
                seen.add(cgroup)
                assert Path(cgroup, "pids.max").read_text().strip() == str(LIMIT)
                # bwrap (the group leader), its sandbox's PID 1 and the shell at least: the command is inside
                members = {int(pid) for pid in Path(cgroup, "cgroup.procs").read_text().split()}
                assert process.pid in members and len(members) >= 3, members
                assert 3 <= int(Path(cgroup, "pids.current").read_text()) <= LIMIT
        assert len(seen) == 8
        go.touch()
        for process in every:
            facts = await process.wait()
            assert (facts.exit_code, process.read_output()) == (0, "ran\n"), facts
        await wait_until(lambda: not any(os.path.exists(cgroup) for cgroup in seen))
    assert not any(os.path.exists(parent) for parent in parents.values())


def _dead_pid() -> int:
    child = subprocess.Popen(["true"])
    child.wait()
    return child.pid


def test_cgroups_of_a_dead_harness_are_swept_and_those_of_live_ones_kept() -> None:
    assert BASE is not None
    namespace = _pid_namespace()
    dead = _dead_pid()
    here = os.getpid()
    made = {
        # a harness killed with SIGKILL: no process has its pid now
        "dead": f"trio-harness-{namespace}-{dead}-{_started(here)}-0dead001",
        # its pid given to another process since (started at another time)
        "reused": f"trio-harness-{namespace}-{here}-1-0dead002",
        # a live harness (this process, as another executor of it names its own)
        "live": _parent_name("0a11fe01"),
        # a harness of another PID namespace, whose pids this process cannot see
        "elsewhere": f"trio-harness-1-{dead}-1-0e15e001",
        # the old naming, which cannot tell
        "old": f"trio-harness-{dead}-0001d001",
    }
    paths = {key: os.path.join(BASE, name) for key, name in made.items()}
    try:
        for path in paths.values():
            os.mkdir(path)
            os.mkdir(os.path.join(path, "c1"))  # a command's cgroup, empty (ended, or not joined yet)
        removed = sweep_stale(BASE)
        assert sorted(removed) == sorted([paths["dead"], paths["reused"]])
        assert {key for key, path in paths.items() if os.path.isdir(os.path.join(path, "c1"))} == {
            "live",
            "elsewhere",
            "old",
        }
    finally:
        for path in paths.values():
            for leaf in (os.path.join(path, "c1"), path):
                if os.path.isdir(leaf):
                    os.rmdir(leaf)


async def test_a_harness_opening_sweeps_a_dead_ones_cgroups_and_keeps_a_live_ones(work: Path) -> None:
    assert BASE is not None
    dead = os.path.join(BASE, f"trio-harness-{_pid_namespace()}-{_dead_pid()}-1-0dead003")
    os.mkdir(dead)
    os.mkdir(os.path.join(dead, "c1"))
    try:
        async with open_bash_executor(OPTIONS) as first:
            assert not os.path.exists(dead)
            # A command of the first executor made its cgroup and has not joined it yet when another opens.
            sandbox = first.checked_sandbox
            assert sandbox is not None and sandbox._bound is not None
            hold, before = Hold(), set(sandbox._bound.cgroups)
            sandbox.argv(["/bin/sh", "-c", "true"], workdir=str(work), writable_dir=str(work), hold=hold)
            (waiting,) = set(sandbox._bound.cgroups) - before
            async with open_bash_executor(OPTIONS) as second:
                assert os.path.isdir(waiting)
                result = await second.run(second.resolve(BashRequest("echo ran", workdir=str(work))))
                assert (result.exit_code, result.stdout) == (0, "ran\n"), result
            assert os.path.isdir(waiting)
            hold.release()  # its command ended
            assert not os.path.exists(waiting)
    finally:
        for leaf in (os.path.join(dead, "c1"), dead):
            if os.path.isdir(leaf):
                os.rmdir(leaf)


async def test_a_command_that_cannot_join_its_cgroup_is_killed_before_it_runs_and_says_why(
    work: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The sandbox child must not go on when the helper fails (it would read the FIFO's end and run the
    command unbounded: before, about one start in eight did); tried ten times, as the race was."""
    async with open_bash_executor(OPTIONS) as executor:
        sandbox = executor.checked_sandbox
        assert sandbox is not None and sandbox._bound is not None
        for _ in range(10):
            hold, before = Hold(), set(sandbox._bound.cgroups)
            argv = sandbox.argv(["/bin/sh", "-c", "echo ran"], workdir=str(work), writable_dir=str(work), hold=hold)
            (cgroup,) = set(sandbox._bound.cgroups) - before
            os.rmdir(cgroup)  # removed by someone else before the command joined it
            try:
                # A group of its own: the helper kills the whole group
                result = await trio.run_process(
                    argv, capture_stdout=True, capture_stderr=True, check=False, start_new_session=True
                )
            finally:
                with caplog.at_level(logging.WARNING, logger="trio_harness.bash"):
                    hold.release()
            assert result.returncode == -9 and b"ran" not in result.stdout, result
            said = result.stderr.decode()
            assert "the bash sandbox killed the command before it ran: it could not join its pids cgroup" in said
            assert f"the pids cgroup {cgroup!r} of an ended command was already gone" in caplog.text
