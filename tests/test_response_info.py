"""The response's model and id (ResponseInfo): read by each provider, logged, on the chat span."""

from __future__ import annotations

import json

import attrs
import trio
from _anthropic_streams import BASIC
from _responses_fixtures import text_stream
from _sse_server import DONE, Stream, sse, start_server

from trio_harness.model import (
    AnthropicProvider,
    Finish,
    OpenAIProvider,
    ResponseInfo,
    ResponsesProvider,
    TextDelta,
    Usage,
)
from trio_harness.model._protocol import Chunk, ModelRequest, UserMessage
from trio_harness.session._codec import decode_event, encode_event
from trio_harness.session._events import AssistantMessage

REQUEST = ModelRequest(model="", system="", messages=(UserMessage("hi"),))


async def _stream(provider: OpenAIProvider | AnthropicProvider) -> list[Chunk]:
    chunks: list[Chunk] = []
    with trio.fail_after(10):
        async with provider:
            await provider.stream(REQUEST, chunks.append)
    return chunks


def _chat(obj: dict[str, object]) -> bytes:
    return sse({"id": "chatcmpl-9", "object": "chat.completion.chunk", "model": "gpt-4o-2024-08-06", **obj})


async def test_chat_completions_report_the_first_chunks_model_and_id_once_before_the_usage(
    nursery: trio.Nursery,
) -> None:
    pieces = [
        _chat({"choices": [{"index": 0, "delta": {"content": "Hi"}}]}),  # the fast path
        sse({"id": "other", "model": "other", "choices": [{"index": 0, "delta": {"content": "!"}}]}),
        _chat({"choices": [{"index": 0, "delta": {}, "finish_reason": "stop"}], "usage": {"prompt_tokens": 3}}),
        DONE,
    ]
    server = await start_server(nursery, Stream(pieces))
    chunks = await _stream(OpenAIProvider(model="m", base_url=server.base_url, max_retries=0))
    assert chunks == [
        TextDelta("Hi"),
        TextDelta("!"),
        ResponseInfo(model="gpt-4o-2024-08-06", id="chatcmpl-9"),
        Usage(input_tokens=3),
        Finish("stop"),
    ]


async def test_a_stream_that_names_no_model_reports_no_info(nursery: trio.Nursery) -> None:
    pieces = [
        sse({"choices": [{"delta": {"content": "x"}}]}),
        sse({"choices": [{"delta": {}, "finish_reason": "stop"}]}),
    ]
    server = await start_server(nursery, Stream([*pieces, DONE]))
    chunks = await _stream(OpenAIProvider(model="m", base_url=server.base_url, max_retries=0))
    assert chunks == [TextDelta("x"), Finish("stop")]


async def test_anthropic_reports_message_start_model_and_id(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, Stream(BASIC))
    base = server.base_url.removesuffix("/v1")
    chunks = await _stream(AnthropicProvider(model="m", base_url=base, api_key="k", max_retries=0))
    infos = [chunk for chunk in chunks if isinstance(chunk, ResponseInfo)]
    assert infos == [ResponseInfo(model="claude-opus-4-6", id="msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY")]
    assert chunks[-3:] == [infos[0], Usage(25, 15), Finish("stop")]


async def test_responses_reports_the_response_model_and_id(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, Stream(text_stream()))
    chunks = await _stream(ResponsesProvider(model="m", base_url=server.base_url, api_key="k", max_retries=0))
    infos = [chunk for chunk in chunks if isinstance(chunk, ResponseInfo)]
    assert len(infos) == 1 and infos[0].model == "gpt-4.1-2025-04-14" and infos[0].id.startswith("resp")
    assert isinstance(chunks[-2], Usage) and chunks[-3] == infos[0]


def test_assistant_message_writes_the_response_fields_only_when_known_and_old_lines_read_unchanged() -> None:
    old = (
        '{"type":"assistant/message","seq":3,"ts":1.5,"turn":1,"step":1,"text":"hi",'
        '"reasoning":"","tool_calls":[],"usage":null,"finish":"stop"}'
    )
    event = decode_event(old)
    assert isinstance(event, AssistantMessage) and (event.response_model, event.response_id) == ("", "")
    assert encode_event(event) == old
    named = attrs.evolve(event, response_model="claude-opus-4-6", response_id="msg_1")
    line = encode_event(named)
    assert json.loads(line)["response_model"] == "claude-opus-4-6" and json.loads(line)["response_id"] == "msg_1"
    assert decode_event(line) == named and encode_event(decode_event(line)) == line
