"""Approval before dangerous tool calls, end to end through a scripted model (docs/approval.rst)."""

from __future__ import annotations

import json
import shutil
from collections.abc import Awaitable, Callable, Mapping
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
import trio.testing

from trio_harness import ApprovalDecision, ApprovalRequest, BashToolOptions, allow_all, open_harness
from trio_harness._errors import EventDecodeError, ToolError
from trio_harness.agents import AgentOptions, ReactAgent, Tool, ToolContext
from trio_harness.model import ToolMessage
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.session import decode_event
from trio_harness.session._recovery import INTERRUPTED_APPROVAL_RESULT
from trio_harness.testing import NOISE, assert_balanced, assert_events, open_test_harness
from trio_harness.tools._bash import SHELL_METACHARACTERS, command_allowed

OBJ: dict[str, Any] = {"type": "object", "properties": {"x": {"type": "string"}}}


@attrs.define
class Ran:
    """Records the calls a tool handler actually ran."""

    calls: list[dict[str, Any]] = attrs.field(factory=list)

    def tool(self, name: str = "danger", **kwargs: Any) -> Tool:
        async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
            self.calls.append({"tool": name, **args})
            return f"{name} ran {args.get('x')}"

        kwargs.setdefault("requires_approval", True)
        return Tool(name, f"the {name} tool", OBJ, handler, **kwargs)


@attrs.define
class Answers:
    """An approver answering from a list (or a function), recording every request."""

    answers: list[ApprovalDecision | Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]]
    requests: list[ApprovalRequest] = attrs.field(factory=list)

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        self.requests.append(request)
        answer = self.answers.pop(0)
        if isinstance(answer, ApprovalDecision):
            return answer
        return await answer(request)


async def refuse_to_be_asked(request: ApprovalRequest) -> ApprovalDecision:
    raise AssertionError(f"nobody should be asked about {request.tool}")


def call(name: str, x: str = "1", call_id: str | None = None) -> dict[str, Any]:
    made: dict[str, Any] = {"name": name, "arguments": {"x": x}}
    if call_id is not None:
        made["id"] = call_id
    return made


def of(agent: object, kind: type[ev.Event]) -> list[Any]:
    assert isinstance(agent, ReactAgent)
    return [e for e in agent.session.events if isinstance(e, kind)]


def results(agent: object) -> list[ev.ToolResult]:
    return of(agent, ev.ToolResult)


# ---------------------------------------------------------------- basics


