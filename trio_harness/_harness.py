"""The harness root: services started in dependency order, stopped in reverse.

``open_harness()`` opens a root scope and one child scope per service, in the
order they depend on each other::

    harness (root scope)
      sessions   the session store (flushes and detaches what is left, last)
      bash       the bash executor (kills every process group it started)
      tasks      the task service (cancels and awaits every live task)
      plugins    tool plugins (task tools, bash, subagent, yours)
      agents     the agent factory; every agent scope is a child of it

Child scopes close newest first, so on exit every agent is disposed first
(its turn closed, its owned tasks stopped, its session flushed), then the
plugins unload, then unowned tasks stop, then processes are killed, and the
session store closes last.

Each service is given the few services it uses (the registry the store and
the bus; the agent factory the bus, the shared tool set, the registry and the
default model; each tool plugin its services), never the :class:`Harness`:
the harness is the top of the stack, built once every service is open
(docs/architecture.rst, "Layers").
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, TypeVar

import attrs

from ._bus import EventBus
from ._errors import SessionStoreError
from ._scope import DEFAULT_TEARDOWN_TIMEOUT, LoadedPlugin, Plugin, Scope, open_scope
from .agents._factory import ReactLoopFactory
from .agents._registry import AgentRegistry
from .agents._tools import ToolSet
from .bash._executor import BashExecutor, open_bash_executor
from .bash._options import BashOptions
from .model._protocol import ModelProvider, ModelSettings
from .session._jsonl import JsonlPersistence
from .session._persistence import MemoryPersistence, SessionPersistence
from .session._store import SessionStore
from .tasks._options import TaskOptions
from .tasks._service import TaskService, open_task_service
from .tools._bash import BashToolPlugin
from .tools._subagent import SubagentOptions, SubagentToolPlugin
from .tools._tasks import TaskToolOptions, TaskToolsPlugin

__all__ = ["Harness", "open_harness", "resolve_store"]

_O = TypeVar("_O", BashOptions, TaskOptions, TaskToolOptions, SubagentOptions)


def _option_record(kind: type[_O], value: _O | Mapping[str, Any] | None, parameter: str) -> _O:
    """``value`` as a ``kind`` record; a mapping (the older form) is converted, its keys checked."""
    if value is None:
        return kind()
    if isinstance(value, kind):
        return value
    if not isinstance(value, Mapping):
        raise TypeError(f"{parameter} must be a {kind.__name__} (or a dict of its fields), got {type(value).__name__}")
    known = [field.name for field in attrs.fields(kind)]
    unknown = sorted(str(key) for key in value if key not in known)
    if unknown:
        raise TypeError(
            f"{parameter} has unknown option{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}; "
            f"{kind.__name__} takes {', '.join(known)}"
        )
    return kind(**value)


def resolve_store(store: SessionPersistence | str | os.PathLike[str]) -> SessionPersistence:
    """Turn ``":memory:"``, a directory path or a persistence object into a provider."""
    if isinstance(store, str | os.PathLike):
        if os.fspath(store) == ":memory:":
            return MemoryPersistence()
        return JsonlPersistence(Path(store))
    missing = [
        name
        for name in ("check", "exists", "list", "load", "open_writer", "resume", "save")
        if not callable(getattr(store, name, None))
    ]
    if missing:
        raise TypeError(
            f"store must be ':memory:', a directory path or a session persistence provider; "
            f"{store!r} has no {', '.join(missing)}"
        )
    return store


@attrs.frozen(eq=False, repr=False)
class Harness:
    """The root of a running harness.  Obtain one from :func:`open_harness`.

    Every service is open when the harness is made; none of them holds the
    harness (each was given the services it uses).

    Attributes:
        scope: the root scope.
        bus: live notifications (``session/*``, ``agent/*``, ``task/*``).
        sessions: the session store service.
        agents: the agent registry service.
        tasks: the background task service.
        bash: the bash executor service.
        tools: harness-wide tools and prompt sections.
        model: the default model provider (None if not configured).
        plugins_scope: the scope tool plugins are loaded into.
    """

    scope: Scope
    bus: EventBus
    sessions: SessionStore
    agents: AgentRegistry
    tasks: TaskService
    bash: BashExecutor
    tools: ToolSet
    model: ModelProvider | None
    plugins_scope: Scope

    def __repr__(self) -> str:
        return f"<Harness agents={len(self.agents.list())} sessions={len(self.sessions.list())}>"

    async def load(self, plugin: Plugin) -> LoadedPlugin:
        """Load a plugin into the harness's plugin scope."""
        return await self.plugins_scope.load(plugin)

    async def unload(self, name: str) -> None:
        """Unload a plugin by name (its scope closes; its contributions unwind)."""
        await self.plugins_scope.unload(name)

    async def reload(self, plugin: Plugin) -> LoadedPlugin:
        """Unload the plugin of the same name, then load ``plugin``."""
        return await self.plugins_scope.reload(plugin)


@asynccontextmanager
async def open_harness(
    *,
    model: ModelProvider | str | None = None,
    store: SessionPersistence | str | os.PathLike[str] = ":memory:",
    builtin_tools: bool | Sequence[str] = True,
    clock: Callable[[], float] = time.time,
    teardown_timeout: float = DEFAULT_TEARDOWN_TIMEOUT,
    bash_options: BashOptions | Mapping[str, Any] | None = None,
    task_options: TaskOptions | Mapping[str, Any] | None = None,
    task_tool_options: TaskToolOptions | Mapping[str, Any] | None = None,
    subagent_options: SubagentOptions | Mapping[str, Any] | None = None,
    model_settings: ModelSettings | None = None,
) -> AsyncIterator[Harness]:
    """Open a harness; every service stops (in reverse order) when the block exits.

    The four settings arguments take their record (``bash_options=BashOptions(...)``)
    or, as before the records existed, a dict of the record's fields; a dict is
    converted here, and an unknown key raises :exc:`TypeError` naming it.

    Args:
        model: the default model: a provider object or a spec string
            (``scripted:PATH``, ``deepseek:MODEL``, ``openai:MODEL@BASE_URL``).
        store: ``":memory:"``, a directory for the JSONL store, or a provider;
            checked at once (:exc:`SessionStoreError` when it cannot be written).
        builtin_tools: load the built-in tool plugins (``"tasks"``, ``"bash"``,
            ``"subagent"``): True for all, False for none, or a list of names.
        clock: wall clock for event timestamps (injectable for tests).
        teardown_timeout: bound, in seconds of Trio time, on each teardown
            step (an agent's disposal waiting for its tasks, the task
            service's exit); a task still live after it is force-settled
            ``failed`` and reported as ``task/done``.
        bash_options: settings of the bash executor (:class:`~trio_harness.bash.BashOptions`).
        task_options: settings of the task service (:class:`~trio_harness.tasks.TaskOptions`).
        task_tool_options: settings of the task tools plugin
            (:class:`~trio_harness.tools.TaskToolOptions`).
        subagent_options: settings of the subagent tool plugin
            (:class:`~trio_harness.tools.SubagentOptions`).
        model_settings: model settings for every agent of the harness
            (:class:`~trio_harness.ModelSettings`); an agent's
            (``AgentOptions.model_settings``) and a turn's
            (``followup(text, settings=...)``) win over them, field by field.

    Raises:
        TypeError: a settings argument has an unknown key or the wrong type.
        SessionStoreError: at exit, when a session was closed with events its
            store did not take (every service still stopped).  When the block
            itself raised, its error propagates with a note naming them.
    """
    if isinstance(teardown_timeout, bool) or not isinstance(teardown_timeout, int | float) or not teardown_timeout > 0:
        raise ValueError(f"teardown_timeout must be a positive number of seconds, got {teardown_timeout!r}")
    if model_settings is not None and not isinstance(model_settings, ModelSettings):
        raise TypeError(f"model_settings must be a ModelSettings, got {type(model_settings).__name__}")
    bash_settings = _option_record(BashOptions, bash_options, "bash_options")
    task_settings = _option_record(TaskOptions, task_options, "task_options")
    task_tool_settings = _option_record(TaskToolOptions, task_tool_options, "task_tool_options")
    subagent_settings = _option_record(SubagentOptions, subagent_options, "subagent_options")
    provider: ModelProvider | None = None
    if isinstance(model, str):
        from .model._spec import resolve_model

        provider = resolve_model(model)
    elif model is not None:
        from .model._spec import resolve_model

        provider = resolve_model(model)  # checks it is a provider
    persistence = resolve_store(store)
    await persistence.check()  # a store path that is a file or not writable fails here, not at a flush
    if builtin_tools is True:
        wanted = {"tasks", "bash", "subagent"}
    elif builtin_tools is False:
        wanted = set()
    else:
        wanted = set(builtin_tools)
        unknown = wanted - {"tasks", "bash", "subagent"}
        if unknown:
            raise ValueError(f"unknown built-in tools {sorted(unknown)}; choose from bash, subagent, tasks")

    bus = EventBus()
    sessions = SessionStore(persistence=persistence, bus=bus, clock=clock)
    tools = ToolSet()
    async with _reporting_unstored(sessions), open_scope("harness", teardown_timeout=teardown_timeout) as root:
        if isinstance(model, str):
            # A provider we built from a spec is ours to close (its HTTP client), last.
            aclose = getattr(provider, "aclose", None)
            if aclose is not None:
                root.add_exit_callback(aclose)

        sessions_scope = await root.open_child("sessions")
        sessions_scope.add_exit_callback(sessions.detach_all)
        bash_scope = await root.open_child("bash")
        bash = await bash_scope.enter_async_context(open_bash_executor(**attrs.asdict(bash_settings, recurse=False)))
        tasks_scope = await root.open_child("tasks")
        task_kwargs = attrs.asdict(task_settings, recurse=False)
        if task_kwargs["teardown_timeout"] is None:
            task_kwargs["teardown_timeout"] = teardown_timeout
        tasks = await tasks_scope.enter_async_context(open_task_service(**task_kwargs))
        tasks.on_task_done(lambda snapshot: bus.emit("task/done", snapshot), scope=tasks_scope)
        plugins_scope = await root.open_child("plugins")
        agents_scope = await root.open_child("agents")
        agents = AgentRegistry(sessions=sessions, bus=bus)
        factory = ReactLoopFactory(bus=bus, tools=tools, agents=agents, model=provider, model_settings=model_settings)
        agents.register_factory(factory, agents_scope)
        harness = Harness(
            scope=root,
            bus=bus,
            sessions=sessions,
            agents=agents,
            tasks=tasks,
            bash=bash,
            tools=tools,
            model=provider,
            plugins_scope=plugins_scope,
        )

        if "tasks" in wanted:
            await harness.load(TaskToolsPlugin(tasks, tools, **attrs.asdict(task_tool_settings, recurse=False)))
        if "bash" in wanted:
            await harness.load(BashToolPlugin(bash, tasks, tools))
        if "subagent" in wanted:
            await harness.load(SubagentToolPlugin(tasks, tools, **attrs.asdict(subagent_settings, recurse=False)))
        yield harness


@asynccontextmanager
async def _reporting_unstored(sessions: SessionStore) -> AsyncIterator[None]:
    """Raise, once every service stopped, what the store could not take (docs/guarantees.rst)."""
    try:
        yield
    except BaseException as exc:
        # Do not hide the block's own error; name what was not stored beside it.
        for failure in sessions.take_unreported():
            exc.add_note(f"also: {failure}")
        raise
    failures = sessions.take_unreported()
    if len(failures) == 1:
        raise failures[0]
    if failures:
        error = SessionStoreError(
            f"{len(failures)} sessions were closed with events that could not be stored: "
            + "; ".join(str(failure) for failure in failures)
        )
        raise error from failures[0]
