"""open_harness: services start in dependency order and stop in reverse."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_harness import (
    BashRuntimeOptions,
    ScriptedModel,
    SubagentOptions,
    TaskRuntimeOptions,
    TaskToolOptions,
    open_harness,
)
from trio_harness._bus import Notice
from trio_harness.agents import ToolSet
from trio_harness.bash import open_bash_executor
from trio_harness.tasks import TaskHooks, TaskOutcome, TaskSpec, open_task_service
from trio_harness.tools import BashToolPlugin, SubagentToolPlugin, TaskToolsPlugin


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


# ---------------------------------------------------------------- settings records


async def test_settings_records_configure_each_service_and_plugin() -> None:
    async with open_harness(
        model=ScriptedModel([]),
        teardown_timeout=7,
        bash_options=BashRuntimeOptions(grace_period=0.5, max_timeout=60.0),
        task_options=TaskRuntimeOptions(finished_cap=4),
        task_tool_options=TaskToolOptions(quiet=True, output_limit_bytes=500),
        subagent_options=SubagentOptions(max_depth=1, child_tools=["task_list"]),
    ) as h:
        assert (h.bash.grace_period, h.bash.max_timeout, h.bash.tail_bytes) == (0.5, 60.0, 64 * 1024)
        assert (h.tasks.finished_cap, h.tasks.teardown_timeout) == (4, 7)  # None: the harness's timeout
        plugins = {name: loaded.plugin for name, loaded in h.plugins_scope.plugins.items()}
        task_tools, subagent = plugins["task-tools"], plugins["subagent"]
        assert isinstance(task_tools, TaskToolsPlugin) and isinstance(subagent, SubagentToolPlugin)
        assert (task_tools.quiet, task_tools.output_limit_bytes, task_tools.wake_budget) == (True, 500, 3)
        assert (subagent.max_depth, subagent.child_tools, subagent.tasks) == (1, ["task_list"], h.tasks)
        assert isinstance(plugins["bash"], BashToolPlugin) and plugins["bash"].bash is h.bash
    async with open_harness(builtin_tools=False, task_options=TaskRuntimeOptions(teardown_timeout=2.5)) as h:
        assert h.tasks.teardown_timeout == 2.5


async def test_settings_given_as_dicts_are_converted() -> None:
    async with open_harness(bash_options={"grace_period": 0.25}, task_options={"per_owner_cap": 2}) as h:
        assert (h.bash.grace_period, h.tasks.per_owner_cap) == (0.25, 2)


@pytest.mark.parametrize(
    ("parameter", "kind"),
    [
        ("bash_options", "BashRuntimeOptions"),
        ("task_options", "TaskRuntimeOptions"),
        ("task_tool_options", "TaskToolOptions"),
        ("subagent_options", "SubagentOptions"),
    ],
)
async def test_an_unknown_setting_is_refused_by_name_before_anything_opens(
    parameter: str, kind: str, tmp_path: Path
) -> None:
    store = tmp_path / "store"
    unknown: dict[str, Any] = {parameter: {"colour": "blue"}}
    with pytest.raises(TypeError, match=rf"{parameter} has unknown option 'colour'; {kind} takes \w+"):
        async with open_harness(store=store, **unknown):
            pass  # pragma: no cover
    assert not store.exists()  # refused before the store was even checked
    wrong: dict[str, Any] = {parameter: ["grace_period"]}
    with pytest.raises(TypeError, match=rf"{parameter} must be a {kind} \(or a dict of its fields\), got list"):
        async with open_harness(**wrong):
            pass  # pragma: no cover


def _defaults(fn: Callable[..., object], skip: tuple[str, ...] = ()) -> dict[str, object]:
    parameters = inspect.signature(fn).parameters.values()
    return {p.name: p.default for p in parameters if p.kind is p.KEYWORD_ONLY and p.name not in skip}


def test_settings_records_match_what_they_configure() -> None:
    """Each record has the fields and defaults of the function or plugin it configures (no drift)."""
    # session_root is the harness's to pass (its store's root), not a setting.
    assert attrs.asdict(BashRuntimeOptions(), recurse=False) == _defaults(open_bash_executor, skip=("session_root",))
    assert attrs.asdict(TaskRuntimeOptions()) == {**_defaults(open_task_service), "teardown_timeout": None}
    unset: Any = None  # the services are not settings
    plugins = (
        (TaskToolOptions(), TaskToolsPlugin(unset, ToolSet())),
        (SubagentOptions(), SubagentToolPlugin(unset, ToolSet())),
    )
    for record, plugin in plugins:
        settings = attrs.asdict(plugin, recurse=False)
        del settings["tasks"], settings["tools"]
        assert attrs.asdict(record, recurse=False) == settings