async def test_without_an_approver_calls_that_require_approval_are_denied_saying_how_to_allow_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ran = Ran()
    model = ScriptedModel(
        [{"tool_calls": [call("danger"), call("safe")]}, {"tool_calls": [call("danger", "2")]}, {"text": "done"}]
    )
    async with open_test_harness(model) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        h.tools.add(ran.tool("safe", requires_approval=False))
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == [{"tool": "safe", "x": "1"}]  # only the call that needs no approval ran
        assert of(agent, ev.ApprovalRequested) == []  # nobody was asked
        decided = of(agent, ev.ApprovalDecided)
        assert [(d.name, d.outcome, d.source) for d in decided] == [("danger", "deny", "error")] * 2
        denied = [r for r in results(agent) if r.name == "danger"]
        for result in denied:
            assert result.is_error
            assert result.content.startswith("error: denied: the call to 'danger' requires approval and no approver")
            for how in ("approver=", "allow_all", "BashToolOptions(requires_approval=False)"):
                assert how in result.content
        assert all(d.message and "allow_all" in d.message for d in decided)
    # The developer sees it once per agent on the library's log, besides the session log.
    warnings = [r for r in caplog.records if r.name == "trio_harness.agent" and "no approver" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelname == "WARNING"


async def test_without_an_approver_bash_does_not_run_a_command(tmp_path: Path) -> None:
    marker = tmp_path / "pwned"
    model = ScriptedModel(
        [{"tool_calls": [{"name": "bash", "arguments": {"command": f"touch {marker}"}}]}, {"text": "ok"}]
    )
    async with open_harness(model=model, store=tmp_path / "s") as h, h.agents.open(cwd=str(tmp_path)) as agent:
        agent.followup("go")
        await agent.when_idle()
        (result,) = results(agent)
        assert result.is_error and "no approver is configured" in result.content
    assert not marker.exists()


@pytest.mark.parametrize("where", ["harness", "agent"])
async def test_allow_all_runs_every_call_unasked_and_logs_each(tmp_path: Path, where: str) -> None:
    marker = tmp_path / "ran"
    model = ScriptedModel(
        [{"tool_calls": [{"name": "bash", "arguments": {"command": f"touch {marker}"}}]}, {"text": "ok"}]
    )
    harness_approver = allow_all if where == "harness" else None
    options = AgentOptions(approver=allow_all) if where == "agent" else None
    async with (
        open_harness(model=model, store=tmp_path / "s", approver=harness_approver) as h,
        h.agents.open(cwd=str(tmp_path), options=options) as agent,
    ):
        agent.followup("go")
        await agent.when_idle()
        assert [(d.outcome, d.source) for d in of(agent, ev.ApprovalDecided)] == [("allow_once", "approver")]
        (result,) = results(agent)
        assert not result.is_error
    assert marker.exists()


async def test_allow_once_runs_the_call_and_logs_who_approved_what() -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.allow_once(), ApprovalDecision.allow_once()])
    model = ScriptedModel(
        [{"tool_calls": [call("danger", "a", "c1")]}, {"tool_calls": [call("danger", "b", "c2")]}, {"text": "ok"}]
    )
    async with open_test_harness(model, approver=approver) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == [{"tool": "danger", "x": "a"}, {"tool": "danger", "x": "b"}]  # asked twice
        first = approver.requests[0]
        assert (first.tool, first.call_id, first.agent_id, first.turn, first.step) == ("danger", "c1", agent.id, 1, 1)
        assert first.arguments == {"x": "a"} and json.loads(first.raw_arguments) == {"x": "a"}
        assert first.agent is agent
        assert_events(
            agent.session,
            [
                "turn/start",
                "step/start",
                "user/message",
                "assistant/message",
                "tool/call",
                "approval/requested",
                "approval/decided",
                "tool/started",
                "tool/result",
                "step/end",
                "step/start",
                "assistant/message",
                "tool/call",
                "approval/requested",
                "approval/decided",
                "tool/started",
                "tool/result",
                "step/end",
                "step/start",
                "assistant/message",
                "step/end",
                "turn/end",
            ],
            ignore=NOISE,
        )
        requested = of(agent, ev.ApprovalRequested)[0]
        assert (requested.call_id, requested.name, json.loads(requested.arguments)) == ("c1", "danger", {"x": "a"})
        decided = of(agent, ev.ApprovalDecided)[0]
        assert (decided.call_id, decided.outcome, decided.source, decided.message) == (
            "c1",
            "allow_once",
            "approver",
            None,
        )


async def test_deny_with_a_message_never_runs_and_the_model_reads_why() -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.deny("use the staging database instead")])
    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "understood"}])
    async with open_test_harness(model, approver=approver) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == []
        result = results(agent)[0]
        assert result.is_error
        assert result.content == (
            "error: denied: the call to 'danger' was not approved, so it did not run; "
            "message: use the staging database instead"
        )
        decided = of(agent, ev.ApprovalDecided)[0]
        assert (decided.outcome, decided.source, decided.message) == (
            "deny",
            "approver",
            "use the staging database instead",
        )
        # The model's next request carries the denial as the call's error result.
        tool_messages = [m for m in model.requests[1].messages if isinstance(m, ToolMessage)]
        assert tool_messages[-1].content == result.content and tool_messages[-1].is_error
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"


async def test_a_deny_without_a_message_says_it_was_not_approved() -> None:
    approver = Answers([ApprovalDecision.deny()])
    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=approver) as h, h.agents.open() as agent:
        h.tools.add(Ran().tool())
        agent.followup("go")
        await agent.when_idle()
        assert results(agent)[0].content == "error: denied: the call to 'danger' was not approved, so it did not run"


