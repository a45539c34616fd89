"""Review probes: races and leaks across tasks, bash, subagents and the ACP server."""

from __future__ import annotations

import os
from typing import Any

import pytest
import trio
import trio.testing
from _acp_clients import connected
from _util import WAIT
from test_acp_server import assert_nothing_left, scripted
from test_bash_tool import group_alive

from trio_harness import AgentOptions, ScriptedModel
from trio_harness.acp import _jsonrpc as rpc
from trio_harness.bash._executor import BashExecutor, BashProcess
from trio_harness.bash._records import BashSpec
from trio_harness.session import _events as ev
from trio_harness.tasks import TaskHooks, TaskOutcome, TaskSpec
from trio_harness.testing import assert_balanced, open_test_harness
from trio_harness.tools import SubagentToolPlugin


def results(session: Any) -> list[ev.ToolResult]:
    return [e for e in session.events if isinstance(e, ev.ToolResult)]


def notices(session: Any, task_id: str) -> list[ev.UserMessage]:
    return [e for e in session.events if isinstance(e, ev.UserMessage) and task_id in e.text]


# ---------------------------------------------------------------- bash


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
    async with open_test_harness(model, builtin_tools=True) as h:
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


# ---------------------------------------------------------------- ACP


async def test_acp_prompt_immediately_followed_by_close() -> None:
    """The prompt is answered exactly once (cancelled), the close answers, nothing is left."""
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        async with connected(harness) as (peer, server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request(
                "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "x"}]}
            )
            close = peer.request("session/close", {"sessionId": session_id})
            await peer.send(prompt, close)
            assert (await peer.response(close["id"]))["result"] == {}
            assert (await peer.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
            await peer.call("initialize", {"protocolVersion": 1})
            answers = [m for m in peer.received if m.get("id") == prompt["id"]]
            assert len(answers) == 1
            assert server.session_ids == []
            assert harness.agents.get(session_id) is None
            # A prompt for the closed session is refused.
            late = peer.request("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "y"}]})
            await peer.send(late)
            assert (await peer.response(late["id"]))["error"]["code"] == rpc.RESOURCE_NOT_FOUND
        await assert_nothing_left(harness, [session_id])


async def test_acp_prompt_running_then_close() -> None:
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request(
                "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "x"}]}
            )
            await peer.send(prompt)
            with trio.fail_after(WAIT):
                while (agent := harness.agents.get(session_id)) is None or agent.status != "running":
                    await trio.sleep(0)
            assert await peer.call("session/close", {"sessionId": session_id}) == {}
            assert (await peer.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
            await peer.call("initialize", {"protocolVersion": 1})
            assert len([m for m in peer.received if m.get("id") == prompt["id"]]) == 1
        await assert_nothing_left(harness, [session_id])


async def test_acp_cancel_after_the_prompt_finished_is_harmless() -> None:
    async with open_test_harness(scripted([{"text": "one"}, {"text": "two"}])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            text = [{"type": "text", "text": "x"}]
            assert await peer.call("session/prompt", {"sessionId": session_id, "prompt": text}) == {
                "stopReason": "end_turn"
            }
            await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
            assert await peer.call("session/cancel", {"sessionId": session_id}) is None
            assert await peer.call("session/prompt", {"sessionId": session_id, "prompt": text}) == {
                "stopReason": "end_turn"
            }
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert_balanced(agent.session)


async def test_acp_load_of_a_session_live_on_the_same_connection() -> None:
    async with open_test_harness(scripted([{"text": "one"}])) as harness:
        async with connected(harness) as (peer, server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            text = [{"type": "text", "text": "x"}]
            await peer.call("session/prompt", {"sessionId": session_id, "prompt": text})
            load = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            await peer.send(load)
            assert (await peer.response(load["id"]))["error"]["code"] == rpc.INVALID_PARAMS
            assert server.session_ids == [session_id]
            # Two loads of a closed session racing each other: exactly one wins.
            assert await peer.call("session/close", {"sessionId": session_id}) == {}
            one = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            two = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            await peer.send(one, two)
            replies = [await peer.response(one["id"]), await peer.response(two["id"])]
            assert sorted("result" in r for r in replies) == [False, True]
            assert server.session_ids == [session_id]
        await assert_nothing_left(harness, [session_id])


@pytest.mark.parametrize("request_id", [{"a": 1}, [1], True, 1.5])
async def test_acp_request_with_a_bad_id_type_is_answered_with_null(request_id: object) -> None:
    async with open_test_harness(scripted([])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            await peer.send({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": {}})
            reply = await peer.response(None)
            assert reply["error"]["code"] == rpc.INVALID_REQUEST
            assert await peer.call("initialize", {"protocolVersion": 1})


# ---------------------------------------------------------------- subagents


async def test_parent_disposed_while_a_background_child_is_being_created(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: object
) -> None:
    original = SubagentToolPlugin._create_child
    entered = trio.Event()

    async def slow_create(self: SubagentToolPlugin, agents: Any, parent: Any) -> Any:
        entered.set()
        await trio.sleep(5)
        return await original(self, agents, parent)

    monkeypatch.setattr(SubagentToolPlugin, "_create_child", slow_create)
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "job", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    options = {"child_options": AgentOptions(model=ScriptedModel([{"hang": True}]))}
    async with open_test_harness(model, builtin_tools=["tasks", "subagent"], subagent_options=options) as h:
        handle = await h.agents.create()
        handle.agent.followup("go")
        await entered.wait()
        await handle.dispose()
        assert h.agents.list() == [] and h.sessions.list() == []
        assert h.tasks.list() == []
        await trio.sleep(10)
        assert h.agents.list() == []


async def test_kill_of_a_background_child_that_already_answered(autojump_clock: object) -> None:
    """A child that finished its turn and is only being disposed: the kill must not fail or hang."""
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "compute", "run_in_background": True}}]},
            {"text": "waiting"},
        ]
    )
    child_model = ScriptedModel([{"text": "42", "delay": 1}])
    async with open_test_harness(
        model,
        builtin_tools=["tasks", "subagent"],
        task_tool_options={"quiet": True},
        subagent_options={"child_options": AgentOptions(model=child_model)},
    ) as h:
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            await trio.sleep(10)
            snap = await h.tasks.kill("subagent-1", agent)
            assert snap.status == "completed"
            read = h.tasks.read("subagent-1", agent)
            assert read.output == "42"


# ---------------------------------------------------------------- task tools


async def test_task_list_with_unicode_labels_respects_the_byte_limit(autojump_clock: object) -> None:
    async def run() -> TaskHooks:
        stop = trio.Event()

        async def done() -> TaskOutcome:
            await stop.wait()
            return TaskOutcome("killed")

        return TaskHooks(cancel=lambda reason: stop.set(), done=done)

    model = ScriptedModel([{"tool_calls": [{"name": "task_list", "arguments": {}}]}, {"text": "ok"}])
    async with (
        open_test_harness(model, builtin_tools=["tasks"], task_tool_options={"output_limit_bytes": 61}) as h,
        h.agents.open() as agent,
    ):
        for label in ("☃☃☃☃☃ 日本語のラベル", "🎉" * 20, "a\nb\u2028c\ud800"):
            await h.tasks.start(TaskSpec(kind="job", label=label, owner=agent, run=run))
        agent.followup("go")
        await agent.when_idle()
        (listing,) = results(agent.session)
        data = listing.content.encode("utf-8")
        assert len(data) <= 61
        assert listing.content.startswith("job-1 [job] running — ☃")


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
    async with open_test_harness(model, builtin_tools=True) as h:
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


async def test_parent_disposal_of_a_running_background_child_is_clean(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "forever", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    options = {"child_options": AgentOptions(model=ScriptedModel([{"hang": True}]))}
    async with open_test_harness(model, builtin_tools=["tasks", "subagent"], subagent_options=options) as h:
        seen: list[Any] = []
        h.tasks.on_task_done(seen.append)
        handle = await h.agents.create()
        handle.agent.followup("go")
        await handle.agent.when_idle()
        await handle.dispose()
        assert [s.status for s in seen] == ["killed"]
        assert seen[0].error is None
    assert not [r for r in caplog.records if r.levelname in ("WARNING", "ERROR")]


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
    async with open_test_harness(model, builtin_tools=True) as h, h.agents.open() as agent:
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        (result,) = results(agent.session)
        assert result.is_error and "label" in result.content
        assert h.bash.list() == []
        assert_balanced(agent.session)
