"""Quickstart: open a harness, create an agent, prompt it, stream the answer.

What it shows:

* :func:`trio_harness.open_harness` with a model provider (here the offline
  :class:`~trio_harness.ScriptedModel`; pass ``model="deepseek:deepseek-chat"``
  for the real thing) and the default in-memory session store;
* ``harness.agents.open()``: an agent bound to an ``async with`` block;
* ``await agent.run(text)``: a prompt that starts a new turn, awaited to the
  end of that turn; it returns the final text and the turn's usage;
* ``async with agent.events() as stream``: every event appended to the session
  log, read by a task of our own, so the answer can be printed chunk by chunk
  (``assistant/chunk`` events) while the model is still streaming (a reader
  that falls behind gets counted gaps; the agent never waits for it);
* the resulting event log.

Run it with ``python examples/quickstart.py``; no network is needed.
"""

from __future__ import annotations

import trio

from trio_harness import ScriptedModel, open_harness
from trio_harness import events as ev
from trio_harness.agents import EventStream

ANSWER = (
    "Trio is a Python library for async concurrency built on structured concurrency: "
    "every task lives in a nursery, and a nursery does not exit before its tasks do."
)


async def main() -> None:
    # One scripted response: a final answer, streamed in six chunks.
    model = ScriptedModel([{"text": ANSWER}], chunks=6)
    async with open_harness(model=model) as harness, harness.agents.open() as agent:
        print(f"agent {agent.id} is {agent.status}")

        async def show(stream: EventStream) -> None:
            async for event in stream:
                if isinstance(event, ev.AssistantChunk) and event.kind == "text":
                    print(f"  chunk: {event.text!r}")
                elif isinstance(event, ev.TurnStart):
                    print(f"turn {event.turn} started")
                elif isinstance(event, ev.TurnEnd):
                    return  # the prompt's turn is over

        async with agent.events() as stream, trio.open_nursery() as nursery:
            nursery.start_soon(show, stream)
            result = await agent.run("What is Trio?")

        assert result.text == ANSWER
        print(f"answer: {result.text}")
        print(f"turn {result.turn}: {result.usage.requests} model request(s)")
        print(f"agent is {agent.status} again; the session log holds:")
        for event in agent.session.events:
            print(f"  {event.seq:2} {event.type}")
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
    # Leaving the blocks disposed the agent and closed every harness service.
    print("harness closed")


if __name__ == "__main__":
    trio.run(main)
