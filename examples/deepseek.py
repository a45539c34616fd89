"""A real model when a key is available: ``deepseek:deepseek-chat``, else the scripted model.

What it shows:

* turning a model spec string into a provider with
  :func:`trio_harness.model.resolve_model` (defined in
  ``trio_harness.model._spec``; the same strings the CLI's ``--model SPEC``
  and ``open_harness(model="...")`` accept);
* the DeepSeek route needs ``DEEPSEEK_API_KEY``: when it is set this example
  talks to DeepSeek's API, otherwise it falls back to the offline scripted
  model, and it prints which one it used;
* ``await agent.run(prompt)``, with the answer streamed to the terminal as it
  arrives by a task reading ``agent.events()``; cancelling ``run()`` (here
  after 45 s) cancels its turn;
* closing the HTTP provider's connection pool when done (``aclose()``).

Try it with ``DEEPSEEK_API_KEY=sk-... python examples/deepseek.py``.
"""

from __future__ import annotations

import contextlib
import os

import trio

from trio_harness import ModelProvider, RunError, ScriptedModel, open_harness
from trio_harness import events as ev
from trio_harness.agents import EventStream
from trio_harness.model import OpenAIProvider, resolve_model

SPEC = "deepseek:deepseek-chat"
PROMPT = "In two sentences: what is structured concurrency?"


def choose_model() -> tuple[ModelProvider, str]:
    if os.environ.get("DEEPSEEK_API_KEY", "").strip():
        return resolve_model(SPEC), f"{SPEC} (DEEPSEEK_API_KEY is set)"
    scripted = ScriptedModel(
        [
            {
                "text": "Structured concurrency ties every concurrent task to a block of code "
                "that cannot finish before its tasks do. Errors and cancellation therefore "
                "flow along the program's structure, and nothing is left running by accident."
            }
        ],
        chunks=8,
    )
    return scripted, "the scripted model (DEEPSEEK_API_KEY is not set; offline)"


async def main() -> None:
    provider, description = choose_model()
    print(f"model: {description}")
    try:
        async with (
            open_harness(model=provider, builtin_tools=False) as harness,
            harness.agents.open() as agent,
        ):

            async def show(stream: EventStream) -> None:
                async for event in stream:
                    if isinstance(event, ev.AssistantChunk) and event.kind == "text":
                        print(event.text, end="", flush=True)
                    elif isinstance(event, ev.TurnEnd):
                        return

            print(f"> {PROMPT}")
            async with agent.events() as stream, trio.open_nursery() as nursery:
                nursery.start_soon(show, stream)
                with trio.move_on_after(45):  # cancelling run() cancels its turn
                    with contextlib.suppress(RunError):  # the turn did not complete: its end says how
                        await agent.run(PROMPT)
            await agent.when_idle()
            print()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd)
            print(f"[turn ended: {end.reason}" + (f", {end.failure.message}]" if end.failure else "]"))
            if isinstance(provider, ScriptedModel):
                assert end.reason == "completed"
    finally:
        if isinstance(provider, OpenAIProvider):
            await provider.aclose()


if __name__ == "__main__":
    trio.run(main)
