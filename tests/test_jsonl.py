"""The JSONL directory store: layout, appends, torn tails, corruption, id escaping,
every-byte cut recovery, and a real SIGKILL (docs/guarantees.rst, "Sessions").
"""

from __future__ import annotations

import errno
import json
import logging
import os
import signal
import stat
import subprocess
import sys
import threading
import uuid
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from _util import WAIT
from _writer_proc import CYCLE, expected_event
from hypothesis import HealthCheck, Phase, assume, given, settings
from hypothesis import strategies as st

from trio_harness._errors import (
    AgentExistsError,
    InvalidSessionIdError,
    SessionCorruptError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
    UnsupportedFormatError,
)
from trio_harness._harness import open_harness
from trio_harness.model._protocol import ToolCall
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import (
    FORMAT_VERSION,
    JsonlStore,
    SessionHeader,
    SessionRegistry,
    _jsonl_files,
    decode_event,
    encode_event,
    encode_header,
)
from trio_harness.session._create_lock import CLAIM_NAME
from trio_harness.session._events import (
    AssistantChunk,
    AssistantMessage,
    Event,
    InboxMessage,
    InboxSpliced,
    StepEnd,
    StepStart,
    ToolCallRequested,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from trio_harness.session._jsonl_files import LOG_NAME, escape_session_id, unescape_session_id
from trio_harness.session._recovery import closers_for

TS = 1_700_000_000.0
Step = tuple[type[Event], dict[str, Any]]


def fixed_clock() -> float:
    return TS


def header(session_id: str = "s1", **changes: Any) -> SessionHeader:
    return SessionHeader(id=session_id, created_at=TS, cwd="/work", **changes)


def build(steps: list[Step], first_seq: int = 0) -> list[Event]:
    return [cls(seq=first_seq + i, ts=TS + i, **fields) for i, (cls, fields) in enumerate(steps)]


def turn_steps(turn: int, calls: int = 1) -> list[Step]:
    tool_calls = tuple(ToolCall(f"c{turn}.{k}", "bash", '{"command": "ls"}') for k in range(calls))
    steps: list[Step] = [
        (TurnStart, {"turn": turn}),
        (StepStart, {"turn": turn, "step": 1}),
        (AssistantMessage, {"turn": turn, "step": 1, "text": "ünï\ncode", "tool_calls": tool_calls}),
    ]
    for call in tool_calls:
        steps.append((ToolResult, {"turn": turn, "step": 1, "call_id": call.id, "name": "bash", "content": "ok"}))
    steps += [(StepEnd, {"turn": turn, "step": 1}), (TurnEnd, {"turn": turn, "reason": "completed"})]
    return steps


async def write_log(persistence: JsonlStore, events: list[Event], session_id: str = "s1") -> Path:
    """Write a new session through the writer (one flush); returns the log path."""
    writer = await persistence.open_writer(header(session_id))
    for event in events:
        writer.write(event)
    await writer.flush()
    await writer.aclose()
    return persistence.path_of(session_id)


def snapshot(root: Path) -> dict[str, tuple[bytes, int] | None]:
    """Every directory and file under ``root``, with file bytes and mtime."""
    state: dict[str, tuple[bytes, int] | None] = {}
    for path in sorted(root.rglob("*")):
        key = str(path.relative_to(root))
        state[key] = (path.read_bytes(), path.stat().st_mtime_ns) if path.is_file() else None
    return state


@pytest.fixture
def persistence(tmp_path: Path) -> JsonlStore:
    return JsonlStore(tmp_path / "root")


# ------------------------------------------------------------------ layout


async def test_no_file_or_directory_before_the_first_flush(persistence: JsonlStore) -> None:
    writer = await persistence.open_writer(header())
    await writer.flush()  # nothing written: nothing created but the create lock (issue 24)
    assert [p.name for p in persistence.root.iterdir()] == [CLAIM_NAME]
    assert not await persistence.exists("s1")

    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s2")
    entry = store.enter(session)
    session.append(TurnStart, turn=1)  # buffered, not flushed
    assert not await persistence.exists("s2") and await persistence.list() == []
    await session.flush()
    assert await persistence.exists("s2")
    await store.detach(entry)
    await writer.aclose()
    assert sorted(p.name for p in persistence.root.iterdir()) == [CLAIM_NAME, "s2"]


async def test_a_flush_in_a_cancelled_scope_raises_cancelled_and_writes_nothing(tmp_path: Path) -> None:
    persistence = JsonlStore(tmp_path, fsync=False)
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    session.append(TurnStart, turn=1)
    await session.flush()
    path = persistence.path_of("s1")
    session.append(TurnStart, turn=2)
    with trio.CancelScope() as scope:
        scope.cancel()
        await session.flush()
    assert scope.cancelled_caught
    assert len(path.read_bytes().splitlines()) == 2  # the header and turn 1
    await session.flush()  # the buffered event is still there
    assert [decode_event(line) for line in path.read_bytes().splitlines()[1:]] == list(session.events)
    await store.detach(entry)


async def test_overlapping_flushes_write_their_batches_in_order(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The first flush waits for its fsync in a worker thread; a second flush meanwhile waits for it.
    persistence = JsonlStore(tmp_path)
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    session.append(TurnStart, turn=1)
    await session.flush()  # creates the log
    path = persistence.path_of("s1")
    release = threading.Event()
    real_fsync = os.fsync

    def gated_fsync(fd: int) -> None:
        release.wait(WAIT)
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", gated_fsync)
    done: list[int] = []

    async def flush(number: int) -> None:
        await session.flush()
        done.append(number)

    async with trio.open_nursery() as nursery:
        session.append(TurnStart, turn=2)
        nursery.start_soon(flush, 1)
        await trio.testing.wait_all_tasks_blocked()  # flush 1 holds the writer, in fsync
        session.append(TurnStart, turn=3)
        nursery.start_soon(flush, 2)
        await trio.testing.wait_all_tasks_blocked()  # flush 2 waits for the writer
        assert done == [] and len(path.read_bytes().splitlines()) == 3  # batch 2 is not written yet
        release.set()
    assert done == [1, 2]
    assert [decode_event(line) for line in path.read_bytes().splitlines()[1:]] == list(session.events)
    await store.detach(entry)


async def test_the_log_is_a_header_line_then_one_event_per_line(persistence: JsonlStore) -> None:
    events = build(turn_steps(1, calls=2) + turn_steps(2))
    path = await write_log(persistence, events)
    assert path == persistence.root / "s1" / LOG_NAME
    data = path.read_bytes()
    assert data.endswith(b"\n")
    lines = data.decode("utf-8").split("\n")[:-1]
    assert len(lines) == 1 + len(events)
    objects = [json.loads(line) for line in lines]
    assert all(isinstance(o, dict) and isinstance(o.get("type"), str) for o in objects)
    assert objects[0] == {
        "type": "session",
        "id": "s1",
        "created_at": TS,
        "cwd": "/work",
        "parent_session": None,
        "seed_length": 0,
        "version": FORMAT_VERSION,
    }
    assert [o["seq"] for o in objects[1:]] == list(range(len(events)))
    assert [o["type"] for o in objects[1:]] == [e.type for e in events]
    assert [decode_event(line) for line in lines[1:]] == events
    loaded = await persistence.load("s1")
    assert loaded.header == header() and list(loaded.events) == events
    assert (loaded.dropped_tail, loaded.valid_length) == (0, len(data))


async def test_the_writer_only_appends(persistence: JsonlStore) -> None:
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    path = persistence.path_of("s1")
    sizes = []
    previous = b""
    inode = None
    for turn in range(1, 4):
        for cls, fields in turn_steps(turn):
            session.append(cls, **fields)
        await session.flush()
        data = path.read_bytes()
        assert data.startswith(previous) and len(data) > len(previous)
        inode = inode or path.stat().st_ino
        assert path.stat().st_ino == inode  # the same file, never rewritten
        previous = data
        sizes.append(len(data))
    await store.detach(entry)

    # A resumed writer appends to the same bytes too.
    resumed = await store.prepare_resume("s1")
    entry = store.enter(resumed)
    resumed.append(TurnStart, turn=4)
    await store.detach(entry)
    data = path.read_bytes()
    assert data.startswith(previous) and path.stat().st_ino == inode
    assert [e.seq for e in (await persistence.load("s1")).events] == list(range(len(resumed)))


async def test_flush_without_fsync_writes_the_same_bytes(tmp_path: Path) -> None:
    events = build(turn_steps(1))
    synced = await write_log(JsonlStore(tmp_path / "a"), events)
    unsynced = await write_log(JsonlStore(tmp_path / "b", fsync=False), events)
    assert synced.read_bytes() == unsynced.read_bytes()


async def test_a_lone_surrogate_does_not_poison_the_writer(persistence: JsonlStore) -> None:
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    session.append(TurnStart, turn=1)
    session.append(AssistantChunk, turn=1, step=1, kind="text", text="half an emoji: \ud83d")
    await session.flush()
    session.append(TurnEnd, turn=1, reason="completed")
    await store.detach(entry)
    assert list((await persistence.load("s1")).events) == list(session.events)


async def test_a_second_writer_of_the_same_log_is_refused_at_prepare(tmp_path: Path) -> None:
    # Two stores over one root stand for two processes (flock is per open file);
    # the real second process is in test_a_session_live_in_another_process_cannot_be_resumed.
    root = tmp_path / "root"
    await write_log(JsonlStore(root), build(turn_steps(1)))
    first = SessionRegistry(JsonlStore(root), clock=fixed_clock)
    second = SessionRegistry(JsonlStore(root), clock=fixed_clock)
    a = await first.prepare_resume("s1")
    # Refused before publication, before any flush of the first writer.
    with pytest.raises(SessionLockedError, match="live in another process") as info:
        await second.prepare_resume("s1")
    assert isinstance(info.value, SessionExistsError) and info.value.path == str(JsonlStore(root).path_of("s1"))
    entry_a = first.enter(a)
    for cls, fields in turn_steps(2):
        a.append(cls, **fields)
    await first.detach(entry_a)  # flushes, then releases the lock
    b = await second.prepare_resume("s1")
    assert list(b.events) == list(a.events)  # read after the lock was taken: a's flush included
    await second.discard(b)  # a discarded preparation releases the lock too
    c = await first.prepare_resume("s1")
    await first.discard(c)


async def test_a_prepared_resume_in_this_process_holds_the_session(persistence: JsonlStore) -> None:
    await write_log(persistence, build(turn_steps(1)))
    store = SessionRegistry(persistence, clock=fixed_clock)
    held = await store.prepare_resume("s1")  # prepared, not live yet (setup running)
    with pytest.raises(SessionLockedError, match="being resumed in this process"):
        await store.prepare_resume("s1")
    await store.discard(held)
    await store.discard(await store.prepare_resume("s1"))


async def test_a_new_session_never_overwrites_a_stored_one(persistence: JsonlStore) -> None:
    path = await write_log(persistence, build(turn_steps(1)))
    before = path.read_bytes()
    with pytest.raises(SessionExistsError, match="already stored"):
        await persistence.open_writer(header())  # refused when the id is claimed, before anything runs
    assert path.read_bytes() == before


async def test_save_writes_a_whole_session_atomically_and_refuses_to_overwrite(
    persistence: JsonlStore,
) -> None:
    events = build(turn_steps(1))
    await persistence.save(header("forked", parent_session="s0", seed_length=len(events)), events)
    loaded = await persistence.load("forked")
    assert loaded.header.parent_session == "s0" and list(loaded.events) == events
    path = persistence.path_of("forked")
    assert os.listdir(path.parent) == [LOG_NAME]  # no temporary file left behind
    before = path.read_bytes()
    with pytest.raises(SessionExistsError, match="already stored"):
        await persistence.save(header("forked"), [])
    assert path.read_bytes() == before and os.listdir(path.parent) == [LOG_NAME]


async def test_list_returns_readable_headers_and_skips_damaged_ones(
    persistence: JsonlStore, caplog: pytest.LogCaptureFixture
) -> None:
    await write_log(persistence, build(turn_steps(1)), "b")
    await persistence.save(SessionHeader(id="a", created_at=TS - 5), [])
    torn = persistence.root / "torn"
    torn.mkdir()
    (torn / LOG_NAME).write_bytes(encode_header(header("torn")).encode()[:10])
    bad = persistence.root / "bad"
    bad.mkdir()
    (bad / LOG_NAME).write_bytes(b"not json\n")
    (persistence.root / "stray-file").write_bytes(b"")
    caplog.set_level(logging.WARNING, logger="trio_harness.session.jsonl")
    assert [h.id for h in (await persistence.list())] == ["a", "b"]
    assert any("bad" in r.getMessage() for r in caplog.records)
    assert (await JsonlStore(persistence.root / "missing").list()) == []


# ------------------------------------------------------------------ ids


ids = st.text(st.characters(exclude_categories=["Cs", "Cc"]) | st.sampled_from("%./\\ _-~é😀"), min_size=1, max_size=40)


def is_valid(session_id: str) -> bool:
    return "/" not in session_id and "\\" not in session_id and session_id not in (".", "..")


@given(session_id=ids)
def test_escaping_is_one_to_one_and_stays_a_single_safe_name(session_id: str) -> None:
    assume(is_valid(session_id))
    # Letters, digits, "_" and "-" stay; every other character becomes %XX per UTF-8 byte.
    escaped_length = sum(1 if c.isascii() and (c.isalnum() or c in "_-") else 3 * len(c.encode()) for c in session_id)
    if escaped_length > 255:  # longer than a directory name may be: refused, never cut
        with pytest.raises(InvalidSessionIdError, match="too long"):
            escape_session_id(session_id)
        return
    name = escape_session_id(session_id)
    # unescape is a left inverse, so escape is injective (one-to-one).
    assert unescape_session_id(name) == session_id
    assert "/" not in name and "\x00" not in name and not name.startswith(".")
    assert len(name.encode()) <= 255
    root = Path("/store/root")
    path = JsonlStore(root).path_of(session_id)
    assert path.parent.parent == root and path.parent.name == name


@given(a=ids, b=ids)
def test_distinct_ids_never_share_a_directory(a: str, b: str) -> None:
    assume(is_valid(a) and is_valid(b) and a != b)
    try:
        assert escape_session_id(a) != escape_session_id(b)
    except InvalidSessionIdError:
        pass


@pytest.mark.parametrize(
    ("session_id", "name"),
    [
        (".hidden", "%2Ehidden"),
        ("...", "%2E%2E%2E"),
        ("a.b", "a%2Eb"),
        ("50%", "50%25"),
        ("é", "%C3%A9"),
        ("a-Z_9", "a-Z_9"),
    ],
)
def test_escaped_names_are_never_hidden_or_relative(session_id: str, name: str) -> None:
    assert escape_session_id(session_id) == name
    assert unescape_session_id(name) == session_id


@pytest.mark.parametrize(("a", "b"), [("A", "%41"), ("a b", "a%20b"), ("é", "%C3%A9"), ("a", "A"), ("-", "%2D")])
async def test_lookalike_ids_get_separate_directories(persistence: JsonlStore, a: str, b: str) -> None:
    await write_log(persistence, build(turn_steps(1)), a)
    await write_log(persistence, build(turn_steps(1) + turn_steps(2)), b)
    assert len((await persistence.load(a)).events) == len(turn_steps(1))
    assert len((await persistence.load(b)).events) == len(turn_steps(1) + turn_steps(2))
    assert sorted(h.id for h in (await persistence.list())) == sorted([a, b])


@pytest.mark.parametrize("session_id", ["/", "a/b", "..", ".", "a\x00b", "", "../../etc", "a\\b", "x" * 201, "\ud800"])
async def test_ids_that_could_escape_the_root_are_rejected(
    persistence: JsonlStore, tmp_path: Path, session_id: str
) -> None:
    with pytest.raises(InvalidSessionIdError):
        persistence.path_of(session_id)
    with pytest.raises(InvalidSessionIdError):
        await persistence.exists(session_id)
    with pytest.raises(InvalidSessionIdError):
        await persistence.load(session_id)
    with pytest.raises(InvalidSessionIdError):
        await persistence.open_writer(SessionHeader(id=session_id, created_at=TS))
    with pytest.raises(InvalidSessionIdError):
        await SessionRegistry(persistence).prepare_new(session_id)
    assert sorted(os.listdir(tmp_path)) == []


def test_an_id_escaping_to_a_too_long_name_is_rejected() -> None:
    with pytest.raises(InvalidSessionIdError, match="too long to store"):
        escape_session_id("é" * 50)  # 50 characters, 300 bytes escaped


# ------------------------------------------------------------------ torn and damaged logs


async def test_a_torn_last_line_is_dropped_and_cut_off_before_the_next_append(
    persistence: JsonlStore,
) -> None:
    events = build(turn_steps(1) + turn_steps(2)[:3])
    path = await write_log(persistence, events)
    valid = path.read_bytes()
    torn = encode_event(build(turn_steps(2), first_seq=len(events))[3]).encode()[:25]
    with path.open("ab") as f:
        f.write(torn)

    loaded = await persistence.load("s1")
    assert list(loaded.events) == events
    assert (loaded.dropped_tail, loaded.valid_length) == (len(torn), len(valid))
    assert path.read_bytes() == valid + torn  # loading changed nothing

    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_resume("s1")
    entry = store.enter(session)
    session.append(TurnStart, turn=3)
    await store.detach(entry)
    data = path.read_bytes()
    appended = session.events[len(events) :]
    assert data == valid + b"".join(encode_event(e).encode() + b"\n" for e in appended)
    reloaded = await persistence.load("s1")
    assert reloaded.dropped_tail == 0
    assert list(reloaded.events) == list(session.events)
    assert [e.type for e in reloaded.events[len(events) :]] == ["tool/result", "step/end", "turn/end", "turn/start"]


async def test_a_bad_line_after_the_last_turn_end_is_uncommitted_and_dropped(
    persistence: JsonlStore, caplog: pytest.LogCaptureFixture
) -> None:
    events = build(turn_steps(1))
    path = await write_log(persistence, events)
    valid = path.read_bytes()
    with path.open("ab") as f:
        f.write(b'{"type":"turn/start","seq":6,"ts":1.0}\n')  # complete line, missing key
        f.write(b'{"type":"step/start"')
    caplog.set_level(logging.WARNING, logger="trio_harness.session.jsonl")
    loaded = await persistence.load("s1")
    assert list(loaded.events) == events
    assert loaded.valid_length == len(valid) and loaded.dropped_tail == path.stat().st_size - len(valid)
    assert any(f"{path}:{len(events) + 2}" in r.getMessage() for r in caplog.records)

    store = SessionRegistry(persistence, clock=fixed_clock)
    entry = store.enter(await store.prepare_resume("s1"))
    entry.session.append(TurnStart, turn=2)
    await store.detach(entry)
    assert list((await persistence.load("s1")).events) == list(entry.session.events)
    assert path.read_bytes().startswith(valid)


def corrupt_line(events: list[Event], index: int, replacement: bytes) -> tuple[bytes, int]:
    """The log bytes with event ``index`` replaced; returns (data, its 1-based line)."""
    lines = [encode_header(header()).encode()] + [encode_event(e).encode() for e in events]
    lines[index + 1] = replacement
    return b"\n".join(lines) + b"\n", index + 2


DAMAGE = [
    ("garbage", b"\x00\x01garbage", "not valid JSON"),
    ("half a line", b'{"type":"assistant/message","seq":2,"ts"', "not valid JSON"),
    ("unknown type", b'{"type":"turn/pause","seq":2,"ts":1.0,"turn":1}', "unknown event type 'turn/pause'"),
    ("seq gap", b'{"type":"step/start","seq":7,"ts":1.0,"turn":1,"step":1}', "event seq 7 where 2 was expected"),
    ("extra key", b'{"type":"step/start","seq":2,"ts":1.0,"turn":1,"step":1,"x":0}', "unexpected keys"),
    ("blank line", b"", "not valid JSON"),
]


@pytest.mark.parametrize(("replacement", "message"), [(r, m) for _, r, m in DAMAGE], ids=[d[0] for d in DAMAGE])
async def test_damage_before_a_later_turn_end_is_an_error_naming_file_and_line(
    persistence: JsonlStore, replacement: bytes, message: str
) -> None:
    events = build(turn_steps(1) + turn_steps(2))
    path = await write_log(persistence, events)
    data, line = corrupt_line(events, 2, replacement)
    path.write_bytes(data)
    before = snapshot(persistence.root)

    with pytest.raises(SessionCorruptError) as info:
        await persistence.load("s1")
    assert info.value.path == str(path) and info.value.line == line == 4
    assert f"{path}:4: " in str(info.value)
    assert message in str(info.value)
    store = SessionRegistry(persistence, clock=fixed_clock)
    with pytest.raises(SessionCorruptError):
        await store.prepare_resume("s1")
    assert store.get("s1") is None
    assert snapshot(persistence.root) == before  # a failed load changes nothing on disk


@pytest.mark.parametrize(
    ("first_line", "error", "message"),
    [
        (b"", SessionCorruptError, "session header is not valid JSON"),
        (b"{not json", SessionCorruptError, "not valid JSON"),
        (b'{"type":"turn/start","seq":0,"ts":1.0,"turn":1}', SessionCorruptError, "not a session header"),
        (
            json.dumps({"type": "session", "id": "s1", "created_at": TS, "version": FORMAT_VERSION + 1}).encode(),
            UnsupportedFormatError,
            f"version {FORMAT_VERSION + 1} is not supported",
        ),
        (
            encode_header(header("someone-else")).encode(),
            SessionCorruptError,
            "the header names session 'someone-else', but the log is stored as 's1'",
        ),
    ],
    ids=["empty header", "bad header", "event as header", "future version", "foreign header"],
)
async def test_a_bad_header_fails_the_load_and_changes_nothing(
    persistence: JsonlStore, first_line: bytes, error: type[Exception], message: str
) -> None:
    path = await write_log(persistence, build(turn_steps(1)))
    lines = path.read_bytes().split(b"\n")
    lines[0] = first_line
    path.write_bytes(b"\n".join(lines))
    before = snapshot(persistence.root)
    with pytest.raises(error, match=message) as info:
        await persistence.load("s1")
    if isinstance(info.value, SessionCorruptError):
        assert (info.value.path, info.value.line) == (str(path), 1)
        assert str(info.value).startswith(f"{path}:1: ")
    with pytest.raises(error):
        await SessionRegistry(persistence).prepare_resume("s1")
    assert snapshot(persistence.root) == before


async def test_a_header_without_a_newline_is_an_incomplete_session(persistence: JsonlStore) -> None:
    path = persistence.root / "s1" / LOG_NAME
    path.parent.mkdir(parents=True)
    path.write_bytes(encode_header(header()).encode())
    with pytest.raises(SessionCorruptError, match="header is incomplete"):
        await persistence.load("s1")


async def test_loading_an_unknown_session_is_not_found(persistence: JsonlStore) -> None:
    with pytest.raises(SessionNotFoundError, match="no stored session 'ghost'"):
        await persistence.load("ghost")
    assert not persistence.root.exists()


# ------------------------------------------------------------------ every-byte cuts

small_text = st.text(st.characters(exclude_categories=["Cs"]), max_size=4)


@st.composite
def session_logs(draw: st.DrawFn) -> list[Event]:
    """A small valid log: turns of steps with tool calls and inbox splices, correct seqs."""
    steps: list[Step] = []
    for turn in range(1, draw(st.integers(1, 2)) + 1):
        message = InboxMessage(f"m{turn}", draw(small_text), draw(st.sampled_from(["followup", "steer", "inject"])))
        steps.append((InboxSpliced, {"queue": "next-turn", "start": 0, "inserted": (message,)}))
        steps.append((TurnStart, {"turn": turn}))
        for step in range(1, draw(st.integers(1, 2)) + 1):
            at = {"turn": turn, "step": step}
            steps.append((StepStart, at))
            if step == 1:
                steps.append(
                    (
                        InboxSpliced,
                        {
                            "queue": "next-turn",
                            "start": 0,
                            "removed": (message.id,),
                            "outcome": "claimed",
                            "turn": turn,
                        },
                    )
                )
                steps.append(
                    (UserMessage, {**at, "message_id": message.id, "text": message.text, "mode": message.mode})
                )
            else:
                steps.append(
                    (
                        AssistantChunk,
                        {**at, "kind": draw(st.sampled_from(["text", "reasoning"])), "text": draw(small_text)},
                    )
                )
            calls = tuple(
                ToolCall(f"c{turn}{step}{k}", "bash", draw(small_text)) for k in range(draw(st.integers(0, 2)))
            )
            steps.append((AssistantMessage, {**at, "text": draw(small_text), "tool_calls": calls}))
            for call in calls:
                if draw(st.booleans()):
                    steps.append(
                        (ToolCallRequested, {**at, "call_id": call.id, "name": call.name, "arguments": call.arguments})
                    )
                steps.append(
                    (
                        ToolResult,
                        {
                            **at,
                            "call_id": call.id,
                            "name": call.name,
                            "content": draw(small_text),
                            "is_error": draw(st.booleans()),
                        },
                    )
                )
            steps.append((StepEnd, at))
        reason = draw(st.sampled_from(["completed", "aborted"]))
        steps.append((TurnEnd, {"turn": turn, "reason": reason, "cause": "user" if reason == "aborted" else None}))
    ts = float(draw(st.integers(min_value=0, max_value=2**31)))
    return [cls(seq=i, ts=ts + i, **fields) for i, (cls, fields) in enumerate(steps)]


@attrs.define
class CutExpectation:
    """What loading the first ``offset`` bytes of a log must give."""

    header_end: int
    line_ends: list[int]  # offsets just past each event line's newline

    def complete(self, offset: int) -> int | None:
        """Events whose line is complete within ``offset`` bytes, None inside the header."""
        if offset < self.header_end:
            return None
        return sum(1 for end in self.line_ends if end <= offset)

    def valid_length(self, offset: int) -> int:
        return max([self.header_end, *(end for end in self.line_ends if end <= offset)])


@pytest.mark.slow  # ~35-50 s: runs with --run-slow, which `nox -s tests` (and so CI) passes
@settings(
    max_examples=6,  # every example loads every cut twice: ~2,000-3,500 loads
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
    phases=[Phase.explicit, Phase.reuse, Phase.generate],  # shrinking would re-run thousands of cuts
)
@given(events=session_logs())
async def test_a_log_cut_at_any_byte_loads_exactly_its_complete_lines(tmp_path: Path, events: list[Event]) -> None:
    example = tmp_path / uuid.uuid4().hex
    data = (await write_log(JsonlStore(example / "full", fsync=False), events)).read_bytes()
    ends = [i + 1 for i, byte in enumerate(data) if byte == ord("\n")]
    expect = CutExpectation(header_end=ends[0], line_ends=ends[1:])
    assert len(expect.line_ends) == len(events)

    # What each cut gave: from load, (events, valid_length, dropped_tail); from
    # prepare_resume, its events; or, inside the header, the corrupt line twice.
    outcomes: dict[int, tuple[object, ...]] = {}

    async def check(offset: int, persistence: JsonlStore) -> None:
        store = SessionRegistry(persistence, clock=fixed_clock)
        cut = persistence.path_of("s1")
        cut.unlink(missing_ok=True)  # a fresh file (rewriting one in place is slow on ext4)
        cut.write_bytes(data[:offset])
        try:
            loaded = await persistence.load("s1")
        except SessionCorruptError as exc:
            try:
                await store.prepare_resume("s1")
            except SessionCorruptError as again:
                outcomes[offset] = ("corrupt", exc.line, again.line)
            return
        session = await store.prepare_resume("s1")
        await store.discard(session)
        unchanged = cut.read_bytes() == data[:offset]
        outcomes[offset] = (
            list(loaded.events),
            loaded.valid_length,
            loaded.dropped_tail,
            list(session.events),
            unchanged,
        )

    async def worker(slot: int, slots: int) -> None:
        # The same session id in a store root of the worker's own, one cut at a time.
        persistence = JsonlStore(example / f"cut-{slot}", fsync=False)
        persistence.path_of("s1").parent.mkdir(parents=True)
        for offset in range(slot, len(data) + 1, slots):
            await check(offset, persistence)

    # Concurrent workers: each load waits on a worker thread.
    async with trio.open_nursery() as nursery:
        for slot in range(16):
            nursery.start_soon(worker, slot, 16)

    for offset in range(len(data) + 1):
        count = expect.complete(offset)
        if count is None:
            assert outcomes[offset] == ("corrupt", 1, 1), offset
            continue
        valid = expect.valid_length(offset)
        closers = [cls(seq=count + i, ts=TS, **fields) for i, (cls, fields) in enumerate(closers_for(events[:count]))]
        assert outcomes[offset] == (events[:count], valid, offset - valid, events[:count] + closers, True), offset


# ------------------------------------------------------------------ SIGKILL


async def read_reports(stream: trio.abc.ReceiveStream, wanted: int) -> int:
    """Read ``flushed N`` lines until ``wanted`` were seen; returns the largest N read."""
    buffer = b""
    reports: list[int] = []
    while len(reports) < wanted:
        chunk = await stream.receive_some()
        assert chunk, f"the writer exited early after {reports}"
        buffer += chunk
        *lines, buffer = buffer.split(b"\n")
        for line in lines:
            word, count = line.split()
            assert word == b"flushed"
            reports.append(int(count))
    assert reports == sorted(reports)
    return reports[-1]


@pytest.mark.parametrize("every", [1, 7, 60])
async def test_a_flushed_event_survives_sigkill_right_after_the_flush(tmp_path: Path, every: int) -> None:
    root = tmp_path / "root"
    script = Path(__file__).with_name("_writer_proc.py")
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script), str(root), "killed", str(every)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        with trio.fail_after(WAIT):  # a bound on a real process, not a sleep
            reported = await read_reports(process.stdout, 3)
            process.send_signal(signal.SIGKILL)  # right after a flush was reported
            await process.wait()
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.stdout.aclose()
    assert process.returncode == -signal.SIGKILL
    assert reported >= 3 * every

    persistence = JsonlStore(root)
    loaded = await persistence.load("killed")
    assert len(loaded.events) >= reported
    assert list(loaded.events) == [expected_event(i) for i in range(len(loaded.events))]

    # The killed writer's lock is gone: the log resumes and stays valid.
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_resume("killed")
    entry = store.enter(session)
    session.append(TurnStart, turn=10_000)
    await store.detach(entry)
    reloaded = await persistence.load("killed")
    assert reloaded.dropped_tail == 0 and list(reloaded.events) == list(session.events)


# ------------------------------------------------------------------ one writer per session (locks)


async def start_holder(root: Path, session_id: str, events: int) -> trio.Process:
    """A real second process that creates ``session_id``, flushes ``events`` events and stays live."""
    script = Path(__file__).with_name("_writer_proc.py")
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script), str(root), session_id, str(events), str(events)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    with trio.fail_after(WAIT):  # a bound on a real process, not a sleep
        assert await read_reports(process.stdout, 1) == events
    return process


