"""A tool-using agent: a custom Tool, JSON-schema validated arguments, self-correction.

What it shows:

* a :class:`~trio_harness.Tool` with a JSON schema for its arguments and an
  ``async`` handler receiving a :class:`~trio_harness.ToolContext`;
* installing it as a tool local to one agent, from the ``setup`` callback of
  ``harness.agents.open()`` (the agent's world is complete before it is
  published, and the tool unwinds with the agent's scope);
* arguments that do not match the schema never reach the handler: the model
  gets an error result naming the problem;
* a handler that returns ``ToolOutput(..., is_error=True)`` for a value it
  cannot handle;
* the model reading those errors in its next request and correcting itself
  (the scripted model here decides from the request it receives, like a real
  model would).
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from typing import Any

import trio

from trio_harness import Agent, ScriptedModel, Tool, ToolContext, ToolOutput, open_harness
from trio_harness import events as ev
from trio_harness.model import ModelRequest, ToolMessage

TEMPERATURES = {"paris": 18, "oslo": 7, "lima": 22}

SCHEMA = {
    "type": "object",
    "properties": {
        "city": {"type": "string", "description": "A city name, e.g. 'Paris'."},
        "units": {"type": "string", "enum": ["celsius", "fahrenheit"]},
    },
    "required": ["city"],
    "additionalProperties": False,
}


async def get_temperature(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
    """The handler: ``args`` has already been validated against SCHEMA."""
    city = args["city"].strip().lower()
    if city not in TEMPERATURES:
        known = ", ".join(sorted(TEMPERATURES))
        return ToolOutput(f"unknown city {args['city']!r}; known cities: {known}", is_error=True)
    celsius = TEMPERATURES[city]
    if args.get("units") == "fahrenheit":
        return f"{celsius * 9 / 5 + 32:.0f} °F in {args['city']} (turn {ctx.turn}, step {ctx.step})"
    return f"{celsius} °C in {args['city']} (turn {ctx.turn}, step {ctx.step})"


TOOL = Tool(
    name="get_temperature",
    description="The current temperature in a city.",
    parameters=SCHEMA,
    handler=get_temperature,
)


def call(arguments: Mapping[str, Any]) -> dict[str, Any]:
    return {"tool_calls": [{"name": "get_temperature", "arguments": dict(arguments)}]}


def correct_after_error(expected: str, then: Mapping[str, Any]) -> Callable[[ModelRequest], Mapping[str, Any]]:
    """A scripted response that checks the last tool result before answering."""

    def respond(request: ModelRequest) -> Mapping[str, Any]:
        last = request.messages[-1]
        assert isinstance(last, ToolMessage) and last.is_error, last
        assert expected in last.content, last.content
        print(f"  model reads the error and corrects itself: {json.dumps(dict(then))}")
        return call(then)

    return respond


async def install_tools(agent: Agent) -> None:
    """``setup``: runs before the agent is published; nothing can see it yet."""
    agent.tools.add(TOOL, scope=agent.scope)


async def main() -> None:
    model = ScriptedModel(
        [
            # 1. wrong type and a misspelt key: rejected by the schema.
            call({"city": 75001, "unit": "celsius"}),
            # 2. valid arguments, but the handler does not know the city.
            correct_after_error("do not match its schema", {"city": "Pariss"}),
            # 3. fixed.
            correct_after_error("unknown city", {"city": "Paris", "units": "celsius"}),
            {"text": "It is 18 °C in Paris right now."},
        ]
    )
    async with (
        open_harness(model=model, builtin_tools=False) as harness,
        harness.agents.open(setup=install_tools) as agent,
    ):
        print("tools offered:", [tool.name for tool in agent.tools.tools()])
        agent.followup("How warm is it in Paris?")
        await agent.when_idle()

        print("tool results, in the order the model saw them:")
        for event in agent.session.events:
            if isinstance(event, ev.ToolResult):
                flag = "ERROR" if event.is_error else "ok   "
                print(f"  {flag} {event.content}")
        results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        assert [r.is_error for r in results] == [True, True, False]
        final = [e for e in agent.session.events if isinstance(e, ev.AssistantMessage)][-1]
        print(f"answer: {final.text}")
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
        print(f"one turn, {len(model.requests)} model requests, ended {end.reason}")


if __name__ == "__main__":
    trio.run(main)
