"""Review probes: races, re-entrancy and teardown edges of the driver and registry."""

from __future__ import annotations

from typing import Any, NoReturn

import pytest
import trio
import trio.testing

from trio_harness.agents import Agent, AgentOptions, ReactAgent, Tool, ToolContext
from trio_harness.model._protocol import Emit, Finish, ModelRequest, TextDelta, ToolCallDelta
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness


def turn_ends(agent: Agent) -> list[tuple[int, str, str | None]]:
    return [(e.turn, e.reason, e.cause) for e in agent.session.events if isinstance(e, ev.TurnEnd)]


# ---------------------------------------------------------------- re-entrancy


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


async def test_session_observer_steer_during_claim_keeps_log_replayable() -> None:
    """A session observer that steers while the inbox appends its own splice."""
    from trio_harness.agents._inbox import Inbox

    model = ScriptedModel([{"text": "a"}, {"text": "b"}, {"text": "c"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if isinstance(event, ev.InboxSpliced) and event.outcome == "claimed" and not sent:
                sent.append(agent.steer("from observer"))

        agent.session.observe(observer)
        agent.followup("first")
        await agent.when_idle()
        # the durable projection equals the live one
        replayed = Inbox.replay(agent.session)
        assert [m.id for m in replayed.next_turn] == [m.id for m in agent.inbox.next_turn]
        assert [m.id for m in replayed.next_step] == [m.id for m in agent.inbox.next_step]
        texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
        assert "from observer" in texts


async def test_session_observer_steer_during_step_claim_keeps_log_replayable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Steering from an observer of a next-step claim must not corrupt the durable inbox."""
    from trio_harness.agents._inbox import Inbox

    model = ScriptedModel([{"hang": True}, {"text": "b"}, {"text": "c"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if (
                isinstance(event, ev.InboxSpliced)
                and event.queue == "next-step"
                and event.outcome == "claimed"
                and not sent
            ):
                sent.append(agent.steer("from observer"))

        agent.session.observe(observer)
        agent.inject("parked")
        agent.followup("first")  # step 1 claims the parked inject: the observer steers
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        replayed = Inbox.replay(agent.session)  # raised InboxError: splice outside next-step
        assert [m.id for m in replayed.next_step] == [m.id for m in agent.inbox.next_step] == sent


async def test_session_observer_followup_on_insert_keeps_order() -> None:
    from trio_harness.agents._inbox import Inbox

    model = ScriptedModel([])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if isinstance(event, ev.InboxSpliced) and event.inserted and not sent:
                sent.append("x")
                agent.inject("second")

        agent.session.observe(observer)
        agent.inject("first")
        replayed = Inbox.replay(agent.session)
        assert [m.text for m in replayed.next_step] == [m.text for m in agent.inbox.next_step]


# ---------------------------------------------------------------- maintenance / dispose


async def test_maintenance_exit_after_dispose_started_does_not_start_a_driver(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Whether the close hook runs before the maintenance block exits depends on
    # Trio's (randomised) scheduling order, so try several times.
    model = ScriptedModel([{"text": "never"}])
    async with open_test_harness(model) as h:
        for _ in range(12):
            handle = await h.agents.create()
            agent = handle.agent
            async with agent.maintenance():
                agent.followup("during maintenance")
                with trio.move_on_after(0):
                    await handle.dispose()  # teardown requested, not yet awaited
            start = trio.current_time()
            await handle.dispose()
            assert trio.current_time() == start  # no teardown timeout was needed
            assert agent.status == "idle"
            await agent.when_idle()
        assert model.requests == []
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_dispose_while_maintenance_held_waits_for_it(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"text": "never"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        release = trio.Event()
        order: list[str] = []

        async def hold() -> None:
            async with agent.maintenance():
                await release.wait()
                order.append("maintenance done")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(hold)
            await trio.testing.wait_all_tasks_blocked()

            async def dispose() -> None:
                await handle.dispose()
                order.append("disposed")

            nursery.start_soon(dispose)
            await trio.testing.wait_all_tasks_blocked()  # dispose is parked on the maintenance
            assert order == []
            release.set()
        assert order == ["maintenance done", "disposed"]
        assert model.requests == []


# ---------------------------------------------------------------- tools


async def test_tool_that_closes_its_own_owner_scope(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"tool_calls": [{"name": "quit", "arguments": {}}]}, {"text": "never"}])
    async with open_test_harness(model) as h:
        owner = await h.scope.open_child("owner")

        async def quit_(ctx: ToolContext, args: dict[str, Any]) -> str:
            await owner.close()
            return "closed"

        h.tools.add(Tool("quit", "q", {"type": "object"}, quit_))
        handle = await h.agents.create(owner=owner)
        agent = handle.agent
        agent.followup("go")
        with trio.fail_after(5):
            await owner.close()
        assert handle.disposed
        assert turn_ends(agent) == [(1, "aborted", "disposed")]
        assert_balanced(agent.session)
        assert h.agents.list() == [] and h.sessions.list() == []


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


# ---------------------------------------------------------------- providers


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


# ---------------------------------------------------------------- cancel causes and latches


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


async def test_keep_inbox_cancel_dispose_resume_keeps_pending_and_turn_numbers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([{"text": "one"}, {"hang": True}, {"text": "parked ran"}, {"text": "wake ran"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create(session_id="s1")
        agent = handle.agent
        agent.followup("one")
        await agent.when_idle()
        agent.followup("two")
        parked = agent.followup("parked")
        await trio.testing.wait_all_tasks_blocked()
        agent.inject("mid-turn inject")
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        await handle.dispose()
        handle2 = await h.agents.resume("s1")
        again = handle2.agent
        assert parked in again.inbox and len(again.inbox.next_step) == 1
        assert again.status == "idle"
        again.followup("wake")
        await again.when_idle()
        starts = [e.turn for e in again.session.events if isinstance(e, ev.TurnStart)]
        assert starts == [1, 2, 3, 4]
        assert_balanced(again.session)
        await handle2.dispose()


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


async def test_when_idle_waiter_cancelled_does_not_disturb_agent(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([{"text": "x", "delay": 10}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("go")
        with trio.move_on_after(1):
            await agent.when_idle()
        assert agent.status == "running"
        await agent.when_idle()
        assert turn_ends(agent) == [(1, "completed", None)]


async def test_setup_error_after_registering_tools_rolls_back(autojump_clock: trio.testing.MockClock) -> None:
    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    events: list[str] = []
    async with open_test_harness() as h:
        h.bus.on("*", lambda n: events.append(n.name))

        async def setup(agent: Agent) -> None:
            agent.tools.add(Tool("mine", "m", {"type": "object"}, noop), scope=agent.scope)
            h.tools.add(Tool("global", "g", {"type": "object"}, noop), scope=agent.scope)
            child = await agent.scope.open_child("plugin")
            child.spawn(trio.sleep_forever)
            raise RuntimeError("setup failed")

        with pytest.raises(RuntimeError, match="setup failed"):
            await h.agents.create(session_id="z", setup=setup)
        assert h.tools.get("global") is None
        assert h.agents.get("z") is None and h.sessions.get("z") is None
        assert not any(name in events for name in ("agent/created", "agent/disposed", "session/disposed"))
        async with h.agents.open(session_id="z") as agent:
            assert agent.id == "z"


async def test_create_racing_harness_exit(autojump_clock: trio.testing.MockClock) -> None:
    results: list[object] = []
    gate = trio.Event()

    async def setup(agent: Agent) -> None:
        await gate.wait()

    async with open_test_harness() as h:

        async def create() -> None:
            try:
                results.append(await h.agents.create(session_id="r", setup=setup))
            except BaseException as exc:
                results.append(exc)
                raise

        h.scope.spawn(create)
        await trio.testing.wait_all_tasks_blocked()
    assert len(results) == 1 and isinstance(results[0], BaseException)
    assert h.agents.list() == [] and h.sessions.list() == []


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
