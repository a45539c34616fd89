"""AnthropicStreamParser on streams the Messages spec does not allow, and on open blocks at message_stop.

Each event names the content block it adds to by ``index``; a delta carries
the block's own kind of content (text_delta for text, input_json_delta for
tool_use and server_tool_use, thinking_delta and signature_delta for
thinking).  A stream that breaks that is a ``malformed-stream`` failure, a
value naming what was wrong, never an exception out of the parser and never
text of one block glued onto another.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest
from _anthropic_streams import (
    MESSAGE_STOP,
    SIGNATURE,
    TOOL_ID,
    block_start,
    block_stop,
    delta,
    event,
    message_delta,
    message_start,
    text,
)

from trio_harness.model._anthropic import assistant_content
from trio_harness.model._anthropic_stream import AnthropicStreamParser
from trio_harness.model._chunks import ChunkParser
from trio_harness.model._http import StreamParser
from trio_harness.model._protocol import (
    AssistantMessage,
    Chunk,
    Failure,
    Finish,
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from trio_harness.model._responses_stream import ResponsesParser
from trio_harness.model._sse import SSEDecoder, SSEEvent


def parse(pieces: list[bytes]) -> tuple[list[Chunk], Finish | Failure]:
    decoder = SSEDecoder()
    parser = AnthropicStreamParser("test")
    chunks: list[Chunk] = []
    parser.feed_into(decoder.feed_bytes(b"".join(pieces)), chunks.append)
    chunks.extend(parser.feed_end(decoder.close()))
    return chunks, parser.conclude()


TEXT = {"type": "text", "text": ""}
TOOL = {"type": "tool_use", "id": TOOL_ID, "name": "get_weather", "input": {}}
THINK = {"type": "thinking", "thinking": ""}


@pytest.mark.parametrize("index", [[0], {"i": 0}, "0", None, 1.5])
def test_a_text_delta_with_a_bad_index_is_a_malformed_stream(index: object) -> None:
    bad = event({"type": "content_block_delta", "index": index, "delta": {"type": "text_delta", "text": "x"}})
    chunks, outcome = parse([message_start(), block_start(0, TEXT), text(0, "a"), bad])
    assert chunks == [TextDelta("a")]
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream", outcome
    assert "index" in outcome.message


@pytest.mark.parametrize(
    ("block", "body", "kind"),
    [
        (TOOL, {"type": "text_delta", "text": "x"}, "tool_use"),
        (THINK, {"type": "text_delta", "text": "x"}, "thinking"),
        (TEXT, {"type": "input_json_delta", "partial_json": '{"a": 1}'}, "text"),
        (TEXT, {"type": "thinking_delta", "thinking": "hmm"}, "text"),
        (TOOL, {"type": "thinking_delta", "thinking": "hmm"}, "tool_use"),
        (TEXT, {"type": "signature_delta", "signature": SIGNATURE}, "text"),
    ],
)
def test_a_delta_of_another_kind_of_block_is_a_malformed_stream(
    block: dict[str, object], body: dict[str, object], kind: str
) -> None:
    _chunks, outcome = parse([message_start(), block_start(0, block), delta(0, body), block_stop(0)])
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream", outcome
    assert f"{body['type']} for content block 0, a {kind} block" in outcome.message


def test_server_tool_use_takes_input_json_deltas() -> None:
    server = {"type": "server_tool_use", "id": "srvtoolu_1", "name": "web_search", "input": {}}
    pieces = [
        message_start(),
        block_start(0, server),
        delta(0, {"type": "input_json_delta", "partial_json": ""}),
        delta(0, {"type": "input_json_delta", "partial_json": '{"query": "trio"}'}),
        block_stop(0),
        message_delta("end_turn", 3),
        MESSAGE_STOP,
    ]
    decoder = SSEDecoder()
    parser = AnthropicStreamParser("test")
    # Not a call for the harness: a block to send back as it came.
    done = {**server, "input": {"query": "trio"}}
    before = {"text": 0, "tool_calls": 0}
    assert parser.feed_all(decoder.feed_bytes(b"".join(pieces))) == [
        ReasoningBlock("anthropic", {"index": 0, "block": done, "before": before})
    ]
    assert parser.conclude() == Finish("stop")
    assert parser.content == [done]


def test_blocks_still_open_at_message_stop_are_completed() -> None:
    # message_stop ends the message: a block the server did not stop is complete as it is (in index
    # order), so a call without arguments still gets "{}" and a thinking block still goes back.
    chunks, outcome = parse(
        [
            message_start(),
            block_start(0, THINK),
            delta(0, {"type": "thinking_delta", "thinking": "hmm"}),
            delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
            block_start(1, TOOL),
            delta(1, {"type": "input_json_delta", "partial_json": ""}),
            message_delta("tool_use", 9),
            MESSAGE_STOP,
        ]
    )
    assert outcome == Finish("tool-calls")
    assert chunks == [
        ReasoningDelta("hmm"),
        ToolCallDelta(index=0, id=TOOL_ID, name="get_weather"),
        ReasoningBlock(
            "anthropic",
            {
                "index": 0,
                "block": {**THINK, "thinking": "hmm", "signature": SIGNATURE},
                "before": {"text": 0, "tool_calls": 0},  # the text and calls before it, counted at its start
            },
        ),
        ToolCallDelta(index=0, arguments="{}"),
    ]


def test_an_empty_first_input_json_delta_is_no_argument_fragment() -> None:
    chunks, outcome = parse(
        [
            message_start(),
            block_start(0, TOOL),
            delta(0, {"type": "input_json_delta", "partial_json": ""}),
            delta(0, {"type": "input_json_delta", "partial_json": '{"location": "SF"}'}),
            block_stop(0),
            message_delta("tool_use", 9),
            MESSAGE_STOP,
        ]
    )
    assert outcome == Finish("tool-calls")
    calls = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert [call.arguments for call in calls] == ["", '{"location": "SF"}']
    assert json.loads("".join(call.arguments for call in calls)) == {"location": "SF"}


def test_blocks_still_open_when_a_stream_ends_after_its_stop_reason_are_completed() -> None:
    chunks, outcome = parse([message_start(), block_start(0, TOOL), message_delta("tool_use", 9)])
    assert outcome == Finish("tool-calls")
    assert chunks == [ToolCallDelta(index=0, id=TOOL_ID, name="get_weather"), ToolCallDelta(index=0, arguments="{}")]


def test_a_block_index_used_twice_is_a_malformed_stream() -> None:
    # Each index is one block of the final content: a second start at a stopped one would replace it
    # (a thinking block reported twice, at one position).
    _chunks, outcome = parse(
        [message_start(), block_start(0, TEXT), text(0, "a"), block_stop(0), block_start(0, TEXT), text(0, "b")]
    )
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream", outcome
    assert "content block 0 started twice" in outcome.message


def test_message_delta_usage_is_cumulative_not_added() -> None:
    # Several message_delta events (server tools send them): each carries the totals so far.
    decoder = SSEDecoder()
    parser = AnthropicStreamParser("test")
    pieces = [
        message_start(10, 1),
        event({"type": "ping"}),
        message_delta(None, 5),
        message_delta("end_turn", 9, input_tokens=12, cache_read_input_tokens=100),
        MESSAGE_STOP,
    ]
    assert parser.feed_all(decoder.feed_bytes(b"".join(pieces))) == []
    assert parser.conclude() == Finish("stop")
    assert parser.usage == Usage(input_tokens=112, output_tokens=9, cache_hit_tokens=100)


DEEP = "[" * 100_000 + "]" * 100_000
"""JSON nested deeper than the parser's recursion limit (json raises RecursionError, not ValueError)."""


