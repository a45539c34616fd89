"""Usage: per turn on ``turn/end``, session totals rebuilt on resume, and budgets that end turns."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import trio
from _sse_server import DONE, Stream, sse_finish, sse_text, sse_usage, start_server

from trio_harness import Budget, ScriptedModel, UsageTotals
from trio_harness._cli import EXIT_LIMIT, _exit_code
from trio_harness.acp import stop_reason_for
from trio_harness.agents import AgentOptions, Tool, ToolContext, TurnOutcome
from trio_harness.model import Failure, OpenAIProvider, Usage
from trio_harness.session import _events as ev
from trio_harness.session import decode_event
from trio_harness.testing import assert_balanced, open_test_harness


async def echo(ctx: ToolContext, args: dict[str, object]) -> str:
    return "echoed"


ECHO = Tool("echo", "echo", {"type": "object", "properties": {}}, echo)
CALL = {"tool_calls": [{"name": "echo", "arguments": {}}]}


def turn_ends(events: Any) -> list[ev.TurnEnd]:
    return [e for e in events if isinstance(e, ev.TurnEnd)]


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
            first, second = turn_ends(events)
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
            (end,) = turn_ends(agent.session.events)
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
            (end,) = turn_ends(agent.session.events)
            # the step that used the tokens still ran its tool: the log stays well formed
            assert [e.content for e in agent.session.events if isinstance(e, ev.ToolResult)] == ["echoed"]
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
            ends = turn_ends(agent.session.events)
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
