"""Paused approvals: a turn cut off while a call waits for approval ends paused and asks again on resume."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from test_approval import Answers, Ran, call, of, refuse_to_be_asked, results

from trio_harness import ApprovalDecision, ApprovalRequest, open_harness
from trio_harness.agents import ReactAgent
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import JsonlStore
from trio_harness.session import _events as ev
from trio_harness.session._paused import paused_calls
from trio_harness.testing import EventLogMismatch, assert_balanced, open_test_harness


async def never_answers(request: ApprovalRequest) -> ApprovalDecision:
    await trio.sleep_forever()


class Asking:
    """An approver that never answers; ``asked`` is set once it was asked (after the checkpoints before it)."""

    def __init__(self) -> None:
        self.asked = trio.Event()

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        self.asked.set()
        await trio.sleep_forever()


def turn_ends(agent: object) -> list[tuple[int, str, str | None]]:
    return [(e.turn, e.reason, e.cause) for e in of(agent, ev.TurnEnd)]


async def pause_by_disposal(store: Path, model: ScriptedModel, ran: Ran, *, session_id: str = "s") -> list[ev.Event]:
    """Run a prompt whose first call waits for approval, dispose the agent meanwhile; return its log."""
    asked = trio.Event()

    async def asks_forever(request: ApprovalRequest) -> ApprovalDecision:
        asked.set()
        await trio.sleep_forever()

    async with open_test_harness(model, store=store, approver=asks_forever) as h:
        h.tools.add(ran.tool())
        h.tools.add(ran.tool("safe", requires_approval=False))
        handle = await h.agents.create(session_id=session_id)
        agent = handle.agent
        agent.followup("go")
        await asked.wait()  # the checkpoints before it reach the store on a worker thread
        assert of(agent, ev.ApprovalRequested) and not of(agent, ev.ApprovalDecided)
        await handle.dispose()
        return list(agent.session.events)


def check_paused_end(events: list[ev.Event], call_id: str, *, cause: str | None) -> None:
    """The shape of a paused turn: the call asked, undecided, unanswered; the step and turn closed."""
    assert [e.type for e in events[-2:]] == ["step/end", "turn/end"]
    asked = [e.call_id for e in events if isinstance(e, ev.ApprovalRequested)]
    assert asked == [call_id]
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("paused", cause)
    assert not [e for e in events if isinstance(e, ev.ApprovalDecided)]
    assert call_id not in {e.call_id for e in events if isinstance(e, ev.ToolResult)}
    assert [c.id for c in paused_calls(events)] == [call_id]
    assert_balanced(events)


async def test_a_disposal_while_the_approver_waits_ends_the_turn_paused(tmp_path: Path) -> None:
    ran = Ran()
    model = ScriptedModel([{"tool_calls": [call("safe", "0", "c0"), call("danger", "1", "c1")]}])
    events = await pause_by_disposal(tmp_path, model, ran)
    check_paused_end(events, "c1", cause="disposed")
    assert ran.calls == [{"tool": "safe", "x": "0"}]
    # What was stored is the same paused end.
    loaded = await JsonlStore(tmp_path).load("s")
    check_paused_end(list(loaded.events), "c1", cause="disposed")


async def test_resume_asks_again_and_an_allowed_call_runs_then_the_turn_goes_on(tmp_path: Path) -> None:
    ran = Ran()
    events = await pause_by_disposal(tmp_path, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    check_paused_end(events, "c1", cause="disposed")

    approver = Answers([ApprovalDecision.allow_once()])
    again = ScriptedModel([{"text": "it ran"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            # The same request went to the approver again, in a continuation turn (turn 2).
            assert [(r.call_id, r.tool, r.raw_arguments, r.turn, r.step) for r in approver.requests] == [
                ("c1", "danger", '{"x": "1"}', 2, 1)
            ]
            assert ran.calls == [{"tool": "danger", "x": "1"}]
            # Then the next model request went out with the result; the turn completed.
            (request,) = again.requests
            assert request.messages[-1].content == "danger ran 1"  # type: ignore[union-attr]
            assert turn_ends(agent) == [(1, "paused", "disposed"), (2, "completed", None)]
            turn2 = [e for e in agent.session.events if getattr(e, "turn", None) == 2]
            assert not [e for e in turn2 if isinstance(e, ev.UserMessage)]  # it claimed no prompt
            assert_balanced(agent.session)
            assert isinstance(agent, ReactAgent) and agent.session.events[-1].type == "turn/end"


async def test_resume_with_a_denial_continues_with_the_denial(tmp_path: Path) -> None:
    ran = Ran()
    await pause_by_disposal(tmp_path, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    approver = Answers([ApprovalDecision.deny("not on a Friday")])
    again = ScriptedModel([{"text": "understood"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            assert ran.calls == []
            (result,) = results(agent)
            assert result.call_id == "c1" and result.is_error and "not on a Friday" in result.content
            assert len(again.requests) == 1  # the model read the denial and answered
            assert turn_ends(agent) == [(1, "paused", "disposed"), (2, "completed", None)]
            assert_balanced(agent.session)


async def test_a_followup_sent_while_paused_runs_after_the_continuation(tmp_path: Path) -> None:
    ran = Ran()
    await pause_by_disposal(tmp_path, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    approver = Answers([ApprovalDecision.allow_once()])
    again = ScriptedModel([{"text": "continued"}, {"text": "and the followup"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            agent.followup("next")
            await agent.when_idle()
            claims = [(e.turn, e.text) for e in of(agent, ev.UserMessage)]
            assert claims == [(1, "go"), (3, "next")]
            assert turn_ends(agent) == [(1, "paused", "disposed"), (2, "completed", None), (3, "completed", None)]
            assert_balanced(agent.session)


async def test_cancel_of_a_paused_session_drops_the_question(tmp_path: Path) -> None:
    ran = Ran()
    await pause_by_disposal(tmp_path, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    again = ScriptedModel([{"text": "fresh start"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=refuse_to_be_asked) as h:
        h.tools.add(ran.tool())
        # Resumed, the continuation starts at once; cancelled before it ran, nothing is asked.
        handle = await h.agents.resume("s")
        agent = handle.agent
        assert agent.cancel() is True
        await agent.when_idle()
        decided = of(agent, ev.ApprovalDecided)
        assert [(d.call_id, d.outcome, d.source, d.cause) for d in decided] == [
            ("c1", "cancelled", "cancelled", "user")
        ]
        (result,) = results(agent)
        assert result.call_id == "c1" and result.is_error and "not run" in result.content
        assert turn_ends(agent)[-1][1:] == ("aborted", "user")
        assert paused_calls(agent.session.events) == ()
        assert again.requests == []
        agent.followup("other")
        await agent.when_idle()
        assert len(again.requests) == 1
        assert_balanced(agent.session)
        await handle.dispose()
    assert ran.calls == []


async def test_recovery_of_a_log_cut_during_the_wait_writes_the_same_paused_end(tmp_path: Path) -> None:
    ran = Ran()
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}])
    asking = Asking()
    async with open_test_harness(model, store=live, approver=asking) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await asking.asked.wait()  # the question is on disk before the approver is asked (a checkpoint)
            # What a process killed at this moment leaves on disk.
            shutil.copytree(live, crashed)

    approver = Answers([ApprovalDecision.allow_once()])
    again = ScriptedModel([{"text": "after the restart"}])
    async with open_harness(model=again, store=crashed, builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        handle = await h.agents.resume("s")
        agent = handle.agent
        # Recovery closed the log as a disposal would have (cause: none, nobody disposed it).
        events = list(agent.session.events)
        paused_at = max(i for i, e in enumerate(events) if isinstance(e, ev.TurnEnd))
        check_paused_end(events[: paused_at + 1], "c1", cause=None)
        await agent.when_idle()
        assert [r.call_id for r in approver.requests] == ["c1"]
        assert turn_ends(agent) == [(1, "paused", None), (2, "completed", None)]
        assert_balanced(agent.session)
        await handle.dispose()
    assert ran.calls == [{"tool": "danger", "x": "1"}]


async def test_a_continuation_cut_off_again_pauses_again(tmp_path: Path) -> None:
    ran = Ran()
    await pause_by_disposal(tmp_path, ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}]), ran)
    for _ in range(2):
        silent = ScriptedModel([])
        asking = Asking()
        async with open_harness(model=silent, store=tmp_path, builtin_tools=False, approver=asking) as h:
            h.tools.add(ran.tool())
            handle = await h.agents.resume("s")
            await asking.asked.wait()
            await handle.dispose()
            events = list(handle.agent.session.events)
            assert events[-1].type == "turn/end" and getattr(events[-1], "reason", None) == "paused"
            assert [c.id for c in paused_calls(events)] == ["c1"]
            assert_balanced(events)
    approver = Answers([ApprovalDecision.allow_once()])
    last = ScriptedModel([{"text": "ok"}])
    async with open_harness(model=last, store=tmp_path, builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            assert turn_ends(agent)[-1] == (4, "completed", None)
            assert_balanced(agent.session)
    assert ran.calls == [{"tool": "danger", "x": "1"}]


def test_assert_balanced_refuses_waiting_calls_unless_the_turn_ends_paused() -> None:
    from trio_harness._records import ToolCall

    def log(reason: str) -> list[ev.Event]:
        rows: list[tuple[type[ev.Event], dict[str, Any]]] = [
            (ev.TurnStart, {"turn": 1}),
            (ev.StepStart, {"turn": 1, "step": 1}),
            (ev.AssistantMessage, {"turn": 1, "step": 1, "text": "", "tool_calls": (ToolCall("c1", "danger", "{}"),)}),
            (ev.ApprovalRequested, {"turn": 1, "step": 1, "call_id": "c1", "name": "danger", "arguments": "{}"}),
            (ev.StepEnd, {"turn": 1, "step": 1}),
            (ev.TurnEnd, {"turn": 1, "reason": reason}),
        ]
        return [cls(seq=i, ts=0.0, **fields) for i, (cls, fields) in enumerate(rows)]

    assert_balanced(log("paused"))
    with pytest.raises(EventLogMismatch, match="not paused"):
        assert_balanced(log("completed"))


def test_a_continuation_turn_is_no_compaction_boundary() -> None:
    """The paused turn's call and the continuation's result are never split by a compaction."""
    import attrs

    from trio_harness._records import ToolCall
    from trio_harness.agents._history import History

    rows: list[tuple[type[ev.Event], dict[str, Any]]] = [
        (ev.TurnStart, {"turn": 1}),
        (ev.StepStart, {"turn": 1, "step": 1}),
        (ev.AssistantMessage, {"turn": 1, "step": 1, "text": "", "tool_calls": (ToolCall("c1", "danger", "{}"),)}),
        (ev.ApprovalRequested, {"turn": 1, "step": 1, "call_id": "c1", "name": "danger", "arguments": "{}"}),
        (ev.StepEnd, {"turn": 1, "step": 1}),
        (ev.TurnEnd, {"turn": 1, "reason": "paused", "cause": "disposed"}),
        (ev.TurnStart, {"turn": 2}),
        (ev.StepStart, {"turn": 2, "step": 1}),
        (ev.ToolResult, {"turn": 2, "step": 1, "call_id": "c1", "name": "danger", "content": "ok"}),
        (ev.StepEnd, {"turn": 2, "step": 1}),
        (ev.TurnEnd, {"turn": 2, "reason": "completed"}),
        (ev.TurnStart, {"turn": 3}),
    ]
    events = [cls(seq=i, ts=0.0, **fields) for i, (cls, fields) in enumerate(rows)]
    assert_balanced(events[:-1])

    @attrs.define
    class Log:
        events: list[ev.Event]

    history = History(Log(events))  # type: ignore[arg-type]
    assert [mark.seq for mark in history.marks] == [0, 11]  # turn 1 and turn 3, not the continuation


KILLED_WHILE_ASKING = r"""
import sys
import trio
from trio_harness import open_harness
from trio_harness.agents import Tool
from trio_harness.model._scripted import ScriptedModel

