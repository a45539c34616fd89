"""ResponsesProvider against a server no one here wrote: LiteLLM's proxy serving ``/v1/responses``.

LiteLLM's ``mock_response`` does not stream on ``/v1/responses`` (its proxy
fails with "'ResponsesAPIResponse' object has no attribute '__aiter__'",
LiteLLM 1.108), so the proxy is given a real upstream instead: a
chat-completions route (``deepseek/up-model`` at a loopback
``api_base``, tests/_sse_server.py) that LiteLLM bridges to the Responses
API itself, writing its own Responses events (data-only lines ending in
``[DONE]``) and translating our input items (function calls, their outputs)
to chat messages.

The proxy is a large install that CI does not have (``pip install
'litellm[proxy]'`` into a separate virtualenv): the test runs when
``TRIO_HARNESS_LITELLM`` names its ``litellm`` executable (or
``/tmp/litellm-resp/bin/litellm`` exists) and is marked slow (the proxy takes
about 15 seconds to start).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from _sse_server import DONE, Stream, closed_port, sse_delta, sse_finish, sse_text, sse_usage, start_server

from trio_harness.model import (
    AssistantMessage,
    Chunk,
    Finish,
    ModelRequest,
    ResponsesProvider,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)

LITELLM = os.environ.get("TRIO_HARNESS_LITELLM", "/tmp/litellm-resp/bin/litellm")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not Path(LITELLM).exists(), reason=f"LiteLLM's proxy is not installed at {LITELLM}"),
]

TOOL = ToolSpec("get_weather", "The weather of a city.", {"type": "object", "properties": {"city": {"type": "string"}}})

CALL = Stream(
    [
        sse_delta(
            role="assistant",
            tool_calls=[
                {"index": 0, "id": "call_up1", "type": "function", "function": {"name": "get_weather", "arguments": ""}}
            ],
        ),
        sse_delta(tool_calls=[{"index": 0, "function": {"arguments": '{"city":'}}]),
        sse_delta(tool_calls=[{"index": 0, "function": {"arguments": ' "Paris"}'}}]),
        sse_finish("tool_calls"),
        sse_usage(11, 5),
        DONE,
    ]
)
ANSWER = Stream([sse_text("Sunny"), sse_text(" in Paris."), sse_finish("stop"), sse_usage(30, 4), DONE])


async def test_a_tool_loop_through_litellm(nursery: trio.Nursery, tmp_path: Path) -> None:
    upstream = await start_server(nursery, CALL, ANSWER)
    config = tmp_path / "litellm.yaml"
    config.write_text(
        "model_list:\n"
        "  - model_name: up-model\n"
        "    litellm_params:\n"
        "      model: deepseek/up-model\n"
        f"      api_base: {upstream.base_url}\n"
        "      api_key: fake-key\n"
    )
    port = closed_port()
    env = {
        **os.environ,
        "LITELLM_DANGEROUSLY_PERMIT_WEAK_OR_UNSET_MASTER_KEY": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    log = (tmp_path / "litellm.log").open("wb")
    process = await trio.lowlevel.open_process(
        [LITELLM, "--config", str(config), "--host", "127.0.0.1", "--port", str(port)],
        stdout=log,
        stderr=subprocess.STDOUT,
        env=env,
    )
    try:
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient() as client:
            with trio.fail_after(120):
                while True:
                    assert process.poll() is None, (tmp_path / "litellm.log").read_text()[-3000:]
                    try:
                        if (await client.get(base + "/health/liveliness")).status_code == 200:
                            break
                    except httpx.TransportError:
                        pass
                    await trio.sleep(0.5)
        async with ResponsesProvider(model="up-model", base_url=base + "/v1", api_key="sk-any") as provider:
            first: list[Chunk] = []
            question = (UserMessage("Weather in Paris?"),)
            with trio.fail_after(60):
                await provider.stream(ModelRequest("", "Be brief.", question, tools=(TOOL,)), first.append)
            calls = [chunk for chunk in first if isinstance(chunk, ToolCallDelta)]
            assert calls, first
            call_id = calls[0].id
            assert call_id
            assert calls[0].name == "get_weather"
            assert "".join(call.arguments for call in calls) == '{"city": "Paris"}'
            assert first[-1] == Finish("tool-calls")
            assert Usage(input_tokens=11, output_tokens=5) in first

            second: list[Chunk] = []
            followup = (
                *question,
                AssistantMessage("", tool_calls=(ToolCall(call_id, "get_weather", '{"city": "Paris"}'),)),
                ToolMessage(call_id, "get_weather", "18C, sunny"),
            )
            with trio.fail_after(60):
                await provider.stream(ModelRequest("", "Be brief.", followup, tools=(TOOL,)), second.append)
            assert "".join(chunk.text for chunk in second if isinstance(chunk, TextDelta)) == "Sunny in Paris."
            assert second[-1] == Finish("stop")
    finally:
        process.terminate()
        with trio.CancelScope(shield=True):
            await process.wait()
        log.close()
    # LiteLLM turned our input items into the chat messages a chat-completions server expects.
    messages = upstream.requests[1].json["messages"]
    assert messages[0] == {"role": "system", "content": "Be brief."}
    assistant = next(message for message in messages if message["role"] == "assistant")
    assert assistant["tool_calls"][0]["function"]["name"] == "get_weather"
    tool = next(message for message in messages if message["role"] == "tool")
    assert tool["content"] == "18C, sunny"
    assert tool["tool_call_id"] == assistant["tool_calls"][0]["id"]