# ---------------------------------------------------------------- remembered decisions


async def test_allow_always_is_remembered_per_tool_and_rebuilt_after_resume(tmp_path: Path) -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.allow_always(), ApprovalDecision.allow_once()])
    model = ScriptedModel(
        [
            {"tool_calls": [call("danger", "1")]},
            {"tool_calls": [call("danger", "2")]},
            {"tool_calls": [call("other", "3")]},  # another tool still asks
            {"text": "done"},
        ]
    )
    async with open_test_harness(model, store=tmp_path, approver=approver) as h:
        h.tools.add(ran.tool())
        h.tools.add(ran.tool("other"))
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [r.tool for r in approver.requests] == ["danger", "other"]
            decided = [(d.name, d.outcome, d.source) for d in of(agent, ev.ApprovalDecided)]
            assert decided == [
                ("danger", "allow_always", "approver"),
                ("danger", "allow_always", "remembered"),
                ("other", "allow_once", "approver"),
            ]
            # a remembered decision asks nobody: no approval/requested for the second call
            assert len(of(agent, ev.ApprovalRequested)) == 2
            assert isinstance(agent, ReactAgent) and agent.standing_decisions == {"danger": "allow_always"}
    assert [c["x"] for c in ran.calls] == ["1", "2", "3"]

    # A new process: the decision is rebuilt from the stored log, nobody is asked.
    again = ScriptedModel([{"tool_calls": [call("danger", "4")]}, {"text": "done again"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=refuse_to_be_asked) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            assert isinstance(agent, ReactAgent) and agent.standing_decisions == {"danger": "allow_always"}
            agent.followup("more")
            await agent.when_idle()
            assert ran.calls[-1] == {"tool": "danger", "x": "4"}
            assert of(agent, ev.ApprovalDecided)[-1].source == "remembered"


async def test_deny_always_is_remembered_and_rebuilt_after_resume(tmp_path: Path) -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.deny_always("never in this project")])
    model = ScriptedModel(
        [{"tool_calls": [call("danger", "1")]}, {"tool_calls": [call("danger", "2")]}, {"text": "ok"}]
    )
    async with open_test_harness(model, store=tmp_path, approver=approver) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            assert len(approver.requests) == 1
            first, second = results(agent)
            assert first.content == (
                "error: denied: the call to 'danger' (and later calls of this tool in this session) was not "
                "approved, so it did not run; message: never in this project"
            )
            assert second.content == (
                "error: denied: calls to 'danger' were denied for this session, so this call did not run; "
                "message: never in this project"
            )
            assert [(d.outcome, d.source, d.message) for d in of(agent, ev.ApprovalDecided)] == [
                ("deny_always", "approver", "never in this project"),
                ("deny_always", "remembered", "never in this project"),
            ]
    again = ScriptedModel([{"tool_calls": [call("danger", "3")]}, {"text": "ok"}])
    async with open_harness(model=again, store=tmp_path, builtin_tools=False, approver=refuse_to_be_asked) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            agent.followup("again")
            await agent.when_idle()
            assert results(agent)[-1].content == (
                "error: denied: calls to 'danger' were denied for this session, so this call did not run; "
                "message: never in this project"
            )
    assert ran.calls == []


