"""Create / resume publication, handles and the three teardown owners
(docs/guarantees.rst, "Publication")."""

from __future__ import annotations

import gc
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _util import turn_ends
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness._bus import Notice
from trio_harness._errors import (
    AgentDisposedError,
    AgentError,
    AgentExistsError,
    FactoryError,
    InboxError,
    InvalidSessionIdError,
)
from trio_harness._harness import Harness
from trio_harness.agents import Agent, AgentHandle, AgentOptions, ReactAgent, ReactLoopFactory, Tool, ToolContext
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness

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
        h.bus.on(
            "agent/created",
            lambda n: seen_tools.append(isinstance(n.subject, ReactAgent) and n.subject.tools.get("mine") is not None),
        )
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
            assert entered == 1  # the id is claimed before setup: the other create was refused at once
            assert len(results) == 1 and isinstance(results[0], AgentExistsError)
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


async def test_disposing_first_releases_the_owner_callback() -> None:
    async with open_test_harness() as h:
        owner = await h.scope.open_child("caller")
        handles = [await h.agents.create(owner=owner) for _ in range(50)]
        for handle in handles:
            await handle.dispose()
        assert sum(cb is not None for cb in owner._callbacks) == 0
        await owner.close()


async def test_factory_scope_closing_stops_every_agent_and_empties_the_slot() -> None:
    async with open_test_harness(builtin_loop=False) as h:  # the slot is left empty for this test's factory
        factory_scope = await h.scope.open_child("loop-v2")
        factory = ReactLoopFactory(bus=h.bus, tools=h.tools, agents=h.agents, model=h.model)
        h.agents.register_factory(factory, factory_scope)
        with pytest.raises(FactoryError, match="already registered"):
            h.agents.register_factory(factory, factory_scope)
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


@pytest.mark.parametrize("notice", ["session/created", "agent/created"])
async def test_listener_requesting_disposal_sees_a_coherent_world(notice: str) -> None:
    """A listener that closes the agent's owner mid-announcement: the others still see it whole."""
    async with open_test_harness() as h, trio.open_nursery() as nursery:
        owner = await h.scope.open_child("owner")
        views: list[tuple[str, bool, bool]] = []
        requested: list[str] = []

        def view(n: Notice) -> None:
            views.append((n.name, h.agents.get("L") is not None, h.sessions.get("L") is not None))

        def dispose_it(n: Notice) -> None:
            # The owner's teardown is requested now; it runs at the next checkpoint.
            nursery.start_soon(owner.close)
            requested.append(n.name)
            view(n)

        h.bus.on(notice, dispose_it)
        for name in ("session/created", "agent/created", "agent/session-start"):
            h.bus.on(name, view)
        seen = record(h)
        handle = await h.agents.create(session_id="L", owner=owner)
        assert requested == [notice]
        # Every listener of every announcement saw both registries holding the agent.
        assert all(agent_live and session_live for _, agent_live, session_live in views)
        assert [name for name, _, _ in views] == [
            *([notice] if notice == "session/created" else []),
            "session/created",
            *([notice] if notice == "agent/created" else []),
            "agent/created",
            "agent/session-start",
        ]
        assert seen == ["session/created", "agent/created", "agent/session-start"]
        await trio.testing.wait_all_tasks_blocked()  # the requested teardown runs to its end
        assert handle.disposed
        assert seen[3:] == ["agent/disposed", "session/disposed"]
        assert h.agents.get("L") is None and h.sessions.get("L") is None


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
    from trio_harness.session import JsonlStore

    loaded = await JsonlStore(tmp_path).load("left-running")
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
        (factory_scope,) = [scope for scope in h.scope.children if scope.name == "harness/agents"]
        assert factory_scope.children == ()
        await trio.testing.wait_all_tasks_blocked()
        root_task = trio.lowlevel.current_root_task()
        assert root_task is not None

        def count(task: trio.lowlevel.Task) -> int:
            return 1 + sum(count(t) for n in task.child_nurseries for t in n.child_tasks)

        # harness runner tasks only: root scope, 5 service scopes, bash and task service holders
        assert count(root_task) < 30
    gc.collect()


