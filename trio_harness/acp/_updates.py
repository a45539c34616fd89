"""Session events -> ACP ``session/update`` payloads, and turn ends -> ACP stop reasons.

The live stream of a prompt is the translation of the events of the turn that
claimed its message (``agent.follow``, :class:`~trio_harness.agents.FollowedPrompt`,
finds that turn; :func:`stop_reason_for` maps how it ended); a ``session/load`` replays a
whole stored log with :func:`replay_updates`.

Translation table (live):

=====================================  ==============================================
session event                          ACP update
=====================================  ==============================================
``assistant/chunk`` (kind text)        ``agent_message_chunk``
``assistant/chunk`` (kind reasoning)   ``agent_thought_chunk``
``tool/call``                          ``tool_call`` (status ``pending``)
notice ``agent/tool/started``          ``tool_call_update`` (status ``in_progress``)
``tool/result``                        ``tool_call_update`` (``completed`` / ``failed``;
                                       a file tool's with ``locations``, a write's
                                       content a ``diff``)
``user/message`` of a task notice      ``agent_thought_chunk`` (``_meta`` origin)
=====================================  ==============================================

A call is ``pending`` until it runs (its arguments checked, and approved when
it needs approval: the ``session/request_permission`` carries the same status),
then ``in_progress`` (the driver's ``agent/tool/started`` notice), so a call
that is denied or has bad arguments goes from ``pending`` to ``failed``.

A replay also sends every claimed user message as ``user_message_chunk`` (a
task notice as above), sends the assistant text of each step as one chunk,
and ends a cancelled, interrupted or failed turn with an agent message saying
so.  Tool call ids are made unique within a session by qualifying the model's
id with the turn number (``"3/call_1"``): scripted and some real providers
reuse ids across turns.

Every message chunk carries a ``messageId``: a UUID derived from the session
id and the chunk's place in the log (``message_id``), so a live stream and
a later replay of the same message agree, and a step's reasoning and its text
are two messages (docs/acp.rst, "Message ids").
"""

from __future__ import annotations

import datetime
import json
import os
import uuid
from collections.abc import Callable, Iterator, Sequence
from decimal import Decimal
from typing import Any, Final, Literal, TypeAlias

from .._records import Failure, UsageTotals
from ..session import _events as ev

StopReason: TypeAlias = Literal["end_turn", "max_tokens", "max_turn_requests", "refusal", "cancelled"]
"""The ACP stop reasons of a prompt turn."""

Update: TypeAlias = dict[str, Any]

TITLE_LENGTH: Final = 80
"""The longest session title sent (``session_info_update``, ``session/list``)."""

NOTICE_META: Final = "trio-harness/origin"
"""The ``_meta`` key marking a chunk that shows a task notice (value ``"task-notice"``)."""

FAILURE_META: Final = "trio-harness/failure"
"""The ``_meta`` key naming the failure of a failed turn (``code``, ``message``)."""

TURN_END_META: Final = "trio-harness/turnEnd"
"""The ``_meta`` key of a replayed note on how a turn ended (``reason``, ``cause``, ``stopReason``)."""

USAGE_META: Final = "trio-harness/usage"
"""The ``_meta`` key of a ``usage_update`` carrying the turn's and session's token usage."""

_MESSAGE_NAMESPACE: Final = uuid.uuid5(uuid.NAMESPACE_URL, "https://github.com/trio-harness/acp/message-id")

_TOOL_KINDS: Final[dict[str, str]] = {
    "bash": "execute",
    "task_output": "read",
    "task_list": "read",
    "task_kill": "delete",
    "subagent": "think",
    "read_file": "read",
    "write_file": "edit",
    "edit_file": "edit",
    "todo_write": "think",
}

