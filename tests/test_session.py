"""The session log (``Session``) and session id validation (docs/guarantees.rst, "Sessions")."""

from __future__ import annotations

import logging
from pathlib import Path

import attrs
import pytest
import trio

from trio_harness._errors import InvalidSessionIdError
from trio_harness.session import (
    JsonlStore,
    MemoryStore,
    Session,
    SessionHeader,
    SessionRegistry,
    validate_session_id,
)
from trio_harness.session._events import AssistantChunk, Event, StepStart, TurnStart


@attrs.define
class FakeClock:
    """An injectable wall clock that advances by one second per reading."""

    now: float = 1000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@attrs.define
class RecordingWriter:
    """A SessionWriter that records what it was handed."""

    written: list[Event] = attrs.field(factory=list)
    flushes: int = 0
    closed: bool = False

    def write(self, event: Event) -> None:
        self.written.append(event)

    async def flush(self, *, sync: bool = True) -> None:
        self.flushes += 1

    async def aclose(self) -> None:
        self.closed = True


def make_session(writer: RecordingWriter | None = None) -> Session:
    return Session(header=SessionHeader(id="s1", created_at=1.0), events=[], writer=writer, clock=FakeClock())


# ------------------------------------------------------------------ the log


def test_seq_equals_the_index_and_ts_comes_from_the_injected_clock() -> None:
    session = make_session()
    first = session.append(TurnStart, turn=1)
    second = session.append(StepStart, turn=1, step=1)
    third = session.append(AssistantChunk, turn=1, step=1, kind="text", text="hi")
    assert [e.seq for e in session.events] == [0, 1, 2] == list(range(len(session)))
    assert [first.ts, second.ts, third.ts] == [1001.0, 1002.0, 1003.0]
    assert list(session.events) == [first, second, third]
    assert isinstance(third, AssistantChunk) and third.text == "hi"
    assert session.id == "s1"


def test_append_hands_the_event_to_the_writer_before_returning() -> None:
    writer = RecordingWriter()
    session = make_session(writer)
    event = session.append(TurnStart, turn=1)
    assert writer.written == [event]
    assert writer.written[0] is event


async def test_flush_delegates_to_the_writer_and_is_a_no_op_without_one() -> None:
    writer = RecordingWriter()
    await make_session(writer).flush()
    assert writer.flushes == 1
    await make_session(None).flush()  # no writer: nothing to do


def test_events_are_frozen() -> None:
    session = make_session()
    event = session.append(TurnStart, turn=1)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.seq = 5  # type: ignore[misc]
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        event.turn = 2  # type: ignore[misc]
    assert session.events[0] == TurnStart(seq=0, ts=1001.0, turn=1)


def test_append_refuses_an_explicit_seq() -> None:
    session = make_session()
    with pytest.raises(TypeError):
        session.append(TurnStart, seq=7, turn=1)
    assert len(session) == 0


def test_observers_run_after_the_append_with_the_event() -> None:
    session = make_session()
    seen: list[tuple[Event, int, bool]] = []

    def observer(event: Event) -> None:
        # The event is already in the log when the observer sees it.
        seen.append((event, len(session), session.events[-1] is event))

    session.observe(observer)
    event = session.append(TurnStart, turn=1)
    assert seen == [(event, 1, True)]


def test_a_raising_observer_is_logged_and_contained(caplog: pytest.LogCaptureFixture) -> None:
    session = make_session()
    later: list[Event] = []

    def boom(event: Event) -> None:
        raise RuntimeError("observer failed")

    session.observe(boom)
    session.observe(later.append)
    caplog.set_level(logging.ERROR, logger="trio_harness.session")
    event = session.append(TurnStart, turn=1)
    assert later == [event]
    assert list(session.events) == [event]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and "turn/start" in errors[0].getMessage()
    assert errors[0].exc_info is not None and str(errors[0].exc_info[1]) == "observer failed"


def test_observe_returns_an_idempotent_remover() -> None:
    session = make_session()
    seen: list[int] = []
    remove = session.observe(lambda e: seen.append(e.seq))
    session.append(TurnStart, turn=1)
    remove()
    remove()
    session.append(TurnStart, turn=2)
    assert seen == [0]


def test_an_observer_removing_itself_does_not_skip_the_next_one() -> None:
    session = make_session()
    seen: list[str] = []

    def once(event: Event) -> None:
        seen.append("once")
        remove()

    remove = session.observe(once)
    session.observe(lambda e: seen.append("always"))
    session.append(TurnStart, turn=1)
    session.append(TurnStart, turn=2)
    assert seen == ["once", "always", "always"]


# ------------------------------------------------------------------ session ids


@pytest.mark.parametrize(
    ("session_id", "message"),
    [
        ("", "must not be empty"),
        ("/", "contains a path separator"),
        ("a/b", "contains a path separator"),
        ("a\\b", "contains a path separator"),
        ("..", "is a relative path component"),
        (".", "is a relative path component"),
        ("a\x00b", "contains a NUL character"),
        ("a\nb", "contains a control character"),
        ("\x1b[31m", "contains a control character"),
        ("tab\there", "contains a control character"),
        ("del\x7f", "contains a control character"),
        ("a\ud800b", "contains a lone surrogate"),
        ("x" * 201, "is 201 characters; at most 200"),
        (None, "must be a string, got NoneType"),
        (42, "must be a string, got int"),
        (b"abc", "must be a string, got bytes"),
    ],
    ids=[
        "empty",
        "slash",
        "nested",
        "backslash",
        "dotdot",
        "dot",
        "nul",
        "newline",
        "escape",
        "tab",
        "del",
        "surrogate",
        "too long",
        "none",
        "int",
        "bytes",
    ],
)
def test_invalid_session_ids_are_rejected_naming_the_problem(session_id: object, message: str) -> None:
    with pytest.raises(InvalidSessionIdError, match=message):
        validate_session_id(session_id)


def test_invalid_session_id_errors_are_value_errors() -> None:
    with pytest.raises(ValueError, match="empty"):
        validate_session_id("")


@pytest.mark.parametrize("session_id", ["abc", "a.b", "...", ".hidden", "séance", "a b", "%2F", "😀", "x" * 200])
def test_valid_session_ids_are_returned_unchanged(session_id: str) -> None:
    assert validate_session_id(session_id) is session_id


async def test_flush_waits_unless_the_writer_says_its_flush_never_waits(tmp_path: Path) -> None:
    # The driver shields a turn's final flushes only when they may wait (docs/guarantees.rst, "No silent loss").
    assert not Session(header=SessionHeader(id="s", created_at=1.0), events=[]).flush_waits  # no writer
    persistence = MemoryStore()
    memory = SessionRegistry(persistence)
    in_memory = await memory.prepare_new("m")
    assert not in_memory.flush_waits
    in_memory.append(TurnStart, turn=1)
    with trio.CancelScope() as scope:
        scope.cancel()
        await in_memory.flush()  # never waits, so nothing cancels it
    assert not scope.cancelled_caught
    assert list((await persistence.load("m")).events) == list(in_memory.events)
    jsonl = SessionRegistry(JsonlStore(tmp_path))
    on_disk = await jsonl.prepare_new("j")
    assert on_disk.flush_waits
    await jsonl.discard(on_disk)
