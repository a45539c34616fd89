"""The session event codec: exact round trips, strict rejections (docs/guarantees.rst, "Sessions")."""

from __future__ import annotations

import base64
import json
from typing import Any, ClassVar, get_args

import attrs
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_harness._errors import EventDecodeError, UnsupportedFormatError
from trio_harness._records import OMIT_IF_DEFAULT, plain_constructor
from trio_harness.model._protocol import Failure, ModelSettings, ReasoningBlock, ToolCall, Usage, UsageTotals
from trio_harness.session import (
    FORMAT_VERSION,
    SessionHeader,
    _codec,
    _session,
    decode_event,
    decode_header,
    encode_event,
    encode_header,
)
from trio_harness.session._events import (
    EVENT_TYPES,
    ApprovalDecided,
    ApprovalOutcome,
    ApprovalRequested,
    ApprovalSource,
    AssistantChunk,
    AssistantMessage,
    CancelCause,
    CompactionFailed,
    ConfigChanged,
    ContextCompacted,
    ControlRefused,
    Event,
    ImagePart,
    InboxMessage,
    InboxQueue,
    InboxSpliced,
    MessageOrigin,
    RequestHeader,
    RequestRetry,
    SendMode,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolResult,
    ToolStarted,
    TurnEnd,
    TurnEndReason,
    TurnStart,
    UserMessage,
)

# ------------------------------------------------------------------ strategies

texts = st.text(st.characters(exclude_categories=["Cs"]), max_size=30)
ints = st.integers(min_value=-(2**63), max_value=2**63)
floats = st.floats(allow_nan=False, allow_infinity=False)
send_modes = st.sampled_from(get_args(SendMode))
origins = st.sampled_from(get_args(MessageOrigin))

failures = st.builds(Failure, code=texts, message=texts, retryable=st.booleans(), retry_after=st.none() | floats)
usages = st.builds(Usage, input_tokens=ints, output_tokens=ints, cache_hit_tokens=ints, reasoning_tokens=ints)
totals = st.builds(
    UsageTotals,
    input_tokens=ints,
    output_tokens=ints,
    cache_hit_tokens=ints,
    reasoning_tokens=ints,
    requests=ints,
)
json_values = st.recursive(
    st.none() | st.booleans() | ints | floats | texts,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(texts, inner, max_size=3),
    max_leaves=6,
)
model_settings = st.builds(
    ModelSettings,
    temperature=st.none() | st.floats(min_value=0, max_value=2),
    top_p=st.none() | st.floats(min_value=0, max_value=1),
    max_tokens=st.none() | st.integers(min_value=1, max_value=2**31),
    seed=st.none() | ints,
    stop=st.none() | st.lists(texts.filter(bool), max_size=3).map(tuple),
    reasoning_effort=st.none() | st.sampled_from(["low", "medium", "high"]),
    parallel_tool_calls=st.none() | st.booleans(),
    extra_body=st.none() | st.dictionaries(texts, json_values, max_size=3),
)
tool_calls = st.builds(ToolCall, id=texts, name=texts, arguments=texts)
image_parts = st.builds(
    ImagePart,
    media_type=st.sampled_from(["image/png", "image/jpeg", "image/gif", "image/webp"]),
    data=st.binary(min_size=1, max_size=40).map(lambda b: base64.b64encode(b).decode("ascii")),
)
reasoning_blocks = st.builds(ReasoningBlock, provider=texts, data=st.dictionaries(texts, json_values, max_size=4))
inbox_messages = st.builds(
    InboxMessage,
    id=texts,
    text=texts,
    mode=send_modes,
    settings=st.none() | model_settings,
    origin=origins,
    images=st.lists(image_parts, max_size=2).map(tuple),
)

_BASE = {"seq": ints, "ts": floats}
_STEP = {**_BASE, "turn": ints, "step": ints}