async def test_a_fork_does_not_inherit_always_decisions() -> None:
    approver = Answers([ApprovalDecision.allow_always(), ApprovalDecision.deny()])
    model = ScriptedModel(
        [{"tool_calls": [call("danger")]}, {"text": "ok"}, {"tool_calls": [call("danger")]}, {"text": "ok"}]
    )
    async with open_test_harness(model, approver=approver) as h:
        h.tools.add(Ran().tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            boundary = len(agent.session)
        await h.sessions.fork("s", boundary, "f")
        async with h.agents.open(session_id="f", resume=True) as forked:
            assert isinstance(forked, ReactAgent) and forked.standing_decisions == {}
            forked.followup("go on")
            await forked.when_idle()
            assert len(approver.requests) == 2  # asked again in the fork


# ---------------------------------------------------------------- cancel, dispose, errors


@pytest.mark.parametrize("order", ["cancel-then-decision", "decision-then-cancel"])
async def test_cancel_during_the_wait_never_runs_the_call(order: str, autojump_clock: trio.testing.MockClock) -> None:
    ran = Ran()
    gate = trio.Event()

    async def wait_for_gate(request: ApprovalRequest) -> ApprovalDecision:
        await gate.wait()
        return ApprovalDecision.allow_always()

    approver = Answers([wait_for_gate])
    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "never"}])
    async with open_test_harness(model, approver=approver) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        assert len(approver.requests) == 1  # the driver waits for the decision
        started = trio.current_time()
        # Both orders are forced in one synchronous block, with no checkpoint between.
        if order == "cancel-then-decision":
            assert agent.cancel() is True
            gate.set()
        else:
            gate.set()  # the decision is in, but the driver has not resumed yet
            assert agent.cancel() is True
        await agent.when_idle()
        assert trio.current_time() == started  # the wait ended at once
        assert ran.calls == []
        decided = of(agent, ev.ApprovalDecided)
        assert len(decided) == 1
        assert (decided[0].outcome, decided[0].source, decided[0].cause) == ("cancelled", "cancelled", "user")
        if order == "decision-then-cancel":
            assert decided[0].message == "the decision allow_always arrived after the cancel and was not applied"
        else:
            assert decided[0].message is None
        assert isinstance(agent, ReactAgent) and agent.standing_decisions == {}  # nothing of it applied
        assert results(agent)[0].content == "error: not run: the turn was aborted (cause: user)"
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
        assert_balanced(agent.session)
        assert len(model.requests) == 1  # the turn did not go on


async def test_dispose_during_the_wait_ends_it_and_records_the_cause(autojump_clock: trio.testing.MockClock) -> None:
    ran = Ran()

    async def never_answers(request: ApprovalRequest) -> ApprovalDecision:
        await trio.sleep_forever()

    model = ScriptedModel([{"tool_calls": [call("danger")]}])
    async with open_test_harness(model, approver=Answers([never_answers])) as h:
        h.tools.add(ran.tool())
        handle = await h.agents.create()
        agent = handle.agent
        agent.followup("go")
        await trio.testing.wait_all_tasks_blocked()
        started = trio.current_time()
        await handle.dispose()
        assert trio.current_time() == started
        assert ran.calls == []
        decided = of(agent, ev.ApprovalDecided)
        assert [(d.outcome, d.source, d.cause) for d in decided] == [("cancelled", "cancelled", "disposed")]
        assert results(agent)[0].content == "error: not run: the turn was aborted (cause: disposed)"
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "disposed")
        assert_balanced(agent.session)


async def test_an_approver_that_raises_denies_the_call_and_the_error_reaches_the_log() -> None:
    ran = Ran()

    async def broken(request: ApprovalRequest) -> ApprovalDecision:
        raise RuntimeError("the approval service is down")

    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=broken) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == []
        decided = of(agent, ev.ApprovalDecided)[0]
        assert (decided.outcome, decided.source) == ("deny", "error")
        assert decided.message == "the approver failed: RuntimeError: the approval service is down"
        assert results(agent)[0].content == (
            "error: denied: approval could not be obtained (the approver failed: RuntimeError: the approval "
            "service is down); the call did not run"
        )
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"


async def test_an_approver_that_answers_something_else_denies_the_call() -> None:
    ran = Ran()

    async def sloppy(request: ApprovalRequest) -> ApprovalDecision:
        return "yes"  # type: ignore[return-value]  # what a careless approver returns

    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=sloppy) as h, h.agents.open() as agent:
        h.tools.add(ran.tool())
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == []
        decided = of(agent, ev.ApprovalDecided)[0]
        assert (decided.outcome, decided.source) == ("deny", "error")
        assert decided.message == "the approver returned str 'yes', not an ApprovalDecision"


