"""The turn driver: turns, steps, statuses, cancellation, tools (docs/guarantees.rst, "The driver")."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
import trio
import trio.testing
from _util import turn_ends

from trio_harness import _harness
from trio_harness._bus import Notice
from trio_harness.agents import Agent, AgentOptions, ReactAgent, Tool, ToolContext, ToolOutput
from trio_harness.model import UserMessage
from trio_harness.model._protocol import Emit, Finish, ModelRequest, TextDelta, ToolCallDelta
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.testing import NOISE, assert_balanced, assert_events, open_test_harness

OBJ: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "string"}}}


def status_of(agent: Any) -> str:
    return str(agent.status)


def statuses(h: _harness.Harness) -> list[str]:
    seen: list[str] = []
    h.bus.on("agent/status", lambda n: seen.append(n.data["status"]))
    return seen


async def test_completed_turn_logs_balanced_events_and_status_changes_once() -> None:
    model = ScriptedModel([{"text": "hello there"}])
    async with open_test_harness(model) as h:
        seen = statuses(h)
        async with h.agents.open() as agent:
            agent.followup("hi")
            assert status_of(agent) == "running"
            await agent.when_idle()
            assert status_of(agent) == "idle"
            assert_events(
                agent.session,
                ["turn/start", "step/start", "user/message", "assistant/message", "step/end", "turn/end"],
                ignore=NOISE,
            )
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
        assert seen == ["running", "idle"]


async def test_n_synchronous_followups_give_n_turns_in_order() -> None:
    model = ScriptedModel([{"text": f"answer {i}"} for i in range(5)])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        ids = [agent.followup(f"q{i}") for i in range(5)]
        assert len(set(ids)) == 5
        await agent.when_idle()
        turns = [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)]
        assert turns == [1, 2, 3, 4, 5]
        users = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
        assert users == [f"q{i}" for i in range(5)]
        # each request carried exactly one new prompt
        assert [len(r.messages) for r in model.requests] == [1, 3, 5, 7, 9]


async def test_idle_cancel_with_nothing_queued_does_nothing() -> None:
    model = ScriptedModel([{"text": "ok"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        notices: list[Notice] = []
        h.bus.on("agent/cancel-requested", notices.append)
        before = len(agent.session)
        assert agent.cancel() is False
        assert len(agent.session) == before and notices == []
        agent.followup("next")
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd)
        assert end.reason == "completed"


async def test_followup_then_cancel_before_first_step_never_reaches_model() -> None:
    model = ScriptedModel([{"text": "never"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        notices: list[Notice] = []
        h.bus.on("agent/cancel-requested", notices.append)
        agent.followup("do it")
        assert agent.cancel() is True
        await agent.when_idle()
        assert model.requests == []
        assert [n.data["cause"] for n in notices] == ["user"]
        assert_events(agent.session, ["turn/start", "turn/end"], ignore=NOISE)
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
        assert len(agent.inbox) == 0


async def test_cancel_mid_step_drops_queued_prompts(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "after"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        agent.followup("queued")
        await trio.testing.wait_all_tasks_blocked()
        assert len(model.requests) == 1
        agent.cancel()
        await agent.when_idle()
        assert len(model.requests) == 1  # the queued prompt never ran
        assert len(agent.inbox) == 0
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
        assert_balanced(agent.session)
        # the next prompt is independent and runs
        agent.followup("fresh")
        await agent.when_idle()
        assert model.requests[-1].messages[-1] == UserMessage("fresh")


async def test_keep_inbox_cancel_parks_prompts_until_next_wake(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "a"}, {"text": "b"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        parked = agent.followup("parked")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        await trio.sleep(10)
        assert len(model.requests) == 1 and parked in agent.inbox
        agent.followup("wake")
        await agent.when_idle()
        texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
        assert texts == ["first", "parked", "wake"]


async def test_cancelled_steering_is_not_requeued(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "x"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        agent.steer("steer me")
        agent.cancel()
        await agent.when_idle()
        await trio.sleep(5)
        assert len(model.requests) == 1
        assert all(e.text != "steer me" for e in agent.session.events if isinstance(e, ev.UserMessage))


async def test_waking_send_after_cancel_is_latched(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "latched ran"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        agent.steer("after cancel")  # reclassified to next-turn, runs after the aborted turn
        await agent.when_idle()
        turn_ends = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
        assert [(e.reason, e.cause) for e in turn_ends] == [("aborted", "user"), ("completed", None)]
        assert model.requests[-1].messages[-1] == UserMessage("after cancel")
        assert_balanced(agent.session)


async def test_first_cancel_cause_wins(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel("parent")
        agent.cancel("user")
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.cause == "parent"


async def test_replacement_activity_records_its_own_cause(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"hang": True}, {"text": "third"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel("parent")
        agent.followup("latched")
        await trio.testing.wait_all_tasks_blocked()
        assert len(model.requests) == 2
        agent.cancel("hook")
        await agent.when_idle()
        assert turn_ends(agent) == [(1, "aborted", "parent"), (2, "aborted", "hook")]
        agent.followup("third")
        await agent.when_idle()
        assert turn_ends(agent)[-1] == (3, "completed", None)
        assert_balanced(agent.session)


async def test_dispose_mid_turn_ends_aborted_disposed(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        await handle.dispose()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "disposed")
        assert_balanced(agent.session)
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_disposal_never_latches_a_wake(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "never"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        agent.followup("go")
        agent.followup("queued")
        await trio.testing.wait_all_tasks_blocked()
        await handle.dispose()
        assert len(model.requests) == 1


def _slow_tool(name: str, delay: float, order: list[str], parallel: bool = True) -> Tool:
    async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        order.append(f"start {name}")
        await trio.sleep(delay)
        order.append(f"end {name}")
        return f"{name} done"

    return Tool(name, f"sleeps {delay}", {"type": "object"}, handler, parallel_safe=parallel)


async def test_parallel_results_logged_in_model_order(autojump_clock: trio.testing.MockClock) -> None:
    order: list[str] = []
    model = ScriptedModel(
        [{"tool_calls": [{"name": "slow", "arguments": {}}, {"name": "fast", "arguments": {}}]}, {"text": "done"}]
    )
    async with open_test_harness(model) as h:
        h.tools.add(_slow_tool("slow", 5, order))
        h.tools.add(_slow_tool("fast", 1, order))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            assert set(order[:2]) == {"start slow", "start fast"}
            assert order[2:] == ["end fast", "end slow"]
            results = [e.name for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert results == ["slow", "fast"]
            assert trio.current_time() == pytest.approx(5)  # ran concurrently


async def test_exclusive_tool_is_a_barrier(autojump_clock: trio.testing.MockClock) -> None:
    order: list[str] = []
    calls: list[dict[str, Any]] = [{"name": n, "arguments": {}} for n in ("a", "ex", "b")]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    async with open_test_harness(model) as h:
        h.tools.add(_slow_tool("a", 1, order))
        h.tools.add(_slow_tool("ex", 1, order, parallel=False))
        h.tools.add(_slow_tool("b", 1, order))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
        assert order == ["start a", "end a", "start ex", "end ex", "start b", "end b"]


async def test_tool_concurrency_limit(autojump_clock: trio.testing.MockClock) -> None:
    running = 0
    peak = 0

    async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await trio.sleep(1)
        running -= 1
        return "ok"

    model = ScriptedModel([{"tool_calls": [{"name": "t", "arguments": {}}] * 7}, {"text": "done"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("t", "t", {"type": "object"}, handler))
        async with h.agents.open(options=AgentOptions(tool_concurrency=3)) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert peak == 3
            assert sum(isinstance(e, ev.ToolResult) for e in agent.session.events) == 7


async def test_abort_gives_synthetic_results_for_unstarted_calls(autojump_clock: trio.testing.MockClock) -> None:
    order: list[str] = []
    calls = [{"name": "ex", "arguments": {}}, {"name": "a", "arguments": {}}]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "next"}])
    async with open_test_harness(model) as h:
        h.tools.add(_slow_tool("ex", 100, order, parallel=False))
        h.tools.add(_slow_tool("a", 1, order))
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.sleep(1)
            agent.cancel()
            await agent.when_idle()
            results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert [(r.name, r.is_error) for r in results] == [("ex", True), ("a", True)]
            assert "cancelled" in results[0].content and "not run" in results[1].content
            assert order == ["start ex"]
            assert_balanced(agent.session)
            # the next request is well formed: every call has a result
            agent.followup("again")
            await agent.when_idle()
            msgs = model.requests[-1].messages
            assert [m.role for m in msgs] == ["user", "assistant", "tool", "tool", "user"]


async def test_parallel_tools_one_raises_another_cancelled(autojump_clock: trio.testing.MockClock) -> None:
    async def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
        await trio.sleep(1)
        raise RuntimeError("boom")

    async def slow(ctx: ToolContext, args: dict[str, Any]) -> str:
        await trio.sleep(100)
        return "slow"

    calls = [{"name": "boom", "arguments": {}}, {"name": "slow", "arguments": {}}]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "after"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("boom", "b", {"type": "object"}, boom))
        h.tools.add(Tool("slow", "s", {"type": "object"}, slow))
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.sleep(2)
            agent.cancel("hook")
            await agent.when_idle()
            results = [(e.name, e.is_error, e.content) for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert [r[:2] for r in results] == [("boom", True), ("slow", True)]
            assert "boom" in results[0][2] and "cause: hook" in results[1][2]
            assert turn_ends(agent) == [(1, "aborted", "hook")]
            assert_balanced(agent.session)


async def test_cancel_racing_finishing_tool(autojump_clock: trio.testing.MockClock) -> None:
    """Cancel lands exactly when the tool result is logged (before the next checkpoint)."""

    async def quick(ctx: ToolContext, args: dict[str, Any]) -> str:
        await trio.sleep(1)
        return "finished"

    model = ScriptedModel([{"tool_calls": [{"name": "quick", "arguments": {}}]}, {"text": "never"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("quick", "q", {"type": "object"}, quick))
        async with h.agents.open() as agent:

            def observer(event: ev.Event) -> None:
                if isinstance(event, ev.ToolResult):
                    agent.cancel()

            agent.session.observe(observer)
            agent.followup("go")
            await agent.when_idle()
            results = [(e.content, e.is_error) for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert results == [("finished", False)]
            assert turn_ends(agent) == [(1, "aborted", "user")]
            assert len(model.requests) == 1
            assert_balanced(agent.session)


async def test_cancel_reaching_a_tool_through_its_own_nursery_reports_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Cancellation wrapped in an exception group still reads as 'cancelled'."""

    async def with_nursery(ctx: ToolContext, args: dict[str, Any]) -> NoReturn:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(trio.sleep_forever)
            await trio.sleep_forever()

    model = ScriptedModel([{"tool_calls": [{"name": "nested", "arguments": {}}]}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("nested", "n", {"type": "object"}, with_nursery))
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.testing.wait_all_tasks_blocked()  # the tool is running
            agent.cancel()
            await agent.when_idle()
            (result,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert result.is_error and "cancelled" in result.content
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")


async def test_tool_error_raised_while_cancelled_does_not_crash_the_harness(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """A group mixing Cancelled with the tool's own error: logged as a failure, turn aborted."""

    async def fails_on_cancel() -> None:
        try:
            await trio.sleep_forever()
        finally:
            raise ValueError("cleanup broke")

    async def tool(ctx: ToolContext, args: dict[str, Any]) -> NoReturn:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(fails_on_cancel)
            await trio.sleep_forever()

    model = ScriptedModel([{"tool_calls": [{"name": "fragile", "arguments": {}}]}, {"text": "next"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("fragile", "f", {"type": "object"}, tool))
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.testing.wait_all_tasks_blocked()  # the tool is running
            agent.cancel()
            await agent.when_idle()
            (result,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert result.is_error and "cleanup broke" in result.content
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
            assert_balanced(agent.session)
            agent.followup("still alive?")
            await agent.when_idle()
            last = agent.session.events[-1]
            assert isinstance(last, ev.TurnEnd) and last.reason == "completed"


async def test_bad_arguments_and_unknown_tool_become_error_results() -> None:
    seen: list[dict[str, Any]] = []

    async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        seen.append(args)
        return "ok"

    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "count", "arguments": "{not json"},
                    {"name": "count", "arguments": {"n": "three"}},
                    {"name": "nope", "arguments": {}},
                    {"name": "count", "arguments": {"n": 3}},
                ]
            },
            {"text": "fixed"},
        ]
    )
    async with open_test_harness(model) as h:
        h.tools.add(Tool("count", "count", schema, handler))
        started: list[tuple[int, str, str]] = []
        h.bus.on("agent/tool/started", lambda n: started.append((n.data["turn"], n.data["call_id"], n.data["tool"])))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert [r.is_error for r in results] == [True, True, True, False]
            # Only the call that ran was announced as started (before its handler ran).
            assert started == [(1, results[3].call_id, "count")]
            assert "not valid JSON" in results[0].content
            assert "n: 'three' is not of type 'integer'" in results[1].content
            assert "unknown tool 'nope'" in results[2].content and "count" in results[2].content
            assert seen == [{"n": 3}]
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "completed"


async def test_tool_exception_and_tool_output_error() -> None:
    async def boom(ctx: ToolContext, args: dict[str, Any]) -> str:
        raise RuntimeError("disk on fire")

    async def soft(ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
        assert ctx.agent.id == ctx.agents.list()[0].id
        return ToolOutput("bad input", is_error=True)

    model = ScriptedModel(
        [{"tool_calls": [{"name": "boom", "arguments": {}}, {"name": "soft", "arguments": {}}]}, {"text": "ok"}]
    )
    async with open_test_harness(model) as h:
        h.tools.add(Tool("boom", "b", {"type": "object"}, boom))
        h.tools.add(Tool("soft", "s", {"type": "object"}, soft))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert "RuntimeError: disk on fire" in results[0].content and results[0].is_error
            assert (results[1].content, results[1].is_error) == ("bad input", True)


async def test_each_step_offers_the_tools_registered_at_that_step() -> None:
    # A tool added or removed between steps (here by a tool call) is what the next request offers.
    removers: list[Any] = []

    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    later = Tool("later", "added by a call", {"type": "object"}, noop)

    async def grow(ctx: ToolContext, args: dict[str, Any]) -> str:
        removers.append(h.tools.add(later))
        return "added"

    async def shrink(ctx: ToolContext, args: dict[str, Any]) -> str:
        removers.pop()()
        return "removed"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "grow"}]},
            {"tool_calls": [{"name": "later"}, {"name": "shrink"}]},
            {"tool_calls": [{"name": "later"}]},
            {"text": "done"},
        ]
    )
    async with open_test_harness(model) as h:
        h.tools.add(Tool("grow", "g", {"type": "object"}, grow))
        h.tools.add(Tool("shrink", "s", {"type": "object"}, shrink))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            offered = [[spec.name for spec in request.tools] for request in model.requests]
            assert offered == [["grow", "shrink"], ["grow", "shrink", "later"], ["grow", "shrink"], ["grow", "shrink"]]
            headers = [e.tools for e in agent.session.events if isinstance(e, ev.RequestHeader)]
            assert headers == [tuple(names) for names in offered]
            results = [(e.name, e.content) for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert results[-1][0] == "later" and "unknown tool 'later'" in results[-1][1]


async def test_a_tool_filter_decides_at_every_step() -> None:
    allowed = {"a"}

    async def switch(ctx: ToolContext, args: dict[str, Any]) -> str:
        allowed.symmetric_difference_update({"a", "b"})
        return "switched"

    model = ScriptedModel([{"tool_calls": [{"name": "a"}]}, {"tool_calls": [{"name": "b"}]}, {"text": "done"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("a", "a", {"type": "object"}, switch))
        h.tools.add(Tool("b", "b", {"type": "object"}, switch))
        options = AgentOptions(tool_filter=lambda tool: tool.name in allowed)
        async with h.agents.open(options=options) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [[spec.name for spec in r.tools] for r in model.requests] == [["a"], ["b"], ["a"]]


async def test_tool_filter_that_raises_fails_the_turn_not_the_harness() -> None:
    broken = [True]

    def flaky_filter(tool: Tool) -> bool:
        if broken:
            raise RuntimeError("filter broke")
        return True

    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    model = ScriptedModel([{"text": "fine"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open(options=AgentOptions(tool_filter=flaky_filter)) as agent:
            agent.followup("go")
            await agent.when_idle()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "error"
            assert end.failure is not None and "filter broke" in end.failure.message
            assert_balanced(agent.session)
            assert agent.status == "idle" and not agent.scope.closing
            broken.clear()
            agent.followup("again")
            await agent.when_idle()
            assert turn_ends(agent)[-1] == (2, "completed", None)


async def test_model_error_and_max_tokens_end_reasons() -> None:
    model = ScriptedModel([{"error": {"message": "overloaded", "code": "http-529"}}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("go")
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "error"
        assert end.failure is not None and end.failure.code == "http-529"
        agent.followup("again")  # script exhausted: a clear failure naming the script
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.failure is not None
        assert end.failure.code == "script-exhausted" and "in-process script" in end.failure.message


class RaisingProvider:
    name = "raising"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        emit(TextDelta("partial"))
        emit(ToolCallDelta(index=0, id="c1", name="noop", arguments="{"))
        await trio.lowlevel.checkpoint()
        raise ConnectionError("reset")


class LateChunksProvider:
    name = "late"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        emit(TextDelta("done"))
        emit(Finish("stop"))
        emit(TextDelta(" extra"))
        emit(ToolCallDelta(index=0, id="c1", name="noop", arguments="{}"))


class NoFinishProvider:
    name = "nofinish"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        emit(TextDelta("half"))


@pytest.mark.parametrize(
    ("provider", "reason", "code"),
    [
        (RaisingProvider(), "error", "provider-crashed"),
        (LateChunksProvider(), "completed", None),
        (NoFinishProvider(), "error", "no-finish"),
    ],
)
async def test_misbehaving_providers_give_balanced_logs(provider: Any, reason: str, code: str | None) -> None:
    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    async with open_test_harness(provider) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == reason
            assert (end.failure.code if end.failure else None) == code
            assert not any(isinstance(e, ev.ToolCallRequested) for e in agent.session.events)
            assert_balanced(agent.session)


async def test_max_steps_blocks_the_turn() -> None:
    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "again"

    model = ScriptedModel([{"tool_calls": [{"name": "noop", "arguments": {}}]}] * 3)
    async with open_test_harness(model) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open(options=AgentOptions(max_steps=2)) as agent:
            agent.followup("loop")
            await agent.when_idle()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "blocked"
            assert len(model.requests) == 2


async def test_max_steps_after_tool_calls_is_balanced() -> None:
    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    model = ScriptedModel([{"tool_calls": [{"name": "noop", "arguments": {}}] * 2}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open(options=AgentOptions(max_steps=1)) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert turn_ends(agent) == [(1, "blocked", None)]
            assert_balanced(agent.session)


async def test_inject_joins_next_step_of_running_driver(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()

    async def wait_gate(ctx: ToolContext, args: dict[str, Any]) -> str:
        await gate.wait()
        return "opened"

    model = ScriptedModel([{"tool_calls": [{"name": "gate", "arguments": {}}]}, {"text": "done"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("gate", "g", {"type": "object"}, wait_gate))
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.testing.wait_all_tasks_blocked()
            agent.inject("context for step 2")
            gate.set()
            await agent.when_idle()
            second = model.requests[1].messages
            assert second[-1] == UserMessage("context for step 2")
            steps = [(e.step, e.text) for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert steps == [(1, "go"), (2, "context for step 2")]


async def test_steer_between_finish_and_tool_dispatch_joins_next_step(autojump_clock: trio.testing.MockClock) -> None:
    steered: list[str] = []
    agent_box: list[Agent] = []

    def observer(event: ev.Event) -> None:
        if isinstance(event, ev.AssistantMessage) and event.tool_calls and not steered:
            steered.append(agent_box[0].steer("mid"))

    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    model = ScriptedModel([{"tool_calls": [{"name": "noop", "arguments": {}}]}, {"text": "end"}])
    async with open_test_harness(model) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open() as agent:
            agent_box.append(agent)
            agent.session.observe(observer)
            agent.followup("go")
            await agent.when_idle()
            users = [(e.turn, e.step, e.text) for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert users == [(1, 1, "go"), (1, 2, "mid")]
            assert turn_ends(agent) == [(1, "completed", None)]


async def test_idle_inject_parks_and_steer_opens_a_turn(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"text": "ok"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.inject("parked")
        await trio.sleep(10)
        assert agent.status == "idle" and model.requests == [] and len(agent.inbox.next_step) == 1
        agent.steer("now")
        await agent.when_idle()
        assert list(model.requests[0].messages) == [UserMessage("parked"), UserMessage("now")]


async def test_maintenance_holds_idle_and_defers_wakes(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"text": "after maintenance"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        async with agent.maintenance():
            agent.followup("during")
            await trio.sleep(5)
            assert model.requests == [] and agent.status == "idle"
            assert len(agent.inbox.next_turn) == 1
        await agent.when_idle()
        assert len(model.requests) == 1


async def test_when_idle_follows_replacement_work(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"hang": True}, {"text": "replacement", "delay": 3}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        agent.followup("replacement")  # latched before the observed activity ended
        await agent.when_idle()
        assert agent.status == "idle"
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"


async def test_status_listener_followup_on_idle_does_not_break_when_idle() -> None:
    """A listener that queues more work when the agent goes idle (a pump).

    Before the fix the old activity set the *new* activity's idle event, so
    ``when_idle()`` spun on a set event (and under an autojump clock, forever).
    """
    model = ScriptedModel([{"text": "one"}, {"hang": True}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        pumped: list[str] = []

        def pump(notice: Any) -> None:
            if notice.data["status"] == "idle" and not pumped:
                pumped.append(agent.followup("pumped"))

        h.bus.on("agent/status", pump)
        returned: list[bool] = []
        async with trio.open_nursery() as nursery:

            async def watcher() -> None:
                await agent.when_idle()
                returned.append(True)

            agent.followup("first")
            nursery.start_soon(watcher)
            for _ in range(50):  # bounded: the first turn ends, the pumped one hangs
                await trio.lowlevel.checkpoint()
            assert pumped and len(model.requests) == 2
            assert agent.status == "running" and returned == []
            assert isinstance(agent, ReactAgent)
            assert not agent._idle.is_set()  # else when_idle() busy-loops
            agent.cancel()
        assert returned == [True]
        assert turn_ends(agent) == [(1, "completed", None), (2, "aborted", "user")]
        assert_balanced(agent.session)


def _all_tasks() -> list[trio.lowlevel.Task]:
    root = trio.lowlevel.current_root_task()
    assert root is not None
    found: list[trio.lowlevel.Task] = []

    def walk(task: trio.lowlevel.Task) -> None:
        found.append(task)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    walk(root)
    return found


def _drivers(agent: Agent) -> list[trio.lowlevel.Task]:
    return [task for task in _all_tasks() if task.name == f"agent {agent.id} driver"]


@pytest.mark.parametrize("dispose_while", ["idle", "running"])
async def test_one_driver_task_runs_every_activity_and_disposal_ends_it(
    autojump_clock: trio.testing.MockClock, dispose_while: str
) -> None:
    """The driver task is spawned at the first wake, parks between activities, and is gone after disposal."""
    model = ScriptedModel([{"text": "one"}, {"hang": True}, {"text": "three"}, {"text": "four"}, {"hang": True}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        await trio.testing.wait_all_tasks_blocked()
        assert _drivers(agent) == []  # an agent that never ran has no task
        agent.followup("one")
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        first = _drivers(agent)
        assert len(first) == 1  # parked, not ended
        agent.followup("two")
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel()
        await agent.when_idle()
        # After a cancelled activity the next ones run in a fresh cancel scope, not aborted.
        agent.followup("three")
        await agent.when_idle()
        agent.followup("four")
        await agent.when_idle()
        await trio.testing.wait_all_tasks_blocked()
        assert _drivers(agent) == first
        assert turn_ends(agent) == [
            (1, "completed", None),
            (2, "aborted", "user"),
            (3, "completed", None),
            (4, "completed", None),
        ]
        if dispose_while == "running":
            agent.followup("five")
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "running"
        await handle.dispose()
        assert first[0] not in _all_tasks()
        if dispose_while == "running":
            assert turn_ends(agent)[-1] == (5, "aborted", "disposed")
        assert_balanced(agent.session)


async def test_when_idle_waiter_cancelled_does_not_disturb_agent(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"text": "x", "delay": 10}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("go")
        with trio.move_on_after(1):
            await agent.when_idle()
        assert agent.status == "running"
        await agent.when_idle()
        assert turn_ends(agent) == [(1, "completed", None)]


async def test_reasoning_and_usage_are_logged() -> None:
    model = ScriptedModel([{"reasoning": "think think", "text": "answer"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("q")
        await agent.when_idle()
        msg = next(e for e in agent.session.events if isinstance(e, ev.AssistantMessage))
        assert msg.reasoning == "think think" and msg.text == "answer" and msg.usage is not None
        kinds = {e.kind for e in agent.session.events if isinstance(e, ev.AssistantChunk)}
        assert kinds == {"text", "reasoning"}


async def test_send_after_dispose_is_refused() -> None:
    from trio_harness._errors import AgentDisposedError

    async with open_test_harness() as h:
        handle = await h.agents.create()
        await handle.dispose()
        with pytest.raises(AgentDisposedError, match="disposed"):
            handle.agent.followup("late")


async def test_bad_cancel_cause_and_mode_are_refused() -> None:
    async with open_test_harness() as h, h.agents.open() as agent:
        with pytest.raises(ValueError, match="cause"):
            agent.cancel("bogus")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="mode"):
            agent.send("x", mode="shout")  # type: ignore[arg-type]
