"""Reading a JSONL session log back: strict where nothing can be damaged, tolerant where a crash leaves damage.

The first line is the header, every later line one event.  A torn last line
(no newline) is dropped, and so is a bad line after the last committed
``turn/end``; a bad line before it is a :class:`SessionCorruptError` naming
the file and line.  :func:`parse_log` changes nothing on disk: it says how
many bytes are good (``valid_length``) and how many were dropped
(``dropped_tail``), and a writer resuming a log with a dropped tail cuts the
tail off before its first append (:mod:`._jsonl_writer`).
"""

from __future__ import annotations

import logging

from .._errors import EventDecodeError, SessionCorruptError
from ._codec import decode_event, decode_event_line, decode_header
from ._events import Event, TurnEnd
from ._persistence import LoadedSession

log = logging.getLogger("trio_harness.session.jsonl")

_TURN_END_MARK = b'"type":"turn/end"'


def parse_log(data: bytes, path: str) -> LoadedSession:
    """Parse the bytes of a session log (see the module docs).

    Raises:
        SessionCorruptError: the header is incomplete or damaged, or a line
            before the last committed ``turn/end`` is bad.
        UnsupportedFormatError: the header names another format version.
    """
    lines = data.split(b"\n")
    tail = lines.pop()  # the bytes after the last newline: a torn line, or b""
    if not lines:
        raise SessionCorruptError(f"{path}:1: the session header is incomplete", path=path, line=1)
    try:
        header = decode_header(lines[0])
    except EventDecodeError as exc:
        raise SessionCorruptError(f"{path}:1: {exc}", path=path, line=1) from exc
    offset = len(lines[0]) + 1
    events: list[Event] = []
    for index in range(1, len(lines)):
        raw = lines[index]
        try:
            event = decode_event_line(raw)
            if event.seq != len(events):
                raise EventDecodeError(f"event seq {event.seq} where {len(events)} was expected")
        except EventDecodeError as exc:
            if any(_TURN_END_MARK in later and _is_turn_end(later) for later in lines[index + 1 :]):
                raise SessionCorruptError(
                    f"{path}:{index + 1}: {exc} (the log is damaged before its last committed turn; "
                    "repair or remove the file)",
                    path=path,
                    line=index + 1,
                ) from exc
            dropped = len(data) - offset
            log.warning(
                "%s:%d: dropping %d uncommitted bytes after the last turn end: %s", path, index + 1, dropped, exc
            )
            return LoadedSession(header=header, events=tuple(events), dropped_tail=dropped, valid_length=offset)
        events.append(event)
        offset += len(raw) + 1
    return LoadedSession(header=header, events=tuple(events), dropped_tail=len(tail), valid_length=offset)


def _is_turn_end(raw: bytes) -> bool:
    try:
        return isinstance(decode_event(raw), TurnEnd)
    except EventDecodeError:
        return False
