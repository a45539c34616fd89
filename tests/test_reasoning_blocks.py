"""Reasoning blocks: logged with the assistant message, sent back in every later request, exact on resume and replay."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
from _postgres import postgres_cluster, schema, store
from _util import echo_tool, wait_until

from trio_harness.model import AssistantMessage, Emit, Finish, ModelRequest, ReasoningBlock, TextDelta
from trio_harness.model._replay import ReplayModel
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import PostgresStore
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

ECHO = echo_tool()

THINKING = {"type": "thinking", "thinking": "the user wants 1", "signature": "c2lnbmF0dXJlLTE="}
REDACTED = {"type": "redacted_thinking", "data": "ZW5jcnlwdGVk"}
REASONING = {"type": "reasoning", "id": "rs_1", "encrypted_content": "gAAAA", "summary": [{"type": "summary_text"}]}

SCRIPT: list[dict[str, Any]] = [
    {
        "reasoning": "thinking...",
        "reasoning_blocks": [{"provider": "anthropic", "data": THINKING}, {"provider": "anthropic", "data": REDACTED}],
        "tool_calls": [{"name": "echo", "arguments": {"x": "1"}}],
    },
    {"reasoning_blocks": [{"provider": "openai-responses", "data": REASONING}], "text": "first done"},
    {"text": "second done"},
]


def blocks_of(request: ModelRequest) -> list[tuple[Any, ...]]:
    return [m.reasoning_blocks for m in request.messages if isinstance(m, AssistantMessage)]


async def test_blocks_are_logged_in_order_and_sent_back_in_every_later_request() -> None:
    model = ScriptedModel(SCRIPT)
    async with open_test_harness(model) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            agent.followup("one")
            await agent.when_idle()
            agent.followup("two")
            await agent.when_idle()
            messages = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
    first = (ReasoningBlock("anthropic", THINKING), ReasoningBlock("anthropic", REDACTED))
    second = (ReasoningBlock("openai-responses", REASONING),)
    assert [m.reasoning_blocks for m in messages] == [first, second, ()]
    # step 2 of turn 1 (the tool loop), then turn 2: every earlier block, in order, on its own message
    assert blocks_of(model.requests[0]) == []
    assert blocks_of(model.requests[1]) == [first]
    assert blocks_of(model.requests[2]) == [first, second]


async def test_requests_after_resume_equal_the_never_restarted_ones_jsonl(tmp_path: Path) -> None:
    await check_resume(tmp_path)


async def test_requests_after_resume_equal_the_never_restarted_ones_postgres(store: PostgresStore) -> None:
    await check_resume(store)


async def check_resume(where: Any) -> None:
    straight = ScriptedModel([*SCRIPT])
    async with open_test_harness(straight) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()

    first = ScriptedModel(SCRIPT[:2])
    async with open_test_harness(first, store=where) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s") as agent:
            agent.followup("one")
            await agent.when_idle()
    second = ScriptedModel(SCRIPT[2:])
    async with open_test_harness(second, store=where) as h:
        h.tools.add(ECHO)
        handle = await h.agents.resume("s")
        handle.agent.followup("two")
        await handle.agent.when_idle()
        await handle.dispose()
    assert second.requests[0] == straight.requests[-1]
    assert blocks_of(second.requests[0])[0] == (
        ReasoningBlock("anthropic", THINKING),
        ReasoningBlock("anthropic", REDACTED),
    )


async def test_a_replay_sends_the_same_requests_and_logs_the_same_blocks(tmp_path: Path) -> None:
    model = ScriptedModel(SCRIPT)
    async with open_test_harness(model, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="rec") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()
            recorded = [e.reasoning_blocks for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
    replay = ReplayModel.from_file(tmp_path / "rec" / "session.jsonl", strict=True)
    async with open_test_harness(replay) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="again") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()
            replayed = [e.reasoning_blocks for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
    assert replayed == recorded
    assert replay.requests == model.requests


class _Provider:
    """Emits a block and some text, then hangs (cancelled), or fails, or answers."""

    name = "fake"
    model = "fake-model"

    def __init__(self, behaviours: list[str]) -> None:
        self.behaviours = behaviours
        self.requests: list[ModelRequest] = []
        self.hanging = False

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        behaviour = self.behaviours.pop(0)
        emit(ReasoningBlock("anthropic", {"type": "thinking", "thinking": behaviour, "signature": "s"}))
        emit(TextDelta(f"partial {behaviour}"))
        if behaviour == "hang":
            self.hanging = True
            await trio.sleep_forever()
        if behaviour == "bad":
            emit(ReasoningBlock("anthropic", {"bytes": b"\x00"}))
        emit(Finish("error" if behaviour == "error" else "stop"))


async def test_blocks_of_cancelled_and_failed_steps_are_logged_but_not_sent_back() -> None:
    provider = _Provider(["hang", "error", "ok", "ok"])
    async with open_test_harness(provider) as h, h.agents.open() as agent:
        agent.followup("one")
        await wait_until(lambda: provider.hanging)
        agent.cancel()
        await agent.when_idle()
        for prompt in ("two", "three", "four"):
            agent.followup(prompt)
            await agent.when_idle()
        messages = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)]
    assert [(m.finish, [b.data["thinking"] for b in m.reasoning_blocks]) for m in messages] == [
        ("aborted", ["hang"]),
        ("error", ["error"]),
        ("stop", ["ok"]),
        ("stop", ["ok"]),
    ]
    # the last request: the aborted and failed messages' text, without their blocks; the good one's block
    last = provider.requests[-1]
    assistant = [m for m in last.messages if isinstance(m, AssistantMessage)]
    assert [m.text for m in assistant] == ["partial hang", "partial error", "partial ok"]
    assert [[b.data["thinking"] for b in m.reasoning_blocks] for m in assistant] == [[], [], ["ok"]]


async def test_a_block_that_is_not_plain_json_ends_the_step_as_an_error() -> None:
    provider = _Provider(["bad"])
    async with open_test_harness(provider) as h, h.agents.open() as agent:
        agent.followup("one")
        await agent.when_idle()
        end = agent.session.events[-1]
    assert isinstance(end, ev.TurnEnd) and end.reason == "error" and end.failure is not None
    assert end.failure.code == "invalid-chunk" and "fake" in end.failure.message


def test_the_script_format_checks_reasoning_blocks() -> None:
    from trio_harness import ModelError

    with pytest.raises(ModelError, match="reasoning_blocks"):
        ScriptedModel([{"text": "x", "reasoning_blocks": [{"provider": "a"}]}])
    with pytest.raises(ModelError, match="reasoning_blocks"):
        ScriptedModel([{"text": "x", "reasoning_blocks": [{"provider": 1, "data": {}}]}])


def thinking(n: int) -> dict[str, Any]:
    return {"reasoning_blocks": [{"provider": "anthropic", "data": {"type": "thinking", "signature": f"s{n}"}}]}


async def test_a_compaction_drops_the_compacted_blocks_and_keeps_the_rest_also_after_resume(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": f"answer {n}", **thinking(n)} for n in (1, 2, 3)], summary="the summary")
    async with open_test_harness(model, store=tmp_path) as h, h.agents.open(session_id="c") as agent:
        for prompt in ("one", "two"):
            agent.followup(prompt)
            await agent.when_idle()
        compacted = await agent.compact(keep_tokens=15)  # keeps turn 2 (about 13 tokens), not turn 1
        assert compacted is not None
        agent.followup("three")
        await agent.when_idle()
    summary_request = model.requests[2]
    assert summary_request.purpose == "compaction"
    assert all(not m.reasoning_blocks for m in summary_request.messages if isinstance(m, AssistantMessage))
    last = model.requests[-1]
    # turn 1 is summarized (its block gone with it); turn 2, kept verbatim, keeps its block
    assert [[b.data["signature"] for b in blocks] for blocks in blocks_of(last)] == [["s2"]]
    again = ScriptedModel([{"text": "answer 4"}])
    async with open_test_harness(again, store=tmp_path) as h:
        handle = await h.agents.resume("c")
        handle.agent.followup("four")
        await handle.agent.when_idle()
        await handle.dispose()
    assert [[b.data["signature"] for b in blocks] for blocks in blocks_of(again.requests[0])] == [["s2"], ["s3"]]
    assert again.requests[0].messages[:-1] == (
        *last.messages,
        AssistantMessage(
            "answer 3", reasoning_blocks=(ReasoningBlock("anthropic", {"type": "thinking", "signature": "s3"}),)
        ),
    )


def test_the_size_estimate_counts_a_blocks_json() -> None:
    from trio_harness.model._context import message_chars

    block = ReasoningBlock("anthropic", THINKING)
    expected = len(json.dumps(THINKING, separators=(",", ":")))
    assert message_chars(AssistantMessage("hi", reasoning_blocks=(block, block))) == 2 + 2 * expected
