"""ResponsesProvider against a real HTTP server on 127.0.0.1 (tests/_sse_server.py).

The streams are tests/_responses_fixtures.py's, shaped after OpenAI's
published examples; the parser alone is tested in tests/test_responses_stream.py.
The HTTP loop is OpenAIProvider's (tests/test_openai_provider.py): the tests
here check that the Responses route keeps its guarantees (retries,
Retry-After, cancellation) and its wire format.
"""

from __future__ import annotations

import base64
import gc
import json
import math
import random
from collections.abc import AsyncIterator, Callable
from typing import Any

import pytest
import trio
import trio.testing
from _responses_fixtures import REASONING_ITEM, failed_stream, reasoning_call_stream, text_stream
from _sse_server import Pause, Respond, ScriptedServer, Stream, start_server

from trio_harness._errors import ModelError
from trio_harness.model import (
    AssistantMessage,
    Chunk,
    Failure,
    Finish,
    Image,
    ModelProvider,
    ModelRequest,
    ModelSettings,
    OutputFormat,
    ReasoningBlock,
    ResponseInfo,
    ResponsesProvider,
    Retry,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolMessage,
    ToolSpec,
    Usage,
    UserMessage,
    resolve_model,
)
from trio_harness.model._spec import missing_api_key

REQUEST = ModelRequest(model="", system="", messages=(UserMessage("hi"),))
NO_TIMEOUTS: dict[str, Any] = {"request_timeout": math.inf, "connect_timeout": math.inf, "read_timeout": math.inf}
PNG = b"\x89PNG\r\n\x1a\n" + b"\0" * 16

MakeProvider = Callable[..., ResponsesProvider]


@pytest.fixture
async def make_provider() -> AsyncIterator[MakeProvider]:
    made: list[ResponsesProvider] = []

    def make(target: ScriptedServer | str, **kwargs: Any) -> ResponsesProvider:
        base_url = target.base_url if isinstance(target, ScriptedServer) else target
        options: dict[str, Any] = {
            "model": "gpt-5",
            "base_url": base_url,
            "api_key": "sk-test",
            "name": "test:gpt-5",
            "rng": random.Random(1234),
            "max_retries": 0,
        }
        options.update(kwargs)
        provider = ResponsesProvider(**options)
        made.append(provider)
        return provider

    yield make
    for provider in made:
        await provider.aclose()


async def collect(
    provider: ResponsesProvider, request: ModelRequest = REQUEST, *, guard: float | None = 10.0, info: bool = False
) -> list[Chunk]:
    chunks: list[Chunk] = []
    if guard is None:
        await provider.stream(request, chunks.append)
    else:
        with trio.fail_after(guard):
            await provider.stream(request, chunks.append)
    assert isinstance(chunks[-1], Finish)
    assert sum(isinstance(chunk, Finish) for chunk in chunks) == 1
    # At most one ResponseInfo, after the output; left out unless asked for (``info=True``).
    assert sum(isinstance(chunk, ResponseInfo) for chunk in chunks) <= 1
    if not info:
        chunks = [chunk for chunk in chunks if not isinstance(chunk, ResponseInfo)]
    gc.collect()
    return chunks


def failure_of(chunks: list[Chunk]) -> Failure:
    finish = chunks[-1]
    assert isinstance(finish, Finish)
    assert finish.reason == "error"
    assert finish.failure is not None
    return finish.failure


async def test_is_a_model_provider(make_provider: MakeProvider) -> None:
    provider = make_provider("http://127.0.0.1:1/v1")
    assert isinstance(provider, ModelProvider)
    assert provider.url == "http://127.0.0.1:1/v1/responses"
    assert provider.context_window == 400_000  # from the model catalog
    assert provider.supports_images
    assert provider.json_schema_output


