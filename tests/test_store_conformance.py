"""Every session store keeps the same promises (docs/sessions.rst, "Stores" and "Writing and durability").

One suite, run against the in-memory, JSONL and PostgreSQL stores: no record
before the first flush, one writer per session, whole batches, resume
continuing the sequence, fork, listing order, header round trip, closed
writers, failed flushes reported and retried, posted messages.  Where the
stores differ on purpose (only PostgreSQL keeps messages for a session nobody
holds), the test states both behaviours.

The PostgreSQL store runs on a throwaway cluster (tests/_postgres.py), one
schema per test.
"""

from __future__ import annotations

import shutil
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _postgres import Cluster, fresh_schema, postgres_cluster
from test_images import png

from trio_harness import (
    AgentNotFoundError,
    ForkBoundaryError,
    Image,
    InvalidSessionIdError,
    SessionExistsError,
    SessionLockedError,
    SessionNotFoundError,
    SessionStoreError,
    open_harness,
)
from trio_harness.model import ScriptedModel
from trio_harness.model._protocol import ToolCall
from trio_harness.session import (
    JsonlStore,
    MemoryStore,
    PooledPostgresStore,
    PostgresStore,
    Session,
    SessionHeader,
    SessionRegistry,
    SessionStore,
)
from trio_harness.session import _events as ev
from trio_harness.session._events import Event, ImagePart, InboxMessage

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

STORES = ["memory", "jsonl", "postgres", "postgres-pooled"]


@attrs.define
class FakeClock:
    now: float = 1_700_000_000.0

    def __call__(self) -> float:
        self.now += 1.0
        return self.now


@attrs.define
class Kit:
    """One store under test, and what the tests need around it."""

    kind: str
    persistence: SessionStore
    # Another provider object on the same storage (another process's view;
    # the in-memory store has no such thing, so it is the same object).
    twin: Callable[[], SessionStore]
    # Break the store so that a new session cannot be stored, and mend it.
    breaks: Callable[[], None] | None = None
    mends: Callable[[], None] | None = None

    def store(self, clock: Callable[[], float] | None = None) -> SessionRegistry:
        return SessionRegistry(self.persistence, clock=clock if clock is not None else FakeClock())


def _psql(cluster: Cluster, sql: str) -> None:
    cluster.psql(sql)


@pytest.fixture(params=STORES)
async def kit(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Kit]:
    if request.param == "memory":
        memory = MemoryStore()
        yield Kit("memory", memory, twin=lambda: memory)
        return
    if request.param == "jsonl":
        root = tmp_path / "sessions"

        def break_jsonl() -> None:
            if root.is_dir():
                shutil.rmtree(root)
            root.write_text("not a directory\n")

        def mend_jsonl() -> None:
            root.unlink()
            root.mkdir()

        yield Kit("jsonl", JsonlStore(root), twin=lambda: JsonlStore(root), breaks=break_jsonl, mends=mend_jsonl)
        return
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    schema = fresh_schema()
    async with AsyncExitStack() as stack:
        make = PooledPostgresStore if request.param == "postgres-pooled" else PostgresStore
        first = make(cluster.dsn(), schema=schema)
        await first.check()
        await stack.enter_async_context(first)

        yield Kit(
            "postgres",
            first,
            twin=lambda: make(cluster.dsn(), schema=schema),
            breaks=lambda: _psql(cluster, f"ALTER TABLE {schema}.events RENAME TO events_away"),
            mends=lambda: _psql(cluster, f"ALTER TABLE {schema}.events_away RENAME TO events"),
        )


async def appended(session: Session, predicate: Callable[[Event], bool]) -> Event:
    """Wait until an event matching ``predicate`` is in the session (already, or appended later)."""
    for event in session.events:
        if predicate(event):
            return event
    found: list[Event] = []
    seen = trio.Event()

    def watch(event: Event) -> None:
        if not found and predicate(event):
            found.append(event)
            seen.set()

    remove = session.observe(watch)
    try:
        with trio.fail_after(10):  # delivery crosses a socket: a bound, not a sleep
            await seen.wait()
    finally:
        remove()
    return found[0]


async def opened(stack: AsyncExitStack, persistence: SessionStore) -> SessionStore:
    """Open a twin's service (PostgreSQL) for the rest of the test."""
    if isinstance(persistence, PostgresStore):
        await stack.enter_async_context(persistence)
    return persistence


CALLS = (ToolCall("call-1", "bash", '{"command": "ls"}'),)


