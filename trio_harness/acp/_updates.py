"""Session events -> ACP ``session/update`` payloads, and turn ends -> ACP stop reasons.

The live stream of a prompt is the translation of the events of the turn that
claimed its message (:class:`~trio_harness.agents.TurnWatcher` finds that
turn; :func:`stop_reason_for` maps how it ended); a ``session/load`` replays a
whole stored log with :func:`replay_updates`.

Translation table (live):

=====================================  ==============================================
session event                          ACP update
=====================================  ==============================================
``assistant/chunk`` (kind text)        ``agent_message_chunk``
``assistant/chunk`` (kind reasoning)   ``agent_thought_chunk``
``tool/call``                          ``tool_call`` (status ``in_progress``)
``tool/result``                        ``tool_call_update`` (``completed`` / ``failed``)
``approval/requested``                 ``tool_call_update`` (status ``pending``)
``approval/decided`` (allowed)         ``tool_call_update`` (status ``in_progress``)
=====================================  ==============================================

A replay also sends every claimed user message as ``user_message_chunk`` and
sends the assistant text of each step as one chunk.  Tool call ids are made
unique within a session by qualifying the model's id with the turn number
(``"3/call_1"``): scripted and some real providers reuse ids across turns.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Iterator, Sequence
from typing import Any, Final, Literal, TypeAlias

from .._records import Failure
from ..session import _events as ev

__all__ = [
    "StopReason",
    "first_user_text",
    "iso_time",
    "live_update",
    "raw_input",
    "replay_updates",
    "shorten",
    "stop_reason_for",
    "tool_call_id",
    "tool_kind",
    "tool_title",
]

StopReason: TypeAlias = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
"""The ACP stop reasons of a prompt turn."""

Update: TypeAlias = dict[str, Any]

_TOOL_KINDS: Final[dict[str, str]] = {
    "bash": "execute",
    "task_output": "read",
    "task_list": "read",
    "task_kill": "delete",
    "subagent": "think",
}


def shorten(text: str, limit: int = 200) -> str:
    """``text`` on one line, cut to at most ``limit`` characters with an ellipsis."""
    flat = " ".join(text.split())
    if len(flat) <= limit:
        return flat
    return flat[: max(limit - 1, 0)] + "…"


def iso_time(timestamp: float) -> str:
    """An ISO 8601 UTC time (``2026-01-02T03:04:05Z``) for a POSIX timestamp."""
    moment = datetime.datetime.fromtimestamp(timestamp, tz=datetime.UTC)
    return moment.strftime("%Y-%m-%dT%H:%M:%SZ")


def _text(text: str) -> dict[str, Any]:
    return {"type": "text", "text": text}


def _parse_arguments(arguments: str) -> Any:
    try:
        return json.loads(arguments) if arguments.strip() else {}
    except (ValueError, RecursionError):
        return arguments


def raw_input(arguments: str) -> Any:
    """The ACP ``rawInput`` of a tool call: its JSON arguments parsed (the text itself when not JSON)."""
    return _parse_arguments(arguments)


def tool_call_id(turn: int, call_id: str) -> str:
    """The ACP ``toolCallId`` of a model tool call: unique within the session."""
    return f"{turn}/{call_id}"


def tool_kind(name: str) -> str:
    """The ACP tool kind shown for a tool name (``other`` when unknown)."""
    return _TOOL_KINDS.get(name, "other")


def tool_title(name: str, arguments: str, limit: int = 80) -> str:
    """A one-line, human-readable title for a tool call."""
    parsed = _parse_arguments(arguments)
    if isinstance(parsed, dict):
        command = parsed.get("command")
        if name == "bash" and isinstance(command, str):
            return f"bash: {shorten(command, limit)}"
        prompt = parsed.get("prompt")
        if name == "subagent" and isinstance(prompt, str):
            return f"subagent: {shorten(prompt, limit)}"
        if not parsed:
            return name
    return f"{name} {shorten(arguments, limit)}"


def stop_reason_for(end: ev.TurnEnd | None) -> tuple[StopReason | None, Failure | None]:
    """The ACP stop reason of a turn end, or ``(None, failure)`` for an error.

    ``completed`` -> ``end_turn``, ``max-tokens`` -> ``max_tokens``, ``blocked``
    -> ``max_turn_requests``, ``budget`` -> ``max_tokens`` for a token budget
    and ``max_turn_requests`` for a request budget, ``aborted`` /
    ``interrupted`` -> ``cancelled``,
    an error whose failure code is ``refusal`` -> ``refusal``; any other error
    gives no stop reason and its failure (the prompt answers with an error).
    No end (``None``: the prompt's message never ran, see
    :class:`~trio_harness.agents.TurnOutcome`) -> ``cancelled``.
    """
    if end is None:
        return "cancelled", None
    reason = end.reason
    if reason == "completed":
        return "end_turn", None
    if reason == "max-tokens":
        return "max_tokens", None
    if reason == "blocked":
        return "max_turn_requests", None
    if reason == "budget":
        tokens = end.failure is not None and end.failure.code == "budget-tokens"
        return ("max_tokens" if tokens else "max_turn_requests"), None
    if reason in ("aborted", "interrupted"):
        return "cancelled", None
    failure = end.failure or Failure("unknown", "the turn failed without details")
    if failure.code == "refusal":
        return "refusal", None
    return None, failure


def _tool_call(event: ev.ToolCallRequested) -> Update:
    return {
        "sessionUpdate": "tool_call",
        "toolCallId": tool_call_id(event.turn, event.call_id),
        "title": tool_title(event.name, event.arguments),
        "kind": tool_kind(event.name),
        "status": "in_progress",
        "rawInput": _parse_arguments(event.arguments),
    }


def _tool_result(event: ev.ToolResult) -> Update:
    return {
        "sessionUpdate": "tool_call_update",
        "toolCallId": tool_call_id(event.turn, event.call_id),
        "status": "failed" if event.is_error else "completed",
        "content": [{"type": "content", "content": _text(event.content)}],
    }


def live_update(event: ev.Event) -> Update | None:
    """The ``session/update`` payload (the ``update`` object) for a live event, or None."""
    if isinstance(event, ev.AssistantChunk):
        if not event.text:
            return None
        kind = "agent_message_chunk" if event.kind == "text" else "agent_thought_chunk"
        return {"sessionUpdate": kind, "content": _text(event.text)}
    if isinstance(event, ev.ToolCallRequested):
        return _tool_call(event)
    if isinstance(event, ev.ToolResult):
        return _tool_result(event)
    if isinstance(event, ev.ApprovalRequested):
        # ACP: "pending" covers a call awaiting approval (docs/approval.rst).
        return {
            "sessionUpdate": "tool_call_update",
            "toolCallId": tool_call_id(event.turn, event.call_id),
            "status": "pending",
        }
    if isinstance(event, ev.ApprovalDecided) and event.source == "approver" and event.outcome.startswith("allow"):
        return {
            "sessionUpdate": "tool_call_update",
            "toolCallId": tool_call_id(event.turn, event.call_id),
            "status": "in_progress",
        }
    return None


def replay_updates(events: Sequence[ev.Event]) -> Iterator[Update]:
    """The updates that replay a stored log to a client (``session/load``).

    User messages become ``user_message_chunk``; each step's assistant text and
    reasoning are sent whole (from ``assistant/message``, or from the chunks of
    a step that died before its message was logged); tool calls and results
    as in the live stream.
    """
    text: list[str] = []
    reasoning: list[str] = []

    def pending() -> Iterator[Update]:
        if reasoning:
            yield {"sessionUpdate": "agent_thought_chunk", "content": _text("".join(reasoning))}
        if text:
            yield {"sessionUpdate": "agent_message_chunk", "content": _text("".join(text))}
        reasoning.clear()
        text.clear()

    for event in events:
        if isinstance(event, ev.UserMessage):
            yield from pending()
            yield {"sessionUpdate": "user_message_chunk", "content": _text(event.text)}
        elif isinstance(event, ev.AssistantChunk):
            (text if event.kind == "text" else reasoning).append(event.text)
        elif isinstance(event, ev.AssistantMessage):
            text[:] = [event.text] if event.text else []
            reasoning[:] = [event.reasoning] if event.reasoning else []
            yield from pending()
        elif isinstance(event, ev.ToolCallRequested):
            yield from pending()
            yield _tool_call(event)
        elif isinstance(event, ev.ToolResult):
            yield _tool_result(event)
        elif isinstance(event, ev.StepEnd | ev.TurnEnd):
            yield from pending()
    yield from pending()


def first_user_text(events: Sequence[ev.Event]) -> str | None:
    """The text of the first claimed user message of a log, if any."""
    for event in events:
        if isinstance(event, ev.UserMessage):
            return event.text
    return None
