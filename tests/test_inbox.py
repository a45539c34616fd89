"""The durable inbox (docs/guarantees.rst, "The inbox")."""

from __future__ import annotations

from collections.abc import Callable

import attrs
import pytest
import trio
import trio.testing
from hypothesis import given
from hypothesis import strategies as st

from trio_harness._errors import AgentDisposedError, InboxError, SessionStoreError
from trio_harness.agents import Inbox
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import Session, SessionHeader
from trio_harness.session import _events as ev
from trio_harness.session._events import InboxMessage
from trio_harness.testing import open_test_harness


def new_session() -> Session:
    return Session(header=SessionHeader(id="s", created_at=0.0), events=[])


def msg(i: str, mode: ev.SendMode = "followup") -> InboxMessage:
    return InboxMessage(id=i, text=f"text {i}", mode=mode)


def test_splice_event_is_appended_before_the_lists_change() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    views: list[tuple[tuple[str, ...], int]] = []
    session.observe(lambda e: views.append((tuple(m.id for m in inbox.next_turn), e.seq)))
    inbox.append("next-turn", msg("a"))
    inbox.append("next-turn", msg("b"))
    inbox.remove("a")
    # the observer saw the pre-splice projection each time
    assert views == [((), 0), (("a",), 1), (("a", "b"), 2)]


def test_operations_and_replay_rebuild_the_same_inbox() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    inbox.append("next-turn", msg("a"))
    inbox.append("next-turn", msg("b"))
    inbox.prepend("next-turn", msg("c"))
    inbox.append("next-step", msg("s", "steer"))
    inbox.replace("b", msg("b2"))
    inbox.replace("s", msg("s2", "inject"))
    inbox.remove("c")
    claimed = inbox.claim(1, turn_boundary=True)
    assert [m.id for m in claimed] == ["s2", "a"]
    inbox.append("next-step", msg("late", "inject"))
    rebuilt = Inbox.replay(session)
    assert rebuilt.next_turn == inbox.next_turn and rebuilt.next_step == inbox.next_step
    assert [m.id for m in rebuilt.next_turn] == ["b2"] and [m.id for m in rebuilt.next_step] == ["late"]


def test_message_id_is_pending_at_most_once_across_both_lists() -> None:
    inbox = Inbox(session=new_session())
    inbox.append("next-turn", msg("dup"))
    with pytest.raises(InboxError, match="already pending"):
        inbox.append("next-step", msg("dup"))
    with pytest.raises(InboxError, match="already pending"):
        inbox.append("next-turn", msg("dup"))
    inbox.remove("dup")
    inbox.append("next-step", msg("dup"))  # free again once removed


def test_replace_across_lists_and_unknown_ids() -> None:
    inbox = Inbox(session=new_session())
    inbox.append("next-turn", msg("t"))
    inbox.append("next-step", msg("s"))
    with pytest.raises(InboxError, match="already pending"):
        inbox.replace("t", msg("s"))
    inbox.replace("t", msg("t2"))
    with pytest.raises(InboxError, match="not pending"):
        inbox.replace("t", msg("x"))
    with pytest.raises(InboxError, match="not pending"):
        inbox.remove("zzz")


def test_clear_writes_next_step_then_next_turn_canceled() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    assert inbox.clear() == [] and len(session) == 0  # empty clear writes nothing
    inbox.append("next-turn", msg("a"))
    inbox.append("next-step", msg("b"))
    inbox.append("next-step", msg("c"))
    before = len(session)
    gone = inbox.clear()
    splices = [e for e in session.events[before:] if isinstance(e, ev.InboxSpliced)]
    assert [(s.queue, s.removed, s.outcome) for s in splices] == [
        ("next-step", ("b", "c"), "canceled"),
        ("next-turn", ("a",), "canceled"),
    ]
    assert [m.id for m in gone] == ["b", "c", "a"] and len(inbox) == 0


