"""open_harness: services start in dependency order and stop in reverse."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio

from trio_harness import (
    BashRuntimeOptions,
    BashToolOptions,
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
    task_tool_options = TaskToolOptions(quiet=True, output_limit_bytes=500)
    subagent_options = SubagentOptions(max_depth=1, child_tools=["task_list"])
    bash_tool_options = BashToolOptions(requires_approval=False)
    async with open_harness(
        model=ScriptedModel([]),
        teardown_timeout=7,
        bash_options=BashRuntimeOptions(grace_period=0.5, max_timeout=60.0),
        task_options=TaskRuntimeOptions(finished_cap=4),
        task_tool_options=task_tool_options,
        subagent_options=subagent_options,
        bash_tool_options=bash_tool_options,
    ) as h:
        assert (h.bash.grace_period, h.bash.max_timeout, h.bash.tail_bytes) == (0.5, 60.0, 64 * 1024)
        assert (h.tasks.finished_cap, h.tasks.teardown_timeout) == (4, 7)  # None: the harness's timeout
        plugins = {name: loaded.plugin for name, loaded in h.plugins_scope.plugins.items()}
        task_tools, subagent, bash = plugins["task-tools"], plugins["subagent"], plugins["bash"]
        assert isinstance(task_tools, TaskToolsPlugin) and isinstance(subagent, SubagentToolPlugin)
        assert isinstance(bash, BashToolPlugin) and bash.bash is h.bash
        # Each record is handed on whole: one source of truth per setting.
        assert task_tools.options is task_tool_options and subagent.options is subagent_options
        assert bash.options is bash_tool_options and subagent.tasks is h.tasks
    async with open_harness(builtin_tools=False, task_options=TaskRuntimeOptions(teardown_timeout=2.5)) as h:
        assert h.tasks.teardown_timeout == 2.5


RECORDS = [
    ("bash_options", BashRuntimeOptions),
    ("task_options", TaskRuntimeOptions),
    ("task_tool_options", TaskToolOptions),
    ("subagent_options", SubagentOptions),
    ("bash_tool_options", BashToolOptions),
]


@pytest.mark.parametrize(("parameter", "kind"), RECORDS)
async def test_a_settings_dict_is_refused_naming_its_record_before_anything_opens(
    parameter: str, kind: type[Any], tmp_path: Path
) -> None:
    store = tmp_path / "store"
    field = attrs.fields(kind)[0]
    for wrong in ({field.name: field.default}, [field.name]):
        given: dict[str, Any] = {parameter: wrong}
        named = rf"{parameter} must be a {kind.__name__} record \({parameter}={kind.__name__}\(\.\.\.\)\), got"
        with pytest.raises(TypeError, match=named):
            async with open_harness(store=store, **given):
                pass  # pragma: no cover
        assert not store.exists()  # refused before the store was even checked


@pytest.mark.parametrize(
    ("open_runtime", "kind"), [(open_bash_executor, BashRuntimeOptions), (open_task_service, TaskRuntimeOptions)]
)
async def test_a_runtime_takes_its_settings_record_and_refuses_a_dict(
    open_runtime: Callable[..., AbstractAsyncContextManager[object]], kind: type[Any]
) -> None:
    parameters = inspect.signature(open_runtime).parameters.values()
    assert [p.name for p in parameters if p.kind is not p.KEYWORD_ONLY] == ["options"]
    with pytest.raises(TypeError, match=rf"options must be a {kind.__name__}, got dict"):
        async with open_runtime({}):
            pass  # pragma: no cover


_UNSET: Any = None  # the services a plugin is given are not settings


@pytest.mark.parametrize(
    ("make", "kind"),
    [
        (lambda options: TaskToolsPlugin(_UNSET, ToolSet(), options), TaskToolOptions),
        (lambda options: SubagentToolPlugin(_UNSET, ToolSet(), options), SubagentOptions),
        (lambda options: BashToolPlugin(_UNSET, _UNSET, ToolSet(), options), BashToolOptions),
    ],
)
def test_a_tool_plugin_takes_its_settings_record_and_refuses_a_dict(
    make: Callable[[Any], Any], kind: type[Any]
) -> None:
    record = kind()
    assert make(record).options is record
    with pytest.raises(TypeError, match=kind.__name__):
        make({})