def turn(number: int, text: str = "do it") -> list[tuple[type[Event], dict[str, Any]]]:
    """One complete turn: a message claimed, a tool call, an answer."""
    message_id = f"m{number}"
    return [
        (ev.InboxSpliced, {"queue": "next-turn", "start": 0, "inserted": (InboxMessage(message_id, text),)}),
        (ev.TurnStart, {"turn": number}),
        (ev.StepStart, {"turn": number, "step": 1}),
        (
            ev.InboxSpliced,
            {"queue": "next-turn", "start": 0, "removed": (message_id,), "outcome": "claimed", "turn": number},
        ),
        (ev.UserMessage, {"turn": number, "step": 1, "message_id": message_id, "text": text}),
        (ev.AssistantMessage, {"turn": number, "step": 1, "text": "", "tool_calls": CALLS}),
        (ev.ToolResult, {"turn": number, "step": 1, "call_id": "call-1", "name": "bash", "content": "a\nb"}),
        (ev.StepEnd, {"turn": number, "step": 1}),
        (ev.TurnEnd, {"turn": number, "reason": "completed"}),
    ]


def store_failure_of(session: Session) -> SessionStoreError | None:
    return session.store_failure


def append(session: Session, steps: list[tuple[type[Event], dict[str, Any]]]) -> None:
    for cls, fields in steps:
        session.append(cls, **fields)


async def create(store: SessionRegistry, session_id: str, steps: list[tuple[type[Event], dict[str, Any]]]) -> Session:
    """Create, fill and detach a session."""
    session = await store.prepare_new(session_id, cwd="/work")
    entry = store.enter(session)
    append(session, steps)
    await store.detach(entry)
    return session


# ------------------------------------------------------------------ no record before the first flush


async def test_nothing_is_stored_before_the_first_flush_and_everything_after(kit: Kit) -> None:
    persistence = kit.persistence
    writer = await persistence.open_writer(SessionHeader(id="s1", created_at=1.0, cwd="/w"))
    session = Session(header=SessionHeader(id="s1", created_at=1.0, cwd="/w"), events=[], writer=writer)
    append(session, turn(1))
    assert not await persistence.exists("s1")
    assert await persistence.list() == []
    with pytest.raises(SessionNotFoundError):
        await persistence.load("s1")
    await session.flush()
    assert await persistence.exists("s1")
    assert [h.id for h in await persistence.list()] == ["s1"]
    assert (await persistence.load("s1")).events == tuple(session.events)
    await writer.aclose()


async def test_the_fast_mailbox_check_agrees_with_the_protocol(kit: Kit) -> None:
    """has_mailbox (the per-create check) answers as isinstance(writer, MailboxWriter) for every store."""
    from trio_harness.session._persistence import MAILBOX_METHODS, MailboxWriter, has_mailbox

    members = {name for name, value in vars(MailboxWriter).items() if callable(value) and not name.startswith("_")}
    assert set(MAILBOX_METHODS) == members
    writer = await kit.persistence.open_writer(SessionHeader(id="s1", created_at=1.0, cwd="/w"))
    try:
        assert has_mailbox(writer) == isinstance(writer, MailboxWriter)
        assert has_mailbox(writer) == (kit.kind == "postgres")
        assert not has_mailbox(object())
    finally:
        await writer.aclose()