async def test_a_resume_of_a_session_that_died_while_asking_ends_the_call_as_not_run(tmp_path: Path) -> None:
    ran = Ran()

    asked = trio.Event()

    async def never_answers(request: ApprovalRequest) -> ApprovalDecision:
        asked.set()
        await trio.sleep_forever()

    live, crashed = tmp_path / "live", tmp_path / "crashed"
    model = ScriptedModel([{"tool_calls": [call("danger", "1", "c1")]}])
    async with open_test_harness(model, store=live, approver=never_answers) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await asked.wait()  # the question is on disk before the approver is asked (a checkpoint)
            # What a process killed at this moment leaves on disk.
            shutil.copytree(live, crashed)
            assert of(agent, ev.ApprovalRequested) and not of(agent, ev.ApprovalDecided)

    again = ScriptedModel([{"text": "after the restart"}])
    async with open_harness(model=again, store=crashed, builtin_tools=False, approver=refuse_to_be_asked) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(session_id="s", resume=True) as agent:
            events = agent.session.events
            tail = [e.type for e in events[-4:]]
            assert tail == ["approval/decided", "tool/result", "step/end", "turn/end"]
            decided = of(agent, ev.ApprovalDecided)[0]
            assert (decided.call_id, decided.outcome, decided.source) == ("c1", "cancelled", "interrupted")
            result = results(agent)[0]
            assert (result.call_id, result.content, result.is_error) == ("c1", INTERRUPTED_APPROVAL_RESULT, True)
            end = events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "interrupted"
            agent.followup("and now?")
            await agent.when_idle()
            assert_balanced(agent.session)
    assert ran.calls == []  # nothing ran, and nobody was asked again


# ---------------------------------------------------------------- parallel calls, predicates, options


async def test_parallel_calls_ask_one_at_a_time_in_model_order(autojump_clock: trio.testing.MockClock) -> None:
    ran = Ran()
    asking = 0
    most = 0
    order: list[str] = []

    async def slow(request: ApprovalRequest) -> ApprovalDecision:
        nonlocal asking, most
        asking += 1
        most = max(most, asking)
        order.append(request.call_id)
        await trio.sleep(10)  # a user thinking
        asking -= 1
        return ApprovalDecision.allow_once()

    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    call("a", "1", "c1"),
                    call("free", "2", "c2"),
                    call("b", "3", "c3"),
                    call("c", "4", "c4"),
                ]
            },
            {"text": "ok"},
        ]
    )
    async with open_test_harness(model, approver=slow) as h, h.agents.open() as agent:
        for name in ("a", "b", "c"):
            h.tools.add(ran.tool(name))
        h.tools.add(ran.tool("free", requires_approval=False))
        agent.followup("go")
        await trio.sleep(5)
        # the call that needs no approval ran while the first one was being asked
        assert [c["tool"] for c in ran.calls] == ["free"]
        await agent.when_idle()
        assert order == ["c1", "c3", "c4"] and most == 1
        assert sorted(c["tool"] for c in ran.calls) == ["a", "b", "c", "free"]
        assert [r.call_id for r in results(agent)] == ["c1", "c2", "c3", "c4"]  # model order


