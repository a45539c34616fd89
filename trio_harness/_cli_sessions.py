"""``trio-harness sessions list`` and ``sessions show``: the store's sessions, and a readable transcript."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING

import trio

from ._cli_common import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    _compact_arguments,
    _error,
    _local_time,
    _shorten,
    _store_is_not_a_directory,
    _store_name,
)
from ._errors import HarnessError, InvalidSessionIdError, SessionNotFoundError

if TYPE_CHECKING:
    from .session._events import Event, SessionHeader


def sessions_list(args: argparse.Namespace) -> int:
    from ._harness import open_store

    if _store_is_not_a_directory(args.store):
        return EXIT_USAGE

    async def load_all() -> list[tuple[SessionHeader, tuple[Event, ...] | str]]:
        rows: list[tuple[SessionHeader, tuple[Event, ...] | str]] = []
        async with open_store(args.store) as persistence:
            for header in await persistence.list():
                try:
                    rows.append((header, (await persistence.load(header.id)).events))
                except HarnessError as exc:
                    rows.append((header, f"unreadable: {exc}"))
        return rows

    try:
        listed = trio.run(load_all)
    except HarnessError as exc:
        _error(str(exc))
        return EXIT_FAILED
    if not listed:
        print(f"no sessions in {_store_name(args.store)}")
        return EXIT_OK

    from .acp._updates import first_user_text

    table: list[tuple[str, str, str, str, str]] = []
    for header, events in listed:
        if isinstance(events, str):
            table.append((header.id, _local_time(header.created_at), "?", "?", _shorten(events, 60)))
            continue
        last = events[-1].ts if events else header.created_at
        first = first_user_text(events)
        preview = _shorten(first, 60) if first else "(no prompt)"
        table.append(
            (
                header.id,
                _local_time(header.created_at),
                str(len(events)),
                _local_time(last),
                preview,
            )
        )
    titles = ("ID", "CREATED", "EVENTS", "LAST ACTIVITY", "FIRST PROMPT")
    widths = [max(len(row[i]) for row in (titles, *table)) for i in range(4)]
    rows = [
        "  ".join((*(cell.ljust(widths[i]) for i, cell in enumerate(row[:4])), row[4])).rstrip()
        for row in (titles, *table)
    ]
    for line in _for_stdout(rows):
        print(line)
    return EXIT_OK


def sessions_show(args: argparse.Namespace) -> int:
    from ._harness import open_store
    from .session._persistence import LoadedSession

    async def load() -> LoadedSession:
        async with open_store(args.store) as persistence:
            return await persistence.load(args.session_id)

    if _store_is_not_a_directory(args.store):
        return EXIT_USAGE

    async def find() -> str | None:
        async with open_store(args.store) as persistence:
            return unique_session([header.id for header in await persistence.list()], args.session_id)

    try:
        session_id = trio.run(find)
        if session_id is None:
            return EXIT_USAGE
        args.session_id = session_id
        loaded = trio.run(load)
    except (SessionNotFoundError, InvalidSessionIdError) as exc:
        _error(str(exc))
        return EXIT_USAGE
    except HarnessError as exc:
        _error(str(exc))
        return EXIT_FAILED
    for line in _for_stdout(transcript(loaded.header, loaded.events, width=args.width)):
        print(line)
    return EXIT_OK


def _for_stdout(lines: list[str]) -> list[str]:
    """``lines`` made inert when stdout is a terminal (docs/cli.rst); exact into a file or pipe."""
    from ._cli_progress import inert

    return [inert(line) for line in lines] if sys.stdout.isatty() else lines


def unique_session(stored: Sequence[str], wanted: str) -> str | None:
    """The stored session id ``wanted`` names: itself, or the one id it prefixes (None: reported)."""
    ids = sorted(stored)
    if wanted in ids:
        return wanted
    matches = [session_id for session_id in ids if session_id.startswith(wanted)] if wanted else []
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        _error(f"session prefix {wanted!r} is ambiguous: it matches {', '.join(matches)}; give more of the id")
        return None
    return wanted  # loading it reports the unknown (or invalid) id


def transcript(header: SessionHeader, events: Sequence[Event], *, width: int = 500) -> list[str]:
    """A readable transcript of a session log, as lines.

    Args:
        header: the session header.
        events: the session's events.
        width: tool arguments and results are cut to this many characters.
    """
    from .session import _events as ev
    from .session._paused import paused_calls

    lines = [
        f"session {header.id}",
        f"created {_local_time(header.created_at)}  cwd {header.cwd or '?'}",
    ]
    if header.parent_session is not None:
        lines.append(f"forked from {header.parent_session} (first {header.seed_length} events)")
    lines.append(f"{len(events)} events")
    # Calls whose handler started (tool/started) and that have no result yet, by call id.
    running: dict[str, ev.ToolStarted] = {}
    arguments: dict[str, str] = {}
    for event in events:
        if isinstance(event, ev.TurnStart):
            lines += ["", f"=== turn {event.turn} ==="]
        elif isinstance(event, ev.UserMessage):
            # A background task's completion notice is no user text (docs/tasks.rst).
            who = "notice" if event.origin == "task-notice" else "user"
            who = who if event.mode == "followup" else f"{who} ({event.mode})"
            lines.append(f"{who}: {_indent(event.text)}")
            for part in event.images:  # the size of the image file (a reference's, or the base64's)
                size = part.size if part.by_reference else len(part.data) * 3 // 4 - part.data.count("=")
                lines.append(f"  [image] {part.media_type}, {size} bytes")
        elif isinstance(event, ev.AssistantMessage):
            if event.reasoning:
                lines.append(f"thinking: {_shorten(event.reasoning, width)}")
            if event.text:
                lines.append(f"assistant: {_indent(event.text)}")
        elif isinstance(event, ev.ToolCallRequested):
            arguments[event.call_id] = event.arguments
            lines.append(f"  [tool] {event.name} {_shorten(_compact_arguments(event.arguments), width)}")
        elif isinstance(event, ev.ToolStarted):
            running[event.call_id] = event
        elif isinstance(event, ev.ToolResult):
            running.pop(event.call_id, None)
            label = "[tool error]" if event.is_error else "[tool result]"
            lines += _result_lines(label, event.content, width)
        elif isinstance(event, ev.ApprovalDecided):
            decided = f"  [approval] {event.name}: {event.outcome.replace('_', ' ')} ({event.source})"
            if event.cause is not None:
                decided += f" (cause: {event.cause})"
            if event.message:
                decided += f": {_shorten(event.message, width)}"
            lines.append(decided)
        elif isinstance(event, ev.RequestRetry):
            lines.append(f"  [retry {event.attempt}] {event.failure.message} ({event.failure.code})")
        elif isinstance(event, ev.ContextCompacted):
            lines.append(
                f"--- context compacted ({event.reason}): events before seq {event.boundary} summarized "
                f"({len(event.summary)} characters) ---"
            )
        elif isinstance(event, ev.CompactionFailed) and event.failure.code == "cancelled":
            lines.append(f"--- context compaction cancelled ({event.reason}) ---")
        elif isinstance(event, ev.CompactionFailed):
            lines.append(
                f"--- context compaction failed ({event.reason}): {event.failure.message} ({event.failure.code}) ---"
            )
        elif isinstance(event, ev.ApprovalRequested):
            lines.append(f"  [approval] {event.name}: asked")
        elif isinstance(event, ev.ControlRefused):
            what = f"decision for {event.call_id}" if event.call_id is not None else event.kind
            lines.append(f"  [posted {what} not applied] {_shorten(event.reason, width)}")
        elif isinstance(event, ev.TurnEnd):
            reason: str = event.reason
            if event.cause is not None:
                reason += f" (cause: {event.cause})"
            if event.failure is not None:
                reason += f": {event.failure.message} ({event.failure.code})"
            lines.append(f"--- turn {event.turn} ended: {reason} ---")
    for call in paused_calls(events):  # docs/approval.rst, "Paused approvals"
        lines.append(f"[waiting for approval] {call.name} {_shorten(_compact_arguments(call.arguments), width)}")
    for started in running.values():  # docs/guarantees.rst, "Durable steps"
        shown = _shorten(_compact_arguments(arguments.get(started.call_id, "")), width)
        lines.append(
            f"[started, no result] {started.name} {shown} (call {started.call_id}): still running, or interrupted "
            "with its process (it may have had effects)"
        )
    return lines


def _result_lines(label: str, content: str, width: int) -> list[str]:
    """A tool result in a transcript: beside its label when one line, else its lines indented under it.

    Either way it is cut to ``width`` characters (newlines included), ending in ``…`` when cut.
    """
    content = content.strip("\n")
    if "\n" not in content:
        return [f"  {label} {_shorten(content, width)}".rstrip()]
    if len(content) > width:
        content = content[: max(width - 1, 0)] + "…"
    return [f"  {label}", *(f"    {line}".rstrip() for line in content.split("\n"))]


def _indent(text: str) -> str:
    return text.replace("\n", "\n  ")
