"""Assertions over session event logs."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Sequence
from typing import Any

from ..session import _events as ev
from ..session._session import Session

NOISE: frozenset[str] = frozenset({"assistant/chunk", "agent/inbox/spliced", "request/header", "request/retry"})
"""Event types most assertions want to ignore (pass as ``ignore=NOISE``)."""


class EventLogMismatch(AssertionError):
    """An event log did not match the expected sequence."""


def _events_of(log: Session | Iterable[ev.Event]) -> list[ev.Event]:
    return list(log.events if isinstance(log, Session) else log)


def event_types(log: Session | Iterable[ev.Event], *, ignore: Collection[str] = ()) -> list[str]:
    """The ``type`` of every event in ``log``, skipping the types in ``ignore``."""
    return [e.type for e in _events_of(log) if e.type not in ignore]


def assert_events(
    log: Session | Iterable[ev.Event],
    expected: Sequence[str | Collection[str]],
    *,
    ignore: Collection[str] = (),
) -> None:
    """Assert the event types of ``log`` match ``expected`` exactly.

    Each item of ``expected`` is a type string, or a collection (e.g. a set)
    of type strings whose events may come in any order (set-aware matching
    where order is not guaranteed, such as parallel tool calls).  A
    multiset is matched by counts: ``["tool/call", "tool/call"]`` inside a
    set position is not possible, so pass a list for repeated types there.

    Raises:
        EventLogMismatch: with both sequences and the first difference.
    """
    actual = event_types(log, ignore=ignore)
    position = 0
    for index, item in enumerate(expected):
        if isinstance(item, str):
            if position >= len(actual) or actual[position] != item:
                _fail(actual, expected, index, position, f"expected {item!r}")
            position += 1
        else:
            group = sorted(item)
            window = sorted(actual[position : position + len(group)])
            if window != group:
                _fail(actual, expected, index, position, f"expected {group} in any order")
            position += len(group)
    if position != len(actual):
        _fail(actual, expected, len(expected), position, "expected the log to end here")


def _fail(actual: list[str], expected: Sequence[Any], index: int, position: int, what: str) -> None:
    found = repr(actual[position]) if position < len(actual) else "the end of the log"
    lines = [
        f"event log mismatch at expected item {index} (event {position}): {what}, found {found}",
        "expected:",
        *(f"  {i:3}: {item!r}" for i, item in enumerate(expected)),
        "actual:",
        *(f"  {i:3}: {t}" for i, t in enumerate(actual)),
    ]
    raise EventLogMismatch("\n".join(lines))


def assert_balanced(log: Session | Iterable[ev.Event]) -> None:
    """Assert turns and steps open and close properly and every tool call has a result.

    A step may end with calls still waiting for approval (``approval/requested``
    without a decision) only when its turn then ends ``paused``; those calls
    carry into the next turn, whose first step must answer them
    (docs/approval.rst, "Paused approvals").

    Raises:
        EventLogMismatch: naming the first event that breaks the structure.
    """
    turn: int | None = None
    step: int | None = None
    pending: set[str] = set()
    waiting: set[str] = set()
    paused_step = False
    for event in _events_of(log):
        where = f"event {event.seq} ({event.type})"
        if isinstance(event, ev.TurnStart):
            if turn is not None:
                raise EventLogMismatch(f"{where}: turn {event.turn} starts while turn {turn} is open")
            turn = event.turn
        elif isinstance(event, ev.StepStart):
            if turn is None or step is not None:
                raise EventLogMismatch(f"{where}: step starts outside a turn or inside another step")
            if paused_step:
                raise EventLogMismatch(f"{where}: step starts after a step that left calls waiting for approval")
            step = event.step
            waiting = set()
        elif isinstance(event, ev.AssistantMessage):
            pending.update(call.id for call in event.tool_calls)
        elif isinstance(event, ev.ApprovalRequested):
            waiting.add(event.call_id)
        elif isinstance(event, ev.ApprovalDecided):
            waiting.discard(event.call_id)
        elif isinstance(event, ev.ToolResult):
            pending.discard(event.call_id)
        elif isinstance(event, ev.StepEnd):
            if step is None:
                raise EventLogMismatch(f"{where}: step/end without an open step")
            if pending - waiting:
                raise EventLogMismatch(f"{where}: step ends with unanswered tool calls {sorted(pending - waiting)}")
            paused_step = bool(pending)
            step = None
        elif isinstance(event, ev.TurnEnd):
            if turn is None or step is not None:
                raise EventLogMismatch(f"{where}: turn/end without an open turn, or with a step open")
            if paused_step and event.reason != "paused":
                raise EventLogMismatch(
                    f"{where}: calls {sorted(pending)} wait for approval but the turn ends {event.reason}, not paused"
                )
            paused_step = False
            turn = None
    if turn is not None:
        raise EventLogMismatch(f"the log ends with turn {turn} still open")
