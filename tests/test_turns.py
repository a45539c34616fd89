"""Following one message to the end of the turn that ran it (agents.TurnWatcher)."""

from __future__ import annotations

import trio.testing

from trio_harness import ScriptedModel
from trio_harness.agents import TurnOutcome, TurnWatcher
from trio_harness.events import InboxMessage
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness


class Recorder:
    def __init__(self, message_id: str) -> None:
        self.events: list[ev.Event] = []
        self.outcomes: list[TurnOutcome] = []
        self.watcher = TurnWatcher(message_id, self.events.append, self.outcomes.append)


async def test_the_claiming_turn_is_followed_to_its_end() -> None:
    model = ScriptedModel([{"text": "first"}, {"text": "second"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("earlier")
        await agent.when_idle()
        watched = Recorder("m-watched")
        agent.session.observe(watched.watcher)
        agent.followup(InboxMessage(id="m-watched", text="watch me"))
        await agent.when_idle()
    (outcome,) = watched.outcomes
    assert outcome.end is not None and (outcome.end.turn, outcome.end.reason) == (2, "completed")
    assert watched.watcher.turn == 2 and watched.watcher.done
    # Every event of turn 2 after the claim, except its end; nothing of turn 1.
    assert {getattr(e, "turn", None) for e in watched.events} == {2}
    assert not any(isinstance(e, ev.TurnEnd) for e in watched.events)
    chunks = [e.text for e in watched.events if isinstance(e, ev.AssistantChunk)]
    assert "".join(chunks) == "second"


async def test_a_message_canceled_before_any_turn_claimed_it_ends_with_no_end() -> None:
    async with open_test_harness(ScriptedModel([])) as h, h.agents.open() as agent:
        watched = Recorder("m-queued")
        agent.session.observe(watched.watcher)
        agent.inject(InboxMessage(id="m-queued", text="never runs"))  # queued, the agent stays idle
        assert agent.cancel("user")
        await agent.when_idle()
    assert watched.outcomes == [TurnOutcome(end=None)]
    assert watched.events == [] and watched.watcher.turn is None


async def test_an_aborted_turn_is_reported_with_its_end() -> None:
    async with open_test_harness(ScriptedModel([{"hang": True}])) as h, h.agents.open() as agent:
        watched = Recorder("m-hang")
        agent.session.observe(watched.watcher)
        agent.followup(InboxMessage(id="m-hang", text="hang"))
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel("user")
        await agent.when_idle()
    (outcome,) = watched.outcomes
    assert outcome.end is not None and (outcome.end.reason, outcome.end.cause) == ("aborted", "user")


def test_abandon_reports_once_and_later_events_are_ignored() -> None:
    watched = Recorder("m")
    watched.watcher(ev.UserMessage(seq=0, ts=0.0, turn=3, step=1, message_id="m", text="t"))
    watched.watcher.abandon()
    watched.watcher.abandon()
    watched.watcher(ev.StepEnd(seq=1, ts=0.0, turn=3, step=1))
    watched.watcher(ev.TurnEnd(seq=2, ts=0.0, turn=3, reason="completed"))
    assert watched.outcomes == [TurnOutcome(end=None)]
    assert watched.events == []


def test_only_the_claiming_turn_counts() -> None:
    watched = Recorder("m")
    other_end = ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="completed")
    watched.watcher(other_end)  # before the claim: not ours
    claim = ev.InboxSpliced(seq=1, ts=0.0, queue="next-turn", start=0, removed=("m",), outcome="claimed", turn=2)
    watched.watcher(claim)
    watched.watcher(ev.StepStart(seq=2, ts=0.0, turn=2, step=1))
    watched.watcher(ev.TurnEnd(seq=3, ts=0.0, turn=1, reason="completed"))  # another turn's end
    end = ev.TurnEnd(seq=4, ts=0.0, turn=2, reason="blocked")
    watched.watcher(end)
    assert watched.outcomes == [TurnOutcome(end)]
    assert watched.events == [ev.StepStart(seq=2, ts=0.0, turn=2, step=1)]
