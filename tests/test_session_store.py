"""The session store: prepare / enter / announce / detach, resume, recovery, fork.

Every test runs against both persistence providers (in memory and JSONL on
``tmp_path``).  What they pin: docs/guarantees.rst, "Publication" and "Sessions".
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_harness._bus import Notice
from trio_harness._errors import (
    AgentExistsError,
    ForkBoundaryError,
    InvalidSessionIdError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
)
from trio_harness._harness import open_harness
from trio_harness.agents import Agent, AgentHandle
from trio_harness.model._protocol import ToolCall
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import (
    JsonlStore,
    MemoryStore,
    Session,
    SessionEntry,
    SessionHeader,
    SessionRegistry,
    SessionStore,
)
from trio_harness.session._events import (
    AssistantMessage,
    Event,
    InboxMessage,
    InboxSpliced,
    StepEnd,
    StepStart,
    ToolResult,
    TurnEnd,
    TurnStart,
    UserMessage,
)
from trio_harness.session._recovery import NOT_STARTED_TOOL_RESULT


@attrs.define
class FakeClock:
    now: float = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@pytest.fixture(params=["memory", "jsonl"])
def persistence(request: pytest.FixtureRequest, tmp_path: Path) -> SessionStore:
    if request.param == "memory":
        return MemoryStore()
    return JsonlStore(tmp_path / "sessions")


@pytest.fixture
def store(persistence: SessionStore) -> SessionRegistry:
    return SessionRegistry(persistence, clock=FakeClock())


@pytest.fixture
def notices(store: SessionRegistry) -> list[tuple[str, str]]:
    seen: list[tuple[str, str]] = []
    store.bus.on("*", lambda n: seen.append((n.name, n.subject.id)))
    return seen


Step = tuple[type[Event], dict[str, Any]]

CALLS = (ToolCall("call-1", "bash", '{"command": "ls"}'), ToolCall("call-2", "read", '{"path": "a"}'))


def balanced_turn(turn: int) -> list[Step]:
    """One complete tool-calling turn."""
    return [
        (InboxSpliced, {"queue": "next-turn", "start": 0, "inserted": (InboxMessage(f"m{turn}", "do it"),)}),
        (TurnStart, {"turn": turn}),
        (StepStart, {"turn": turn, "step": 1}),
        (
            InboxSpliced,
            {"queue": "next-turn", "start": 0, "removed": (f"m{turn}",), "outcome": "claimed", "turn": turn},
        ),
        (UserMessage, {"turn": turn, "step": 1, "message_id": f"m{turn}", "text": "do it"}),
        (AssistantMessage, {"turn": turn, "step": 1, "text": "", "tool_calls": CALLS[:1]}),
        (ToolResult, {"turn": turn, "step": 1, "call_id": "call-1", "name": "bash", "content": "a\nb"}),
        (StepEnd, {"turn": turn, "step": 1}),
        (StepStart, {"turn": turn, "step": 2}),
        (AssistantMessage, {"turn": turn, "step": 2, "text": "done"}),
        (StepEnd, {"turn": turn, "step": 2}),
        (TurnEnd, {"turn": turn, "reason": "completed"}),
    ]


def died_mid_turn(turn: int) -> list[Step]:
    """turn/start, step/start, an assistant message with 2 tool calls, one result."""
    return [
        (TurnStart, {"turn": turn}),
        (StepStart, {"turn": turn, "step": 1}),
        (AssistantMessage, {"turn": turn, "step": 1, "text": "", "tool_calls": CALLS}),
        (ToolResult, {"turn": turn, "step": 1, "call_id": "call-1", "name": "bash", "content": "ok"}),
    ]


def append_all(session: Session, steps: list[Step]) -> None:
    for cls, fields in steps:
        session.append(cls, **fields)


async def store_session(store: SessionRegistry, session_id: str, steps: list[Step]) -> tuple[Event, ...]:
    """Create, publish, fill and detach a session; returns its events."""
    session = await store.prepare_new(session_id, cwd="/work")
    entry = store.enter(session)
    store.announce(entry)
    append_all(session, steps)
    await store.detach(entry)
    return tuple(session.events)


async def stored_events(persistence: SessionStore, session_id: str) -> tuple[Event, ...]:
    return (await persistence.load(session_id)).events


# ------------------------------------------------------------------ publication


async def test_prepare_enter_announce_publishes_in_steps(
    store: SessionRegistry, persistence: SessionStore, notices: list[tuple[str, str]]
) -> None:
    session = await store.prepare_new("s1", cwd="/work")
    assert session.id == "s1" and session.header.cwd == "/work" and len(session) == 0
    assert store.get("s1") is None and store.list() == []
    assert not await persistence.exists("s1")

    entry = store.enter(session)
    assert entry.session is session and entry.announced is False
    assert store.get("s1") is session and store.list() == [session]
    assert notices == []  # enter emits nothing

    store.announce(entry)
    assert getattr(entry, "announced") is True  # noqa: B009 (not narrowed)
    assert notices == [("session/created", "s1")]
    store.announce(entry)  # once only
    assert notices == [("session/created", "s1")]


async def test_a_second_live_session_with_the_same_id_is_refused(
    store: SessionRegistry, persistence: SessionStore, notices: list[tuple[str, str]]
) -> None:
    winner = await store.prepare_new("s1")
    loser = await store.prepare_new("s1")  # both prepared while neither is live
    entry = store.enter(winner)
    with pytest.raises(SessionExistsError, match="session 's1' already exists"):
        store.enter(loser)
    await store.discard(loser)
    with pytest.raises(SessionExistsError, match="'s1' already exists"):
        await store.prepare_new("s1")
    assert store.get("s1") is winner and store.list() == [winner]

    store.announce(entry)
    winner.append(TurnStart, turn=1)
    await store.detach(entry)
    assert await stored_events(persistence, "s1") == tuple(winner.events)
    assert notices == [("session/created", "s1"), ("session/disposed", "s1")]


async def test_enter_refuses_a_session_this_store_did_not_prepare(store: SessionRegistry) -> None:
    session = await store.prepare_new("s1")
    await store.discard(session)
    with pytest.raises(SessionExistsError, match="not prepared by this store or was discarded"):
        store.enter(session)
    assert store.get("s1") is None


async def test_detach_removes_the_entry_and_emits_disposed_after_removal(
    store: SessionRegistry, notices: list[tuple[str, str]]
) -> None:
    live_at_dispatch: list[Session | None] = []
    store.bus.on("session/disposed", lambda n: live_at_dispatch.append(store.get(n.subject.id)))
    entry = store.enter(await store.prepare_new("s1"))
    store.announce(entry)
    await store.detach(entry)
    await store.detach(entry)  # idempotent
    assert entry.detached
    assert store.get("s1") is None and store.list() == []
    assert notices == [("session/created", "s1"), ("session/disposed", "s1")]
    assert live_at_dispatch == [None]


async def test_a_stale_detach_does_not_remove_a_later_entry_with_the_same_id(
    store: SessionRegistry, notices: list[tuple[str, str]]
) -> None:
    first = store.enter(await store.prepare_new("s1"))
    store.announce(first)
    first.session.append(TurnStart, turn=1)
    first.session.append(TurnEnd, turn=1, reason="completed")
    await store.detach(first)

    second = store.enter(await store.prepare_resume("s1"))
    store.announce(second)
    notices.clear()
    await store.detach(first)  # stale: bound to the first entry only
    assert store.get("s1") is second.session
    assert notices == []
    # The live entry's writer still works.
    second.session.append(TurnStart, turn=2)
    await store.detach(second)
    assert notices == [("session/disposed", "s1")]
    assert [e.seq for e in (await store.load_events("s1"))[1]] == [0, 1, 2]


async def test_a_stale_entry_object_cannot_remove_the_live_entry(
    store: SessionRegistry, notices: list[tuple[str, str]]
) -> None:
    # Detach is bound to the entry object, not the id: a foreign entry for the
    # same session neither removes the live one nor announces anything.
    live = store.enter(await store.prepare_new("s1"))
    store.announce(live)
    notices.clear()
    impostor = SessionEntry(session=live.session, writer=live.writer)
    store.announce(impostor)
    assert not impostor.announced
    await store.detach(impostor)
    assert store.get("s1") is live.session
    assert notices == []


async def test_detaching_a_never_announced_entry_emits_no_disposed(
    store: SessionRegistry, notices: list[tuple[str, str]]
) -> None:
    entry = store.enter(await store.prepare_new("s1"))
    await store.detach(entry)
    assert store.get("s1") is None
    assert notices == []
    store.announce(entry)  # too late: a detached entry is never announced
    assert notices == [] and not entry.announced


async def test_detach_flushes_even_when_the_caller_is_cancelled(
    store: SessionRegistry, persistence: SessionStore
) -> None:
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append_all(session, balanced_turn(1))
    with trio.CancelScope() as cancelled:
        cancelled.cancel()
        await store.detach(entry)
    assert store.get("s1") is None
    assert await persistence.exists("s1")
    assert await stored_events(persistence, "s1") == tuple(session.events)


async def test_prepare_new_of_a_stored_id_is_refused(store: SessionRegistry) -> None:
    await store_session(store, "s1", balanced_turn(1))
    with pytest.raises(SessionExistsError, match="'s1' already exists in the store; resume it instead"):
        await store.prepare_new("s1")


async def test_prepare_new_records_lineage_without_ownership(store: SessionRegistry, persistence: SessionStore) -> None:
    parent = store.enter(await store.prepare_new("parent"))
    child = await store.prepare_new("child", parent_session="parent")
    assert child.header.parent_session == "parent"
    child_entry = store.enter(child)
    child.append(TurnStart, turn=1)
    await store.detach(parent)  # the parent goes; the child stays live
    assert store.get("child") is child
    await store.detach(child_entry)
    assert (await persistence.load("child")).header.parent_session == "parent"


async def test_prepare_new_without_an_id_makes_a_fresh_one(store: SessionRegistry) -> None:
    first, second = await store.prepare_new(), await store.prepare_new()
    assert first.id != second.id and first.id and second.id


# ------------------------------------------------------------------ resume


async def test_resume_reads_a_balanced_log_back_without_closers(
    store: SessionRegistry, persistence: SessionStore
) -> None:
    written = await store_session(store, "s1", balanced_turn(1) + balanced_turn(2))
    session = await store.prepare_resume("s1")
    assert tuple(session.events) == written
    assert session.header.id == "s1" and session.header.cwd == "/work"
    assert store.get("s1") is None  # prepared, not live
    entry = store.enter(session)
    appended = session.append(TurnStart, turn=3)
    assert appended.seq == len(written)  # seqs continue
    await store.detach(entry)
    assert await stored_events(persistence, "s1") == (*written, appended)


async def test_prepare_resume_of_a_live_session_is_refused(store: SessionRegistry) -> None:
    entry = store.enter(await store.prepare_new("s1"))
    with pytest.raises(SessionExistsError, match="'s1' is live"):
        await store.prepare_resume("s1")
    assert store.get("s1") is entry.session


async def test_prepare_resume_of_an_unknown_id_is_not_found(store: SessionRegistry) -> None:
    with pytest.raises(SessionNotFoundError, match="no stored session 'nobody'"):
        await store.prepare_resume("nobody")
    with pytest.raises(InvalidSessionIdError):
        await store.prepare_resume("../escape")


async def test_resume_of_a_log_that_died_mid_turn_appends_closers(
    store: SessionRegistry, persistence: SessionStore
) -> None:
    written = await store_session(store, "s1", balanced_turn(1) + died_mid_turn(2))
    session = await store.prepare_resume("s1")
    assert tuple(session.events[: len(written)]) == written
    closers = session.events[len(written) :]
    n = len(written)
    assert [(type(e), e.seq) for e in closers] == [(ToolResult, n), (StepEnd, n + 1), (TurnEnd, n + 2)]
    result, step_end, turn_end = closers
    assert isinstance(result, ToolResult) and isinstance(step_end, StepEnd) and isinstance(turn_end, TurnEnd)
    assert (result.turn, result.step, result.call_id, result.name) == (2, 1, "call-2", "read")
    assert result.is_error and result.content == NOT_STARTED_TOOL_RESULT  # no tool/started: it never ran
    assert (step_end.turn, step_end.step) == (2, 1)
    assert (turn_end.turn, turn_end.reason, turn_end.cause, turn_end.failure) == (2, "interrupted", None, None)

    # Once entered and detached, the closers are stored and a second resume adds none.
    await store.detach(store.enter(session))
    assert await stored_events(persistence, "s1") == tuple(session.events)
    again = await store.prepare_resume("s1")
    assert tuple(again.events) == tuple(session.events)
    await store.discard(again)


@pytest.mark.parametrize(
    ("tail", "expected"),
    [
        ([(TurnStart, {"turn": 2})], [TurnEnd]),
        ([(TurnStart, {"turn": 2}), (StepStart, {"turn": 2, "step": 1})], [StepEnd, TurnEnd]),
        (
            [(TurnStart, {"turn": 2}), (StepStart, {"turn": 2, "step": 1}), (StepEnd, {"turn": 2, "step": 1})],
            [TurnEnd],
        ),
        (
            [
                (TurnStart, {"turn": 2}),
                (StepStart, {"turn": 2, "step": 1}),
                (AssistantMessage, {"turn": 2, "step": 1, "text": "", "tool_calls": CALLS}),
            ],
            [ToolResult, ToolResult, StepEnd, TurnEnd],
        ),
    ],
    ids=["open turn", "open step", "step ended", "no results"],
)
async def test_recovery_closes_exactly_what_is_open(
    store: SessionRegistry, tail: list[Step], expected: list[type[Event]]
) -> None:
    written = await store_session(store, "s1", balanced_turn(1) + tail)
    session = await store.prepare_resume("s1")
    closers = session.events[len(written) :]
    assert [type(e) for e in closers] == expected
    assert all(getattr(e, "turn", None) == 2 for e in closers)
    results = [e for e in closers if isinstance(e, ToolResult)]
    assert [r.call_id for r in results] == [c.id for c in CALLS][: len(results)]
    await store.discard(session)


# ------------------------------------------------------------------ fork


async def test_fork_copies_events_up_to_the_boundary_with_lineage(
    store: SessionRegistry, persistence: SessionStore, notices: list[tuple[str, str]]
) -> None:
    written = await store_session(store, "parent", balanced_turn(1) + balanced_turn(2))
    notices.clear()
    boundary = len(balanced_turn(1))  # right after turn 1 ended
    child = await store.fork("parent", boundary, "child")
    assert isinstance(child, SessionHeader)
    assert (child.id, child.parent_session, child.seed_length, child.cwd) == ("child", "parent", boundary, "/work")
    loaded = await persistence.load("child")
    assert loaded.header == child
    assert loaded.events == written[:boundary]
    # Lineage only: the fork is stored, not live, and announced nothing.
    assert store.get("child") is None and store.list() == []
    assert notices == []
    # The parent is untouched.
    assert await stored_events(persistence, "parent") == written


async def test_fork_of_a_live_session_and_resume_of_the_child_as_an_independent_root(
    store: SessionRegistry, persistence: SessionStore
) -> None:
    parent = await store.prepare_new("parent", cwd="/work")
    parent_entry = store.enter(parent)
    append_all(parent, balanced_turn(1))
    await store.fork("parent", len(parent), "child")
    await store.fork("parent", 0, "empty")
    assert (await persistence.load("empty")).events == ()

    child = await store.prepare_resume("child")  # while the parent is live
    child_entry = store.enter(child)
    assert tuple(child.events) == tuple(parent.events)
    child.append(TurnStart, turn=2)
    await store.detach(child_entry)
    assert store.get("parent") is parent  # detaching the child does not touch the parent
    assert len(parent) == len(balanced_turn(1))
    await store.detach(parent_entry)


async def test_fork_refusals_are_distinct(store: SessionRegistry, persistence: SessionStore) -> None:
    written = await store_session(store, "src", balanced_turn(1) + died_mid_turn(2))
    inside = len(balanced_turn(1)) + 2  # after turn/start and step/start of turn 2
    await store_session(store, "taken", balanced_turn(1))
    live = store.enter(await store.prepare_new("live-one"))

    with pytest.raises(SessionNotFoundError, match="cannot fork unknown session 'ghost'"):
        await store.fork("ghost", 0, "c1")
    with pytest.raises(ForkBoundaryError, match=f"outside 0..{len(written)}"):
        await store.fork("src", len(written) + 1, "c1")
    with pytest.raises(ForkBoundaryError, match="outside"):
        await store.fork("src", -1, "c1")
    with pytest.raises(ForkBoundaryError, match="inside open turn 2"):
        await store.fork("src", inside, "c1")
    with pytest.raises(ForkBoundaryError, match="inside open turn 2"):
        await store.fork("src", len(written), "c1")  # the stored log ends mid-turn
    with pytest.raises(SessionExistsError, match="cannot fork into 'taken'"):
        await store.fork("src", 0, "taken")
    with pytest.raises(SessionExistsError, match="cannot fork into 'live-one'"):
        await store.fork("src", 0, "live-one")
    with pytest.raises(InvalidSessionIdError):
        await store.fork("src", 0, "a/b")
    assert not await persistence.exists("c1")
    await store.detach(live)


async def test_fork_boundary_errors_are_value_errors(store: SessionRegistry) -> None:
    await store_session(store, "src", balanced_turn(1))
    with pytest.raises(ValueError, match=r"outside 0\.\.12"):
        await store.fork("src", 13, "child")


async def test_a_session_without_events_is_never_stored(store: SessionRegistry, persistence: SessionStore) -> None:
    entry = store.enter(await store.prepare_new("empty"))
    store.announce(entry)
    await store.detach(entry)
    assert not await persistence.exists("empty")
    with pytest.raises(SessionNotFoundError):
        await store.prepare_resume("empty")


# ------------------------------------------------------------------ queries


async def test_stored_lists_headers_oldest_first(store: SessionRegistry) -> None:
    await store_session(store, "b", balanced_turn(1))
    await store_session(store, "a", balanced_turn(1))
    headers = await store.stored()
    assert [h.id for h in headers] == ["b", "a"]
    assert headers[0].created_at < headers[1].created_at


async def test_load_events_reads_the_live_log_then_the_stored_one(store: SessionRegistry) -> None:
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append_all(session, balanced_turn(1))  # not flushed yet
    header, events = await store.load_events("s1")
    assert header is session.header and events == tuple(session.events)
    await store.detach(entry)
    header, events = await store.load_events("s1")
    assert header == session.header and events == tuple(session.events)
    with pytest.raises(SessionNotFoundError):
        await store.load_events("ghost")


async def test_listeners_see_the_session_in_notices(store: SessionRegistry) -> None:
    got: list[Notice] = []
    store.bus.on("session/created", got.append)
    entry = store.enter(await store.prepare_new("s1"))
    store.announce(entry)
    assert [n.subject for n in got] == [entry.session]
    await store.detach(entry)


# ------------------------------------------------------------------ one writer per session


async def test_a_session_held_by_one_store_cannot_be_resumed_through_another(persistence: SessionStore) -> None:
    # Two stores over one persistence stand for two harnesses (or processes) sharing it.
    first, second = SessionRegistry(persistence, clock=FakeClock()), SessionRegistry(persistence, clock=FakeClock())
    await store_session(first, "s1", balanced_turn(1))
    held = await first.prepare_resume("s1")  # prepared only: not live yet
    with pytest.raises(SessionLockedError, match=r"'s1' is (already )?live"):
        await second.prepare_resume("s1")
    await first.discard(held)  # a discarded preparation releases the session
    entry = second.enter(await second.prepare_resume("s1"))
    with pytest.raises(SessionLockedError):
        await first.prepare_resume("s1")
    append_all(entry.session, balanced_turn(2))
    await second.detach(entry)  # detach releases it
    resumed = await first.prepare_resume("s1")
    assert list(resumed.events) == list(entry.session.events)
    await first.discard(resumed)


async def test_a_created_session_is_held_from_its_first_flush(persistence: SessionStore) -> None:
    first, second = SessionRegistry(persistence, clock=FakeClock()), SessionRegistry(persistence, clock=FakeClock())
    entry = first.enter(await first.prepare_new("s1"))
    rival = second.enter(await second.prepare_new("s1"))  # nothing stored yet: both may prepare
    append_all(entry.session, balanced_turn(1))
    await entry.session.flush()
    with pytest.raises(SessionLockedError):
        await SessionRegistry(persistence).prepare_resume("s1")
    append_all(rival.session, balanced_turn(1))
    with pytest.raises(SessionStoreError, match="'s1' is already stored") as caught:
        await rival.session.flush()  # the first flush of the other writer won the id
    assert isinstance(caught.value.__cause__, SessionExistsError)
    await first.detach(entry)
    with pytest.raises(SessionStoreError, match="'s1' is already stored"):
        await second.detach(rival)  # its events were never stored: reported, not lost silently
    assert await stored_events(persistence, "s1") == tuple(entry.session.events)


async def test_a_discarded_preparation_stores_nothing(store: SessionRegistry, persistence: SessionStore) -> None:
    session = await store.prepare_new("s1")
    append_all(session, balanced_turn(1))
    await store.discard(session)
    assert not await persistence.exists("s1") and (await persistence.list()) == []
    await store_session(store, "s1", balanced_turn(1))  # the id is free
    assert [e.seq for e in await stored_events(persistence, "s1")] == list(range(len(balanced_turn(1))))


# ------------------------------------------------------------------ the memory store through the harness


@pytest.mark.parametrize("first_to_publish", ["a", "b"])
async def test_racing_creates_on_the_memory_store_never_mix_their_events(first_to_publish: str) -> None:
    sequencer = trio.testing.Sequencer()
    finish = {first_to_publish: 2, ("b" if first_to_publish == "a" else "a"): 3}

    def setup_for(name: str, start: int) -> Any:
        async def setup(agent: Agent) -> None:
            async with sequencer(start):
                agent.inject(f"from {name}")  # appended to its session before publication
            async with sequencer(finish[name]):
                pass

        return setup

    results: dict[str, object] = {}
    async with open_harness(model=ScriptedModel([]), store=":memory:", builtin_tools=False) as h:

        async def create(name: str, start: int) -> None:
            try:
                results[name] = await h.agents.create(session_id="same", setup=setup_for(name, start))
            except AgentExistsError as exc:
                results[name] = exc

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create, "a", 0)
            nursery.start_soon(create, "b", 1)
        loser = "b" if first_to_publish == "a" else "a"
        assert isinstance(results[loser], AgentExistsError)
        assert not await h.sessions.persistence.exists("same")  # nothing stored before the first flush
        winner = results[first_to_publish]
        assert isinstance(winner, AgentHandle) and h.agents.list() == [winner.agent]
        await winner.dispose()  # the first flush: the record appears now, the winner's events only
        loaded = await h.sessions.persistence.load("same")
    texts = [m.text for e in loaded.events if isinstance(e, InboxSpliced) for m in e.inserted]
    assert texts == [f"from {first_to_publish}"]
    assert [e.seq for e in loaded.events] == list(range(len(loaded.events)))


async def test_a_failed_setup_on_the_memory_store_leaves_the_id_free() -> None:
    async with open_harness(model=ScriptedModel([]), store=":memory:", builtin_tools=False) as h:

        async def setup(agent: Agent) -> None:
            agent.inject("before the failure")
            raise RuntimeError("setup broke")

        with pytest.raises(RuntimeError, match="setup broke"):
            await h.agents.create(session_id="x", setup=setup)
        assert not await h.sessions.persistence.exists("x")
        with pytest.raises(SessionNotFoundError):
            await h.agents.resume("x")
        async with h.agents.open(session_id="x") as agent:
            agent.inject("after")
        events = (await h.sessions.persistence.load("x")).events
    assert [m.text for e in events if isinstance(e, InboxSpliced) for m in e.inserted] == ["after"]


# ------------------------------------------------------------------ checking the store before any model call


async def test_a_store_path_that_is_a_file_is_refused_at_open_harness(tmp_path: Path) -> None:
    file = tmp_path / "not-a-dir"
    file.write_text("x")
    with pytest.raises(SessionStoreError, match=r"the session store .*not-a-dir is a regular file, not a directory"):
        async with open_harness(store=file, builtin_tools=False):
            pass  # pragma: no cover
    with pytest.raises(
        SessionStoreError, match=r"store .*not-a-dir/sessions cannot be created: .*not-a-dir is a regular file"
    ) as info:
        async with open_harness(store=file / "sessions", builtin_tools=False):
            pass  # pragma: no cover
    assert info.value.path == str(file / "sessions")
    missing = tmp_path / "a" / "b"
    async with open_harness(store=missing, builtin_tools=False):
        assert not (tmp_path / "a").exists()  # checked, not created
    async with open_harness(store=":memory:", builtin_tools=False):
        pass


async def test_create_and_resume_check_the_store_before_setup_and_any_model_call(tmp_path: Path) -> None:
    root = tmp_path / "store"
    model = ScriptedModel([{"text": "stored"}])
    setups: list[str] = []

    async def setup(agent: Agent) -> None:
        setups.append(agent.id)

    async with open_harness(model=model, store=root, builtin_tools=False) as h:
        async with h.agents.open(session_id="kept") as agent:
            agent.followup("hello")
            await agent.when_idle()
        stored = tmp_path / "moved"
        root.rename(stored)
        root.write_text("the store was replaced by a file")
        with pytest.raises(SessionStoreError, match="is a regular file, not a directory"):
            await h.agents.create(session_id="new", setup=setup)
        with pytest.raises(SessionStoreError, match="is a regular file, not a directory"):
            await h.agents.resume("kept", setup=setup)
        assert setups == [] and len(model.requests) == 1 and h.agents.list() == []


READ_ONLY_CHECK = """
import sys, trio
from trio_harness import SessionStoreError, open_harness

async def main() -> None:
    try:
        async with open_harness(store=sys.argv[1], builtin_tools=False):
            print("opened")
    except SessionStoreError as exc:
        print(exc)

trio.run(main)
"""


async def test_a_store_on_a_read_only_file_system_is_refused(tmp_path: Path) -> None:
    directory = tmp_path / "ro"
    directory.mkdir()
    code = [sys.executable, "-c", READ_ONLY_CHECK]
    if os.geteuid() == 0:
        # root may write anywhere a permission bit forbids: a read-only bind mount in a
        # private mount namespace is a real read-only file system.
        command = [
            "unshare",
            "-m",
            "sh",
            "-c",
            'mount --bind "$1" "$1" && mount -o remount,bind,ro "$1" "$1" && shift && exec "$@"',
            "sh",
            str(directory),
            *code,
            str(directory / "sessions"),
        ]
    else:
        directory.chmod(0o555)
        command = [*code, str(directory / "sessions")]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    result = await trio.run_process(command, capture_stdout=True, capture_stderr=True, env=env, check=False)
    assert result.returncode == 0, result.stderr.decode()
    assert result.stdout.decode().strip() == (
        f"the session store {directory}/sessions cannot be created: {directory} is not writable; "
        "pass a directory this process can write to"
    )
