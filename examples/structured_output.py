"""Structured output: one prompt, a typed answer, validated and retried.

What it shows:

* ``await agent.run(prompt)``: send one prompt, wait for its turn, get the
  final text and the turn's usage;
* ``await agent.run(prompt, output=City)``: the answer must be JSON matching
  the attrs class ``City`` (any type a typed tool accepts works: TypedDict,
  dataclasses, pydantic models, ``list[...]`` ...).  The schema goes to the
  model (as OpenAI's ``response_format`` on a real endpoint, and in the
  system prompt); here the scripted model first answers in prose, then with a
  negative population, and each time the validation error is sent back in the
  same turn until the answer is valid;
* a type the answers never match: :class:`~trio_harness.OutputValidationError`
  after the retries, naming the type and the last error.

Run it with ``python examples/structured_output.py``; no network is needed.
"""

from __future__ import annotations

import attrs
import trio

from trio_harness import OutputValidationError, ScriptedModel, open_harness
from trio_harness import events as ev


@attrs.frozen
class City:
    """A city and how many people live there."""

    name: str
    population: int = attrs.field(validator=attrs.validators.ge(0))


async def main() -> None:
    model = ScriptedModel(
        [
            {"text": "Lyon is in France."},
            {"text": "Lyon has about half a million inhabitants."},
            {"text": '{"name": "Lyon", "population": -1}'},
            {"text": '{"name": "Lyon", "population": 520000}'},
            {"text": "I would rather not say."},
            {"text": "Still no."},
        ]
    )
    async with open_harness(model=model) as harness, harness.agents.open() as agent:
        plain = await agent.run("Where is Lyon?")
        print(f"text: {plain.output!r} ({plain.usage.requests} request, {plain.usage.total_tokens} tokens)")

        city = await agent.run("How many people live in Lyon?", output=City)
        assert city.output == City("Lyon", 520_000)
        print(f"typed answer: {city.output!r} after {city.usage.requests} requests")
        for event in agent.session.events:
            if isinstance(event, ev.UserMessage) and event.mode == "steer":
                print(f"  sent back: {event.text[:90]}...")
        print(f"schema sent: {model.requests[-1].output.schema if model.requests[-1].output else None}")

        try:
            await agent.run("And Paris?", output=City, retries=1)
        except OutputValidationError as exc:
            print(f"gave up: {exc}")


if __name__ == "__main__":
    trio.run(main)
