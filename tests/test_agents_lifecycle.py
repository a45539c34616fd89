"""Create / resume publication, handles and the three teardown owners (invariants 1-8)."""

from __future__ import annotations

import gc
from collections.abc import Callable
from pathlib import Path

import pytest
import trio
import trio.testing

from trio_harness._bus import Notice
from trio_harness._errors import AgentError, AgentExistsError, FactoryError, InboxError
from trio_harness._harness import Harness
from trio_harness.agents import Agent, AgentHandle, AgentOptions, ReactLoopFactory, Tool, ToolContext
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

LIFECYCLE = ("session/created", "agent/created", "agent/session-start", "agent/disposed", "session/disposed")


def record(h: Harness, names: tuple[str, ...] = LIFECYCLE) -> list[str]:
    seen: list[str] = []
    for name in names:
        h.bus.on(name, lambda n: seen.append(n.name))
    return seen


async def test_setup_runs_before_publication_and_announcements_are_ordered() -> None:
    async with open_test_harness() as h:
        seen = record(h)
        gate = trio.Event()
        observed: list[tuple[int, int]] = []

        async def setup(agent: Agent) -> None:
            observed.append((len(h.agents.list()), len(h.sessions.list())))
            await gate.wait()
            observed.append((len(h.agents.list()), len(h.sessions.list())))

        async with trio.open_nursery() as nursery:
            handles = []

            async def create() -> None:
                handles.append(await h.agents.create(session_id="a1", setup=setup))

            nursery.start_soon(create)
            await trio.testing.wait_all_tasks_blocked()
            assert h.agents.get("a1") is None and h.sessions.get("a1") is None
            assert seen == []
            gate.set()
        assert observed == [(0, 0), (0, 0)]
        assert seen == ["session/created", "agent/created", "agent/session-start"]
        agent = handles[0].agent
        assert agent.id == agent.session.id == "a1"
        await handles[0].dispose()
        assert seen[3:] == ["agent/disposed", "session/disposed"]


async def test_setup_commit_runs_and_tools_are_installed_before_publication() -> None:
    async with open_test_harness() as h:
        committed: list[bool] = []

        async def noop(ctx: ToolContext, args: dict[str, object]) -> str:
            return ""

        async def setup(agent: Agent) -> Callable[[], None]:
            agent.tools.add(Tool("mine", "m", {"type": "object"}, noop), scope=agent.scope)
            return lambda: committed.append(True)

        seen_tools: list[bool] = []
        h.bus.on("agent/created", lambda n: seen_tools.append(n.subject.tools.get("mine") is not None))
        async with h.agents.open(setup=setup) as agent:
            assert committed == [True] and seen_tools == [True]
            assert agent.tools.get("mine") is not None


@pytest.mark.parametrize("where", ["setup", "commit"])
async def test_failed_setup_or_commit_publishes_nothing_and_frees_the_id(where: str) -> None:
    async with open_test_harness() as h:
        seen = record(h)
        closed: list[bool] = []

        async def setup(agent: Agent) -> Callable[[], None]:
            agent.scope.add_exit_callback(lambda: closed.append(True))
            if where == "setup":
                raise RuntimeError("setup broke")

            def commit() -> None:
                raise RuntimeError("commit broke")

            return commit

        with pytest.raises(RuntimeError, match=f"{where} broke"):
            await h.agents.create(session_id="x", setup=setup)
        assert seen == [] and closed == [True]
        assert h.agents.list() == [] and h.sessions.list() == []
        handle = await h.agents.create(session_id="x")  # the id is free again
        await handle.dispose()


async def test_owner_closing_during_setup_publishes_nothing() -> None:
    async with open_test_harness() as h:
        seen = record(h)
        owner = await h.scope.open_child("owner")

        async def setup(agent: Agent) -> None:
            await owner.close()

        with pytest.raises(AgentError, match="owner scope"):
            await h.agents.create(session_id="o", setup=setup, owner=owner)
        assert seen == [] and h.agents.list() == []


async def test_same_id_race_exactly_one_publishes() -> None:
    async with open_test_harness() as h:
        gate = trio.Event()
        entered = 0

        async def setup(agent: Agent) -> None:
            nonlocal entered
            entered += 1
            await gate.wait()

        results: list[object] = []

        async def create() -> None:
            try:
                results.append(await h.agents.create(session_id="same", setup=setup))
            except AgentExistsError as exc:
                results.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            nursery.start_soon(create)
            await trio.testing.wait_all_tasks_blocked()
            assert entered == 2  # both ran setup
            gate.set()
        errors = [r for r in results if isinstance(r, AgentExistsError)]
        assert len(errors) == 1 and "already exists" in str(errors[0])
        assert len(h.agents.list()) == 1 and len(h.sessions.list()) == 1