async def stop(process: trio.Process) -> None:
    with trio.CancelScope(shield=True):
        process.kill()
        await process.wait()
        assert process.stdout is not None
        await process.stdout.aclose()


async def test_a_session_live_in_another_process_cannot_be_resumed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    holder = await start_holder(root, "shared", CYCLE)
    setups: list[str] = []
    model = ScriptedModel([{"text": "resumed"}])
    try:
        async with open_harness(model=model, store=root, builtin_tools=False) as h:

            async def setup(agent: object) -> None:
                setups.append("ran")

            with pytest.raises(AgentExistsError, match="live in another process") as info:
                await h.agents.resume("shared", setup=setup)
            assert isinstance(info.value.__cause__, SessionLockedError)
            assert setups == [] and model.requests == []  # refused before setup and any model call
            assert h.agents.list() == [] and h.sessions.list() == []
            with pytest.raises(SessionLockedError, match=r"'shared' is live in another process \(.*session.jsonl"):
                await h.sessions.prepare_resume("shared")

            await stop(holder)  # the holder's lock dies with it
            handle = await h.agents.resume("shared", setup=setup)
            assert setups == ["ran"]
            handle.agent.inject("written by this process")  # logged, does not wake the agent
            await handle.dispose()
        loaded = await JsonlStore(root).load("shared")
        assert list(loaded.events[:CYCLE]) == [expected_event(i) for i in range(CYCLE)]
        assert [e.seq for e in loaded.events] == list(range(len(loaded.events)))
        spliced = loaded.events[CYCLE]
        assert isinstance(spliced, InboxSpliced) and spliced.inserted[0].text == "written by this process"
    finally:
        await stop(holder)


