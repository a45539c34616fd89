"""Crash points: a log cut after any event, loaded and closed, is well formed and rebuilds the same request.

The reference log is a real multi-step session (tool steps, approvals allowed
and denied, failing tools, a failed model request) written by a JSONL store.
For a cut after event ``k`` (every ``k`` of one rich session, and hypothesis's
choice of session and ``k``), the file cut after that event is resumed by a
fresh harness.  Then:

* the log it loaded is the reference's first ``k`` events, and it appended
  exactly the recovery closers (``closers_for``), which balance it
  (``assert_balanced``);
* a call whose handler had started (``tool/started``) and has no result is
  closed as interrupted while running (it may have had effects); a call that
  never started is closed as not run;
* the resumed agent's next request equals the request the reference agent
  (never restarted: the same agent object, its tools, options and provider)
  would send after appending the same closers to its in-memory log.

See docs/guarantees.rst, "Crashes".
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness import ApprovalDecision, open_harness
from trio_harness.agents import ApprovalRequest, ReactAgent, Tool, ToolContext
from trio_harness.agents._history import History
from trio_harness.model import ScriptedModel
from trio_harness.model._protocol import ModelRequest
from trio_harness.session import Session
from trio_harness.session import _events as ev
from trio_harness.session._jsonl import escape_session_id
from trio_harness.session._recovery import closers_for
from trio_harness.testing import assert_balanced

SESSION = "cut"

CALL_KINDS = ("echo", "allowed", "denied", "fail")
"""A call of ``echo``; of ``ask`` (requires approval), allowed or denied; of ``fail`` (raises)."""

# A scenario: turns of steps of calls, each turn ending with a text or a failed request.
Scenario = list[tuple[list[list[str]], bool]]


async def echo(ctx: ToolContext, args: dict[str, Any]) -> str:
    return f"echo {args.get('x', '')}"


async def fail(ctx: ToolContext, args: dict[str, Any]) -> str:
    raise RuntimeError(f"the tool failed for {ctx.call_id}")


async def approver(request: ApprovalRequest) -> ApprovalDecision:
    allowed = bool(request.arguments.get("allow"))
    return ApprovalDecision.allow_once() if allowed else ApprovalDecision.deny("not now")


OBJECT = {"type": "object", "properties": {"x": {"type": "string"}, "allow": {"type": "boolean"}}}
TOOLS = (
    Tool("echo", "echo x", OBJECT, echo),
    Tool("ask", "echo x, once approved", OBJECT, echo, requires_approval=True),
    Tool("fail", "always fails", OBJECT, fail),
)


def script(scenario: Scenario) -> list[dict[str, Any]]:
    responses: list[dict[str, Any]] = []
    for t, (steps, fails) in enumerate(scenario):
        for s, calls in enumerate(steps):
            tool_calls = []
            for c, kind in enumerate(calls):
                name = {"echo": "echo", "allowed": "ask", "denied": "ask", "fail": "fail"}[kind]
                arguments = {"x": f"{t}.{s}.{c}", "allow": kind == "allowed"}
                tool_calls.append({"name": name, "arguments": arguments, "id": f"t{t}s{s}c{c}"})
            responses.append({"tool_calls": tool_calls, "text": f"step {t}.{s}"})
        if fails:
            responses.append({"error": {"message": "the provider is overloaded", "code": "http-529"}})
        else:
            responses.append({"text": f"answer {t}"})
    return responses


@attrs.define
class Reference:
    """The never-restarted agent's log, its file, and how to build its request after given closers."""

    events: tuple[ev.Event, ...]
    root: Path
    requests: list[ModelRequest]


def never_restarted_request(agent: ReactAgent, prefix: Sequence[ev.Event]) -> ModelRequest:
    """The request ``agent`` would send with ``prefix`` as its in-memory log, after appending its closers."""
    session = Session(header=agent.session.header, events=list(prefix))
    for cls, fields in closers_for(prefix):
        session.append(cls, **fields)
    builder = attrs.evolve(agent._request, history=History(session))
    return builder.build(builder.tools())