async def test_a_predicate_decides_per_call_whether_to_ask() -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.deny()])

    def risky(args: Mapping[str, Any]) -> bool:
        return args.get("x") != "safe"

    model = ScriptedModel([{"tool_calls": [call("danger", "safe"), call("danger", "risky")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=approver) as h, h.agents.open() as agent:
        h.tools.add(ran.tool(requires_approval=risky))
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == [{"tool": "danger", "x": "safe"}]
        assert [r.arguments["x"] for r in approver.requests] == ["risky"]


async def test_a_predicate_that_raises_denies_the_call() -> None:
    ran = Ran()

    def broken(args: Mapping[str, Any]) -> bool:
        raise KeyError("mode")

    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=refuse_to_be_asked) as h, h.agents.open() as agent:
        h.tools.add(ran.tool(requires_approval=broken))
        agent.followup("go")
        await agent.when_idle()
        assert ran.calls == []
        assert results(agent)[0].content == (
            "error: denied: deciding whether the call needs approval failed: KeyError: 'mode'; "
            "the call to 'danger' did not run"
        )
        assert of(agent, ev.ApprovalDecided)[0].source == "error"


async def test_the_agents_approver_wins_over_the_harness_approver() -> None:
    harness_approver = Answers([])
    agent_approver = Answers([ApprovalDecision.allow_once()])
    model = ScriptedModel([{"tool_calls": [call("danger")]}, {"text": "ok"}])
    async with open_test_harness(model, approver=harness_approver) as h:
        h.tools.add(Ran().tool())
        async with h.agents.open(options=AgentOptions(approver=agent_approver)) as agent:
            agent.followup("go")
            await agent.when_idle()
    assert len(agent_approver.requests) == 1 and harness_approver.requests == []


async def test_a_subagent_asks_its_parents_approver() -> None:
    ran = Ran()
    approver = Answers([ApprovalDecision.allow_once()])
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "subagent", "arguments": {"prompt": "do it"}}]},  # parent
            {"tool_calls": [call("danger")]},  # child
            {"text": "child done"},
            {"text": "parent done"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["subagent"]) as h:
        h.tools.add(ran.tool())
        async with h.agents.open(options=AgentOptions(approver=approver)) as parent:
            parent.followup("delegate")
            await parent.when_idle()
            (request,) = approver.requests
            assert request.agent_id != parent.id and request.agent.parent_id == parent.id
    assert ran.calls == [{"tool": "danger", "x": "1"}]


# ---------------------------------------------------------------- bash


def bash(command: str) -> dict[str, Any]:
    return {"name": "bash", "arguments": {"command": command}}


async def test_bash_requires_approval_by_default_and_allowed_prefixes_never_ask(tmp_path: Path) -> None:
    approver = Answers([ApprovalDecision.deny("no redirections, please")])
    marker = tmp_path / "marker"
    model = ScriptedModel(
        [
            {"tool_calls": [bash("echo hello")]},
            {"tool_calls": [bash(f"echo hello > {marker}")]},  # a metacharacter: asked, denied
            {"text": "done"},
        ]
    )
    async with open_test_harness(
        model,
        builtin_tools=["bash"],
        approver=approver,
        bash_tool_options=BashToolOptions(allow_prefixes=["echo", "git status"]),
    ) as h:
        async with h.agents.open(cwd=tmp_path) as agent:
            agent.followup("go")
            await agent.when_idle()
            first, second = results(agent)
            assert first.content.strip() == "hello" and not first.is_error  # ran without asking
            assert second.is_error and "no redirections, please" in second.content
            assert [r.raw_arguments for r in approver.requests] == [json.dumps({"command": f"echo hello > {marker}"})]
    assert not marker.exists()  # the denied command never ran