STORE = sys.argv[1]
OBJ = {"type": "object", "properties": {"x": {"type": "string"}}}


async def handler(ctx, args):
    raise AssertionError("the killed process never runs the call")


async def asks_forever(request):
    await request.agent.session.flush()  # the approval/requested is on disk
    print("asked", flush=True)
    await trio.sleep_forever()


async def main():
    model = ScriptedModel([{"tool_calls": [{"id": "c1", "name": "danger", "arguments": {"x": "1"}}]}])
    async with open_harness(model=model, store=STORE, builtin_tools=False, approver=asks_forever) as h:
        h.tools.add(Tool("danger", "the danger tool", OBJ, handler, requires_approval=True))
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await trio.sleep_forever()


trio.run(main)
"""


async def test_a_process_killed_while_asking_resumes_paused_and_asks_again(tmp_path: Path) -> None:
    """A real SIGKILL during the approval wait: the resumed log ends paused and the approver is asked again."""
    import os
    import signal
    import subprocess
    import sys

    from _util import WAIT, read_line

    script = tmp_path / "writer.py"
    script.write_text(KILLED_WHILE_ASKING, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parent.parent)}
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script), str(tmp_path / "store")], stdout=subprocess.PIPE, env=env
    )
    try:
        assert process.stdout is not None
        assert await read_line(process.stdout, "the writer") == b"asked\n"
        process.send_signal(signal.SIGKILL)
        with trio.fail_after(WAIT):
            assert await process.wait() == -signal.SIGKILL
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            if process.stdout is not None:
                await process.stdout.aclose()

    ran = Ran()
    approver = Answers([ApprovalDecision.allow_once()])
    again = ScriptedModel([{"text": "after the kill"}])
    async with open_harness(model=again, store=tmp_path / "store", builtin_tools=False, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            await agent.when_idle()
            assert [r.call_id for r in approver.requests] == ["c1"]
            assert turn_ends(agent) == [(1, "paused", None), (2, "completed", None)]
            assert_balanced(agent.session)
    assert ran.calls == [{"tool": "danger", "x": "1"}]
