"""The bash tool and background bash tasks, with real processes
(docs/guarantees.rst, "Bash" and "Background tasks")."""

from __future__ import annotations

import os
import signal
from typing import Any

import pytest
import trio
import trio.testing
from _util import UNASKED_BASH, WAIT, group_alive

from trio_harness import AgentOptions, BashRuntimeOptions, BashToolOptions, ScriptedModel, TaskRuntimeOptions
from trio_harness._errors import TaskNotFoundError
from trio_harness.bash._executor import BashExecutor, BashProcess
from trio_harness.bash._records import BashSpec
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness
from trio_harness.tools import BashToolPlugin, TaskToolsPlugin


def results(session: Any) -> list[ev.ToolResult]:
    return [e for e in session.events if isinstance(e, ev.ToolResult)]


async def test_foreground_output_exit_code_and_workdir(tmp_path: Any) -> None:
    calls = [
        {"name": "bash", "arguments": {"command": "pwd; echo oops >&2; exit 4", "run_in_background": False}},
    ]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(cwd=str(tmp_path)) as agent:
            agent.followup("go")
            await agent.when_idle()
            (result,) = results(agent.session)
            assert result.is_error  # a nonzero exit is a failed call
            assert result.content.startswith(str(tmp_path))
            assert "[stderr]\noops" in result.content and "[exit code: 4]" in result.content


async def test_foreground_timeout_is_marked() -> None:
    calls = [{"name": "bash", "arguments": {"command": "sleep 30", "timeout_ms": 200, "run_in_background": False}}]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    async with (
        open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h,
        h.agents.open() as agent,
    ):
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        assert "timed out" in results(agent.session)[0].content


async def test_background_disabled_removes_the_parameter_and_refuses_forced_calls() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "echo x", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["tasks"], bash_tool_options=UNASKED_BASH) as h:
        plugin = BashToolPlugin(
            h.bash, h.tasks, h.tools, BashToolOptions(run_in_background=False, requires_approval=False)
        )
        assert "run_in_background" not in plugin.tool().parameters["properties"]
        await h.load(plugin)
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            (result,) = results(agent.session)
            assert result.is_error and "disabled" in result.content


async def test_background_bash_with_a_blank_description_is_a_tool_error_not_a_crash() -> None:
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "true", "description": "   ", "run_in_background": True}}
                ]
            },
            {"text": "ok"},
        ]
    )
    async with (
        open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h,
        h.agents.open() as agent,
    ):
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        (result,) = results(agent.session)
        assert result.is_error and "label" in result.content
        assert h.bash.list() == []
        assert_balanced(agent.session)


async def test_scripted_background_scenario_with_completion_notices() -> None:
    """Start background commands, keep working, list, read with wait; notices arrive."""
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {
                        "name": "bash",
                        "arguments": {
                            "command": "sleep 0.3; echo built",
                            "description": "build",
                            "run_in_background": True,
                        },
                    }
                ]
            },
            {"tool_calls": [{"name": "task_list", "arguments": {}}]},
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "sleep 0.1; echo second", "run_in_background": True}}
                ]
            },
            {"tool_calls": [{"name": "task_output", "arguments": {"task_id": "bash-1", "wait": True}}]},
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "sleep 0.5; echo third", "run_in_background": True}}
                ]
            },
            {"text": "build finished"},
            {"text": "noted the third task"},
        ]
    )
    async with (
        open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h,
        h.agents.open() as agent,
    ):
        agent.followup("build it")
        with trio.fail_after(WAIT):
            await agent.when_idle()
            out = results(agent.session)
            assert out[0].content == "started background task bash-1"
            assert out[1].content == "bash-1 [bash] running — build"
            assert out[3].content.startswith("built\n[status: completed")
            # bash-2 finished while the agent was busy: its notice was injected into turn 1
            injected = [e for e in agent.session.events if isinstance(e, ev.UserMessage) and "bash-2" in e.text]
            assert len(injected) == 1 and injected[0].turn == 1 and "task_output" in injected[0].text
            # bash-3 finishes after the turn: its notice wakes the idle agent with a followup
            while len([e for e in agent.session.events if isinstance(e, ev.TurnEnd)]) < 2:
                await trio.sleep(0.05)
            await agent.when_idle()
        woken = [e for e in agent.session.events if isinstance(e, ev.UserMessage) and "bash-3" in e.text]
        assert len(woken) == 1 and woken[0].turn == 2 and woken[0].mode == "followup"
        # bash-1 was read with wait, so it got no notice
        assert not any("bash-1" in e.text for e in agent.session.events if isinstance(e, ev.UserMessage))
        assert_balanced(agent.session)


