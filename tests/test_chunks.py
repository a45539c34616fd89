"""The OpenAI chat-completions chunk parser, tested without I/O.

Events are built directly (or decoded from bytes by the SSE decoder, as the
provider does); no server runs here.  tests/test_openai_provider.py keeps the
end-to-end tests against a real loopback server.
"""

from __future__ import annotations

import gc
import itertools
import json
from typing import Any

import attrs
import pytest
from _sse_server import DONE, sse, sse_delta, sse_finish, sse_text, sse_usage
from hypothesis import given
from hypothesis import strategies as st

from trio_harness.model._chunks import ChunkParser, message_of
from trio_harness.model._protocol import (
    Chunk,
    Failure,
    Finish,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from trio_harness.model._sse import SSEDecoder, SSEEnd, SSEEvent

NAME = "test:model"


def event(obj: object, type: str = "message") -> SSEEvent:
    return SSEEvent(obj if isinstance(obj, str) else json.dumps(obj), type)


def delta(finish_reason: str | None = None, **fields: Any) -> SSEEvent:
    choice: dict[str, Any] = {"index": 0, "delta": fields}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    return event({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})


def text(content: str) -> SSEEvent:
    return delta(content=content)


def finish(reason: str = "stop") -> SSEEvent:
    return delta(finish_reason=reason)


def usage(prompt: int, completion: int, **extra: Any) -> SSEEvent:
    return event(
        {"id": "c1", "choices": [], "usage": {"prompt_tokens": prompt, "completion_tokens": completion, **extra}}
    )


def tool(index: int | None, *, id: str | None = None, name: str | None = None, args: Any = "") -> SSEEvent:
    call: dict[str, Any] = {"function": {"arguments": args}}
    if index is not None:
        call["index"] = index
    if id is not None:
        call.update(id=id, type="function")
        call["function"]["name"] = name
    return delta(tool_calls=[call])


DONE_EVENT = SSEEvent("[DONE]")


def run(*events: SSEEvent, end: SSEEnd | None = None, failure: Failure | None = None) -> list[object]:
    """Feed the events one by one, then the end; return the chunks, the usage and the outcome."""
    parser = ChunkParser(NAME)
    chunks: list[object] = []
    for one in events:
        chunks += parser.feed(one)
    if end is not None:
        chunks += parser.feed_end(end)
    if parser.usage is not None:
        chunks.append(parser.usage)
    chunks.append(parser.conclude(failure))
    return chunks


def failure_of(chunks: list[object]) -> Failure:
    outcome = chunks[-1]
    assert isinstance(outcome, Failure)
    return outcome


# ---------------------------------------------------------------- deltas


def test_text_then_finish_then_usage() -> None:
    chunks = run(delta(role="assistant", content=""), text("Hel"), text("lo"), finish(), usage(12, 3), DONE_EVENT)
    assert chunks == [TextDelta("Hel"), TextDelta("lo"), Usage(12, 3, 0), Finish("stop")]


@pytest.mark.parametrize("field", ["reasoning_content", "reasoning"])
def test_reasoning(field: str) -> None:
    chunks = run(
        delta(role="assistant", content=None, **{field: "Let me "}),
        delta(content=None, **{field: "think."}),
        delta(content="Answer", **{field: None}),
        finish(),
        DONE_EVENT,
    )
    assert chunks == [ReasoningDelta("Let me "), ReasoningDelta("think."), TextDelta("Answer"), Finish("stop")]


def test_fast_path_text_deltas_are_ordinary_records() -> None:
    # Plain text deltas are built without TextDelta's __init__ (see _chunks.py): same records.
    parser = ChunkParser(NAME)
    (fast,) = parser.feed(event({"choices": [{"delta": {"content": "h\u00e9"}}]}))
    assert type(fast) is TextDelta
    assert fast == TextDelta("h\u00e9")
    assert hash(fast) == hash(TextDelta("h\u00e9"))
    assert repr(fast) == repr(TextDelta("h\u00e9"))
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        fast.text = "x"  # type: ignore[misc]


def test_reasoning_and_text_in_one_delta() -> None:
    assert run(delta(content="a", reasoning_content="r"), finish(), DONE_EVENT) == [
        ReasoningDelta("r"),
        TextDelta("a"),
        Finish("stop"),
    ]


def test_tool_call_deltas_across_many_events() -> None:
    args_a = '{"path": "a.txt"}'
    args_b = '{"cmd": "ls -l", "timeout": 5}'
    events = [text("Reading."), tool(0, id="call_a", name="read")]
    events += [tool(0, args=args_a[i : i + 3]) for i in range(0, len(args_a), 3)]
    events.append(tool(1, id="call_b", name="bash", args=args_b[:4]))
    events += [tool(1, args=args_b[i : i + 5]) for i in range(4, len(args_b), 5)]
    chunks = run(*events, finish("tool_calls"), usage(100, 40), DONE_EVENT)

    assert chunks[0] == TextDelta("Reading.")
    assert chunks[-2:] == [Usage(100, 40, 0), Finish("tool-calls")]
    deltas = [chunk for chunk in chunks if isinstance(chunk, ToolCallDelta)]
    assert deltas[0] == ToolCallDelta(0, "call_a", "read", "")
    assert deltas[len(args_a) // 3 + 2] == ToolCallDelta(1, "call_b", "bash", args_b[:4])
    assembled: dict[int, list[str]] = {}
    for piece in deltas:
        entry = assembled.setdefault(piece.index, ["", "", ""])
        entry[0] += piece.id or ""
        entry[1] += piece.name or ""
        entry[2] += piece.arguments
    assert assembled == {0: ["call_a", "read", args_a], 1: ["call_b", "bash", args_b]}


def test_two_tool_calls_in_one_event() -> None:
    both = delta(
        tool_calls=[
            {"index": 0, "id": "a", "type": "function", "function": {"name": "x", "arguments": "{}"}},
            {"index": 1, "id": "b", "type": "function", "function": {"name": "y", "arguments": ""}},
        ]
    )
    assert run(both, finish("tool_calls"), DONE_EVENT) == [
        ToolCallDelta(0, "a", "x", "{}"),
        ToolCallDelta(1, "b", "y", ""),
        Finish("tool-calls"),
    ]


def test_tool_calls_without_an_index() -> None:
    # A new id starts a new call; a piece without an id continues the last one.
    chunks = run(
        tool(None, id="c", name="z", args="{"),
        tool(None, args="}"),
        tool(None, id="d", name="w", args="[]"),
        tool(None, id="c", args=""),  # a known id goes back to its call (nothing new to report)
        tool(None, args=" "),
        finish("stop"),
        DONE_EVENT,
    )
    assert chunks == [
        ToolCallDelta(0, "c", "z", "{"),
        ToolCallDelta(0, None, None, "}"),
        ToolCallDelta(1, "d", "w", "[]"),
        ToolCallDelta(0, "c", None, ""),
        ToolCallDelta(0, None, None, " "),
        # "stop" after tool calls (some local servers say so): reported as tool calls.
        Finish("tool-calls"),
    ]


def test_parsed_tool_arguments_are_sent_as_json_text() -> None:
    chunks = run(tool(0, id="c", name="f", args={"k": "\u00fc"}), finish("tool_calls"), DONE_EVENT)
    assert chunks[0] == ToolCallDelta(0, "c", "f", '{"k": "\u00fc"}')


def test_empty_pieces_and_keepalives_give_nothing() -> None:
    chunks = run(
        event(""),
        event("  "),
        text(""),
        delta(role="assistant"),
        event({"choices": []}),
        finish(),
        DONE_EVENT,
    )
    assert chunks == [Finish("stop")]


# ---------------------------------------------------------------- usage


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"prompt_cache_hit_tokens": 32, "prompt_cache_miss_tokens": 18}, Usage(50, 7, 32)),
        ({"prompt_tokens_details": {"cached_tokens": 48}, "total_tokens": 57}, Usage(50, 7, 48)),
        ({}, Usage(50, 7, 0)),
        ({"prompt_cache_hit_tokens": "x", "prompt_tokens_details": None}, Usage(50, 7, 0)),
    ],
    ids=["deepseek", "openai", "no-cache", "odd-cache-fields"],
)
def test_usage_with_cache_hits(fields: dict[str, Any], expected: Usage) -> None:
    assert run(text("x"), finish(), usage(50, 7, **fields), DONE_EVENT) == [TextDelta("x"), expected, Finish("stop")]