# Every field of every event, given explicitly (checked below).
EVENT_FIELDS: dict[type[Event], dict[str, st.SearchStrategy[Any]]] = {
    TurnStart: {**_BASE, "turn": ints},
    StepStart: _STEP,
    UserMessage: {
        **_STEP,
        "message_id": texts,
        "text": texts,
        "mode": send_modes,
        "origin": origins,
        "images": st.lists(image_parts, max_size=2).map(tuple),
    },
    RequestHeader: {
        **_STEP,
        "provider": texts,
        "model": texts,
        "tools": st.lists(texts, max_size=4).map(tuple),
        "max_tokens": st.none() | ints,
        "settings": st.none() | model_settings,
    },
    RequestRetry: {**_STEP, "attempt": ints, "delay": floats, "failure": failures},
    AssistantChunk: {**_STEP, "kind": st.sampled_from(["text", "reasoning"]), "text": texts},
    AssistantMessage: {
        **_STEP,
        "text": texts,
        "reasoning": texts,
        "tool_calls": st.lists(tool_calls, max_size=3).map(tuple),
        "usage": st.none() | usages,
        "finish": texts,
        "reasoning_blocks": st.lists(reasoning_blocks, max_size=3).map(tuple),
        "response_model": texts,
        "response_id": texts,
    },
    ToolCallRequested: {**_STEP, "call_id": texts, "name": texts, "arguments": texts},
    ToolResult: {
        **_STEP,
        "call_id": texts,
        "name": texts,
        "content": texts,
        "is_error": st.booleans(),
        "detail": st.none() | st.dictionaries(texts, st.none() | texts | st.integers(-(2**53), 2**53), max_size=3),
    },
    ToolStarted: {**_STEP, "call_id": texts, "name": texts},
    StepEnd: _STEP,
    TurnEnd: {
        **_BASE,
        "turn": ints,
        "reason": st.sampled_from(get_args(TurnEndReason)),
        "cause": st.none() | st.sampled_from(get_args(CancelCause)),
        "failure": st.none() | failures,
        "usage": st.none() | totals,
    },
    InboxSpliced: {
        **_BASE,
        "queue": st.sampled_from(get_args(InboxQueue)),
        "start": ints,
        "removed": st.lists(texts, max_size=3).map(tuple),
        "inserted": st.lists(inbox_messages, max_size=3).map(tuple),
        "outcome": st.none() | st.sampled_from(["canceled", "claimed"]),
        "turn": st.none() | ints,
    },
    ApprovalRequested: {**_STEP, "call_id": texts, "name": texts, "arguments": texts},
    ApprovalDecided: {
        **_STEP,
        "call_id": texts,
        "name": texts,
        "outcome": st.sampled_from(get_args(ApprovalOutcome)),
        "source": st.sampled_from(get_args(ApprovalSource)),
        "message": st.none() | texts,
        "cause": st.none() | st.sampled_from(get_args(CancelCause)),
    },
    CompactionFailed: {
        **_BASE,
        "reason": st.sampled_from(["threshold", "overflow", "manual"]),
        "failure": failures,
        "turn": st.none() | ints,
        "usage": st.none() | totals,
    },
    ConfigChanged: {**_BASE, "option": texts, "value": texts},
    ControlRefused: {
        **_BASE,
        "message_id": texts,
        "kind": st.sampled_from(["cancel", "decision", "unknown"]),
        "reason": texts,
        "call_id": st.none() | texts,
    },
    ContextCompacted: {
        **_BASE,
        "boundary": ints,
        "summary": texts,
        "reason": st.sampled_from(["threshold", "overflow", "manual"]),
        "turn": st.none() | ints,
        "tokens_before": ints,
        "usage": st.none() | totals,
        "partials": st.lists(texts, max_size=3).map(tuple),
    },
}

EVENT_STRATEGIES: dict[type[Event], st.SearchStrategy[Event]] = {
    cls: st.builds(cls, **fields) for cls, fields in EVENT_FIELDS.items()
}
any_event = st.one_of(*EVENT_STRATEGIES.values())

headers = st.builds(
    SessionHeader,
    id=texts,
    created_at=floats,
    cwd=texts,
    parent_session=st.none() | texts,
    seed_length=st.integers(min_value=0, max_value=2**31),
    version=st.just(FORMAT_VERSION),
)


def test_the_strategies_cover_every_event_class_and_field() -> None:
    assert set(EVENT_FIELDS) == set(EVENT_TYPES)
    for cls, fields in EVENT_FIELDS.items():
        assert set(fields) == {f.name for f in attrs.fields(cls)}, cls
    assert len({cls.type for cls in EVENT_TYPES}) == len(EVENT_TYPES)  # tags are unique


