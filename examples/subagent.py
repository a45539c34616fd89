"""Subagents: the ``subagent`` tool in the foreground and in the background.

What it shows:

* a foreground ``subagent`` call: a child agent is created with the calling
  agent as its runtime owner, runs the prompt, and its final answer becomes
  the tool result; the child is disposed right after;
* a background call (``run_in_background: true``): the call returns a task id
  (``subagent-1``) at once and the parent collects the answer later with
  ``task_output`` (final-output task: the whole answer, once it has ended);
* lineage: each child session records ``parent_session``; ownership: the
  registry knows the child's owner while it lives (``agents.owner_of``);
* children use their own model through ``subagent_options`` (a
  :class:`~trio_harness.SubagentOptions`; here a second
  scripted model, so the two scripts do not interleave).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import trio

from trio_harness import AgentOptions, Notice, ScriptedModel, SubagentOptions, open_harness
from trio_harness import events as ev
from trio_harness.agents import EventStream
from trio_harness.model import ModelRequest, UserMessage


def child_answer(request: ModelRequest) -> Mapping[str, Any]:
    """What a child says: derived from its prompt (a real model would do better)."""
    prompt = request.messages[-1]
    assert isinstance(prompt, UserMessage)
    return {"text": f"findings for {prompt.text!r}: 42", "delay": 0.2}


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


async def main() -> None:
    parent_model = ScriptedModel(
        [
            call("subagent", prompt="Read the changelog.", description="changelog", run_in_background=False),
            call("subagent", prompt="Scan the issue tracker.", description="issues", run_in_background=True),
            call("task_output", task_id="subagent-1", wait=True, timeout_ms=10_000),
            {"text": "Both subagents reported back."},
        ]
    )
    child_model = ScriptedModel([child_answer, child_answer])
    async with open_harness(
        model=parent_model,
        subagent_options=SubagentOptions(child_options=AgentOptions(model=child_model)),
    ) as harness:

        def on_lifecycle(notice: Notice) -> None:
            agent_id = notice.subject.id
            owner = harness.agents.owner_of(agent_id)
            print(f"  [{notice.name}] {agent_id[:8]}" + (f" owned by {owner[:8]}" if owner else ""))

        harness.bus.on("agent/created", on_lifecycle)
        harness.bus.on("agent/disposed", on_lifecycle)

        async with harness.agents.open() as parent:

            async def show(stream: EventStream) -> None:
                async for event in stream:
                    if isinstance(event, ev.ToolCallRequested):
                        print(f">>> {event.name} {event.arguments}")
                    elif isinstance(event, ev.ToolResult):
                        print("\n".join(f"    {line}" for line in event.content.splitlines()))
                    elif isinstance(event, ev.AssistantMessage) and event.text:
                        print(f"<<< {event.text}")
                    elif isinstance(event, ev.TurnEnd):
                        return

            async with parent.events() as stream, trio.open_nursery() as nursery:
                nursery.start_soon(show, stream)
                await parent.run("What changed, and what is broken?")

            assert [s.status for s in harness.tasks.list(parent)] == ["completed"]
            assert harness.agents.list() == [parent]  # every child was disposed
            children = [h for h in await harness.sessions.stored() if h.parent_session == parent.id]
            print(f"stored child sessions of {parent.id[:8]}:")
            for header in children:
                print(f"    {header.id[:8]} parent_session={str(header.parent_session)[:8]}")
            assert len(children) == 2
            assert len(child_model.requests) == 2


if __name__ == "__main__":
    trio.run(main)
