"""Usage: per turn on ``turn/end``, session totals rebuilt on resume, and budgets that end turns."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from _sse_server import DONE, Stream, sse_finish, sse_text, sse_usage, start_server
from _util import echo_tool, turn_end_events

from trio_harness import AgentDisposedError, Budget, CompactionError, ContextPolicy, ScriptedModel, UsageTotals
from trio_harness._cli import _exit_code
from trio_harness._cli_common import EXIT_LIMIT
from trio_harness.acp._updates import stop_reason_for
from trio_harness.agents import AgentOptions, Tool, ToolContext, TurnOutcome
from trio_harness.model import Failure, OpenAIProvider, ReplayModel, Usage
from trio_harness.session import _events as ev
from trio_harness.session import decode_event
from trio_harness.testing import assert_balanced, open_test_harness

ECHO = echo_tool()
CALL = {"tool_calls": [{"name": "echo", "arguments": {}}]}


def folded(events: Any) -> UsageTotals:
    """What the totals must be: every request counted, every reported usage added."""
    totals = UsageTotals()
    for event in events:
        if isinstance(event, ev.RequestHeader):
            totals = totals.add(None, requests=1)
        elif isinstance(event, ev.AssistantMessage):
            totals = totals.add(event.usage)
    return totals


async def test_turn_end_carries_the_turns_usage_and_the_agent_the_sessions() -> None:
    model = ScriptedModel([CALL, {"text": "done, after the tool"}, {"text": "second answer"}])
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            assert agent.usage == UsageTotals()
            agent.followup("first")
            await agent.when_idle()
            agent.followup("second")
            await agent.when_idle()
            events = list(agent.session.events)
            first, second = turn_end_events(events)
            assert first.usage is not None and second.usage is not None
            assert first.usage.requests == 2 and second.usage.requests == 1
            assert first.usage.input_tokens > 0 and first.usage.output_tokens > 0
            cut = events.index(first) + 1
            assert first.usage == folded(events[:cut])
            assert second.usage == folded(events[cut:])
            assert agent.usage == first.usage + second.usage == folded(events)
            assert agent.usage.total_tokens == agent.usage.input_tokens + agent.usage.output_tokens


async def test_usage_totals_are_rebuilt_on_resume(tmp_path: Path) -> None:
    model = ScriptedModel([CALL, {"text": "a"}, {"text": "b"}])
    async with open_test_harness(model, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()
            before = agent.usage
    assert before.requests == 3
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        async with h.agents.open(session_id="s", resume=True) as agent:
            assert agent.usage == before


def test_a_turn_end_line_without_usage_still_loads() -> None:
    event = decode_event('{"type":"turn/end","seq":4,"ts":1.0,"turn":1,"reason":"completed"}')
    assert isinstance(event, ev.TurnEnd) and event.usage is None


async def test_a_request_budget_ends_the_turn_before_the_next_request() -> None:
    model = ScriptedModel([CALL, CALL, CALL, {"text": "never"}])
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=AgentOptions(turn_budget=Budget(requests=2))) as agent:
            agent.followup("loop")
            await agent.when_idle()
            (end,) = turn_end_events(agent.session.events)
            assert_balanced(agent.session.events)
    assert len(model.requests) == 2
    assert end.reason == "budget"
    assert end.failure == Failure("budget-requests", "the turn budget of 2 model requests is used up (2 made)")
    assert end.usage is not None and end.usage.requests == 2


async def test_a_token_budget_ends_the_turn_after_the_step_that_reached_it() -> None:
    model = ScriptedModel([CALL, CALL, {"text": "never"}])
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=AgentOptions(turn_budget=Budget(tokens=1))) as agent:
            agent.followup("loop")
            await agent.when_idle()
            (end,) = turn_end_events(agent.session.events)
            # the step that used the tokens still ran its tool: the log stays well formed
            assert [e.content for e in agent.session.events if isinstance(e, ev.ToolResult)] == ["echo"]
    assert len(model.requests) == 1
    assert end.reason == "budget" and end.failure is not None and end.failure.code == "budget-tokens"
    assert "the turn budget of 1 tokens is used up" in end.failure.message


async def test_a_session_budget_counts_every_turn_and_ends_later_turns_at_once() -> None:
    model = ScriptedModel([{"text": "one"}, {"text": "two"}, {"text": "never"}])
    async with open_test_harness(model) as h:
        async with h.agents.open(options=AgentOptions(session_budget=Budget(requests=2))) as agent:
            for prompt in ("a", "b", "c"):
                agent.followup(prompt)
                await agent.when_idle()
            ends = turn_end_events(agent.session.events)
            # the third prompt was claimed (it is in the conversation) but sent nowhere
            users = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
    assert [e.reason for e in ends] == ["completed", "completed", "budget"]
    assert ends[2].failure is not None and ends[2].failure.code == "budget-requests"
    assert "session budget of 2 model requests" in ends[2].failure.message
    assert ends[2].usage == UsageTotals()
    assert users == ["a", "b", "c"] and len(model.requests) == 2


def test_budgets_are_checked_when_made() -> None:
    with pytest.raises(ValueError, match=r"Budget\.tokens must be a positive int"):
        Budget(tokens=0)
    with pytest.raises(ValueError, match=r"Budget\.requests must be a positive int"):
        Budget(requests=1.5)  # type: ignore[arg-type]
    with pytest.raises(TypeError):
        AgentOptions(turn_budget=3)  # type: ignore[arg-type]


@pytest.mark.parametrize(("code", "stop"), [("budget-tokens", "max_tokens"), ("budget-requests", "max_turn_requests")])
def test_acp_and_cli_map_a_budget_end(code: str, stop: str, capsys: pytest.CaptureFixture[str]) -> None:
    end = ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="budget", failure=Failure(code, "the turn budget ... is used up"))
    assert stop_reason_for(end) == (stop, None)
    assert _exit_code(TurnOutcome(end), interrupted=False) == EXIT_LIMIT
    assert "[stopped] the turn budget ... is used up" in capsys.readouterr().err


async def test_reasoning_and_cache_tokens_are_read_from_the_openai_usage(nursery: trio.Nursery) -> None:
    usage = sse_usage(
        120, 30, prompt_tokens_details={"cached_tokens": 100}, completion_tokens_details={"reasoning_tokens": 25}
    )
    server = await start_server(nursery, Stream([sse_text("ok"), sse_finish("stop"), usage, DONE]))
    async with OpenAIProvider(model="m", base_url=server.base_url, api_key="k", max_retries=0) as provider:
        async with open_test_harness(provider) as h, h.agents.open() as agent:
            agent.followup("hi")
            await agent.when_idle()
            (message,) = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
            assert message.usage == Usage(input_tokens=120, output_tokens=30, cache_hit_tokens=100, reasoning_tokens=25)
            assert agent.usage == UsageTotals(
                input_tokens=120, output_tokens=30, cache_hit_tokens=100, reasoning_tokens=25, requests=1
            )


# ---------------------------------------------------------------- every request counts: summaries and retries

SUMMARY = "the summary " * 5


async def big(ctx: ToolContext, args: dict[str, object]) -> str:
    return "r" * 3600


BIG = Tool("big", "a large result", {"type": "object", "properties": {}}, big)


async def grow_in_turn_three(
    options: AgentOptions, model: ScriptedModel | ReplayModel | None = None
) -> tuple[ScriptedModel | ReplayModel, list[ev.Event]]:
    """Turns 1 and 2 fit; turn 3's tool result makes its second step pass the threshold (a compaction in the turn)."""
    if model is None:
        model = ScriptedModel(
            [{"text": "one"}, {"text": "two"}, {"tool_calls": [{"name": "big", "arguments": {}}]}, {"text": "three"}],
            context_window=2_000,
            summary=SUMMARY,
        )
    async with open_test_harness(model) as h:
        h.tools.add(BIG)
        async with h.agents.open(options=options) as agent:
            for text in ("a" * 1600, "b" * 1600, "c"):
                agent.followup(text)
                await agent.when_idle()
            events = list(agent.session.events)
            assert agent.usage.requests == len(model.requests)  # every request the model received counts
            assert_balanced(events)
    return model, events


