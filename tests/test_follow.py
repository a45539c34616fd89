"""``agent.follow()``: one prompt sent and followed to the end of its turn (agents.FollowedPrompt)."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from _util import turn_ends

from trio_harness import AgentDisposedError, ScriptedModel
from trio_harness.agents import FollowedPrompt, Tool, ToolContext, TurnOutcome
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness


class Recorder:
    """The callbacks of one followed prompt."""

    def __init__(self) -> None:
        self.events: list[ev.Event] = []
        self.outcomes: list[TurnOutcome] = []

    def follow(self, agent: Any, message: str, **kwargs: Any) -> FollowedPrompt:
        followed: FollowedPrompt = agent.follow(
            message, on_event=self.events.append, on_done=self.outcomes.append, **kwargs
        )
        return followed

    @property
    def turns(self) -> set[int | None]:
        return {getattr(event, "turn", None) for event in self.events}

    def texts(self) -> list[str]:
        return [event.text for event in self.events if isinstance(event, ev.UserMessage)]


def gate_tool(gate: trio.Event) -> Tool:
    async def wait_gate(ctx: ToolContext, args: dict[str, Any]) -> str:
        await gate.wait()
        return "opened"

    return Tool("gate", "waits for the test", {"type": "object"}, wait_gate)


GATED: list[dict[str, Any]] = [{"tool_calls": [{"name": "gate", "arguments": {}}]}, {"text": "done"}]


async def test_the_outcome_and_the_events_of_the_prompts_turn() -> None:
    model = ScriptedModel([{"text": "first"}, {"text": "second"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        await agent.run("earlier")
        seen = Recorder()
        followed = seen.follow(agent, "follow me")
        assert (followed.done, followed.outcome, followed.turn) == (False, None, None)
        assert followed.message_id in agent.inbox
        outcome = await followed.wait()
        assert await followed.wait() is outcome  # the outcome stays
        agent.followup("later")  # not the followed prompt's turn: not reported
        await agent.when_idle()
    assert outcome.end is not None and (outcome.end.turn, outcome.end.reason) == (2, "completed")
    assert followed.done and followed.outcome is outcome and followed.turn == 2
    assert seen.outcomes == [outcome]
    # Every event of turn 2 after the claim of the message, up to its end (excluded).
    assert seen.turns == {2}
    assert not any(isinstance(event, ev.TurnEnd) for event in seen.events)
    (message,) = [event for event in seen.events if isinstance(event, ev.UserMessage)]
    assert (message.message_id, message.text) == (followed.message_id, "follow me")
    assert "".join(e.text for e in seen.events if isinstance(e, ev.AssistantChunk)) == "second"
    assert repr(followed) == f"<FollowedPrompt {followed.message_id!r} done>"


async def test_settings_and_a_given_message_are_sent_as_send_sends_them() -> None:
    from trio_harness import ModelSettings
    from trio_harness.events import InboxMessage

    model = ScriptedModel([{"text": "ok"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        followed = agent.follow(InboxMessage(id="m-given", text="hi"), settings=ModelSettings(temperature=0.5))
        assert followed.message_id == "m-given"
        outcome = await followed.wait()
    assert outcome.end is not None and outcome.end.reason == "completed"
    assert model.requests[0].settings.temperature == 0.5


async def test_cancel_stops_the_followed_turn_alone(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    async with open_test_harness(ScriptedModel(GATED)) as h:
        h.tools.add(gate_tool(gate))
        async with h.agents.open() as agent:
            followed = agent.follow("hold")
            await trio.testing.wait_all_tasks_blocked()
            assert followed.turn == 1 and not followed.done
            agent.followup("next")  # queued behind the followed prompt
            assert followed.cancel()
            outcome = await followed.wait()
            assert not followed.cancel()  # the outcome is known: nothing to stop
            await agent.when_idle()
            assert turn_ends(agent) == [(1, "aborted", "user")]
            assert [message.text for message in agent.inbox.next_turn] == ["next"]  # stays queued, as after cancel()
    assert outcome.end is not None and (outcome.end.reason, outcome.end.cause) == ("aborted", "user")


async def test_cancel_drops_a_queued_prompt_and_the_running_turn_goes_on(
    autojump_clock: trio.testing.MockClock,
) -> None:
    gate = trio.Event()
    async with open_test_harness(ScriptedModel(GATED)) as h:
        h.tools.add(gate_tool(gate))
        async with h.agents.open() as agent:
            running = agent.follow("hold")
            await trio.testing.wait_all_tasks_blocked()
            queued = agent.follow("never runs")
            assert queued.cancel()
            assert await queued.wait() == TurnOutcome(end=None)
            assert queued.message_id not in agent.inbox and queued.turn is None
            gate.set()
            end = (await running.wait()).end
            assert end is not None and end.reason == "completed"


async def test_a_cancelled_wait_leaves_the_prompt_running(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    async with open_test_harness(ScriptedModel(GATED)) as h:
        h.tools.add(gate_tool(gate))
        async with h.agents.open() as agent:
            followed = agent.follow("hold")
            with trio.move_on_after(5):
                await followed.wait()
            assert agent.status == "running" and not followed.done
            gate.set()
            end = (await followed.wait()).end
            assert end is not None and end.reason == "completed"


async def test_a_steer_while_following_joins_the_followed_turn(autojump_clock: trio.testing.MockClock) -> None:
    gate = trio.Event()
    async with open_test_harness(ScriptedModel(GATED)) as h:
        h.tools.add(gate_tool(gate))
        async with h.agents.open() as agent:
            prompt, steer = Recorder(), Recorder()
            followed = prompt.follow(agent, "hold")
            await trio.testing.wait_all_tasks_blocked()
            steered = steer.follow(agent, "mid", mode="steer")
            agent.steer("also mid")
            gate.set()
            outcome = await followed.wait()
            assert await steered.wait() == outcome  # a steer is followed to the end of the turn it joins
    assert outcome.end is not None and (outcome.end.turn, outcome.end.reason) == (1, "completed")
    assert followed.turn == steered.turn == 1
    assert prompt.texts() == ["hold", "mid", "also mid"]
    assert steer.texts() == ["mid", "also mid"]  # from its claim on
    assert prompt.turns == steer.turns == {1}


async def test_two_followers_at_once_each_get_their_own_turn() -> None:
    model = ScriptedModel([{"text": "one"}, {"text": "two"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        first, second = Recorder(), Recorder()
        a = first.follow(agent, "a")
        b = second.follow(agent, "b")
        async with trio.open_nursery() as nursery:
            nursery.start_soon(b.wait)
            nursery.start_soon(a.wait)
    assert (a.turn, b.turn) == (1, 2)
    assert first.turns == {1} and second.turns == {2}
    assert first.texts() == ["a"] and second.texts() == ["b"]
    assert [o.end.turn for o in first.outcomes + second.outcomes if o.end is not None] == [1, 2]


async def test_following_on_a_disposed_agent_raises() -> None:
    async with open_test_harness(ScriptedModel([])) as h:
        async with h.agents.open() as agent:
            pass
        with pytest.raises(AgentDisposedError, match="cannot follow a prompt"):
            agent.follow("too late")


async def test_disposal_reports_a_follower_still_waiting_with_no_end() -> None:
    async with open_test_harness(ScriptedModel([])) as h:
        seen = Recorder()
        async with h.agents.open() as agent:
            followed = seen.follow(agent, "parked", mode="inject")  # queued; the agent stays idle
        assert seen.outcomes == [TurnOutcome(end=None)]
        assert await followed.wait() == TurnOutcome(end=None)
        assert not followed.cancel()


async def test_a_send_that_fails_leaves_no_follower() -> None:
    async with open_test_harness(ScriptedModel([{"text": "ok"}])) as h, h.agents.open() as agent:
        with pytest.raises(ValueError, match="mode"):
            agent.follow("x", mode="shout")  # type: ignore[arg-type]
        with pytest.raises(TypeError):
            agent.follow(42)  # type: ignore[arg-type]
        observers = len(agent.session._observers)
        outcome = await agent.follow("ok").wait()
        assert outcome.end is not None
        assert len(agent.session._observers) == observers  # released once done