def test_usage_on_the_finish_chunk_and_odd_counts() -> None:
    final = event({"choices": [{"delta": {}, "finish_reason": "length"}], "usage": {"prompt_tokens": 3}})
    assert run(text("a"), final, DONE_EVENT) == [TextDelta("a"), Usage(3, 0, 0), Finish("max-tokens")]
    negative = event({"choices": [], "usage": {"prompt_tokens": -1, "completion_tokens": True}})
    assert run(finish(), negative, DONE_EVENT) == [Usage(0, 0, 0), Finish("stop")]


def test_the_last_usage_wins() -> None:
    assert run(usage(1, 1), finish(), usage(5, 6), DONE_EVENT)[-2] == Usage(5, 6, 0)


# ---------------------------------------------------------------- the outcome


@pytest.mark.parametrize(
    ("wire", "reason"),
    [
        ("stop", "stop"),
        ("eos", "stop"),
        ("end_turn", "stop"),
        ("tool_calls", "tool-calls"),
        ("function_call", "tool-calls"),
        ("tool_use", "tool-calls"),
        ("length", "max-tokens"),
        ("max_tokens", "max-tokens"),
        ("something_new", "stop"),
    ],
)
def test_finish_reasons(wire: str, reason: str) -> None:
    assert run(text("a"), finish(wire), DONE_EVENT) == [TextDelta("a"), Finish(reason)]  # type: ignore[arg-type]


