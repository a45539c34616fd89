"""A resumed agent starts the work its restored inbox holds (docs/inbox.rst, "The durable inbox"; issue 28).

A worker that died after a message was spliced into an agent's inbox (the
``agent/inbox/spliced`` stored) but before a turn claimed it leaves a log that
ends with the message pending.  The worker that resumes the session must run
it as the dead one would have: a pending followup or steer starts a turn on
resume, which claims it exactly once; a parked inject alone waits for a waking
send; messages a ``keep_inbox=True`` cancel kept wait for one too.

The logs are either written by a real agent and cut where the process died
(the JSONL file as it was on disk then), or written event by event as a
crashed worker leaves them, through the store's own writer: a JSONL
directory, and PostgreSQL in both modes (a real cluster).
"""

from __future__ import annotations

import functools
import tempfile
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Literal

import pytest
import trio
import trio.testing
from _pg_modes import MODES, make
from _postgres import Cluster, postgres_cluster, schema
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness.agents import Agent
from trio_harness.agents._driver import ReactAgent
from trio_harness.model import ScriptedModel
from trio_harness.model._protocol import ToolCall
from trio_harness.session import JsonlStore, Session, SessionRegistry, SessionStore
from trio_harness.session import _events as ev
from trio_harness.session._events import InboxMessage
from trio_harness.testing import assert_balanced, open_test_harness

_FIXTURES = (postgres_cluster, schema)  # imported for pytest

SID = "resumed"
Kind = Literal["followup", "steer", "late-steer", "inject"]
# Where each kind of message waits: a steer that arrived while a cancelled turn was closing went to next-turn.
QUEUE: dict[Kind, ev.InboxQueue] = {
    "followup": "next-turn",
    "steer": "next-step",
    "late-steer": "next-turn",
    "inject": "next-step",
}
MODE: dict[Kind, ev.SendMode] = {"followup": "followup", "steer": "steer", "late-steer": "steer", "inject": "inject"}


def one_turn(session: Session, turn: int, message_id: str) -> None:
    """A completed turn that claimed ``message_id`` (pending at the front of next-turn)."""
    session.append(ev.TurnStart, turn=turn)
    session.append(ev.StepStart, turn=turn, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=(message_id,), outcome="claimed", turn=turn)
    session.append(ev.UserMessage, turn=turn, step=1, message_id=message_id, text="do it")
    session.append(ev.AssistantMessage, turn=turn, step=1, text="done")
    session.append(ev.StepEnd, turn=turn, step=1)
    session.append(ev.TurnEnd, turn=turn, reason="completed")


def splice(session: Session, kind: Kind, message_id: str) -> None:
    """Log ``message_id`` of ``kind`` added at the end of its queue (as send and a posted delivery do)."""
    queue = QUEUE[kind]
    start = sum(
        len(e.inserted) - len(e.removed) for e in session.events if isinstance(e, ev.InboxSpliced) and e.queue == queue
    )
    message = InboxMessage(message_id, f"text of {message_id}", mode=MODE[kind])
    session.append(ev.InboxSpliced, queue=queue, start=start, inserted=(message,))


async def write_log(persistence: SessionStore, fill: Callable[[Session], None]) -> None:
    """Store the log a worker leaves when it dies: one completed turn, then what ``fill`` appends."""
    registry = SessionRegistry(persistence)
    session = await registry.prepare_new(SID, cwd="/work")
    entry = registry.enter(session)
    splice(session, "followup", "m1")
    one_turn(session, 1, "m1")
    fill(session)
    await registry.detach(entry)


def claims(agent: Agent) -> dict[str, list[int]]:
    """The turns that claimed each message id (a message is claimed once: one turn)."""
    found: dict[str, list[int]] = {}
    for event in agent.session.events:
        if isinstance(event, ev.InboxSpliced) and event.outcome == "claimed":
            assert event.turn is not None
            for message_id in event.removed:
                found.setdefault(message_id, []).append(event.turn)
    return found


