"""The agent factory is a public seam: a second loop plugs in through it and consumers do not change.

``EchoAgent`` is a loop of its own, written against the public names only
(:class:`~trio_harness.agents.LoopAgent`, :class:`~trio_harness.agents.AgentFactory`,
:class:`~trio_harness.agents.Inbox`, the event records): each followup is one
turn whose answer repeats the prompt.  It is plugged into a harness opened with
``builtin_loop=False`` by a plugin whose scope is the factory's, and driven
through ``harness.agents`` like the default loop; each of the three owners of
an agent (its handle, the caller's scope, the factory's scope) tears it down.
"""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator, Awaitable
from decimal import Decimal
from typing import Any

import attrs
import pytest
import trio

from trio_harness import FactoryError, Scope, Session, open_harness
from trio_harness import events as ev
from trio_harness.agents import (
    AgentOptions,
    AgentRegistry,
    AgentStatus,
    FollowedPrompt,
    Followers,
    Inbox,
    LoopAgent,
    Prompt,
    ToolSet,
)
from trio_harness.model import UsageTotals
from trio_harness.testing import assert_balanced, event_types

LIFECYCLE = ("session/created", "agent/created", "agent/session-start", "agent/disposed", "session/disposed")


@attrs.define(eq=False)
class EchoAgent:
    """A minimal loop: a driver task in the agent's scope answers each followup with its text."""

    session: Session
    options: AgentOptions
    scope: Scope
    parent_id: str | None
    inbox: Inbox = attrs.field(init=False)
    tools: ToolSet = attrs.field(factory=ToolSet, init=False)
    status: AgentStatus = attrs.field(default="idle", init=False)
    disposing: bool = attrs.field(default=False, init=False)
    _wake: trio.Event = attrs.field(factory=trio.Event, init=False)
    _idle: trio.Event = attrs.field(factory=trio.Event, init=False)
    _done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _turn: int = attrs.field(default=0, init=False)
    _followers: Followers = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.inbox = Inbox.replay(self.session)
        self._followers = Followers(session=self.session, cancel=lambda followed: False)
        self._idle.set()
        self.scope.spawn(self._drive)

    @property
    def id(self) -> str:
        return self.session.id

    @property
    def usage(self) -> UsageTotals:
        return UsageTotals()

    @property
    def cost(self) -> Decimal | None:
        return None

    def cost_of(self, usage: UsageTotals | None, *, at: float | None = None) -> Decimal | None:
        return None

    def send(self, message: Prompt, *, mode: Any, settings: Any = None) -> str:
        inbox_message = Inbox.message(message, mode)
        self.inbox.append("next-turn" if mode == "followup" else "next-step", inbox_message)
        if mode != "inject":
            self._idle = trio.Event()
            self._wake.set()
        return inbox_message.id

    def followup(self, message: Prompt, *, settings: Any = None) -> str:
        return self.send(message, mode="followup")

    def steer(self, message: Prompt) -> str:
        return self.send(message, mode="steer")

    def inject(self, message: Prompt) -> str:
        return self.send(message, mode="inject")

    def cancel(self, cause: Any = "user", *, keep_inbox: bool = False) -> bool:
        return bool(self.inbox.clear()) if not keep_inbox else False

    async def run(self, prompt: Prompt, **kwargs: Any) -> Any:
        raise NotImplementedError

    def follow(
        self,
        message: Prompt,
        *,
        mode: Any = "followup",
        settings: Any = None,
        on_event: Any = None,
        on_done: Any = None,
    ) -> FollowedPrompt:
        msg = Inbox.message(message, mode)
        followed = self._followers.watch(msg.id, on_event, on_done)  # before the send: no event is missed
        self.send(msg, mode=mode)
        return followed

    async def when_idle(self) -> None:
        await self._idle.wait()

    def events(self, *, buffer: int = 256) -> Any:
        raise NotImplementedError

    async def compact(self, *, keep_tokens: int | None = None) -> None:
        return None

    @contextlib.asynccontextmanager
    async def maintenance(self) -> AsyncIterator[None]:
        yield

    def dispose_hook(self) -> Awaitable[None]:
        self.disposing = True
        self._wake.set()
        return self._done.wait()

    async def _drive(self) -> None:
        try:
            while not self.disposing:
                await self._wake.wait()
                self._wake = trio.Event()
                while not self.disposing and self.inbox.has_turn_work():
                    self.status = "running"
                    self._turn += 1
                    turn = self._turn
                    self.session.append(ev.TurnStart, turn=turn)
                    self.session.append(ev.StepStart, turn=turn, step=1)
                    for message in self.inbox.claim(turn, turn_boundary=True):
                        self.session.append(ev.UserMessage, turn=turn, step=1, message_id=message.id, text=message.text)
                        self.session.append(ev.AssistantMessage, turn=turn, step=1, text=f"echo: {message.text}")
                    self.session.append(ev.StepEnd, turn=turn, step=1)
                    self.session.append(ev.TurnEnd, turn=turn, reason="completed")
                    await trio.lowlevel.checkpoint()
                self.status = "idle"
                self._idle.set()
        finally:
            self._idle.set()
            self._done.set()


