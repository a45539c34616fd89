"""AnthropicProvider and its sans-io stream parser.

The parser is fed the streams of Anthropic's published streaming examples
(tests/_anthropic_streams.py) split at every point; the provider is run against
a real HTTP server on 127.0.0.1 (tests/_sse_server.py) replaying them.
"""

from __future__ import annotations

import gc
import json
import math
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing
from _anthropic_streams import (
    BASIC,
    MESSAGE_STOP,
    OVERLOADED,
    REDACTED,
    SIGNATURE,
    THINKING,
    THINKING_PIECES,
    TOOL_ID,
    TOOL_PIECES,
    TOOL_USE,
    block_start,
    block_stop,
    delta,
    event,
    message_delta,
    message_start,
    text,
)
from _sse_server import Pause, Respond, ScriptedServer, Stream, start_server

from trio_harness._errors import ModelError
from trio_harness.model import AnthropicProvider, Image, resolve_model
from trio_harness.model._anthropic_stream import AnthropicStreamParser
from trio_harness.model._protocol import (
    AssistantMessage,
    Chunk,
    Failure,
    Finish,
    ModelRequest,
    ModelSettings,
    ReasoningBlock,
    ReasoningDelta,
    ResponseInfo,
    Retry,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
)
from trio_harness.model._spec import missing_api_key
from trio_harness.model._sse import SSEDecoder

REQUEST = ModelRequest(model="", system="", messages=(UserMessage("hi"),))
NOTHING_BEFORE = {"text": 0, "tool_calls": 0}
NO_TIMEOUTS: dict[str, Any] = {"request_timeout": math.inf, "connect_timeout": math.inf, "read_timeout": math.inf}

MakeProvider = Callable[..., AnthropicProvider]


def parse(pieces: list[bytes], *, split: int | None = None) -> tuple[list[Chunk], Finish | Failure, Usage | None]:
    """Run the parser over the bytes (cut every ``split`` bytes when given)."""
    data = b"".join(pieces)
    cuts = [data] if split is None else [data[i : i + split] for i in range(0, len(data), split)]
    decoder = SSEDecoder()
    parser = AnthropicStreamParser("test")
    chunks: list[Chunk] = []
    for cut in cuts:
        parser.feed_into(decoder.feed_bytes(cut), chunks.append)
    chunks.extend(parser.feed_end(decoder.close()))
    return chunks, parser.conclude(), parser.usage


def joined_text(chunks: list[Chunk]) -> str:
    return "".join(chunk.text for chunk in chunks if isinstance(chunk, TextDelta))


# ---------------------------------------------------------------- the parser, sans-io


@pytest.mark.parametrize("split", [None, 1, 7, 64])
def test_basic_stream_any_split(split: int | None) -> None:
    chunks, outcome, usage = parse(BASIC, split=split)
    assert chunks == [TextDelta("Hello"), TextDelta("!")]
    assert outcome == Finish("stop")
    assert usage == Usage(input_tokens=25, output_tokens=15)


@pytest.mark.parametrize("split", [None, 3, 50])
def test_tool_use_stream(split: int | None) -> None:
    chunks, outcome, _ = parse(TOOL_USE, split=split)
    assert joined_text(chunks) == "Okay, let's check the weather for San Francisco, CA:"
    calls = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(index=0, id=TOOL_ID, name="get_weather")
    assert {call.index for call in calls} == {0}
    arguments = "".join(call.arguments for call in calls)
    assert json.loads(arguments) == {"location": "San Francisco, CA", "unit": "fahrenheit"}
    assert arguments == "".join(TOOL_PIECES)
    assert outcome == Finish("tool-calls")


def test_parallel_tool_calls_get_indexes_zero_and_one() -> None:
    stream = [
        message_start(),
        block_start(0, {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {}}),
        block_start(1, {"type": "tool_use", "id": "toolu_b", "name": "ls", "input": {}}),
        delta(0, {"type": "input_json_delta", "partial_json": '{"path": "a"}'}),
        block_stop(0),
        block_stop(1),  # no arguments streamed: an empty object
        message_delta("tool_use", 30),
        MESSAGE_STOP,
    ]
    chunks, outcome, _ = parse(stream)
    assert chunks == [
        ToolCallDelta(index=0, id="toolu_a", name="read"),
        ToolCallDelta(index=1, id="toolu_b", name="ls"),
        ToolCallDelta(index=0, arguments='{"path": "a"}'),
        ToolCallDelta(index=1, arguments="{}"),
    ]
    assert outcome == Finish("tool-calls")