async def test_a_compaction_inside_a_turn_is_made_only_when_the_budget_affords_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    # Unbounded: turn 3's second step compacts first (2 summary requests), then it is sent: 6 requests.
    model, events = await grow_in_turn_three(AgentOptions())
    purposes = [r.purpose for r in model.requests]
    assert purposes[:6] == ["turn", "turn", "turn", "compaction", "compaction", "turn"]
    # A session budget of 4: 3 made, the compaction and the step would need 3 more: the step goes as it is.
    model, events = await grow_in_turn_three(AgentOptions(session_budget=Budget(requests=4)))
    assert [r.purpose for r in model.requests] == ["turn"] * 4
    assert [e.reason for e in turn_end_events(events)] == ["completed"] * 3
    assert not [e for e in events if isinstance(e, ev.ContextCompacted | ev.CompactionFailed)]
    # A budget of 5: the same in turn 3; after it, the compaction between turns needs more than the one
    # request left, so it is not started either.
    model, events = await grow_in_turn_three(AgentOptions(session_budget=Budget(requests=5)))
    assert [r.purpose for r in model.requests] == ["turn"] * 4
    assert not [e for e in events if isinstance(e, ev.ContextCompacted | ev.CompactionFailed)]
    # A budget of 6 affords both; nothing is made past it (no compaction between turns after turn 3).
    model, events = await grow_in_turn_three(AgentOptions(session_budget=Budget(requests=6)))
    assert [r.purpose for r in model.requests] == ["turn", "turn", "turn", "compaction", "compaction", "turn"]
    assert [e.reason for e in turn_end_events(events)] == ["completed"] * 3
    # The same with a turn budget of 3: turn 3 has made 1 when its second step would compact (3 more);
    # between turns no turn budget applies, so the compaction runs there, as maintenance.
    model, events = await grow_in_turn_three(AgentOptions(turn_budget=Budget(requests=3)))
    end = turn_end_events(events)[2]
    assert end.reason == "completed" and end.usage is not None and end.usage.requests == 2
    (compacted,) = [e for e in events if isinstance(e, ev.ContextCompacted)]
    assert compacted.turn is None and compacted.seq > end.seq and compacted.usage is not None
    assert [r.purpose for r in model.requests] == ["turn"] * 4 + ["compaction"] * compacted.usage.requests