def turn_ends(agent: Agent) -> list[tuple[int, str]]:
    return [(e.turn, e.reason) for e in agent.session.events if isinstance(e, ev.TurnEnd)]


async def settle(agent: Agent) -> None:
    """Let whatever the resume started run to its end."""
    await trio.testing.wait_all_tasks_blocked()
    await agent.when_idle()
    await agent.session.flush()


def answers(count: int) -> ScriptedModel:
    return ScriptedModel([{"text": f"answer {n}"} for n in range(count)])


# ---------------------------------------------------------------- a real agent's log, cut where its process died


async def test_a_followup_a_dead_worker_spliced_runs_once_when_the_session_is_resumed(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The writer: a turn, then a followup whose splice is on disk but which no turn claimed yet (the
    # agent held idle in maintenance, as a worker whose turn had not begun).  Its process dies there:
    # the log is the file as it was on disk at that moment.
    async with open_test_harness(answers(2), store=tmp_path) as harness:
        async with harness.agents.open(session_id=SID) as agent:
            agent.followup("turn one")
            await agent.when_idle()
            async with agent.maintenance():
                posted = agent.followup("posted before the kill")
                await agent.session.flush()
                path = JsonlStore(tmp_path).path_of(SID)
                on_disk = path.read_bytes()
            await agent.when_idle()  # (the writer that did not die ran it)
    path.write_bytes(on_disk)  # what the dead writer left

    model = answers(1)
    async with open_test_harness(model, store=tmp_path) as harness:
        async with harness.agents.open(session_id=SID, resume=True) as agent:
            assert agent.status == "running"  # started by the resume, nothing else was sent
            await settle(agent)
            assert claims(agent)[posted] == [2]
            assert turn_ends(agent) == [(1, "completed"), (2, "completed")]
            assert [e.message_id for e in agent.session.events if isinstance(e, ev.UserMessage)][-1] == posted
            assert len(agent.inbox) == 0 and len(model.requests) == 1
            assert_balanced(agent.session)
    # Resumed once more, nothing is pending: nothing runs again.
    async with open_test_harness(answers(0), store=tmp_path) as harness:
        async with harness.agents.open(session_id=SID, resume=True) as agent:
            await settle(agent)
            assert turn_ends(agent) == [(1, "completed"), (2, "completed")]


# ---------------------------------------------------------------- logs as crashed workers leave them


async def resume_and_settle(where: SessionStore | Path, model: ScriptedModel) -> Agent:
    """Resume :data:`SID` on ``where``, let what the resume started end; the agent (disposed by then)."""
    async with open_test_harness(model, store=where) as harness:
        async with harness.agents.open(session_id=SID, resume=True) as agent:
            await settle(agent)
            assert_balanced(agent.session)
    return agent


@pytest.mark.parametrize("store_kind", ["jsonl", *MODES])
async def test_a_spliced_unclaimed_followup_starts_one_turn_on_resume_on_every_store(
    store_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    def fill(session: Session) -> None:
        splice(session, "followup", "posted-1")

    if store_kind == "jsonl":
        await write_log(JsonlStore(tmp_path), fill)
        where: SessionStore | Path = tmp_path
        agent = await resume_and_settle(where, answers(1))
    else:
        cluster: Cluster = request.getfixturevalue("postgres_cluster")
        name: str = request.getfixturevalue("schema")
        writer = make(store_kind, cluster.dsn(), name)
        await writer.check()
        async with writer:
            await write_log(writer, fill)
        async with make(store_kind, cluster.dsn(), name) as taker:
            agent = await resume_and_settle(taker, answers(1))
    assert claims(agent) == {"m1": [1], "posted-1": [2]}
    assert turn_ends(agent) == [(1, "completed"), (2, "completed")]


async def test_a_followup_left_by_a_worker_that_died_mid_turn_runs_after_the_interrupted_turn(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    def fill(session: Session) -> None:
        splice(session, "followup", "m2")
        session.append(ev.TurnStart, turn=2)
        session.append(ev.StepStart, turn=2, step=1)
        session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=("m2",), outcome="claimed", turn=2)
        session.append(ev.UserMessage, turn=2, step=1, message_id="m2", text="do it")
        session.append(ev.AssistantMessage, turn=2, step=1, text="", tool_calls=(ToolCall("c1", "bash", "{}"),))
        splice(session, "followup", "m3")  # posted while turn 2 ran its tool; then the process died

    await write_log(JsonlStore(tmp_path), fill)
    agent = await resume_and_settle(tmp_path, answers(1))
    assert claims(agent) == {"m1": [1], "m2": [2], "m3": [3]}
    assert turn_ends(agent) == [(1, "completed"), (2, "interrupted"), (3, "completed")]


# ---------------------------------------------------------------- which queue, and what holds it back

Ending = Literal["idle", "mid-turn", "disposed", "kept", "kept-then-woken"]


def arrivals(kinds: Sequence[Kind], ending: Ending) -> list[tuple[str, Kind]]:
    """The pending messages in the order they were logged: after a cancel, the late steers come last.

    A steer is moved to next-turn only once its turn is cancelled: in the
    ``kept`` endings it is sent after the cancel (its mark), the others before.
    """
    pairs: list[tuple[str, Kind]] = [(f"p{n}", kind) for n, kind in enumerate(kinds)]
    if ending in ("kept", "kept-then-woken"):
        pairs = [p for p in pairs if p[1] != "late-steer"] + [p for p in pairs if p[1] == "late-steer"]
    if ending == "kept-then-woken":
        pairs.append(("wake", "followup"))
    return pairs


def expected_turns(kinds: Sequence[Kind], ending: Ending) -> list[list[str]]:
    """The message ids each new turn claims, in turn order ([] when nothing runs).

    The first new turn's first step claims every next-step message and the
    first next-turn one; each further next-turn message gets its own turn.
    A ``kept`` cancel holds everything unless a waking send (a late steer)
    came after it.
    """
    pairs = arrivals(kinds, ending)
    waking = any(kind != "inject" for _, kind in pairs)
    if not waking or (ending == "kept" and "late-steer" not in kinds):
        return []
    step = [i for i, kind in pairs if QUEUE[kind] == "next-step"]
    turn = [i for i, kind in pairs if QUEUE[kind] == "next-turn"]
    if not turn:
        return [step]
    return [[*step, turn[0]], *([i] for i in turn[1:])]


def crashed_log(kinds: Sequence[Kind], ending: Ending, *, marks: bool = True) -> Callable[[Session], None]:
    """The log of ``ending`` with ``kinds`` pending; ``marks=False``: as written before cancels were marked."""

    def fill(session: Session) -> None:
        pairs = arrivals(kinds, ending)
        if ending == "idle":
            for message_id, kind in pairs:
                splice(session, kind, message_id)
            return
        # Turn 2 runs (its prompt claimed); the messages arrive meanwhile, then:
        splice(session, "followup", "m2")
        session.append(ev.TurnStart, turn=2)
        session.append(ev.StepStart, turn=2, step=1)
        session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=("m2",), outcome="claimed", turn=2)
        session.append(ev.UserMessage, turn=2, step=1, message_id="m2", text="do it")
        if ending in ("mid-turn", "disposed"):
            for message_id, kind in pairs:
                splice(session, kind, message_id)
            if ending == "mid-turn":
                return  # the process died: recovery closes turn 2 interrupted
            session.append(ev.StepEnd, turn=2, step=1)
            # its harness closed: a disposal decides nothing about pending work
            session.append(ev.TurnEnd, turn=2, reason="aborted", cause="disposed")
            return
        # cancel(keep_inbox=True): turn 2 aborted by the user, the messages sent before it kept for a later wake
        before = [p for p in pairs if p[1] != "late-steer" and p[0] != "wake"]
        for message_id, kind in before:
            splice(session, kind, message_id)
        if marks:
            session.append(ev.InboxSpliced, queue="next-turn", start=0, outcome="canceled")  # the cancel's mark
        for message_id, kind in pairs[len(before) :]:
            if kind == "late-steer":  # sent after the cancel, while turn 2 was closing
                splice(session, kind, message_id)
        session.append(ev.StepEnd, turn=2, step=1)
        session.append(ev.TurnEnd, turn=2, reason="aborted", cause="user")
        if ending == "kept-then-woken":
            splice(session, "followup", "wake")  # a waking send after the cancel runs everything

    return fill


async def _check_queues(root: Path, kinds: Sequence[Kind], ending: Ending, *, marks: bool = True) -> None:
    await write_log(JsonlStore(root), crashed_log(kinds, ending, marks=marks))
    expected = expected_turns(kinds, ending)
    agent = await resume_and_settle(root, answers(len(expected)))
    old = 1 if ending == "idle" else 2
    got = claims(agent)
    last = max(e.turn for e in agent.session.events if isinstance(e, ev.TurnStart))
    new_turns = [sorted(i for i, turns in got.items() if turns == [turn]) for turn in range(old + 1, last + 1)]
    assert new_turns == [sorted(ids) for ids in expected], (kinds, ending, agent.session.events[-12:])
    assert all(len(turns) == 1 for turns in got.values())  # each claimed once
    if expected:
        assert len(agent.inbox) == 0
        assert turn_ends(agent)[-len(expected) :] == [(t, "completed") for t in range(old + 1, last + 1)]
    else:  # nothing ran: everything still waits
        pending = [*agent.inbox.next_turn, *agent.inbox.next_step]
        assert sorted(m.id for m in pending) == sorted(f"p{n}" for n in range(len(kinds)))


@pytest.mark.parametrize("ending", ["idle", "mid-turn", "disposed", "kept", "kept-then-woken"])
@pytest.mark.parametrize("kind", ["followup", "steer", "late-steer", "inject"])
async def test_each_queue_on_resume(
    kind: Kind, ending: Ending, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A followup or steer (next-step, or next-turn after a cancel) starts a turn; an inject alone, a kept one wait."""
    await _check_queues(tmp_path, [kind], ending)


@pytest.mark.parametrize("ending", ["kept", "kept-then-woken"])
@pytest.mark.parametrize("kind", ["followup", "steer", "late-steer", "inject"])
async def test_each_queue_on_resume_of_a_log_without_cancel_marks(
    kind: Kind, ending: Ending, tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A log written before cancels were marked: the turn's end is the cancel, a late steer still runs."""
    await _check_queues(tmp_path, [kind], ending, marks=False)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    kinds=st.lists(st.sampled_from(list(QUEUE)), min_size=1, max_size=5),
    ending=st.sampled_from(["idle", "mid-turn", "disposed", "kept", "kept-then-woken"]),
    marks=st.booleans(),
)
def test_any_mix_of_pending_messages_is_claimed_once_as_its_writer_would_have(
    kinds: list[Kind], ending: Ending, marks: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="resume-pending-") as root:
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(functools.partial(_check_queues, Path(root), kinds, ending, marks=marks), clock=clock)


# ---------------------------------------------------------------- a waking send after a cancel (trio-mapping item 18)


async def _cancel_then_send(tmp_path: Path, *, keep_inbox: bool, send: Callable[[Agent], list[str]]) -> list[str]:
    """Turn one runs; cancel it, send at once, and dispose before the cancelled turn ended: the ids sent."""
    async with open_test_harness(ScriptedModel([{"text": "slow", "delay": 100}]), store=tmp_path) as harness:
        async with harness.agents.open(session_id=SID) as agent:
            agent.followup("turn one")
            await trio.sleep(1)
            assert agent.status == "running"
            assert agent.cancel("user", keep_inbox=keep_inbox)
            sent = send(agent)
    assert turn_ends(agent) == [(1, "aborted")]
    return sent


async def test_a_steer_and_a_followup_sent_after_a_keep_inbox_cancel_run_on_resume(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The live agent latches a waking send made after the cancel and runs it once the cancelled turn ended.
    sent = await _cancel_then_send(
        tmp_path, keep_inbox=True, send=lambda agent: [agent.steer("late steer"), agent.followup("late")]
    )
    agent = await resume_and_settle(tmp_path, answers(2))
    steer, followup = sent
    got = claims(agent)
    assert got[steer] == [2] and got[followup] == [3] and len(agent.inbox) == 0  # the steer went to next-turn
    assert turn_ends(agent) == [(1, "aborted"), (2, "completed"), (3, "completed")]


async def test_a_prompt_sent_right_after_a_plain_cancel_runs_on_resume(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # ACP's session/cancel, then session/prompt at once: the new prompt runs (the live agent would).
    (new,) = await _cancel_then_send(tmp_path, keep_inbox=False, send=lambda a: [a.followup("new prompt")])
    agent = await resume_and_settle(tmp_path, answers(1))
    assert claims(agent)[new] == [2] and len(agent.inbox) == 0
    assert turn_ends(agent) == [(1, "aborted"), (2, "completed")]


async def test_a_posted_followup_not_stored_yet_does_not_wake_the_resumed_agent(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The mail loop may log a posted followup's splice before the resume's own check runs: until it is
    # stored the agent may not act on it, so what a cancel kept stays held; once stored it wakes the agent.
    await write_log(JsonlStore(tmp_path), crashed_log(["followup"], "kept"))
    async with open_test_harness(answers(2), store=tmp_path) as harness:
        async with harness.agents.open(session_id=SID, resume=True) as opened:
            assert isinstance(opened, ReactAgent)  # the driver's own methods (the mail loop calls them)
            agent = opened
            await trio.testing.wait_all_tasks_blocked()
            assert agent.status == "idle" and [m.id for m in agent.inbox.next_turn] == ["p0"]
            agent.deliver_posted(InboxMessage("posted", "a posted followup", mode="followup"))
            assert [m.id for m in agent.inbox.staged] == ["posted"]
            agent.resume_pending()  # as if the resume checked only now
            assert agent.status == "idle"
            await agent.session.flush()  # stored: it wakes the agent, which runs what was kept too
            assert str(agent.status) == "running"
            await settle(agent)
            assert claims(agent) == {"m1": [1], "m2": [2], "p0": [3], "posted": [4]}


# ---------------------------------------------------------------- a teardown requested before the turn starts


def driver_first(monkeypatch: pytest.MonkeyPatch) -> None:
    """Run the disposal's close hook one checkpoint late: the driver a wake spawned runs first, its scope closing.

    Trio runs the driver and the scope's runner in the same batch, in either order (half the time the driver
    first); this fixes the order that used to claim the queued message in an empty aborted turn.
    """
    real = ReactAgent.dispose_hook

    def deferred(self: ReactAgent) -> Awaitable[None]:
        async def later() -> None:
            await trio.lowlevel.checkpoint()
            waiting = real(self)
            if waiting is not None:
                await waiting

        return later()

    monkeypatch.setattr(ReactAgent, "dispose_hook", deferred)


def requested(agent: Agent) -> list[int]:
    return [e.turn for e in agent.session.events if isinstance(e, ev.RequestHeader)]


@pytest.mark.parametrize("kind", ["followup", "steer"])
async def test_a_resume_disposed_at_once_leaves_the_pending_message_for_the_next_resume(
    kind: Kind, tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    await write_log(JsonlStore(tmp_path), lambda session: splice(session, kind, "queued"))
    with monkeypatch.context() as patch:
        driver_first(patch)
        async with open_test_harness(answers(0), store=tmp_path) as harness:
            handle = await harness.agents.resume(SID)
            agent = handle.agent
            await handle.dispose()  # at once: the turn the resume woke has not started
    assert claims(agent) == {"m1": [1]} and turn_ends(agent) == [(1, "completed")]
    assert [m.id for m in [*agent.inbox.next_turn, *agent.inbox.next_step]] == ["queued"]
    model = answers(1)
    agent = await resume_and_settle(tmp_path, model)  # the next resume runs it, once
    assert claims(agent) == {"m1": [1], "queued": [2]}
    assert turn_ends(agent) == [(1, "completed"), (2, "completed")]
    assert len(model.requests) == 1 and len(agent.inbox) == 0


async def test_a_followup_disposed_at_once_stays_pending_as_on_resume(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The live path: a followup sent, its agent disposed before the turn it woke started.
    with monkeypatch.context() as patch:
        driver_first(patch)
        async with open_test_harness(answers(0), store=tmp_path) as harness:
            async with harness.agents.open(session_id=SID) as agent:
                sent = agent.followup("queued")
    assert turn_ends(agent) == [] and [m.id for m in agent.inbox.next_turn] == [sent]
    agent = await resume_and_settle(tmp_path, answers(1))
    assert claims(agent) == {sent: [1]} and turn_ends(agent) == [(1, "completed")]


async def test_a_resumed_turn_that_started_is_aborted_by_the_disposal(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    # The turn asked the model before the teardown: it claimed the message and ends aborted (docs/inbox.rst).
    await write_log(JsonlStore(tmp_path), lambda session: splice(session, "followup", "queued"))
    model = ScriptedModel([{"text": "slow", "delay": 100}])
    async with open_test_harness(model, store=tmp_path) as harness:
        handle = await harness.agents.resume(SID)
        agent = handle.agent
        await trio.testing.wait_all_tasks_blocked()
        assert len(model.requests) == 1
        await handle.dispose()
    assert claims(agent) == {"m1": [1], "queued": [2]} and requested(agent)[-1] == 2
    assert turn_ends(agent) == [(1, "completed"), (2, "aborted")]
    end = agent.session.events[-1]
    assert isinstance(end, ev.TurnEnd) and (end.turn, end.reason, end.cause) == (2, "aborted", "disposed")


async def _dispose_after(root: Path, checkpoints: int, hook_late: bool) -> None:
    """Resume, dispose after ``checkpoints`` checkpoints; then resume again and check the message was answered."""
    await write_log(JsonlStore(root), lambda session: splice(session, "followup", "queued"))
    with pytest.MonkeyPatch.context() as patch:
        if hook_late:
            driver_first(patch)
        async with open_test_harness(ScriptedModel([{"text": "slow", "delay": 1}]), store=root) as harness:
            handle = await harness.agents.resume(SID)
            agent = handle.agent
            for _ in range(checkpoints):
                await trio.lowlevel.checkpoint()
            await handle.dispose()
    assert_balanced(agent.session)
    first = claims(agent).get("queued")
    # A teardown requested before the driver ran beats the turn to its start: nothing is claimed.  A turn
    # that started first claimed the message as it asked the model, and the disposal aborted it.
    if checkpoints == 0:
        assert first is None, agent.session.events[-8:]
    assert first is None or (first == [2] and 2 in requested(agent)), agent.session.events[-8:]
    agent = await resume_and_settle(root, answers(1))
    got = claims(agent)
    assert got["queued"] == [2]
    if first is None:  # still pending after the disposal: the second resume answered it
        assert turn_ends(agent) == [(1, "completed"), (2, "completed")]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(checkpoints=st.integers(min_value=0, max_value=4), hook_late=st.booleans())
def test_a_queued_message_is_claimed_only_by_a_turn_that_started_whenever_the_teardown_comes(
    checkpoints: int, hook_late: bool
) -> None:
    with tempfile.TemporaryDirectory(prefix="resume-dispose-") as root:
        clock = trio.testing.MockClock(autojump_threshold=0)
        trio.run(functools.partial(_dispose_after, Path(root), checkpoints, hook_late), clock=clock)
