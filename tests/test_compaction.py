"""Context-window management: long sessions stay under the window, compact, and resume to the same request."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from _sse_server import DONE, Respond, Stream, sse_finish, sse_text, sse_usage, start_server
from _util import echo_tool

from trio_harness import AgentDisposedError, Budget, CompactionError, ContextPolicy, ModelError, ScriptedModel
from trio_harness.agents import AgentOptions, ReactAgent
from trio_harness.model import Emit, Failure, Message, ModelRequest, OpenAIProvider, ReplayModel, UserMessage
from trio_harness.model._context import context_window_for, is_context_overflow
from trio_harness.session import _events as ev
from trio_harness.session._jsonl import parse_log
from trio_harness.testing import assert_balanced, open_test_harness

WINDOW = 3_000
TURNS = 200


ECHO = echo_tool(padding=120)


def summarize(request: ModelRequest) -> str:
    """A deterministic summary of bounded size (what the scripted model answers compaction requests with)."""
    (message,) = request.messages
    assert isinstance(message, UserMessage)
    return f"Summary of {len(message.text)} characters: the user asked many numbered questions. " + "s" * 200


def script(turns: int) -> list[dict[str, Any]]:
    """Responses for ``turns`` turns; every fifth turn calls the tool first."""
    responses: list[dict[str, Any]] = []
    for n in range(1, turns + 1):
        if n % 5 == 0:
            responses.append({"tool_calls": [{"name": "echo", "arguments": {"x": str(n)}}]})
        responses.append({"text": f"Answer {n}: " + "a" * 180})
    return responses


def prompt(n: int) -> str:
    return f"Question {n}: " + "q" * 180


OPTIONS = AgentOptions(context=ContextPolicy(window=WINDOW))


def compactions(events: Sequence[ev.Event]) -> list[ev.ContextCompacted]:
    return [e for e in events if isinstance(e, ev.ContextCompacted)]


def check_boundaries(events: Sequence[ev.Event]) -> None:
    """Every boundary is a turn start, never after the turn the compaction ran in (or, between turns, the end)."""
    for event in compactions(events):
        start = events[event.boundary]
        if event.turn is None and not isinstance(start, ev.TurnStart):
            assert not any(isinstance(e, ev.TurnStart | ev.UserMessage) for e in events[event.boundary : event.seq])
            continue
        assert isinstance(start, ev.TurnStart), event
        if event.turn is not None:
            assert start.turn <= event.turn


async def run_turns(agent: Any, first: int, last: int) -> None:
    for n in range(first, last + 1):
        agent.followup(prompt(n))
        await agent.when_idle()


# ---------------------------------------------------------------- the long session


async def test_a_200_turn_session_stays_under_a_small_window_and_compacts() -> None:
    model = ScriptedModel(script(TURNS), context_window=WINDOW, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            assert isinstance(agent, ReactAgent)
            await run_turns(agent, 1, TURNS)
            events = list(agent.session.events)
            assert_balanced(events)
            ends = [e for e in events if isinstance(e, ev.TurnEnd)]
            assert len(ends) == TURNS and {e.reason for e in ends} == {"completed"}
            done = compactions(events)
            assert len(done) >= 5 and {c.reason for c in done} == {"threshold"}
            # each ran as maintenance between turns, none inside a turn
            assert {c.turn for c in done} == {None}
            assert all(isinstance(events[c.seq - 1], ev.TurnEnd) for c in done)
            check_boundaries(events)
            sizes = [model.prompt_tokens(r) for r in model.requests if r.purpose == "turn"]
            assert max(sizes) <= 0.8 * WINDOW + 200  # the threshold, plus one turn's growth
            assert model.remaining == 0
            # after the last compaction, requests are system prompt + summary + the events after the boundary
            request = agent.build_request()
            assert done[-1].summary in request.system
            assert request.messages[0] == UserMessage(prompt(_turn_at(events, done[-1].boundary)))
            # compaction requests are counted in the session's usage
            assert agent.usage.requests == len(model.requests)


def _turn_at(events: Sequence[ev.Event], seq: int) -> int:
    start = events[seq]
    assert isinstance(start, ev.TurnStart)
    return start.turn


async def test_resume_after_compactions_sends_the_same_requests_as_a_never_restarted_agent(tmp_path: Path) -> None:
    # A: never restarted
    straight = ScriptedModel(script(TURNS), context_window=WINDOW, summary=summarize)
    async with open_test_harness(straight, store=tmp_path / "a") as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=OPTIONS) as agent:
            assert isinstance(agent, ReactAgent)
            await run_turns(agent, 1, TURNS)
            final_straight = agent.build_request()
    recorded = parse_log((tmp_path / "a" / "s" / "session.jsonl").read_bytes(), "a").events

    # B: stops after turn 120 (the process ends), then resumes against a strict replay of A
    cut_turn = 120
    first = ScriptedModel(script(cut_turn), context_window=WINDOW, summary=summarize)
    async with open_test_harness(first, store=tmp_path / "b") as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=OPTIONS) as agent:
            await run_turns(agent, 1, cut_turn)
            assert compactions(agent.session.events)
    cut = next(e.seq for e in recorded if isinstance(e, ev.TurnStart) and e.turn == cut_turn + 1)
    replay = ReplayModel.from_events(recorded[cut:], strict=True)
    async with open_test_harness(replay, store=tmp_path / "b") as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=OPTIONS, resume=True) as agent:
            assert isinstance(agent, ReactAgent)
            assert agent.build_request() == _request_before(straight.requests, first.requests)
            await run_turns(agent, cut_turn + 1, TURNS)
            events = list(agent.session.events)
            assert {e.reason for e in events if isinstance(e, ev.TurnEnd)} == {"completed"}
            assert agent.build_request() == final_straight
    # every request of B, before and after the restart, equals A's at the same point
    assert first.requests + replay.requests == straight.requests
    assert replay.remaining == 0
    assert [(c.boundary, c.summary) for c in compactions(events)] == [
        (c.boundary, c.summary) for c in compactions(recorded)
    ]


def _request_before(straight: list[ModelRequest], first: list[ModelRequest]) -> ModelRequest:
    """A's request that follows B's last one before the restart, minus the new prompt (build_request sees none)."""
    return _without_last_user(straight[len(first)])


def _without_last_user(request: ModelRequest) -> ModelRequest:
    import attrs

    assert isinstance(request.messages[-1], UserMessage)
    return attrs.evolve(request, messages=tuple(request.messages[:-1]))


async def test_strict_replay_reports_a_compaction_where_the_recording_had_a_step(tmp_path: Path) -> None:
    model = ScriptedModel(script(40), context_window=WINDOW, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            await run_turns(agent, 1, 40)
            recorded = list(agent.session.events)
    assert compactions(recorded)
    # the same prompts, but an agent that never compacts: the strict replay sees the divergence
    replay = ReplayModel.from_events(recorded, strict=True)
    never = AgentOptions(context=ContextPolicy(window=WINDOW, auto=False))
    async with open_test_harness(replay) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=never) as agent:
            await run_turns(agent, 1, 40)
            failures = [e.failure for e in agent.session.events if isinstance(e, ev.TurnEnd) and e.failure]
    assert failures and failures[0].code == "replay-diverged"
    assert "is a step request where the recording had a compaction (summary) request" in failures[0].message


async def test_fork_keeps_the_compaction_state() -> None:
    model = ScriptedModel(script(60), context_window=WINDOW, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="parent", options=OPTIONS) as agent:
            assert isinstance(agent, ReactAgent)
            await run_turns(agent, 1, 60)
            assert compactions(agent.session.events)
            expected = agent.build_request()
            await h.sessions.fork("parent", len(agent.session), "child")
        async with h.agents.open(session_id="child", options=OPTIONS, resume=True) as child:
            assert isinstance(child, ReactAgent)
            assert child.build_request() == expected


# ---------------------------------------------------------------- automatic compaction as maintenance


@attrs.define(eq=False)
class GatedModel:
    """A scripted model whose compaction (summary) requests wait for ``release`` (until it is set)."""

    inner: ScriptedModel
    entered: trio.Event = attrs.field(factory=trio.Event)
    release: trio.Event = attrs.field(factory=trio.Event)

    @property
    def name(self) -> str:
        return self.inner.name

    @property
    def context_window(self) -> int | None:
        return self.inner.context_window

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        if request.purpose == "compaction" and not self.release.is_set():
            self.entered.set()
            await self.release.wait()
        await self.inner.stream(request, emit)


async def _first_maintenance_turn() -> int:
    """The turn after which the long session first compacts (as maintenance)."""
    model = ScriptedModel(script(60), context_window=WINDOW, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            n = 0
            while not compactions(agent.session.events):
                n += 1
                agent.followup(prompt(n))
                await agent.when_idle()
            first = compactions(agent.session.events)[0]
            end = agent.session.events[first.seq - 1]
            assert first.turn is None and isinstance(end, ev.TurnEnd) and end.turn == n
            return n


async def _into_maintenance(agent: Any, gated: GatedModel, turn: int) -> None:
    """Run turns 1..``turn``; return while the maintenance compaction after ``turn`` waits at its request."""
    await run_turns(agent, 1, turn - 1)
    agent.followup(prompt(turn))
    await gated.entered.wait()
    await trio.testing.wait_all_tasks_blocked()


async def test_automatic_compaction_runs_as_maintenance_and_a_followup_waits_for_it(
    autojump_clock: trio.testing.MockClock,
) -> None:
    k = await _first_maintenance_turn()
    gated = GatedModel(ScriptedModel(script(k + 1), context_window=WINDOW, summary=summarize))
    async with open_test_harness(gated) as h:
        statuses: list[str] = []
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            h.bus.on("agent/status", lambda n: statuses.append(n.data["status"]))
            await _into_maintenance(agent, gated, k)
            events = agent.session.events
            assert isinstance(events[-1], ev.TurnEnd) and events[-1].turn == k  # turn k is over
            assert agent.status == "idle" and statuses[-1] == "idle"
            agent.followup(prompt(k + 1))
            idle_seen: list[float] = []
            sequencer = trio.testing.Sequencer()

            async def wait_idle() -> None:
                async with sequencer(0):
                    pass
                await agent.when_idle()
                idle_seen.append(trio.current_time())

            async def release() -> None:
                async with sequencer(1):
                    await trio.testing.wait_all_tasks_blocked()
                    # maintenance holds: the followup waits in the inbox, when_idle has not returned
                    assert not idle_seen and agent.status == "idle"
                    assert [m.text for m in agent.inbox.next_turn] == [prompt(k + 1)]
                    assert not any(isinstance(e, ev.TurnStart) and e.turn == k + 1 for e in agent.session.events)
                    gated.release.set()

            async with trio.open_nursery() as nursery:
                nursery.start_soon(wait_idle)
                nursery.start_soon(release)
            assert idle_seen
            events = list(agent.session.events)
    assert_balanced(events)
    (compacted,) = compactions(events)
    assert compacted.turn is None and compacted.reason == "threshold"
    start = next(e for e in events if isinstance(e, ev.TurnStart) and e.turn == k + 1)
    last_end = [e for e in events[: compacted.seq] if isinstance(e, ev.TurnEnd)][-1]
    assert last_end.turn == k and compacted.seq < start.seq  # between turns k and k+1
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["completed"] * (k + 1)
    # the followup ran after the compaction, on the compacted conversation
    assert compacted.summary in gated.inner.requests[-1].system
    assert statuses[-4:] == ["running", "idle", "running", "idle"]


async def test_cancel_during_maintenance_stops_it_promptly_and_logs_nothing(
    autojump_clock: trio.testing.MockClock,
) -> None:
    k = await _first_maintenance_turn()
    gated = GatedModel(ScriptedModel(script(k + 2), context_window=WINDOW, summary=summarize))
    async with open_test_harness(gated) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            await _into_maintenance(agent, gated, k)
            before = len(agent.session)
            agent.followup(prompt(k + 1))
            start = trio.current_time()
            assert agent.cancel() is True
            await agent.when_idle()
            assert trio.current_time() == start  # prompt: no wait for the summary request
            # only the inbox splices queueing and clearing the followup, and the cancel's mark (docs/inbox.rst)
            assert len(agent.session) == before + 3
            assert not compactions(agent.session.events) and not len(agent.inbox)
            assert agent.status == "idle"
            # the agent goes on; the maintenance is not retried before another turn has run, so the
            # next turn, whose request passes the threshold, compacts inside the turn (the safety net)
            gated.release.set()
            agent.followup(prompt(k + 1))
            await agent.when_idle()
            events = list(agent.session.events)
    assert_balanced(events)
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["completed"] * (k + 1)
    (compacted,) = compactions(events)
    assert compacted.turn == k + 1 and compacted.reason == "threshold"


async def test_cancel_keeping_the_inbox_during_maintenance_leaves_the_followup_queued(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    k = await _first_maintenance_turn()
    gated = GatedModel(ScriptedModel(script(k + 1), context_window=WINDOW, summary=summarize))
    async with open_test_harness(gated, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            await _into_maintenance(agent, gated, k)
            agent.followup(prompt(k + 1))
            assert agent.cancel(keep_inbox=True) is True
            await agent.when_idle()
            # pending work awaits a later wake, as after any cancel keeping the inbox
            assert [m.text for m in agent.inbox.next_turn] == [prompt(k + 1)]
            assert not compactions(agent.session.events)
            assert [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)][-1] == k
            session_id = agent.id
    # Resumed, it still waits: the cancel's mark in the log holds it, as the live agent did.
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        async with h.agents.open(session_id=session_id, resume=True, options=OPTIONS) as agent:
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "idle"
            assert [m.text for m in agent.inbox.next_turn] == [prompt(k + 1)]
            assert [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)][-1] == k


async def test_disposal_during_maintenance_logs_nothing_and_resume_sends_the_same_requests(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    k = await _first_maintenance_turn()
    # A: never restarted
    straight = ScriptedModel(script(k + 1), context_window=WINDOW, summary=summarize)
    async with open_test_harness(straight, store=tmp_path / "a") as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=OPTIONS) as agent:
            await run_turns(agent, 1, k + 1)
    recorded = parse_log((tmp_path / "a" / "s" / "session.jsonl").read_bytes(), "a").events
    (expected,) = compactions(recorded)

    # B: disposed while the maintenance compaction after turn k waits for its summary
    gated = GatedModel(ScriptedModel(script(k), context_window=WINDOW, summary=summarize))
    async with open_test_harness(gated, store=tmp_path / "b") as h:
        h.tools.add(ECHO)
        handle = await h.agents.create(session_id="s", options=OPTIONS)
        await _into_maintenance(handle.agent, gated, k)
        start = trio.current_time()
        await handle.dispose()
        assert trio.current_time() == start
        events = list(handle.agent.session.events)
    assert_balanced(events)
    assert not compactions(events) and isinstance(events[-1], ev.TurnEnd)
    stored = parse_log((tmp_path / "b" / "s" / "session.jsonl").read_bytes(), "b").events
    assert len(stored) == len(events)

    # B resumed against a strict replay of A from its compaction on: the same requests, in order
    replay = ReplayModel.from_events(recorded[expected.seq :], strict=True)
    async with open_test_harness(replay, store=tmp_path / "b") as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=OPTIONS, resume=True) as agent:
            statuses: list[str] = []
            h.bus.on("agent/status", lambda n: statuses.append(n.data["status"]))
            agent.followup(prompt(k + 1))
            await agent.when_idle()
            events = list(agent.session.events)
    # the resumed agent stays idle while it compacts, then runs the followup: no running/idle flip
    assert statuses == ["running", "idle"]
    assert gated.inner.requests + replay.requests == straight.requests
    assert replay.remaining == 0
    assert {e.reason for e in events if isinstance(e, ev.TurnEnd)} == {"completed"}
    (compacted,) = compactions(events)
    assert (compacted.boundary, compacted.summary, compacted.turn) == (expected.boundary, expected.summary, None)


async def test_no_summary_request_is_made_between_turns_past_the_session_budget() -> None:
    k = await _first_maintenance_turn()
    counted = ScriptedModel(script(k), context_window=WINDOW, summary=summarize)
    async with open_test_harness(counted) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=AgentOptions(context=ContextPolicy(window=WINDOW, auto=False))) as agent:
            await run_turns(agent, 1, k)
            used = agent.usage.requests  # the requests of turns 1..k
    model = ScriptedModel(script(k), context_window=WINDOW, summary=summarize)
    options = AgentOptions(context=ContextPolicy(window=WINDOW), session_budget=Budget(requests=used))
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=options) as agent:
            await run_turns(agent, 1, k)
            assert agent.status == "idle" and agent.usage.requests == used
            events = list(agent.session.events)
    assert not compactions(events) and "compaction" not in [r.purpose for r in model.requests]
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["completed"] * k


# ---------------------------------------------------------------- overflow


async def test_a_context_length_error_triggers_one_compaction_and_one_retry() -> None:
    responses = script(30)
    model = ScriptedModel(responses, context_window=1_500, summary=summarize)
    # no automatic compaction: only the provider's refusal triggers it
    options = AgentOptions(context=ContextPolicy(auto=False))
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=options) as agent:
            await run_turns(agent, 1, 30)
            events = list(agent.session.events)
    assert_balanced(events)
    assert {e.reason for e in events if isinstance(e, ev.TurnEnd)} == {"completed"}
    done = compactions(events)
    assert done and {c.reason for c in done} == {"overflow"}
    check_boundaries(events)
    refused = [e for e in events if isinstance(e, ev.AssistantMessage) and e.finish == "error"]
    assert len(refused) == len(done)
    # the refused step was retried once, in the same step, after the compaction
    first = done[0]
    step_events = [e for e in events if getattr(e, "turn", None) == first.turn and e.seq > refused[0].seq]
    assert isinstance(step_events[0], ev.ContextCompacted) and isinstance(step_events[1], ev.RequestHeader)


async def test_a_refusal_that_compaction_cannot_fix_ends_the_turn_with_the_providers_error() -> None:
    model = ScriptedModel([{"text": "never"}], context_window=10, summary=summarize)
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("a prompt far too long for a ten-token window")
        await agent.when_idle()
        (end,) = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
    assert end.reason == "error" and end.failure is not None and end.failure.code == "context-length"
    assert not compactions(agent.session.events)  # a single turn: nothing to compact


async def test_an_http_400_context_error_is_recovered_from(nursery: trio.Nursery) -> None:
    refusal = Respond(
        400,
        {
            "error": {
                "message": "This model's maximum context length is 8192 tokens. However, you requested 9000 tokens.",
                "type": "invalid_request_error",
                "code": "context_length_exceeded",
            }
        },
    )

    def answer(text: str) -> Stream:
        return Stream([sse_text(text), sse_finish("stop"), sse_usage(10, 5), DONE])

    server = await start_server(nursery, answer("one"), answer("two"), refusal, answer("the summary"), answer("three"))
    async with OpenAIProvider(model="m", base_url=server.base_url, api_key="k", max_retries=0) as provider:
        async with open_test_harness(provider) as h, h.agents.open() as agent:
            for text in ("first", "second", "third"):
                agent.followup(text)
                await agent.when_idle()
            events = list(agent.session.events)
    (compacted,) = compactions(events)
    assert compacted.reason == "overflow" and compacted.summary == "the summary"
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["completed"] * 3
    retried = server.requests[4].json
    assert retried["messages"][0]["role"] == "system" and "the summary" in retried["messages"][0]["content"]
    assert [m["content"] for m in retried["messages"][1:]] == ["second", "two", "third"]


def test_context_overflow_failures_are_recognised() -> None:
    assert is_context_overflow(Failure("context-length", "x"))
    assert is_context_overflow(Failure("http-400", "p: HTTP 400: This model's maximum context length is 8192 tokens"))
    assert is_context_overflow(Failure("http-400", "context_length_exceeded"))
    assert not is_context_overflow(Failure("http-400", "invalid tool schema"))
    assert not is_context_overflow(Failure("http-500", "maximum context length"))
    assert not is_context_overflow(None)


def test_known_models_have_a_context_window() -> None:
    assert context_window_for("deepseek-chat") == 128_000
    assert context_window_for("gpt-4o-2024-08-06") == 128_000
    assert context_window_for("gpt-4.1-mini") == 1_047_576
    assert context_window_for("llama3") is None
    assert OpenAIProvider(model="gpt-4o", base_url="http://x/v1").context_window == 128_000
    assert OpenAIProvider(model="local", base_url="http://x/v1", context_window=4096).context_window == 4096
    with pytest.raises(ModelError, match="context_window must be a positive int"):
        OpenAIProvider(model="m", base_url="http://x/v1", context_window=0)


def test_the_script_file_sets_a_context_window_and_a_summary(tmp_path: Path) -> None:
    path = tmp_path / "s.json"
    path.write_text('{"responses": [], "context_window": 100, "summary": "short"}')
    model = ScriptedModel.from_file(path)
    assert model.context_window == 100 and model.summary == "short"
    path.write_text('{"responses": [], "context_window": -1}')
    with pytest.raises(ModelError, match="context_window must be a positive int"):
        ScriptedModel.from_file(path)


# ---------------------------------------------------------------- the estimate


async def test_the_estimate_follows_the_reported_usage_and_the_added_text() -> None:
    model = ScriptedModel(script(30))
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            assert isinstance(agent, ReactAgent)
            for n in range(1, 31):
                agent.followup(prompt(n))
                await agent.when_idle()
                estimate = agent.context_estimate()
                actual = model.prompt_tokens(agent.build_request())
                assert abs(estimate - actual) <= 8, (n, estimate, actual)


async def test_the_estimate_right_after_a_compaction_measures_the_compacted_request() -> None:
    # The kept messages' reported usage measured the request before the compaction: it must not anchor
    # the estimate afterwards, or the next check would still see the old size.
    model = ScriptedModel(script(60), context_window=WINDOW, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open(options=OPTIONS) as agent:
            assert isinstance(agent, ReactAgent)
            n = 0
            while not compactions(agent.session.events):
                n += 1
                agent.followup(prompt(n))
                await agent.when_idle()
            estimate = agent.context_estimate()
            actual = model.prompt_tokens(agent.build_request())
            assert abs(estimate - actual) <= 8, (estimate, actual)
            assert estimate < 0.8 * WINDOW / 2


# ---------------------------------------------------------------- on demand, as maintenance


async def test_compact_on_demand_holds_idle_and_waking_input_waits(autojump_clock: trio.testing.MockClock) -> None:
    model = ScriptedModel([*script(6), {"text": "the summary", "delay": 5}, {"text": "after"}])
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            await run_turns(agent, 1, 6)
            async with trio.open_nursery() as nursery:
                result: list[ev.ContextCompacted | None] = []

                async def compact() -> None:
                    result.append(await agent.compact(keep_tokens=0))

                nursery.start_soon(compact)
                await trio.testing.wait_all_tasks_blocked()
                agent.followup("during the compaction")
                await trio.testing.wait_all_tasks_blocked()
                assert agent.status == "idle" and [m.text for m in agent.inbox.next_turn] == ["during the compaction"]
            await agent.when_idle()
            (event,) = result
            assert event is not None and event.reason == "manual" and event.summary == "the summary"
            events = agent.session.events
            later = [e for e in events if isinstance(e, ev.TurnStart) and e.seq > event.seq]
            assert len(later) == 1  # the waiting followup ran after the compaction
            assert model.requests[-2].purpose == "compaction"
            check_boundaries(events)  # keep_tokens=0: everything before the new prompt was summarized
            assert isinstance(agent, ReactAgent)
            assert agent.build_request().messages[0] == UserMessage("during the compaction")


async def test_a_cancelled_compaction_logs_nothing() -> None:
    model = ScriptedModel([*script(3), {"hang": True}])
    async with open_test_harness(model) as h:
        async with h.agents.open() as agent:
            await run_turns(agent, 1, 3)
            before = len(agent.session)
            with trio.move_on_after(5) as scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(agent.compact)
                    await trio.testing.wait_all_tasks_blocked()
                    nursery.cancel_scope.cancel()
            assert not scope.cancelled_caught
            assert len(agent.session) == before and agent.status == "idle"
            agent.followup("next")  # the agent goes on as before
            model.push({"text": "fine"})
            await agent.when_idle()


async def test_disposal_cancels_a_compaction_and_logs_nothing() -> None:
    model = ScriptedModel([*script(3), {"hang": True}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        await run_turns(agent, 1, 3)
        before = len(agent.session)
        errors: list[BaseException] = []

        async def compact() -> None:
            try:
                await agent.compact()
            except AgentDisposedError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(compact)
            await trio.testing.wait_all_tasks_blocked()
            with trio.fail_after(5):
                await handle.dispose()
        assert len(agent.session) == before
        (error,) = errors
        assert "disposed while compacting; nothing was compacted" in str(error)


async def test_compact_reports_nothing_to_do_and_a_failed_summary() -> None:
    model = ScriptedModel([{"text": "only turn"}, {"text": "second"}, {"error": {"message": "overloaded"}}])
    async with open_test_harness(model) as h, h.agents.open(options=OPTIONS) as agent:
        agent.followup("one")
        await agent.when_idle()
        assert await agent.compact() is None  # a single turn: nothing before the latest turn
        agent.followup("two")
        await agent.when_idle()
        before = len(agent.session)
        requests = agent.usage.requests
        with pytest.raises(CompactionError, match="the summary request failed: overloaded"):
            await agent.compact(keep_tokens=0)
        # nothing compacted; the failure and the request it spent are logged
        (failed,) = agent.session.events[before:]
        assert isinstance(failed, ev.CompactionFailed) and failed.reason == "manual" and failed.turn is None
        assert failed.failure.code == "summary-failed" and "overloaded" in failed.failure.message
        assert failed.usage is not None and failed.usage.requests == 1
        assert agent.usage.requests == requests + 1
        assert not compactions(agent.session.events)


async def test_a_failed_automatic_compaction_is_reported_and_then_ends_the_turn_that_needs_it() -> None:
    # After turn 2 the next turn would pass the threshold: the maintenance compaction's summary
    # request fails (reported on the bus); turn 3's request still passes it, so the turn compacts
    # first, and that failure ends the turn with a clear error.
    model = ScriptedModel(
        [
            *script(2),
            {"error": {"message": "summary refused", "code": "http-503"}},
            {"error": {"message": "summary refused again", "code": "http-503"}},
        ]
    )
    options = AgentOptions(context=ContextPolicy(window=300))
    async with open_test_harness(model) as h:
        notices: list[Any] = []
        h.bus.on("agent/compaction-failed", notices.append)
        h.tools.add(ECHO)
        async with h.agents.open(options=options) as agent:
            await run_turns(agent, 1, 2)
            (notice,) = notices
            assert notice.subject is agent and isinstance(notice.data["error"], CompactionError)
            assert "summary refused" in str(notice.data["error"])
            await run_turns(agent, 3, 3)
            ends = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
    assert not compactions(agent.session.events)
    assert [e.reason for e in ends] == ["completed", "completed", "error"]
    # one summary request between turns 2 and 3, one inside turn 3; none again right after turn 3
    assert [r.purpose for r in model.requests].count("compaction") == 2
    assert model.requests[-1].purpose == "compaction"
    failure = ends[-1].failure
    assert failure is not None and failure.code == "compaction-failed"
    assert "passes 80% of the context window (300 tokens)" in failure.message
    assert "summary refused again" in failure.message


# ---------------------------------------------------------------- the history processor


async def test_a_history_processor_shapes_what_is_sent_and_resume_sends_the_same(tmp_path: Path) -> None:
    def last_two_turns(messages: Sequence[Message]) -> Sequence[Message]:
        users = [i for i, m in enumerate(messages) if isinstance(m, UserMessage)]
        return tuple(messages[users[-2] :]) if len(users) >= 2 else tuple(messages)

    options = AgentOptions(history_processor=last_two_turns)
    model = ScriptedModel([{"text": f"a{n}"} for n in range(5)])
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="s", options=options) as agent:
            assert isinstance(agent, ReactAgent)
            for n in range(4):
                agent.followup(f"q{n}")
                await agent.when_idle()
            assert [m.text for m in model.requests[-1].messages if isinstance(m, UserMessage)] == ["q2", "q3"]
            expected = agent.build_request()
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        async with h.agents.open(session_id="s", options=options, resume=True) as agent:
            assert isinstance(agent, ReactAgent)
            assert agent.build_request() == expected


def test_policies_are_checked() -> None:
    with pytest.raises(ValueError, match=r"ContextPolicy\.threshold must be a number within \(0, 1\]"):
        ContextPolicy(threshold=1.5)
    with pytest.raises(ValueError, match=r"ContextPolicy\.window must be a positive int or None"):
        ContextPolicy(window=0)


def test_the_transcript_shows_a_compaction() -> None:
    from trio_harness._cli_sessions import transcript
    from trio_harness.session import SessionHeader

    event = ev.ContextCompacted(seq=9, ts=1.0, boundary=4, summary="s" * 42, reason="threshold", turn=3)
    lines = transcript(SessionHeader(id="x", created_at=1.0), [event])
    assert lines[-1] == "--- context compacted (threshold): events before seq 4 summarized (42 characters) ---"
    failed = ev.CompactionFailed(seq=10, ts=1.0, reason="manual", failure=Failure("summary-failed", "overloaded"))
    lines = transcript(SessionHeader(id="x", created_at=1.0), [event, failed])
    assert lines[-1] == "--- context compaction failed (manual): overloaded (summary-failed) ---"


async def test_a_large_system_prompt_and_tools_do_not_make_every_step_compact() -> None:
    # The built-in tools' definitions (the file tools included) take about half of this window: the part
    # kept verbatim must leave room below the threshold, or each request would pass it again right after
    # compacting.
    model = ScriptedModel([{"text": f"Answer {n}: " + "a" * 180} for n in range(30)], summary="short summary")
    async with open_test_harness(model, builtin_tools=["tasks", "bash", "subagent", "files"]) as h:
        async with h.agents.open(options=AgentOptions(context=ContextPolicy(window=3_000))) as agent:
            assert isinstance(agent, ReactAgent)
            await run_turns(agent, 1, 30)
            events = list(agent.session.events)
    done = compactions(events)
    assert 1 <= len(done) <= 6
    assert {e.reason for e in events if isinstance(e, ev.TurnEnd)} == {"completed"}


async def test_a_failed_compaction_is_logged_counted_and_a_resumed_agent_skips_it_as_the_live_one_did(
    tmp_path: Path,
) -> None:
    refused = {"error": {"message": "summary refused", "code": "http-503"}}
    options = AgentOptions(context=ContextPolicy(window=300))
    model = ScriptedModel([*script(2), refused])
    async with open_test_harness(model, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=options) as agent:
            await run_turns(agent, 1, 2)  # the compaction between turns 2 and 3 fails
            events = list(agent.session.events)
            usage = agent.usage
    (failed,) = [e for e in events if isinstance(e, ev.CompactionFailed)]
    assert (failed.reason, failed.turn, failed.failure.code) == ("threshold", None, "summary-failed")
    assert "summary refused" in failed.failure.message and isinstance(events[failed.seq - 1], ev.TurnEnd)
    assert failed.usage is not None and usage.requests == len(model.requests) == 3  # two turns, one summary
    assert not compactions(events)

    # resumed: not retried between turns right after turn 2 (as the live agent decided); turn 3's own
    # compaction is the next summary request
    again = ScriptedModel([refused])
    async with open_test_harness(again, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s", options=options, resume=True) as agent:
            assert agent.usage == usage  # the failed summary's request is counted after resume too
            await run_turns(agent, 3, 3)
            end = agent.session.events[-1]
    assert [r.purpose for r in again.requests] == ["compaction"]
    assert isinstance(end, ev.TurnEnd) and end.failure is not None and end.failure.code == "compaction-failed"


async def test_compact_on_demand_summarizes_all_but_the_latest_turn_whatever_the_window(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel(script(4), context_window=1_000_000, summary=summarize)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            assert isinstance(agent, ReactAgent)
            await run_turns(agent, 1, 4)  # turn 4 has no tool call; all four fit in the window many times
            # with keep_tokens, the turns that fit in it stay: all four fit, nothing to do
            assert await agent.compact(keep_tokens=100_000) is None
            event = await agent.compact()
            assert event is not None and event.reason == "manual" and event.turn is None
            events = agent.session.events
            start = events[event.boundary]
            assert isinstance(start, ev.TurnStart) and start.turn == 4
            (summary_request,) = [r for r in model.requests if r.purpose == "compaction"]
            (message,) = summary_request.messages
            assert isinstance(message, UserMessage)
            assert prompt(3) in message.text and prompt(4) not in message.text  # turns 1..3 summarized
            request = agent.build_request()
            assert event.summary in request.system
            assert [m for m in request.messages if isinstance(m, UserMessage)] == [UserMessage(prompt(4))]
            # the latest turn alone is left: nothing more to compact
            assert await agent.compact() is None
            assert len([r for r in model.requests if r.purpose == "compaction"]) == 1


def test_a_cancelled_compaction_reads_as_cancelled_in_the_transcript_and_over_acp() -> None:
    from trio_harness._cli_sessions import transcript
    from trio_harness.acp._updates import compaction_failed_update
    from trio_harness.session import SessionHeader

    failure = Failure("cancelled", "the compaction was cancelled")
    cancelled = ev.CompactionFailed(seq=10, ts=1.0, reason="threshold", failure=failure)
    lines = transcript(SessionHeader(id="x", created_at=1.0), [cancelled])
    assert lines[-1] == "--- context compaction cancelled (threshold) ---"
    update = str(compaction_failed_update(cancelled, "x"))
    assert "'text': 'Compacting the conversation was cancelled.'" in update