async def test_disposing_the_owner_kills_the_whole_group() -> None:
    command = "sleep 300 & sleep 300 & wait"
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command, "run_in_background": True}}]},
            {"text": "started"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        handle = await h.agents.create()
        handle.agent.followup("start it")
        with trio.fail_after(WAIT):
            await handle.agent.when_idle()
        (process,) = h.bash.list()
        pgid = process.pid
        assert group_alive(pgid)
        with trio.fail_after(WAIT):
            await handle.dispose()
        assert not group_alive(pgid)
        assert h.tasks.list() == []
        assert not os.path.exists(process.stdout_path)


async def test_harness_exit_kills_unfinished_background_groups() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300 & wait", "run_in_background": True}}]},
            {"text": "x"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        agent = (await h.agents.create()).agent
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        pgid = h.bash.list()[0].pid
    assert not group_alive(pgid)


async def test_bash_spawn_racing_owner_disposal_leaves_no_process(monkeypatch: pytest.MonkeyPatch) -> None:
    """The shell is spawned (uncancellably) while the owner starts closing: it must not survive."""
    gate = trio.Event()
    entered = trio.Event()
    original = BashExecutor.start

    async def slow_start(self: BashExecutor, spec: BashSpec) -> BashProcess:
        # trio.lowlevel.open_process runs Popen in a thread that cannot be cancelled.
        with trio.CancelScope(shield=True):
            entered.set()
            await gate.wait()
            process = await original(self, spec)
        return process

    monkeypatch.setattr(BashExecutor, "start", slow_start)
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300", "run_in_background": True}}]},
            {"text": "x"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        handle = await h.agents.create()
        handle.agent.followup("go")
        with trio.fail_after(WAIT):
            await entered.wait()
            async with trio.open_nursery() as nursery:
                nursery.start_soon(handle.dispose)
                while not handle.agent.scope.closing:
                    await trio.sleep(0.01)
                gate.set()
        processes = h.bash.list()
        pgids = [p.pid for p in processes]
        assert processes == [], "a background shell outlived its owner"
        assert h.tasks.list() == []
    for pgid in pgids:
        assert not group_alive(pgid)


async def test_owner_disposed_during_a_task_output_wait_on_background_bash() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300 & wait", "run_in_background": True}}]},
            {
                "tool_calls": [
                    {"name": "task_output", "arguments": {"task_id": "bash-1", "wait": True, "timeout_ms": 300000}}
                ]
            },
            {"text": "never"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        handle = await h.agents.create()
        handle.agent.followup("go")
        with trio.fail_after(WAIT):
            # Poll until the task_output call is requested, then let it park in its wait.
            while not any(
                isinstance(e, ev.ToolCallRequested) and e.name == "task_output" for e in handle.agent.session.events
            ):
                await trio.sleep(0.01)
            await trio.testing.wait_all_tasks_blocked()
            (process,) = h.bash.list()
            await handle.dispose()
        assert not group_alive(process.pid)
        assert not os.path.exists(process.stdout_path) and not os.path.exists(process.stderr_path)
        assert h.tasks.list() == [] and h.bash.list() == []
        events = handle.agent.session.events
        assert_balanced(events)
        end = events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "disposed")


async def test_plugin_reload_keeps_the_task_running_and_private() -> None:
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": "echo ready; sleep 300", "run_in_background": True}}
                ]
            },
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        owner = (await h.agents.create(session_id="owner")).agent
        other = (await h.agents.create(session_id="other", options=AgentOptions(model=ScriptedModel([])))).agent
        owner.followup("go")
        with trio.fail_after(WAIT):
            await owner.when_idle()
        await h.reload(BashToolPlugin(h.bash, h.tasks, h.tools, BashToolOptions(requires_approval=False)))
        await h.unload("task-tools")
        await h.load(TaskToolsPlugin(h.tasks, h.tools))
        snapshot = h.tasks.get("bash-1", owner)
        assert snapshot.status == "running"
        with trio.fail_after(WAIT):
            while "ready" not in h.tasks.read("bash-1", owner).output:
                await trio.sleep(0.02)
        for caller in (other, None):
            with pytest.raises(TaskNotFoundError, match="unknown task 'bash-1'"):
                h.tasks.get("bash-1", caller)
        assert h.bash.owner_of(h.bash.list()[0].id) == "owner"
        await h.tasks.kill("bash-1", owner)
        with trio.fail_after(WAIT):
            final = await h.tasks.wait("bash-1", 10, owner)
        assert final.status == "killed"
        assert not group_alive(h.bash.list()[0].pid)


async def test_kill_sigterm_then_sigkill_for_a_stubborn_group() -> None:
    command = "trap '' TERM; echo trap installed; sleep 300 & wait"
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": command, "run_in_background": True}}]},
            {"text": "x"},
        ]
    )
    async with open_test_harness(
        model, builtin_tools=True, bash_tool_options=UNASKED_BASH, bash_options=BashRuntimeOptions(grace_period=0.3)
    ) as h:
        agent = (await h.agents.create()).agent
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
            # Poll the real process until it says the trap is installed.
            output = h.tasks.read("bash-1", agent).output
            while "trap installed" not in output:
                await trio.sleep(0.01)
                output += h.tasks.read("bash-1", agent).output
            await h.tasks.kill("bash-1", agent)
            snap = await h.tasks.wait("bash-1", 10, agent)
        assert snap.status == "killed" and snap.detail.get("signal") == signal.SIGKILL