# ------------------------------------------------------------------ round trips


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@given(data=st.data())
def test_every_event_type_round_trips_exactly(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[cls])
    line = encode_event(event)
    assert "\n" not in line  # one event, one line
    decoded = decode_event(line)
    assert type(decoded) is cls
    assert decoded == event
    assert decode_event(line.encode("utf-8")) == event  # bytes in, same event


@given(event=any_event)
def test_an_encoded_event_is_a_json_object_with_type_first_and_seq(event: Event) -> None:
    obj = json.loads(encode_event(event))
    assert isinstance(obj, dict)
    assert next(iter(obj)) == "type" and obj["type"] == event.type
    assert obj["seq"] == event.seq


@given(header=headers)
def test_the_header_round_trips_exactly(header: SessionHeader) -> None:
    line = encode_header(header)
    assert "\n" not in line
    assert json.loads(line)["type"] == "session"
    assert decode_header(line) == header
    assert decode_header(line.encode("utf-8")) == header


@pytest.mark.parametrize("text", ["\ud800", "a\udfff b ü", "\udc00\ud800", "😀 \ud83d", "\ude00 x"])
def test_lone_surrogates_encode_as_utf8_and_round_trip(text: str) -> None:
    # A half of a split emoji must not make the line unwritable: every event round-trips
    # through the codec exactly (docs/guarantees.rst, "Sessions").
    event = AssistantMessage(seq=0, ts=1.0, turn=1, step=1, text=text, tool_calls=(ToolCall("c", "bash", text),))
    line = encode_event(event)
    data = line.encode("utf-8")  # does not raise
    assert decode_event(line) == event
    assert decode_event(data) == event
    header = SessionHeader(id="s", created_at=1.0, cwd=text)
    assert decode_header(encode_header(header).encode("utf-8")) == header


def test_a_split_surrogate_pair_decodes_as_its_character() -> None:
    event = ToolResult(seq=0, ts=1.0, turn=1, step=1, call_id="c", name="n", content="\ud83d" + "\ude00")
    decoded = decode_event(encode_event(event).encode("utf-8"))
    assert isinstance(decoded, ToolResult) and decoded.content == "😀"


def test_plain_non_ascii_text_is_written_as_utf8_not_escaped() -> None:
    line = encode_event(TurnEnd(seq=0, ts=1.0, turn=1, reason="error", failure=Failure("c", "überlastet ✓")))
    assert "überlastet ✓" in line


# ------------------------------------------------------------------ the on-disk bytes
#
# encode_event is a generated fast encoder; the log format is what the general
# encoder below (cattrs + json, the codec's encoder before the fast one) wrote.
# Every line must stay byte-identical to it, odd values included.

# The codec's converter: it leaves fields marked omit_if_default out at their
# default (docs/sessions.rst), which the plain converter below would write.
_reference_converter = _codec._converter
_reference_utf8 = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_reference_ascii = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode


def reference_encode(event: Event) -> str:
    data = {"type": event.type, **_reference_converter.unstructure(event, type(event))}
    line = _reference_utf8(data)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return _reference_ascii(data)
    return line


def _outcome(encode: Any, event: Event) -> tuple[str, str]:
    try:
        return "line", encode(event)
    except Exception as exc:  # the same error type and message, or the same line
        return type(exc).__name__, str(exc)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@given(data=st.data())
def test_every_event_type_encodes_byte_identical_to_the_reference(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[cls])
    assert encode_event(event) == reference_encode(event)


def test_every_event_class_has_a_generated_encoder() -> None:
    # Fields left out at their default (omit_if_default) are written by the generated
    # encoders too: no event class is left to the slower general encoder.
    assert [cls for cls in EVENT_TYPES if _codec.encoder_of(cls) is _codec._encode_general] == []


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@given(data=st.data())
def test_the_fast_encoder_writes_what_the_general_encoder_writes(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[cls])
    assert _codec.encoder_of(cls)(event) == _codec._encode_general(event)


# A record and an event shaped to exercise every form of omit_if_default field the
# generator handles: a plain default, a factory (also one taking the instance), a
# converted default, omittable fields before others (the general encoder writes them
# last), and a record whose every field may be left out.


def _mirror_default(instance: Any) -> int:
    return int(instance.early)