def test_content_filter_is_a_refusal() -> None:
    chunks = run(text("I"), finish("content_filter"), usage(1, 1), DONE_EVENT)
    assert chunks[:2] == [TextDelta("I"), Usage(1, 1, 0)]
    outcome = chunks[-1]
    assert isinstance(outcome, Finish)
    assert outcome.reason == "error"
    assert outcome.failure == Failure("refusal", f"{NAME}: the response was stopped by the content filter")


def test_done_without_a_finish_reason() -> None:
    assert failure_of(run(text("a"), DONE_EVENT)) == Failure(
        "no-finish", f"{NAME}: stream sent [DONE] without a finish_reason"
    )


def test_missing_finish() -> None:
    parser = ChunkParser(NAME)
    assert parser.feed(text("a")) == [TextDelta("a")]
    assert not parser.done
    assert parser.conclude() == Failure("no-finish", f"{NAME}: stream ended without a finish_reason or [DONE]")
    cut = Failure("truncated-stream", "cut", retryable=True)
    assert parser.conclude(cut) is cut  # why the stream ended, when the caller knows


def test_a_finish_reason_makes_the_answer_complete() -> None:
    # Losing the connection (or the deadline) after the finish_reason only loses trailing usage.
    parser = ChunkParser(NAME)
    parser.feed_all([text("a"), finish()])
    assert parser.conclude(Failure("timeout", "late", retryable=True)) == Finish("stop")


def test_events_after_done_are_ignored() -> None:
    parser = ChunkParser(NAME)
    assert parser.feed_all([text("a"), finish(), DONE_EVENT, text("late"), event("{bad")]) == [TextDelta("a")]
    assert parser.done
    assert parser.feed(text("later")) == []
    assert parser.feed_end(SSEEnd(partial_line="x")) == []
    assert parser.conclude() == Finish("stop")


def test_a_failure_found_outside_the_events() -> None:
    # An HTTP status or undecodable bytes: the outcome, whatever the caller concludes with later.
    parser = ChunkParser(NAME)
    parser.feed_all([text("a"), finish()])
    status = Failure("http-503", "busy", retryable=True)
    assert parser.fail(status) is status
    assert parser.done
    assert parser.feed(text("b")) == []
    assert parser.fail(Failure("later", "x")) is status  # the first one stays
    assert parser.conclude(Failure("timeout", "late", retryable=True)) is status


def test_emitted_says_whether_any_delta_was_returned() -> None:
    parser = ChunkParser(NAME)
    parser.feed_all([text(""), usage(1, 2), delta(role="assistant")])
    assert not parser.emitted
    parser.feed(delta(reasoning_content="r"))
    assert parser.emitted


# ---------------------------------------------------------------- bad streams