def test_claim_is_a_deletion_not_marked_canceled() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    inbox.append("next-turn", msg("a"))
    inbox.append("next-turn", msg("b"))
    inbox.claim(7, turn_boundary=True)
    last = session.events[-1]
    assert isinstance(last, ev.InboxSpliced)
    assert (last.removed, last.outcome, last.turn) == (("a",), "claimed", 7)
    assert inbox.claim(8, turn_boundary=False) == []  # next-turn items wait for a boundary


def test_notifications_inserted_claimed_discarded() -> None:
    seen: list[tuple[str, str, int | None]] = []
    inbox = Inbox(session=new_session(), notify=lambda kind, m, turn: seen.append((kind, m.id, turn)))
    inbox.append("next-turn", msg("a"))
    inbox.append("next-turn", msg("b"))
    inbox.replace("b", msg("b2"))
    inbox.claim(1, turn_boundary=True)
    inbox.clear()
    assert seen == [
        ("inserted", "a", None),
        ("inserted", "b", None),
        ("discarded", "b", None),
        ("inserted", "b2", None),
        ("claimed", "a", 1),
        ("discarded", "b2", None),
    ]


@pytest.mark.parametrize(
    ("splice", "problem"),
    [
        ({"queue": "next-turn", "start": 5}, "outside"),
        ({"queue": "next-turn", "start": 0, "removed": ("zz",)}, "expected to remove"),
        ({"queue": "next-turn", "start": 0, "inserted": (InboxMessage("a", "again"),)}, "already pending"),
    ],
)
def test_invalid_persisted_splices_fail_replay(splice: dict[str, object], problem: str) -> None:
    session = new_session()
    Inbox(session=session).append("next-turn", msg("a"))
    session.append(ev.InboxSpliced, **splice)
    with pytest.raises(InboxError, match=problem):
        Inbox.replay(session)


def test_replay_starts_after_the_seed() -> None:
    session = new_session()
    Inbox(session=session).append("next-turn", msg("from-parent"))
    forked = Session(header=SessionHeader(id="f", created_at=0.0, seed_length=1), events=list(session.events))
    assert len(Inbox.replay(forked)) == 0


# ---------------------------------------------------------------- bad input, sealed inbox

NOT_TEXT = st.one_of(
    st.none(), st.integers(), st.floats(), st.binary(), st.booleans(), st.lists(st.text(max_size=2), max_size=2)
)


@given(text=NOT_TEXT)
def test_a_message_whose_text_is_not_text_is_refused_by_name(text: object) -> None:
    with pytest.raises(TypeError, match=f"InboxMessage.text must be a str, got {type(text).__name__}"):
        InboxMessage(id="m", text=text)  # type: ignore[arg-type]


@given(message_id=NOT_TEXT)
def test_a_message_whose_id_is_not_text_is_refused_by_name(message_id: object) -> None:
    with pytest.raises(TypeError, match=f"InboxMessage.id must be a str, got {type(message_id).__name__}"):
        InboxMessage(id=message_id, text="t")  # type: ignore[arg-type]


@given(mode=st.one_of(NOT_TEXT, st.text().filter(lambda m: m not in ("followup", "steer", "inject"))))
def test_a_message_with_an_unknown_mode_is_refused(mode: object) -> None:
    with pytest.raises(ValueError, match=r"InboxMessage\.mode must be one of followup, steer, inject"):
        InboxMessage(id="m", text="t", mode=mode)  # type: ignore[arg-type]


@given(text=st.text(), message_id=st.text(min_size=1))
def test_any_text_message_survives_the_log_and_replay(text: str, message_id: str) -> None:
    from trio_harness.session._codec import decode_event, encode_event

    session = new_session()
    Inbox(session=session).append("next-turn", InboxMessage(id=message_id, text=text))
    stored = Session(header=session.header, events=[decode_event(encode_event(e)) for e in session.events])
    (replayed,) = Inbox.replay(stored).next_turn
    # A lone surrogate pair written as two escapes reads back as the one character.
    assert replayed.text.encode("utf-16", "surrogatepass") == text.encode("utf-16", "surrogatepass")
    assert replayed.id.encode("utf-16", "surrogatepass") == message_id.encode("utf-16", "surrogatepass")


