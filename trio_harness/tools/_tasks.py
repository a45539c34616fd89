"""The model-facing task controller: ``task_output``, ``task_list``, ``task_kill`` and notices.

:func:`task_tools` builds the three kind-independent tools over a
:class:`~trio_harness.tasks.TaskService`; :class:`TaskToolsPlugin` registers
them with the background-task guidance, attaches itself as the service's task
controller and delivers completion notices to the exact owning agent, all
bound to the plugin's scope.  Unloading or reloading the plugin removes only
these contributions: the tasks themselves live in the service.
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, ClassVar, Protocol, runtime_checkable

import attrs
import trio

from .._errors import TaskError, TaskNotFoundError
from ..agents._inbox import new_message_id
from ..agents._tools import Tool, ToolContext, ToolHandler, ToolOutput, ToolSet
from ..session._events import InboxMessage
from ..tasks._render import (
    TASKS_GUIDANCE,
    bound_text,
    render_kill_result,
    render_notice,
    render_task_list,
    render_task_output,
)
from ..tasks._service import TaskService
from ..tasks._types import TaskOwner, TaskSnapshot
from ._lost_tasks import report_lost_tasks

if TYPE_CHECKING:
    from .._bus import EventBus, Notice
    from .._scope import Scope


log = logging.getLogger("trio_harness.tasks")

DEFAULT_WAIT = 30.0
"""Seconds ``task_output(wait=true)`` waits when no ``timeout_ms`` is given."""

MAX_WAIT = 300.0
"""The longest wait ``task_output`` grants, in seconds."""


@runtime_checkable
class NoticeTarget(Protocol):
    """What a task owner must offer to receive completion notices (an Agent does)."""

    @property
    def id(self) -> str:
        """The owner's session id."""
        ...

    @property
    def scope(self) -> Scope:
        """The owner's scope (no notice is delivered once it is closing)."""
        ...

    @property
    def status(self) -> str:
        """``"idle"`` or ``"running"``."""
        ...

    def followup(self, message: str | InboxMessage) -> str:
        """Queue a message for a new turn, waking the owner.

        Notices arrive as :class:`~trio_harness.events.InboxMessage` objects
        with ``origin="task-notice"``.
        """
        ...

    def inject(self, message: str | InboxMessage) -> str:
        """Queue a message for the next step without waking the owner (a notice, as for ``followup``)."""
        ...


def effective_limit(*limits: int | None) -> int | None:
    """The strictest of the given byte limits (None means unlimited)."""
    present = [limit for limit in limits if limit is not None]
    return min(present) if present else None


def _check_wait(default_wait: float, max_wait: float) -> None:
    if not (max_wait >= 0 and default_wait >= 0):
        raise ValueError(f"default_wait and max_wait must be >= 0, got {default_wait!r} and {max_wait!r}")


def _check_limit(limit: int | None) -> None:
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit <= 0):
        raise ValueError(f"output_limit_bytes must be a positive integer or None, got {limit!r}")


class _InvalidArguments(dict[str, Any]):
    """Arguments that failed validation, handed on so the handler words the error within the byte limit.

    JSON decoding only ever produces plain dicts, so a model cannot forge one.
    """

    def __init__(self, message: str) -> None:
        super().__init__()
        self.message = message