FILE_TOOLS: Final = frozenset({"read_file", "write_file", "edit_file"})


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
        path = parsed.get("path")
        if name in FILE_TOOLS and isinstance(path, str):
            return f"{name}: {shorten(path, limit)}"
        prompt = parsed.get("prompt")
        if name == "subagent" and isinstance(prompt, str):
            return f"subagent: {shorten(prompt, limit)}"
        if name == "todo_write":
            return "Update the plan"
        if not parsed:
            return name
    return f"{name} {shorten(arguments, limit)}"


def stop_reason_for(end: ev.TurnEnd | None) -> tuple[StopReason | None, Failure | None]:
    """The ACP stop reason of a turn end, or ``(None, failure)`` for an error.

    ``completed`` -> ``end_turn``, ``max-tokens`` -> ``max_tokens``, ``blocked``
    -> ``max_turn_requests``, ``budget`` -> ``max_tokens`` for a token budget
    and ``max_turn_requests`` for a request budget, ``aborted`` /
    ``interrupted`` / ``paused`` -> ``cancelled``,
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
    if reason in ("aborted", "interrupted", "paused"):
        return "cancelled", None
    failure = end.failure or Failure("unknown", "the turn failed without details")
    if failure.code == "refusal":
        return "refusal", None
    return None, failure


def file_location(name: str, arguments: str, cwd: str | None) -> list[dict[str, Any]] | None:
    """The ACP ``locations`` of a file tool call from its arguments (the path made absolute), or None."""
    if name not in FILE_TOOLS:
        return None
    parsed = _parse_arguments(arguments)
    path = parsed.get("path") if isinstance(parsed, dict) else None
    if not isinstance(path, str) or not path or "\0" in path:
        return None
    if not os.path.isabs(path):
        if cwd is None:
            return None
        path = os.path.normpath(os.path.join(cwd, path))
    location: dict[str, Any] = {"path": path}
    offset = parsed.get("offset")
    if name == "read_file" and type(offset) is int and offset >= 1:
        location["line"] = offset
    return [location]


def _tool_call(event: ev.ToolCallRequested, cwd: str | None = None) -> Update:
    update: Update = {
        "sessionUpdate": "tool_call",
        "toolCallId": tool_call_id(event.turn, event.call_id),
        "title": tool_title(event.name, event.arguments),
        "kind": tool_kind(event.name),
        "status": "pending",  # until it runs: see tool_started_update
        "rawInput": _parse_arguments(event.arguments),
    }
    locations = file_location(event.name, event.arguments, cwd)
    if locations is not None:
        update["locations"] = locations
    return update


def diff_content(path: str, old_text: str | None, new_text: str) -> dict[str, Any]:
    """An ACP ``diff`` tool call content block (``oldText`` null for a new file)."""
    return {"type": "diff", "path": path, "oldText": old_text, "newText": new_text}


def _tool_result(event: ev.ToolResult) -> Update:
    update: Update = {
        "sessionUpdate": "tool_call_update",
        "toolCallId": tool_call_id(event.turn, event.call_id),
        "status": "failed" if event.is_error else "completed",
        "content": [{"type": "content", "content": _text(event.content)}],
    }
    detail = event.detail
    path = detail.get("path") if detail is not None and event.name in FILE_TOOLS and not event.is_error else None
    if detail is not None and isinstance(path, str):
        # A file tool: where it read or wrote, and a write as a diff (docs/editors.rst).
        location: dict[str, Any] = {"path": path}
        if type(detail.get("line")) is int:
            location["line"] = detail["line"]
        update["locations"] = [location]
        new_text = detail.get("new_text")
        old_text = detail.get("old_text")
        if isinstance(new_text, str) and (old_text is None or isinstance(old_text, str)):
            update["content"] = [diff_content(path, old_text, new_text)]
    return update


def message_id(session_id: str, key: str) -> str:
    """The ``messageId`` of a message chunk: a UUID from the session id and the message's place in the log.

    ``key`` names the place: ``"3/1/text"`` (the text of turn 3, step 1),
    ``"3/1/reasoning"`` (its reasoning), ``"3/message/ID"`` (the inbox message
    ``ID`` claimed in turn 3), ``"3/end"`` (the note on how turn 3 ended).
    Derived, not random, so the live stream and a replay give one message the
    same id; a UUID, as the ACP message-id RFD suggests.
    """
    return str(uuid.uuid5(_MESSAGE_NAMESPACE, f"{session_id}/{key}"))


def _chunk(kind: str, text: str, session_id: str, key: str, meta: dict[str, Any] | None = None) -> Update:
    update: Update = {"sessionUpdate": kind, "content": _text(text), "messageId": message_id(session_id, key)}
    if meta is not None:
        update["_meta"] = meta
    return update


def message_update(event: ev.UserMessage, session_id: str = "") -> Update:
    """How a claimed message is shown: a user's as ``user_message_chunk``, a task notice as the agent's.

    A background task's completion notice is no user text: it is information
    the harness gave the model, worded for the model (it names the
    ``task_output`` call to make).  It is sent as an ``agent_thought_chunk``
    with ``_meta: {"trio-harness/origin": "task-notice"}``: editors show
    thoughts as the agent's own, secondary information, and never merge them
    into the answer text (docs/acp.rst, "Task notices").
    """
    key = f"{event.turn}/message/{event.message_id}"
    if event.origin == "task-notice":
        return _chunk("agent_thought_chunk", event.text, session_id, key, {NOTICE_META: event.origin})
    return _chunk("user_message_chunk", event.text, session_id, key)


def message_updates(event: ev.UserMessage, session_id: str = "") -> Iterator[Update]:
    """A claimed message as updates: its text (``message_update``; left out when empty and it has images),
    then each image as a ``user_message_chunk`` with an ``image`` block, under the same ``messageId``."""
    if event.text or not event.images:
        yield message_update(event, session_id)
    key = message_id(session_id, f"{event.turn}/message/{event.message_id}")
    for part in event.images:
        content = {"type": "image", "data": part.data, "mimeType": part.media_type}
        yield {"sessionUpdate": "user_message_chunk", "content": content, "messageId": key}


def failure_text(failure: Failure) -> str:
    """The agent message that says a turn failed (live and in a replay)."""
    return (
        f"The turn failed: {failure.message} ({failure.code}). "
        "Your prompt is kept in the session; send a prompt to try again."
    )


def failure_update(turn: int, failure: Failure, session_id: str = "") -> Update:
    """The ``agent_message_chunk`` saying turn ``turn`` failed, with ``_meta`` naming the failure."""
    meta = {FAILURE_META: {"code": failure.code, "message": failure.message}}
    return _chunk("agent_message_chunk", failure_text(failure), session_id, f"{turn}/end", meta)


def compaction_failed_update(event: ev.CompactionFailed, session_id: str = "") -> Update:
    """The ``agent_thought_chunk`` saying a compaction between turns failed (``_meta`` names the failure).

    A thought, not an answer: no prompt is waiting, and the conversation goes
    on uncompacted (a turn that then needs the compaction ends with
    ``compaction-failed``, shown as a failure like any other).  One with the
    code ``cancelled`` reads as cancelled.
    """
    failure = event.failure
    meta = {FAILURE_META: {"code": failure.code, "message": failure.message}}
    if failure.code == "cancelled":  # cancelled after a summary request: logged for what it spent, not an error
        text = "Compacting the conversation was cancelled."
    else:
        text = f"Compacting the conversation failed: {failure.message}"
    return _chunk("agent_thought_chunk", text, session_id, f"{event.seq}/compaction-failed", meta)


def turn_end_update(end: ev.TurnEnd, session_id: str = "") -> Update | None:
    """The note a replay ends a turn with when the turn did not finish normally, or None.

    A cancelled (``aborted``), ``interrupted`` or ``paused`` turn (a call
    waiting for approval: its ``tool_call`` stays ``pending``) ends with an
    ``agent_message_chunk`` saying so, whose ``_meta`` carries the turn end
    (``{"trio-harness/turnEnd": {"reason", "cause", "stopReason":
    "cancelled"}}``); a failed turn with the message a live prompt shows
    (:func:`failure_update`).  Live, the prompt's ``stopReason`` says it.
    """
    stop_reason, failure = stop_reason_for(end)
    if failure is not None:
        return failure_update(end.turn, failure, session_id)
    if stop_reason != "cancelled":
        return None
    if end.reason == "interrupted":
        text = "The turn was interrupted: the agent stopped before it finished."
    elif end.reason == "paused":
        text = "The turn is paused: a tool call is waiting for approval (it is asked again when the session resumes)."
    else:
        text = "The turn was cancelled."
    meta: dict[str, Any] = {"reason": end.reason, "stopReason": "cancelled"}
    if end.cause is not None:
        meta["cause"] = end.cause
    return _chunk("agent_message_chunk", text, session_id, f"{end.turn}/end", {TURN_END_META: meta})


def live_update(event: ev.Event, session_id: str = "", cwd: str | None = None) -> Update | None:
    """The ``session/update`` payload (the ``update`` object) for a live event, or None.

    ``session_id`` seeds the chunks' ``messageId`` (``message_id``).  A
    claimed user message gives none (the client sent it), a task notice an
    ``agent_thought_chunk`` (``message_update``).
    """
    if isinstance(event, ev.AssistantChunk):
        if not event.text:
            return None
        if event.kind == "text":
            return _chunk("agent_message_chunk", event.text, session_id, f"{event.turn}/{event.step}/text")
        return _chunk("agent_thought_chunk", event.text, session_id, f"{event.turn}/{event.step}/reasoning")
    if isinstance(event, ev.UserMessage):
        return message_update(event, session_id) if event.origin == "task-notice" else None
    if isinstance(event, ev.ToolCallRequested):
        return _tool_call(event, cwd)
    if isinstance(event, ev.ToolResult):
        return _tool_result(event)
    return None


def tool_started_update(turn: int, call_id: str) -> Update:
    """``tool_call_update`` to ``in_progress``: the call runs now (the ``agent/tool/started`` notice).

    ACP's ``pending`` covers a call whose input is not checked or approved
    yet, so a call goes ``pending`` -> ``in_progress`` -> ``completed`` /
    ``failed``, never back (docs/approval.rst).
    """
    return {"sessionUpdate": "tool_call_update", "toolCallId": tool_call_id(turn, call_id), "status": "in_progress"}


def replay_updates(events: Sequence[ev.Event], session_id: str = "", cwd: str | None = None) -> Iterator[Update]:
    """The updates that replay a stored log to a client (``session/load``).

    User messages become ``user_message_chunk`` (task notices
    ``agent_thought_chunk``, see ``message_update``); each step's
    assistant text and reasoning are sent whole (from ``assistant/message``,
    or from the chunks of a step that died before its message was logged);
    tool calls and results as in the live stream (a call's ``tool/started``
    as ``in_progress``, so a call the process died running shows as running
    until its recovery result says it was interrupted); a cancelled,
    interrupted or failed turn ends with a note saying so (``turn_end_update``).
    """
    text: list[str] = []
    reasoning: list[str] = []
    place = ""

    def pending() -> Iterator[Update]:
        if reasoning:
            yield _chunk("agent_thought_chunk", "".join(reasoning), session_id, f"{place}/reasoning")
        if text:
            yield _chunk("agent_message_chunk", "".join(text), session_id, f"{place}/text")
        reasoning.clear()
        text.clear()

    for event in events:
        if isinstance(event, ev.UserMessage):
            yield from pending()
            yield from message_updates(event, session_id)
        elif isinstance(event, ev.AssistantChunk):
            place = f"{event.turn}/{event.step}"
            (text if event.kind == "text" else reasoning).append(event.text)
        elif isinstance(event, ev.AssistantMessage):
            place = f"{event.turn}/{event.step}"
            text[:] = [event.text] if event.text else []
            reasoning[:] = [event.reasoning] if event.reasoning else []
            yield from pending()
        elif isinstance(event, ev.ToolCallRequested):
            yield from pending()
            yield _tool_call(event, cwd)
        elif isinstance(event, ev.ToolStarted):
            yield tool_started_update(event.turn, event.call_id)
        elif isinstance(event, ev.ToolResult):
            yield _tool_result(event)
        elif isinstance(event, ev.StepEnd):
            yield from pending()
        elif isinstance(event, ev.CompactionFailed) and event.turn is None:
            yield from pending()
            yield compaction_failed_update(event, session_id)
        elif isinstance(event, ev.TurnEnd):
            yield from pending()
            note = turn_end_update(event, session_id)
            if note is not None:
                yield note
    yield from pending()


def first_user_text(events: Sequence[ev.Event]) -> str | None:
    """The text of the first claimed user message of a log (task notices are not), if any."""
    for event in events:
        if isinstance(event, ev.UserMessage) and event.origin == "user":
            return event.text
    return None


def session_title(events: Sequence[ev.Event]) -> str | None:
    """A session's title: the first non-blank line of its first user message, cut to 80 characters."""
    text = first_user_text(events)
    return title_of(text) if text is not None else None


