"""Same-id creates are arbitrated before anything runs (issue 24, docs/guarantees.rst "Publication").

Two creators of one id, in two processes or two harnesses over one JSONL root
or one PostgreSQL database: exactly one create succeeds; the other raises
before its setup and before any model request.  A create that is discarded
leaves nothing listed and frees the id.  On JSONL, ids share claim bytes only
by a hash collision, which may refuse a create as busy but never lets one
succeed wrongly.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Callable
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from _postgres import Cluster, fresh_schema, postgres_cluster
from _util import WAIT, LineProcess
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness import AgentExistsError, SessionExistsError, open_harness
from trio_harness.agents import Agent
from trio_harness.model import ScriptedModel
from trio_harness.session import (
    JsonlStore,
    MemoryStore,
    PostgresStore,
    Session,
    SessionHeader,
    SessionRegistry,
    SessionStore,
    _create_lock,
)
from trio_harness.session import _events as ev

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

HERE = Path(__file__).resolve().parent


# ------------------------------------------------------------------ stores


@attrs.define
class Twins:
    """Two provider objects on one storage (two processes' views; memory: one object)."""

    kind: str
    first: SessionStore
    second: SessionStore


@pytest.fixture(params=["memory", "jsonl", "postgres"])
async def twins(request: pytest.FixtureRequest, tmp_path: Path) -> AsyncIterator[Twins]:
    if request.param == "memory":
        memory = MemoryStore()
        yield Twins("memory", memory, memory)
        return
    if request.param == "jsonl":
        yield Twins("jsonl", JsonlStore(tmp_path / "root"), JsonlStore(tmp_path / "root"))
        return
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    schema = fresh_schema()
    async with AsyncExitStack() as stack:
        first = PostgresStore(cluster.dsn(), schema=schema)
        second = PostgresStore(cluster.dsn(), schema=schema)
        await first.check()
        await stack.enter_async_context(first)
        await stack.enter_async_context(second)
        yield Twins("postgres", first, second)


def one_turn(session: Session) -> None:
    session.append(ev.TurnStart, turn=1)
    session.append(ev.TurnEnd, turn=1, reason="completed")


# ------------------------------------------------------------------ two stores, one process


@pytest.mark.parametrize("winner", [0, 1])
async def test_the_first_prepare_claims_the_id_and_the_second_is_refused_at_once(twins: Twins, winner: int) -> None:
    stores = [SessionRegistry(twins.first), SessionRegistry(twins.second)]
    sequencer = trio.testing.Sequencer()
    prepared: list[Session] = []
    refused: list[SessionExistsError] = []

    async def creator(index: int) -> None:
        async with sequencer(0 if index == winner else 1):
            try:
                prepared.append(await stores[index].prepare_new("ticket-42"))
            except SessionExistsError as exc:
                refused.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(creator, 0)
        nursery.start_soon(creator, 1)
    assert len(prepared) == 1 and len(refused) == 1
    assert "'ticket-42'" in str(refused[0])
    assert await stores[1 - winner].stored() == []  # a claim is not a stored session

    # The claim is held until the first flush stored the session; then the log refuses.
    entry = stores[winner].enter(prepared[0])
    one_turn(prepared[0])
    await prepared[0].flush()
    with pytest.raises(SessionExistsError, match="ticket-42"):
        await stores[1 - winner].prepare_new("ticket-42")
    await stores[winner].detach(entry)
    with pytest.raises(SessionExistsError, match="already"):
        await stores[1 - winner].prepare_new("ticket-42")
    assert [h.id for h in await stores[1 - winner].stored()] == ["ticket-42"]


async def test_a_discarded_create_leaves_nothing_listed_and_frees_the_id(twins: Twins) -> None:
    first, second = SessionRegistry(twins.first), SessionRegistry(twins.second)
    session = await first.prepare_new("ticket-42")
    session.append(ev.TurnStart, turn=1)  # buffered only
    with pytest.raises(SessionExistsError):
        await second.prepare_new("ticket-42")
    await first.discard(session)
    assert await first.stored() == [] and await second.stored() == []
    again = await second.prepare_new("ticket-42")  # free again, for the other store too
    entry = second.enter(again)
    one_turn(again)
    await second.detach(entry)
    assert [h.id for h in await first.stored()] == ["ticket-42"]


async def test_a_create_cancelled_during_setup_frees_the_id_for_the_other_store(twins: Twins) -> None:
    # No mock clock: the PostgreSQL store's statements run on worker threads
    # (an autojump clock would expire their write_timeout meanwhile).
    in_setup = trio.Event()

    async def setup(agent: Agent) -> None:
        in_setup.set()
        await trio.sleep_forever()

    async with (
        open_harness(model=ScriptedModel([]), store=twins.first, builtin_tools=False) as first,
        open_harness(model=ScriptedModel([]), store=twins.second, builtin_tools=False) as second,
    ):
        scope = trio.CancelScope()

        async def create() -> None:
            with scope:
                await first.agents.create(session_id="ticket-42", setup=setup)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(create)
            await in_setup.wait()
            scope.cancel()
        assert scope.cancelled_caught
        assert await second.sessions.stored() == []
        async with second.agents.open(session_id="ticket-42") as agent:
            agent.inject("the id was free")
        assert [h.id for h in await first.sessions.stored()] == ["ticket-42"]


async def test_a_fork_into_an_id_being_created_is_refused(twins: Twins) -> None:
    first, second = SessionRegistry(twins.first), SessionRegistry(twins.second)
    source = await first.prepare_new("source")
    entry = first.enter(source)
    one_turn(source)
    await first.detach(entry)
    claimed = await first.prepare_new("child")
    with pytest.raises(SessionExistsError, match="child"):
        await second.fork("source", len(source.events), "child")
    await first.discard(claimed)
    await second.fork("source", len(source.events), "child")
    assert sorted(h.id for h in await first.stored()) == ["child", "source"]


# ------------------------------------------------------------------ two harnesses, one process


@pytest.mark.parametrize("winner", [0, 1])
async def test_two_harnesses_racing_create_run_one_setup_and_one_model(twins: Twins, winner: int) -> None:
    models = [ScriptedModel([{"text": "one"}]), ScriptedModel([{"text": "two"}])]
    setups: list[int] = []
    outcomes: dict[int, object] = {}
    in_setup, release = trio.Event(), trio.Event()

    async with AsyncExitStack() as stack:
        harnesses = [
            await stack.enter_async_context(open_harness(model=models[index], store=store, builtin_tools=False))
            for index, store in enumerate((twins.first, twins.second))
        ]

        async def creator(index: int) -> None:
            async def setup(agent: Agent) -> None:
                setups.append(index)
                in_setup.set()
                if index != winner:
                    release.set()  # (today's bug: the loser's setup runs too)
                await release.wait()

            if index != winner:
                await in_setup.wait()  # the winner is inside its setup: its claim is held
            try:
                handle = await harnesses[index].agents.create(session_id="ticket-42", setup=setup)
            except AgentExistsError as exc:
                outcomes[index] = exc
                release.set()
                return
            outcomes[index] = handle
            async with handle as agent:
                agent.followup("hello")
                await agent.when_idle()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(creator, 0)
            nursery.start_soon(creator, 1)
            with trio.fail_after(WAIT):
                await release.wait()
    loser = 1 - winner
    assert setups == [winner]  # the loser's setup never ran
    assert isinstance(outcomes[loser], AgentExistsError) and "ticket-42" in str(outcomes[loser])
    assert len(models[winner].requests) == 1 and models[loser].requests == []


# ------------------------------------------------------------------ hash collisions (JSONL)


async def test_ids_sharing_a_claim_byte_may_be_refused_as_busy_but_never_both_succeed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_create_lock, "claim_offset", lambda session_id: 7)
    first, second = SessionRegistry(JsonlStore(tmp_path)), SessionRegistry(JsonlStore(tmp_path))
    x = await first.prepare_new("x")
    with pytest.raises(SessionExistsError, match="'y' already exists: it is being created"):
        await second.prepare_new("y")  # busy only because of the collision: refused, not wrongly taken
    with pytest.raises(SessionExistsError, match="'x' already exists: it is being created"):
        await second.prepare_new("x")
    entry = first.enter(x)
    one_turn(x)
    await x.flush()  # stored and locked: the byte is free again
    y = await second.prepare_new("y")
    third, header = JsonlStore(tmp_path), SessionHeader(id="x", created_at=1.0, cwd="/")
    with pytest.raises(SessionExistsError, match="'x' is already stored"):
        await third.open_writer(header)  # the byte is held by y's claim: the stored log is reported
    await second.discard(y)
    with pytest.raises(SessionExistsError, match="'x' is already stored"):
        await third.open_writer(header)  # the byte is free: the log still refuses
    await first.detach(entry)
    assert [h.id for h in await first.stored()] == ["x"]


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    steps=st.lists(
        st.tuples(st.sampled_from(["claim", "flush", "discard"]), st.integers(0, 2), st.sampled_from("abcdef")),
        max_size=25,
    ),
    buckets=st.integers(1, 3),
)
async def test_claims_succeed_exactly_when_the_id_is_free_and_its_byte_unclaimed(
    tmp_path_factory: pytest.TempPathFactory, steps: list[tuple[str, int, str]], buckets: int
) -> None:
    root = tmp_path_factory.mktemp("claims")
    offset: Callable[[str], int] = lambda session_id: ord(session_id) % buckets  # noqa: E731 (collisions on purpose)
    original = _create_lock.claim_offset
    setattr(_create_lock, "claim_offset", offset)  # noqa: B010 (a module function, replaced for the test)
    try:
        stores = [SessionRegistry(JsonlStore(root)) for _ in range(3)]
        claims: dict[str, tuple[int, Session]] = {}  # id -> (store, prepared session)
        stored: set[str] = set()
        for action, index, session_id in steps:
            if action == "claim":
                free = session_id not in stored and all(offset(other) != offset(session_id) for other in claims)
                try:
                    session = await stores[index].prepare_new(session_id)
                except SessionExistsError:
                    assert not free, (session_id, claims, stored)
                else:
                    assert free, (session_id, claims, stored)
                    claims[session_id] = (index, session)
            elif claims:
                session_id = sorted(claims)[index % len(claims)]
                owner, session = claims.pop(session_id)
                if action == "discard":
                    await stores[owner].discard(session)
                else:
                    entry = stores[owner].enter(session)
                    one_turn(session)
                    await stores[owner].detach(entry)
                    stored.add(session_id)
        for owner, session in claims.values():
            await stores[owner].discard(session)
        assert {h.id for h in await stores[0].stored()} == stored
    finally:
        setattr(_create_lock, "claim_offset", original)  # noqa: B010


