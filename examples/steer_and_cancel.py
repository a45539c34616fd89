"""Steering and cancelling a running agent: followup vs steer vs inject, and cancel.

What it shows, in four acts on one agent:

1. ``followup`` queues a prompt for a *new turn*; ``steer`` joins the *next step
   of the running turn* (here: after a slow tool call returns);
2. ``inject`` while idle does not wake the agent: the message parks in the
   inbox and joins the first step of whatever runs next;
3. ``cancel()`` aborts the running turn (``turn/end`` reason ``aborted``, cause
   ``user``) and drops every queued message;
4. ``cancel(keep_inbox=True)`` aborts only the running turn: queued messages
   stay parked, and run once a waking send (followup or steer) arrives.

Every step prints the inbox and, at the end, which turn and step claimed each
message.  The tool and the model wait on Trio events the script controls, so
the interleaving is exact.
"""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trio_harness import Agent, ScriptedModel, Tool, ToolContext, open_harness
from trio_harness import events as ev


def show_inbox(agent: Agent, when: str) -> None:
    turn = [m.text for m in agent.inbox.next_turn]
    step = [m.text for m in agent.inbox.next_step]
    print(f"  [{when}] status={agent.status} next-turn={turn} next-step={step}")


def turn_ends(agent: Agent) -> list[tuple[int, str, str | None]]:
    return [(e.turn, e.reason, e.cause) for e in agent.session.events if isinstance(e, ev.TurnEnd)]


async def main() -> None:
    tool_entered = trio.Event()
    tool_release = trio.Event()

    async def slow_work(ctx: ToolContext, args: dict[str, Any]) -> str:
        tool_entered.set()
        await tool_release.wait()
        return "draft written"

    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "write_draft", "arguments": {}}]},  # turn 1, step 1
            {"text": "Here is the report, in bullet points."},  # turn 1, step 2 (steered)
            {"text": "Summary: all good."},  # turn 2 (the followup)
            {"text": "It is 14:00 in your timezone."},  # turn 3 (inject + followup)
            {"hang": True},  # turn 4: cancelled
            {"hang": True},  # turn 5: cancelled with keep_inbox=True
            {"text": "Parked question answered."},  # turn 6
            {"text": "And the wake-up answered."},  # turn 7
        ]
    )
    async with open_harness(model=model, builtin_tools=False) as harness:
        harness.tools.add(Tool("write_draft", "Write a draft.", {"type": "object"}, slow_work))
        async with harness.agents.open() as agent:
            print("1. followup vs steer while a turn runs")
            agent.followup("Write a report.")
            await tool_entered.wait()  # turn 1 is inside its tool call
            agent.steer("Use bullet points.")  # joins turn 1, step 2
            agent.followup("Then summarize it.")  # becomes turn 2
            show_inbox(agent, "tool running")
            tool_release.set()
            await agent.when_idle()
            show_inbox(agent, "idle")

            print("2. inject while idle parks without waking")
            agent.inject("FYI: the user is in UTC+2.")
            await trio.testing.wait_all_tasks_blocked()
            show_inbox(agent, "after inject")
            assert agent.status == "idle" and len(model.requests) == 3
            agent.followup("What time is it?")  # wakes; step 1 claims the inject too
            await agent.when_idle()

            print("3. cancel() aborts the turn and drops queued work")
            agent.followup("A long job.")
            agent.followup("A queued question.")
            await trio.testing.wait_all_tasks_blocked()  # the model call hangs
            show_inbox(agent, "long job running")
            assert agent.cancel() is True
            await agent.when_idle()
            show_inbox(agent, "after cancel")
            assert len(agent.inbox) == 0

            print("4. cancel(keep_inbox=True) keeps queued work parked")
            agent.followup("Another long job.")
            agent.followup("A parked question.")
            await trio.testing.wait_all_tasks_blocked()
            agent.cancel(keep_inbox=True)
            await agent.when_idle()
            show_inbox(agent, "after cancel(keep_inbox=True)")
            assert [m.text for m in agent.inbox.next_turn] == ["A parked question."]
            agent.followup("Wake up.")  # the parked question runs first, then this
            await agent.when_idle()
            show_inbox(agent, "idle")

            print("who claimed what:")
            for event in agent.session.events:
                if isinstance(event, ev.UserMessage):
                    print(f"  turn {event.turn} step {event.step}: {event.mode:8} {event.text!r}")
            print("how each turn ended:")
            for turn, reason, cause in turn_ends(agent):
                print(f"  turn {turn}: {reason}" + (f" (cause: {cause})" if cause else ""))
            assert turn_ends(agent) == [
                (1, "completed", None),
                (2, "completed", None),
                (3, "completed", None),
                (4, "aborted", "user"),
                (5, "aborted", "user"),
                (6, "completed", None),
                (7, "completed", None),
            ]


if __name__ == "__main__":
    trio.run(main)
