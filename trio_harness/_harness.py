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
"""

from __future__ import annotations

import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs

from ._bus import EventBus
from ._errors import SessionStoreError
from ._scope import DEFAULT_TEARDOWN_TIMEOUT, LoadedPlugin, Plugin, Scope, open_scope
from .agents._factory import ReactLoopFactory
from .agents._registry import AgentRegistry
from .agents._tools import ToolSet
from .model._protocol import ModelProvider
from .session._jsonl import JsonlPersistence
from .session._persistence import MemoryPersistence, SessionPersistence
from .session._store import SessionStore

if TYPE_CHECKING:
    from .bash import BashExecutor
    from .tasks import TaskService

__all__ = ["Harness", "open_harness", "resolve_store"]


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


@attrs.define(eq=False, repr=False)
class Harness:
    """The root of a running harness.  Obtain one from :func:`open_harness`.

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
    agents: AgentRegistry = attrs.field(init=False)
    tasks: TaskService = attrs.field(init=False)
    bash: BashExecutor = attrs.field(init=False)
    tools: ToolSet = attrs.field(factory=ToolSet)
    model: ModelProvider | None = None
    plugins_scope: Scope = attrs.field(init=False)

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
    bash_options: dict[str, Any] | None = None,
    task_options: dict[str, Any] | None = None,
    task_tool_options: dict[str, Any] | None = None,
    subagent_options: dict[str, Any] | None = None,
) -> AsyncIterator[Harness]:
    """Open a harness; every service stops (in reverse order) when the block exits.

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
        bash_options: keyword arguments for the bash executor.
        task_options: keyword arguments for the task service.
        task_tool_options: keyword arguments for the task tools plugin.
        subagent_options: keyword arguments for the subagent tool plugin.

    Raises:
        SessionStoreError: at exit, when a session was closed with events its
            store did not take (every service still stopped).  When the block
            itself raised, its error propagates with a note naming them.
    """
    from .bash import open_bash_executor
    from .model._spec import open_model
    from .tasks import open_task_service

    if isinstance(teardown_timeout, bool) or not isinstance(teardown_timeout, int | float) or not teardown_timeout > 0:
        raise ValueError(f"teardown_timeout must be a positive number of seconds, got {teardown_timeout!r}")
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
    async with _reporting_unstored(sessions), open_scope("harness", teardown_timeout=teardown_timeout) as root:
        # A provider built from a spec is held by the root scope: closed after every child scope.
        provider = None if model is None else await root.enter_async_context(open_model(model))
        harness = Harness(scope=root, bus=bus, sessions=sessions, model=provider)

        sessions_scope = await root.open_child("sessions")
        sessions_scope.add_exit_callback(sessions.detach_all)
        bash_scope = await root.open_child("bash")
        harness.bash = await bash_scope.enter_async_context(open_bash_executor(**(bash_options or {})))
        tasks_scope = await root.open_child("tasks")
        harness.tasks = await tasks_scope.enter_async_context(
            open_task_service(**{"teardown_timeout": teardown_timeout, **(task_options or {})})
        )
        harness.tasks.on_task_done(lambda snapshot: bus.emit("task/done", snapshot), scope=tasks_scope)
        harness.plugins_scope = await root.open_child("plugins")
        agents_scope = await root.open_child("agents")
        harness.agents = AgentRegistry(harness=harness, sessions=sessions, bus=bus)
        harness.agents.register_factory(ReactLoopFactory(), agents_scope)

        if "tasks" in wanted:
            from .tasks import TaskToolsPlugin

            await harness.load(TaskToolsPlugin(harness.tasks, harness.tools, **(task_tool_options or {})))
        if "bash" in wanted:
            from .bash import BashToolPlugin

            await harness.load(BashToolPlugin(harness))
        if "subagent" in wanted:
            from .agents._subagent import SubagentToolPlugin

            await harness.load(SubagentToolPlugin(harness, **(subagent_options or {})))
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