# ------------------------------------------------------------------ failed flushes


def fail_once(monkeypatch: pytest.MonkeyPatch, target: object, name: str, error: int = errno.ENOSPC) -> list[int]:
    """Make ``target.name`` raise ``OSError(error)`` on its next call only; returns the call log."""
    real = getattr(target, name)
    calls: list[int] = []

    def failing(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) == 1:
            raise OSError(error, os.strerror(error))
        return real(*args, **kwargs)

    monkeypatch.setattr(target, name, failing)
    return calls


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


@pytest.mark.parametrize("step", ["write", "fsync", "link"])
async def test_a_failed_first_flush_leaves_nothing_and_a_retry_stores_every_event(
    persistence: JsonlStore, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1", cwd="/work")
    entry = store.enter(session)
    for cls, fields in turn_steps(1):
        session.append(cls, **fields)
    fds = open_fds()
    target: object = _jsonl_files if step == "write" else os
    calls = fail_once(monkeypatch, target, "_write_all" if step == "write" else step)
    with pytest.raises(SessionStoreError, match="No space left on device") as info:
        await session.flush()
    assert calls
    error = info.value
    assert "'s1'" in str(error) and str(persistence.path_of("s1")) in str(error)
    assert error.path == str(persistence.path_of("s1"))
    assert isinstance(error.__cause__, OSError) and error.__cause__.errno == errno.ENOSPC
    # Nothing left behind: no log, no temporary file, no directory, no descriptor.
    assert [p.name for p in persistence.root.iterdir()] == [CLAIM_NAME]  # only the create lock
    assert not await persistence.exists("s1")
    assert open_fds() == fds
    with pytest.raises(SessionNotFoundError):
        await persistence.load("s1")

    # Once the cause is gone the same session flushes: the buffered events were kept.
    session.append(TurnStart, turn=2)
    await session.flush()
    assert sorted(os.listdir(persistence.path_of("s1").parent)) == [LOG_NAME]
    loaded = await persistence.load("s1")
    assert list(loaded.events) == list(session.events) and loaded.header == session.header
    await store.detach(entry)


@pytest.mark.parametrize("step", ["write", "fsync"])
async def test_a_failed_later_flush_is_cut_back_and_retried_without_duplicates(
    persistence: JsonlStore, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    store = SessionRegistry(persistence, clock=fixed_clock)
    session = await store.prepare_new("s1", cwd="/work")
    entry = store.enter(session)
    for cls, fields in turn_steps(1):
        session.append(cls, **fields)
    await session.flush()
    path = persistence.path_of("s1")
    before = path.read_bytes()
    for cls, fields in turn_steps(2):
        session.append(cls, **fields)
    target: object = _jsonl_files if step == "write" else os
    fail_once(monkeypatch, target, "_write_all" if step == "write" else step, errno.EIO)
    with pytest.raises(SessionStoreError, match=r"cannot write session 's1' to .*session.jsonl: Input/output error"):
        await session.flush()
    assert path.read_bytes() == before  # an unsynced batch is cut off again
    await session.flush()
    assert list((await persistence.load("s1")).events) == list(session.events)
    await store.detach(entry)


async def test_a_header_that_cannot_be_encoded_is_refused_before_anything_is_stored(
    persistence: JsonlStore,
) -> None:
    store = SessionRegistry(persistence, clock=lambda: float("nan"))
    # The header record refuses a non-finite timestamp before the store sees it.
    with pytest.raises(ValueError, match="created_at must be finite"):
        await store.prepare_new("s1")
    assert not persistence.root.exists() and store.list() == []


# ------------------------------------------------------------------ planted links and special files


def plant_outside_log(tmp_path: Path, session_id: str) -> Path:
    """A valid log of ``session_id`` outside the store root; returns its directory."""
    outside = tmp_path / "outside"
    outside.mkdir()
    data = encode_header(header(session_id)) + "\n" + "".join(encode_event(e) + "\n" for e in build(turn_steps(1)))
    (outside / LOG_NAME).write_bytes(data.encode())
    return outside


async def test_a_symlink_planted_as_a_session_directory_is_never_followed(tmp_path: Path) -> None:
    root = tmp_path / "root"
    root.mkdir()
    outside = plant_outside_log(tmp_path, "evil")
    (outside / LOG_NAME).unlink()
    (root / escape_session_id("evil")).symlink_to(outside, target_is_directory=True)
    model = ScriptedModel([{"text": "never"}])
    async with open_harness(model=model, store=root, builtin_tools=False) as h:
        with pytest.raises(SessionStoreError, match=r"root/evil is a symbolic link, not a directory") as info:
            await h.agents.create(session_id="evil")
        assert info.value.path == str(root / "evil")
        assert model.requests == [] and h.agents.list() == []
        with pytest.raises(SessionStoreError, match="is a symbolic link, not a directory"):
            await h.agents.resume("evil")

        # Planted after the session was prepared: the first flush refuses it.
        session = await h.sessions.prepare_new("late")
        entry = h.sessions.enter(session)
        session.append(TurnStart, turn=1)
        (root / "late").symlink_to(outside, target_is_directory=True)
        with pytest.raises(SessionStoreError, match="root/late is a symbolic link"):
            await session.flush()
        (root / "late").unlink()
        await h.sessions.detach(entry)  # the buffered event is stored in a real directory now
        assert [e.type for e in (await h.sessions.persistence.load("late")).events] == ["turn/start"]

        with pytest.raises(SessionStoreError, match="is a symbolic link"):
            await h.sessions.fork("late", 0, "evil")
    assert os.listdir(outside) == []  # nothing was ever written outside the root


async def test_a_symlinked_log_is_never_read_or_appended_through(tmp_path: Path) -> None:
    persistence = JsonlStore(tmp_path / "root")
    outside = plant_outside_log(tmp_path, "s1")
    before = (outside / LOG_NAME).read_bytes()
    (persistence.root / "s1").mkdir(parents=True)
    (persistence.root / "s1" / LOG_NAME).symlink_to(outside / LOG_NAME)
    store = SessionRegistry(persistence, clock=fixed_clock)
    for attempt in (persistence.load("s1"), store.prepare_resume("s1")):
        with pytest.raises(SessionStoreError, match=r"root/s1/session.jsonl is a symbolic link; refusing to follow"):
            await attempt
    assert (await persistence.list()) == []
    assert (outside / LOG_NAME).read_bytes() == before


@pytest.mark.parametrize("planted", ["fifo", "dev-zero", "device", "directory"])
async def test_a_special_file_planted_as_the_log_is_refused_before_any_read(
    persistence: JsonlStore, planted: str, caplog: pytest.LogCaptureFixture
) -> None:
    log_path = persistence.path_of("s1")
    log_path.parent.mkdir(parents=True)
    if planted == "fifo":
        os.mkfifo(log_path)
        expected = "is a FIFO, not a regular file"
    elif planted == "dev-zero":
        log_path.symlink_to("/dev/zero")
        expected = "is a symbolic link; refusing to follow it"
    elif planted == "device":
        os.mknod(log_path, 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's device numbers
        expected = "is a device, not a regular file"
    else:
        log_path.mkdir()
        expected = "is a directory|Is a directory"
    store = SessionRegistry(persistence, clock=fixed_clock)
    caplog.set_level(logging.WARNING, logger="trio_harness.session.jsonl")
    # A real deadline only as a bound: a read of a FIFO or of /dev/zero would never end.
    with trio.fail_after(WAIT):
        for attempt in (persistence.load("s1"), store.prepare_resume("s1")):
            with pytest.raises(SessionStoreError, match=expected):
                await attempt
        assert (await persistence.list()) == []
    assert open_fds_of(log_path) == 0


def open_fds_of(path: Path) -> int:
    """How many descriptors of this process refer to ``path``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{fd}") == str(path):
                count += 1
        except OSError:
            pass
    return count


async def test_list_does_not_follow_planted_links(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    persistence = JsonlStore(tmp_path / "root")
    await write_log(persistence, build(turn_steps(1)), "good")
    outside = plant_outside_log(tmp_path, "linked")
    (persistence.root / "linked").symlink_to(outside, target_is_directory=True)
    (persistence.root / "loglink").mkdir()
    (persistence.root / "loglink" / LOG_NAME).symlink_to(outside / LOG_NAME)
    (persistence.root / "fifo").mkdir()
    os.mkfifo(persistence.root / "fifo" / LOG_NAME)
    caplog.set_level(logging.WARNING, logger="trio_harness.session.jsonl")
    with trio.fail_after(WAIT):
        assert [h.id for h in (await persistence.list())] == ["good"]
    warned = " ".join(r.getMessage() for r in caplog.records)
    assert "root/linked" in warned and "a symbolic link" in warned and "a FIFO" in warned
    assert not await persistence.exists("linked")


async def test_a_log_above_the_size_limit_is_refused_naming_the_limit(tmp_path: Path) -> None:
    path = await write_log(JsonlStore(tmp_path / "root"), build(turn_steps(1)))
    size = path.stat().st_size
    small = JsonlStore(tmp_path / "root", max_log_bytes=size - 1)
    for attempt in (small.load("s1"), SessionRegistry(small).prepare_resume("s1")):
        with pytest.raises(
            SessionStoreError, match=rf"{size:,} bytes, more than the {size - 1:,} bytes.*max_log_bytes"
        ):
            await attempt
    exact = JsonlStore(tmp_path / "root", max_log_bytes=size)
    assert len((await exact.load("s1")).events) == len(turn_steps(1))
    assert JsonlStore(tmp_path).max_log_bytes == 1 << 30


async def test_a_cancelled_resume_abandons_a_blocked_read_without_leaking_the_log(
    persistence: JsonlStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_log(persistence, build(turn_steps(1)))
    path = persistence.path_of("s1")
    reading, release, closed = threading.Event(), threading.Event(), threading.Event()
    read_fds: list[int] = []
    real_read, real_close = _jsonl_files._pread_all, os.close

    def blocked(fd: int, size: int) -> bytes:
        read_fds.append(fd)
        reading.set()
        release.wait()  # a read that does not return (a hung file system)
        return real_read(fd, size)

    def close(fd: int) -> None:
        real_close(fd)
        if read_fds and fd == read_fds[0]:
            closed.set()

    monkeypatch.setattr(_jsonl_files, "_pread_all", blocked)
    monkeypatch.setattr(os, "close", close)
    store = SessionRegistry(persistence, clock=fixed_clock)
    with trio.CancelScope() as scope:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(store.prepare_resume, "s1")
            await trio.to_thread.run_sync(reading.wait)
            scope.cancel()  # returns at once although the read is still blocked
    assert scope.cancelled_caught
    # The abandoned reader owns the descriptor until its read returns: the lock is still held.
    with pytest.raises(SessionLockedError):
        await SessionRegistry(JsonlStore(persistence.root)).prepare_resume("s1")
    assert not closed.is_set()  # never closed under a running read
    release.set()
    await trio.to_thread.run_sync(closed.wait)  # closed by the reader when its read returned
    assert open_fds_of(path) == 0
    await store.discard(await store.prepare_resume("s1"))

    # Cancelled before the reader started: closed at once.
    with trio.CancelScope() as scope:
        scope.cancel()
        await store.prepare_resume("s1")
    assert open_fds_of(path) == 0
    await store.discard(await store.prepare_resume("s1"))