# ------------------------------------------------------------------ two processes


@attrs.define
class Racer(LineProcess):
    """A racer process (tests/_create_race.py) and its JSON lines."""

    async def send(self) -> None:
        assert self.process.stdin is not None
        await self.process.stdin.send_all(b"go\n")

    async def finish(self) -> int:
        if self.process.poll() is None:
            self.process.kill()
        with trio.CancelScope(shield=True):
            code = await self.process.wait()
        return code


async def race(argv: list[str]) -> tuple[dict[str, Any], dict[str, Any]]:
    """Two racers create the same id at once; returns the winner's and the loser's final lines."""
    racers = [await Racer.start(argv), await Racer.start(argv)]
    try:
        for racer in racers:
            assert "ready" in await racer.line()
        for racer in racers:
            await racer.send()
        # Each either sits in its setup or was refused; only then is the winner let go.
        first = [await racer.line() for racer in racers]
        in_setup = [index for index, line in enumerate(first) if line.get("in_setup")]
        assert len(in_setup) == 1, first  # today's bug: both run their setup
        winner = in_setup[0]
        loser = first[1 - winner]
        await racers[winner].send()
        won = await racers[winner].line()
        with trio.fail_after(WAIT):
            assert await racers[winner].process.wait() == 0
            assert await racers[1 - winner].process.wait() == 0
        return won, loser
    finally:
        for racer in racers:
            await racer.finish()