@pytest.mark.parametrize(
    ("bad", "needle"),
    [
        (event("{not json"), "bad JSON in a data line"),
        (event('{"a": 1} x'), "bad JSON in a data line"),
        (event("not json"), "bad JSON in a data line"),
        (event("[DONE] "), "bad JSON in a data line"),
        (event("[1, 2]"), "not a JSON object"),
        (event({"choices": "nope"}), "'choices' is not a list of objects"),
        (event({"choices": ["nope"]}), "'choices' is not a list of objects"),
        (event({"choices": [{"delta": "nope"}]}), "'delta' is not an object"),
        (delta(content=5), "'content' is not a string"),
        (delta(reasoning_content=["r"]), "reasoning is not a string"),
        (delta(tool_calls={"index": 0}), "'tool_calls' is not a list"),
        (delta(tool_calls=["x"]), "a tool call delta is not an object"),
        (delta(tool_calls=[{"index": 0, "function": "f"}]), "'function' is not an object"),
        (delta(tool_calls=[{"index": "0"}]), "index is not an integer"),
        (delta(tool_calls=[{"index": 0, "id": 7}]), "wrong shape"),
        (delta(tool_calls=[{"index": 0, "function": {"arguments": 5}}]), "wrong shape"),
        (event({"choices": [{"delta": {}, "finish_reason": 3}]}), "'finish_reason' is not a string"),
        (event({"choices": [], "usage": [1]}), "'usage' is not an object"),
    ],
)
def test_malformed_events(bad: SSEEvent, needle: str) -> None:
    parser = ChunkParser(NAME)
    # The chunks before the bad event are still returned; nothing after it.
    assert parser.feed_all([text("a"), bad, text("b"), finish(), DONE_EVENT]) == [TextDelta("a")]
    assert parser.done
    failure = parser.conclude()
    assert failure == parser.failure
    assert isinstance(failure, Failure)
    assert failure.code == "malformed-stream"
    assert not failure.retryable
    assert failure.message.startswith(f"{NAME}: ")
    assert needle in failure.message


def test_a_malformed_event_wins_over_a_finish_reason() -> None:
    failure = failure_of(run(text("a"), finish(), event("{oops}"), DONE_EVENT))
    assert failure.code == "malformed-stream"
    assert "{oops}" in failure.message


@pytest.mark.parametrize(
    ("bad", "code", "retryable", "needle"),
    [
        (event({"error": {"message": "model overloaded", "code": 503}}), "http-503", True, "model overloaded"),
        (event({"error": {"message": "slow", "code": "429"}}), "http-429", True, "slow"),
        (event({"error": {"message": "no", "code": 400}}), "http-400", False, "no"),
        (event({"error": {"message": "weird", "type": "x"}}), "stream-error", False, "weird"),
        # OpenAI's own in-stream errors: a retry may cure them (review finding: they were final).
        (event({"error": {"message": "Sorry", "type": "server_error", "code": None}}), "stream-error", True, "Sorry"),
        (event({"error": {"message": "slow down", "code": "rate_limit_exceeded"}}), "stream-error", True, "(rate_"),
        (event({"message": "typed"}, type="error"), "stream-error", False, "typed"),
        (event({"error": "plain"}), "stream-error", False, "plain"),
        (
            event({"choices": [{"delta": {}, "finish_reason": "error"}], "error": {"message": "mid"}}),
            "stream-error",
            False,
            "mid",
        ),
    ],
)
def test_errors_inside_the_stream(bad: SSEEvent, code: str, retryable: bool, needle: str) -> None:
    failure = failure_of(run(text("a"), bad, finish(), DONE_EVENT))
    assert (failure.code, failure.retryable) == (code, retryable)
    assert needle in failure.message


# ---------------------------------------------------------------- the end of the stream


def test_the_end_of_the_stream() -> None:
    no_finish = Failure("no-finish", "ended")
    # A last event that lacked its blank line is taken.
    assert run(text("a"), finish(), end=SSEEnd(event=DONE_EVENT)) == [TextDelta("a"), Finish("stop")]
    assert run(text("a"), end=SSEEnd(event=finish()), failure=no_finish) == [TextDelta("a"), Finish("stop")]
    # Cut mid-line before a finish_reason: truncated (retryable); after one: complete.
    truncated = failure_of(run(text("a"), end=SSEEnd(event=finish(), partial_line="data: {")))
    assert truncated == Failure("truncated-stream", f"{NAME}: stream ended in the middle of a line", retryable=True)
    assert run(text("a"), finish(), end=SSEEnd(event=usage(2, 1), partial_line="da")) == [
        TextDelta("a"),
        Usage(2, 1, 0),
        Finish("stop"),
    ]
    assert run(text("a"), end=SSEEnd(), failure=no_finish) == [TextDelta("a"), no_finish]


