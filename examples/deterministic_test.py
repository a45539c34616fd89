"""A deterministic test of an agent under Trio's ``MockClock`` with autojump.

What it shows:

* every timeout and delay in trio_harness uses Trio time, so under
  ``trio.testing.MockClock(autojump_threshold=0)`` a test that "waits" an hour
  finishes at once, and the virtual time at the end is exact;
* the scripted model's ``delay`` key (seconds of Trio time before answering),
  a tool that sleeps, and a ``trio.move_on_after`` bound all land on exact
  virtual instants;
* the injectable wall clock of ``open_harness(clock=...)``: here event
  timestamps follow the virtual clock, so the whole log is reproducible;
* checking the event log: the exact sequence of event types, a group of
  events whose order is not part of the contract, and the model order of
  tool results.

It runs as a script (``trio.run(..., clock=MockClock(autojump_threshold=0))``).
Under pytest the same body works as a pytest-trio test with the
``autojump_clock`` fixture, and :mod:`trio_harness.testing` offers the
``harness`` / ``scripted_model`` fixtures and ``assert_events`` /
``assert_balanced`` with readable mismatch messages (that module needs pytest,
which a plain run of this script does not have).
"""

from __future__ import annotations

import time
from typing import Any

import trio
import trio.testing

from trio_harness import ScriptedModel, Session, Tool, ToolContext, open_harness
from trio_harness import events as ev

EPOCH = 1_700_000_000.0
NOISE = {"assistant/chunk", "agent/inbox/spliced", "request/header"}


def event_types(session: Session) -> list[str]:
    return [event.type for event in session.events if event.type not in NOISE]


async def nap(ctx: ToolContext, args: dict[str, Any]) -> str:
    await trio.sleep(args["seconds"])
    return f"slept {args['seconds']} s"


NAP = Tool(
    "nap",
    "Sleep for a while.",
    {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
    nap,
)


async def test_agent_timeline() -> None:
    start = trio.current_time()
    model = ScriptedModel(
        [
            # step 1: think for 5 s, then call two naps (run concurrently)
            {
                "delay": 5,
                "tool_calls": [
                    {"name": "nap", "arguments": {"seconds": 3600}},
                    {"name": "nap", "arguments": {"seconds": 60}},
                ],
            },
            # step 2: think for 2 s, answer
            {"delay": 2, "text": "Rested."},
            # turn 2: a model call that never answers
            {"hang": True},
        ]
    )
    async with open_harness(
        model=model, store=":memory:", builtin_tools=False, clock=lambda: EPOCH + trio.current_time()
    ) as harness:
        harness.tools.add(NAP)
        async with harness.agents.open() as agent:
            agent.followup("Take a nap.")
            await agent.when_idle()
            elapsed = trio.current_time() - start
            print(f"turn 1 took {elapsed} s of virtual time")
            assert elapsed == 5 + 3600 + 2  # the naps overlapped

            types = event_types(agent.session)
            # Parallel calls: how their starts and results interleave is not part
            # of the contract, so compare that stretch as a multiset.
            assert types[:4] == ["turn/start", "step/start", "user/message", "assistant/message"]
            assert sorted(types[4:10]) == [
                "tool/call",
                "tool/call",
                "tool/result",
                "tool/result",
                "tool/started",
                "tool/started",
            ]
            assert types[10:] == ["step/end", "step/start", "assistant/message", "step/end", "turn/end"]
            results = [e.content for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert results == ["slept 3600 s", "slept 60 s"]  # model order, not finishing order
            end = agent.session.events[-1]
            assert end.ts == EPOCH + 3607  # the injected wall clock follows Trio time

            agent.followup("And now?")
            with trio.move_on_after(30):
                await agent.when_idle()  # the model hangs: we give up after 30 s
            assert agent.status == "running"
            agent.cancel()
            await agent.when_idle()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
            assert event_types(agent.session)[-5:] == [
                "turn/start",
                "step/start",
                "user/message",
                "step/end",
                "turn/end",
            ]
    total = trio.current_time() - start
    print(f"the test took {total} s of virtual time")
    assert total == 3607 + 30


def main() -> None:
    wall = time.perf_counter()
    trio.run(test_agent_timeline, clock=trio.testing.MockClock(autojump_threshold=0))
    print(f"...and {time.perf_counter() - wall:.2f} s of real time")


if __name__ == "__main__":
    main()
