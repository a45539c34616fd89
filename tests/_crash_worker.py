"""A writer process for the crash suite (``tests/test_crash.py``), killed with SIGKILL by the test.

Usage::

    python _crash_worker.py STORE SESSION_ID SCRIPT SIDE_FILE [--durability=POLICY] [--approve=HOW] PROMPT...

``STORE`` is a JSONL directory, or ``postgresql://...#SCHEMA`` (the fragment
names the schema).  The worker opens a harness on the store with the scripted
model of ``SCRIPT`` (a script file, ``scripted:PATH`` format), resumes the
session (or creates it when nothing is stored yet) and sends the prompts one
turn after the other.  Its one tool, ``work``, appends its
:attr:`ToolContext.call_id` to ``SIDE_FILE`` (flushed and fsynced: the side
effect), then works for ``ms`` milliseconds; a call with ``"ask": true``
requires approval, which the worker's approver grants after a short wait.
``--durability`` sets the harness's policy (default ``step``); ``--approve``
is ``slow`` (the default: allow after a short wait), ``allow``, ``deny`` or
``never`` (wait until killed).  A resumed session's continuation (a paused
turn asked again) runs before the prompts.

The worker prints one JSON object a line (flushed) at the moments the test
kills it at, each stating what the log must hold from then on:

* ``{"at": "ready", "events": N}``: the harness is open and the session live;
* ``{"at": "request", "prompts": [...], "calls": [...], "steps": N}``: a
  model request was made (the prompts and the tool calls it carries, and the
  steps the session had completed, counted in memory): from the checkpoint
  before a model request, all of it is in the log;
* ``{"at": "tool", "call_id": ID}``: the handler ran and wrote its side
  effect: the call's ``tool/started`` is in the log;
* ``{"at": "approval", "call_id": ID}``: the approver was asked: the
  ``approval/requested`` is in the log;
* ``{"at": "between", "turn": T, "reason": R}``: the turn ended (the turn end
  waits for the disk);
* ``{"at": "done"}``: every prompt ran; the worker then exits.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from trio_harness import ApprovalDecision, SessionNotFoundError, open_harness
from trio_harness.agents import Agent, ApprovalRequest, Tool, ToolContext
from trio_harness.model import ScriptedModel
from trio_harness.model._protocol import AssistantMessage, Emit, ModelRequest, ToolMessage, UserMessage
from trio_harness.session import JsonlStore, PostgresStore, SessionStore
from trio_harness.session import _events as ev

APPROVAL_WAIT = 0.02
"""Seconds the approver takes to answer (the test kills the worker meanwhile)."""

BETWEEN_TURNS = 0.01
"""Seconds between a turn's end and the next prompt."""


def mark(at: str, **fields: Any) -> None:
    """Print one marker line, flushed at once (the test reads it before killing)."""
    print(json.dumps({"at": at, **fields}), flush=True)


class MarkedModel(ScriptedModel):
    """The scripted model, printing a ``request`` marker as each request reaches it."""

    agent: Agent | None = None

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        agent = MarkedModel.agent
        steps = sum(1 for e in agent.session.events if isinstance(e, ev.StepEnd)) if agent is not None else 0
        calls: list[str] = []
        for message in request.messages:
            if isinstance(message, AssistantMessage):
                calls.extend(call.id for call in message.tool_calls)
            elif isinstance(message, ToolMessage):
                calls.append(message.call_id)
        prompts = [m.text for m in request.messages if isinstance(m, UserMessage)]
        mark("request", prompts=prompts, calls=sorted(set(calls)), steps=steps)
        await super().stream(request, emit)


def work_tool(side_file: str) -> Tool:
    """``work``: append the call id to ``side_file`` (fsynced), then work ``ms`` milliseconds."""

    async def work(ctx: ToolContext, args: dict[str, Any]) -> str:
        fd = os.open(side_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, f"{ctx.call_id}\n".encode())
            os.fsync(fd)
        finally:
            os.close(fd)
        mark("tool", call_id=ctx.call_id)
        await trio.sleep(args.get("ms", 0) / 1000)
        return f"done {ctx.call_id}"

    return Tool(
        "work",
        "append the call id to the side file, then work",
        {"type": "object", "properties": {"ms": {"type": "integer"}, "ask": {"type": "boolean"}}},
        work,
        requires_approval=lambda args: bool(args.get("ask")),
    )


def approver_for(how: str) -> Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]:
    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        mark("approval", call_id=request.call_id)
        if how == "never":
            await trio.sleep_forever()
        if how == "slow":
            await trio.sleep(APPROVAL_WAIT)
        return ApprovalDecision.deny("not now") if how == "deny" else ApprovalDecision.allow_once()

    return approver


def open_store(where: str) -> SessionStore:
    if where.startswith("postgresql://"):
        dsn, _, schema = where.partition("#")
        return PostgresStore(dsn, schema=schema, lock_timeout=30.0)
    return JsonlStore(where)


async def main(where: str, session_id: str, script: str, side_file: str, prompts: list[str]) -> None:
    model = MarkedModel.from_file(script)
    options = {"durability": "step", "approve": "slow"}
    while prompts and prompts[0].startswith("--"):
        name, _, value = prompts.pop(0)[2:].partition("=")
        options[name] = value
    durability: Any = options["durability"]
    approver = approver_for(options["approve"])
    store = open_store(where)
    async with open_harness(
        model=model, store=store, builtin_tools=False, approver=approver, durability=durability
    ) as harness:
        harness.tools.add(work_tool(side_file))
        try:
            handle = await harness.agents.resume(session_id)
        except SessionNotFoundError:
            handle = await harness.agents.create(session_id=session_id)
        async with handle as agent:
            MarkedModel.agent = agent
            mark("ready", events=len(agent.session.events))
            await agent.when_idle()  # a paused turn's continuation, if any
            for prompt in prompts:
                agent.followup(prompt)
                await agent.when_idle()
                end = next(e for e in reversed(agent.session.events) if isinstance(e, ev.TurnEnd))
                mark("between", turn=end.turn, reason=end.reason)
                await trio.sleep(BETWEEN_TURNS)
    mark("done")


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
