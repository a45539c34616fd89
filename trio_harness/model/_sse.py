"""A server-sent events decoder that never touches a socket (sans-io).

:class:`SSEDecoder` turns the text of an ``text/event-stream`` body into
:class:`SSEEvent` records, following the WHATWG HTML "server-sent events"
parsing rules: lines end with CRLF, LF or CR (a CRLF split between two pieces
is still one line end); a line starting with ``:`` is a comment; ``field:
value`` drops one space after the colon; ``data`` lines of one event are
joined with LF; ``id`` sets the last event id (kept across events, ignored
when it contains NUL); ``retry`` sets the reconnection time when it is only
ASCII digits; other fields are ignored; a blank line dispatches the event,
unless it has no ``data`` line; a byte-order mark at the start of the stream
is dropped.

The caller feeds whatever arrived (:meth:`SSEDecoder.feed` for text,
:meth:`SSEDecoder.feed_bytes` for UTF-8 bytes, decoded incrementally so a
character split between two reads is fine) and gets the events it completed;
the result never depends on where the input was split.  At the end of the
body, :meth:`SSEDecoder.close` says what was left: the last event when its
lines were complete but its blank line never came (a browser discards it;
many servers end the body right after the last ``data`` line, so it is handed
back and the caller decides), and the start of a line cut off by the end of
the stream, which means the stream was truncated.

A piece of stream made only of plain events (one ``data: ...`` line each, the
bulk of any model stream) comes back as :class:`SSEMessages`: one object
holding their data strings, read as :class:`SSEEvent` objects on demand.  The
hot path (:meth:`ChunkParser.feed_into
<trio_harness.model._chunks.ChunkParser.feed_into>`) reads the strings
directly, so it makes no object per event and leaves the garbage collector
nothing to do.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterator, Sequence
from typing import Final, overload

import attrs

MAX_EVENT_CHARS: Final = 16 * 1024 * 1024
"""The longest event (in characters) a decoder buffers before giving up."""


class SSEError(ValueError):
    """The input is not an event stream the decoder can read (not UTF-8, an event too long)."""


@attrs.frozen
class SSEEvent:
    """One dispatched event.

    Attributes:
        data: the event's data lines joined with LF.
        type: the event type (the ``event`` field), ``"message"`` when unset.
        id: the last event id when the event was dispatched (``""`` if none).
    """

    data: str
    type: str = "message"
    id: str = ""


class SSEMessages(Sequence[SSEEvent]):
    """Plain events in a row (type ``"message"``, one last event id), kept as their data strings.

    A sequence of :class:`SSEEvent`: indexing or iterating makes the event
    objects; :attr:`data` is the list of data strings, which the hot path
    reads without making them.  Equal to any sequence of the same events.

    Attributes:
        data: each event's data, in order.
        id: the last event id of every one of them.
    """

    __slots__ = ("data", "id")

    def __init__(self, data: list[str], id: str = "") -> None:
        self.data = data
        self.id = id

    def __len__(self) -> int:
        return len(self.data)

    @overload
    def __getitem__(self, index: int) -> SSEEvent: ...

    @overload
    def __getitem__(self, index: slice) -> list[SSEEvent]: ...

    def __getitem__(self, index: int | slice) -> SSEEvent | list[SSEEvent]:
        if isinstance(index, slice):
            return [SSEEvent(data, "message", self.id) for data in self.data[index]]
        return SSEEvent(self.data[index], "message", self.id)

    def __iter__(self) -> Iterator[SSEEvent]:
        ident = self.id
        for data in self.data:
            yield SSEEvent(data, "message", ident)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str | bytes):
            return NotImplemented
        return list(self) == list(other)

    __hash__ = None  # type: ignore[assignment]  # mutable, like a list

    def __repr__(self) -> str:
        return f"SSEMessages({self.data!r}, id={self.id!r})"


@attrs.frozen
class SSEEnd:
    """What :meth:`SSEDecoder.close` found at the end of the stream.

    Attributes:
        event: the last event, when it had complete ``data`` lines but the
            blank line that dispatches it never came; else None.
        partial_line: the start of a line the end of the stream cut off (or
            an incomplete UTF-8 character): the stream was truncated.  None
            when the stream ended at a line end.
    """

    event: SSEEvent | None = None
    partial_line: str | None = None

    @property
    def truncated(self) -> bool:
        """True when the stream ended in the middle of a line."""
        return self.partial_line is not None


class SSEDecoder:
    """Incremental server-sent events decoder (see the module docstring).

    Attributes:
        last_event_id: the last event id buffer (the ``id`` field).
        retry: the reconnection time in milliseconds the server asked for
            (the ``retry`` field), or None.
    """

    __slots__ = ("_bom_checked", "_closed", "_decode", "_pending", "_size", "_skip_lf", "last_event_id", "retry")

    def __init__(self) -> None:
        self.last_event_id = ""
        self.retry: int | None = None
        # The text of the event not yet ended by a blank line, line ends
        # normalised to LF, in the pieces it came in (joined once, when the
        # event ends: a long event fed in small pieces costs linear time), and
        # its length.
        self._pending: list[str] = []
        self._size = 0
        # The last piece ended with a CR: an LF starting the next one is the
        # rest of that CRLF, not another line end.
        self._skip_lf = False
        self._bom_checked = False
        self._closed = False
        self._decode = codecs.getincrementaldecoder("utf-8")().decode

    def feed_bytes(self, data: bytes) -> Sequence[SSEEvent]:
        """Decode ``data`` as the next UTF-8 bytes of the stream and :meth:`feed` the text.

        Raises:
            SSEError: the bytes are not UTF-8, or an event is too long.
        """
        try:
            text = self._decode(data)
        except UnicodeDecodeError as exc:
            raise SSEError(f"stream is not UTF-8: {exc}") from None
        return self.feed(text)

    def feed(self, text: str) -> Sequence[SSEEvent]:
        """Take the next piece of the stream's text; return the events it completed, in order.

        The events are a list, or an :class:`SSEMessages` when they are all
        plain ``data: ...`` events.

        Raises:
            SSEError: an event is longer than :data:`MAX_EVENT_CHARS`.
            RuntimeError: the decoder was closed.
        """
        if self._closed:
            raise RuntimeError("SSEDecoder.feed() after close()")
        if not self._bom_checked and text:
            self._bom_checked = True
            if text[0] == "\ufeff":
                text = text[1:]
        if self._skip_lf and text:
            # The piece before ended with a CR: an LF here completes that CRLF.
            self._skip_lf = False
            if text[0] == "\n":
                text = text[1:]
        if "\r" in text:
            self._skip_lf = text[-1] == "\r"
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if not text:
            return []
        pending = self._pending
        cut = text.rfind("\n\n")
        if cut < 0 and not (pending and text[0] == "\n" and pending[-1][-1] == "\n"):
            # No event ends in this piece (nor where it meets the one before): keep it.
            pending.append(text)
            self._size += len(text)
            if self._size > MAX_EVENT_CHARS:
                raise SSEError(f"an event is longer than {MAX_EVENT_CHARS} characters")
            return []
        if pending:
            text = "".join(pending) + text
            cut = text.rfind("\n\n")
        rest = text[cut + 2 :]
        self._pending = [rest] if rest else []
        self._size = len(rest)
        if self._size > MAX_EVENT_CHARS:
            raise SSEError(f"an event is longer than {MAX_EVENT_CHARS} characters")
        # The events complete in this piece, without the blank line that ends the last one.
        region = text[:cut]
        separators = region.count("\n\n")
        if region[:6] == "data: " and region.count("\n") == 2 * separators and region.count("\n\ndata: ") == separators:
            # Nearly every piece: events that are each a single "data: ..." line
            # (every newline is in an event separator, each event starts with
            # "data: "), taken in one split.
            return SSEMessages(region[6:].split("\n\ndata: "), self.last_event_id)
        events: list[SSEEvent] = []
        for block in region.split("\n\n"):
            event = self._parse(block)
            if event is not None:
                events.append(event)
        return events

    def close(self) -> SSEEnd:
        """End of the stream: report what was left (see :class:`SSEEnd`).

        The decoder cannot be fed afterwards; closing again reports nothing.
        """
        if self._closed:
            return SSEEnd()
        self._closed = True
        try:
            tail = self._decode(b"", True)
        except UnicodeDecodeError:
            tail = "\ufffd"  # an incomplete character: the stream was cut
        rest = "".join(self._pending) + tail
        self._pending = []
        self._size = 0
        complete, newline, partial = rest.rpartition("\n")
        event = self._parse(complete) if newline else None
        return SSEEnd(event=event, partial_line=partial or None)

    def _parse(self, block: str) -> SSEEvent | None:
        """Parse the lines of one event (no blank line inside but leading ones)."""
        data: list[str] = []
        kind = ""
        for line in block.split("\n"):
            if not line or line[0] == ":":
                continue  # a blank line before the event, or a comment
            field, _, value = line.partition(":")
            if value[:1] == " ":
                value = value[1:]
            if field == "data":
                data.append(value)
            elif field == "event":
                kind = value
            elif field == "id" and "\0" not in value:
                self.last_event_id = value
            elif field == "retry" and value.isascii() and value.isdigit():
                self.retry = int(value)
        if not data:
            return None
        return SSEEvent("\n".join(data), kind or "message", self.last_event_id)
