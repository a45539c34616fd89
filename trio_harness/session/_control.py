"""Control posted to a session from anywhere: a cancel, or a decision for a call waiting for approval.

``harness.sessions.post(session_id, cancel=True)`` and ``post(session_id,
call_id=..., decision=...)`` travel like posted messages (the PostgreSQL
mailbox, or straight to the live agent in this process) as an
:class:`~trio_harness.events.InboxMessage` whose id starts with
:data:`CONTROL_PREFIX` and whose text is the JSON of a :class:`Control`; the
receiving registry applies it instead of splicing it into the inbox
(agents/_remote_control.py).
"""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from typing import Literal, Protocol

import attrs

from .._errors import CallNotFoundError, CallNotPendingError
from ._events import ApprovalDecided, ApprovalRequested, AssistantMessage, Event, InboxMessage, ToolResult

CONTROL_PREFIX = "ctl-"
"""The id prefix of a posted control (posted messages' ids start with ``msg-``)."""

VERDICTS = ("allow_once", "allow_always", "deny", "deny_always")


class ApprovalDecisionLike(Protocol):
    """What a posted decision must offer (an :class:`~trio_harness.agents.ApprovalDecision` does)."""

    @property
    def verdict(self) -> str:
        """``allow_once``, ``allow_always``, ``deny`` or ``deny_always``."""
        ...

    @property
    def message(self) -> str | None:
        """For a denial, the text the model reads."""
        ...


@attrs.frozen
class Control:
    """One posted control: ``cancel`` (as ``agent.cancel("user")``) or ``decision`` for ``call_id``."""

    kind: Literal["cancel", "decision"]
    call_id: str | None = None
    verdict: str | None = None
    message: str | None = None


def control_message(control: Control) -> InboxMessage:
    """The mailbox form of ``control``."""
    return InboxMessage(id=f"{CONTROL_PREFIX}{uuid.uuid4().hex}", text=json.dumps(attrs.asdict(control)), mode="inject")


def read_control(message: InboxMessage) -> Control | None:
    """The control ``message`` carries, or None for an ordinary message (or a malformed control)."""
    if not message.id.startswith(CONTROL_PREFIX):
        return None
    try:
        data = json.loads(message.text)
        control = Control(**data)
    except (ValueError, TypeError):
        return None
    if control.kind == "decision" and (not isinstance(control.call_id, str) or control.verdict not in VERDICTS):
        return None
    return control if control.kind in ("cancel", "decision") else None


def check_pending(events: Sequence[Event], session_id: str, call_id: str) -> None:
    """Refuse a decision for a call the log does not have, or one not waiting for approval.

    A call waits for approval when its ``approval/requested`` has no later
    ``approval/decided`` and the call no result (a live question, or one a
    paused turn left open for its continuation).

    Raises:
        CallNotFoundError: no tool call ``call_id`` in the log.
        CallNotPendingError: the call is not waiting for approval.
    """
    known = asked = False
    for event in events:
        if isinstance(event, AssistantMessage) and any(call.id == call_id for call in event.tool_calls):
            known = True
        elif isinstance(event, ApprovalRequested) and event.call_id == call_id:
            known = asked = True
        elif isinstance(event, ApprovalDecided | ToolResult) and event.call_id == call_id:
            asked = False
    if not known:
        raise CallNotFoundError(f"session {session_id!r} has no tool call {call_id!r}")
    if not asked:
        raise CallNotPendingError(f"tool call {call_id!r} of session {session_id!r} is not waiting for approval")


def is_pending(events: Sequence[Event], call_id: str) -> bool:
    """Whether ``call_id`` waits for approval in ``events`` (see :func:`check_pending`)."""
    try:
        check_pending(events, "", call_id)
    except (CallNotFoundError, CallNotPendingError):
        return False
    return True