class _BoundedTool(Tool):
    """A tool with a byte limit: its argument errors reach the handler instead of the driver.

    The driver words a validation error itself (``error: <message>``) without
    knowing the tool's limit; this tool hands the message to its handler,
    which returns the same text cut to the limit.
    """

    __slots__ = ()

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse and validate; a failure becomes :class:`_InvalidArguments` rather than ``ValueError``."""
        try:
            return super().validate(arguments)
        except ValueError as exc:
            return _InvalidArguments(str(exc))


def task_tools(tasks: TaskService, options: TaskToolOptions | None = None) -> list[Tool]:
    """Build the ``task_output``, ``task_list`` and ``task_kill`` tools.

    The calling agent (``ctx.agent``) is the caller for authorization: it sees
    and controls only the tasks it owns.

    Args:
        tasks: the task service.
        options: the tools' settings (:class:`TaskToolOptions`; None for the
            defaults): its ``default_wait`` (capped by ``max_wait``) is used
            when a ``task_output(wait=true)`` call gives no ``timeout_ms``; its
            ``output_limit_bytes`` is combined with each task's own (the
            stricter wins).  Its notice settings are not used here.

    Returns:
        The three tools, in the order output, list, kill.  With a limit, every
        result (argument errors included) stays within it.

    Raises:
        ValueError: a wait is negative or NaN, or the limit is not positive.
    """
    if options is None:
        options = TaskToolOptions()
    default_wait, max_wait, output_limit_bytes = options.default_wait, options.max_wait, options.output_limit_bytes
    _check_wait(default_wait, max_wait)
    _check_limit(output_limit_bytes)
    default = min(default_wait, max_wait)

    def error(message: str, limit: int | None = None) -> ToolOutput:
        return ToolOutput(bound_text(message, effective_limit(limit, output_limit_bytes)), is_error=True)

    def task_limit(task_id: str, caller: TaskOwner) -> int | None:
        try:
            return tasks.get(task_id, caller=caller).output_limit_bytes
        except TaskNotFoundError:
            return None

    async def task_output(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        task_id = str(args["task_id"])
        try:
            if args.get("wait", False):
                timeout_ms = args.get("timeout_ms")
                timeout = default if timeout_ms is None else min(max(int(timeout_ms), 0) / 1000, max_wait)
                await tasks.wait(task_id, timeout, caller=ctx.agent)
            read = tasks.read(task_id, caller=ctx.agent)
        except TaskNotFoundError as exc:
            return error(str(exc))
        except TaskError as exc:
            return error(str(exc), task_limit(task_id, ctx.agent))
        limit = effective_limit(read.snapshot.output_limit_bytes, output_limit_bytes)
        return render_task_output(read, limit)

    async def task_list(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        return bound_text(render_task_list(tasks.list(caller=ctx.agent)), output_limit_bytes)

    async def task_kill(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        task_id = str(args["task_id"])
        reason = args.get("reason")
        try:
            snapshot = await tasks.kill(task_id, caller=ctx.agent, reason=None if reason is None else str(reason))
        except TaskNotFoundError as exc:
            return error(str(exc))
        except TaskError as exc:
            return error(str(exc), task_limit(task_id, ctx.agent))
        limit = effective_limit(snapshot.output_limit_bytes, output_limit_bytes)
        return render_kill_result(snapshot, limit)

    def make(name: str, description: str, parameters: dict[str, Any], handler: ToolHandler) -> Tool:
        if output_limit_bytes is None:
            return Tool(name=name, description=description, parameters=parameters, handler=handler)

        async def checked(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
            if isinstance(args, _InvalidArguments):
                return error(f"error: {args.message}")  # the driver's wording, within the limit
            return await handler(ctx, args)

        return _BoundedTool(name=name, description=description, parameters=parameters, handler=checked)

    wait_help = f"default {default:g} s, at most {max_wait:g} s"
    task_id_schema = {"type": "string", "description": 'The task id, e.g. "bash-3".'}
    return [
        make(
            name="task_output",
            description=(
                "Read the output of a background task. Stream tasks (such as bash) return only "
                "the output produced since your previous read; final-output tasks (such as "
                "subagents) return their result once they have ended. The result always ends "
                "with [status: ...]. Non-blocking unless wait is true; then it waits until the "
                f"task ends or timeout_ms passes ({wait_help}). A wait that times out reports "
                "the task as still running and does not stop it."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "task_id": task_id_schema,
                    "wait": {
                        "type": "boolean",
                        "description": "Wait for the task to end before reading (default false).",
                    },
                    "timeout_ms": {
                        "type": "integer",
                        "minimum": 0,
                        "description": f"How long to wait, in milliseconds ({wait_help}).",
                    },
                },
                "required": ["task_id"],
            },
            handler=task_output,
        ),
        make(
            name="task_list",
            description=("List your background tasks, one per line as <id> [<kind>] <status> — <label>."),
            parameters={"type": "object", "properties": {}},
            handler=task_list,
        ),
        make(
            name="task_kill",
            description=(
                "Stop a background task whose work no longer matters. Reports the task's "
                "status; a task that has already ended keeps its status."
            ),
            parameters={
                "type": "object",
                "properties": {
                    "task_id": task_id_schema,
                    "reason": {
                        "type": "string",
                        "description": "Why the task is stopped (logged and passed to the task).",
                    },
                },
                "required": ["task_id"],
            },
            handler=task_kill,
        ),
    ]


@attrs.define(eq=False)
class _Notifier:
    """The completion listener of one applied :class:`TaskToolsPlugin`."""

    tasks: TaskService
    output_limit_bytes: int | None
    quiet: bool
    wake_budget: int
    wake_window: float
    # Recent wake times per exact owner object: id(owner) -> (owner, times).
    _wakes: dict[int, tuple[object, deque[float]]] = attrs.field(factory=dict, init=False)

    def _take_wake(self, owner: object) -> bool:
        """Spend one wake of ``owner``'s budget if any is left in the window."""
        now = trio.current_time()
        horizon = now - self.wake_window
        for key, (_, times) in tuple(self._wakes.items()):
            while times and times[0] <= horizon:
                times.popleft()
            if not times:
                del self._wakes[key]
        entry = self._wakes.get(id(owner))
        if entry is None or entry[0] is not owner:
            entry = (owner, deque())
            self._wakes[id(owner)] = entry
        times = entry[1]
        if len(times) >= self.wake_budget:
            return False
        times.append(now)
        return True

    def __call__(self, snapshot: TaskSnapshot) -> None:
        if snapshot.owner_id is None or snapshot.reported or snapshot.owner_disposed:
            return
        owner = self.tasks.owner_of(snapshot.id)
        if owner is None or not isinstance(owner, NoticeTarget) or owner.scope.closing:
            return
        if not self.tasks.claim_report(snapshot.id):
            return  # another reader or controller delivered it first
        limit = effective_limit(snapshot.output_limit_bytes, self.output_limit_bytes)
        text = render_notice(snapshot, limit)
        try:
            # Logged as what it is (origin task-notice): the model reads it as
            # user text, front ends show it as the agent's (docs/tasks.rst).
            if not self.quiet and owner.status == "idle" and self._take_wake(owner):
                owner.followup(InboxMessage(id=new_message_id(), text=text, mode="followup", origin="task-notice"))
            else:
                owner.inject(InboxMessage(id=new_message_id(), text=text, mode="inject", origin="task-notice"))
        except Exception:
            log.warning("could not deliver the completion notice of task %s", snapshot.id, exc_info=True)


