"""A posted approval decision is bound to the call it was posted for, and one that cannot apply is never silent.

Models reuse call ids (``call_0`` in every step): a decision posted for an
earlier call must not decide a later call with the same id.  A decision that
cannot be applied (answered meanwhile, stale, an agent that takes none)
reaches the poster as an error, or the session as ``control/refused``.
"""

from __future__ import annotations

from typing import Any

import pytest
import trio
from _postgres import Cluster, postgres_cluster, schema
from _util import WAIT
from test_approval import Ran, call, of, refuse_to_be_asked
from test_factory import echo_harness
from test_remote_control import _load, _pause, decisions

from trio_harness import AgentError, ApprovalDecision, ApprovalRequest, CallNotPendingError, open_harness
from trio_harness._records import ToolCall
from trio_harness.agents._remote_control import apply_control
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import PostgresStore
from trio_harness.session import _events as ev
from trio_harness.session._control import Control
from trio_harness.testing import assert_balanced, open_test_harness

__all__ = ["postgres_cluster", "schema"]  # the fixtures, imported for pytest


class Answering:
    """An approver that waits until told what to answer; ``asked`` holds each request."""

    def __init__(self) -> None:
        self.asked: list[ApprovalRequest] = []
        self.waiting = trio.Event()
        self._answers: trio.MemorySendChannel[ApprovalDecision]
        self._answers, self._next = trio.open_memory_channel[ApprovalDecision](10)

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.append(request)
        self.waiting.set()
        return await self._next.receive()

    async def answer(self, decision: ApprovalDecision) -> None:
        self.waiting = trio.Event()
        await self._answers.send(decision)

    async def wait_asked(self, count: int) -> None:
        with trio.fail_after(WAIT):
            while len(self.asked) < count:
                await self.waiting.wait()


# Two steps whose calls have one id, as models write them.
REUSED_ID = [
    {"tool_calls": [call("danger", "1", "call_0")]},
    {"tool_calls": [call("danger", "2", "call_0")]},
    {"text": "ok"},
]


def questions(events: Any) -> list[int]:
    return [e.seq for e in events if isinstance(e, ev.ApprovalRequested)]