def test_a_sealed_inbox_refuses_every_change_and_writes_nothing() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    inbox.append("next-turn", msg("a"))
    inbox.append("next-step", msg("s", "steer"))
    inbox.seal("agent 's' is disposed")
    assert inbox.sealed
    length = len(session)
    changes: list[Callable[[], object]] = [
        lambda: inbox.append("next-turn", msg("b")),
        lambda: inbox.prepend("next-step", msg("b")),
        lambda: inbox.replace("a", msg("b")),
        lambda: inbox.remove("a"),
        inbox.clear,
        lambda: inbox.claim(1, turn_boundary=True),
    ]
    for change in changes:
        with pytest.raises(AgentDisposedError, match="'s' is disposed"):
            change()
    assert len(session) == length
    assert [m.id for m in inbox.next_turn] == ["a"] and [m.id for m in inbox.next_step] == ["s"]


def test_a_sealed_empty_inbox_clears_and_claims_nothing_without_error() -> None:
    session = new_session()
    inbox = Inbox(session=session)
    inbox.seal("sealed")
    assert inbox.clear() == [] and inbox.claim(1, turn_boundary=True) == []
    assert len(session) == 0


# ---------------------------------------------------------------- an observer sending while a splice is logged


async def test_session_observer_steer_during_claim_keeps_log_replayable() -> None:
    """A session observer that steers while the inbox appends its own splice."""
    model = ScriptedModel([{"text": "a"}, {"text": "b"}, {"text": "c"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if isinstance(event, ev.InboxSpliced) and event.outcome == "claimed" and not sent:
                sent.append(agent.steer("from observer"))

        agent.session.observe(observer)
        agent.followup("first")
        await agent.when_idle()
        # the durable projection equals the live one
        replayed = Inbox.replay(agent.session)
        assert [m.id for m in replayed.next_turn] == [m.id for m in agent.inbox.next_turn]
        assert [m.id for m in replayed.next_step] == [m.id for m in agent.inbox.next_step]
        texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
        assert "from observer" in texts


async def test_session_observer_steer_during_step_claim_keeps_log_replayable(
    autojump_clock: trio.testing.MockClock,
) -> None:
    """Steering from an observer of a next-step claim must not corrupt the durable inbox."""
    model = ScriptedModel([{"hang": True}, {"text": "b"}, {"text": "c"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if (
                isinstance(event, ev.InboxSpliced)
                and event.queue == "next-step"
                and event.outcome == "claimed"
                and not sent
            ):
                sent.append(agent.steer("from observer"))

        agent.session.observe(observer)
        agent.inject("parked")
        agent.followup("first")  # step 1 claims the parked inject: the observer steers
        await trio.testing.wait_all_tasks_blocked()
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        replayed = Inbox.replay(agent.session)  # raised InboxError: splice outside next-step
        assert [m.id for m in replayed.next_step] == [m.id for m in agent.inbox.next_step] == sent


async def test_session_observer_followup_on_insert_keeps_order() -> None:
    model = ScriptedModel([])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        sent: list[str] = []

        def observer(event: ev.Event) -> None:
            if isinstance(event, ev.InboxSpliced) and event.inserted and not sent:
                sent.append("x")
                agent.inject("second")

        agent.session.observe(observer)
        agent.inject("first")
        replayed = Inbox.replay(agent.session)
        assert [m.text for m in replayed.next_step] == [m.text for m in agent.inbox.next_step]


# ------------------------------------------------------------------ staged (posted) messages


@attrs.define
class FlakyWriter:
    """A session writer whose next flush succeeds or fails as the test says."""

    fail_next: bool = False
    stored: int = 0
    pending: list[ev.Event] = attrs.field(factory=list)

    def write(self, event: ev.Event) -> None:
        self.pending.append(event)

    async def flush(self, *, sync: bool = True) -> None:
        await trio.lowlevel.checkpoint()
        if self.fail_next:
            raise SessionStoreError("the store is away", session_id="s")
        self.stored += len(self.pending)
        self.pending.clear()

    async def aclose(self) -> None:
        return None


def test_a_staged_message_is_logged_at_once_and_taken_only_once_stored() -> None:
    async def main() -> None:
        writer = FlakyWriter()
        session = Session(header=SessionHeader(id="s", created_at=0.0), events=[], writer=writer)
        inbox = Inbox(session=session)
        applied: list[str] = []
        inbox.append("next-turn", msg("a"))
        inbox.stage("next-turn", msg("p"), lambda m: applied.append(m.id))
        assert [m.id for m in inbox.next_turn] == ["a"] and [m.id for m in inbox.staged] == ["p"]
        assert [m.id for m in Inbox.replay(session).next_turn] == ["a", "p"]  # the log has it already
        with pytest.raises(InboxError, match="already pending"):
            inbox.append("next-turn", msg("p"))
        writer.fail_next = True
        with pytest.raises(SessionStoreError):
            await session.flush()
        assert applied == [] and [m.id for m in inbox.next_turn] == ["a"]  # not stored: not taken
        writer.fail_next = False
        await session.flush()
        assert applied == ["p"] and [m.id for m in inbox.next_turn] == ["a", "p"] and inbox.staged == ()

    trio.run(main)


OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["append", "prepend", "stage"]), st.sampled_from(["next-turn", "next-step"])),
        st.tuples(st.sampled_from(["remove", "replace"]), st.integers(0, 5)),
        st.tuples(st.sampled_from(["clear", "claim", "claim-step", "flush", "fail"]), st.none()),
    ),
    max_size=30,
)


@given(ops=OPS)
def test_staged_messages_and_every_other_mutation_keep_the_log_and_the_lists_in_step(
    ops: list[tuple[str, object]],
) -> None:
    # While staged, a message is the tail of its queue in the log's projection
    # and absent from the lists; once stored, the lists equal the projection.
    async def main() -> None:
        writer = FlakyWriter()
        session = Session(header=SessionHeader(id="s", created_at=0.0), events=[], writer=writer)
        inbox = Inbox(session=session)
        applied: list[str] = []
        for number, (op, arg) in enumerate(ops):
            live = [*inbox.next_turn, *inbox.next_step]
            if op in ("append", "prepend", "stage"):
                assert arg in ("next-turn", "next-step")
                message = msg(f"m{number}", "followup" if arg == "next-turn" else "steer")
                if op == "stage":
                    inbox.stage(arg, message, lambda m: applied.append(m.id))
                else:
                    getattr(inbox, op)(arg, message)
            elif op in ("remove", "replace"):
                assert isinstance(arg, int)
                if live:
                    target = live[arg % len(live)]
                    if op == "remove":
                        inbox.remove(target.id)
                    else:
                        inbox.replace(target.id, msg(f"m{number}", target.mode))
            elif op == "clear":
                inbox.clear()
            elif op in ("claim", "claim-step"):
                inbox.claim(number, turn_boundary=op == "claim")
            else:
                writer.fail_next = op == "fail"
                staged = [m.id for m in inbox.staged]
                try:
                    await session.flush()
                except SessionStoreError:
                    assert [m.id for m in inbox.staged] == staged
                else:
                    assert inbox.staged == () and applied[len(applied) - len(staged) :] == staged
            rebuilt = Inbox.replay(session)
            for queue, items in (("next-turn", inbox.next_turn), ("next-step", inbox.next_step)):
                tail = [m for m in inbox.staged if ("next-turn" if m.mode == "followup" else "next-step") == queue]
                assert list(getattr(rebuilt, queue.replace("-", "_"))) == [*items, *tail]
        writer.fail_next = False
        await session.flush()
        rebuilt = Inbox.replay(session)
        assert rebuilt.next_turn == inbox.next_turn and rebuilt.next_step == inbox.next_step

    trio.run(main)