@attrs.frozen
class _AllOptional:
    first: int | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT)
    second: tuple[str, ...] = attrs.field(factory=tuple, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class _Mixed:
    a: int = attrs.field(default=0, metadata=OMIT_IF_DEFAULT)
    b: str = "x"
    c: _AllOptional = attrs.field(factory=_AllOptional, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class _Probe(Event):
    type: ClassVar[str] = "test/probe"
    early: int = attrs.field(default=1, metadata=OMIT_IF_DEFAULT)
    mixed: _Mixed | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT)
    scaled: float = attrs.field(default=1, converter=float, metadata=OMIT_IF_DEFAULT)
    mirror: int = attrs.field(default=attrs.Factory(_mirror_default, takes_self=True), metadata=OMIT_IF_DEFAULT)
    flag: bool = False
    extra: dict[str, Any] | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT)


_codec._register_omitting(_Probe, set())
_probe_encoders = _codec._EncoderGen().compile((_Probe,))  # empty when the generator declines _Probe

small = st.integers(min_value=-2, max_value=2)
all_optionals = st.builds(_AllOptional, first=st.none() | small, second=st.lists(texts, max_size=2).map(tuple))
mixeds = st.builds(_Mixed, a=small, b=texts, c=all_optionals)
probes = st.builds(
    _Probe,
    seq=ints,
    ts=floats,
    early=small,
    mixed=st.none() | mixeds,
    scaled=small,
    mirror=small,
    flag=st.booleans(),
    extra=st.none() | st.dictionaries(texts, json_values, max_size=2),
)


@given(event=probes)
def test_the_generator_writes_omit_if_default_fields_as_the_general_encoder(event: _Probe) -> None:
    assert _probe_encoders[_Probe](event) == reference_encode(event)


def test_the_generator_leaves_out_every_default_and_orders_omittable_fields_last() -> None:
    encode = _probe_encoders[_Probe]
    assert encode(_Probe(seq=0, ts=1.0)) == '{"type":"test/probe","seq":0,"ts":1.0,"flag":false}'
    event = _Probe(seq=0, ts=1.0, early=2, mixed=_Mixed(a=1, c=_AllOptional(second=("s",))), scaled=2, mirror=2)
    line = '{"type":"test/probe","seq":0,"ts":1.0,"flag":false,"early":2,'
    line += '"mixed":{"b":"x","a":1,"c":{"second":["s"]}},"scaled":2.0}'  # mirror equals early: its default
    assert encode(event) == line == reference_encode(event)


class _Text(str):
    pass


class _Number(int):
    pass


class _SubCall(ToolCall):
    pass


# Values of the wrong type, or that the general encoder refuses.
odd_values = st.one_of(
    st.none(),
    st.booleans(),
    ints,
    st.floats(),  # NaN and infinities included
    st.integers().map(float),
    texts,
    texts.map(_Text),
    st.integers().map(_Number),
    st.text(max_size=3),  # lone surrogates included
    st.lists(texts, max_size=2),
    st.lists(tool_calls, max_size=2).map(tuple),
    st.lists(inbox_messages, max_size=2),
    tool_calls,
    st.builds(_SubCall, id=texts, name=texts, arguments=texts),
    usages,
    failures,
    st.builds(object),
)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@settings(max_examples=300)
@given(data=st.data())
def test_an_odd_field_value_encodes_or_fails_exactly_as_the_reference(cls: type[Event], data: st.DataObject) -> None:
    event = data.draw(EVENT_STRATEGIES[cls])
    name = data.draw(st.sampled_from(sorted(EVENT_FIELDS[cls])))
    odd = attrs.evolve(event, **{name: data.draw(odd_values)})
    assert _outcome(encode_event, odd) == _outcome(reference_encode, odd)


