"""Tools from typed functions: ``@tool`` derives the schema, validates and converts arguments.

What it shows:

* ``@tool`` on an ``async def``: the name, the description and the parameters
  schema come from the signature and the docstring (no hand-written schema);
* a ``Literal`` and an ``Enum`` parameter, an attrs class as a parameter and as
  a return value (the model reads it as JSON);
* a first parameter annotated :class:`~trio_harness.ToolContext` receives the
  call's context and is not offered to the model;
* a plain ``def`` running in a worker thread (``@tool(thread=True)``);
* arguments that do not match the types never reach the function: the model
  gets an error result naming the problem, reads it and corrects itself.

Offline: the scripted model decides from the request it receives, like a real
model would.
"""

from __future__ import annotations

import enum
import hashlib
import json
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import trio

from trio_harness import Agent, ScriptedModel, ToolContext, ToolOutput, open_harness, tool
from trio_harness import events as ev
from trio_harness.model import ModelRequest, ToolMessage

TEMPERATURES = {"paris": 18.0, "oslo": 7.0, "lima": 22.0}


class Unit(enum.Enum):
    """A temperature unit."""

    CELSIUS = "celsius"
    FAHRENHEIT = "fahrenheit"


@attrs.frozen
class Reading:
    """A temperature reading.

    Attributes:
        value: the temperature.
        unit: its unit.
    """

    value: float
    unit: Unit = Unit.CELSIUS


@tool
async def get_temperature(ctx: ToolContext, city: str, detail: Literal["short", "long"] = "short") -> str | ToolOutput:
    """The current temperature in a city, in degrees Celsius.

    Args:
        city: a city name, e.g. "Paris".
        detail: how much to say.
    """
    key = city.strip().lower()
    if key not in TEMPERATURES:
        return ToolOutput(f"unknown city {city!r}; known cities: {', '.join(sorted(TEMPERATURES))}", is_error=True)
    text = f"{TEMPERATURES[key]:g} °C in {city}"
    return text if detail == "short" else f"{text} (turn {ctx.turn}, step {ctx.step}, call {ctx.call_id})"


@tool
def convert(reading: Reading, to: Unit) -> Reading:
    """Convert a temperature reading to another unit.

    Args:
        reading: the reading to convert.
        to: the unit wanted.
    """
    if reading.unit is to:
        return reading
    if to is Unit.FAHRENHEIT:
        return Reading(round(reading.value * 9 / 5 + 32, 1), to)
    return Reading(round((reading.value - 32) * 5 / 9, 1), to)


@tool(thread=True)
def fingerprint(text: str, algorithm: Literal["sha256", "blake2b"] = "sha256") -> dict[str, str]:
    """A hash of a text (computed in a worker thread: the event loop stays free).

    Args:
        text: the text to hash.
        algorithm: the hash function.
    """
    return {"algorithm": algorithm, "hex": hashlib.new(algorithm, text.encode()).hexdigest()[:16]}


def call(name: str, arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": name, "arguments": dict(arguments)}]}


def after_error(expected: str, then: dict[str, Any]) -> Callable[[ModelRequest], Mapping[str, Any]]:
    """A scripted response that checks the last tool result is the expected error, then corrects itself."""

    def respond(request: ModelRequest) -> Mapping[str, Any]:
        last = request.messages[-1]
        assert isinstance(last, ToolMessage) and last.is_error, last
        assert expected in last.content, last.content
        print(f"  model reads the error and corrects itself: {json.dumps(then)}")
        return then

    return respond


async def install_tools(agent: Agent) -> None:
    """``setup``: the tools are local to this agent and unwind with its scope."""
    for one in (get_temperature, convert, fingerprint):
        agent.tools.add(one, scope=agent.scope)


async def main() -> None:
    print("schema derived for convert:")
    print(" ", json.dumps(convert.parameters))
    model = ScriptedModel(
        [
            # 1. a wrong type and an unknown unit: refused before the function runs.
            call("convert", {"reading": {"value": "warm"}, "to": "kelvin"}),
            # 2. fixed; the function receives a Reading and a Unit member.
            after_error("do not match its schema", call("convert", {"reading": {"value": 18}, "to": "fahrenheit"})),
            # 3. a city the function does not know: its own error result.
            call("get_temperature", {"city": "Pariss"}),
            after_error("unknown city", call("get_temperature", {"city": "Paris", "detail": "long"})),
            call("fingerprint", {"text": "18 °C in Paris"}),
            {"text": "It is 18 °C (64.4 °F) in Paris right now."},
        ]
    )
    async with (
        open_harness(model=model, builtin_tools=False) as harness,
        harness.agents.open(setup=install_tools) as agent,
    ):
        offered = {one.name: one.spec for one in agent.tools.tools()}
        print("tools offered:", sorted(offered))
        print("get_temperature parameters:", sorted(offered["get_temperature"].parameters["properties"]))
        agent.followup("How warm is it in Paris, in Fahrenheit?")
        await agent.when_idle()

        print("tool results, in the order the model saw them:")
        results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        for result in results:
            print(f"  {'ERROR' if result.is_error else 'ok   '} {result.name}: {result.content}")
        assert [r.is_error for r in results] == [True, False, True, False, False]
        assert json.loads(results[1].content) == {"value": 64.4, "unit": "fahrenheit"}
        final = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)][-1]
        print(f"answer: {final.text}")
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
    # The decorated names are still the functions for plain code and tests.
    assert convert(Reading(64.4, Unit.FAHRENHEIT), Unit.CELSIUS) == Reading(18.0, Unit.CELSIUS)


if __name__ == "__main__":
    trio.run(main)
