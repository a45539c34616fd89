"""Closing a log that died mid-turn, and finding where turns are open."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from ._events import (
    ApprovalDecided,
    ApprovalRequested,
    AssistantMessage,
    Event,
    StepEnd,
    StepStart,
    ToolResult,
    ToolStarted,
    TurnEnd,
    TurnStart,
)

INTERRUPTED_TOOL_RESULT = (
    "error: the tool call was interrupted while it was running (the process stopped): it may have had effects; "
    "check whether they happened before repeating the call (call id {call_id})"
)

NOT_STARTED_TOOL_RESULT = "error: not run: the process stopped before the tool call started"

INTERRUPTED_APPROVAL_RESULT = "error: not run: the process stopped while the call was waiting for approval"


def open_turn_at(events: Sequence[Event], boundary: int) -> int | None:
    """The number of the turn still open after ``events[:boundary]``, or None."""
    open_turn: int | None = None
    for event in events[:boundary]:
        if isinstance(event, TurnStart):
            open_turn = event.turn
        elif isinstance(event, TurnEnd):
            open_turn = None
    return open_turn


def unanswered_result(events: Sequence[Event], call_id: str) -> str:
    """The result of an unanswered call of the open (last) step: interrupted if it started, else not run.

    A call whose ``tool/started`` is in the step may have had effects: its
    result says so, naming the call id (the tool's idempotency key), so the
    model checks before repeating it.  Recovery never re-runs a call.
    """
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is ToolStarted and event.call_id == call_id:
            return INTERRUPTED_TOOL_RESULT.format(call_id=call_id)
        if type(event) is StepStart:
            break
    return NOT_STARTED_TOOL_RESULT


def closers_for(events: Sequence[Event]) -> list[tuple[type[Event], dict[str, Any]]]:
    """The events to append so that a log that died mid-turn is balanced again.

    Unanswered tool calls of the open step get error results (a call with
    ``tool/started``: interrupted while running, it may have had effects; one
    without: not run; :func:`unanswered_result`), the open step a
    ``step/end`` and the open turn a ``turn/end`` with reason ``interrupted``.
    A call that was still waiting for approval (``approval/requested`` without
    ``approval/decided``) first gets an ``approval/decided`` with outcome
    ``cancelled`` (source ``interrupted``), and its result says that it did not
    run (docs/approval.rst).

    Returns:
        ``(event class, fields)`` pairs to pass to :meth:`Session.append`, in order.
    """
    turn: int | None = None
    step: int | None = None
    pending: dict[str, str] = {}
    asking: set[str] = set()
    for event in events:
        if isinstance(event, TurnStart):
            turn, step, pending, asking = event.turn, None, {}, set()
        elif isinstance(event, StepStart):
            step, pending, asking = event.step, {}, set()
        elif isinstance(event, AssistantMessage):
            for call in event.tool_calls:
                pending[call.id] = call.name
        elif isinstance(event, ApprovalRequested):
            asking.add(event.call_id)
        elif isinstance(event, ApprovalDecided):
            asking.discard(event.call_id)
        elif isinstance(event, ToolResult):
            pending.pop(event.call_id, None)
        elif isinstance(event, StepEnd):
            step, pending, asking = None, {}, set()
        elif isinstance(event, TurnEnd):
            turn, step, pending, asking = None, None, {}, set()
    closers: list[tuple[type[Event], dict[str, Any]]] = []
    if turn is None:
        return closers
    if step is not None:
        for call_id, name in pending.items():
            where = {"turn": turn, "step": step, "call_id": call_id, "name": name}
            if call_id in asking:
                closers.append(
                    (
                        ApprovalDecided,
                        {
                            **where,
                            "outcome": "cancelled",
                            "source": "interrupted",
                            "message": "the process stopped while waiting for the decision",
                        },
                    )
                )
                content = INTERRUPTED_APPROVAL_RESULT
            else:
                content = unanswered_result(events, call_id)
            closers.append((ToolResult, {**where, "content": content, "is_error": True}))
        closers.append((StepEnd, {"turn": turn, "step": step}))
    closers.append((TurnEnd, {"turn": turn, "reason": "interrupted"}))
    return closers