@pytest.mark.parametrize("split", [None, 5])
def test_thinking_block_is_shown_and_kept_exactly(split: int | None) -> None:
    chunks, outcome, _ = parse(THINKING, split=split)
    reasoning = [chunk for chunk in chunks if isinstance(chunk, ReasoningDelta)]
    assert "".join(chunk.text for chunk in reasoning) == "".join(THINKING_PIECES)
    blocks = [chunk for chunk in chunks if isinstance(chunk, ReasoningBlock)]
    assert blocks == [
        ReasoningBlock(
            "anthropic",
            {
                "index": 0,
                "block": {"type": "thinking", "thinking": "".join(THINKING_PIECES), "signature": SIGNATURE},
                "before": {"text": 0, "tool_calls": 0},
            },
        )
    ]
    assert blocks[0].data["block"] == blocks[0].data["block"]  # equality is by value
    # The block comes once complete, before the answer's text.
    assert chunks.index(blocks[0]) < chunks.index(TextDelta("The greatest common divisor of 1071 and 462 is **21**."))
    assert outcome == Finish("stop")


def test_redacted_thinking_block_is_kept_as_received() -> None:
    stream = [message_start(), block_start(0, REDACTED), block_stop(0), message_delta("end_turn", 3), MESSAGE_STOP]
    chunks, outcome, _ = parse(stream)
    assert chunks == [ReasoningBlock("anthropic", {"index": 0, "block": REDACTED, "before": NOTHING_BEFORE})]
    assert outcome == Finish("stop")


def test_usage_counts_cache_reads_and_writes_in_the_prompt() -> None:
    stream = [
        message_start(10, 1, cache_creation_input_tokens=2000, cache_read_input_tokens=30000),
        block_start(0, {"type": "text", "text": ""}),
        text(0, "x"),
        block_stop(0),
        message_delta("end_turn", 42),
        MESSAGE_STOP,
    ]
    _, _, usage = parse(stream)
    assert usage == Usage(input_tokens=32010, output_tokens=42, cache_hit_tokens=30000, cache_write_tokens=2000)


@pytest.mark.parametrize(
    ("reason", "expected"),
    [
        ("end_turn", Finish("stop")),
        ("stop_sequence", Finish("stop")),
        ("max_tokens", Finish("max-tokens")),
        ("tool_use", Finish("tool-calls")),
    ],
)
def test_stop_reasons(reason: str, expected: Finish) -> None:
    stream = [message_start(), message_delta(reason, 1), MESSAGE_STOP]
    assert parse(stream)[1] == expected


@pytest.mark.parametrize(("reason", "code"), [("refusal", "refusal"), ("pause_turn", "pause-turn")])
def test_refusal_and_pause_turn_end_the_turn_with_a_failure(reason: str, code: str) -> None:
    outcome = parse([message_start(), message_delta(reason, 1), MESSAGE_STOP])[1]
    assert isinstance(outcome, Finish) and outcome.reason == "error"
    assert outcome.failure is not None and outcome.failure.code == code
    assert reason in outcome.failure.message


def test_error_event_mid_stream_keeps_what_came_before() -> None:
    chunks, outcome, _ = parse([*BASIC[:4], OVERLOADED, *BASIC[4:]])
    assert chunks == [TextDelta("Hello")]
    assert isinstance(outcome, Failure)
    assert (outcome.code, outcome.retryable) == ("http-529", True)
    assert "overloaded_error: Overloaded" in outcome.message


def test_invalid_request_error_event_is_not_retryable() -> None:
    bad = event({"type": "error", "error": {"type": "invalid_request_error", "message": "bad"}})
    outcome = parse([message_start(), bad])[1]
    assert isinstance(outcome, Failure) and not outcome.retryable and outcome.code == "stream-error"


@pytest.mark.parametrize(
    ("stream", "needle"),
    [
        ([message_start(), b"event: content_block_delta\ndata: {not json}\n\n"], "bad JSON"),
        ([message_start(), text(3, "x")], "not open"),
        ([message_start(), b'event: message_start\ndata: {"type": "message_start"}\n\n'], "no message"),
        ([message_start(), block_start(0, {"type": "tool_use", "input": {}})], "id and a name"),
        ([message_start(), b"data: [1]\n\n"], "not a JSON object"),
    ],
)
def test_malformed_streams(stream: list[bytes], needle: str) -> None:
    outcome = parse(stream)[1]
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream"
    assert needle in outcome.message


