"""ResponsesProvider in agent turns: reasoning items go back verbatim, and resume sends the same bytes.

A real loopback server (tests/_sse_server.py) plays OpenAI-shaped streams
(tests/_responses_fixtures.py): a reasoning item and a function call, then
answers.  The request bodies the server received are compared byte for byte:
the requests a resumed session sends equal those of a session that never
stopped (docs/models.rst, "Replay stays exact").
"""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import trio
from _responses_fixtures import CALL_ITEM, REASONING_ITEM, reasoning_call_stream, text_stream
from _sse_server import ScriptedServer, Stream, start_server

from trio_harness.agents import Tool, ToolContext
from trio_harness.model import ResponsesProvider
from trio_harness.testing import open_test_harness


async def _weather(ctx: ToolContext, args: dict[str, Any]) -> str:
    return f"18C in {args['location']}"


WEATHER = Tool("get_weather", "The weather of a place.", {"type": "object", "properties": {}}, _weather)


def _provider(server: ScriptedServer) -> ResponsesProvider:
    return ResponsesProvider(model="gpt-5", base_url=server.base_url, api_key="k", rng=random.Random(1), max_retries=0)


async def test_reasoning_items_go_back_verbatim_and_resume_sends_the_same_bytes(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    script = (Stream(reasoning_call_stream()), Stream(text_stream()), Stream(text_stream(("Again",))))
    straight = await start_server(nursery, *script)
    async with _provider(straight) as provider, open_test_harness(provider, store=tmp_path / "a") as h:
        h.tools.add(WEATHER)
        async with h.agents.open(session_id="s") as agent:
            for prompt in ("Weather in Paris?", "And now?"):
                agent.followup(prompt)
                with trio.fail_after(30):
                    await agent.when_idle()
            assert agent.session.events  # the turns ran
    assert len(straight.requests) == 3
    step_two = straight.requests[1].json["input"]
    # The reasoning item exactly as received, then the call by call_id, then its output.
    assert step_two[1] == REASONING_ITEM
    assert step_two[2] == {
        "type": "function_call",
        "call_id": CALL_ITEM["call_id"],
        "name": "get_weather",
        "arguments": CALL_ITEM["arguments"],
    }
    assert step_two[3] == {
        "type": "function_call_output",
        "call_id": CALL_ITEM["call_id"],
        "output": "18C in Paris, France",
    }
    assert straight.requests[2].json["input"][1] == REASONING_ITEM  # in every later request

    # The same session, stopped after the first turn and resumed for the second.
    first = await start_server(nursery, *script[:2])
    async with _provider(first) as provider, open_test_harness(provider, store=tmp_path / "b") as h:
        h.tools.add(WEATHER)
        async with h.agents.open(session_id="s") as agent:
            agent.followup("Weather in Paris?")
            with trio.fail_after(30):
                await agent.when_idle()
    second = await start_server(nursery, script[2])
    async with _provider(second) as provider, open_test_harness(provider, store=tmp_path / "b") as h:
        h.tools.add(WEATHER)
        handle = await h.agents.resume("s")
        handle.agent.followup("And now?")
        with trio.fail_after(30):
            await handle.agent.when_idle()
        await handle.dispose()
    assert [r.body for r in first.requests] == [r.body for r in straight.requests[:2]]
    assert second.requests[0].body == straight.requests[2].body  # byte for byte
    assert json.loads(second.requests[0].body)["input"][1] == REASONING_ITEM