# ---------------------------------------------------------------- a whole JSON body


def test_a_whole_json_completion() -> None:
    completion = {
        "choices": [
            {
                "index": 0,
                "message": {
                    "role": "assistant",
                    "content": "done",
                    "reasoning_content": "why",
                    "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}],
                },
                "finish_reason": "tool_calls",
            }
        ],
        "usage": {"prompt_tokens": 1, "completion_tokens": 2},
    }
    parser = ChunkParser(NAME)
    assert parser.feed_body(json.dumps(completion).encode()) == [
        ReasoningDelta("why"),
        TextDelta("done"),
        ToolCallDelta(0, "c1", "f", "{}"),
    ]
    assert parser.done and parser.emitted
    assert parser.usage == Usage(1, 2, 0)
    assert parser.conclude() == Finish("tool-calls")
    assert parser.feed_body(b"{}") == []


@pytest.mark.parametrize(
    ("body", "code", "needle"),
    [
        (b'{"error": {"message": "quota exceeded"}}', "stream-error", "quota exceeded"),
        (b'{"error": {"message": "busy", "code": 503}}', "http-503", "busy"),
        (b"not json", "malformed-stream", "expected an event stream, got a JSON body: not json"),
        (b'{"choices": []}', "malformed-stream", "expected an event stream"),
        (b'{"choices": [{"message": "x"}]}', "malformed-stream", "expected an event stream"),
        (b'{"choices": [{"message": {"content": 5}}]}', "malformed-stream", "'content' is not a string"),
        (b'{"choices": [{"message": {"content": "x"}}]}', "no-finish", "without a finish_reason"),
    ],
)
def test_a_whole_json_body_that_is_not_a_completion(body: bytes, code: str, needle: str) -> None:
    parser = ChunkParser(NAME)
    parser.feed_body(body)
    failure = parser.conclude()
    assert isinstance(failure, Failure)
    assert failure.code == code
    assert needle in failure.message


# ---------------------------------------------------------------- properties

_TEXT = st.text(st.characters(blacklist_categories=["Cs"]), max_size=6)
_EVENTS = st.one_of(
    st.builds(text, _TEXT),
    st.builds(lambda r, c: delta(reasoning_content=r, content=c), _TEXT, st.one_of(st.none(), _TEXT)),
    st.builds(
        lambda i, id, name, args: tool(i, id=id, name=name, args=args),
        st.one_of(st.none(), st.integers(0, 2)),
        st.one_of(st.none(), st.sampled_from(["a", "b"])),
        st.sampled_from(["f", "g"]),
        _TEXT,
    ),
    st.builds(finish, st.sampled_from(["stop", "tool_calls", "length", "content_filter", "eos"])),
    st.builds(usage, st.integers(0, 9), st.integers(0, 9)),
    st.just(DONE_EVENT),
    st.just(event("")),
    st.just(event({"error": {"message": "boom", "code": 500}})),
    st.just(event("{bad")),
    st.just(delta(content=3)),
)


@given(
    st.lists(_EVENTS, max_size=20),
    st.lists(st.integers(min_value=0, max_value=20), max_size=6),
)
def test_any_batching_gives_the_same_chunks(events: list[SSEEvent], cuts: list[int]) -> None:
    def outcome(batches: list[list[SSEEvent]]) -> tuple[list[Chunk], bool, bool, Usage | None, object]:
        parser = ChunkParser(NAME)
        chunks: list[Chunk] = []
        for batch in batches:
            chunks += parser.feed_all(batch)
        return chunks, parser.done, parser.emitted, parser.usage, parser.conclude()

    bounds = [0, *sorted({cut % (len(events) + 1) for cut in cuts}), len(events)]
    batches = [events[start:end] for start, end in itertools.pairwise(bounds)]
    whole = outcome([events])
    assert outcome(batches) == whole
    assert outcome([[one] for one in events]) == whole