def test_truncated_stream_is_retryable_and_no_stop_is_no_finish() -> None:
    truncated = parse([*BASIC[:4], b"event: content_block_delta\ndata: {"])[1]
    assert isinstance(truncated, Failure) and (truncated.code, truncated.retryable) == ("truncated-stream", True)
    ended = parse(BASIC[:4])[1]
    assert isinstance(ended, Failure) and ended.code == "no-finish"


def test_stop_reason_without_message_stop_is_complete() -> None:
    assert parse(BASIC[:-1])[1] == Finish("stop")


# ---------------------------------------------------------------- the request body


def make(**kwargs: Any) -> AnthropicProvider:
    return AnthropicProvider(model="claude-test", api_key="k", **kwargs)


TOOLS = (
    ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}),
    ToolSpec("ls", "List", {"type": "object"}),
)
THOUGHT = ReasoningBlock(
    "anthropic", {"index": 0, "block": {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE}}
)
LOOP = ModelRequest(
    model="",
    system="You are terse.",
    tools=TOOLS,
    messages=(
        UserMessage("look"),
        AssistantMessage(
            "Checking.",
            tool_calls=(ToolCall("toolu_a", "read", '{"path": "a"}'), ToolCall("toolu_b", "ls", "")),
            reasoning_blocks=(THOUGHT, ReasoningBlock("openai-responses", {"id": "rs_1"})),
        ),
        ToolMessage("toolu_a", "read", "contents"),
        ToolMessage("toolu_b", "ls", "no such dir", is_error=True),
    ),
)


def test_tool_loop_body_sends_thinking_back_in_place() -> None:
    body = make(prompt_caching=False).build_body(LOOP)
    assert body["system"] == [{"type": "text", "text": "You are terse."}]
    assert body["max_tokens"] == 8192 and body["stream"] is True
    assert body["messages"] == [
        {"role": "user", "content": [{"type": "text", "text": "look"}]},
        {
            "role": "assistant",
            "content": [
                {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE},  # exactly, first; no other provider's
                {"type": "text", "text": "Checking."},
                {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a"}},
                {"type": "tool_use", "id": "toolu_b", "name": "ls", "input": {}},
            ],
        },
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "toolu_a", "content": "contents"},
                {"type": "tool_result", "tool_use_id": "toolu_b", "content": "no such dir", "is_error": True},
            ],
        },
    ]
    assert body["tools"][0] == {
        "name": "read",
        "description": "Read a file",
        "input_schema": {"type": "object", "properties": {"path": {"type": "string"}}},
    }
    assert "cache_control" not in json.dumps(body)


def test_reasoning_block_position_is_kept_between_other_blocks() -> None:
    late = ReasoningBlock("anthropic", {"index": 1, "block": REDACTED})
    message = AssistantMessage("a", tool_calls=(ToolCall("t1", "ls", "{}"),), reasoning_blocks=(late,))
    body = make().build_body(ModelRequest(model="", system="", messages=(UserMessage("x"), message)))
    assert [block["type"] for block in body["messages"][1]["content"]] == ["text", "redacted_thinking", "tool_use"]


def test_anchored_blocks_go_back_among_text_and_calls_and_bad_anchors_lose_nothing() -> None:
    def anchored(block: dict[str, Any], text: int, calls: int) -> ReasoningBlock:
        return ReasoningBlock("anthropic", {"index": 0, "block": block, "before": {"text": text, "tool_calls": calls}})

    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    calls = (ToolCall("t1", "ls", "{}"), ToolCall("t2", "ls", "{}"))
    message = AssistantMessage(
        "ab", tool_calls=calls, reasoning_blocks=(anchored(search, 1, 1), anchored(REDACTED, 1, 2))
    )
    body = make().build_body(ModelRequest(model="", system="", messages=(UserMessage("x"), message)))
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "a"},
        {"type": "tool_use", "id": "t1", "name": "ls", "input": {}},
        search,
        {"type": "tool_use", "id": "t2", "name": "ls", "input": {}},
        REDACTED,
        {"type": "text", "text": "b"},
    ]
    # Anchors past the text and calls (or going back) are clamped: every piece goes back once, in order.
    wild = AssistantMessage(
        "ab", tool_calls=calls, reasoning_blocks=(anchored(search, 99, 99), anchored(REDACTED, 0, 0))
    )
    body = make().build_body(ModelRequest(model="", system="", messages=(UserMessage("x"), wild)))
    assert [block["type"] for block in body["messages"][1]["content"]] == [
        "text",
        "tool_use",
        "tool_use",
        "server_tool_use",
        "redacted_thinking",
    ]