async def test_a_writer_closed_before_any_flush_leaves_nothing_and_the_id_free(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    append(session, turn(1))
    await store.discard(session)
    assert not await kit.persistence.exists("s1")
    again = await create(store, "s1", turn(1))
    assert (await kit.persistence.load("s1")).events == tuple(again.events)


async def test_a_session_without_events_is_never_stored(kit: Kit) -> None:
    store = kit.store()
    entry = store.enter(await store.prepare_new("empty"))
    await store.detach(entry)
    assert not await kit.persistence.exists("empty")


# ------------------------------------------------------------------ one writer per session


async def test_a_session_held_by_one_writer_cannot_be_resumed_through_another_store(kit: Kit) -> None:
    await create(kit.store(), "s1", turn(1))
    first, second = kit.store(), kit.store()
    held = await first.prepare_resume("s1")
    with pytest.raises(SessionLockedError):
        await second.prepare_resume("s1")
    await first.discard(held)  # a discarded preparation releases the session
    resumed = await second.prepare_resume("s1")
    assert len(resumed) == len(turn(1))
    await second.discard(resumed)


async def test_a_session_held_through_one_provider_object_is_refused_through_another(kit: Kit) -> None:
    await create(kit.store(), "s1", turn(1))
    async with AsyncExitStack() as stack:
        other = SessionRegistry(await opened(stack, kit.twin()))
        mine = kit.store()
        held = await mine.prepare_resume("s1")
        with pytest.raises(SessionLockedError):
            await other.prepare_resume("s1")
        await mine.discard(held)
        resumed = await other.prepare_resume("s1")
        await other.discard(resumed)


async def test_a_created_session_is_held_from_its_first_flush_until_detached(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append(session, turn(1))
    await session.flush()
    with pytest.raises(SessionLockedError):
        await kit.store().prepare_resume("s1")
    await store.detach(entry)
    resumed = await kit.store().prepare_resume("s1")
    assert tuple(resumed.events) == tuple(session.events)


@pytest.mark.parametrize("first_to_prepare", ["a", "b"])
async def test_two_creators_of_one_id_the_first_to_prepare_claims_it_the_other_is_refused_at_once(
    kit: Kit, first_to_prepare: str
) -> None:
    loser = "b" if first_to_prepare == "a" else "a"
    async with AsyncExitStack() as stack:
        stores = {first_to_prepare: kit.store(), loser: SessionRegistry(await opened(stack, kit.twin()))}
        session = await stores[first_to_prepare].prepare_new("s1")
        with pytest.raises(SessionExistsError, match="'s1' already exists"):
            await stores[loser].prepare_new("s1")  # claimed: refused before anything runs (issue 24)
        entry = stores[first_to_prepare].enter(session)
        append(session, turn(1, text=f"from {first_to_prepare}"))
        await session.flush()
        with pytest.raises(SessionExistsError):
            await stores[loser].prepare_new("s1")
        await stores[first_to_prepare].detach(entry)
        with pytest.raises(SessionExistsError):
            await stores[loser].prepare_new("s1")
    assert (await kit.persistence.load("s1")).events == tuple(session.events)


async def test_prepare_new_of_a_stored_id_is_refused(kit: Kit) -> None:
    await create(kit.store(), "s1", turn(1))
    with pytest.raises(SessionExistsError):
        await kit.store().prepare_new("s1")


# ------------------------------------------------------------------ batches and sequences


async def test_each_flush_stores_its_batch_whole_and_in_order(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    for number in range(1, 6):
        append(session, turn(number))
        await session.flush()
        stored = (await kit.persistence.load("s1")).events
        assert stored == tuple(session.events)
        assert [event.seq for event in stored] == list(range(len(stored)))
    await store.detach(entry)


async def test_a_resumed_session_continues_its_sequence(kit: Kit) -> None:
    first = await create(kit.store(), "s1", turn(1))
    store = kit.store()
    resumed = await store.prepare_resume("s1")
    entry = store.enter(resumed)
    assert tuple(resumed.events) == tuple(first.events)
    append(resumed, turn(2))
    await store.detach(entry)
    stored = (await kit.persistence.load("s1")).events
    assert [event.seq for event in stored] == list(range(2 * len(turn(1))))
    assert stored == tuple(resumed.events)


async def test_a_session_that_died_mid_turn_is_closed_on_resume(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append(session, turn(1)[:-2])  # the turn is open: a tool result, no step or turn end
    await session.flush()
    await entry.writer.aclose()  # not detached: the writer goes as a crash would take it
    resumed = await kit.store().prepare_resume("s1")
    ends = [event for event in resumed.events if isinstance(event, ev.TurnEnd)]
    assert [(end.turn, end.reason) for end in ends] == [(1, "interrupted")]


async def test_events_and_header_round_trip_exactly(kit: Kit) -> None:
    store = SessionRegistry(kit.persistence, clock=FakeClock())
    session = await store.prepare_new("unicode-ß-☃", cwd="/home/zoë/proj ect", parent_session="parent")
    entry = store.enter(session)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m1", 'héllo\n\t"quoted" 🎉'),))
    session.append(ev.AssistantChunk, turn=1, step=1, kind="text", text="half an emoji: \ud83d")
    session.append(ev.AssistantChunk, turn=1, step=1, kind="reasoning", text="\x00 nul and \u2028 separators")
    await store.detach(entry)
    loaded = await kit.persistence.load("unicode-ß-☃")
    assert loaded.header == session.header
    assert loaded.events == tuple(session.events)
    (listed,) = await kit.persistence.list()
    assert listed == session.header


# ------------------------------------------------------------------ queries


async def test_stored_sessions_are_listed_oldest_first_then_by_id(kit: Kit) -> None:
    clock = FakeClock()
    await create(SessionRegistry(kit.persistence, clock=clock), "b", turn(1))
    await create(SessionRegistry(kit.persistence, clock=clock), "a", turn(1))
    tied = FakeClock(now=clock.now + 10)
    for session_id in ("z", "y"):
        tied.now = clock.now + 10  # the same creation time: ordered by id
        await create(SessionRegistry(kit.persistence, clock=lambda: tied.now), session_id, turn(1))
    assert [h.id for h in await kit.persistence.list()] == ["b", "a", "y", "z"]
    assert [h.id for h in await kit.store().stored()] == ["b", "a", "y", "z"]


async def test_exists_load_and_resume_of_unknown_and_invalid_ids(kit: Kit) -> None:
    assert not await kit.persistence.exists("nope")
    with pytest.raises(SessionNotFoundError):
        await kit.persistence.load("nope")
    with pytest.raises(SessionNotFoundError):
        await kit.store().prepare_resume("nope")
    for bad in ("", "a/b", "..", "x\x00y"):
        with pytest.raises(InvalidSessionIdError):
            await kit.persistence.exists(bad)
        with pytest.raises(InvalidSessionIdError):
            await kit.persistence.load(bad)


async def test_a_live_session_can_be_read_but_not_taken(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append(session, turn(1))
    await session.flush()
    append(session, turn(2)[:3])  # buffered, not flushed
    assert len((await kit.persistence.load("s1")).events) == len(turn(1))
    with pytest.raises(SessionLockedError):
        await kit.store().prepare_resume("s1")
    await store.detach(entry)


# ------------------------------------------------------------------ fork


async def test_fork_stores_the_prefix_with_lineage_and_the_child_is_resumable(kit: Kit) -> None:
    parent = await create(kit.store(), "parent", turn(1) + turn(2))
    store = kit.store()
    boundary = len(turn(1))
    child = await store.fork("parent", boundary, "child")
    assert child.parent_session == "parent" and child.seed_length == boundary
    loaded = await kit.persistence.load("child")
    assert loaded.header == child
    assert loaded.events == tuple(parent.events[:boundary])
    resumed = await store.prepare_resume("child")
    entry = store.enter(resumed)
    append(resumed, turn(2, text="the child's own turn"))
    await store.detach(entry)
    assert (await kit.persistence.load("parent")).events == tuple(parent.events)  # untouched


async def test_fork_of_a_live_session_includes_its_unflushed_events(kit: Kit) -> None:
    store = kit.store()
    parent = await store.prepare_new("parent")
    entry = store.enter(parent)
    append(parent, turn(1))
    await parent.flush()
    append(parent, turn(2))  # not flushed: only in memory
    await store.fork("parent", len(parent), "child")
    assert (await kit.persistence.load("child")).events == tuple(parent.events)
    await store.detach(entry)


async def test_fork_refusals(kit: Kit) -> None:
    await create(kit.store(), "parent", turn(1))
    await create(kit.store(), "taken", turn(1))
    store = kit.store()
    with pytest.raises(SessionNotFoundError):
        await store.fork("missing", 0, "c1")
    with pytest.raises(ForkBoundaryError):
        await store.fork("parent", 3, "c1")  # inside the open turn
    with pytest.raises(ForkBoundaryError):
        await store.fork("parent", len(turn(1)) + 1, "c1")
    with pytest.raises(SessionExistsError):
        await store.fork("parent", len(turn(1)), "taken")
    assert not await kit.persistence.exists("c1")
    assert (await kit.persistence.load("taken")).header.parent_session is None


# ------------------------------------------------------------------ closed writers and failed flushes


async def test_a_closed_writer_refuses_to_store_and_closing_twice_is_harmless(kit: Kit) -> None:
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append(session, turn(1))
    await store.detach(entry)
    session.append(ev.TurnStart, turn=2)  # after detach: nowhere to go
    with pytest.raises(SessionStoreError) as caught:
        await session.flush()
    assert caught.value.session_id == "s1"
    await entry.writer.aclose()
    assert len((await kit.persistence.load("s1")).events) == len(turn(1))


@pytest.mark.parametrize("kit", ["jsonl", "postgres"], indirect=True)
async def test_a_failed_flush_is_reported_keeps_its_events_and_a_retry_stores_them(kit: Kit) -> None:
    # The in-memory store cannot fail; the others are broken for real.
    assert kit.breaks is not None and kit.mends is not None
    store = kit.store()
    session = await store.prepare_new("s1")
    entry = store.enter(session)
    append(session, turn(1))
    kit.breaks()
    with pytest.raises(SessionStoreError) as caught:
        await session.flush()
    assert caught.value.session_id == "s1"
    assert store_failure_of(session) is caught.value
    kit.mends()
    assert not await kit.persistence.exists("s1")
    await session.flush()  # the retry stores the whole batch
    assert store_failure_of(session) is None
    assert (await kit.persistence.load("s1")).events == tuple(session.events)
    await store.detach(entry)


# ------------------------------------------------------------------ posted messages


async def test_a_message_posted_to_a_live_agent_is_spliced_into_its_inbox_and_stored(kit: Kit) -> None:
    model = ScriptedModel([{"text": "first"}, {"text": "second"}])
    async with open_harness(model=model, store=kit.persistence, builtin_tools=False) as harness:
        async with harness.agents.open(session_id="agent") as agent:
            agent.followup("hello")
            await agent.when_idle()
            message_id = await harness.sessions.post("agent", "posted", mode="followup")
            await appended(agent.session, lambda e: isinstance(e, ev.TurnEnd) and e.turn == 2)
            await agent.when_idle()
            claimed = [e for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert [(e.text, e.message_id) for e in claimed][-1] == ("posted", message_id)
    stored = (await kit.persistence.load("agent")).events
    assert [e.text for e in stored if isinstance(e, ev.UserMessage)] == ["hello", "posted"]


async def test_a_message_posted_to_a_fresh_agent_with_nothing_stored_yet_is_delivered(kit: Kit) -> None:
    async with open_harness(model=ScriptedModel([{"text": "ok"}]), store=kit.persistence, builtin_tools=False) as h:
        async with h.agents.open(session_id="fresh") as agent:
            message_id = await h.sessions.post("fresh", "the very first message")
            await appended(agent.session, lambda e: isinstance(e, ev.TurnEnd))
            await agent.when_idle()
    claimed = [e for e in (await kit.persistence.load("fresh")).events if isinstance(e, ev.UserMessage)]
    assert [(e.text, e.message_id) for e in claimed] == [("the very first message", message_id)]


async def test_a_message_posted_to_a_session_nobody_holds(kit: Kit) -> None:
    """PostgreSQL keeps it until the next resume; the local stores refuse it (docs/postgres.rst)."""
    await create(kit.store(), "idle", turn(1))
    model = ScriptedModel([{"text": "ok"}])
    async with open_harness(model=model, store=kit.persistence, builtin_tools=False) as harness:
        with pytest.raises(SessionNotFoundError):
            await harness.sessions.post("never-stored", "hi")
        if kit.kind != "postgres":
            with pytest.raises(AgentNotFoundError, match="not live in this process"):
                await harness.sessions.post("idle", "hi")
            return
        await harness.sessions.post("idle", "while nobody holds it")
        async with harness.agents.open(session_id="idle", resume=True) as agent:
            await appended(agent.session, lambda e: isinstance(e, ev.TurnEnd) and e.turn == 2)
            texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert texts == ["do it", "while nobody holds it"]


# ------------------------------------------------------------------ large images (session/_blobs.py)


async def test_a_large_image_resumes_and_forks_as_it_was_appended(kit: Kit) -> None:
    big = ImagePart.of(Image(png(300, 300, seed=4), "image/png"))  # above MAX_INLINE_IMAGE_BYTES
    store = kit.store()
    session = await store.prepare_new("img", cwd="/work")
    entry = store.enter(session)
    append(session, turn(1))
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(InboxMessage("m2", "look", images=(big,)),))
    append(session, turn(2)[1:4])
    session.append(ev.UserMessage, turn=2, step=1, message_id="m2", text="look", images=(big,))
    append(session, turn(2)[5:])
    expected = tuple(session.events)
    await store.detach(entry)
    stored = (await kit.persistence.load("img")).events
    assert len(stored) == len(expected)
    assert isinstance(stored[-5], ev.UserMessage)
    # The memory store keeps it inline.
    inline = kit.kind == "memory"
    assert stored[-5].images[0].by_reference is not inline
    other = kit.store()
    resumed = await other.prepare_resume("img")
    assert tuple(resumed.events) == expected
    await other.discard(resumed)
    await other.fork("img", len(expected), "img-child")
    child = await other.prepare_resume("img-child")
    assert tuple(child.events) == expected
    await other.discard(child)
