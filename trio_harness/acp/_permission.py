"""``session/request_permission``: the question an approval request becomes, and the decision its answer is."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final

from ..agents._approval import ApprovalDecision
from ..tools._files import file_change
from ._updates import diff_content, file_location, raw_input, shorten, tool_call_id, tool_kind, tool_title

if TYPE_CHECKING:
    from ..agents._approval import ApprovalRequest
    from ..agents._tools import ToolSet

PERMISSION_OPTIONS: Final = (
    {"optionId": "allow_once", "name": "Allow once", "kind": "allow_once"},
    {"optionId": "allow_always", "name": "Allow always (this session, this tool)", "kind": "allow_always"},
    {"optionId": "reject_once", "name": "Reject", "kind": "reject_once"},
    {"optionId": "reject_always", "name": "Reject always (this session, this tool)", "kind": "reject_always"},
)
"""The options of every ``session/request_permission`` (ids equal the ACP option kinds)."""

_VERDICT_OF_OPTION: Final = {
    "allow_once": ApprovalDecision.allow_once(),
    "allow_always": ApprovalDecision.allow_always(),
    "reject_once": ApprovalDecision.deny(),
    "reject_always": ApprovalDecision.deny_always(),
}


def permission_params(session_id: str, request: ApprovalRequest) -> dict[str, Any]:
    """The params of the ``session/request_permission`` asking the client about ``request``."""
    call_id = tool_call_id(request.turn, request.call_id)
    if request.agent_id != session_id:  # a subagent's call: name the child
        call_id = f"{request.agent_id}/{call_id}"
    return {
        "sessionId": session_id,
        "toolCall": {
            "toolCallId": call_id,
            "title": tool_title(request.tool, request.raw_arguments),
            "kind": tool_kind(request.tool),
            "status": "pending",
            "rawInput": raw_input(request.raw_arguments),
        },
        "options": [dict(option) for option in PERMISSION_OPTIONS],
    }


async def add_file_change(params: dict[str, Any], request: ApprovalRequest, tools: ToolSet | None) -> None:
    """Put a write's change into the question: ``locations`` and a ``diff`` content block (file tools only)."""
    locations = file_location(request.tool, request.raw_arguments, request.agent.session.header.cwd)
    if locations is None:
        return
    tool_call = params["toolCall"]
    tool_call["locations"] = locations
    change = await file_change(request, tools)
    if change is not None:
        tool_call["locations"] = [{"path": change.path}]
        tool_call["content"] = [diff_content(change.path, change.old_text, change.new_text)]


def decision_of(result: object, error: object) -> ApprovalDecision | None:
    """The decision the client's answer (its ``result`` or ``error``) makes; None when it cancelled."""
    if error is not None:
        detail = error.get("message") if isinstance(error, dict) else None
        text = detail if isinstance(detail, str) and detail else shorten(repr(error), 200)
        return ApprovalDecision.deny(f"the client answered the permission request with an error: {text}")
    outcome = result.get("outcome") if isinstance(result, dict) else None
    kind = outcome.get("outcome") if isinstance(outcome, dict) else None
    if kind == "cancelled":
        return None
    option = outcome.get("optionId") if isinstance(outcome, dict) and kind == "selected" else None
    decision = _VERDICT_OF_OPTION.get(option) if isinstance(option, str) else None
    if decision is None:
        return ApprovalDecision.deny(
            f"the client's answer to the permission request is not a known choice: {shorten(repr(result), 200)}"
        )
    return decision
