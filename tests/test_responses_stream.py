"""The Responses event-stream parser without I/O (trio_harness/model/_responses_stream.py)."""

from __future__ import annotations

import itertools
import json
import time

import pytest
from _responses_fixtures import (
    CALL_ITEM,
    ERROR_EVENT,
    REASONING_ITEM,
    TEXT_ITEM,
    event,
    failed_stream,
    incomplete_stream,
    reasoning_call_stream,
    text_stream,
)
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_harness.model._protocol import (
    Chunk,
    Failure,
    Finish,
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from trio_harness.model._responses_stream import ResponsesParser
from trio_harness.model._sse import SSEDecoder, SSEEvent


def parse(pieces: list[bytes], *, cuts: list[int] | None = None) -> tuple[list[Chunk], Finish | Failure, Usage | None]:
    """Decode and parse a byte stream (optionally re-split at ``cuts``); the chunks, the outcome, the usage."""
    data = b"".join(pieces)
    if cuts is not None:
        bounds = [0, *sorted(set(cuts)), len(data)]
        pieces = [data[a:b] for a, b in itertools.pairwise(bounds)]
    decoder = SSEDecoder()
    parser = ResponsesParser("test")
    chunks: list[Chunk] = []
    for piece in pieces:
        parser.feed_into(decoder.feed_bytes(piece), chunks.append)
    chunks += parser.feed_end(decoder.close())
    return chunks, parser.conclude(), parser.usage


NOTHING_BEFORE = {"text": 0, "tool_calls": 0}


def test_text_stream() -> None:
    chunks, outcome, usage = parse(text_stream(cached=5))
    assert chunks == [TextDelta("Hi"), TextDelta(" there"), TextDelta("!")]  # .done does not repeat the text
    assert outcome == Finish("stop")
    assert usage == Usage(input_tokens=37, output_tokens=11, cache_hit_tokens=5)


def test_reasoning_then_function_call() -> None:
    chunks, outcome, usage = parse(reasoning_call_stream())
    summary = REASONING_ITEM["summary"][0]["text"]  # type: ignore[index]
    assert chunks == [
        ReasoningDelta(summary[:24]),
        ReasoningDelta(summary[24:]),
        ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": NOTHING_BEFORE}),
        # The call id is call_..., not the item id fc_...
        ToolCallDelta(index=0, id="call_12345xyz", name="get_weather", arguments=""),
        ToolCallDelta(index=0, arguments='{"location":'),
        ToolCallDelta(index=0, arguments='"Paris, France"}'),
    ]
    block = chunks[2]
    assert isinstance(block, ReasoningBlock)
    assert block.data["item"] == REASONING_ITEM  # as received, encrypted content included
    assert outcome == Finish("tool-calls")
    assert usage == Usage(input_tokens=80, output_tokens=150, cache_hit_tokens=64, reasoning_tokens=128)


@settings(max_examples=60, deadline=None)
@given(st.data())
def test_any_split_gives_the_same_result(data: st.DataObject) -> None:
    pieces = reasoning_call_stream()
    size = len(b"".join(pieces))
    cuts = data.draw(st.lists(st.integers(0, size), max_size=12))
    assert parse(pieces, cuts=cuts) == parse(pieces)


def test_whole_items_without_deltas() -> None:
    """A server that sends only the finished items (no deltas) still gives the text and the call."""
    pieces = [
        event({"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM}),
        event({"type": "response.output_item.done", "output_index": 1, "item": TEXT_ITEM}),
        event({"type": "response.output_item.done", "output_index": 2, "item": CALL_ITEM}),
        event({"type": "response.completed", "response": {"status": "completed"}}),
    ]
    chunks, outcome, _ = parse(pieces)
    assert chunks == [
        ReasoningDelta(REASONING_ITEM["summary"][0]["text"]),  # type: ignore[index]
        ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": NOTHING_BEFORE}),
        TextDelta("Hi there!"),
        ToolCallDelta(index=0, id="call_12345xyz", name="get_weather", arguments='{"location":"Paris, France"}'),
    ]
    assert outcome == Finish("tool-calls")


def test_done_completes_partial_arguments() -> None:
    pieces = [
        event({"type": "response.output_item.added", "output_index": 0, "item": {**CALL_ITEM, "arguments": ""}}),
        event({"type": "response.function_call_arguments.delta", "output_index": 0, "delta": '{"loc'}),  # no item_id
        event({"type": "response.function_call_arguments.done", "item_id": "fc_12345xyz", "arguments": '{"loc":1}'}),
        event({"type": "response.completed", "response": {"status": "completed"}}),
    ]
    chunks, outcome, _ = parse(pieces)
    assert chunks[1:] == [ToolCallDelta(index=0, arguments='{"loc'), ToolCallDelta(index=0, arguments='":1}')]
    assert outcome == Finish("tool-calls")


def test_data_only_stream_with_done_marker() -> None:
    """LiteLLM's proxy writes no ``event:`` lines and ends with ``[DONE]``."""
    pieces = [piece.split(b"\n", 1)[1] for piece in text_stream()] + [b"data: [DONE]\n\n"]
    chunks, outcome, _ = parse(pieces)
    assert chunks == [TextDelta("Hi"), TextDelta(" there"), TextDelta("!")]
    assert outcome == Finish("stop")


def test_failed_response() -> None:
    chunks, outcome, _ = parse(failed_stream())
    assert chunks == []
    assert isinstance(outcome, Failure)
    assert outcome.code == "stream-error"
    assert outcome.retryable
    assert "The server had an error processing your request. (server_error)" in outcome.message


def test_failed_context_overflow_is_recognised() -> None:
    from trio_harness.model._context import is_context_overflow

    _, outcome, _ = parse(failed_stream("context_length_exceeded", "Your input exceeds the context window."))
    assert isinstance(outcome, Failure)
    assert not outcome.retryable
    assert is_context_overflow(outcome)


def test_error_event() -> None:
    chunks, outcome, _ = parse([text_stream()[0], ERROR_EVENT, *text_stream()[1:]])
    assert chunks == []  # nothing after the error is read
    assert isinstance(outcome, Failure)
    assert outcome.code == "stream-error"
    assert "Something went wrong (ERR_SOMETHING)" in outcome.message


@pytest.mark.parametrize(
    ("reason", "expected"),
    [("max_output_tokens", Finish("max-tokens")), ("content_filter", None)],
)
def test_incomplete(reason: str, expected: Finish | None) -> None:
    chunks, outcome, usage = parse(incomplete_stream(reason))
    assert chunks == [TextDelta("Hi")]
    assert usage is not None
    if expected is not None:
        assert outcome == expected
    else:
        assert isinstance(outcome, Finish)
        assert outcome.failure is not None
        assert outcome.failure.code == "refusal"


def test_refusal() -> None:
    pieces = [
        event({"type": "response.refusal.delta", "item_id": "msg_1", "output_index": 0, "delta": "I can't"}),
        event({"type": "response.refusal.done", "item_id": "msg_1", "output_index": 0, "refusal": "I can't help."}),
        event({"type": "response.completed", "response": {"status": "completed"}}),
    ]
    _, outcome, _ = parse(pieces)
    assert isinstance(outcome, Finish)
    assert outcome.failure == Failure("refusal", "test: the model refused: I can't help.")


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (b"data: {not json\n\n", "bad JSON"),
        (b"data: [1, 2]\n\n", "not a JSON object"),
        (b'data: {"delta": "x"}\n\n', "has no 'type'"),
        (b'data: {"type": "response.output_text.delta", "delta": 5}\n\n', "'delta' is not a string"),
        (
            b'data: {"type": "response.function_call_arguments.delta", "item_id": "nope", "delta": "{"}\n\n',
            "unknown item",
        ),
        (
            b'data: {"type": "response.output_item.added", "item": {"type": "function_call", "name": "f"}}\n\n',
            "needs a 'call_id'",
        ),
        (b'data: {"type": "response.completed", "response": 3}\n\n', "'response' is not an object"),
    ],
)
def test_malformed(bad: bytes, needle: str) -> None:
    chunks, outcome, _ = parse([text_stream()[4], bad, *text_stream()[5:]])
    assert chunks == [TextDelta("Hi")]  # what came before is kept
    assert isinstance(outcome, Failure)
    assert outcome.code == "malformed-stream"
    assert needle in outcome.message
    assert not outcome.retryable


def test_end_without_terminal_event() -> None:
    chunks, outcome, _ = parse(text_stream()[:-1])
    assert len(chunks) == 3
    assert isinstance(outcome, Failure)
    assert outcome.code == "no-finish"
    assert "response.completed" in outcome.message


def test_cut_mid_line_is_truncated() -> None:
    data = b"".join(text_stream())
    _, outcome, _ = parse([data[: len(data) - 40]])
    assert isinstance(outcome, Failure)
    assert (outcome.code, outcome.retryable) == ("truncated-stream", True)


def test_whole_json_body() -> None:
    parser = ResponsesParser("test")
    body = {"object": "response", "status": "completed", "output": [REASONING_ITEM, TEXT_ITEM], "usage": None}
    chunks = parser.feed_body(json.dumps(body).encode())
    assert chunks[-1] == TextDelta("Hi there!")
    assert ReasoningBlock("openai-responses", {"item": REASONING_ITEM, "before": NOTHING_BEFORE}) in chunks
    assert parser.conclude() == Finish("stop")
    error = ResponsesParser("test")
    assert error.feed_body(b'{"error": {"message": "bad key", "code": "invalid_api_key"}}') == []
    outcome = error.conclude()
    assert isinstance(outcome, Failure)
    assert "bad key" in outcome.message


def test_a_kept_item_is_anchored_where_it_was_added_or_else_where_it_is_done() -> None:
    late = {**REASONING_ITEM, "id": "rs_late"}
    pieces = [
        event({"type": "response.output_item.done", "output_index": 0, "item": TEXT_ITEM}),
        event({"type": "response.output_item.done", "output_index": 1, "item": CALL_ITEM}),
        # Added before the next message streamed, done after it: it stands where it was added.
        event({"type": "response.output_item.added", "output_index": 2, "item": {**late, "encrypted_content": None}}),
        event({"type": "response.output_text.delta", "item_id": "msg_2", "output_index": 3, "delta": "More."}),
        event({"type": "response.output_item.done", "output_index": 2, "item": late}),
        # Only done (a server that sends whole items): it stands after everything so far.
        event({"type": "response.output_item.done", "output_index": 4, "item": REASONING_ITEM}),
        event({"type": "response.completed", "response": {"status": "completed"}}),
    ]
    chunks, outcome, _ = parse(pieces)
    blocks = [chunk.data for chunk in chunks if isinstance(chunk, ReasoningBlock)]
    assert blocks == [
        {"item": late, "before": {"text": len("Hi there!"), "tool_calls": 1}},
        {"item": REASONING_ITEM, "before": {"text": len("Hi there!More."), "tool_calls": 1}},
    ]
    assert outcome == Finish("tool-calls")


def test_long_arguments_in_many_deltas_take_linear_time() -> None:
    # Review finding: each arguments delta was added to the whole text so far (a copy), so a 1.2 MB
    # argument (a file to write) in 10-character deltas stalled the event loop for about a minute.
    parser = ResponsesParser("test")
    added = {**CALL_ITEM, "arguments": ""}
    chunks: list[Chunk] = []
    parser.feed_into(
        [SSEEvent(json.dumps({"type": "response.output_item.added", "output_index": 0, "item": added}))], chunks.append
    )
    delta = SSEEvent(
        json.dumps({"type": "response.function_call_arguments.delta", "item_id": CALL_ITEM["id"], "delta": "x" * 10})
    )
    start = time.perf_counter()
    for batch in range(120):
        parser.feed_into([delta] * 1000, chunks.append)
        assert time.perf_counter() - start < 10, f"{batch * 1000} deltas in 10 s: quadratic"
    whole = "x" * 1_200_000
    done = {"type": "response.function_call_arguments.done", "item_id": CALL_ITEM["id"], "arguments": whole + "}"}
    parser.feed_into([SSEEvent(json.dumps(done))], chunks.append)
    assert chunks[-1] == ToolCallDelta(index=0, arguments="}")  # what the deltas had not sent
    assert "".join(chunk.arguments for chunk in chunks if isinstance(chunk, ToolCallDelta)) == whole + "}"


def test_deltas_keyed_by_output_index_are_not_repeated_by_the_finished_item() -> None:
    # Review finding: deltas without an item_id (some compatible servers) were remembered by their
    # output_index, the finished item looked up by its id: its whole text (and summary) came again.
    summary = REASONING_ITEM["summary"][0]["text"]  # type: ignore[index]
    pieces = [
        event({"type": "response.reasoning_summary_text.delta", "output_index": 0, "delta": summary}),
        event({"type": "response.output_item.done", "output_index": 0, "item": REASONING_ITEM}),
        event({"type": "response.output_text.delta", "output_index": 1, "delta": "Hi there!"}),
        event(
            {"type": "response.output_text.done", "item_id": TEXT_ITEM["id"], "output_index": 1, "text": "Hi there!"}
        ),
        event({"type": "response.output_item.done", "output_index": 1, "item": TEXT_ITEM}),
        event({"type": "response.completed", "response": {"status": "completed"}}),
    ]
    chunks, outcome, _ = parse(pieces)
    assert [chunk for chunk in chunks if not isinstance(chunk, ReasoningBlock)] == [
        ReasoningDelta(summary),
        TextDelta("Hi there!"),
    ]
    assert outcome == Finish("stop")
