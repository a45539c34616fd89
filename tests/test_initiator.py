"""The current initiator: a ContextVar isolated across concurrent Trio tasks."""

from __future__ import annotations

from typing import Any

import trio
import trio.testing

from trio_harness import (
    AgentOptions,
    ScriptedModel,
    Tool,
    ToolContext,
    current_initiator,
    with_initiator,
    without_initiator,
)
from trio_harness.testing import open_test_harness


async def test_with_and_without_restore_the_previous_value() -> None:
    assert current_initiator() is None
    with with_initiator("a"):
        assert current_initiator() == "a"
        with without_initiator():
            assert current_initiator() is None
            with with_initiator("b"):
                assert current_initiator() == "b"
            assert current_initiator() is None
        assert current_initiator() == "a"
    assert current_initiator() is None


async def test_concurrent_chains_are_isolated(autojump_clock: trio.testing.MockClock) -> None:
    seen: dict[str, list[str | None]] = {"x": [], "y": []}

    async def chain(name: str, delay: float) -> None:
        with with_initiator(name):
            for _ in range(3):
                await trio.sleep(delay)
                seen[name].append(current_initiator())

                async def child() -> None:
                    seen[name].append(current_initiator())  # inherited at spawn

                async with trio.open_nursery() as nursery:
                    nursery.start_soon(child)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(chain, "x", 1)
        nursery.start_soon(chain, "y", 1.5)
    assert seen == {"x": ["x"] * 6, "y": ["y"] * 6}
    assert current_initiator() is None


async def test_tool_calls_run_with_the_driving_agent_as_initiator() -> None:
    seen: list[str | None] = []

    async def who(ctx: ToolContext, args: dict[str, Any]) -> str:
        seen.append(current_initiator())
        return "ok"

    def script() -> ScriptedModel:
        return ScriptedModel([{"tool_calls": [{"name": "who", "arguments": {}}]}, {"text": "done"}])

    async with open_test_harness() as h:
        h.tools.add(Tool("who", "who", {"type": "object"}, who))
        one, two = AgentOptions(model=script()), AgentOptions(model=script())
        async with (
            h.agents.open(session_id="one", options=one) as first,
            h.agents.open(session_id="two", options=two) as second,
        ):
            first.followup("go")
            second.followup("go")
            await first.when_idle()
            await second.when_idle()
    assert sorted(s or "" for s in seen) == ["one", "two"]
    assert current_initiator() is None
