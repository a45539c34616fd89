"""The ``todo_write`` tool: the model keeps its plan, a list of entries with a status.

The model sends the whole list every time (``todos``: entries with
``content``, ``status`` ``pending`` / ``in_progress`` / ``completed`` and
``priority`` ``high`` / ``medium`` / ``low``); the list replaces the previous
one.  The plan lives in the log and nowhere else: it is the arguments of the
last successful ``todo_write`` call, so a resumed or loaded session has it
back with no state of its own (:func:`plan_of`, :func:`current_plan`).  The
ACP bridge sends it as a ``plan`` session update, live and on ``session/load``
(docs/acp.rst, "Plans"); ``trio-harness run`` prints it (docs/cli.rst).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

import attrs

from ..agents._tools import Tool, ToolContext, ToolOutput, ToolSet
from ..session import _events as ev

if TYPE_CHECKING:
    from .._scope import Scope
    from ..agents._agent import Agent

PLAN_TOOL: Final = "todo_write"
"""The model-facing name of the plan tool."""

PlanStatus = Literal["pending", "in_progress", "completed"]
PlanPriority = Literal["high", "medium", "low"]

_STATUSES: Final = ("pending", "in_progress", "completed")
_PRIORITIES: Final = ("high", "medium", "low")
MAX_ENTRIES: Final = 100
"""The most entries a plan may have."""
MAX_CONTENT: Final = 2000
"""The longest entry text, in characters."""

DESCRIPTION: Final = (
    "Keep your plan for the current task: send the WHOLE list of entries each time (it replaces the "
    "previous list). Each entry has content (what to do), status (pending, in_progress or completed) "
    "and priority (high, medium or low). Use it for work of several steps: write the plan first, mark "
    "one entry in_progress while you work on it, and completed as soon as it is done."
)


@attrs.frozen
class PlanEntry:
    """One entry of an agent's plan (the ``todo_write`` tool).

    Attributes:
        content: what the entry is about.
        status: ``pending``, ``in_progress`` or ``completed``.
        priority: ``high``, ``medium`` or ``low``.
    """

    content: str
    status: PlanStatus = "pending"
    priority: PlanPriority = "medium"


class PlanError(ValueError):
    """A ``todo_write`` call whose list is not a valid plan (the model is told what is wrong)."""


def parse_plan(args: object) -> tuple[PlanEntry, ...]:
    """The plan the arguments of a ``todo_write`` call give.

    Raises:
        PlanError: naming the first thing wrong with them.
    """
    todos = args.get("todos") if isinstance(args, dict) else None
    if not isinstance(todos, list):
        raise PlanError("todos must be a list of entries ({content, status, priority})")
    if len(todos) > MAX_ENTRIES:
        raise PlanError(f"a plan has at most {MAX_ENTRIES} entries, got {len(todos)}")
    entries: list[PlanEntry] = []
    for index, item in enumerate(todos):
        where = f"todos[{index}]"
        if not isinstance(item, dict):
            raise PlanError(f"{where} must be an object with content, status and priority")
        content = item.get("content")
        if not isinstance(content, str) or not content.strip():
            raise PlanError(f"{where}.content must be a non-empty string")
        if len(content) > MAX_CONTENT:
            raise PlanError(f"{where}.content is longer than {MAX_CONTENT} characters")
        status = item.get("status", "pending")
        if status not in _STATUSES:
            raise PlanError(f"{where}.status must be one of {', '.join(_STATUSES)}, got {status!r}")
        priority = item.get("priority", "medium")
        if priority not in _PRIORITIES:
            raise PlanError(f"{where}.priority must be one of {', '.join(_PRIORITIES)}, got {priority!r}")
        entries.append(PlanEntry(content=content.strip(), status=status, priority=priority))
    return tuple(entries)


def plan_from_call(arguments: str) -> tuple[PlanEntry, ...] | None:
    """The plan of a logged ``todo_write`` call's raw arguments (None when they are not a valid plan)."""
    try:
        return parse_plan(json.loads(arguments))
    except (ValueError, RecursionError):
        return None


def plan_result(event: ev.ToolResult, events: Sequence[ev.Event]) -> tuple[PlanEntry, ...] | None:
    """The plan a successful ``todo_write`` result (in ``events``) set, or None for any other event."""
    if event.name != PLAN_TOOL or event.is_error:
        return None
    for candidate in reversed(events[: event.seq]):  # seq is the index in the log
        if (
            isinstance(candidate, ev.ToolCallRequested)
            and candidate.call_id == event.call_id
            and candidate.turn == event.turn
        ):
            return plan_from_call(candidate.arguments)
    return None


def plan_of(events: Sequence[ev.Event]) -> tuple[PlanEntry, ...]:
    """The plan of a log: that of its last successful ``todo_write`` call (empty when there is none)."""
    for event in reversed(events):
        if isinstance(event, ev.ToolResult) and event.name == PLAN_TOOL and not event.is_error:
            plan = plan_result(event, events)
            if plan is not None:
                return plan
    return ()


def current_plan(agent: Agent) -> tuple[PlanEntry, ...]:
    """The plan ``agent`` keeps with ``todo_write`` (from its log: the same after a resume)."""
    return plan_of(agent.session.events)


_MARKS: Final = {"pending": "[ ]", "in_progress": "[~]", "completed": "[x]"}


def render_plan(entries: Sequence[PlanEntry]) -> str:
    """The plan as text, one entry a line (``[x] done``, ``[~] doing``, ``[ ] to do``)."""
    if not entries:
        return "(the plan is empty)"
    lines = []
    for entry in entries:
        priority = "" if entry.priority == "medium" else f" ({entry.priority})"
        lines.append(f"{_MARKS[entry.status]} {entry.content}{priority}")
    return "\n".join(lines)


@attrs.define(eq=False)
class PlanToolPlugin:
    """Registers the ``todo_write`` tool (``open_harness(builtin_tools=[..., "plan"])``).

    Attributes:
        tools: the tool set to register into.
    """

    name: ClassVar[str] = "plan"
    tools: ToolSet

    def tool(self) -> Tool:
        """The ``todo_write`` tool definition."""
        entry = {
            "type": "object",
            "properties": {
                "content": {"type": "string", "description": "What to do."},
                "status": {"type": "string", "enum": list(_STATUSES)},
                "priority": {"type": "string", "enum": list(_PRIORITIES)},
            },
            "required": ["content", "status", "priority"],
        }
        return Tool(
            name=PLAN_TOOL,
            description=DESCRIPTION,
            parameters={
                "type": "object",
                "properties": {"todos": {"type": "array", "items": entry, "description": "The whole plan."}},
                "required": ["todos"],
            },
            handler=self._call,
            requires_approval=False,
        )

    async def apply(self, scope: Scope) -> None:
        """Register the tool, bound to ``scope``."""
        self.tools.add(self.tool(), scope=scope)

    async def _call(self, ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        try:
            entries = parse_plan(args)
        except PlanError as exc:
            return ToolOutput(f"error: {exc}; the plan is unchanged", is_error=True)
        done = sum(entry.status == "completed" for entry in entries)
        return f"The plan is saved ({len(entries)} entries, {done} completed):\n{render_plan(entries)}"