@attrs.define(eq=False)
class EchoFactory:
    """Builds echo agents (an :class:`~trio_harness.agents.AgentFactory`)."""

    built: list[EchoAgent] = attrs.field(factory=list)

    async def build(self, *, session: Session, options: AgentOptions, scope: Scope, parent_id: str | None) -> LoopAgent:
        agent = EchoAgent(session=session, options=options, scope=scope, parent_id=parent_id)
        self.built.append(agent)
        return agent


@attrs.define(eq=False)
class EchoLoop:
    """A plugin that fills the factory slot for as long as it is loaded."""

    agents: AgentRegistry
    factory: EchoFactory = attrs.field(factory=EchoFactory)
    name: str = "echo-loop"

    async def apply(self, scope: Scope) -> None:
        self.agents.register_factory(self.factory, scope)


@contextlib.asynccontextmanager
async def echo_harness() -> AsyncIterator[tuple[Any, EchoLoop, list[str]]]:
    async with open_harness(builtin_tools=False, builtin_loop=False) as harness:
        seen: list[str] = []
        for name in LIFECYCLE:
            harness.bus.on(name, lambda notice: seen.append(notice.name))
        loop = EchoLoop(harness.agents)
        await harness.load(loop)
        yield harness, loop, seen


async def test_without_the_builtin_loop_the_slot_is_empty() -> None:
    async with open_harness(builtin_tools=False, builtin_loop=False) as harness:
        with pytest.raises(FactoryError, match="no agent factory"):
            await harness.agents.create()


async def test_a_second_loop_is_driven_through_harness_agents_and_disposed_by_its_handle() -> None:
    async with echo_harness() as (harness, loop, seen):
        handle = await harness.agents.create(session_id="echo-1")
        agent = handle.agent
        assert harness.agents.get("echo-1") is agent and harness.sessions.get("echo-1") is not None
        assert loop.factory.built == [agent]
        agent.followup("hello")
        agent.send("again", mode="followup")
        await agent.when_idle()
        texts = [e.text for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
        assert texts == ["echo: hello", "echo: again"]
        assert_balanced(agent.session)
        assert event_types(agent.session).count("turn/end") == 2

        await handle.dispose()
        assert handle.disposed and isinstance(agent, EchoAgent) and agent.disposing
        assert harness.agents.list() == [] and harness.sessions.list() == []
        assert seen == list(LIFECYCLE)
        # The session outlived the agent in the store: it resumes as a fresh echo agent.
        resumed = await harness.agents.resume("echo-1")
        assert resumed.agent is not agent and len(resumed.agent.session) == len(agent.session)
        await resumed.dispose()


async def test_a_prompt_to_the_second_loop_is_followed_as_the_front_ends_follow_one() -> None:
    async with echo_harness() as (harness, _, _):
        handle = await harness.agents.create(session_id="echo-2")
        seen: list[str] = []
        followed = handle.agent.follow("hi there", on_event=lambda event: seen.append(event.type))
        outcome = await followed.wait()
        assert outcome.end is not None and (outcome.end.turn, outcome.end.reason) == (1, "completed")
        assert followed.turn == 1 and "assistant/message" in seen
        await handle.dispose()


async def test_the_callers_scope_closing_disposes_an_agent_of_the_second_loop() -> None:
    async with echo_harness() as (harness, _loop, _):
        caller = await harness.scope.open_child("caller")
        handle = await harness.agents.create(owner=caller)
        handle.agent.followup("hi")
        await handle.agent.when_idle()
        await caller.close()
        assert handle.disposed and harness.agents.list() == []


async def test_unloading_the_loop_disposes_its_agents_and_empties_the_slot() -> None:
    async with echo_harness() as (harness, loop, _):
        with pytest.raises(FactoryError, match="already registered"):
            harness.agents.register_factory(EchoFactory(), harness.scope)
        handles = [await harness.agents.create() for _ in range(3)]
        for handle in handles:
            handle.agent.followup("x")
        await harness.unload(loop.name)
        assert all(handle.disposed for handle in handles) and harness.agents.list() == []
        assert all(isinstance(a, EchoAgent) and a.disposing for a in loop.factory.built)
        with pytest.raises(FactoryError, match="no agent factory"):
            await harness.agents.create()
        # Loading it again fills the slot again: a reloaded loop serves new agents.
        again = EchoLoop(harness.agents)
        await harness.load(again)
        handle = await harness.agents.create()
        assert again.factory.built == [handle.agent]
        await handle.dispose()


async def test_the_harness_exit_disposes_the_agents_of_the_second_loop() -> None:
    async with echo_harness() as (harness, _loop, seen):
        handle = await harness.agents.create()
        handle.agent.followup("bye")
    assert handle.disposed
    assert seen == list(LIFECYCLE)
    assert_balanced(handle.agent.session)
