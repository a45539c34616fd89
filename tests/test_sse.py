"""The server-sent events decoder, tested without I/O (plain calls over strings and bytes).

The examples follow the WHATWG HTML "server-sent events" parsing rules; the
property tests check that the events never depend on where the input was
split (text or UTF-8 bytes), and agree with a line-by-line reference decoder
written from the spec.
"""

from __future__ import annotations

import itertools
import re
import time
from typing import AnyStr

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_harness.model import _sse
from trio_harness.model._sse import SSEDecoder, SSEEnd, SSEError, SSEEvent, SSEMessages


def decode(*pieces: str) -> tuple[list[SSEEvent], SSEEnd]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for piece in pieces:
        events += decoder.feed(piece)
    return events, decoder.close()


def decode_bytes(*pieces: bytes) -> tuple[list[SSEEvent], SSEEnd]:
    decoder = SSEDecoder()
    events: list[SSEEvent] = []
    for piece in pieces:
        events += decoder.feed_bytes(piece)
    return events, decoder.close()


def datas(events: list[SSEEvent]) -> list[str]:
    return [event.data for event in events]


# ---------------------------------------------------------------- the spec's examples


def test_data_lines_are_joined_with_newlines() -> None:
    events, end = decode("data: YHOO\ndata: +2\ndata: 10\n\n")
    assert events == [SSEEvent("YHOO\n+2\n10")]
    assert end == SSEEnd()
    assert not end.truncated


def test_comments_ids_and_the_space_after_the_colon() -> None:
    events, end = decode(": test stream\n\ndata: first event\nid: 1\n\ndata:second event\nid\n\ndata:  third event\n\n")
    assert events == [
        SSEEvent("first event", "message", "1"),
        SSEEvent("second event", "message", ""),  # "id" alone resets the last event id
        SSEEvent(" third event", "message", ""),  # only one space is dropped
    ]
    assert end == SSEEnd()


def test_empty_data_lines_and_an_unfinished_last_line() -> None:
    events, end = decode("data\n\ndata\ndata\n\ndata:")
    assert events == [SSEEvent(""), SSEEvent("\n")]
    assert end == SSEEnd(event=None, partial_line="data:")
    assert end.truncated


def test_with_and_without_the_space() -> None:
    assert decode("data:test\n\ndata: test\n\n")[0] == [SSEEvent("test"), SSEEvent("test")]


# ---------------------------------------------------------------- fields


def test_event_type_and_its_reset() -> None:
    events, _ = decode("event: add\ndata: 1\n\nevent: gone\n\ndata: 2\n\nevent:\ndata: 3\n\n")
    # An event without data is not dispatched, and its type does not carry over.
    assert events == [SSEEvent("1", "add"), SSEEvent("2"), SSEEvent("3")]


def test_last_event_id_persists_and_ignores_nul() -> None:
    decoder = SSEDecoder()
    events = decoder.feed("id: 7\n\ndata: a\n\nid: x\0y\ndata: b\n\n")
    # The id of a data-less event still sets the buffer; an id with NUL is ignored.
    assert events == [SSEEvent("a", "message", "7"), SSEEvent("b", "message", "7")]
    assert decoder.last_event_id == "7"


def retry_after(*pieces: str) -> int | None:
    decoder = SSEDecoder()
    for piece in pieces:
        decoder.feed(piece)
    return decoder.retry


def test_retry_takes_ascii_digits_only() -> None:
    assert retry_after() is None
    assert retry_after("retry: 1500\n\n") == 1500
    assert retry_after("retry: 1500\n\n", "retry: 1a\n\nretry: \u0663\n\nretry:\n\nretry: -5\n\n") == 1500
    assert retry_after("retry: 1500\n\n", "retry:20\ndata: x\n\n") == 20


def test_unknown_fields_and_comments_are_ignored() -> None:
    events, _ = decode(": hi\nfoo: bar\nDATA: no\ndata : no\n:data: no\ndata: yes\n\n")
    assert events == [SSEEvent("yes")]


@pytest.mark.parametrize(
    ("other", "middle", "last_id"),
    [
        (": comment", [], ""),
        ("event: x", [], ""),
        ("data:b", [SSEEvent("b")], ""),
        ("data", [SSEEvent("")], ""),
        ("id: 1", [], "1"),
        ("retry: 5", [], ""),
        ("", [], ""),
    ],
)
def test_plain_events_around_another_kind(other: str, middle: list[SSEEvent], last_id: str) -> None:
    # One piece of single "data: " line events with an event of another shape among them.
    events, end = decode(f"data: a\n\n{other}\n\ndata: c\n\n")
    assert events == [SSEEvent("a"), *middle, SSEEvent("c", "message", last_id)]
    assert end == SSEEnd()


def test_blank_lines_without_data_dispatch_nothing() -> None:
    events, end = decode("\n\n\n\n: ping\n\n\n\ndata: a\n\n\n\n\n")
    assert events == [SSEEvent("a")]
    assert end == SSEEnd()


# ---------------------------------------------------------------- line ends