async def test_a_token_budget_stops_a_compaction_part_way_and_its_request_is_counted(
    autojump_clock: trio.testing.MockClock,
) -> None:
    _, events = await grow_in_turn_three(AgentOptions())
    first_step = next(e for e in events if isinstance(e, ev.AssistantMessage) and e.turn == 3)
    assert first_step.usage is not None
    limit = first_step.usage.input_tokens + first_step.usage.output_tokens + 1  # reached by one summary request
    model, events = await grow_in_turn_three(AgentOptions(turn_budget=Budget(tokens=limit)))
    # turn 3: its first step, one summary request; the second is not sent, nor the step after it
    assert [r.purpose for r in model.requests] == ["turn", "turn", "turn", "compaction"]
    (failed,) = [e for e in events if isinstance(e, ev.CompactionFailed)]
    assert failed.turn == 3 and failed.failure.code == "budget-tokens"
    assert failed.usage is not None and failed.usage.requests == 1  # logged: the request it made counts
    end = turn_end_events(events)[2]
    assert end.reason == "budget" and end.failure is not None and end.failure.code == "budget-tokens"
    assert end.usage is not None and end.usage.requests == 2
    # a strict replay makes the same requests and stops at the same point
    replay = ReplayModel.from_events(events, strict=True)
    options = AgentOptions(turn_budget=Budget(tokens=limit), context=ContextPolicy(window=2_000))
    _, again = await grow_in_turn_three(options, replay)
    assert [r.purpose for r in replay.requests] == ["turn", "turn", "turn", "compaction"]
    shape = [(type(e), getattr(e, "usage", None)) for e in events]
    assert [(type(e), getattr(e, "usage", None)) for e in again] == shape
    assert [(e.reason, e.failure, e.usage) for e in turn_end_events(again)] == [
        (e.reason, e.failure, e.usage) for e in turn_end_events(events)
    ]


async def refused_in_turn_three(options: AgentOptions) -> tuple[ScriptedModel, list[ev.Event]]:
    """Turn 3's request is refused as too long: one compaction (2 summary requests) and one retry fix it."""
    model = ScriptedModel([{"text": "one"}, {"text": "two"}, {"text": "three"}], context_window=1_000, summary=SUMMARY)
    options = attrs.evolve(options, context=ContextPolicy(auto=False))  # only the refusal compacts
    async with open_test_harness(model) as h, h.agents.open(options=options) as agent:
        for text in ("a" * 1600, "b" * 1600, "c" * 1200):
            agent.followup(text)
            await agent.when_idle()
        events = list(agent.session.events)
        assert agent.usage.requests == len(model.requests)
        assert_balanced(events)
    return model, events


