"""Quickstart: open a harness, create an agent, prompt it, stream the answer.

What it shows:

* :func:`trio_harness.open_harness` with a model provider (here the offline
  :class:`~trio_harness.ScriptedModel`; pass ``model="deepseek:deepseek-chat"``
  for the real thing) and the default in-memory session store;
* ``harness.agents.open()``: an agent bound to an ``async with`` block;
* ``agent.followup(text)``: a prompt that starts a new turn;
* ``agent.session.observe(...)``: every event is appended to the session log
  as it happens, so the answer can be printed chunk by chunk
  (``assistant/chunk`` events) while the model is still streaming;
* ``await agent.when_idle()`` and the resulting event log.

Run it with ``python examples/quickstart.py``; no network is needed.
"""

from __future__ import annotations

import trio

from trio_harness import ScriptedModel, open_harness
from trio_harness import events as ev

ANSWER = (
    "Trio is a Python library for async concurrency built on structured concurrency: "
    "every task lives in a nursery, and a nursery does not exit before its tasks do."
)


async def main() -> None:
    # One scripted response: a final answer, streamed in six chunks.
    model = ScriptedModel([{"text": ANSWER}], chunks=6)
    async with open_harness(model=model) as harness, harness.agents.open() as agent:
        print(f"agent {agent.id} is {agent.status}")

        def on_event(event: ev.Event) -> None:
            # Called synchronously after every append to the session log.
            if isinstance(event, ev.AssistantChunk) and event.kind == "text":
                print(f"  chunk: {event.text!r}")

        stop_observing = agent.session.observe(on_event)
        message_id = agent.followup("What is Trio?")
        print(f"queued prompt {message_id}; agent is {agent.status}")
        await agent.when_idle()
        stop_observing()

        final = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)][-1]
        assert final.text == ANSWER
        print(f"answer: {final.text}")
        print(f"agent is {agent.status} again; the session log holds:")
        for event in agent.session.events:
            print(f"  {event.seq:2} {event.type}")
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
    # Leaving the blocks disposed the agent and closed every harness service.
    print("harness closed")


if __name__ == "__main__":
    trio.run(main)
