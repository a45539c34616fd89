"""Paused turns: the calls a turn left waiting for approval, read from the log.

A turn cut off while a call waits for approval (the agent disposed, or the
process killed and its log closed on resume) ends ``paused``: the call keeps
its ``approval/requested`` without a decision and without a result, past the
``step/end`` and the ``turn/end``.  The next turn of the session is its
*continuation*: its first step answers those calls (asking the approver
again) before any model request (docs/approval.rst, "Paused approvals").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .._records import ToolCall
from ._events import (
    ApprovalDecided,
    ApprovalRequested,
    AssistantMessage,
    Event,
    StepEnd,
    StepStart,
    ToolResult,
    TurnEnd,
    TurnStart,
)

PAUSED_NOT_RUN_RESULT = (
    "error: the tool call was interrupted before it returned a result (the process stopped; it may have started)"
)

Closers = list[tuple[type[Event], dict[str, Any]]]


def unanswered_calls(events: Sequence[Event]) -> dict[str, ToolCall]:
    """The tool calls without a result, by id in the model's order, carried across paused turn ends."""
    pending: dict[str, ToolCall] = {}
    for event in events:
        if type(event) is AssistantMessage:
            for call in event.tool_calls:
                pending[call.id] = call
        elif type(event) is ToolResult:
            pending.pop(event.call_id, None)
        elif type(event) is TurnEnd and event.reason != "paused":
            pending.clear()
    return pending


def paused_calls(events: Sequence[Event]) -> tuple[ToolCall, ...]:
    """The calls the session's last turn left waiting, when it ended ``paused`` (else ``()``)."""
    for event in reversed(events):
        if type(event) is TurnStart:
            return ()
        if type(event) is TurnEnd:
            return tuple(unanswered_calls(events).values()) if event.reason == "paused" else ()
    return ()


def pause_closers(events: Sequence[Event], closers: Closers) -> Closers:
    """Recovery's closers, changed to end the turn ``paused`` when a call was waiting for approval.

    ``closers`` are those of :func:`~._recovery.closers_for` (the open
    step's unanswered calls answered, the step and the turn closed
    ``interrupted``).  When the open step has a call still waiting for
    approval (``approval/requested`` without ``approval/decided``), that call
    keeps no decision and no result and the turn ends ``paused``, as a live
    pause writes it.  Calls a paused turn carried into its continuation and
    left unanswered there get the interrupted result.
    """
    if not closers:
        return closers
    asking: set[str] = set()
    for event in events:
        if type(event) is ApprovalRequested:
            asking.add(event.call_id)
        elif type(event) is ApprovalDecided:
            asking.discard(event.call_id)
        elif type(event) is StepStart or type(event) is StepEnd or type(event) is TurnEnd:
            asking = set()
    carried = unanswered_calls(events)
    answered = {fields["call_id"] for cls, fields in closers if cls is ToolResult}
    out: Closers = []
    for cls, fields in closers:
        if cls is ApprovalDecided and fields["call_id"] in asking:
            continue
        if cls is ToolResult and fields["call_id"] in asking:
            continue
        if cls is StepEnd:
            for call_id, call in carried.items():
                if call_id not in asking and call_id not in answered:
                    where = {"turn": fields["turn"], "step": fields["step"], "call_id": call_id, "name": call.name}
                    out.append((ToolResult, {**where, "content": PAUSED_NOT_RUN_RESULT, "is_error": True}))
        if cls is TurnEnd and asking:
            fields = {**fields, "reason": "paused"}
        out.append((cls, fields))
    return out