# ---------------------------------------------------------------- a disposed agent changes nothing


def disposed(handle: AgentHandle) -> bool:
    """Whether the handle's agent is disposed (a function, so type checkers do not narrow it)."""
    return handle.disposed


async def _maintain(agent: Agent) -> None:
    async with agent.maintenance():
        pass  # pragma: no cover  # refused before the block


def _now(change: Callable[[Agent], object]) -> Callable[[Agent], Awaitable[object]]:
    async def run(agent: Agent) -> object:
        return change(agent)

    return run


DISPOSED_OPERATIONS: dict[str, Callable[[Agent], Awaitable[object]]] = {
    "cancel": _now(lambda a: a.cancel()),
    "cancel(keep_inbox)": _now(lambda a: a.cancel("parent", keep_inbox=True)),
    "followup": _now(lambda a: a.followup("late")),
    "steer": _now(lambda a: a.steer("late")),
    "inject": _now(lambda a: a.inject("late")),
    "send": _now(lambda a: a.send(ev.InboxMessage("late-id", "late"), mode="followup")),
    "inbox.clear": _now(lambda a: a.inbox.clear()),
    "inbox.remove": _now(lambda a: a.inbox.remove(a.inbox.next_turn[0].id)),
    "inbox.append": _now(lambda a: a.inbox.append("next-turn", ev.InboxMessage("late-id", "late"))),
    "maintenance": _maintain,
}


@pytest.mark.parametrize("operation", list(DISPOSED_OPERATIONS))
async def test_operations_on_a_disposed_agent_change_nothing(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, operation: str
) -> None:
    """Cancel (or any change) after dispose is refused: the flushed, detached log stays as it is."""
    async with open_test_harness(ScriptedModel([{"hang": True}]), store=tmp_path) as h:
        handle = await h.agents.create(session_id="gone")
        agent = handle.agent
        agent.followup("running")
        await trio.testing.wait_all_tasks_blocked()
        agent.followup("queued")
        agent.inject("parked")
        await handle.dispose()
        log = tmp_path / "gone" / "session.jsonl"
        stored, length = log.read_bytes(), len(agent.session)
        with pytest.raises(AgentDisposedError, match="'gone' is disposed"):
            await DISPOSED_OPERATIONS[operation](agent)
        assert len(agent.session) == length and log.read_bytes() == stored
        assert [m.text for m in agent.inbox.next_turn] == ["queued"]
    async with (
        open_test_harness(ScriptedModel([]), store=tmp_path) as h,
        h.agents.open(session_id="gone", resume=True) as resumed,
    ):
        # The queued work is still queued, exactly as the disposed agent left it.
        assert [m.text for m in resumed.inbox.next_turn] == ["queued"]
        assert [m.text for m in resumed.inbox.next_step] == ["parked"]
        end = resumed.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "disposed")
        assert_balanced(resumed.session)


async def test_cancel_while_disposal_runs_is_refused_and_the_turn_ends_disposed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async with open_test_harness(ScriptedModel([{"hang": True}])) as h:
        handle = await h.agents.create()
        agent = handle.agent
        agent.followup("running")
        await trio.testing.wait_all_tasks_blocked()
        refused: list[BaseException] = []

        def cancel_on_disposal(n: Notice) -> None:
            try:
                agent.cancel()
            except AgentDisposedError as exc:
                refused.append(exc)

        # agent/status "idle" is emitted while the close hook waits for quiescence.
        h.bus.on("agent/status", cancel_on_disposal)
        await handle.dispose()
        assert len(refused) == 1
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "disposed")


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


class _ExitOnCloseRequest(trio.abc.Instrument):
    """Exits a maintenance block at the moment the agent's teardown is requested.

    ``Scope.close`` marks the scope closing and wakes the scope's runner, which
    runs the close hooks at its next step; this exits the block in between,
    synchronously (the block's exit has no checkpoint), so the exit sees a
    closing scope whose close hook has not run yet.
    """

    def __init__(self, agent: Agent, block: Any) -> None:
        self.agent = agent
        self.block = block
        self.exited = False

    def task_scheduled(self, task: trio.lowlevel.Task) -> None:
        if not self.exited and self.agent.scope.closing:
            self.exited = True
            with pytest.raises(StopIteration):
                self.block.__aexit__(None, None, None).send(None)


