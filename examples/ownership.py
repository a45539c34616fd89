"""Ownership: who may tear an agent down, and the order teardown follows.

Three owners can start an agent's teardown, and all of them await the same
single, shielded teardown:

1. the :class:`~trio_harness.AgentHandle` returned by ``create`` / ``resume``
   (``await handle.dispose()``, idempotent and memoized);
2. the caller's scope, passed as ``owner=``: when that scope closes (here a
   plugin is unloaded), every agent it owns is disposed;
3. the factory's scope: when the harness closes, every agent it built is
   disposed, even one whose handle was dropped.

Each agent here is mid-turn (its model call hangs) when its owner acts, so
the turn ends ``aborted`` with cause ``disposed``.  Listeners print the
observable order: the agent scope's own resources unwind first, then
``agent/disposed``, then ``session/disposed`` (after the final flush).
"""

from __future__ import annotations

import trio
import trio.testing

from trio_harness import Agent, Harness, Notice, Scope, ScriptedModel, open_harness
from trio_harness import events as ev


def watch(harness: Harness) -> None:
    def show(notice: Notice) -> None:
        print(f"    {notice.name} {notice.subject.id}")

    harness.bus.on("agent/disposed", show)
    harness.bus.on("session/disposed", show)


def start_work(agent: Agent) -> None:
    agent.followup("Work until told to stop.")

    def scope_closed() -> None:
        # Registered last in the agent's scope, so it unwinds first.
        print(f"    agent scope {agent.id} closed (tools, listeners, owned tasks unwound)")

    agent.scope.add_exit_callback(scope_closed)


def last_turn(agent: Agent) -> str:
    end = agent.session.events[-1]
    assert isinstance(end, ev.TurnEnd)
    assert (end.reason, end.cause) == ("aborted", "disposed")
    return f"turn {end.turn} ended {end.reason} (cause: {end.cause})"


class TeamPlugin:
    """A plugin that creates two agents owned by its own scope."""

    name = "team"

    def __init__(self, harness: Harness) -> None:
        self.harness = harness
        self.agents: list[Agent] = []

    async def apply(self, scope: Scope) -> None:
        for session_id in ("team-a", "team-b"):
            # The handle is not kept: the plugin's scope is the owner.
            handle = await self.harness.agents.create(session_id=session_id, owner=scope)
            self.agents.append(handle.agent)
            start_work(handle.agent)


async def main() -> None:
    model = ScriptedModel([{"hang": True}] * 4)
    orphan: Agent | None = None
    async with open_harness(model=model, builtin_tools=False) as harness:
        watch(harness)

        print("1. the handle disposes its agent (twice, concurrently: one teardown)")
        handle = await harness.agents.create(session_id="by-handle")
        start_work(handle.agent)
        await trio.testing.wait_all_tasks_blocked()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(handle.dispose)
            nursery.start_soon(handle.dispose)
        await handle.dispose()  # already done: returns at once
        print(f"    {last_turn(handle.agent)}; disposed={handle.disposed}")

        print("2. the caller's scope closes: a plugin is unloaded")
        plugin = TeamPlugin(harness)
        await harness.load(plugin)
        await trio.testing.wait_all_tasks_blocked()
        print(f"    live agents: {[a.id for a in harness.agents.list()]}")
        await harness.unload("team")
        for agent in plugin.agents:
            print(f"    {agent.id}: {last_turn(agent)}")
        assert harness.agents.list() == []

        print("3. the factory's scope closes: the harness exits")
        orphan = (await harness.agents.create(session_id="orphan")).agent  # handle dropped
        start_work(orphan)
        await trio.testing.wait_all_tasks_blocked()
        assert orphan.status == "running"
    assert orphan is not None
    print(f"    orphan: {last_turn(orphan)}")
    print("harness closed: no agent, session, task or process is left")


if __name__ == "__main__":
    trio.run(main)