def test_cache_breakpoints_on_tools_system_and_last_two_user_turns() -> None:
    request = ModelRequest(
        model="",
        system="sys",
        tools=TOOLS,
        messages=(
            UserMessage("one"),
            AssistantMessage("r1"),
            UserMessage("two"),
            AssistantMessage("r2"),
            *LOOP.messages,
        ),
    )
    body = make().build_body(request)
    marked = [path for path, _ in _cache_marks(body)]
    assert marked == ["tools[1]", "system[0]", "messages[4].content[0]", "messages[6].content[1]"]
    assert len(marked) <= 4
    # Deterministic: the same request, the same bytes (replay and resume send what was sent).
    again = make().build_body(request)
    assert json.dumps(again) == json.dumps(body)


def _cache_marks(body: dict[str, Any]) -> list[tuple[str, Any]]:
    marks = []
    for key in ("tools", "system"):
        for i, item in enumerate(body.get(key, ())):
            if "cache_control" in item:
                marks.append((f"{key}[{i}]", item["cache_control"]))
    for i, message in enumerate(body["messages"]):
        for j, block in enumerate(message["content"]):
            if "cache_control" in block:
                marks.append((f"messages[{i}].content[{j}]", block["cache_control"]))
    return marks


def test_reasoning_blocks_after_a_json_round_trip_give_the_same_bytes() -> None:
    # The log stores blocks as JSON: what comes back must encode identically.
    restored = [
        ReasoningBlock(block.provider, json.loads(json.dumps(dict(block.data))))
        for block in LOOP.messages[1].reasoning_blocks  # type: ignore[union-attr]
    ]
    assistant = LOOP.messages[1]
    assert isinstance(assistant, AssistantMessage)
    rebuilt = ModelRequest(
        model="",
        system=LOOP.system,
        tools=LOOP.tools,
        messages=(
            LOOP.messages[0],
            AssistantMessage(assistant.text, assistant.tool_calls, reasoning_blocks=tuple(restored)),
            *LOOP.messages[2:],
        ),
    )
    assert json.dumps(make().build_body(rebuilt)) == json.dumps(make().build_body(LOOP))


def test_images_are_base64_blocks() -> None:
    request = ModelRequest(
        model="", system="", messages=(UserMessage("what?", images=(Image(b"\x89PNG..", "image/png"),)),)
    )
    content = make(prompt_caching=False).build_body(request)["messages"][0]["content"]
    assert content == [
        {"type": "text", "text": "what?"},
        {"type": "image", "source": {"type": "base64", "media_type": "image/png", "data": "iVBORy4u"}},
    ]


def test_settings_map_to_messages_fields() -> None:
    settings = ModelSettings(
        temperature=0.5,
        top_p=0.9,
        stop=("END",),
        max_tokens=20000,
        reasoning_effort="medium",
        parallel_tool_calls=False,
    )
    body = make(prompt_caching=False).build_body(
        ModelRequest(
            model="m2", system="", messages=(UserMessage("x"),), tools=TOOLS, settings=settings, max_tokens=20000
        )
    )
    assert (body["model"], body["max_tokens"], body["temperature"], body["top_p"]) == ("m2", 20000, 0.5, 0.9)
    assert body["stop_sequences"] == ["END"]
    assert body["thinking"] == {"type": "enabled", "budget_tokens": 8192}
    assert body["tool_choice"] == {"type": "auto", "disable_parallel_tool_use": True}


