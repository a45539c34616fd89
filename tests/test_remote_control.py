"""Control from anywhere: ``harness.sessions.post`` carries a cancel and an approval decision (issue 28 item 4).

A decision for a call waiting for approval answers it wherever the session is
live (this process, or another worker of a PostgreSQL store), exactly once;
posted while nobody holds the session, it applies at the next resume without
asking the approver again.  A cancel acts as ``agent.cancel("user")``.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest
import trio
from _postgres import Cluster, postgres_cluster, schema
from _util import WAIT
from test_approval import Ran, call, of, refuse_to_be_asked, results
from test_paused_approval import Asking

from trio_harness import (
    AgentNotFoundError,
    ApprovalDecision,
    CallNotFoundError,
    CallNotPendingError,
    SessionNotFoundError,
    open_harness,
)
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import PostgresStore
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness

__all__ = ["postgres_cluster", "schema"]  # the fixtures, imported for pytest


def decisions(events: object) -> list[tuple[str, str, str]]:
    return [(e.call_id, e.outcome, e.source) for e in events if isinstance(e, ev.ApprovalDecided)]  # type: ignore[attr-defined]


async def test_a_posted_decision_answers_a_question_asked_in_this_process(tmp_path: Path) -> None:
    ran, asking = Ran(), Asking()
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}, {"text": "done"}])
    async with open_test_harness(model, store=tmp_path, approver=asking) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await asking.asked.wait()
            await h.sessions.post("s", call_id="c1", decision=ApprovalDecision.deny("not on a Friday"))
            await agent.when_idle()
            assert ran.calls == []
            assert decisions(agent.session.events) == [("c1", "deny", "approver")]
            assert "not on a Friday" in results(agent)[0].content
            # The call is answered: another decision for it is refused.
            with pytest.raises(CallNotPendingError, match="'c1'"):
                await h.sessions.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
            assert_balanced(agent.session)


async def test_post_refuses_unknown_sessions_calls_and_bad_arguments(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": "hi"}])
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            with pytest.raises(CallNotFoundError, match="no tool call 'c9'"):
                await h.sessions.post("s", call_id="c9", decision=ApprovalDecision.allow_once())
            with pytest.raises(TypeError, match="exactly one"):
                await h.sessions.post("s", "hi", cancel=True)
            with pytest.raises(TypeError, match="exactly one"):
                await h.sessions.post("s")
            with pytest.raises(ValueError, match="call_id"):
                await h.sessions.post("s", decision=ApprovalDecision.allow_once())
            with pytest.raises(ValueError, match="decision"):
                await h.sessions.post("s", call_id="c1", decision="yes")  # type: ignore[arg-type]
        with pytest.raises(SessionNotFoundError):
            await h.sessions.post("nobody", call_id="c1", decision=ApprovalDecision.allow_once())
        with pytest.raises(SessionNotFoundError):
            await h.sessions.post("nobody", cancel=True)
        # JSONL keeps no mail: a session nobody holds cannot take a cancel.
        with pytest.raises(AgentNotFoundError, match="not live in this process"):
            await h.sessions.post("s", cancel=True)


async def test_a_posted_cancel_stops_the_running_turn(tmp_path: Path) -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):
                while not model.requests:
                    await trio.sleep(0.01)
            await h.sessions.post("s", cancel=True)
            await agent.when_idle()
            (end,) = of(agent, ev.TurnEnd)
            assert (end.reason, end.cause) == ("aborted", "user")


# ------------------------------------------------------------------ PostgreSQL: two harnesses on one store


async def test_a_decision_posted_from_another_harness_answers_the_question_once(
    postgres_cluster: Cluster, schema: str
) -> None:
    dsn = postgres_cluster.dsn()
    ran, asking = Ran(), Asking()
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}, {"text": "done"}])
    first = PostgresStore(dsn, schema=schema)
    await first.check()
    async with open_harness(model=model, store=first, builtin_tools=False, approver=asking) as a:
        a.tools.add(ran.tool())
        async with a.agents.open(session_id="s") as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):
                await asking.asked.wait()
            async with open_harness(
                model=ScriptedModel([]), store=PostgresStore(dsn, schema=schema), builtin_tools=False
            ) as b:
                assert b.sessions.get("s") is None  # b holds nothing: a does
                await b.sessions.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
                with trio.fail_after(WAIT):
                    while len(of(agent, ev.TurnEnd)) < 1:
                        await trio.sleep(0.01)
                await agent.when_idle()
                assert ran.calls == [{"tool": "danger", "x": "1"}]
                assert decisions(agent.session.events) == [("c1", "allow_once", "approver")]
                await agent.session.flush()
                assert await first.pending_mail("s") == []  # deleted with the decision's flush
                with pytest.raises(CallNotPendingError):
                    await b.sessions.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
    stored = await _load(dsn, schema, "s")
    assert decisions(stored) == [("c1", "allow_once", "approver")]
    assert_balanced(stored)


async def test_a_decision_posted_while_nobody_holds_the_session_applies_at_resume(
    postgres_cluster: Cluster, schema: str, tmp_path: Path
) -> None:
    dsn = postgres_cluster.dsn()
    ran = Ran()
    store = PostgresStore(dsn, schema=schema)
    await store.check()
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}])
    async with store:
        events = await _pause(store, model, ran)
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["paused"]
    async with open_harness(
        model=ScriptedModel([]), store=PostgresStore(dsn, schema=schema), builtin_tools=False
    ) as other:
        await other.sessions.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
        with pytest.raises(CallNotFoundError):
            await other.sessions.post("s", call_id="nope", decision=ApprovalDecision.allow_once())
    again = ScriptedModel([{"text": "it ran"}])
    resumed = PostgresStore(dsn, schema=schema)
    async with open_harness(model=again, store=resumed, builtin_tools=False, approver=refuse_to_be_asked) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            # The approver was not asked again: the posted decision answered the paused call, once.
            assert ran.calls == [{"tool": "danger", "x": "1"}]
            assert decisions(agent.session.events) == [("c1", "allow_once", "approver")]
            assert [e.reason for e in of(agent, ev.TurnEnd)] == ["paused", "completed"]
            await agent.session.flush()
            assert await resumed.pending_mail("s") == []
    assert_balanced(await _load(dsn, schema, "s"))


async def _pause(store: PostgresStore, model: ScriptedModel, ran: Ran) -> list[ev.Event]:
    asking = Asking()
    async with open_harness(model=model, store=store, builtin_tools=False, approver=asking) as h:
        h.tools.add(ran.tool())
        handle = await h.agents.create(session_id="s")
        handle.agent.followup("go")
        with trio.fail_after(WAIT):
            await asking.asked.wait()
        await handle.dispose()
        return list(handle.agent.session.events)


async def _load(dsn: str, schema: str, session_id: str) -> tuple[ev.Event, ...]:
    async with PostgresStore(dsn, schema=schema) as store:
        return (await store.load(session_id)).events


async def test_a_cancel_posted_while_nobody_holds_the_session_drops_the_paused_question_at_resume(
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
        await other.sessions.post("s", cancel=True)
    async with open_harness(
        model=ScriptedModel([]),
        store=PostgresStore(dsn, schema=schema),
        builtin_tools=False,
        approver=refuse_to_be_asked,
    ) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            assert ran.calls == []
            assert decisions(agent.session.events) == [("c1", "cancelled", "cancelled")]
            assert [(e.reason, e.cause) for e in of(agent, ev.TurnEnd)] == [("paused", "disposed"), ("aborted", "user")]
    assert_balanced(await _load(dsn, schema, "s"))


async def test_an_idle_agent_pays_no_memory_for_remote_control() -> None:
    # The memory per idle agent (bench/bench_agents.py): the routes for posted messages and
    # controls are bound methods of the registry's entry (64 B each, where a functools.partial
    # costs ~190 B), and the gate's store of posted decisions is made only when one arrives.
    asking = Asking()
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}, {"text": "done"}])
    async with open_test_harness(model, approver=asking) as h:
        h.tools.add(Ran().tool())
        async with h.agents.open(session_id="s") as agent:
            entry = h.sessions._live["s"]
            assert type(entry.receiver) is types.MethodType and type(entry.control) is types.MethodType
            assert agent._approvals._remote is None  # type: ignore[attr-defined]
            agent.followup("go")
            await asking.asked.wait()
            await h.sessions.post("s", call_id="c1", decision=ApprovalDecision.deny("no"))
            await agent.when_idle()
            assert decisions(agent.session.events) == [("c1", "deny", "approver")]


async def test_a_decision_posted_while_the_question_is_being_stored_answers_it_without_the_approver() -> None:
    # The gate logs the question and flushes it before it waits; a dashboard that answers as soon
    # as it sees the question in the store posts in that window, before anyone waits.  The
    # decision kept for the call must answer it, not be left unused while the approver is asked.
    from trio_harness.agents._approval import ApprovalDecision, ApprovalRequest, RemoteDecisions

    remote = RemoteDecisions()
    acknowledged: list[str] = []
    remote.post("c1", ApprovalDecision.allow_once(), lambda: acknowledged.append("c1"))

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        raise AssertionError("the approver was asked although a decision was posted")

    request = ApprovalRequest(
        tool="bash",
        arguments={},
        raw_arguments="{}",
        call_id="c1",
        agent_id="s",
        turn=1,
        step=1,
        agent=None,  # type: ignore[arg-type]
    )
    decision, applied = await remote.ask(approver, request)
    assert decision == ApprovalDecision.allow_once() and applied is not None
    applied()
    assert acknowledged == ["c1"] and remote.take("c1") is None  # used once
