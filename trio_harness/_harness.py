"""The harness root: services started in dependency order, stopped in reverse.

``open_harness()`` opens a root scope and one child scope per service, in the
order they depend on each other::

    harness (root scope)
      sessions   the session registry (flushes and detaches what is left, last)
      bash       the bash executor (kills every process group it started)
      tasks      the task service (cancels and awaits every live task)
      plugins    tool plugins (task tools, bash, subagent, yours)
      mcp        harness-wide MCP servers (only with ``mcp_servers=``), a child scope each
      agents     the agent factory; every agent scope is a child of it

Child scopes close newest first, so on exit every agent is disposed first
(its turn closed, its owned tasks stopped, its session flushed), then the
MCP servers stop, then the plugins unload, then unowned tasks stop, then processes are killed, and the
session registry closes last (then the store's own service, if it has one).

Each service is given the few services it uses (the agent registry the
session registry and the bus; the agent factory the bus, the shared tool set,
the agent registry and the default model; each tool plugin its services), never the :class:`Harness`:
the harness is the top of the stack, built once every service is open
(docs/architecture.rst, "Layers").
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import attrs

from ._bus import EventBus
from ._construct import NoPublicConstructor
from ._errors import SessionStoreError
from ._scope import DEFAULT_TEARDOWN_TIMEOUT, LoadedPlugin, Plugin, Scope, open_scope
from ._telemetry import open_telemetry
from .agents._approval import Approver
from .agents._durability import Durability, check_durability
from .agents._factory import ReactLoopFactory
from .agents._registry import AgentRegistry
from .agents._tools import ToolSet
from .bash._executor import BashExecutor, open_bash_executor
from .bash._options import BashRuntimeOptions
from .model._protocol import ModelProvider, ModelSettings
from .model._spec import open_model
from .session._jsonl import JsonlStore
from .session._persistence import MemoryStore, SessionStore
from .session._registry import SessionRegistry
from .tasks._options import TaskRuntimeOptions
from .tasks._service import TaskService, open_task_service
from .tools._bash import BashToolOptions, BashToolPlugin
from .tools._files import FileToolOptions, FileToolsPlugin
from .tools._mcp import McpConnection, connect_mcp_servers
from .tools._mcp_config import McpServerConfig, with_env_policy
from .tools._plan import PlanToolPlugin
from .tools._subagent import SubagentOptions, SubagentToolPlugin
from .tools._tasks import TaskToolOptions, TaskToolsPlugin

if TYPE_CHECKING:
    from opentelemetry.metrics import MeterProvider
    from opentelemetry.trace import TracerProvider

_O = TypeVar(
    "_O", BashRuntimeOptions, TaskRuntimeOptions, TaskToolOptions, SubagentOptions, BashToolOptions, FileToolOptions
)


def _option_record(kind: type[_O], value: _O | None, parameter: str) -> _O:
    """``value`` (a ``kind`` record, or None for the defaults), or a TypeError naming ``kind``."""
    if value is None:
        return kind()
    if not isinstance(value, kind):
        raise TypeError(
            f"{parameter} must be a {kind.__name__} record ({parameter}={kind.__name__}(...)), "
            f"got {type(value).__name__}"
        )
    return value


def resolve_store(store: SessionStore | str | os.PathLike[str]) -> SessionStore:
    """Turn ``":memory:"``, a directory path, a ``postgresql://`` URL or a store object into a store.

    Raises:
        SessionStoreError: a ``postgresql://`` URL that cannot be parsed, or
            the PostgreSQL driver is not installed (``trio-harness[postgres]``).
        TypeError: ``store`` is none of these.
    """
    if isinstance(store, str) and store.startswith(("postgresql://", "postgres://")):
        from .session._postgres import PostgresStore

        return PostgresStore(store)
    if isinstance(store, str | os.PathLike):
        if os.fspath(store) == ":memory:":
            return MemoryStore()
        return JsonlStore(Path(store))
    missing = [
        name
        for name in ("check", "exists", "list", "load", "open_writer", "resume", "save")
        if not callable(getattr(store, name, None))
    ]
    if missing:
        raise TypeError(
            f"store must be ':memory:', a directory path or a session store; {store!r} has no {', '.join(missing)}"
        )
    return store


def _store_service(persistence: SessionStore) -> AbstractAsyncContextManager[object]:
    """The store's own service (a PostgreSQL store's heartbeats and listener), or nothing.

    A provider with an ``open_service()`` method is opened for as long as it is
    used; opening it again while it is open is allowed (the outermost opening
    owns it).
    """
    open_service: Callable[[], AbstractAsyncContextManager[object]] | None = getattr(persistence, "open_service", None)
    if open_service is None:
        return contextlib.nullcontext()
    return open_service()


@asynccontextmanager
async def open_store(store: SessionStore | str | os.PathLike[str]) -> AsyncIterator[SessionStore]:
    """Resolve and check a store, and keep it open for the block (no harness).

    The command line's ``sessions list|show`` read stores this way.

    Raises:
        SessionStoreError: the store cannot be used (see :func:`resolve_store`
            and ``check()``).
    """
    persistence = resolve_store(store)
    await persistence.check()
    async with _store_service(persistence):
        yield persistence


@attrs.frozen(eq=False, repr=False)
class Harness(metaclass=NoPublicConstructor, public_way="open_harness()"):
    """The root of a running harness.  Obtain one from :func:`open_harness`.

    Every service is open when the harness is made; none of them holds the
    harness (each was given the services it uses).

    Attributes:
        scope: the root scope.
        bus: live notifications (``session/*``, ``agent/*``, ``task/*``).
        sessions: the session registry (the live sessions, over the store).
        agents: the agent registry service.
        tasks: the background task service.
        bash: the bash executor service.
        tools: harness-wide tools and prompt sections.
        model: the default model provider (None if not configured).
        plugins_scope: the scope tool plugins are loaded into.
        mcp_connections: the harness-wide MCP servers (``mcp_servers=``), connected.
    """

    scope: Scope
    bus: EventBus
    sessions: SessionRegistry
    agents: AgentRegistry
    tasks: TaskService
    bash: BashExecutor
    tools: ToolSet
    model: ModelProvider | None
    plugins_scope: Scope
    # Filled once the servers are connected, before the harness is handed out.
    _mcp_connections: list[McpConnection] = attrs.field(factory=list, alias="_mcp_connections")

    @property
    def mcp_connections(self) -> tuple[McpConnection, ...]:
        """The harness-wide MCP server connections, in configuration order."""
        return tuple(self._mcp_connections)

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
    store: SessionStore | str | os.PathLike[str] = ":memory:",
    builtin_tools: bool | Sequence[str] = True,
    clock: Callable[[], float] = time.time,
    teardown_timeout: float = DEFAULT_TEARDOWN_TIMEOUT,
    bash_options: BashRuntimeOptions | None = None,
    task_options: TaskRuntimeOptions | None = None,
    task_tool_options: TaskToolOptions | None = None,
    subagent_options: SubagentOptions | None = None,
    approver: Approver | None = None,
    bash_tool_options: BashToolOptions | None = None,
    mcp_servers: Sequence[McpServerConfig] = (),
    model_settings: ModelSettings | None = None,
    builtin_loop: bool = True,
    durability: Durability = "step",
    file_tool_options: FileToolOptions | None = None,
    tracer_provider: TracerProvider | None = None,
    meter_provider: MeterProvider | None = None,
) -> AsyncIterator[Harness]:
    """Open a harness; every service stops (in reverse order) when the block exits.

    The five settings arguments each take their record whole
    (``bash_options=BashRuntimeOptions(grace_period=0.5)``), or None for its defaults.

    Args:
        model: the default model: a provider object or a spec string
            (``scripted:PATH``, ``deepseek:MODEL``, ``openai:MODEL@BASE_URL``).
        store: ``":memory:"``, a directory for the JSONL store, a
            ``postgresql://`` URL for the PostgreSQL store, or a
            :class:`~trio_harness.session.SessionStore`; checked at once
            (:exc:`SessionStoreError` when it cannot be written).  A store
            with a service of its own
            (:class:`~trio_harness.session.PostgresStore`) is opened
            before the services start and closed after the sessions are
            detached.
        builtin_tools: load the built-in tool plugins (``"tasks"``, ``"bash"``,
            ``"subagent"``, ``"files"``: ``read_file``, ``write_file``,
            ``edit_file``; ``"plan"``: the ``todo_write`` tool): True for all,
            False for none, or a list of names.
        clock: wall clock for event timestamps (injectable for tests).
        teardown_timeout: bound, in seconds of Trio time, on each teardown
            step (an agent's disposal waiting for its tasks, the task
            service's exit); a task still live after it is force-settled
            ``failed`` and reported as ``task/done``.
        bash_options: settings of the bash executor (:class:`~trio_harness.bash.BashRuntimeOptions`).
        task_options: settings of the task service (:class:`~trio_harness.tasks.TaskRuntimeOptions`).
        task_tool_options: settings of the task tools plugin
            (:class:`~trio_harness.tools.TaskToolOptions`).
        subagent_options: settings of the subagent tool plugin
            (:class:`~trio_harness.tools.SubagentOptions`).
        approver: asked before every call of a tool that requires approval
            (``bash`` by default), for every agent whose options name no
            approver of their own (:doc:`/approval`).  None (the default):
            such calls are denied, with a message saying how to allow them;
            :func:`~trio_harness.allow_all` runs them all without asking.
        bash_tool_options: settings of the ``bash`` tool plugin
            (:class:`~trio_harness.tools.BashToolOptions`): whether commands
            require approval, and the command prefixes that never ask.
        mcp_servers: MCP servers whose tools every agent gets
            (:class:`~trio_harness.McpStdioServer`, :class:`~trio_harness.McpHttpServer`,
            or :func:`~trio_harness.load_mcp_config` of a file), started at once
            in the harness's ``mcp`` scope and stopped after every agent
            (docs/mcp.rst).
        model_settings: model settings for every agent of the harness
            (:class:`~trio_harness.ModelSettings`); an agent's
            (``AgentOptions.model_settings``) and a turn's
            (``followup(text, settings=...)``) win over them, field by field.
        builtin_loop: fill the agent factory slot with the default loop
            (:class:`~trio_harness.agents.ReactLoopFactory`).  False leaves it
            empty for a loop of your own: an
            :class:`~trio_harness.agents.AgentFactory` registered with
            ``harness.agents.register_factory(factory, scope)``, typically from
            a plugin's ``apply`` so that unloading the plugin disposes its
            agents (docs/architecture.rst, "The public surface").  Until one is
            registered, creating an agent raises :exc:`~trio_harness.FactoryError`.
        durability: when the turns' events reach the store, for every agent
            whose options name no policy (``AgentOptions.durability``):
            ``"step"`` (the default: checkpoints before each model request,
            tool call and approval wait and at each step end, written without
            waiting for the disk, and the turn end synced), ``"sync"`` (every
            checkpoint waits for the disk) or ``"turn"`` (only the turn end
            is stored).  docs/sessions.rst, "Durability", says what each can
            lose to a kill -9 and to a power cut.
        file_tool_options: settings of the file tools plugin
            (:class:`~trio_harness.tools.FileToolOptions`): whether writes
            require approval (they do by default, like ``bash``), and the
            byte limits (docs/tools.rst, "File tools").
        tracer_provider: where the OpenTelemetry spans go (:doc:`/tracing`);
            None takes the global provider.  Without the OpenTelemetry API
            (the ``otel`` extra) or with no SDK configured, nothing is traced
            and nothing is added to the agents' work.
        meter_provider: where the OpenTelemetry metrics go; None takes the global provider.

    Raises:
        TypeError: a settings argument is not its record.
        ValueError: ``durability`` names no policy.
        McpConfigError: two MCP servers have the same name.
        McpStartError: an MCP server could not be started (the message names
            it and why); every service was stopped again.
        SessionStoreError: at exit, when a session was closed with events its
            store did not take (every service still stopped).  When the block
            itself raised, its error propagates with a note naming them.
    """
    if isinstance(teardown_timeout, bool) or not isinstance(teardown_timeout, int | float) or not teardown_timeout > 0:
        raise ValueError(f"teardown_timeout must be a positive number of seconds, got {teardown_timeout!r}")
    if model_settings is not None and not isinstance(model_settings, ModelSettings):
        raise TypeError(f"model_settings must be a ModelSettings, got {type(model_settings).__name__}")
    durability = check_durability(durability)
    bash_settings = _option_record(BashRuntimeOptions, bash_options, "bash_options")
    task_settings = _option_record(TaskRuntimeOptions, task_options, "task_options")
    task_tool_settings = _option_record(TaskToolOptions, task_tool_options, "task_tool_options")
    subagent_settings = _option_record(SubagentOptions, subagent_options, "subagent_options")
    bash_tool_settings = _option_record(BashToolOptions, bash_tool_options, "bash_tool_options")
    file_tool_settings = _option_record(FileToolOptions, file_tool_options, "file_tool_options")
    if approver is not None and not callable(approver):
        raise TypeError(f"approver must be an async callable or None, got {type(approver).__name__}")
    persistence = resolve_store(store)
    await persistence.check()  # a store path that is a file or not writable fails here, not at a flush
    if builtin_tools is True:
        wanted = {"tasks", "bash", "subagent", "files", "plan"}
    elif builtin_tools is False:
        wanted = set()
    else:
        wanted = set(builtin_tools)
        unknown = wanted - {"tasks", "bash", "subagent", "files", "plan"}
        if unknown:
            raise ValueError(
                f"unknown built-in tools {sorted(unknown)}; choose from bash, files, plan, subagent, tasks"
            )

    servers = tuple(mcp_servers)
    bus = EventBus()
    sessions = SessionRegistry(persistence=persistence, bus=bus, clock=clock)
    tools = ToolSet()
    async with (
        _reporting_unstored(sessions),
        _store_service(persistence),
        open_scope("harness", teardown_timeout=teardown_timeout) as root,
    ):
        # A provider built from a spec is held by the root scope: closed after every child scope.
        provider = None if model is None else await root.enter_async_context(open_model(model))

        sessions_scope = await root.open_child("sessions")
        sessions_scope.add_exit_callback(sessions.detach_all)
        bash_scope = await root.open_child("bash")
        # The variable the model's key came from stays out of commands and MCP servers (docs/bash.rst, "Environment").
        key_env = getattr(provider, "api_key_env", None)
        env_policy = bash_settings.env_policy.hiding([key_env] if isinstance(key_env, str) and key_env else [])
        # The sandbox hides the store's root: other sessions' transcripts (docs/sandbox.rst).
        store_root = persistence.root if isinstance(persistence, JsonlStore) else None
        bash_settings = attrs.evolve(bash_settings, env_policy=env_policy)
        bash = await bash_scope.enter_async_context(open_bash_executor(bash_settings, session_root=store_root))
        tasks_scope = await root.open_child("tasks")
        if task_settings.teardown_timeout is None:
            task_settings = attrs.evolve(task_settings, teardown_timeout=teardown_timeout)
        tasks = await tasks_scope.enter_async_context(open_task_service(task_settings))
        tasks.on_task_done(lambda snapshot: bus.emit("task/done", snapshot), scope=tasks_scope)
        plugins_scope = await root.open_child("plugins")
        # Opened (when there are servers) before the agents' scope, so it closes after
        # every agent: their calls end first.
        mcp_scope = await root.open_child("mcp") if servers else None
        agents_scope = await root.open_child("agents")
        agents = AgentRegistry(sessions=sessions, bus=bus)
        mcp_connections: list[McpConnection] = []
        if builtin_loop:
            factory = ReactLoopFactory(
                bus=bus,
                tools=tools,
                agents=agents,
                model=provider,
                approver=approver,
                model_settings=model_settings,
                durability=durability,
            )
            agents.register_factory(factory, agents_scope)
        telemetry = open_telemetry(
            bus=bus,
            agents=agents,
            tasks=tasks,
            mcp_connections=mcp_connections,
            tracer_provider=tracer_provider,
            meter_provider=meter_provider,
        )
        if telemetry is not None:  # stops once every agent is disposed (their turns are ended)
            sessions_scope.add_exit_callback(telemetry.close)
        harness = Harness._create(
            scope=root,
            bus=bus,
            sessions=sessions,
            agents=agents,
            tasks=tasks,
            bash=bash,
            tools=tools,
            model=provider,
            plugins_scope=plugins_scope,
            _mcp_connections=mcp_connections,
        )

        if "tasks" in wanted:
            await harness.load(TaskToolsPlugin(tasks, tools, task_tool_settings, bus=bus))
        if "bash" in wanted:
            await harness.load(BashToolPlugin(bash, tasks, tools, bash_tool_settings))
        if "subagent" in wanted:
            await harness.load(SubagentToolPlugin(tasks, tools, subagent_settings, agents=agents))
        if "files" in wanted:
            await harness.load(FileToolsPlugin(tools, bash, file_tool_settings, store_root=store_root))
        if "plan" in wanted:
            await harness.load(PlanToolPlugin(tools))
        if mcp_scope is not None:
            servers = with_env_policy(servers, env_policy)
            harness._mcp_connections.extend(await connect_mcp_servers(mcp_scope, tools, servers, bus=bus))
        yield harness


@asynccontextmanager
async def _reporting_unstored(sessions: SessionRegistry) -> AsyncIterator[None]:
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
