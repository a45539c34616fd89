"""open_harness: services start in dependency order and stop in reverse."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import trio

from trio_harness import ScriptedModel, open_harness
from trio_harness._bus import Notice
from trio_harness.tasks import TaskHooks, TaskOutcome, TaskSpec


async def test_services_stop_in_reverse_dependency_order() -> None:
    order: list[str] = []
    async with open_harness(model=ScriptedModel([]), builtin_tools=["tasks"]) as h:
        names = [child.name for child in h.scope.children]
        assert names == ["harness/sessions", "harness/bash", "harness/tasks", "harness/plugins", "harness/agents"]

        def note(name: str) -> Callable[[], None]:
            return lambda: order.append(name)

        for child in h.scope.children:
            child.add_exit_callback(note(child.name))
        h.bus.on("agent/disposed", lambda n: order.append("agent/disposed"))
        h.bus.on("session/disposed", lambda n: order.append("session/disposed"))
        await h.agents.create()
        done = trio.Event()

        async def starter() -> TaskHooks:
            def cancel(reason: str | None) -> None:
                order.append("unowned task cancelled")
                done.set()

            async def finished() -> TaskOutcome:
                await done.wait()
                return TaskOutcome("killed")

            return TaskHooks(cancel=cancel, done=finished)

        await h.tasks.start(TaskSpec(kind="job", label="unowned", owner=None, run=starter))
    assert order == [
        "agent/disposed",
        "session/disposed",
        "harness/agents",
        "harness/plugins",
        "unowned task cancelled",
        "harness/tasks",
        "harness/bash",
        "harness/sessions",
    ]


async def test_the_block_exception_is_not_wrapped() -> None:
    with pytest.raises(KeyError, match="mine"):
        async with open_harness(model=ScriptedModel([]), builtin_tools=False):
            raise KeyError("mine")


async def test_unknown_builtin_tool_name_is_refused() -> None:
    with pytest.raises(ValueError, match="unknown built-in tools"):
        async with open_harness(builtin_tools=["bash", "teleport"]):
            pass  # pragma: no cover


async def test_task_done_is_published_on_the_bus() -> None:
    seen: list[Notice] = []
    async with open_harness(model=ScriptedModel([]), builtin_tools=["tasks"]) as h:
        h.bus.on("task/done", seen.append)

        async def starter() -> TaskHooks:
            async def finished() -> TaskOutcome:
                return TaskOutcome("completed", output="ok")

            return TaskHooks(cancel=lambda reason: None, done=finished)

        snapshot = await h.tasks.start(TaskSpec(kind="job", label="quick", owner=None, run=starter))
        await h.tasks.wait(snapshot.id, 5)
    assert [n.subject.id for n in seen] == [snapshot.id]


async def test_bad_store_and_model_objects_are_refused_clearly() -> None:
    from trio_harness import AgentOptions, ModelError

    with pytest.raises(TypeError, match="store must be"):
        async with open_harness(store=42, builtin_tools=False):  # type: ignore[arg-type]
            pass  # pragma: no cover
    with pytest.raises(ModelError, match="ModelProvider"):
        async with open_harness(model=object(), builtin_tools=False):  # type: ignore[arg-type]
            pass  # pragma: no cover
    async with open_harness(model=ScriptedModel([]), builtin_tools=False) as h:
        with pytest.raises(ModelError, match="ModelProvider"):
            await h.agents.create(options=AgentOptions(model=object()))  # type: ignore[arg-type]
        assert h.agents.list() == [] and h.sessions.list() == []