async def test_bash_asks_for_every_command_without_an_allow_list(tmp_path: Path) -> None:
    approver = Answers([ApprovalDecision.allow_once()])
    model = ScriptedModel([{"tool_calls": [bash("echo hi")]}, {"text": "done"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=approver) as h:
        async with h.agents.open(cwd=tmp_path) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert [r.tool for r in approver.requests] == ["bash"]
            assert results(agent)[0].content.strip() == "hi"


async def test_bash_approval_can_be_turned_off_through_open_harness(tmp_path: Path) -> None:
    model = ScriptedModel([{"tool_calls": [bash("echo hi")]}, {"text": "done"}])
    async with open_test_harness(
        model,
        builtin_tools=["bash"],
        approver=refuse_to_be_asked,
        bash_tool_options=BashToolOptions(requires_approval=False),
    ) as h:
        assert h.tools.get("bash") is not None and h.tools.get("bash").requires_approval is False  # type: ignore[union-attr]
        async with h.agents.open(cwd=tmp_path) as agent:
            agent.followup("go")
            await agent.when_idle()
            assert results(agent)[0].content.strip() == "hi"


PREFIXES = ["git status", "ls", "echo"]


@pytest.mark.parametrize(
    "command",
    ["git status", "git status --short", "  git   status  ", "git 'status'", 'echo "two words"', "ls -la /tmp"],
)
def test_a_plain_command_starting_with_an_allowed_prefix_is_allowed(command: str) -> None:
    assert command_allowed(command, PREFIXES)


@pytest.mark.parametrize(
    "command",
    [
        "git statusx",
        "git",
        "git stat",
        "git status; rm -rf /",
        "git status;rm -rf /",
        "git status && rm -rf /",
        "git status || rm -rf /",
        "git status | sh",
        "git status & rm -rf /",
        "git status\nrm -rf /",
        "git status\rrm -rf /",
        "git status\trm",
        "git status $(rm -rf /)",
        "git status `rm -rf /`",
        "git status ${IFS}",
        "git status > ~/.bashrc",
        "git status < /etc/passwd",
        "git status 2>/dev/null",
        "git status <(rm -rf /)",
        "(git status)",
        "{ git status; }",
        "git status \\; rm -rf /",
        "git status ';' rm",
        "FOO=1 git status",
        "ls *",
        "ls ?",
        "ls [ab]",
        "echo {a,b}",
        "echo 'unbalanced",
        "'git status'",
        "",
        "   ",
        "rm -rf /",
    ],
)
def test_bypass_attempts_are_not_allowed(command: str) -> None:
    assert not command_allowed(command, PREFIXES)


def test_command_allowed_needs_a_string_and_prefixes() -> None:
    assert not command_allowed(None, PREFIXES)
    assert not command_allowed(["git", "status"], PREFIXES)
    assert not command_allowed("git status", [])
    assert set(";&|<>()$`\\{}*?[]") == SHELL_METACHARACTERS


@pytest.mark.parametrize("prefix", ["git;", "echo $HOME", "'git'", "", "   ", "ls *"])
def test_a_prefix_must_be_plain_words(prefix: str) -> None:
    with pytest.raises(ValueError, match="allow_prefixes"):
        BashToolOptions(allow_prefixes=[prefix])


def test_allow_prefixes_must_be_a_list_not_a_string() -> None:
    with pytest.raises(TypeError, match=r"a list of command prefixes \(e\.g\. \['git status'\]\)"):
        BashToolOptions(allow_prefixes="git status")


# ---------------------------------------------------------------- records and events


def test_decisions_are_checked_when_built() -> None:
    assert ApprovalDecision.allow_once().allowed and not ApprovalDecision.allow_once().remembered
    assert ApprovalDecision.deny_always("x").remembered and not ApprovalDecision.deny_always().allowed
    with pytest.raises(ValueError, match="verdict must be one of allow_once, allow_always, deny, deny_always"):
        ApprovalDecision("perhaps")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="message must be a str or None"):
        ApprovalDecision("deny", 42)  # type: ignore[arg-type]


async def test_approver_and_requires_approval_are_checked() -> None:
    with pytest.raises(TypeError, match="approver must be an async callable or None"):
        async with open_harness(approver="yes"):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="approver must be callable or None"):
        AgentOptions(approver=True)  # type: ignore[arg-type]
    with pytest.raises(ToolError, match="requires_approval must be a bool or a predicate"):
        Tool("t", "t", OBJ, Ran().tool().handler, requires_approval="always")  # type: ignore[arg-type]


def test_approval_events_are_checked_on_decode() -> None:
    base: dict[str, Any] = {"seq": 3, "ts": 1.0, "turn": 1, "step": 1, "call_id": "c", "name": "bash"}
    line = json.dumps({"type": "approval/decided", **base, "outcome": "deny", "source": "approver", "message": "m"})
    assert decode_event(line) == ev.ApprovalDecided(**base, outcome="deny", source="approver", message="m")
    bad = json.dumps({"type": "approval/decided", **base, "outcome": "maybe", "source": "approver"})
    with pytest.raises(EventDecodeError, match="approval/decided"):
        decode_event(bad)