async def test_cancelling_the_creator_after_return_does_not_stop_the_agent(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([{"text": "alive", "delay": 5}])
    async with open_test_harness(model) as h:
        with trio.CancelScope() as creator:
            handle = await h.agents.create()
            creator.cancel()
        handle.agent.followup("still there?")
        await handle.agent.when_idle()
        assert h.agents.get(handle.agent.id) is handle.agent
        end = handle.agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
        await handle.dispose()


async def test_cancelling_the_creator_during_setup_rolls_back(autojump_clock: trio.testing.MockClock) -> None:
    async with open_test_harness() as h:

        async def setup(agent: Agent) -> None:
            await trio.sleep_forever()

        with trio.move_on_after(1) as cs:
            await h.agents.create(session_id="c", setup=setup)
        assert cs.cancelled_caught
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_dispose_is_idempotent_and_memoized() -> None:
    async with open_test_harness() as h:
        seen = record(h, ("agent/disposed",))
        handle = await h.agents.create()
        async with trio.open_nursery() as nursery:
            for _ in range(3):
                nursery.start_soon(handle.dispose)
        await handle.dispose()
        assert seen == ["agent/disposed"] and handle.disposed


async def test_caller_scope_closing_disposes_its_agents() -> None:
    async with open_test_harness() as h:
        seen = record(h, ("agent/disposed", "session/disposed"))
        owner = await h.scope.open_child("caller")
        handle = await h.agents.create(owner=owner)
        await owner.close()
        assert handle.disposed and seen == ["agent/disposed", "session/disposed"]
        assert h.agents.list() == []


async def test_disposing_first_releases_the_owner_callback() -> None:
    async with open_test_harness() as h:
        owner = await h.scope.open_child("caller")
        handles = [await h.agents.create(owner=owner) for _ in range(50)]
        for handle in handles:
            await handle.dispose()
        assert sum(cb is not None for cb in owner._callbacks) == 0
        await owner.close()


async def test_factory_scope_closing_stops_every_agent_and_empties_the_slot() -> None:
    async with open_test_harness() as h:
        factory_scope = await h.scope.open_child("loop-v2")
        h.agents._factory = None  # the harness's own factory slot is released for this test
        h.agents.register_factory(ReactLoopFactory(), factory_scope)
        with pytest.raises(FactoryError, match="already registered"):
            h.agents.register_factory(ReactLoopFactory(), factory_scope)
        handles = [await h.agents.create() for _ in range(3)]
        await factory_scope.close()
        assert all(hd.disposed for hd in handles) and h.agents.list() == []
        with pytest.raises(FactoryError, match="no agent factory"):
            await h.agents.create()


async def test_teardown_order_scope_then_agent_then_session() -> None:
    async with open_test_harness() as h:
        order: list[str] = []
        h.bus.on("agent/disposed", lambda n: order.append("agent/disposed"))
        h.bus.on("session/disposed", lambda n: order.append("session/disposed"))

        async def setup(agent: Agent) -> None:
            agent.scope.add_exit_callback(lambda: order.append("scope callback"))

        handle = await h.agents.create(setup=setup)
        await handle.dispose()
        assert order == ["scope callback", "agent/disposed", "session/disposed"]


async def test_listener_requesting_disposal_sees_a_coherent_world() -> None:
    async with open_test_harness() as h, trio.open_nursery() as nursery:
        views: list[tuple[bool, bool]] = []
        handles: list[AgentHandle] = []

        def first(n: Notice) -> None:
            nursery.start_soon(handles[0].dispose) if handles else None
            views.append((h.agents.get("L") is not None, h.sessions.get("L") is not None))

        def second(n: Notice) -> None:
            views.append((h.agents.get("L") is not None, h.sessions.get("L") is not None))

        h.bus.on("agent/created", first)
        h.bus.on("agent/created", second)
        handle = await h.agents.create(session_id="L")
        handles.append(handle)
        assert views == [(True, True), (True, True)]
        await handle.dispose()
        assert h.agents.get("L") is None


async def test_stale_handle_cannot_remove_a_later_agent_with_the_same_id() -> None:
    async with open_test_harness() as h:
        old = await h.agents.create(session_id="reuse")
        await old.dispose()
        new = await h.agents.create(session_id="reuse")
        await old.dispose()  # stale: memoized, no effect on the new agent
        assert h.agents.get("reuse") is new.agent and h.sessions.get("reuse") is new.agent.session
        await new.dispose()


async def test_throwing_listener_does_not_break_lifecycle(caplog: pytest.LogCaptureFixture) -> None:
    model = ScriptedModel([{"text": "fine"}])
    async with open_test_harness(model) as h:

        def bad(n: Notice) -> None:
            raise RuntimeError(f"listener for {n.name} exploded")

        for name in (*LIFECYCLE, "agent/status"):
            h.bus.on(name, bad)
        handle = await h.agents.create()
        handle.agent.followup("hi")
        await handle.agent.when_idle()
        await handle.dispose()
        assert h.agents.list() == [] and h.sessions.list() == []
        assert "exploded" in caplog.text


async def test_async_with_binds_agent_to_block() -> None:
    async with open_test_harness() as h:
        async with h.agents.open(session_id="blk") as agent:
            assert h.agents.get("blk") is agent
        assert h.agents.get("blk") is None


async def test_resume_of_live_session_is_refused_and_unknown_is_not_found() -> None:
    from trio_harness._errors import SessionNotFoundError

    async with open_test_harness() as h:
        handle = await h.agents.create(session_id="live")
        with pytest.raises(AgentExistsError, match="live"):
            await h.agents.resume("live")
        with pytest.raises(SessionNotFoundError):
            await h.agents.resume("nobody")
        await handle.dispose()


async def test_create_of_a_stored_id_is_refused(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": "a"}])
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="kept") as agent:
            agent.followup("x")
            await agent.when_idle()
        with pytest.raises(AgentExistsError, match="resume it instead"):
            await h.agents.create(session_id="kept")


async def test_invalid_persisted_inbox_splice_fails_recovery(tmp_path: Path) -> None:
    async with open_test_harness(store=tmp_path) as h:
        async with h.agents.open(session_id="bad") as agent:
            agent.inject("parked")
            # a splice that removes an id that is not pending
            agent.session.append(ev.InboxSpliced, queue="next-step", start=0, removed=("ghost",), outcome="canceled")
        with pytest.raises(InboxError, match="ghost"):
            await h.agents.resume("bad")
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_harness_exit_disposes_everything_and_flushes(tmp_path: Path, autojump_clock: object) -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model, store=tmp_path) as h:
        handle = await h.agents.create(session_id="left-running")
        handle.agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
    assert handle.disposed
    from trio_harness.session import JsonlPersistence

    loaded = await JsonlPersistence(tmp_path).load("left-running")
    end = loaded.events[-1]
    assert isinstance(end, ev.TurnEnd) and end.cause == "disposed"