@attrs.frozen
class TaskToolOptions:
    """Settings of the model-facing task tools (``task_output``, ``task_list``,
    ``task_kill``) and completion notices (:class:`TaskToolsPlugin`;
    :func:`~trio_harness.open_harness` takes them as ``task_tool_options=``).
    The task service itself has its own, :class:`~trio_harness.tasks.TaskRuntimeOptions`.

    Attributes:
        default_wait: seconds ``task_output(wait=true)`` waits by default.
        max_wait: the longest wait a call may ask for, in seconds.
        output_limit_bytes: a byte cap on every tool result and notice.
        quiet: only inject notices (never wake an idle owner).
        wake_budget: how many notices may wake one owner per ``wake_window``
            seconds (Trio time); past the budget notices are injected.
        wake_window: the budget window, in seconds.
    """

    default_wait: float = DEFAULT_WAIT
    max_wait: float = MAX_WAIT
    output_limit_bytes: int | None = None
    quiet: bool = False
    wake_budget: int = 3
    wake_window: float = 60.0


@attrs.define(eq=False)
class TaskToolsPlugin:
    """The task controller plugin: tools, guidance and completion notices.

    Load it into a scope (``await scope.load(TaskToolsPlugin(tasks, tools))``);
    everything it registers unwinds with that scope, and no task is affected.

    Attributes:
        name: ``"task-tools"`` (also the controller name it attaches).
        tasks: the task service to control.
        tools: the tool set to register into (normally the harness-wide one).
        options: the tools' settings (:class:`TaskToolOptions`), checked here
            (a bad value raises :exc:`ValueError`).
        bus: the harness's bus (``harness.bus``), or None.  With it, an agent
            that resumes a session learns of the background tasks its earlier
            run started and never reported: they become ``lost`` tasks and it
            gets a notice for each (docs/tasks.rst, "After a restart").
            :func:`~trio_harness.open_harness` passes it.
    """

    name: ClassVar[str] = "task-tools"

    tasks: TaskService
    tools: ToolSet
    options: TaskToolOptions = attrs.field(
        factory=TaskToolOptions, validator=attrs.validators.instance_of(TaskToolOptions)
    )
    bus: EventBus | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        _check_wait(self.options.default_wait, self.options.max_wait)
        _check_limit(self.options.output_limit_bytes)
        if self.options.wake_budget < 0 or not self.options.wake_window >= 0:
            raise ValueError("wake_budget and wake_window must be >= 0")

    async def apply(self, scope: Scope) -> None:
        """Register the tools, the guidance, the controller and the notice listener in ``scope``."""
        for tool in task_tools(self.tasks, self.options):
            self.tools.add(tool, scope=scope)
        self.tools.add_prompt_section(TASKS_GUIDANCE, scope=scope)
        detach: Callable[[], None] = self.tasks.attach_controller(self.name)
        try:
            scope.add_exit_callback(detach)
        except BaseException:
            detach()
            raise
        notifier = _Notifier(
            tasks=self.tasks,
            output_limit_bytes=self.options.output_limit_bytes,
            quiet=self.options.quiet,
            wake_budget=self.options.wake_budget,
            wake_window=self.options.wake_window,
        )
        self.tasks.on_task_done(notifier, scope=scope)
        if self.bus is not None:
            limit = self.options.output_limit_bytes

            def on_session_start(notice: Notice) -> None:
                agent = notice.subject
                if notice.data.get("source") == "resume" and isinstance(agent, NoticeTarget):
                    report_lost_tasks(self.tasks, agent, limit)

            scope.add_exit_callback(self.bus.on("agent/session-start", on_session_start))