@pytest.mark.parametrize("parser_class", [AnthropicStreamParser, ResponsesParser, ChunkParser])
def test_json_nested_too_deep_is_a_malformed_stream_not_a_crash(parser_class: Callable[[str], StreamParser]) -> None:
    # Review finding: a RecursionError escaped every parser (and so the provider's stream()).
    parser = parser_class("test")
    chunks: list[Chunk] = []
    parser.feed_into([SSEEvent(DEEP)], chunks.append)
    assert chunks == []
    outcome = parser.conclude()
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream", outcome
    whole = parser_class("test")
    assert whole.feed_body(DEEP.encode()) == []
    outcome = whole.conclude()
    assert isinstance(outcome, Failure) and outcome.code == "malformed-stream", outcome


def test_tool_arguments_nested_too_deep_go_back_as_an_empty_input() -> None:
    message = AssistantMessage("", tool_calls=(ToolCall("toolu_1", "ls", DEEP),))
    assert assistant_content(message) == [{"type": "tool_use", "id": "toolu_1", "name": "ls", "input": {}}]
    stream = [
        message_start(),
        block_start(0, TOOL),
        delta(0, {"type": "input_json_delta", "partial_json": DEEP}),
        block_stop(0),
        message_delta("tool_use", 9),
        MESSAGE_STOP,
    ]
    parser = AnthropicStreamParser("test")
    parser.feed_all(SSEDecoder().feed_bytes(b"".join(stream)))
    assert parser.conclude() == Finish("tool-calls")
    assert parser.content == [{**TOOL, "input": {}}]