async def test_reasoning_effort_with_max_tokens_no_thinking_budget_fits_is_refused_before_sending() -> None:
    # Anthropic needs 1024 <= budget_tokens < max_tokens: with max_tokens <= 1024 no budget fits,
    # and sending budget_tokens=1024 would be a 400 on every request.
    chunks: list[Chunk] = []
    request = ModelRequest(
        model="",
        system="",
        messages=(UserMessage("x"),),
        settings=ModelSettings(reasoning_effort="low", max_tokens=1024),
    )
    await make().stream(request, chunks.append)
    assert len(chunks) == 1 and isinstance(chunks[0], Finish) and chunks[0].failure is not None
    assert "max_tokens above 1024" in chunks[0].failure.message
    fits = ModelRequest(
        model="",
        system="",
        messages=(UserMessage("x"),),
        settings=ModelSettings(reasoning_effort="high", max_tokens=2000),
    )
    assert make().build_body(fits)["thinking"] == {"type": "enabled", "budget_tokens": 1999}


async def test_bad_reasoning_effort_is_a_clear_failure() -> None:
    chunks: list[Chunk] = []
    request = ModelRequest(
        model="", system="", messages=(UserMessage("x"),), settings=ModelSettings(reasoning_effort="max!")
    )
    await make().stream(request, chunks.append)
    assert len(chunks) == 1 and isinstance(chunks[0], Finish) and chunks[0].failure is not None
    assert "reasoning_effort 'max!'" in chunks[0].failure.message


# ---------------------------------------------------------------- specs


def test_specs() -> None:
    with pytest.raises(ModelError, match="ANTHROPIC_API_KEY"):
        resolve_model("anthropic:claude-sonnet-4-5", env={})
    provider = resolve_model("anthropic:claude-sonnet-4-5", env={"ANTHROPIC_API_KEY": "sk"})
    assert isinstance(provider, AnthropicProvider)
    assert (provider.name, provider.url, provider.api_key, provider.prompt_caching) == (
        "anthropic:claude-sonnet-4-5",
        "https://api.anthropic.com/v1/messages",
        "sk",
        True,
    )
    proxied = resolve_model("anthropic:claude-x@http://localhost:4000?prompt_caching=false&temperature=0", env={})
    assert isinstance(proxied, AnthropicProvider)
    assert proxied.url == "http://localhost:4000/v1/messages" and proxied.api_key is None
    assert not proxied.prompt_caching and proxied.settings.temperature == 0
    with pytest.raises(ModelError, match="prompt_caching='maybe'"):
        resolve_model("anthropic:m@http://h?prompt_caching=maybe", env={})
    with pytest.raises(ModelError, match="must start with http"):
        resolve_model("anthropic:m@localhost:4000", env={})
    assert missing_api_key("anthropic:m", env={}) == "ANTHROPIC_API_KEY"
    assert missing_api_key("anthropic:m@http://h", env={}) is None


# ---------------------------------------------------------------- over HTTP


@pytest.fixture
async def make_provider() -> AsyncIterator[MakeProvider]:
    made: list[AnthropicProvider] = []

    def build(server: ScriptedServer, **kwargs: Any) -> AnthropicProvider:
        options: dict[str, Any] = {
            "model": "claude-test",
            "base_url": server.base_url.removesuffix("/v1"),
            "api_key": "sk-ant",
            "name": "anthropic:claude-test",
            "rng": random.Random(1),
            "max_retries": 0,
        }
        options.update(kwargs)
        provider = AnthropicProvider(**options)
        made.append(provider)
        return provider

    yield build
    for provider in made:
        await provider.aclose()


async def collect(
    provider: AnthropicProvider, request: ModelRequest = REQUEST, *, guard: float | None = 10.0, info: bool = False
) -> list[Chunk]:
    chunks: list[Chunk] = []
    if guard is None:
        await provider.stream(request, chunks.append)
    else:
        with trio.fail_after(guard):
            await provider.stream(request, chunks.append)
    assert isinstance(chunks[-1], Finish) and sum(isinstance(c, Finish) for c in chunks) == 1
    # At most one ResponseInfo, after the output; left out unless asked for (``info=True``).
    assert sum(isinstance(chunk, ResponseInfo) for chunk in chunks) <= 1
    if not info:
        chunks = [chunk for chunk in chunks if not isinstance(chunk, ResponseInfo)]
    gc.collect()
    return chunks


async def test_recorded_stream_over_http(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(THINKING))
    chunks = await collect(make_provider(server), LOOP)
    assert chunks[-2:] == [Usage(input_tokens=25, output_tokens=150), Finish("stop")]
    assert any(isinstance(chunk, ReasoningBlock) for chunk in chunks)
    (sent,) = server.requests
    assert sent.path == "/v1/messages"
    assert sent.headers["x-api-key"] == "sk-ant"
    assert sent.headers["anthropic-version"] == "2023-06-01"
    assert sent.body == json.dumps(make_provider(server).build_body(LOOP), ensure_ascii=False).encode()


