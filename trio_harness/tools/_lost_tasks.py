"""Background tasks that died with their process, reported when their session is resumed.

A background task lives in the process that started it: the task service, its
output and its result are in memory, and the lifeline kills the harness's
processes when the harness dies.  The log records only what the model saw:
the tool result ``started background task <id>`` and, later, the report (a
completion notice, or a ``task_output`` / ``task_kill`` result that delivered
it).  A task started in a resumed session's log and never reported there was
run by an earlier run of the agent (an earlier process, or this one before the
agent was disposed, which stopped the agent's tasks): nothing in this process
runs it, and the log holds no pid to look for (a task of an earlier process
cannot run in this one), so it is lost by construction; except a task whose
work lives in the log itself, a background subagent (its child session), which
resumes in this process under the same id (tools/_resume_tasks.py).

:func:`report_lost_tasks` registers each such task with the service as
``lost`` (so ``task_output`` and ``task_list`` answer for its id) and injects
one completion notice saying so.  The notice is itself in the log (its inbox
splice), so the next resume registers the task again but does not repeat the
notice (docs/tasks.rst, "After a restart").
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING

import attrs

from .._errors import TaskStartError
from ..agents._inbox import new_message_id
from ..session._events import Event, InboxMessage, InboxSpliced, ToolCallRequested, ToolResult, UserMessage
from ..tasks._render import LOST_ERROR, parse_notice, parse_started, render_notice
from ..tasks._types import TERMINAL_STATUSES
from ._resume_tasks import resume_task

if TYPE_CHECKING:
    from ..tasks._service import TaskService
    from ._tasks import NoticeTarget

log = logging.getLogger("trio_harness.tasks")

_LABEL_ARGUMENTS = ("description", "command", "prompt")


@attrs.define
class StartedTask:
    """A task started in a session's log, and what the log says happened to it since.

    Attributes:
        task_id: the id the model was given.
        kind: the producer family (the id without its number).
        label: rebuilt from the starting call's arguments (``description``,
            ``command`` or the first line of ``prompt``), else the tool name.
        state: ``open`` (never reported), ``reported`` (a notice or a read
            delivered it) or ``lost`` (a lost notice or read already told the
            model).
        call_id: the id of the tool call that started it.
        arguments: that call's arguments (JSON text), as the log has them.
        turn: the turn of the call's result.
        step: the step of the call's result.
    """

    task_id: str
    kind: str
    label: str
    state: str = "open"
    call_id: str | None = None
    arguments: str | None = None
    turn: int | None = None
    step: int | None = None


def _label(name: str, arguments: str | None) -> str:
    try:
        parsed = json.loads(arguments) if arguments else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        for key in _LABEL_ARGUMENTS:
            value = parsed.get(key)
            if isinstance(value, str) and value.strip():
                return value.strip().splitlines()[0][:200]
    return name


def _argument_task_id(arguments: str | None) -> str | None:
    try:
        parsed = json.loads(arguments) if arguments else None
    except ValueError:
        return None
    value = parsed.get("task_id") if isinstance(parsed, dict) else None
    return value if isinstance(value, str) else None


def _read_status(content: str) -> str | None:
    """The status of a ``task_output`` / ``task_kill`` result (its last line ``[status: S...]``)."""
    last = content.rstrip("\n").rsplit("\n", 1)[-1]
    if not (last.startswith("[status: ") and last.endswith("]")):
        return None
    return last[len("[status: ") : -1].split(",", 1)[0]


def scan_tasks(events: Iterable[Event]) -> dict[str, StartedTask]:
    """Every task started in ``events`` (by id, the latest start of an id wins) and its state."""
    calls: dict[str, ToolCallRequested] = {}
    tasks: dict[str, StartedTask] = {}

    def mark(task_id: str | None, lost: bool) -> None:
        task = tasks.get(task_id) if task_id is not None else None
        if task is not None and task.state != "lost":
            task.state = "lost" if lost else "reported"

    for event in events:
        if isinstance(event, ToolCallRequested):
            calls[event.call_id] = event
        elif isinstance(event, ToolResult) and not event.is_error:
            call = calls.get(event.call_id)
            started = parse_started(event.content)
            if started is not None:
                kind = started.rsplit("-", 1)[0]
                arguments = call.arguments if call else None
                tasks[started] = StartedTask(
                    started,
                    kind,
                    _label(event.name, arguments),
                    "open",
                    event.call_id,
                    arguments,
                    event.turn,
                    event.step,
                )
            elif event.name in ("task_output", "task_kill") and call is not None:
                status = _read_status(event.content)
                # A kill reports the task whatever its status; a read only a terminal one.
                if event.name == "task_kill" or status in TERMINAL_STATUSES:
                    mark(_argument_task_id(call.arguments), status == "lost")
        elif isinstance(event, InboxSpliced | UserMessage):
            # A notice is in the log from its insertion into the inbox (claimed or not).
            messages = event.inserted if isinstance(event, InboxSpliced) else (event,)
            for message in messages:
                if message.origin == "task-notice" and (parsed := parse_notice(message.text)) is not None:
                    mark(*parsed)
    return tasks


def report_lost_tasks(tasks: TaskService, agent: NoticeTarget, output_limit_bytes: int | None = None) -> list[str]:
    """Register the resumed ``agent``'s unreported tasks as lost and notify it of the new ones.

    A task whose kind has a resumer (:func:`~._resume_tasks.add_resumer`: a
    background subagent) and that the log never reported resumes instead,
    under its id.  Every other task its log started and never reported becomes a ``lost`` task of
    the service; those the log has not yet told the model about get one
    injected completion notice each (it joins the agent's next turn: resuming
    never starts a turn by itself).  The ids of every task the log names are
    reserved, so new tasks do not reuse them.  Events a fork copied in from its
    parent (before the header's ``seed_length``) are not the agent's own tasks.

    Returns:
        The ids of the tasks notified now, in the order they were started.
    """
    session = getattr(agent, "session", None)
    if session is None:
        return []
    events = session.events[session.header.seed_length :]
    notified: list[str] = []
    for task in scan_tasks(events).values():
        tasks.reserve_id(task.task_id)
        if task.state == "reported":
            continue
        if task.state == "open" and resume_task(tasks, agent, task):
            continue  # it carries on in this process under its id (tools/_resume_tasks.py)
        try:
            snapshot = tasks.add_lost(agent, task.task_id, kind=task.kind, label=task.label, error=LOST_ERROR)
        except (TaskStartError, ValueError):
            log.warning("could not register the lost task %s of %s", task.task_id, agent.id, exc_info=True)
            continue
        if task.state == "lost":
            continue  # the log already told the model
        text = render_notice(snapshot, output_limit_bytes)
        try:
            agent.inject(InboxMessage(id=new_message_id(), text=text, mode="inject", origin="task-notice"))
        except Exception:
            log.warning("could not deliver the lost notice of task %s", task.task_id, exc_info=True)
            continue
        notified.append(task.task_id)
    return notified