@pytest.mark.parametrize("order", ["close-hook-first", "maintenance-exit-first"])
async def test_maintenance_exit_after_dispose_started_does_not_start_a_driver(
    autojump_clock: trio.testing.MockClock, order: str
) -> None:
    # Teardown is requested while maintenance holds the agent and input waits; the
    # block then exits either after the close hook started (it waits for the
    # block) or before it ran (the scope is closing, the hook has not run).
    model = ScriptedModel([{"text": "never"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        block = agent.maintenance()
        await block.__aenter__()
        agent.followup("during maintenance")
        if order == "close-hook-first":
            with trio.move_on_after(0):
                await handle.dispose()  # teardown requested, not yet awaited
            await trio.testing.wait_all_tasks_blocked()  # the close hook waits for the block
            assert agent.scope.closing
            await block.__aexit__(None, None, None)
        else:
            instrument = _ExitOnCloseRequest(agent, block)
            trio.lowlevel.add_instrument(instrument)
            try:
                with trio.move_on_after(0):
                    await handle.dispose()
            finally:
                trio.lowlevel.remove_instrument(instrument)
            assert instrument.exited
        start = trio.current_time()
        await handle.dispose()
        assert trio.current_time() == start  # no teardown timeout was needed
        assert agent.status == "idle"
        await agent.when_idle()
        assert model.requests == []
        assert h.agents.list() == [] and h.sessions.list() == []


# ---------------------------------------------------------------- the owner closing during setup


@pytest.mark.parametrize("source", ["create", "resume"])
async def test_owner_closing_cancels_a_slow_setup_promptly(autojump_clock: trio.testing.MockClock, source: str) -> None:
    async with open_test_harness() as h:
        if source == "resume":
            async with h.agents.open(session_id="slow") as stored:
                stored.inject("a stored event")
        seen = record(h, (*LIFECYCLE, "agent/status"))
        owner = await h.scope.open_child("owner")
        cleaned_up: list[float] = []
        outcome: list[BaseException] = []

        async def setup(agent: Agent) -> None:
            try:
                await trio.sleep(1000)
            finally:
                cleaned_up.append(trio.current_time())

        async def build() -> None:
            try:
                if source == "create":
                    await h.agents.create(session_id="slow", setup=setup, owner=owner)
                else:
                    await h.agents.resume("slow", setup=setup, owner=owner)
            except AgentError as exc:
                outcome.append(exc)

        start = trio.current_time()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(build)
            await trio.sleep(1)
            await owner.close()
            # When the owner's close returns, the creation has rolled back.
            assert [type(e) for e in outcome] == [AgentError]
            assert trio.current_time() - start == 1
        assert cleaned_up == [start + 1]
        assert "owner scope 'harness/owner' closed during setup" in str(outcome[0])
        assert seen == [] and h.agents.list() == [] and h.sessions.list() == []
        # The id is free again.
        again = await (h.agents.create(session_id="slow") if source == "create" else h.agents.resume("slow"))
        assert again.agent.id == "slow"
        await again.dispose()


@pytest.mark.parametrize("order", ["close requested as setup returns", "close requested after publication"])
async def test_owner_close_racing_the_end_of_setup(order: str) -> None:
    """Both orders, forced: a close requested before publication rolls back; after it, disposes."""
    async with open_test_harness() as h, trio.open_nursery() as nursery:
        seen = record(h)
        owner = await h.scope.open_child("owner")

        async def setup(agent: Agent) -> None:
            if order == "close requested as setup returns":
                # close() marks the owner closing at once; its teardown has not run yet.
                with trio.CancelScope() as cs:
                    cs.cancel()
                    await owner.close()
            else:
                nursery.start_soon(owner.close)  # runs only after create returned

        if order == "close requested as setup returns":
            with pytest.raises(AgentError, match="owner scope 'harness/owner' closed during setup"):
                await h.agents.create(session_id="race", setup=setup, owner=owner)
            assert seen == []
        else:
            handle = await h.agents.create(session_id="race", setup=setup, owner=owner)
            await trio.testing.wait_all_tasks_blocked()
            assert disposed(handle)
            assert seen == [*LIFECYCLE]
        await owner.close()
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_an_owner_already_closing_is_refused_before_anything_is_prepared() -> None:
    async with open_test_harness() as h:
        seen = record(h)
        ran: list[bool] = []

        async def setup(agent: Agent) -> None:
            ran.append(True)

        owner = await h.scope.open_child("owner")
        await owner.close()
        with pytest.raises(AgentError, match="its owner scope 'harness/owner' is closing"):
            await h.agents.create(session_id="late", owner=owner, setup=setup)
        # The implicit owner: an exit callback runs in its (closing) scope.
        worker = await h.scope.open_child("worker")
        refused: list[AgentError] = []

        async def create_in_teardown() -> None:
            try:
                await h.agents.create(session_id="late", setup=setup)
            except AgentError as exc:
                refused.append(exc)

        worker.add_exit_callback(create_in_teardown)
        await worker.close()
        assert "the scope this code runs in 'harness/worker' is closing" in str(refused[0])
        assert ran == [] and seen == []
        handle = await h.agents.create(session_id="late")
        await handle.dispose()


async def test_harness_exit_cancels_a_slow_setup_promptly(autojump_clock: trio.testing.MockClock) -> None:
    outcome: list[BaseException] = []

    async def setup(agent: Agent) -> None:
        await trio.sleep(1000)

    async def build(h: Harness) -> None:
        with pytest.raises(FactoryError) as caught:
            await h.agents.create(session_id="slow", setup=setup)
        outcome.append(caught.value)

    async with trio.open_nursery() as nursery:  # the creator lives outside the harness
        async with open_test_harness() as h:
            nursery.start_soon(build, h)
            await trio.sleep(1)
        assert trio.current_time() == 1 and len(outcome) == 1
        assert "unloaded during setup" in str(outcome[0])


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


# ---------------------------------------------------------------- the caller's scope as default owner


class _Creator:
    """A plugin whose ``apply`` creates one agent (optionally with an explicit owner)."""

    def __init__(self, h: Harness, owner: object = None) -> None:
        self.name = "creator"
        self.h = h
        self.owner = owner
        self.handles: list[AgentHandle] = []

    async def apply(self, scope: object) -> None:
        kwargs = {"owner": self.owner} if self.owner is not None else {}
        self.handles.append(await self.h.agents.create(session_id="from-plugin", **kwargs))  # type: ignore[arg-type]


async def test_an_agent_created_by_a_plugin_is_disposed_when_the_plugin_unloads() -> None:
    async with open_test_harness() as h:
        seen = record(h, ("agent/disposed",))
        plugin = _Creator(h)
        await h.load(plugin)
        (handle,) = plugin.handles
        assert not disposed(handle)
        await h.unload("creator")
        assert disposed(handle) and seen == ["agent/disposed"]
        assert h.agents.list() == [] and h.sessions.list() == []


async def test_an_explicit_owner_wins_over_the_callers_scope() -> None:
    async with open_test_harness() as h:
        keeper = await h.scope.open_child("keeper")
        plugin = _Creator(h, owner=keeper)
        await h.load(plugin)
        (handle,) = plugin.handles
        await h.unload("creator")
        assert not disposed(handle) and h.agents.get("from-plugin") is handle.agent
        await keeper.close()
        assert disposed(handle)


async def test_an_agent_created_by_a_task_of_a_scope_is_owned_by_that_scope() -> None:
    async with open_test_harness() as h:
        worker = await h.scope.open_child("worker")
        handles: list[AgentHandle] = []

        async def work() -> None:
            handles.append(await h.agents.create(session_id="by-task"))

        worker.spawn(work)
        await trio.testing.wait_all_tasks_blocked()
        assert len(handles) == 1 and not disposed(handles[0])
        await worker.close()
        assert disposed(handles[0])


async def test_a_plain_caller_outside_every_scope_creates_an_agent_only_the_harness_owns() -> None:
    async with open_test_harness() as h:
        handle = await h.agents.create(session_id="plain")
        other = await h.scope.open_child("unrelated")
        await other.close()
        assert not disposed(handle)
    assert disposed(handle)


async def test_a_task_whose_scope_closes_during_setup_is_cancelled_not_failed(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """The caller's own scope closing cancels it like any task of that scope: no error escapes."""
    async with open_test_harness() as h:
        seen = record(h)
        worker = await h.scope.open_child("worker")
        cancelled: list[bool] = []

        async def setup(agent: Agent) -> None:
            try:
                await trio.sleep(1000)
            except trio.Cancelled:
                cancelled.append(True)
                raise

        async def work() -> None:
            await h.agents.create(session_id="doomed", setup=setup)

        worker.spawn(work)
        await trio.sleep(1)
        await worker.close()
        assert trio.current_time() == 1 and cancelled == [True]
        assert seen == [] and h.agents.list() == [] and h.sessions.list() == []


# ---------------------------------------------------------------- bad input at the boundary


BAD_IDS: list[object] = [["x"], {"a": 1}, 5, b"x", "", "a/b"]


@pytest.mark.parametrize("bad", BAD_IDS, ids=repr)
async def test_an_unusable_session_id_is_refused_before_any_lookup(tmp_path: Path, bad: object) -> None:
    async with open_test_harness(store=tmp_path) as h:
        with pytest.raises(InvalidSessionIdError, match="session id"):
            await h.agents.create(session_id=bad)  # type: ignore[arg-type]
        with pytest.raises(InvalidSessionIdError, match="session id"):
            await h.agents.resume(bad)  # type: ignore[arg-type]
        if not isinstance(bad, str):
            for query in (h.agents.get, h.agents.owner_of, h.agents.owned_by):
                with pytest.raises(InvalidSessionIdError, match=type(bad).__name__):
                    query(bad)  # type: ignore[arg-type]
        assert h.agents.list() == [] and h.sessions.list() == []
    assert list(tmp_path.iterdir()) == []


@given(
    cwd=st.one_of(
        st.integers(), st.binary(), st.floats(allow_nan=False), st.lists(st.text(max_size=3), max_size=2), st.booleans()
    )
)
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_a_cwd_that_is_not_text_is_refused_and_nothing_is_written(tmp_path: Path, cwd: object) -> None:
    async def main() -> None:
        async with open_test_harness(ScriptedModel([{"text": "x"}]), store=tmp_path) as h:
            with pytest.raises(TypeError, match=f"cwd must be a str.*got {type(cwd).__name__}"):
                await h.agents.create(session_id="cwd", cwd=cwd)  # type: ignore[arg-type]
            assert h.agents.list() == [] and h.sessions.list() == []
            async with h.agents.open(session_id="cwd", cwd="/fine") as agent:  # the id stays free
                assert agent.session.header.cwd == "/fine"
        # Nothing was stored for the refused create; the good one stores no turn.
        assert not (tmp_path / "cwd" / "session.jsonl").exists()

    trio.run(main)


async def test_a_path_object_as_cwd_is_recorded_as_text(tmp_path: Path) -> None:
    async with open_test_harness(ScriptedModel([{"text": "x"}]), store=tmp_path) as h:
        async with h.agents.open(session_id="p", cwd=tmp_path) as agent:
            assert agent.session.header.cwd == str(tmp_path) and type(agent.session.header.cwd) is str
            agent.followup("go")
            await agent.when_idle()
    async with open_test_harness(store=tmp_path) as h, h.agents.open(session_id="p", resume=True) as agent:
        assert agent.session.header.cwd == str(tmp_path)


async def test_arguments_of_the_wrong_type_are_refused_by_name() -> None:
    async with open_test_harness() as h:
        with pytest.raises(TypeError, match="options must be an AgentOptions, got dict"):
            await h.agents.create(options={"max_steps": 3})  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="owner must be a Scope, got str"):
            await h.agents.create(owner="harness")  # type: ignore[arg-type]
        with pytest.raises(TypeError, match="setup must be an async function"):
            await h.agents.create(setup="no")  # type: ignore[arg-type]
        assert h.agents.list() == [] and h.sessions.list() == []