@pytest.mark.parametrize(
    "event",
    [
        AssistantMessage(seq=1, ts=2, turn=1, step=1, text="\ud800 ü", tool_calls=(_SubCall("c", "n", "{}"),)),
        RequestHeader(seq=True, ts=1.0, turn=1, step=1, provider="p", model="m", tools=["a"]),  # type: ignore[arg-type]
        TurnEnd(seq=0, ts=float("inf"), turn=1, reason="error"),
        RequestRetry(seq=0, ts=1.0, turn=1, step=1, attempt=1, delay=1.0, failure=Failure("c", "m", retry_after=-0.0)),
        ToolResult(seq=0, ts=1e300, turn=-(2**70), step=0, call_id=_Text("c"), name="n", content='\x00\x1f"\\'),
        ToolResult(seq=0, ts=1.0, turn=1, step=1, call_id="c", name="n", content="x", is_error=1),  # type: ignore[arg-type]
        TurnEnd(seq=0, ts=1.0, turn=1.0, reason="error", failure=Failure("c", "m", retryable=0)),  # type: ignore[arg-type]
        StepEnd(seq=0, ts=float("nan"), turn=1, step=1),
    ],
)
def test_examples_of_odd_values_encode_as_the_reference(event: Event) -> None:
    assert _outcome(encode_event, event) == _outcome(reference_encode, event)


# ------------------------------------------------------------------ rejections

TURN_START = {"type": "turn/start", "seq": 0, "ts": 1.5, "turn": 1}
TURN_END = {"type": "turn/end", "seq": 3, "ts": 1.5, "turn": 1, "reason": "completed"}
ASSISTANT = {"type": "assistant/message", "seq": 2, "ts": 1.5, "turn": 1, "step": 1, "text": "hi"}
REQUEST = {"type": "request/header", "seq": 1, "ts": 1.5, "turn": 1, "step": 1, "provider": "p", "model": "m"}
RESULT = {"type": "tool/result", "seq": 3, "ts": 1.5, "turn": 1, "step": 1, "call_id": "c", "name": "n", "content": "x"}
SPLICE = {"type": "agent/inbox/spliced", "seq": 0, "ts": 1.0, "queue": "next-turn", "start": 0}
BASES = (TURN_START, TURN_END, ASSISTANT, REQUEST, RESULT, SPLICE)


def _line(base: dict[str, Any], **changes: Any) -> str:
    data = {**base, **changes}
    return json.dumps({k: v for k, v in data.items() if v is not _DROP})


_DROP = object()

REJECTED: list[tuple[str, str | bytes, str]] = [
    ("unknown type", _line(TURN_START, type="turn/pause"), r"unknown event type 'turn/pause'"),
    ("no type", _line(TURN_START, type=_DROP), r"unknown event type None"),
    ("non-string type", _line(TURN_START, type=7), r"unknown event type 7"),
    ("extra key", _line(TURN_START, colour="red"), r"invalid 'turn/start' event: unexpected keys \['colour'\]"),
    ("missing key", _line(TURN_START, turn=_DROP), r"invalid 'turn/start' event: missing key 'turn'"),
    ("string for int", _line(TURN_START, turn="1"), r"expected int, got str '1'"),
    ("bool for int", _line(TURN_START, seq=True), r"expected int, got bool True"),
    ("float for int", _line(TURN_START, turn=1.0), r"expected int, got float 1.0"),
    ("bool for float", _line(TURN_START, ts=False), r"expected float, got bool False"),
    ("int for str", _line(ASSISTANT, text=5), r"expected str, got int 5"),
    ("null for str", _line(ASSISTANT, text=None), r"expected str, got NoneType"),
    ("string for bool", _line(RESULT, is_error="yes"), r"expected bool, got str 'yes'"),
    ("int for bool", _line(RESULT, is_error=1), r"expected bool, got int 1"),
    ("bool for optional int", _line(REQUEST, max_tokens=True), r"expected int, got bool True"),
    ("string for tuple", _line(REQUEST, tools="bash"), r"expected a JSON array, got str 'bash'"),
    ("object for tuple", _line(REQUEST, tools={"bash": 1}), r"expected a JSON array, got dict"),
    ("NaN", _line(TURN_START, ts=float("nan")), r"expected a finite number, got nan"),
    ("Infinity", _line(TURN_START, ts=float("inf")), r"expected a finite number, got inf"),
    ("overflowing float", '{"type":"turn/start","seq":0,"ts":1e999,"turn":1}', r"finite number"),
    ("bad literal", _line(TURN_END, reason="finished"), r"invalid 'turn/end' event: finished not in literal"),
    ("bad optional literal", _line(TURN_END, cause="boredom"), r"boredom not in literal"),
    (
        "nested extra key",
        _line(TURN_END, failure={"code": "c", "message": "m", "why": 1}),
        r"unexpected keys \['why'\]",
    ),
    ("nested missing key", _line(ASSISTANT, tool_calls=[{"id": "c1", "name": "bash"}]), r"missing key 'arguments'"),
    ("nested wrong type", _line(ASSISTANT, usage={"input_tokens": "3"}), r"expected int, got str '3'"),
    (
        "nested bad literal",
        _line(SPLICE, inserted=[{"id": "m", "text": "t", "mode": "shout"}]),
        r"shout not in literal",
    ),
    ("bad queue literal", _line(SPLICE, queue="later"), r"later not in literal"),
    (
        "reasoning block data not an object",
        _line(ASSISTANT, reasoning_blocks=[{"provider": "anthropic", "data": ["thinking"]}]),
        r"expected a JSON object, got list",
    ),
    (
        "reasoning block without provider",
        _line(ASSISTANT, reasoning_blocks=[{"data": {}}]),
        r"missing key 'provider'",
    ),
    ("extra_body not an object", _line(REQUEST, settings={"extra_body": [1]}), r"expected a JSON object, got list"),
    ("array", "[1, 2]", r"an event must be a JSON object, got list"),
    ("string", '"turn/start"', r"an event must be a JSON object, got str"),
    ("null", "null", r"an event must be a JSON object, got NoneType"),
    ("invalid JSON", '{"type": "turn/start", ', r"not valid JSON"),
    ("empty line", "", r"not valid JSON"),
    ("invalid UTF-8", b'{"type":"turn/start","seq":0,"ts":1.0,"turn":1,"x":"\xff"}', r"not valid JSON"),
]