@pytest.mark.parametrize("newline", ["\n", "\r", "\r\n"])
def test_every_line_end(newline: str) -> None:
    text = "data: a\n: c\ndata: b\n\nevent: t\ndata: c\n\n".replace("\n", newline)
    assert decode(text)[0] == [SSEEvent("a\nb"), SSEEvent("c", "t")]


def test_a_crlf_split_between_two_pieces_is_one_line_end() -> None:
    # Were the CR taken alone, the LF after it would be a blank line ending the event early.
    assert decode("data: a\r", "\ndata: b\r\n\r\n")[0] == [SSEEvent("a\nb")]
    assert decode("data: a\r", "\r\n")[0] == [SSEEvent("a")]
    assert decode("data: a\r", "", "\n\r", "\n")[0] == [SSEEvent("a")]


def test_mixed_line_ends() -> None:
    assert decode("data: a\r\ndata: b\rdata: c\n\r\n")[0] == [SSEEvent("a\nb\nc")]


# ---------------------------------------------------------------- byte order mark and UTF-8


def test_a_leading_byte_order_mark_is_dropped_once() -> None:
    assert decode("\ufeffdata: a\n\n")[0] == [SSEEvent("a")]
    assert decode("", "\ufeff", "data: a\n\n")[0] == [SSEEvent("a")]
    # Only at the start of the stream: later it is part of a field name.
    assert decode("data: a\n\n\ufeffdata: b\n\n")[0] == [SSEEvent("a")]
    assert decode_bytes(b"\xef", b"\xbb", b"\xbfdata: a\n\n")[0] == [SSEEvent("a")]


def test_utf8_split_inside_characters() -> None:
    text = "data: h\u00e9llo \u2603 \U0001f600\n\n"
    data = text.encode()
    for cut in range(1, len(data)):
        assert decode_bytes(data[:cut], data[cut:])[0] == [SSEEvent("h\u00e9llo \u2603 \U0001f600")], cut
    assert decode_bytes(*(data[i : i + 1] for i in range(len(data))))[0] == [SSEEvent("h\u00e9llo \u2603 \U0001f600")]


def test_bytes_that_are_not_utf8() -> None:
    decoder = SSEDecoder()
    with pytest.raises(SSEError, match="not UTF-8"):
        decoder.feed_bytes(b"data: \xff\xfe\n\n")


def test_the_stream_ending_inside_a_character_is_truncated() -> None:
    events, end = decode_bytes(b"data: a\n\n\xe2\x98")
    assert events == [SSEEvent("a")]
    assert end.truncated


# ---------------------------------------------------------------- the end of the stream


def test_close_reports_what_was_left() -> None:
    assert decode("data: a\n\n")[1] == SSEEnd()
    # The last event's lines are complete but its blank line never came.
    assert decode("data: a\n\ndata: b\n")[1] == SSEEnd(event=SSEEvent("b"))
    assert decode("data: a\n\ndata: b\r")[1] == SSEEnd(event=SSEEvent("b"))
    # Cut in the middle of a line.
    assert decode('data: a\n\ndata: b\ndata: {"x')[1] == SSEEnd(event=SSEEvent("b"), partial_line='data: {"x')
    assert decode("data: {")[1] == SSEEnd(partial_line="data: {")
    # Comments and fields without data make no event.
    assert decode(": c\nid: 3\n")[1] == SSEEnd()


def test_nothing_is_fed_after_close() -> None:
    decoder = SSEDecoder()
    decoder.close()
    assert decoder.close() == SSEEnd()
    with pytest.raises(RuntimeError, match="after close"):
        decoder.feed("data: x\n\n")