async def test_the_compaction_and_retry_after_a_context_length_refusal_are_checked_against_the_budgets(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model, events = await refused_in_turn_three(AgentOptions())
    assert [r.purpose for r in model.requests] == ["turn", "turn", "turn", "compaction", "compaction", "turn"]
    # a session budget of 4: the refused request is the third; compaction and retry would make it 6
    model, events = await refused_in_turn_three(AgentOptions(session_budget=Budget(requests=4)))
    assert [r.purpose for r in model.requests] == ["turn"] * 3
    end = turn_end_events(events)[2]
    assert end.reason == "budget" and end.failure is not None and end.failure.code == "budget-requests"
    assert end.failure.message.startswith(
        "the session budget of 4 model requests has 1 left (3 made), too few for the compaction's 2 summary "
        "requests and the step's request after it: no compaction to make the refused request fit ("
    )
    assert "context window of 1000" in end.failure.message
    # a turn budget of 1: the refused request is the turn's only one
    model, events = await refused_in_turn_three(AgentOptions(turn_budget=Budget(requests=1)))
    assert len(model.requests) == 3
    end = turn_end_events(events)[2]
    assert end.reason == "budget" and end.usage is not None and end.usage.requests == 1
    assert end.failure is not None and "the turn budget of 1 model requests is used up (1 made)" in end.failure.message
    # a turn budget of 4 affords the refused request, the 2 summaries and the retry
    model, events = await refused_in_turn_three(AgentOptions(turn_budget=Budget(requests=4)))
    assert len(model.requests) == 6
    end = turn_end_events(events)[2]
    assert end.reason == "completed" and end.usage is not None and end.usage.requests == 4


async def test_compact_on_demand_is_checked_against_the_session_budget(autojump_clock: trio.testing.MockClock) -> None:
    for budget, message in [
        (2, "the session budget of 2 model requests is used up (2 made)"),
        (3, "the session budget of 3 model requests has 1 left (2 made), too few for the compaction's 2 summary"),
    ]:
        model = ScriptedModel([{"text": "one"}, {"text": "two"}], context_window=1_000, summary=SUMMARY)
        options = AgentOptions(context=ContextPolicy(auto=False), session_budget=Budget(requests=budget))
        async with open_test_harness(model) as h, h.agents.open(options=options) as agent:
            for text in ("a" * 1600, "b" * 1600):
                agent.followup(text)
                await agent.when_idle()
            before = len(agent.session)
            with pytest.raises(CompactionError, match=re.escape(f"the compaction was not done: {message}")):
                await agent.compact(keep_tokens=0)
            assert len(agent.session) == before  # no request was made: nothing to log
        assert len(model.requests) == 2
    model = ScriptedModel([{"text": "one"}, {"text": "two"}], context_window=1_000, summary=SUMMARY)
    options = AgentOptions(context=ContextPolicy(auto=False), session_budget=Budget(requests=4))
    async with open_test_harness(model) as h, h.agents.open(options=options) as agent:
        for text in ("a" * 1600, "b" * 1600):
            agent.followup(text)
            await agent.when_idle()
        assert await agent.compact(keep_tokens=0) is not None
        assert agent.usage.requests == len(model.requests) == 4


@attrs.define(eq=False)
class HangsAtSummary(ScriptedModel):
    """A scripted model whose summary request number ``hang_at`` (from 1) never answers."""

    hang_at: int = attrs.field(default=1, kw_only=True)
    summaries: int = attrs.field(default=0, init=False)

    async def stream(self, request: Any, emit: Any) -> None:
        if request.purpose == "compaction":
            self.summaries += 1
            if self.summaries == self.hang_at:
                self.requests.append(request)
                await trio.sleep_forever()
        await super().stream(request, emit)


async def cancel_compact_at(hang_at: int, store: Path) -> list[ev.Event]:
    """Two turns, then ``agent.compact()`` (2 summary requests) cancelled during summary request ``hang_at``."""
    model = HangsAtSummary([{"text": "one"}, {"text": "two"}], context_window=1_000, summary=SUMMARY, hang_at=hang_at)
    options = AgentOptions(context=ContextPolicy(auto=False), session_budget=Budget(requests=4))
    async with open_test_harness(model, store=store) as h, h.agents.open(session_id="s", options=options) as agent:
        for text in ("a" * 1600, "b" * 1600):
            agent.followup(text)
            await agent.when_idle()
        with trio.move_on_after(10) as scope:
            await agent.compact(keep_tokens=0)
        assert scope.cancelled_caught
        assert model.summaries == hang_at
        assert agent.usage.requests == 2 + hang_at - 1  # the completed requests, not the one cancelled
        return list(agent.session.events)


async def test_a_compaction_cancelled_part_way_logs_and_counts_what_it_spent(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    events = await cancel_compact_at(2, tmp_path)
    (failed,) = [e for e in events if isinstance(e, ev.CompactionFailed)]
    assert failed.failure.code == "cancelled" and failed.reason == "manual" and failed.turn is None
    assert failed.usage is not None and failed.usage.requests == 1
    assert not [e for e in events if isinstance(e, ev.ContextCompacted)]
    # a resumed agent counts it: a session budget of 3 requests is used up (2 turns + 1 summary)
    model = ScriptedModel([{"text": "three"}])
    options = AgentOptions(context=ContextPolicy(auto=False), session_budget=Budget(requests=3))
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="s", resume=True, options=options) as agent:
            assert agent.usage.requests == 3
            agent.followup("c")
            await agent.when_idle()
            end = turn_end_events(agent.session.events)[-1]
            assert end.reason == "budget" and end.failure is not None and end.failure.code == "budget-requests"
    assert model.requests == []


async def test_a_compaction_cancelled_before_a_summary_request_completed_logs_nothing(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    events = await cancel_compact_at(1, tmp_path)
    assert not [e for e in events if isinstance(e, (ev.CompactionFailed, ev.ContextCompacted))]
    assert type(events[-1]) is ev.TurnEnd


async def test_a_strict_replay_of_a_cancelled_compaction_stops_where_the_recording_did(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    events = await cancel_compact_at(2, tmp_path)
    (recorded,) = [e for e in events if isinstance(e, ev.CompactionFailed)]
    replay = ReplayModel.from_events(events, strict=True)
    options = AgentOptions(context=ContextPolicy(auto=False, window=1_000), session_budget=Budget(requests=4))
    async with open_test_harness(replay) as h, h.agents.open(options=options) as agent:
        for text in ("a" * 1600, "b" * 1600):
            agent.followup(text)
            await agent.when_idle()
        with pytest.raises(CompactionError, match="the compaction was cancelled"):
            await agent.compact(keep_tokens=0)
        (failed,) = [e for e in agent.session.events if isinstance(e, ev.CompactionFailed)]
    # the completed request is answered with the recorded usage; the one the recording cancelled fails
    assert [r.purpose for r in replay.requests] == ["turn", "turn", "compaction", "compaction"]
    assert failed.usage is not None and recorded.usage is not None
    assert failed.usage.input_tokens == recorded.usage.input_tokens and failed.usage.requests == 2


async def test_a_compaction_inside_a_turn_cancelled_part_way_counts_in_the_turns_usage(
    autojump_clock: trio.testing.MockClock,
) -> None:
    script: list[dict[str, Any]] = [
        {"text": "one"},
        {"text": "two"},
        {"tool_calls": [{"name": "big", "arguments": {}}]},
        {"text": "three"},
    ]
    model = HangsAtSummary(script, context_window=2_000, summary=SUMMARY, hang_at=2)
    async with open_test_harness(model) as h:
        h.tools.add(BIG)
        async with h.agents.open() as agent:
            for text in ("a" * 1600, "b" * 1600):
                agent.followup(text)
                await agent.when_idle()
            agent.followup("c")
            await trio.testing.wait_all_tasks_blocked()
            assert model.summaries == 2  # the second summary request of turn 3's compaction hangs
            agent.cancel()
            await agent.when_idle()
            events = list(agent.session.events)
            assert agent.usage.requests == 4  # 3 steps and the completed summary request
    (failed,) = [e for e in events if isinstance(e, ev.CompactionFailed)]
    assert failed.turn == 3 and failed.failure.code == "cancelled"
    assert failed.usage is not None and failed.usage.requests == 1
    end = turn_end_events(events)[2]
    assert end.reason == "aborted" and end.usage is not None and end.usage.requests == 2
    assert_balanced(events)


async def test_a_compaction_cancelled_part_way_by_disposal_is_stored_with_what_it_spent(
    autojump_clock: trio.testing.MockClock, tmp_path: Path
) -> None:
    model = HangsAtSummary([{"text": "one"}, {"text": "two"}], context_window=1_000, summary=SUMMARY, hang_at=2)
    async with open_test_harness(model, store=tmp_path) as h:
        handle = await h.agents.create(session_id="s", options=AgentOptions(context=ContextPolicy(auto=False)))
        agent = handle.agent
        for text in ("a" * 1600, "b" * 1600):
            agent.followup(text)
            await agent.when_idle()

        async def compact() -> None:
            with pytest.raises(AgentDisposedError):
                await agent.compact(keep_tokens=0)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(compact)
            await trio.testing.wait_all_tasks_blocked()
            assert model.summaries == 2
            await handle.dispose()
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        async with h.agents.open(session_id="s", resume=True) as resumed:
            (failed,) = [e for e in resumed.session.events if isinstance(e, ev.CompactionFailed)]
            assert failed.failure.code == "cancelled" and failed.usage is not None and failed.usage.requests == 1
            assert resumed.usage.requests == 3