@pytest.mark.parametrize(
    ("line", "message"), [(line, msg) for _, line, msg in REJECTED], ids=[name for name, _, _ in REJECTED]
)
def test_a_bad_event_line_is_rejected_with_a_message_naming_the_problem(line: str | bytes, message: str) -> None:
    with pytest.raises(EventDecodeError, match=message):
        decode_event(line)


@pytest.mark.parametrize("base", BASES, ids=[str(b["type"]) for b in BASES])
def test_the_rejection_fixtures_edit_valid_events(base: dict[str, Any]) -> None:
    # Guard the table above: each rejected line is a valid event but for its one problem.
    event = decode_event(json.dumps(base))
    assert event.type == base["type"] and event.seq == base["seq"]


HEADER = {
    "type": "session",
    "id": "s1",
    "created_at": 1.5,
    "cwd": "/w",
    "parent_session": None,
    "seed_length": 0,
    "version": FORMAT_VERSION,
}


@pytest.mark.parametrize("version", [FORMAT_VERSION + 1, 0, "1"])
def test_a_header_of_another_format_version_is_unsupported(version: object) -> None:
    with pytest.raises(UnsupportedFormatError, match=f"version {version!r} is not supported"):
        decode_header(json.dumps({**HEADER, "version": version}))


@pytest.mark.parametrize(
    ("line", "message"),
    [
        (json.dumps({**HEADER, "extra": 1}), r"invalid session header: unexpected keys \['extra'\]"),
        (json.dumps({**HEADER, "created_at": "yesterday"}), r"invalid session header: expected float"),
        (json.dumps({k: v for k, v in HEADER.items() if k != "id"}), r"missing key 'id'"),
        (json.dumps(TURN_START), r"not a session header"),
        (json.dumps([HEADER]), r"not a session header"),
        ('{"type": "session", ', r"session header is not valid JSON"),
    ],
    ids=["extra key", "wrong type", "missing id", "an event", "array", "invalid JSON"],
)
def test_a_bad_header_is_rejected_with_a_message_naming_the_problem(line: str, message: str) -> None:
    with pytest.raises(EventDecodeError, match=message):
        decode_header(line)


def test_a_valid_header_fixture_decodes() -> None:
    assert decode_header(json.dumps(HEADER)) == SessionHeader(id="s1", created_at=1.5, cwd="/w")


def test_encoding_refuses_a_non_finite_float() -> None:
    with pytest.raises(ValueError, match="JSON"):
        encode_event(TurnStart(seq=0, ts=float("nan"), turn=1))