async def test_a_decision_for_an_answered_question_is_refused_when_a_later_call_reuses_the_id() -> None:
    ran, answering = Ran(), Answering()
    model = ScriptedModel(
        [
            {"tool_calls": [call("danger", "1", "call_0")]},
            {"tool_calls": [call("danger", "2", "call_0")]},
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, approver=answering) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await answering.wait_asked(1)
            first = questions(agent.session.events)[0]
            await answering.answer(ApprovalDecision.allow_once())  # the first call_0, answered here
            await answering.wait_asked(2)
            second = questions(agent.session.events)[1]
            # A poster that saw the first question (a stale UI) answers it now: not the second call_0's answer.
            with pytest.raises(CallNotPendingError, match=r"at event \d+ is no longer waiting .*reuses the id"):
                await h.sessions.post("s", call_id="call_0", decision=ApprovalDecision.allow_once(), question_seq=first)
            with pytest.raises(Exception, match="not an approval question"):
                await h.sessions.post("s", call_id="call_0", decision=ApprovalDecision.deny(), question_seq=0)
            # Naming the question waiting now answers it.
            await h.sessions.post("s", call_id="call_0", decision=ApprovalDecision.deny("no"), question_seq=second)
            await agent.when_idle()
            assert ran.calls == [{"tool": "danger", "x": "1"}]
            assert decisions(agent.session.events) == [
                ("call_0", "allow_once", "approver"),
                ("call_0", "deny", "approver"),
            ]
            assert_balanced(agent.session)


async def test_a_decision_bound_to_an_earlier_call_is_not_applied_to_the_call_waiting_now() -> None:
    """At delivery (the mailbox's way): the call waiting has the id, but was made by a later message."""
    ran, answering = Ran(), Answering()
    model = ScriptedModel(
        [
            {"tool_calls": [call("danger", "1", "call_0")]},
            {"tool_calls": [call("danger", "2", "call_0")]},
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, approver=answering) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await answering.wait_asked(1)
            made = [e.seq for e in of(agent, ev.AssistantMessage)]
            await answering.answer(ApprovalDecision.allow_once())
            await answering.wait_asked(2)
            stale = Control("decision", "call_0", "allow_always", None, call_seq=made[0], message_id="ctl-old")
            applied: list[str] = []
            with pytest.raises(CallNotPendingError, match=r"reuses the id.*not applied"):
                apply_control(agent, stale, lambda: applied.append("applied"))
            assert applied == [] and len(decisions(agent.session.events)) == 1  # nothing decided the second call
            await answering.answer(ApprovalDecision.deny())
            await agent.when_idle()
            assert ran.calls == [{"tool": "danger", "x": "1"}]


async def test_a_decision_for_an_agent_that_takes_none_is_an_error_for_the_poster() -> None:
    async with echo_harness() as (harness, _, _):
        handle = await harness.agents.create(session_id="echo")
        session = handle.agent.session
        # The custom loop logged a question it asks its own way.
        session.append(ev.TurnStart, turn=1)
        session.append(ev.StepStart, turn=1, step=1)
        session.append(ev.AssistantMessage, turn=1, step=1, text="", tool_calls=(ToolCall("c1", "danger", "{}"),))
        session.append(ev.ApprovalRequested, turn=1, step=1, call_id="c1", name="danger", arguments="{}")
        with pytest.raises(
            AgentError, match=r"EchoAgent\) cannot take posted approval decisions.*'c1' was not applied"
        ):
            await harness.sessions.post("echo", call_id="c1", decision=ApprovalDecision.allow_once())
        await handle.dispose()


# ------------------------------------------------------------------ PostgreSQL: the mailbox


async def test_a_decision_kept_for_a_paused_call_that_was_cancelled_decides_no_later_call(
    postgres_cluster: Cluster, schema: str
) -> None:
    """Decision then cancel wait in the mailbox; at resume the cancel drops the paused call_0; a new call_0 is asked."""
    dsn = postgres_cluster.dsn()
    ran = Ran()
    store = PostgresStore(dsn, schema=schema)
    await store.check()
    async with store:
        await _pause(store, ScriptedModel([{"tool_calls": [call("danger", "1", "call_0")]}]), ran)
    async with open_harness(
        model=ScriptedModel([]), store=PostgresStore(dsn, schema=schema), builtin_tools=False
    ) as other:
        posted = await other.sessions.post("s", call_id="call_0", decision=ApprovalDecision.allow_always())
        await other.sessions.post("s", cancel=True)
    answering = Answering()
    again = ScriptedModel([{"tool_calls": [call("danger", "2", "call_0")]}, {"text": "ok"}])
    resumed = PostgresStore(dsn, schema=schema)
    async with open_harness(model=again, store=resumed, builtin_tools=False, approver=answering) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            agent.followup("again")
            await answering.wait_asked(1)  # the new call_0 is asked: the old decision does not decide it
            await answering.answer(ApprovalDecision.deny())
            await agent.when_idle()
            (refused,) = of(agent, ev.ControlRefused)
            assert (refused.message_id, refused.kind, refused.call_id) == (posted, "decision", "call_0")
            assert "cancelled before the posted decision applied" in refused.reason
            assert ran.calls == []
            assert decisions(agent.session.events) == [
                ("call_0", "cancelled", "cancelled"),
                ("call_0", "deny", "approver"),
            ]
            await agent.session.flush()
            assert await resumed.pending_mail("s") == []  # the refused decision's row is gone with its event
    assert_balanced(await _load(dsn, schema, "s"))


async def test_a_decision_that_arrives_after_its_call_was_answered_is_logged_as_refused(
    postgres_cluster: Cluster, schema: str
) -> None:
    dsn = postgres_cluster.dsn()
    ran = Ran()
    store = PostgresStore(dsn, schema=schema)
    await store.check()
    async with store:
        await _pause(store, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    async with open_harness(
        model=ScriptedModel([]), store=PostgresStore(dsn, schema=schema), builtin_tools=False
    ) as other:
        await other.sessions.post("s", cancel=True)  # applied first at the resume: the question is dropped
        posted = await other.sessions.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
    resumed = PostgresStore(dsn, schema=schema)
    async with open_harness(
        model=ScriptedModel([]), store=resumed, builtin_tools=False, approver=refuse_to_be_asked
    ) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            (refused,) = of(agent, ev.ControlRefused)
            assert (refused.message_id, refused.call_id) == (posted, "c1")
            assert "not waiting for approval any more" in refused.reason
            assert ran.calls == [] and decisions(agent.session.events) == [("c1", "cancelled", "cancelled")]
            await agent.session.flush()
            assert await resumed.pending_mail("s") == []
    assert_balanced(await _load(dsn, schema, "s"))


def test_a_kept_decision_is_taken_only_by_the_call_it_was_posted_for() -> None:
    from trio_harness.agents._approval import RemoteDecisions

    def made(seq: int) -> ev.AssistantMessage:
        return ev.AssistantMessage(seq=seq, ts=0.0, turn=1, step=seq, text="", tool_calls=(ToolCall("c1", "x", "{}"),))

    remote = RemoteDecisions()
    refused: list[str] = []
    remote.post("c1", ApprovalDecision.allow_always(), lambda: None, call_seq=3, refused=refused.append)
    with pytest.raises(CallNotPendingError, match="waiting to apply already"):
        remote.post("c1", ApprovalDecision.deny(), lambda: None, call_seq=3)
    assert remote.take("c1", [made(3), made(7)]) is None  # call_0 of event 7 reuses the id of event 3's
    assert len(refused) == 1 and "reuses the id" in refused[0]
    remote.post("c1", ApprovalDecision.allow_once(), lambda: None, call_seq=7, refused=refused.append)
    taken = remote.take("c1", [made(3), made(7)])
    assert taken is not None and taken[0] == ApprovalDecision.allow_once() and len(refused) == 1


def test_sessions_show_prints_a_refused_control() -> None:
    from trio_harness import _cli_sessions
    from trio_harness.session import SessionHeader

    refused = ev.ControlRefused(
        seq=0, ts=0.0, message_id="ctl-1", kind="decision", reason="it was answered", call_id="c1"
    )
    lines = _cli_sessions.transcript(SessionHeader(id="s", created_at=0.0), [refused])
    assert "  [posted decision for c1 not applied] it was answered" in lines


def test_the_mailbox_form_binds_the_call_and_stays_readable_by_older_versions() -> None:
    import json

    from trio_harness.session._control import control_message, read_control

    message = control_message(Control("decision", "call_0", "deny", "no", call_seq=12))
    assert set(json.loads(message.text)) == {"kind", "call_id", "verdict", "message"}  # what older versions read
    assert message.id.endswith(".12")
    read = read_control(message)
    assert read is not None and (read.call_id, read.verdict, read.call_seq, read.message_id) == (
        "call_0",
        "deny",
        12,
        message.id,
    )
    newer = ev.InboxMessage(id="ctl-ab", text=json.dumps({"kind": "cancel", "added_later": 1}), mode="inject")
    assert read_control(newer) == Control("cancel")  # keys of a newer version are ignored
    for bad in (
        ev.InboxMessage(id="ctl-ab", text="not json", mode="inject"),
        ev.InboxMessage(id="ctl-ab.x", text=json.dumps({"kind": "cancel"}), mode="inject"),
        ev.InboxMessage(id="ctl-ab", text=json.dumps({"kind": "pause"}), mode="inject"),
        ev.InboxMessage(id="ctl-ab", text=json.dumps({"kind": "decision", "call_id": "c1"}), mode="inject"),
    ):
        with pytest.raises(ValueError, match="ctl-ab"):
            read_control(bad)
    assert read_control(ev.InboxMessage(id="msg-1", text="hi", mode="inject")) is None


async def test_an_unreadable_control_in_the_mailbox_is_refused_not_taken_for_a_message(
    postgres_cluster: Cluster, schema: str
) -> None:
    dsn = postgres_cluster.dsn()
    store = PostgresStore(dsn, schema=schema)
    await store.check()
    async with open_harness(model=ScriptedModel([{"text": "hi"}]), store=store, builtin_tools=False) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            await store.post("s", ev.InboxMessage(id="ctl-garbled", text="{not json", mode="inject"))
            with trio.fail_after(WAIT):
                while not of(agent, ev.ControlRefused):
                    await trio.sleep(0.01)
            (refused,) = of(agent, ev.ControlRefused)
            assert (refused.message_id, refused.kind) == ("ctl-garbled", "unknown")
            assert "cannot be read" in refused.reason
            assert [e.text for e in of(agent, ev.UserMessage)] == ["go"]  # never spliced as a message
            await agent.session.flush()
            assert await store.pending_mail("s") == []