def check_closer_texts(prefix: Sequence[ev.Event], added: Sequence[ev.Event]) -> None:
    """Started calls are closed as interrupted (may have had effects), never-started ones as not run."""
    started = {getattr(e, "call_id", "") for e in prefix if e.type == "tool/started"}
    for event in added:
        if not isinstance(event, ev.ToolResult):
            continue
        assert event.is_error, event
        if event.call_id in started:
            assert "interrupted" in event.content and "not run" not in event.content, event
            assert "effects" in event.content, f"a started call must warn it may have had effects: {event}"
        else:
            assert "not run" in event.content, f"a call that never started must be closed as not run: {event}"


async def check_cut(reference: Reference, agent: ReactAgent, k: int, work: Path) -> None:
    """Resume the reference log cut after ``k`` events in a fresh harness and check it."""
    prefix = reference.events[:k]
    root = work / f"cut-{k}"
    shutil.copytree(reference.root, root)
    log = root / escape_session_id(SESSION) / "session.jsonl"
    lines = log.read_bytes().splitlines(keepends=True)
    header = len(lines) - len(reference.events)
    log.write_bytes(b"".join(lines[: header + k]))
    expected = never_restarted_request(agent, prefix)
    async with open_harness(model=ScriptedModel([]), store=root, builtin_tools=False, approver=approver) as harness:
        for tool in TOOLS:
            harness.tools.add(tool)
        async with harness.agents.open(session_id=SESSION, resume=True) as resumed:
            assert isinstance(resumed, ReactAgent)
            events = resumed.session.events
            assert tuple(events[:k]) == prefix, f"cut {k}: the loaded log differs from what was written"
            closers = closers_for(prefix)
            added = events[k:]
            assert len(added) == len(closers), f"cut {k}: the resume appended {added}, expected {closers}"
            assert [(type(e), {n: getattr(e, n) for n in f}) for e, (_, f) in zip(added, closers, strict=True)] == [
                (cls, fields) for cls, fields in closers
            ], f"cut {k}: the resume appended {added}"
            assert_balanced(events)
            check_closer_texts(prefix, added)
            assert resumed.build_request() == expected, f"cut {k}: the rebuilt request differs"
    shutil.rmtree(root)


async def run_reference(scenario: Scenario, work: Path, cuts: Callable[[int], Sequence[int]]) -> int:
    """Run ``scenario`` to the end on a JSONL store, then check the cuts ``cuts(len(log))``; the log's length."""
    model = ScriptedModel(script(scenario))
    root = work / "reference"
    async with open_harness(model=model, store=root, builtin_tools=False, approver=approver) as harness:
        for tool in TOOLS:
            harness.tools.add(tool)
        async with harness.agents.open(session_id=SESSION) as agent:
            assert isinstance(agent, ReactAgent)
            for t in range(len(scenario)):
                agent.followup(f"prompt {t}")
                await agent.when_idle()
            await agent.session.flush()
            events = tuple(agent.session.events)
            assert_balanced(events)
            ran = any(kind != "denied" for steps, _ in scenario for calls in steps for kind in calls)
            if ran:  # the checkpoint before a handler runs
                assert any(e.type == "tool/started" for e in events), "no tool/started in the log"
            reference = Reference(events, root, model.requests)
            for k in cuts(len(events)):
                await check_cut(reference, agent, k, work)
    return len(events)


RICH: Scenario = [
    ([["echo", "allowed"], ["denied", "fail", "echo"]], False),
    ([], True),
    ([["allowed"], ["echo"]], False),
]


async def test_every_cut_of_a_multi_step_session_resumes_balanced_with_the_same_request(tmp_path: Path) -> None:
    count = await run_reference(RICH, tmp_path, lambda n: range(n + 1))
    assert count > 40


calls = st.lists(st.sampled_from(CALL_KINDS), min_size=1, max_size=3)
turns = st.tuples(st.lists(calls, max_size=3), st.booleans())


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenario=st.lists(turns, min_size=1, max_size=3), data=st.data())
def test_any_cut_of_any_session_resumes_balanced_with_the_same_request(scenario: Scenario, data: st.DataObject) -> None:
    async def main() -> None:
        with tempfile.TemporaryDirectory() as work:
            await run_reference(scenario, Path(work), lambda n: [data.draw(st.integers(0, n), label="cut")])

    trio.run(main)
