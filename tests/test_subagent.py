"""The subagent tool: foreground, background, depth limit, filtering, disposal."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing

from trio_harness import Agent, AgentOptions, ScriptedModel, SubagentOptions, TaskToolOptions
from trio_harness._harness import Harness
from trio_harness.agents import ReactAgent
from trio_harness.model import UserMessage
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness
from trio_harness.tools import SubagentToolPlugin
from trio_harness.tools._subagent import subagent_depth


def results(agent: Agent) -> list[ev.ToolResult]:
    return [e for e in agent.session.events if isinstance(e, ev.ToolResult)]


def created(h: Harness) -> list[Agent]:
    seen: list[Agent] = []
    h.bus.on("agent/created", lambda n: seen.append(n.subject) if isinstance(n.subject, ReactAgent) else None)
    return seen


async def test_foreground_subagent_returns_final_text_and_is_disposed() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "count to 3", "run_in_background": False}}]},
            {"text": "1 2 3"},
            {"text": "the child counted"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["subagent"]) as h:
        seen = created(h)
        async with h.agents.open(session_id="parent") as agent:
            agent.followup("delegate")
            await agent.when_idle()
            assert results(agent)[0].content == "1 2 3"
            child = seen[1]
            assert child.session.header.parent_session == "parent"
            assert h.agents.get(child.id) is None  # always disposed
            assert_balanced(child.session)
            assert list(model.requests[1].messages) == [UserMessage("count to 3")]


async def test_child_failure_is_an_error_result() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "x", "run_in_background": False}}]},
            {"error": {"message": "rate limited", "code": "http-429"}},
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["subagent"]) as h, h.agents.open() as agent:
        agent.followup("go")
        await agent.when_idle()
        result = results(agent)[0]
        assert result.is_error and "rate limited" in result.content


async def test_depth_limit() -> None:
    call = {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "deeper", "run_in_background": False}}]}
    model = ScriptedModel([call, call, {"text": "bottom"}, {"text": "mid"}, {"text": "top"}])
    async with open_test_harness(model, builtin_tools=False) as h:
        await h.load(SubagentToolPlugin(h.tasks, h.tools, SubagentOptions(max_depth=1)))
        depths: list[int] = []
        h.bus.on("agent/created", lambda n: depths.append(subagent_depth(h.agents, n.subject.id)))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
        assert depths == [0, 1]
        nested = await h.sessions.stored()
        assert len(nested) == 2
        child_events = (await h.sessions.persistence.load(nested[1].id)).events
        limited = [e for e in child_events if isinstance(e, ev.ToolResult)]
        assert limited[0].is_error and "depth limit" in limited[0].content


async def test_child_tool_set_can_be_filtered() -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "x", "run_in_background": False}}]},
            {"text": "child"},
            {"text": "parent"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["tasks"]) as h:
        await h.load(SubagentToolPlugin(h.tasks, h.tools, SubagentOptions(child_tools=["task_list"])))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
        parent_tools = {t.name for t in model.requests[0].tools}
        child_tools = {t.name for t in model.requests[1].tools}
        assert {"subagent", "task_list", "task_output"} <= parent_tools
        assert child_tools == {"task_list"}


async def test_background_subagent_task_and_kill_cancels_the_child(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {
                        "name": "subagent",
                        "arguments": {"prompt": "long job", "description": "long job", "run_in_background": True},
                    }
                ]
            },
            {"text": "started it"},
        ]
    )
    child_model = ScriptedModel([{"hang": True}])
    options = SubagentOptions(child_options=AgentOptions(model=child_model))
    async with open_test_harness(model, builtin_tools=["tasks", "subagent"], subagent_options=options) as h:
        seen = created(h)
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            assert results(agent)[0].content == "started background task subagent-1"
            child = seen[1]
            assert h.agents.get(child.id) is child and child.status == "running"
            assert h.tasks.get("subagent-1", agent).status == "running"
            await h.tasks.kill("subagent-1", agent, reason="not needed")
            snap = await h.tasks.wait("subagent-1", 10, agent)
            assert snap.status == "killed"
            assert h.agents.get(child.id) is None
            end = child.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "parent")


async def test_background_subagent_completion_is_readable(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "compute", "run_in_background": True}}]},
            {"text": "waiting"},
            {"tool_calls": [{"name": "task_output", "arguments": {"task_id": "subagent-1"}}]},
            {"text": "the answer is 42"},
        ]
    )
    child_model = ScriptedModel([{"text": "42", "delay": 5}])  # the child answers later
    async with open_test_harness(
        model,
        builtin_tools=["tasks", "subagent"],
        task_tool_options=TaskToolOptions(quiet=True),
        subagent_options=SubagentOptions(child_options=AgentOptions(model=child_model)),
    ) as h:
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            await trio.sleep(10)
            assert h.tasks.get("subagent-1", agent).status == "completed"
            agent.followup("collect")
            await agent.when_idle()
            read = next(r for r in results(agent) if r.name == "task_output")
            assert read.content.startswith("42\n[status: completed")


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
        task_tool_options=TaskToolOptions(quiet=True),
        subagent_options=SubagentOptions(child_options=AgentOptions(model=child_model)),
    ) as h:
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            await trio.sleep(10)
            snap = await h.tasks.kill("subagent-1", agent)
            assert snap.status == "completed"
            read = h.tasks.read("subagent-1", agent)
            assert read.output == "42"


async def test_parent_disposal_disposes_a_background_child(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "forever", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}])))
    async with open_test_harness(model, builtin_tools=["tasks", "subagent"], subagent_options=options) as h:
        handle = await h.agents.create(options=AgentOptions())
        handle.agent.followup("go")
        await handle.agent.when_idle()
        assert len(h.agents.list()) == 2
        await handle.dispose()
        assert h.agents.list() == [] and h.sessions.list() == []
        assert h.tasks.list() == []


async def test_parent_disposed_while_a_background_child_is_being_created(
    monkeypatch: pytest.MonkeyPatch, autojump_clock: object
) -> None:
    original = SubagentToolPlugin._create_child
    entered = trio.Event()

    async def slow_create(self: SubagentToolPlugin, agents: Any, parent: Any, **kwargs: Any) -> Any:
        entered.set()
        await trio.sleep(5)
        return await original(self, agents, parent, **kwargs)

    monkeypatch.setattr(SubagentToolPlugin, "_create_child", slow_create)
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "job", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}])))
    async with open_test_harness(model, builtin_tools=["tasks", "subagent"], subagent_options=options) as h:
        handle = await h.agents.create()
        handle.agent.followup("go")
        await entered.wait()
        await handle.dispose()
        assert h.agents.list() == [] and h.sessions.list() == []
        assert h.tasks.list() == []
        await trio.sleep(10)
        assert h.agents.list() == []


async def test_parent_disposal_of_a_running_background_child_is_clean(
    autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "forever", "run_in_background": True}}]},
            {"text": "ok"},
        ]
    )
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}])))
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


@pytest.mark.parametrize("stop", ["cancel", "dispose"])
async def test_stopping_the_parent_stops_a_foreground_child_with_cause_parent(
    autojump_clock: trio.testing.MockClock, stop: str
) -> None:
    model = ScriptedModel(
        [{"tool_calls": [{"name": "subagent", "arguments": {"prompt": "forever", "run_in_background": False}}]}]
    )
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}])))
    async with open_test_harness(model, builtin_tools=["subagent"], subagent_options=options) as h:
        seen = created(h)
        requested: list[tuple[str, str]] = []
        h.bus.on("agent/cancel-requested", lambda n: requested.append((n.subject.id, n.data["cause"])))
        handle = await h.agents.create(session_id="parent")
        parent = handle.agent
        parent.followup("delegate")
        await trio.testing.wait_all_tasks_blocked()
        child = seen[1]
        assert child.status == "running"
        if stop == "cancel":
            parent.cancel("user")
            await parent.when_idle()
        else:
            await handle.dispose()
        parent_cause = "user" if stop == "cancel" else "disposed"
        # The parent stops its child: the child's cancel cause is "parent".
        assert (child.id, "parent") in requested
        assert requested[0] == ("parent", "user") or stop == "dispose"
        child_end = child.session.events[-1]
        assert isinstance(child_end, ev.TurnEnd) and (child_end.reason, child_end.cause) == ("aborted", "parent")
        parent_end = [e for e in parent.session.events if isinstance(e, ev.TurnEnd)][-1]
        assert (parent_end.reason, parent_end.cause) == ("aborted", parent_cause)
        assert_balanced(child.session)
        assert h.agents.get(child.id) is None
        (result,) = results(parent)
        assert result.is_error and f"cause: {parent_cause}" in result.content
        if stop == "cancel":
            await handle.dispose()