def test_message_origin_is_written_only_for_notices_and_old_lines_read_as_user() -> None:
    # A line written before messages had an origin reads as a user message.
    old = '{"type":"user/message","seq":3,"ts":1.5,"turn":1,"step":1,"message_id":"m1","text":"hi","mode":"followup"}'
    event = decode_event(old)
    assert isinstance(event, UserMessage)
    assert event.origin == "user"
    # The default is not written, so a user message's line is as before.
    assert "origin" not in encode_event(event)
    assert json.loads(encode_event(event)) == json.loads(old)
    notice = attrs.evolve(event, origin="task-notice")
    line = encode_event(notice)
    assert json.loads(line)["origin"] == "task-notice"
    assert decode_event(line) == notice
    spliced = InboxSpliced(
        seq=4, ts=2.0, queue="next-turn", start=0, inserted=(InboxMessage(id="n", text="t", origin="task-notice"),)
    )
    assert decode_event(encode_event(spliced)) == spliced
    with pytest.raises(ValueError, match="origin"):
        InboxMessage(id="n", text="t", origin="robot")  # type: ignore[arg-type]


def test_reasoning_blocks_are_written_only_when_present_and_old_lines_read_as_none() -> None:
    old = (
        '{"type":"assistant/message","seq":3,"ts":1.5,"turn":1,"step":1,"text":"hi",'
        '"reasoning":"","tool_calls":[],"usage":null,"finish":"stop"}'
    )
    event = decode_event(old)
    assert isinstance(event, AssistantMessage) and event.reasoning_blocks == ()
    assert encode_event(event) == old
    data = {"type": "thinking", "thinking": "hm", "signature": "c2ln", "n": [1, 2.5, None]}
    block = ReasoningBlock("anthropic", data)
    with_blocks = attrs.evolve(event, reasoning_blocks=(block, ReasoningBlock("openai-responses", {"id": "rs_1"})))
    line = encode_event(with_blocks)
    assert line == _codec._encode_general(with_blocks)
    assert json.loads(line)["reasoning_blocks"][0] == {"provider": "anthropic", "data": dict(block.data)}
    decoded = decode_event(line)
    assert decoded == with_blocks and encode_event(decoded) == line


# ------------------------------------------------------------------ plain constructors


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
@given(data=st.data())
def test_the_plain_constructor_of_an_event_builds_what_the_class_builds(cls: type[Event], data: st.DataObject) -> None:
    # Session.append builds events with it (docs/guarantees.rst, "Sessions"): the same
    # object, immutable, from the same arguments, by position or by keyword.
    construct = _session._CONSTRUCTORS[cls]  # what Session.append builds events with
    assert construct is not cls
    assert construct.__qualname__ == f"{cls.__qualname__}.__init__"
    event = data.draw(EVENT_STRATEGIES[cls])
    values = {field.name: getattr(event, field.name) for field in attrs.fields(cls)}
    for built in (construct(**values), construct(*values.values())):
        assert type(built) is cls
        assert built == event
        assert hash(built) == hash(event)
        assert repr(built) == repr(event)
        assert encode_event(built) == encode_event(event)
        with pytest.raises(attrs.exceptions.FrozenInstanceError):
            built.seq = 1  # type: ignore[misc]
    # Left-out fields take the class's defaults.
    required = {f.name: values[f.name] for f in attrs.fields(cls) if f.default is attrs.NOTHING}
    assert construct(**required) == cls(**required)


@pytest.mark.parametrize("cls", EVENT_TYPES, ids=lambda cls: cls.type)
def test_the_plain_constructor_refuses_bad_arguments_as_the_class_does(cls: type[Event]) -> None:
    construct = _session._CONSTRUCTORS[cls]
    for args, kwargs in (((), {}), ((0, 1.0), {"seq": 0}), ((0, 1.0), {"no_such_field": 1})):
        with pytest.raises(TypeError) as public:
            cls(*args, **kwargs)
        with pytest.raises(TypeError) as plain:
            construct(*args, **kwargs)
        assert str(plain.value) == str(public.value)


def _positive(instance: object, attribute: object, value: int) -> None:
    if value <= 0:
        raise ValueError("positive")


@attrs.frozen
class _Validated:
    a: int = attrs.field(validator=_positive)


@attrs.frozen
class _Converted:
    a: int = attrs.field(converter=int)


@attrs.frozen
class _Factory:
    a: list[int] = attrs.field(factory=list)


