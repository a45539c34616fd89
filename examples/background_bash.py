"""Background bash: ``bash`` with ``run_in_background``, the task tools, a completion notice.

What it shows (the model is scripted, the commands are real):

* ``bash`` with ``run_in_background: true`` returns a task id (``bash-1``,
  ``bash-2``, ...) at once; the command runs in its own process group, owned
  by the calling agent;
* ``task_list`` lists the caller's tasks as ``<id> [<kind>] <status> — <label>``;
* ``task_output`` with ``wait: true`` waits for a task and returns its output
  followed by ``[status: completed, exit code 0]``;
* ``task_kill`` stops a task that no longer matters (SIGTERM to the group,
  SIGKILL after a grace period);
* a task that ends while the agent is idle, and that nobody read, produces a
  completion notice that wakes the agent for a new turn, in which the model
  collects the result with ``task_output``;
* the same runtime seen from the application: ``harness.tasks.list(agent)``.
"""

from __future__ import annotations

from typing import Any

import trio

from trio_harness import ScriptedModel, allow_all, open_harness
from trio_harness import events as ev
from trio_harness.agents import EventStream


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def bash_bg(command: str, description: str) -> dict[str, Any]:
    return call("bash", command=command, description=description, run_in_background=True)


async def main() -> None:
    model = ScriptedModel(
        [
            # turn 1: start three background commands (bash calls run one at a time)
            {
                "tool_calls": [
                    bash_bg("for i in 1 2 3; do echo tick $i; sleep 0.05; done", "count to three"),
                    bash_bg("sleep 60", "a server we will not need"),
                    bash_bg("sleep 0.5; echo build ok", "build the project"),
                ]
            },
            {"tool_calls": [call("task_list")]},
            {"tool_calls": [call("task_output", task_id="bash-1", wait=True, timeout_ms=5000)]},
            {"tool_calls": [call("task_kill", task_id="bash-2", reason="not needed")]},
            {"text": "Counted to three; the build is still running."},
            # turn 2: woken by the completion notice of bash-3
            {"tool_calls": [call("task_output", task_id="bash-3")]},
            {"text": "The build finished: build ok."},
        ]
    )
    # allow_all: every bash command runs unasked (without an approver they are denied; see approval.py).
    async with open_harness(model=model, approver=allow_all) as harness, harness.agents.open() as agent:
        shown = {1: trio.Event(), 2: trio.Event()}  # each turn's events are printed

        async def show(stream: EventStream) -> None:
            async for event in stream:
                if isinstance(event, ev.ToolCallRequested):
                    print(f">>> {event.name} {event.arguments}")
                elif isinstance(event, ev.ToolResult):
                    print("\n".join(f"    {line}" for line in event.content.splitlines()))
                elif isinstance(event, ev.UserMessage):
                    print(f"--- turn {event.turn}, {event.mode}: {event.text}")
                elif isinstance(event, ev.AssistantMessage) and event.text:
                    print(f"<<< {event.text}")
                elif isinstance(event, ev.TurnEnd):
                    shown[event.turn].set()
                    if event.turn == 2:
                        return

        async with agent.events() as stream, trio.open_nursery() as nursery:
            nursery.start_soon(show, stream)
            # followup + when_idle here: the listing below should see the build still running,
            # and run() first loads the price table (for the turn's cost), which takes a while.
            agent.followup("Count to three, build the project, and don't start the server.")
            await agent.when_idle()
            await shown[1].wait()
            print("turn 1 is over; the application sees:")
            for snapshot in harness.tasks.list(agent):
                print(f"    {snapshot.id}: {snapshot.status} {dict(snapshot.detail)}")

            # bash-3 is still running; when it ends, its notice wakes the idle agent
            # for a turn nobody prompted: the stream shows it too.
            with trio.fail_after(20):
                await shown[2].wait()
        await agent.when_idle()

        print("after turn 2:")
        for snapshot in harness.tasks.list(agent):
            print(f"    {snapshot.id}: {snapshot.status} {dict(snapshot.detail)}")
        statuses = {s.id: s.status for s in harness.tasks.list(agent)}
        assert statuses == {"bash-1": "completed", "bash-2": "killed", "bash-3": "completed"}
        notices = [e for e in agent.session.events if isinstance(e, ev.UserMessage) and e.turn == 2]
        assert len(notices) == 1 and 'task_output("bash-3")' in notices[0].text
    print("the agent was disposed: its tasks are gone with it, no process is left")


if __name__ == "__main__":
    trio.run(main)