def title_of(text: str) -> str | None:
    """The title a first prompt gives: its first non-blank line, cut to 80 characters (None if blank)."""
    for line in text.splitlines():
        if line.strip():
            return shorten(line, TITLE_LENGTH)
    return None


def context_tokens(events: Sequence[ev.Event]) -> int | None:
    """The tokens in context after the last model answer: its reported prompt plus answer tokens.

    None when no answer since the last compaction reported usage (the
    provider reports none, or nothing was asked since).
    """
    for event in reversed(events):
        if isinstance(event, ev.AssistantMessage) and event.usage is not None:
            return event.usage.input_tokens + event.usage.output_tokens
        if isinstance(event, ev.ContextCompacted):
            return None
    return None


def usage_meta(totals: UsageTotals) -> dict[str, int]:
    """Usage totals as a JSON object (camelCase, as ACP names tokens)."""
    return {
        "inputTokens": totals.input_tokens,
        "outputTokens": totals.output_tokens,
        "cachedReadTokens": totals.cache_hit_tokens,
        "thoughtTokens": totals.reasoning_tokens,
        "requests": totals.requests,
    }


def usage_update(
    events: Sequence[ev.Event],
    window: int | None,
    turn: UsageTotals | None,
    session: UsageTotals,
    cost: Decimal | None = None,
    estimate: Callable[[], int | None] | None = None,
) -> Update | None:
    """The ``usage_update`` after a turn: ``used`` of ``size`` (the context window) tokens, or None.

    None when the window or the tokens in context are unknown (ACP requires
    both); ``estimate`` gives the tokens in context when no answer since the
    last compaction reported them.  ``cost`` is the session's cumulative cost in US dollars, sent
    only when known (the ``cost`` extra prices known models).  ``_meta``
    carries the turn's and the session's token usage (``"trio-harness/usage"``).
    """
    if window is None:
        return None
    used = context_tokens(events)
    if used is None and estimate is not None:
        used = estimate()  # right after a compaction: no answer has measured the context yet
    if used is None:
        return None
    meta: dict[str, Any] = {"session": usage_meta(session)}
    if turn is not None:
        meta["turn"] = usage_meta(turn)
    update: Update = {"sessionUpdate": "usage_update", "used": used, "size": window, "_meta": {USAGE_META: meta}}
    if cost is not None:
        update["cost"] = {"amount": float(cost), "currency": "USD"}
    return update