async def test_text_stream(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(text_stream(cached=4)))
    chunks = await collect(make_provider(server))
    assert chunks == [
        TextDelta("Hi"),
        TextDelta(" there"),
        TextDelta("!"),
        Usage(input_tokens=37, output_tokens=11, cache_hit_tokens=4),
        Finish("stop"),
    ]
    (request,) = server.requests
    assert (request.method, request.path) == ("POST", "/v1/responses")
    assert request.headers["authorization"] == "Bearer sk-test"
    assert request.headers["accept"] == "text/event-stream"


async def test_reasoning_and_function_call(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(reasoning_call_stream()))
    chunks = await collect(make_provider(server))
    before = {"text": 0, "tool_calls": 0}
    assert ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": before}) in chunks
    calls = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert calls[0] == ToolCallDelta(index=0, id="call_12345xyz", name="get_weather", arguments="")
    assert "".join(call.arguments for call in calls) == '{"location":"Paris, France"}'
    assert chunks[-2:] == [
        Usage(input_tokens=80, output_tokens=150, cache_hit_tokens=64, reasoning_tokens=128),
        Finish("tool-calls"),
    ]


def _turn_request() -> ModelRequest:
    reasoning = json.loads(json.dumps(REASONING_ITEM))  # as the log reads it back
    return ModelRequest(
        model="",
        system="Be brief.",
        messages=(
            UserMessage("What is in this picture, and the weather in Paris?", images=(Image(PNG, "image/png"),)),
            AssistantMessage(
                "Let me check.",
                tool_calls=(ToolCall("call_12345xyz", "get_weather", '{"location":"Paris, France"}'),),
                reasoning_blocks=(
                    ReasoningBlock("anthropic", {"type": "thinking", "thinking": "x", "signature": "s"}),
                    ReasoningBlock("openai-responses", reasoning),
                ),
            ),
            ToolMessage("call_12345xyz", "get_weather", "18C, sunny"),
        ),
        tools=(ToolSpec("get_weather", "The weather of a place.", {"type": "object", "properties": {}}),),
        settings=ModelSettings(max_tokens=500, temperature=0.5, reasoning_effort="low", parallel_tool_calls=False),
        output=OutputFormat(
            "Answer",
            {
                "type": "object",
                "properties": {"text": {"type": "string"}},
                "required": ["text"],
                "additionalProperties": False,
            },
        ),
    )


async def test_request_wire_format(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(text_stream()))
    await collect(make_provider(server, reasoning_summary="auto"), _turn_request())
    assert server.requests[0].json == {
        "model": "gpt-5",
        "instructions": "Be brief.",
        "input": [
            {
                "role": "user",
                "content": [
                    {"type": "input_text", "text": "What is in this picture, and the weather in Paris?"},
                    {"type": "input_image", "image_url": "data:image/png;base64," + base64.b64encode(PNG).decode()},
                ],
            },
            # Only this provider's own blocks go back, as received, before the text and the calls.
            REASONING_ITEM,
            {"role": "assistant", "content": "Let me check."},
            {
                "type": "function_call",
                "call_id": "call_12345xyz",
                "name": "get_weather",
                "arguments": '{"location":"Paris, France"}',
            },
            {"type": "function_call_output", "call_id": "call_12345xyz", "output": "18C, sunny"},
        ],
        "stream": True,
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "tools": [
            {
                "type": "function",
                "name": "get_weather",
                "description": "The weather of a place.",
                "parameters": {"type": "object", "properties": {}},
                "strict": False,
            }
        ],
        "max_output_tokens": 500,
        "temperature": 0.5,
        "reasoning": {"effort": "low", "summary": "auto"},
        "parallel_tool_calls": False,
        "text": {
            "format": {
                "type": "json_schema",
                "name": "Answer",
                "schema": _turn_request().output.schema,  # type: ignore[union-attr]
                "strict": True,
            }
        },
    }