async def test_owner_queries_for_parent_and_child() -> None:
    async with open_test_harness() as h:
        parent = await h.agents.create(session_id="p")
        child = await h.agents.create(session_id="c", parent=parent.agent)
        assert h.agents.owner_of("c") == "p" and h.agents.owner_of("p") is None
        assert h.agents.owned_by("p") == [child.agent]
        assert child.agent.parent_id == "p"
        await parent.dispose()  # the parent's scope closing disposes the child
        assert child.disposed and h.agents.list() == []


async def test_a_thousand_agents_created_and_disposed_concurrently_leave_nothing() -> None:
    async with open_test_harness() as h:
        handles = []

        async def one(i: int) -> None:
            handle = await h.agents.create(session_id=f"agent-{i}", options=AgentOptions())
            handles.append(handle)
            await trio.lowlevel.checkpoint()
            await handle.dispose()

        async with trio.open_nursery() as nursery:
            for i in range(1000):
                nursery.start_soon(one, i)
        assert len(handles) == 1000 and all(hd.disposed for hd in handles)
        assert h.agents.list() == [] and h.sessions.list() == []
        factory_scope = h.agents._factory[1]  # type: ignore[index]
        assert factory_scope.children == ()
        await trio.testing.wait_all_tasks_blocked()
        root_task = trio.lowlevel.current_root_task()
        assert root_task is not None

        def count(task: trio.lowlevel.Task) -> int:
            return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

        # harness runner tasks only: root scope, 5 service scopes, bash and task service holders
        assert count(root_task) < 30
    gc.collect()