async def test_529_overloaded_with_retry_after_is_retried(
    nursery: trio.Nursery, make_provider: MakeProvider, autojump_clock: trio.testing.MockClock
) -> None:
    overloaded = {"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}}
    server = await start_server(nursery, Respond(529, overloaded, headers={"retry-after": "3"}), Stream(BASIC))
    start = trio.current_time()
    chunks = await collect(make_provider(server, max_retries=2, **NO_TIMEOUTS), guard=None)
    retry = chunks[0]
    assert isinstance(retry, Retry) and (retry.attempt, retry.delay) == (1, 3.0)
    assert retry.failure.code == "http-529" and "Overloaded" in retry.failure.message
    assert chunks[1:] == [TextDelta("Hello"), TextDelta("!"), Usage(25, 15), Finish("stop")]
    assert 3.0 <= trio.current_time() - start < 4.0


async def test_error_event_before_output_is_retried_after_output_is_not(
    nursery: trio.Nursery, make_provider: MakeProvider, autojump_clock: trio.testing.MockClock
) -> None:
    server = await start_server(
        nursery, Stream([message_start(), OVERLOADED]), Stream(BASIC), Stream([*BASIC[:4], OVERLOADED])
    )
    provider = make_provider(server, max_retries=1, backoff_base=1.0, jitter=0.0, **NO_TIMEOUTS)
    first = await collect(provider, guard=None)
    assert isinstance(first[0], Retry) and first[-1] == Finish("stop")
    second = await collect(provider, guard=None)
    finish = second[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert second[0] == TextDelta("Hello")
    assert "not retried: output was already emitted" in finish.failure.message
    assert len(server.requests) == 3


async def test_http_error_message_is_reported(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    body = {"type": "error", "error": {"type": "invalid_request_error", "message": "max_tokens: too large"}}
    server = await start_server(nursery, Respond(400, body))
    finish = (await collect(make_provider(server, max_retries=3)))[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert finish.failure.code == "http-400" and "max_tokens: too large" in finish.failure.message
    assert len(server.requests) == 1


async def test_cancel_mid_stream_closes_the_connection(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream([*BASIC[:4], Pause(1000.0), *BASIC[4:]]))
    provider = make_provider(server)
    chunks: list[Chunk] = []
    got = trio.Event()

    def emit(chunk: Chunk) -> None:
        chunks.append(chunk)
        got.set()

    cancelled_at = math.inf

    async def cancel(scope: trio.CancelScope) -> None:
        nonlocal cancelled_at
        await got.wait()
        await trio.testing.wait_all_tasks_blocked()
        cancelled_at = trio.current_time()
        scope.cancel()

    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            nursery.start_soon(cancel, scope)
            await provider.stream(REQUEST, emit)
            pytest.fail("stream() returned instead of raising Cancelled")
        assert scope.cancelled_caught
        await server.client_disconnected.wait()
        assert trio.current_time() - cancelled_at < 1.0
    assert chunks == [TextDelta("Hello")]
    assert server.disconnects == 1
    gc.collect()


async def test_a_whole_message_body_is_read_as_its_blocks(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    # Servers that ignore stream: true (LiteLLM's mock responses) answer with the whole Message.
    message = {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "content": [
            {"type": "thinking", "thinking": "hmm", "signature": SIGNATURE},
            {"type": "text", "text": "Reading."},
            {"type": "tool_use", "id": "toolu_a", "name": "read", "input": {"path": "a"}},
        ],
        "stop_reason": "tool_use",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": 7, "cache_read_input_tokens": 100},
    }
    server = await start_server(nursery, Respond(200, message), Respond(200, {"type": "message"}))
    provider = make_provider(server)
    assert await collect(provider) == [
        ReasoningDelta("hmm"),
        ReasoningBlock("anthropic", {"index": 0, "block": message["content"][0], "before": NOTHING_BEFORE}),  # type: ignore[index]
        TextDelta("Reading."),
        ToolCallDelta(index=0, id="toolu_a", name="read"),
        ToolCallDelta(index=0, arguments='{"path": "a"}'),
        Usage(input_tokens=105, output_tokens=7, cache_hit_tokens=100),
        Finish("tool-calls"),
    ]
    finish = (await collect(provider))[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert finish.failure.code == "malformed-stream" and "expected an event stream" in finish.failure.message


async def test_a_route_without_images_refuses_them_naming_the_model() -> None:
    chunks: list[Chunk] = []
    request = ModelRequest(model="", system="", messages=(UserMessage("x", images=(Image(b"GIF89a", "image/gif"),)),))
    await make(supports_images=False).stream(request, chunks.append)
    (finish,) = chunks
    assert isinstance(finish, Finish) and finish.failure is not None
    assert finish.failure.code == "images-unsupported" and "claude-test" in finish.failure.message


MODEL = "claude-sonnet-4-5"


def test_cost_prices_cache_reads_and_writes() -> None:
    pytest.importorskip("genai_prices")
    from trio_harness.model._cost import price_route, usage_cost
    from trio_harness.model._protocol import UsageTotals

    provider = resolve_model(f"anthropic:{MODEL}", env={"ANTHROPIC_API_KEY": "k"})
    prefix, url = price_route(provider)
    assert (prefix, url) == ("anthropic", None)
    plain = usage_cost(UsageTotals(input_tokens=1_000_000), MODEL, provider=prefix)
    read = usage_cost(UsageTotals(input_tokens=1_000_000, cache_hit_tokens=1_000_000), MODEL, provider=prefix)
    written = usage_cost(UsageTotals(input_tokens=1_000_000, cache_write_tokens=1_000_000), MODEL, provider=prefix)
    assert plain is not None and read is not None and written is not None
    assert read < plain < written  # reads at a tenth, writes at 1.25x the input price


def test_acp_key_authentication_gives_the_key_to_an_anthropic_provider() -> None:
    from trio_harness.acp._auth import EnvKeyAuth

    provider = resolve_model("anthropic:claude-test", env={}, require_key=False)
    assert isinstance(provider, AnthropicProvider) and provider.api_key is None
    auth = EnvKeyAuth("ANTHROPIC_API_KEY", provider, env={"ANTHROPIC_API_KEY": "sk-ant"})
    assert auth.method()["link"].startswith("https://console.anthropic.com")
    assert auth("env:ANTHROPIC_API_KEY") is True
    assert provider.api_key == "sk-ant"


def test_tool_results_lead_their_turn_and_empty_assistant_messages_are_left_out() -> None:
    request = ModelRequest(
        model="",
        system="",
        messages=(
            UserMessage("go"),
            AssistantMessage("", tool_calls=(ToolCall("t1", "ls", "{}"),)),
            UserMessage("also this"),  # steered in while the tool ran
            ToolMessage("t1", "ls", ""),
            AssistantMessage(""),  # an empty step: no content block may be empty
            UserMessage("next"),
        ),
    )
    messages = make(prompt_caching=False).build_body(request)["messages"]
    assert messages == [
        {"role": "user", "content": [{"type": "text", "text": "go"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "id": "t1", "name": "ls", "input": {}}]},
        {
            "role": "user",
            "content": [
                {"type": "tool_result", "tool_use_id": "t1"},
                {"type": "text", "text": "also this"},
                {"type": "text", "text": "next"},
            ],
        },
    ]


@pytest.mark.parametrize("stream", [THINKING, TOOL_USE], ids=["thinking", "tool_use"])
def test_every_two_piece_split_gives_the_same_chunks(stream: list[bytes]) -> None:
    data = b"".join(stream)
    expected = parse([data])
    for cut in range(1, len(data)):
        decoder = SSEDecoder()
        parser = AnthropicStreamParser("test")
        chunks: list[Chunk] = []
        parser.feed_into(decoder.feed_bytes(data[:cut]), chunks.append)
        parser.feed_into(decoder.feed_bytes(data[cut:]), chunks.append)
        chunks.extend(parser.feed_end(decoder.close()))
        assert (chunks, parser.conclude(), parser.usage) == expected, cut


def test_claude_models_have_a_known_context_window() -> None:
    assert AnthropicProvider(model="claude-sonnet-4-5-20250929").context_window == 200_000
    assert AnthropicProvider(model="claude-test", context_window=50_000).context_window == 50_000


PAUSED = Stream(
    [
        message_start(10, 1),
        block_start(0, {"type": "text", "text": ""}),
        text(0, "Searching."),
        block_stop(0),
        block_start(1, {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": '{"query": '}),
        delta(1, {"type": "input_json_delta", "partial_json": '"trio"}'}),
        block_stop(1),
        message_delta("pause_turn", 5),
        MESSAGE_STOP,
    ]
)
CONTINUED = Stream(
    [
        message_start(20, 1, cache_read_input_tokens=3),
        block_start(0, {"type": "thinking", "thinking": ""}),
        delta(0, {"type": "thinking_delta", "thinking": "read it"}),
        delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
        block_stop(0),
        block_start(1, {"type": "tool_use", "id": "toolu_r", "name": "read", "input": {}}),
        delta(1, {"type": "input_json_delta", "partial_json": '{"path": "a"}'}),
        block_stop(1),
        message_delta("tool_use", 7),
        MESSAGE_STOP,
    ]
)


async def test_a_paused_turn_is_continued_with_its_content_so_far(
    nursery: trio.Nursery, make_provider: MakeProvider
) -> None:
    server = await start_server(nursery, PAUSED, CONTINUED)
    chunks = await collect(make_provider(server), LOOP)
    thought = {"type": "thinking", "thinking": "read it", "signature": SIGNATURE}
    search = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "trio"}}
    after_text = {"text": len("Searching."), "tool_calls": 0}
    assert chunks == [
        TextDelta("Searching."),
        # The server tool's call is no call for the harness to make, but a block to send back.
        ReasoningBlock("anthropic", {"index": 1, "block": search, "before": after_text}),
        ReasoningDelta("read it"),
        # Numbered after the first part's blocks, its text counted.
        ReasoningBlock("anthropic", {"index": 2, "block": thought, "before": after_text}),
        ToolCallDelta(index=0, id="toolu_r", name="read"),
        ToolCallDelta(index=0, arguments='{"path": "a"}'),
        Usage(input_tokens=33, output_tokens=12, cache_hit_tokens=3),  # both requests
        Finish("tool-calls"),
    ]
    first, second = (json.loads(request.body) for request in server.requests)
    assert second["messages"][:-1] == first["messages"]
    assert second["messages"][-1] == {
        "role": "assistant",
        "content": [
            {"type": "text", "text": "Searching."},
            {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {"query": "trio"}},
        ],
    }
    assert {key: value for key, value in second.items() if key != "messages"} == {
        key: value for key, value in first.items() if key != "messages"
    }
    # The next request sends the whole turn back in the order received: the thinking block of the
    # continuation before its tool_use (it landed after it: its index counted the server tool's block).
    blocks = tuple(chunk for chunk in chunks if isinstance(chunk, ReasoningBlock))
    message = AssistantMessage("Searching.", (ToolCall("toolu_r", "read", '{"path": "a"}'),), reasoning_blocks=blocks)
    body = make().build_body(ModelRequest(model="", system="", messages=(UserMessage("look"), message)))
    assert body["messages"][1]["content"] == [
        {"type": "text", "text": "Searching."},
        search,
        thought,
        {"type": "tool_use", "id": "toolu_r", "name": "read", "input": {"path": "a"}},
    ]


async def test_pauses_beyond_max_pause_continuations_fail(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, PAUSED)
    chunks = await collect(make_provider(server, max_pause_continuations=1))
    finish = chunks[-1]
    assert isinstance(finish, Finish) and finish.failure is not None and finish.failure.code == "pause-turn"
    assert "again after max_pause_continuations=1 continuations" in finish.failure.message
    assert chunks[-2] == Usage(input_tokens=20, output_tokens=10)
    assert len(server.requests) == 2


async def test_a_200_page_that_is_no_event_stream_is_named_and_not_retried(
    nursery: trio.Nursery, make_provider: MakeProvider
) -> None:
    page = b"<html>\n\n<body>Sign in" + b"." * 300  # blank lines but no data line; quoted in part
    server = await start_server(nursery, Stream([page], content_type="text/html; charset=utf-8"))
    chunks = await collect(make_provider(server, max_retries=3))
    finish = chunks[-1]
    assert isinstance(finish, Finish) and finish.failure is not None
    assert (finish.failure.code, finish.failure.retryable) == ("malformed-stream", False)
    assert "expected an event stream, got content-type 'text/html; charset=utf-8' and no event: " in (
        finish.failure.message
    )
    assert repr(page[:200].decode()) in finish.failure.message and len(server.requests) == 1