async def test_a_cancel_landing_right_after_the_task_started_keeps_the_id_in_the_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The turn is cancelled while the background start completes: the model still gets the id.

    The cancel is requested after the shell was spawned, inside the task's
    start, so it is delivered at the first checkpoint after ``tasks.start``
    returned: the one place where the id could be lost.
    """
    agent_box: list[Any] = []
    original = BashExecutor.start

    async def start_then_cancel(self: BashExecutor, spec: BashSpec) -> BashProcess:
        process = await original(self, spec)
        agent_box[0].cancel()
        return process

    monkeypatch.setattr(BashExecutor, "start", start_then_cancel)
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 300", "run_in_background": True}}]},
            {"text": "never reached"},
        ]
    )
    async with open_test_harness(model, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        handle = await h.agents.create()
        agent_box.append(handle.agent)
        handle.agent.followup("go")
        with trio.fail_after(WAIT):
            await handle.agent.when_idle()
        (result,) = results(handle.agent.session)
        assert result.content == "started background task bash-1"
        end = handle.agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "aborted"
        # The model knows the id of the running task, and can stop it.
        assert h.tasks.get("bash-1", handle.agent).status == "running"
        (process,) = h.bash.list()
        with trio.fail_after(WAIT):
            await h.tasks.kill("bash-1", handle.agent)
            assert (await h.tasks.wait("bash-1", 10, handle.agent)).status == "killed"
        assert not group_alive(process.pid)


async def test_reported_finished_tasks_beyond_the_cap_are_pruned_with_their_spill_files(tmp_path: Any) -> None:
    spill = tmp_path / "spill"
    spill.mkdir()
    calls = [
        {"name": "bash", "arguments": {"command": f"echo out-{n}; echo err-{n} >&2", "run_in_background": True}}
        for n in range(1, 6)
    ]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "started"}])
    async with open_test_harness(
        model,
        builtin_tools=["bash"],
        bash_tool_options=UNASKED_BASH,
        task_options=TaskRuntimeOptions(finished_cap=2),
        bash_options=BashRuntimeOptions(spill_dir=str(spill)),
    ) as h:
        h.tasks.attach_controller("test")  # no notices: tasks stay unreported until read
        all_settled = trio.Event()
        settled: set[str] = set()

        def on_done(snapshot: Any) -> None:
            settled.add(snapshot.id)
            if len(settled) == 5:  # the five run in parallel: any one may settle last
                all_settled.set()

        h.tasks.on_task_done(on_done)
        agent = (await h.agents.create()).agent
        exit_callbacks = len([c for c in agent.scope._callbacks if c is not None])
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
            await all_settled.wait()
        processes = {p.command.split(";")[0][-5:]: p for p in h.bash.list()}
        assert sorted(processes) == ["out-1", "out-2", "out-3", "out-4", "out-5"]
        assert len(os.listdir(spill)) == 10  # stdout and stderr of each
        assert all(s.status == "completed" and not s.reported for s in h.tasks.list(agent))

        def kept() -> list[str]:
            return [s.id for s in h.tasks.list(agent)]

        for n in (1, 2):
            assert h.tasks.read(f"bash-{n}", agent).output == f"out-{n}\n[stderr]\nerr-{n}\n"
        assert kept() == ["bash-1", "bash-2", "bash-3", "bash-4", "bash-5"]
        h.tasks.read("bash-4", agent)  # a third collected task: the oldest one goes
        assert kept() == ["bash-2", "bash-3", "bash-4", "bash-5"]
        with pytest.raises(TaskNotFoundError):
            h.tasks.read("bash-1", agent)
        gone = processes["out-1"]
        assert not os.path.exists(gone.stdout_path) and not os.path.exists(gone.stderr_path)
        assert gone not in h.bash.list()
        # Unreported tasks (bash-3, bash-5) are never pruned, whatever the cap.
        h.tasks.read("bash-5", agent)
        assert kept() == ["bash-3", "bash-4", "bash-5"]
        remaining = sorted(os.listdir(spill))
        assert len(remaining) == 6
        assert all(os.path.basename(processes[f"out-{n}"].stdout_path) in remaining for n in (3, 4, 5))
        # Each pruned task also took its exit callback off the owner's scope.
        assert len([c for c in agent.scope._callbacks if c is not None]) == exit_callbacks + 1 + 3
