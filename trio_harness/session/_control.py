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
from typing import TYPE_CHECKING, Literal, Protocol

import attrs

from .._errors import CallNotFoundError, CallNotPendingError
from ._events import (
    ApprovalDecided,
    ApprovalRequested,
    AssistantMessage,
    ControlRefused,
    Event,
    InboxMessage,
    ToolResult,
)

if TYPE_CHECKING:
    from ._session import Session

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
    """One posted control: ``cancel`` (as ``agent.cancel("user")``) or ``decision`` for ``call_id``.

    Attributes:
        kind: ``cancel`` or ``decision`` (``unknown`` only to refuse a control
            that could not be read).
        call_id: the call a decision answers.
        verdict: the decision's verdict.
        message: the decision's message.
        call_seq: the seq of the ``assistant/message`` that made the call the
            decision answers (checked when it is posted): a decision applies
            to that call only, never to a later call that reuses its id (models
            reuse ids such as ``call_0``).  None in controls posted by older
            versions (bound to the call id alone).
        message_id: the posted control's id (set when it is read back).
    """

    kind: Literal["cancel", "decision", "unknown"]
    call_id: str | None = None
    verdict: str | None = None
    message: str | None = None
    call_seq: int | None = None
    message_id: str = attrs.field(default="", eq=False)


_FIELDS = ("kind", "call_id", "verdict", "message")


def control_message(control: Control) -> InboxMessage:
    """The mailbox form of ``control``.

    The text is the JSON of the fields every version reads; ``call_seq``
    rides in the id (``ctl-<hex>.<call_seq>``), so a worker of an older
    version, which refuses unknown keys, still reads the control (bound to
    the call id alone) instead of taking it for a message.
    """
    data = {name: getattr(control, name) for name in _FIELDS}
    suffix = f".{control.call_seq}" if control.call_seq is not None else ""
    return InboxMessage(id=f"{CONTROL_PREFIX}{uuid.uuid4().hex}{suffix}", text=json.dumps(data), mode="inject")


def is_control(message: InboxMessage) -> bool:
    """Whether ``message`` carries a control (its id starts with :data:`CONTROL_PREFIX`)."""
    return message.id.startswith(CONTROL_PREFIX)


def read_control(message: InboxMessage) -> Control | None:
    """The control ``message`` carries, or None for an ordinary message.

    Keys of a newer version are ignored.

    Raises:
        ValueError: a control that cannot be read (malformed): it is refused,
            never taken for a message.
    """
    if not is_control(message):
        return None
    _, dot, seq = message.id.partition(".")
    if dot and not (seq.isascii() and seq.isdigit()):
        raise ValueError(f"the posted control {message.id} names no call (its id ends in {seq!r})")
    try:
        data = json.loads(message.text)
        control = Control(**{name: data.get(name) for name in _FIELDS}, call_seq=int(seq) if dot else None)
    except (ValueError, TypeError, AttributeError) as exc:
        raise ValueError(f"the posted control {message.id} cannot be read: {exc}") from None
    control = attrs.evolve(control, message_id=message.id)
    if control.kind not in ("cancel", "decision"):
        raise ValueError(f"the posted control {message.id} is of an unknown kind {control.kind!r}")
    if control.kind == "decision" and (not isinstance(control.call_id, str) or control.verdict not in VERDICTS):
        raise ValueError(f"the posted decision {message.id} names no call or no known verdict")
    return control


@attrs.frozen
class _Calls:
    """What the log says of the calls with one id: the latest's message, whether it waits, which question."""

    known: bool = False
    call_seq: int | None = None  # the assistant/message of the latest call with the id
    asked_seq: int | None = None  # its approval/requested still unanswered, if any


def _calls(events: Sequence[Event], call_id: str) -> _Calls:
    known = False
    call_seq = asked_seq = None
    for event in events:
        if isinstance(event, AssistantMessage) and any(call.id == call_id for call in event.tool_calls):
            known, call_seq, asked_seq = True, event.seq, None  # a new call with this id (a reused id)
        elif isinstance(event, ApprovalRequested) and event.call_id == call_id:
            known, asked_seq = True, event.seq
        elif isinstance(event, ApprovalDecided | ToolResult) and event.call_id == call_id:
            asked_seq = None
    # Asked without its message in the log: call_seq stays None (the decision is bound to the id alone).
    return _Calls(known, call_seq, asked_seq)