async def test_same_request_same_bytes(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    """Replay and resume rebuild the request from the log: equal requests send identical bytes."""
    server = await start_server(nursery, Stream(text_stream()))
    provider = make_provider(server)
    await collect(provider, _turn_request())
    await collect(provider, _turn_request())
    assert server.requests[0].body == server.requests[1].body


async def test_minimal_request_and_store(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(text_stream()))
    await collect(make_provider(server, model="gpt-4o"))  # not a reasoning model: no include
    await collect(make_provider(server, store=True))
    assert server.requests[0].json == {
        "model": "gpt-4o",
        "input": [{"role": "user", "content": "hi"}],
        "stream": True,
        "store": False,
    }
    assert "include" not in server.requests[1].json
    assert server.requests[1].json["store"] is True


@pytest.mark.parametrize(("settings", "field"), [(ModelSettings(seed=1), "seed"), (ModelSettings(stop="x"), "stop")])
async def test_unsupported_settings_fail_naming_them(
    nursery: trio.Nursery, make_provider: MakeProvider, settings: ModelSettings, field: str
) -> None:
    server = await start_server(nursery, Stream(text_stream()))
    provider = make_provider(server)
    request = ModelRequest(model="", system="", messages=(UserMessage("hi"),), settings=settings)
    failure = failure_of(await collect(provider, request))
    assert failure.code == "unsupported-setting"
    assert repr(field) in failure.message
    assert server.requests == []
    with pytest.raises(ModelError, match=field):
        provider.build_body(request)


async def test_images_refused_for_a_text_only_model(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(text_stream()))
    provider = make_provider(server, model="o3-mini")
    assert not provider.supports_images
    request = ModelRequest(model="", system="", messages=(UserMessage("look", images=(Image(PNG, "image/png"),)),))
    failure = failure_of(await collect(provider, request))
    assert failure.code == "images-unsupported"
    assert "'o3-mini'" in failure.message
    assert server.requests == []


async def test_retry_after_429(
    nursery: trio.Nursery, make_provider: MakeProvider, autojump_clock: trio.testing.MockClock
) -> None:
    server = await start_server(
        nursery,
        Respond(429, {"error": {"message": "Rate limit reached", "code": "rate_limit_exceeded"}}, {"retry-after": "3"}),
        Stream(text_stream()),
    )
    provider = make_provider(server, max_retries=2, **NO_TIMEOUTS)
    start = trio.current_time()
    chunks = await collect(provider, guard=None)
    retry = chunks[0]
    assert isinstance(retry, Retry)
    assert (retry.attempt, retry.delay, retry.failure.code) == (1, 3.0, "http-429")
    assert "Rate limit reached" in retry.failure.message
    assert chunks[-1] == Finish("stop")
    assert 3.0 <= trio.current_time() - start < 4.0
    assert len(server.requests) == 2


async def test_failed_response_before_output_is_retried(
    nursery: trio.Nursery, make_provider: MakeProvider, autojump_clock: trio.testing.MockClock
) -> None:
    server = await start_server(nursery, Stream(failed_stream()), Stream(text_stream()))
    chunks = await collect(make_provider(server, max_retries=1, **NO_TIMEOUTS), guard=None)
    assert isinstance(chunks[0], Retry)
    assert chunks[0].failure.code == "stream-error"
    assert chunks[-1] == Finish("stop")


async def test_failed_response_not_retryable(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream(failed_stream("invalid_prompt", "Invalid prompt.")))
    failure = failure_of(await collect(make_provider(server, max_retries=3)))
    assert "Invalid prompt. (invalid_prompt)" in failure.message
    assert len(server.requests) == 1


async def test_malformed_stream_is_an_error(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    server = await start_server(nursery, Stream([*text_stream()[:5], b"event: x\ndata: {oops\n\n"]))
    chunks = await collect(make_provider(server))
    assert chunks[0] == TextDelta("Hi")
    assert failure_of(chunks).code == "malformed-stream"


async def test_cancel_mid_stream_closes_the_connection(nursery: trio.Nursery, make_provider: MakeProvider) -> None:
    pieces = text_stream()
    server = await start_server(nursery, Stream([*pieces[:5], Pause(1000.0), *pieces[5:]]))
    provider = make_provider(server)
    chunks: list[Chunk] = []
    got_first = trio.Event()
    cancelled_at = math.inf

    def emit(chunk: Chunk) -> None:
        chunks.append(chunk)
        got_first.set()

    async def cancel_after_first(scope: trio.CancelScope) -> None:
        nonlocal cancelled_at
        await got_first.wait()
        await trio.testing.wait_all_tasks_blocked()  # stream() waits for its next read
        cancelled_at = trio.current_time()
        scope.cancel()

    with trio.fail_after(10):
        with trio.CancelScope() as scope:
            nursery.start_soon(cancel_after_first, scope)
            await provider.stream(REQUEST, emit)
            pytest.fail("stream() returned instead of raising Cancelled")
        assert scope.cancelled_caught
        await server.client_disconnected.wait()
        assert trio.current_time() - cancelled_at < 1.0  # at once
    assert chunks == [TextDelta("Hi")]
    assert server.disconnects == 1
    gc.collect()
    # The provider still works afterwards.
    server.script = [Stream(text_stream())]
    assert (await collect(provider))[-1] == Finish("stop")


def test_spec_forms() -> None:
    provider = resolve_model("openai-responses:gpt-5?reasoning_effort=high", env={"OPENAI_API_KEY": "sk"})
    assert isinstance(provider, ResponsesProvider)
    assert (provider.name, provider.url, provider.api_key) == (
        "openai-responses:gpt-5",
        "https://api.openai.com/v1/responses",
        "sk",
    )
    assert provider.settings == ModelSettings(reasoning_effort="high")
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        resolve_model("openai-responses:gpt-5", env={})
    assert missing_api_key("openai-responses:gpt-5", env={}) == "OPENAI_API_KEY"
    local = resolve_model("openai-responses:my-model@http://127.0.0.1:4000/v1", env={})
    assert isinstance(local, ResponsesProvider)
    assert (local.url, local.api_key, local.context_window) == ("http://127.0.0.1:4000/v1/responses", None, None)
    assert missing_api_key("openai-responses:m@http://127.0.0.1:4000/v1", env={}) is None
    with pytest.raises(ModelError, match="names no model"):
        resolve_model("openai-responses:", env={"OPENAI_API_KEY": "sk"})
    with pytest.raises(ModelError, match="must start with http"):
        resolve_model("openai-responses:m@localhost:4000", env={})


def test_strict_only_for_strict_compatible_schemas() -> None:
    provider = ResponsesProvider(model="gpt-5", base_url="http://127.0.0.1:1/v1")

    def format_of(schema: dict[str, Any], **kwargs: Any) -> Any:
        request = ModelRequest("", "", (UserMessage("hi"),), output=OutputFormat("Answer", schema))
        return (
            ResponsesProvider(model="gpt-5", base_url="http://127.0.0.1:1/v1", **kwargs).build_body(request).get("text")
        )

    closed = {
        "type": "object",
        "properties": {"a": {"type": "integer"}},
        "required": ["a"],
        "additionalProperties": False,
    }
    assert format_of(closed)["format"]["strict"] is True
    open_object = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
    assert format_of(open_object)["format"]["strict"] is False
    optional = {**closed, "required": []}
    assert format_of(optional)["format"]["strict"] is False
    nested = {**closed, "properties": {"a": {"type": "object", "properties": {"b": {"type": "string"}}}}}
    assert format_of(nested)["format"]["strict"] is False
    referenced = {**closed, "properties": {"a": {"$ref": "#/$defs/A"}}, "$defs": {"A": {"type": "string"}}}
    assert format_of(referenced)["format"]["strict"] is False
    assert format_of(closed, output_format="json_object") == {"format": {"type": "json_object"}}
    assert format_of(closed, output_format="none") is None
    assert provider.json_schema_output


def test_catalog_turns_images_off() -> None:
    assert ResponsesProvider(model="gpt-3.5-turbo", base_url="http://127.0.0.1:1/v1").supports_images is False
    assert ResponsesProvider(model="my-local-model", base_url="http://127.0.0.1:1/v1").supports_images is True
    chat = resolve_model("openai:o3-mini", env={"OPENAI_API_KEY": "k"})
    assert getattr(chat, "supports_images", None) is False


async def test_a_200_page_that_is_no_event_stream_is_named_and_not_retried(
    nursery: trio.Nursery, make_provider: MakeProvider
) -> None:
    # Review finding: a proxy's HTML page (200, text/html, no trailing newline) was read as a stream
    # cut mid-line, "truncated-stream", and retried max_retries times with backoff.
    server = await start_server(nursery, Stream([b"<html>Sign in</html>"], content_type="text/html"))
    chunks = await collect(make_provider(server, max_retries=3))
    assert not any(isinstance(chunk, Retry) for chunk in chunks)
    failure = failure_of(chunks)
    assert (failure.code, failure.retryable) == ("malformed-stream", False)
    assert "expected an event stream, got content-type 'text/html' and no event: '<html>Sign in</html>'" in (
        failure.message
    )
    assert len(server.requests) == 1


def test_a_reasoning_item_without_encrypted_content_is_not_sent_back_with_store_off() -> None:
    # Review finding: with store: false the server keeps nothing, so such an item (no
    # include asked for it: a model the catalog calls non-reasoning, a gateway) made every later
    # request fail with "Item with id 'rs_...' not found"; with store on it goes back by id.
    bare = {"id": "rs_bare", "type": "reasoning", "summary": []}
    message = AssistantMessage(
        "Checking.",
        tool_calls=(ToolCall("call_1", "get_weather", "{}"),),
        reasoning_blocks=(
            ReasoningBlock("openai-responses", {"item": bare, "before": {"text": 0, "tool_calls": 0}}),
            ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": {"text": 9, "tool_calls": 0}}),
            ReasoningBlock("openai-responses", bare),  # an older log's shape
        ),
    )
    request = ModelRequest(model="", system="", messages=(UserMessage("hi"), message))
    call = {"type": "function_call", "call_id": "call_1", "name": "get_weather", "arguments": "{}"}
    text = {"role": "assistant", "content": "Checking."}
    provider = ResponsesProvider(model="gpt-5", base_url="http://127.0.0.1:1/v1", api_key="k")
    assert provider.input_items(request)[1:] == [text, REASONING_ITEM, call]
    stored = ResponsesProvider(model="gpt-5", base_url="http://127.0.0.1:1/v1", api_key="k", store=True)
    assert stored.input_items(request)[1:] == [bare, bare, text, REASONING_ITEM, call]


def test_a_hosted_tools_item_goes_back_in_place_only_with_store_on() -> None:
    search = {"id": "ws_1", "type": "web_search_call", "status": "completed", "action": {"type": "search"}}
    message = AssistantMessage(
        "Found it.",
        reasoning_blocks=(
            ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": {"text": 0, "tool_calls": 0}}),
            ReasoningBlock("openai-responses", {"item": search, "before": {"text": 0, "tool_calls": 0}}),
        ),
    )
    request = ModelRequest(model="", system="", messages=(UserMessage("hi"), message))
    text = {"role": "assistant", "content": "Found it."}
    base = "http://127.0.0.1:1/v1"
    assert ResponsesProvider(model="gpt-5", base_url=base).input_items(request)[1:] == [REASONING_ITEM, text]
    stored = ResponsesProvider(model="gpt-5", base_url=base, store=True)
    assert stored.input_items(request)[1:] == [REASONING_ITEM, search, text]