# ------------------------------------------------- bytes to chunks: the provider's pipeline


def reference_stream() -> bytes:
    return b"".join(
        [
            sse_delta(role="assistant", content="", reasoning_content="\u00fcber "),
            b": keep-alive\r\n\r\n",
            sse_text("caf\u00e9 \U0001f600"),
            sse_delta(tool_calls=[{"index": 0, "id": "c0", "function": {"name": "f", "arguments": '{"a":'}}]),
            sse_delta(tool_calls=[{"index": 0, "function": {"arguments": ' "\u00df"}'}}]),
            sse_finish("tool_calls"),
            sse_usage(9, 8, prompt_cache_hit_tokens=4),
            DONE,
        ]
    )


REFERENCE_CHUNKS: list[object] = [
    ReasoningDelta("\u00fcber "),
    TextDelta("caf\u00e9 \U0001f600"),
    ToolCallDelta(0, "c0", "f", '{"a":'),
    ToolCallDelta(0, None, None, ' "\u00df"}'),
    Usage(9, 8, 4),
    Finish("tool-calls"),
]


def pipeline(pieces: list[bytes], *, as_objects: bool = False) -> list[object]:
    """Bytes to chunks and outcome, as the provider feeds them (without the HTTP loop).

    With ``as_objects``, the decoder's events are read as SSEEvent objects
    (the general path) even when they come as an SSEMessages.
    """
    decoder = SSEDecoder()
    parser = ChunkParser(NAME)
    chunks: list[object] = []
    for piece in pieces:
        if not parser.done:
            events = decoder.feed_bytes(piece)
            parser.feed_into(list(events) if as_objects else events, chunks.append)
    chunks += parser.feed_end(decoder.close())
    if parser.usage is not None:
        chunks.append(parser.usage)
    chunks.append(parser.conclude())
    return chunks


@given(st.lists(st.integers(min_value=1, max_value=len(reference_stream()) - 1), max_size=12))
def test_any_split_of_the_bytes_gives_the_same_chunks(cuts: list[int]) -> None:
    data = reference_stream()
    bounds = [0, *sorted(set(cuts)), len(data)]
    pieces = [data[start:end] for start, end in itertools.pairwise(bounds)]
    assert pipeline(pieces) == REFERENCE_CHUNKS
    assert pipeline(pieces, as_objects=True) == REFERENCE_CHUNKS


def test_one_byte_at_a_time() -> None:
    data = reference_stream()
    assert pipeline([data[i : i + 1] for i in range(len(data))]) == REFERENCE_CHUNKS
    assert pipeline([data]) == REFERENCE_CHUNKS


def test_reference_stream_is_json() -> None:
    # Guard the property test's fixture: every data line but [DONE] is JSON.
    for line in reference_stream().split(b"\n"):
        if line.startswith(b"data: ") and line != b"data: [DONE]":
            json.loads(line[6:])
    assert sse({"x": 1}) == b'data: {"x":1}\n\n'


def test_the_hot_path_leaves_the_garbage_collector_idle() -> None:
    # Plain text events go from bytes to emit() without anything made per event
    # that is still alive at the next one: a model stream does not wake the
    # collector (whose full passes cost more the bigger the program).
    piece = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n' * 5000
    decoder = SSEDecoder()
    parser = ChunkParser(NAME)
    counts: list[int] = []

    def emit(chunk: Chunk) -> None:
        counts.append(gc.get_count()[0])  # objects the collector tracks, net, since its last pass

    gc.disable()
    try:
        before = gc.get_count()[0]
        parser.feed_into(decoder.feed_bytes(piece), emit)
    finally:
        gc.enable()
    assert len(counts) == 5000
    assert max(counts) - before < 100  # not one per event


def test_message_of_error_objects_nested_deep() -> None:
    # A loop, not recursion: nesting deeper than the recursion limit (a hostile error body) is no crash.
    nested: object = {"code": 1}
    for _ in range(5000):
        nested = {"error": nested}
    assert message_of(nested) == ""
    assert message_of({"error": {"error": {"message": "deep"}}}) == "deep"
    assert message_of({"detail": "plain"}) == "plain"
    assert message_of("text") == "text"
    assert message_of(7) == ""
