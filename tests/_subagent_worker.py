"""A harness process with a background subagent task, for ``tests/test_resume_tasks.py``.

Usage::

    python _subagent_worker.py STORE SESSION_ID start|resume

``STORE`` is a JSONL directory, ``postgresql://...#SCHEMA`` (a
:class:`~trio_harness.session.PostgresStore`) or ``postgresql://...#SCHEMA#pooled``
(a :class:`~trio_harness.session.PooledPostgresStore`).  ``start``
creates the owner ``SESSION_ID`` and runs one turn in which the owner starts a
background subagent (``subagent-1``, whose child's model hangs) and a
background ``bash`` (``bash-1``); once the owner's turn ended and the child's
model request was made it prints ``{"at": "running"}`` and waits: the test
kills it with SIGKILL.  ``resume`` resumes the owner; the child's model now
answers; once the owner got the subagent's completion notice and answered
it, the worker prints ``{"at": "done", ...}`` with the task's status, output
and detail, the notices and the task list, and exits.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from typing import Any

import trio

from trio_harness import AgentOptions, BashToolOptions, ScriptedModel, SubagentOptions, open_harness
from trio_harness.model._protocol import Emit, ModelRequest
from trio_harness.session import JsonlStore, PooledPostgresStore, PostgresStore, SessionStore
from trio_harness.session import _events as ev

CHILD_ANSWER = "the child's answer: 3 bugs found"


def mark(at: str, **fields: Any) -> None:
    print(json.dumps({"at": at, **fields}), flush=True)


class MarkedChild(ScriptedModel):
    """The child's model, printing ``{"at": "child-request"}`` as each request reaches it."""

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        mark("child-request")
        await super().stream(request, emit)


def open_store(where: str) -> SessionStore:
    if where.startswith("postgresql://"):
        dsn, _, rest = where.partition("#")
        schema, _, mode = rest.partition("#")
        cls = PooledPostgresStore if mode == "pooled" else PostgresStore
        return cls(dsn, schema=schema, lock_timeout=30.0)
    return JsonlStore(where)


def notices(events: Sequence[ev.Event]) -> list[str]:
    return [m.text for e in events if isinstance(e, ev.InboxSpliced) for m in e.inserted if m.origin == "task-notice"]


async def main(where: str, session_id: str, phase: str) -> None:
    if phase == "start":
        delegate = {"prompt": "review the code", "description": "review", "run_in_background": True}
        server = {"command": "sleep 30", "description": "server", "run_in_background": True}
        owner = ScriptedModel(
            [
                {"tool_calls": [{"name": "subagent", "arguments": delegate}, {"name": "bash", "arguments": server}]},
                {"text": "delegated"},
            ]
        )
        child = MarkedChild([{"hang": True}])
    else:
        owner = ScriptedModel([{"text": "noted"}] * 3)
        child = MarkedChild([{"text": CHILD_ANSWER}])
    options = SubagentOptions(child_options=AgentOptions(model=child))
    async with open_harness(
        model=owner,
        store=open_store(where),
        builtin_tools=["tasks", "subagent", "bash"],
        subagent_options=options,
        bash_tool_options=BashToolOptions(requires_approval=False),
    ) as harness:
        if phase == "start":
            handle = await harness.agents.create(session_id=session_id)
            async with handle as agent:
                agent.followup("delegate the review and start the server")
                await agent.when_idle()
                while not harness.agents.owned_by(session_id) or not child.requests:
                    await trio.sleep(0.01)
                await harness.agents.owned_by(session_id)[0].session.flush()
                mark("running", children=[a.id for a in harness.agents.owned_by(session_id)])
                await trio.sleep_forever()
        handle = await harness.agents.resume(session_id)
        async with handle as agent:
            mark("resumed", tasks=[[s.id, s.status] for s in harness.tasks.list(caller=agent)])
            with trio.fail_after(60):
                while not any("subagent-1" in n for n in notices(agent.session.events)) or agent.status != "idle":
                    await trio.sleep(0.01)
                await agent.when_idle()
            read = harness.tasks.read("subagent-1", caller=agent)
            mark(
                "done",
                status=read.snapshot.status,
                output=read.output,
                detail=dict(read.snapshot.detail),
                notices=notices(agent.session.events),
                tasks=[[s.id, s.status] for s in harness.tasks.list(caller=agent)],
                answers=[e.text for e in agent.session.events if isinstance(e, ev.AssistantMessage) and e.text],
            )


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
