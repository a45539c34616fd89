"""AnthropicProvider in a real tool loop: thinking blocks go back exactly, requests are byte-identical after resume.

The model is a real HTTP server on 127.0.0.1 (tests/_sse_server.py) replaying
Messages streams; the harness logs to JSON lines files in a temporary directory.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import trio
from _anthropic_streams import (
    MESSAGE_STOP,
    SIGNATURE,
    block_start,
    block_stop,
    delta,
    message_delta,
    message_start,
    text,
)
from _sse_server import ScriptedServer, Stream, start_server
from _util import echo_tool

from trio_harness.model import AnthropicProvider
from trio_harness.testing import open_test_harness

THOUGHT = "The user wants an echo of 1."
TOOL_STEP = Stream(
    [
        message_start(100, 1, cache_creation_input_tokens=900),
        block_start(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": THOUGHT}),
        delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
        block_stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": '{"x": "1"}'}),
        block_stop(1),
        message_delta("tool_use", 20),
        MESSAGE_STOP,
    ]
)


def answer(words: str) -> Stream:
    return Stream(
        [
            message_start(10, 1, cache_read_input_tokens=900),
            block_start(0, {"type": "text", "text": ""}),
            text(0, words),
            block_stop(0),
            message_delta("end_turn", 5),
            MESSAGE_STOP,
        ]
    )


def provider_for(server: ScriptedServer) -> AnthropicProvider:
    return AnthropicProvider(
        model="claude-test", base_url=server.base_url.removesuffix("/v1"), api_key="k", name="anthropic:claude-test"
    )


async def run(server: ScriptedServer, store: Any, prompts: list[str], *, resume: bool = False) -> None:
    async with provider_for(server) as provider, open_test_harness(provider, store=store) as h:
        h.tools.add(echo_tool())
        if resume:
            handle = await h.agents.resume("s")
            for prompt in prompts:
                handle.agent.followup(prompt)
                await handle.agent.when_idle()
            await handle.dispose()
            return
        async with h.agents.open(session_id="s") as agent:
            for prompt in prompts:
                agent.followup(prompt)
                await agent.when_idle()


async def test_thinking_goes_back_exactly_and_resume_sends_the_same_bytes(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    with trio.fail_after(30):
        straight = await start_server(nursery, TOOL_STEP, answer("done one"), answer("done two"))
        await run(straight, tmp_path / "straight", ["one", "two"])
        first = await start_server(nursery, TOOL_STEP, answer("done one"))
        await run(first, tmp_path / "restarted", ["one"])
        second = await start_server(nursery, answer("done two"))
        await run(second, tmp_path / "restarted", ["two"], resume=True)

    assert len(straight.requests) == 3
    step2: dict[str, Any] = json.loads(straight.requests[1].body)
    assistant = step2["messages"][1]
    assert assistant == {
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": THOUGHT, "signature": SIGNATURE},
            {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"x": "1"}},
        ],
    }
    results = step2["messages"][2]["content"]
    assert results[0]["type"] == "tool_result" and results[0]["tool_use_id"] == "toolu_1"
    assert results[0]["content"] == "echo 1"
    # The thinking block stays in every later request of the session too.
    turn2: dict[str, Any] = json.loads(straight.requests[2].body)
    assert turn2["messages"][1] == assistant
    assert 0 < json.dumps(turn2).count('"cache_control"') <= 4
    # Resumed from the log, the request is byte for byte the one never restarted.
    assert second.requests[0].body == straight.requests[2].body


SEARCH_CALL = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
SEARCH_RESULT = {
    "type": "web_search_tool_result",
    "tool_use_id": "srvtoolu_1",
    "content": [
        {
            "type": "web_search_result",
            "url": "https://trio.readthedocs.io/",
            "title": "Trio",
            "encrypted_content": "EqgfCioIARgBIiQ3YTAwMjY1Mi1mZjM5LTQ1NGUtODgxNC1kNjNjNTk1ZWI3Y2YSDMjeNYCc",
            "page_age": None,
        }
    ],
}
MIXED_STEP = Stream(
    [
        message_start(100, 1),
        block_start(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "Search first."}),
        delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
        block_stop(0),
        block_start(1, {"type": "text", "text": ""}),
        text(1, "Let me search."),
        block_stop(1),
        block_start(2, SEARCH_CALL),
        delta(2, {"type": "input_json_delta", "partial_json": '{"query": "trio"}'}),
        block_stop(2),
        block_start(3, SEARCH_RESULT),
        block_stop(3),
        block_start(4, {"type": "thinking", "thinking": ""}),
        delta(4, {"type": "thinking_delta", "thinking": "Now echo."}),
        delta(4, {"type": "signature_delta", "signature": SIGNATURE + "2"}),
        block_stop(4),
        block_start(5, {"type": "text", "text": ""}),
        text(5, " Found it."),
        block_stop(5),
        block_start(6, {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {}}),
        delta(6, {"type": "input_json_delta", "partial_json": '{"x": "1"}'}),
        block_stop(6),
        message_delta("tool_use", 20),
        MESSAGE_STOP,
    ]
)
MIXED_CONTENT = [
    {"type": "thinking", "thinking": "Search first.", "signature": SIGNATURE},
    {"type": "text", "text": "Let me search."},
    {**SEARCH_CALL, "input": {"query": "trio"}},
    SEARCH_RESULT,
    {"type": "thinking", "thinking": "Now echo.", "signature": SIGNATURE + "2"},
    {"type": "text", "text": " Found it."},
    {"type": "tool_use", "id": "toolu_1", "name": "echo", "input": {"x": "1"}},
]
"""What MIXED_STEP's message is, block by block, as the server sent it."""


async def test_every_block_goes_back_in_the_order_received_also_after_resume(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    # Review finding: a thinking block's position counted the server-tool blocks, which were not sent
    # back, so the second thinking block landed after the tool_use. Every block now goes back where
    # it was: thinking, text, the server tool's call and result, thinking, text, the call.
    with trio.fail_after(30):
        straight = await start_server(nursery, MIXED_STEP, answer("done one"), answer("done two"))
        await run(straight, tmp_path / "straight", ["one", "two"])
        first = await start_server(nursery, MIXED_STEP, answer("done one"))
        await run(first, tmp_path / "restarted", ["one"])
        second = await start_server(nursery, answer("done two"))
        await run(second, tmp_path / "restarted", ["two"], resume=True)

    step2: dict[str, Any] = json.loads(straight.requests[1].body)
    assert step2["messages"][1] == {"role": "assistant", "content": MIXED_CONTENT}
    assert step2["messages"][2]["content"][0]["tool_use_id"] == "toolu_1"
    turn2: dict[str, Any] = json.loads(straight.requests[2].body)
    assert turn2["messages"][1] == {"role": "assistant", "content": MIXED_CONTENT}
    assert [r.body for r in first.requests] == [r.body for r in straight.requests[:2]]
    assert second.requests[0].body == straight.requests[2].body  # byte for byte after resume