def call_seq_of(events: Sequence[Event], call_id: str) -> int | None:
    """The seq of the latest ``assistant/message`` that made a call ``call_id`` (searched from the end)."""
    for index in range(len(events) - 1, -1, -1):
        event = events[index]
        if type(event) is AssistantMessage and any(call.id == call_id for call in event.tool_calls):
            return event.seq
    return None


def check_pending(
    events: Sequence[Event], session_id: str, call_id: str, question_seq: int | None = None
) -> int | None:
    """The call a decision for ``call_id`` answers (its ``call_seq``: None when the log has the question
    without the message that made the call); refuse one the log does not have waiting.

    A call waits for approval when its ``approval/requested`` has no later
    ``approval/decided`` and the call no result (a live question, or one a
    paused turn left open for its continuation).  Only the latest call with
    the id can wait: an earlier one whose id the model reused is answered.

    Args:
        events: the session's log.
        session_id: the session (for the messages).
        call_id: the call.
        question_seq: the seq of the ``approval/requested`` the poster answers,
            if it says: refused when that question is not the one waiting (it
            was answered, and the model made a new call with the same id).

    Raises:
        CallNotFoundError: no tool call ``call_id`` in the log, or no question
            for it at ``question_seq``.
        CallNotPendingError: the call is not waiting for approval, or the
            question at ``question_seq`` is not the one waiting.
    """
    calls = _calls(events, call_id)
    if not calls.known:
        raise CallNotFoundError(f"session {session_id!r} has no tool call {call_id!r}")
    if question_seq is not None:
        asked = events[question_seq] if 0 <= question_seq < len(events) else None
        if not isinstance(asked, ApprovalRequested) or asked.call_id != call_id:
            raise CallNotFoundError(
                f"event {question_seq} of session {session_id!r} is not an approval question for call {call_id!r}"
            )
        if calls.asked_seq is None or call_seq_of(events[:question_seq], call_id) != calls.call_seq:
            raise CallNotPendingError(
                f"the approval question for tool call {call_id!r} of session {session_id!r} at event "
                f"{question_seq} is no longer waiting (it was answered"
                + (
                    f"; the call waiting now, asked at event {calls.asked_seq}, is a later call that reuses the id"
                    if calls.asked_seq is not None
                    else ""
                )
                + "); the decision was not posted"
            )
    if calls.asked_seq is None:
        raise CallNotPendingError(f"tool call {call_id!r} of session {session_id!r} is not waiting for approval")
    return calls.call_seq


def pending_call(events: Sequence[Event], call_id: str) -> tuple[int | None] | None:
    """``(call_seq,)`` of the call ``call_id`` waiting for approval in ``events``, or None when none waits.

    See :func:`check_pending`.
    """
    calls = _calls(events, call_id)
    return (calls.call_seq,) if calls.asked_seq is not None else None


def stale_reason(call_id: str | None, posted_seq: int | None, call_seq: int | None) -> str | None:
    """Why a decision posted for the call made at ``posted_seq`` does not answer the call made at ``call_seq``.

    None when it does (or when either is unknown: a control of an older version).
    """
    if posted_seq is None or call_seq is None or posted_seq == call_seq:
        return None
    return (
        f"the decision was posted for the call {call_id!r} made at event {posted_seq}, which was answered "
        f"otherwise; the call waiting now (made at event {call_seq}) is a later call that reuses the id, "
        "and a decision for the earlier one does not decide it; post a decision for it"
    )


def refuse_control(session: Session, control: Control, reason: str) -> None:
    """Log that ``control`` was not applied (``control/refused``), for whoever follows the session."""
    session.append(
        ControlRefused, message_id=control.message_id, kind=control.kind, reason=reason, call_id=control.call_id
    )