def test_an_event_longer_than_the_limit(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(_sse, "MAX_EVENT_CHARS", 100)
    decoder = SSEDecoder()
    assert decoder.feed("data: " + "x" * 90) == []
    with pytest.raises(SSEError, match="longer than 100 characters"):
        decoder.feed("x" * 20)
    # A long event that ends is fine; only what waits for its end counts.
    assert SSEDecoder().feed("data: " + "y" * 200 + "\n\n") == [SSEEvent("y" * 200)]


def test_a_long_event_fed_in_small_pieces_takes_linear_time() -> None:
    # Review finding: each piece was appended to the whole pending text (and searched again), so a
    # 12 MB event trickled in 1 KB pieces copied ~70 GB and stalled the event loop for minutes.
    # Now it is joined once, when it ends; the bound is generous (about 0.3 s here, unloaded).
    size, piece = 12 * 1024 * 1024, 1024
    body = "data: " + "x" * size
    decoder = SSEDecoder()
    start = time.perf_counter()
    for at in range(0, len(body), piece):
        assert decoder.feed(body[at : at + piece]) == []
        assert time.perf_counter() - start < 10, f"fed {at} characters in 10 s: quadratic"
    # The blank line split over two pieces still ends the event.
    assert decoder.feed("\n") == []
    assert decoder.feed("\ndata: next") == [SSEEvent("x" * size)]
    assert decoder.close() == SSEEnd(partial_line="data: next")


def test_plain_events_come_as_their_data_strings() -> None:
    decoder = SSEDecoder()
    decoder.feed("id: 9\n\n")
    plain = decoder.feed("data: a\n\ndata: b\n\ndata: {")
    assert isinstance(plain, SSEMessages)
    assert plain.data == ["a", "b"]
    assert plain == [SSEEvent("a", "message", "9"), SSEEvent("b", "message", "9")]
    assert [SSEEvent("a", "message", "9"), SSEEvent("b", "message", "9")] == plain
    assert len(plain) == 2
    assert plain[1] == SSEEvent("b", "message", "9")
    assert plain[-1:] == [SSEEvent("b", "message", "9")]
    assert list(plain) == [plain[0], plain[1]]
    assert plain != [SSEEvent("a", "message", "9")]
    assert plain != "ab"
    assert repr(plain) == "SSEMessages(['a', 'b'], id='9')"
    with pytest.raises(TypeError):
        hash(plain)
    # Any other shape of event in the piece: a list of events.
    mixed = decoder.feed('"}\n\nevent: x\ndata: c\n\n')
    assert type(mixed) is list
    assert mixed == [SSEEvent('{"}', "message", "9"), SSEEvent("c", "x", "9")]


def test_events_compare_by_value() -> None:
    event = SSEEvent("d", "t", "i")
    assert event == SSEEvent("d", "t", "i")
    assert event != SSEEvent("d", "t", "j")
    assert hash(event) == hash(SSEEvent("d", "t", "i"))
    assert repr(event) == "SSEEvent(data='d', type='t', id='i')"


# ---------------------------------------------------------------- properties

_VALUE = st.text(st.characters(blacklist_characters="\r\n", blacklist_categories=["Cs"]), max_size=8)
_LINE = st.one_of(
    st.builds(lambda v: "data: " + v, _VALUE),
    st.builds(lambda v: "data:" + v, _VALUE),
    st.just("data"),
    st.builds(lambda v: ": " + v, _VALUE),
    st.builds(lambda v: "event: " + v, _VALUE),
    st.builds(lambda v: "id: " + v, st.one_of(_VALUE, st.just("a\0b"))),
    st.builds(lambda v: "retry: " + v, st.one_of(st.from_regex(r"\A[0-9]{1,4}\Z"), _VALUE)),
    st.builds(lambda n, v: n + ":" + v, st.sampled_from(["foo", "dat", "DATA", ""]), _VALUE),
    st.just(""),  # a blank line: ends an event
)
_NEWLINE = st.sampled_from(["\n", "\r", "\r\n"])


@st.composite
def streams(draw: st.DrawFn) -> str:
    """Event-stream text: events of lines of every kind, one line end or mixed ones, maybe a BOM, maybe cut."""
    mixed = draw(st.booleans())
    style = draw(_NEWLINE)
    parts: list[str] = []
    for event in draw(st.lists(st.lists(_LINE, min_size=1, max_size=3), max_size=12)):
        for line in [*event, ""]:  # each event ends with a blank line
            parts.append(line + (draw(_NEWLINE) if mixed else style))
    text = "".join(parts)
    if draw(st.booleans()):
        text += draw(_LINE)  # the stream may end in the middle of a line
    if draw(st.booleans()):
        text = "\ufeff" + text
    return text


def split_at(data: AnyStr, cuts: list[int]) -> list[AnyStr]:
    """``data`` cut at the given positions (taken modulo its length, so any integers do)."""
    bounds = [0, *sorted({cut % (len(data) + 1) for cut in cuts}), len(data)]
    return [data[start:end] for start, end in itertools.pairwise(bounds)]


@given(streams(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_the_text_gives_the_same_events(text: str, cuts: list[int]) -> None:
    pieces = split_at(text, cuts)
    assert "".join(pieces) == text
    assert decode(*pieces) == decode(text)


@given(streams(), st.lists(st.integers(min_value=0, max_value=10_000), max_size=12))
def test_any_split_of_the_bytes_gives_the_same_events(text: str, cuts: list[int]) -> None:
    pieces = split_at(text.encode(), cuts)
    assert decode_bytes(*pieces) == decode(text)


@given(streams())
def test_agrees_with_a_line_by_line_reading_of_the_spec(text: str) -> None:
    assert decode(text) == reference_decode(text)


def reference_decode(text: str) -> tuple[list[SSEEvent], SSEEnd]:
    """The spec's algorithm, line by line, on the whole text (plus the close report)."""
    if text.startswith("\ufeff"):
        text = text[1:]
    lines = re.split(r"\r\n|\r|\n", text)
    partial = lines.pop()  # text after the last line end ("" when the text ends with one)
    events: list[SSEEvent] = []
    data: list[str] = []
    kind = ""
    last_id = ""
    for line in lines:
        if line == "":
            if data:
                events.append(SSEEvent("\n".join(data), kind or "message", last_id))
            data, kind = [], ""
            continue
        if line.startswith(":"):
            continue
        field, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if field == "data":
            data.append(value)
        elif field == "event":
            kind = value
        elif field == "id" and "\0" not in value:
            last_id = value
    last = SSEEvent("\n".join(data), kind or "message", last_id) if data else None
    return events, SSEEnd(event=last, partial_line=partial or None)