def check_race(won: dict[str, Any], loser: dict[str, Any]) -> None:
    assert won["created"] is True and won["setup_ran"] is True and won["requests"] == 1, won
    assert loser["created"] is False and loser["error"] == "AgentExistsError", loser
    assert loser["setup_ran"] is False and loser["requests"] == 0, loser
    assert "ticket-42" in loser["message"]


async def test_two_processes_creating_one_id_on_one_jsonl_root(tmp_path: Path) -> None:
    root = tmp_path / "root"
    won, loser = await race([sys.executable, str(HERE / "_create_race.py"), "jsonl", str(root), "-", "ticket-42"])
    check_race(won, loser)
    assert [h.id for h in await JsonlStore(root).list()] == ["ticket-42"]


async def test_two_processes_creating_one_id_on_one_postgres_database(postgres_cluster: Cluster) -> None:
    schema = fresh_schema()
    dsn = postgres_cluster.dsn()
    persistence = PostgresStore(dsn, schema=schema)
    await persistence.check()  # the tables exist before the racers start
    won, loser = await race([sys.executable, str(HERE / "_create_race.py"), "postgres", dsn, schema, "ticket-42"])
    check_race(won, loser)
    async with persistence:
        assert [h.id for h in await persistence.list()] == ["ticket-42"]