@attrs.frozen
class _PostInit:
    a: int

    def __attrs_post_init__(self) -> None:
        pass


@attrs.frozen(cache_hash=True)
class _CachedHash:
    a: int


@attrs.frozen
class _KeywordOnly:
    a: int = attrs.field(kw_only=True)


@attrs.frozen
class _Private:
    _a: int


@attrs.frozen(slots=False)
class _Unslotted:
    a: int


@attrs.frozen
class _Plain:
    a: int
    b: str = "x"


@pytest.mark.parametrize(
    "cls",
    [
        _Validated,
        _Converted,
        _Factory,
        _PostInit,
        _CachedHash,
        _KeywordOnly,
        _Private,
        _Unslotted,
        InboxMessage,
        SessionHeader,
    ],
)
def test_there_is_no_plain_constructor_when_init_does_more_than_store_the_fields(cls: type) -> None:
    # A class whose attrs __init__ validates, converts, makes defaults or hooks keeps it.
    assert plain_constructor(cls) is None


def test_a_plain_record_gets_a_plain_constructor() -> None:
    construct = plain_constructor(_Plain)
    assert construct is not None
    assert construct(1) == _Plain(1)
    assert construct(2, b="y") == _Plain(2, "y")


def test_the_records_the_driver_builds_from_checked_values_use_plain_constructors() -> None:
    from trio_harness import _records
    from trio_harness.agents import _budget, _dispatch, _history, _model_stream
    from trio_harness.model._protocol import AssistantMessage as AssistantRecord
    from trio_harness.model._protocol import ToolMessage
    from trio_harness.model._protocol import UserMessage as UserRecord

    calls = (ToolCall(id="c1", name="echo", arguments='{"x": "hi"}'),)
    cases: list[tuple[object, type, dict[str, object]]] = [
        (_history._user_message, UserRecord, {"text": "hi"}),
        (_history._assistant_message, AssistantRecord, {"text": "t", "tool_calls": calls, "reasoning": "r"}),
        (_history._tool_message, ToolMessage, {"call_id": "c1", "name": "echo", "content": "x", "is_error": True}),
        (_history._turn_mark, _history.TurnMark, {"seq": 3, "index": 1, "chars": 10}),
        (_budget._plain_totals, UsageTotals, {"input_tokens": 1, "output_tokens": 2, "requests": 3}),
        (_records._plain_totals, UsageTotals, {"input_tokens": 1, "cache_hit_tokens": 2, "reasoning_tokens": 4}),
        (_model_stream._tool_call, ToolCall, {"id": "c1", "name": "echo", "arguments": "{}"}),
    ]
    for construct, cls, fields in cases:
        assert construct is not cls, cls  # a plain constructor, not the class
        assert callable(construct)
        built = construct(**fields)
        assert type(built) is cls
        assert built == cls(**fields)
        assert repr(built) == repr(cls(**fields))
    assert UsageTotals(5, 5, 5, 5, 5) - UsageTotals(1, 2, 3, 4, 5) == UsageTotals(4, 3, 2, 1, 0)
    assert UsageTotals(1) + UsageTotals(2) == UsageTotals(3)
    from trio_harness.agents._tools import ToolContext

    given: dict[str, Any] = {"agent": None, "agents": None, "call_id": "c1", "turn": 1, "step": 2}
    context = _dispatch._tool_context(**given)
    assert type(context) is ToolContext
    assert attrs.asdict(context, recurse=False) == attrs.asdict(ToolContext(**given), recurse=False)


def test_an_inbox_message_round_trips_and_bad_text_is_named() -> None:
    from trio_harness.session._codec import decode_inbox_message, encode_inbox_message

    plain = InboxMessage("m1", "hi")
    assert encode_inbox_message(plain) == '{"id":"m1","text":"hi","mode":"followup"}'  # defaults left out
    notice = InboxMessage("m2", "done", "inject", origin="task-notice")
    assert decode_inbox_message(encode_inbox_message(notice)) == notice
    for bad, named in (("[1]", "JSON object"), ('{"id": "m", "text": 3}', "str"), ("{", "Expecting")):
        with pytest.raises(EventDecodeError, match="invalid inbox message") as caught:
            decode_inbox_message(bad)
        assert named in str(caught.value)
