"""The Anthropic Messages event stream, parsed without I/O (sans-io).

:class:`AnthropicStreamParser` takes the server-sent events of one streamed
``POST /v1/messages`` response (decoded by :mod:`trio_harness.model._sse`) and
turns them into the chunks of :mod:`trio_harness.model._protocol`:

* ``message_start`` - the usage so far (input tokens, cache reads and writes);
* ``content_block_start`` / ``content_block_delta`` / ``content_block_stop`` -
  ``text_delta`` as :class:`~trio_harness.model.TextDelta`; a ``tool_use``
  block as :class:`~trio_harness.model.ToolCallDelta` s (its id and name when
  it starts, each ``input_json_delta`` as an arguments fragment; the ``index``
  counts the tool-use blocks of the message, so parallel calls are 0, 1, ...);
  a ``thinking`` block's ``thinking_delta`` as
  :class:`~trio_harness.model.ReasoningDelta` (for display), and, when the
  block stops, the whole block (its text and ``signature``) as a
  :class:`~trio_harness.model.ReasoningBlock`; a ``redacted_thinking`` block,
  a ``server_tool_use`` (its ``input_json_delta`` s parsed), a server tool's
  result and a block of a kind added later as a ReasoningBlock alone;
* ``message_delta`` - the ``stop_reason`` and the final usage;
* ``message_stop`` - the end: the parser is :attr:`~AnthropicStreamParser.done`;
* ``ping`` - nothing; ``error`` - a failure (``overloaded_error`` and
  ``rate_limit_error`` retryable, like HTTP 529 and 429).

A :class:`~trio_harness.model.ReasoningBlock` of this parser has
``provider="anthropic"`` and ``data={"index": I, "block": BLOCK, "before":
{"text": CHARS, "tool_calls": N}}``: ``BLOCK`` is the content block exactly
as the server built it (the start event's object with the streamed
``thinking`` text and ``signature`` filled in), ``I`` its position in the
message's content, ``before`` the characters of text and the tool calls of
the message that came before it, which
:func:`~trio_harness.model._anthropic.assistant_content` uses to put it back
where it was.

A delta must fit its block (``text_delta`` a text block, ``input_json_delta``
a ``tool_use`` or ``server_tool_use``, ``thinking_delta`` and
``signature_delta`` a thinking block); blocks still open at ``message_stop``
(or when a stream with its ``stop_reason`` ends) are completed as they are.

Failures are values, as in :class:`~trio_harness.model._chunks.ChunkParser`:
bad JSON, an event of the wrong shape (a delta that does not fit its block, an
index that is not a number) or an ``error`` event stops the parser
and becomes the outcome of :meth:`~AnthropicStreamParser.conclude`; the chunks
of the events before it are still emitted.  The result never depends on how
the events were batched.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Final

from ._interleave import BEFORE, anchor
from ._protocol import (
    Chunk,
    Failure,
    Finish,
    FinishReason,
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from ._sse import SSEEnd, SSEEvent
from ._stream_base import StreamFailure, StreamParserBase, count

PROVIDER: Final = "anthropic"
"""The ``provider`` of the reasoning blocks this parser reports."""

_DECODER: Final = json.JSONDecoder()
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = getattr(_DECODER, "scan_once", _DECODER.raw_decode)

STOP_REASONS: Final[Mapping[str, FinishReason]] = {
    "end_turn": "stop",
    "stop_sequence": "stop",
    "tool_use": "tool-calls",
    "max_tokens": "max-tokens",
    "model_context_window_exceeded": "max-tokens",
}
"""How Anthropic's ``stop_reason`` values map to finish reasons (``refusal`` and
``pause_turn`` are failures, see :meth:`AnthropicStreamParser.conclude`)."""

_DELTAS: Final[Mapping[str, frozenset[str]]] = {
    "text": frozenset({"text_delta", "citations_delta"}),
    "thinking": frozenset({"thinking_delta", "signature_delta"}),
    "redacted_thinking": frozenset(),
    "tool_use": frozenset({"input_json_delta"}),
    "server_tool_use": frozenset({"input_json_delta"}),
}
"""The deltas of the spec each known kind of content block takes; another of them is a malformed stream
(blocks of other kinds, and delta kinds added later, are not checked)."""

_KNOWN_DELTAS: Final = frozenset().union(*_DELTAS.values())

_RETRYABLE_ERRORS: Final[Mapping[str, int]] = {
    "overloaded_error": 529,
    "rate_limit_error": 429,
    "api_error": 500,
    "timeout_error": 504,
}
"""Error event types a retry may cure, with the HTTP status they stand for."""


class _Block:
    """What the parser keeps of one open content block."""

    __slots__ = ("before", "kind", "parts", "raw", "signature", "streamed", "tool")

    def __init__(self, kind: str, raw: dict[str, Any], tool: int, before: dict[str, int]) -> None:
        self.kind = kind
        self.raw = raw
        self.tool = tool  # the tool-call index of a tool_use block, else -1
        self.before = before  # the text and tool calls of the message before the block
        self.parts: list[str] = []  # thinking text pieces
        self.signature: str | None = None
        self.streamed = False  # a tool_use block got arguments


class AnthropicStreamParser(StreamParserBase):
    """Parser of one Messages stream (see the module docstring).

    Args:
        name: the provider's name, which starts every failure message.
    """

    __slots__ = (
        "_blocks",
        "_chars",
        "_content",
        "_offset",
        "_stop_reason",
        "_stopped",
        "_tools",
        "_usage",
    )

    def __init__(self, name: str, *, tools: int = 0, offset: int = 0, text: int = 0) -> None:
        super().__init__(name)
        # A continuation of a paused turn (see content): its tool calls, blocks
        # and text are counted after the earlier parts'.
        self._offset = offset
        self._chars = text  # the characters of text emitted (TextDelta), the earlier parts' included
        self._content: dict[int, dict[str, Any]] = {}
        self._stop_reason: str | None = None
        self._stopped = False  # message_stop seen
        self._usage: dict[str, Any] = {}
        self._blocks: dict[int, _Block] = {}
        self._tools = tools

    # ------------------------------------------------------------ state

    @property
    def stop_reason(self) -> str | None:
        """The ``stop_reason`` of the last ``message_delta``, if any."""
        return self._stop_reason

    @property
    def tools(self) -> int:
        """How many tool calls the message has (those of the earlier parts included)."""
        return self._tools

    @property
    def text_chars(self) -> int:
        """How many characters of text the message has (those of the earlier parts included)."""
        return self._chars

    @property
    def content(self) -> list[dict[str, Any]]:
        """The message's completed content blocks, in order, as the server built them.

        Text with its whole text, ``tool_use`` and ``server_tool_use`` with
        their parsed ``input``, thinking with its text and signature, others
        as they started.  A paused turn (``stop_reason`` ``pause_turn``) is
        continued by sending them back as the assistant's message.
        """
        return [self._content[index] for index in sorted(self._content)]

    @property
    def usage(self) -> Usage | None:
        """The usage reported so far (``message_start``, updated by ``message_delta``), if any.

        ``input_tokens`` is the whole prompt: Anthropic's ``input_tokens``
        (the uncached part) plus ``cache_read_input_tokens`` and
        ``cache_creation_input_tokens``; the reads are ``cache_hit_tokens``,
        the writes ``cache_write_tokens``.
        """
        usage = self._usage
        if not usage:
            return None
        uncached = count(usage.get("input_tokens"))
        reads = count(usage.get("cache_read_input_tokens"))
        writes = count(usage.get("cache_creation_input_tokens"))
        return Usage(
            input_tokens=uncached + reads + writes,
            output_tokens=count(usage.get("output_tokens")),
            cache_hit_tokens=reads,
            cache_write_tokens=writes,
        )

    # ------------------------------------------------------------ input

    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None:
        """Take events in order, passing each chunk to ``emit`` at once (the hot path).

        Stops at ``message_stop`` or at the first failure; events after that
        are ignored.
        """
        if self._done:
            return
        scan = _SCAN
        blocks = self._blocks
        emitted = False
        try:
            for event in events:
                data = event.data
                try:
                    obj, end = scan(data, 0)
                except (StopIteration, ValueError, RecursionError):  # too deep a nesting too
                    raise self._malformed(f"bad JSON in an event: {data[:200]!r}") from None
                if end != len(data) and not data[end:].isspace():
                    raise self._malformed(f"bad JSON in an event: {data[:200]!r}")
                if type(obj) is not dict:
                    raise self._malformed(f"an event is not a JSON object: {data[:200]!r}")
                kind = obj.get("type")
                if kind == "content_block_delta":
                    delta = obj.get("delta")
                    if (
                        type(delta) is dict
                        and delta.get("type") == "text_delta"
                        and type(index := obj.get("index")) is int
                        and (block := blocks.get(index)) is not None
                        and block.kind == "text"
                    ):
                        # The bulk of every stream: a piece of text.
                        text = delta.get("text")
                        if type(text) is not str:
                            raise self._malformed(f"a text_delta has no text: {data[:200]!r}")
                        if text:
                            block.parts.append(text)
                            self._chars += len(text)
                            emitted = True
                            emit(TextDelta(text))
                        continue
                    if self._on_delta(obj, delta, data, emit):
                        emitted = True
                elif kind == "content_block_start":
                    if self._on_start(obj, data, emit):
                        emitted = True
                elif kind == "content_block_stop":
                    index = obj.get("index")
                    block = blocks.pop(index, None) if type(index) is int else None
                    if block is not None and self._on_stop(index, block, emit):  # type: ignore[arg-type]
                        emitted = True
                elif kind == "message_delta":
                    self._on_message_delta(obj, data)
                elif kind == "message_start":
                    message = obj.get("message")
                    if type(message) is not dict:
                        raise self._malformed(f"message_start has no message: {data[:200]!r}")
                    if self._info is None:
                        self._take_info(message)
                    usage = message.get("usage")
                    if type(usage) is dict:
                        self._usage.update(usage)
                elif kind == "message_stop":
                    self._stopped = True
                    self._done = True
                    if blocks and self._close_open(emit):
                        emitted = True
                    break
                elif kind == "error" or event.type == "error":
                    raise StreamFailure(self._error_event(obj.get("error", obj), data))
                # "ping" and event types added later are ignored.
        except StreamFailure as exc:
            self._failure = exc.failure
            self._done = True
        finally:
            if emitted:
                self._emitted = True

    def feed_message(self, body: bytes) -> list[Chunk]:
        """Take a whole JSON Message (a server that answered ``stream: true`` without streaming).

        Its content blocks are read as the events that would have streamed
        them (each block whole in its ``content_block_start``); an error
        object is the failure.  The parser is :attr:`done` after it.
        """
        if self._done:
            return []
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            obj = None
        excerpt = body[:200].decode(errors="replace")
        if type(obj) is dict and obj.get("type") == "error":
            self._done = True
            self._failure = self._error_event(obj.get("error", obj), excerpt)
            return []
        if type(obj) is not dict or obj.get("type") != "message" or type(obj.get("content")) is not list:
            self._done = True
            self._failure = Failure("malformed-stream", f"{self.name}: expected an event stream, got: {excerpt}")
            return []
        start = {key: value for key, value in obj.items() if key != "content"}
        events = [SSEEvent(json.dumps({"type": "message_start", "message": {**start, "content": []}}))]
        for index, block in enumerate(obj["content"]):
            events.append(SSEEvent(json.dumps({"type": "content_block_start", "index": index, "content_block": block})))
            events.append(SSEEvent(json.dumps({"type": "content_block_stop", "index": index})))
        delta = {"stop_reason": obj.get("stop_reason"), "stop_sequence": obj.get("stop_sequence")}
        events.append(SSEEvent(json.dumps({"type": "message_delta", "delta": delta})))
        events.append(SSEEvent(json.dumps({"type": "message_stop"})))
        return self.feed_all(events)

    feed_body = feed_message

    def feed_end(self, end: SSEEnd) -> list[Chunk]:
        """Take what :meth:`SSEDecoder.close <trio_harness.model._sse.SSEDecoder.close>` found at the end.

        A last event that lacked its blank line is taken like any other; a
        line cut off before any ``stop_reason`` is a ``truncated-stream``
        failure (retryable).
        """
        if self._done:
            return []
        if end.truncated and self._stop_reason is None:
            self._failure = Failure(
                "truncated-stream", f"{self.name}: stream ended in the middle of a line", retryable=True
            )
            self._done = True
            return []
        chunks = self.feed_all((end.event,)) if end.event is not None else []
        # A stream ending after its stop_reason without message_stop is complete (conclude): so are its blocks.
        if self._failure is None and self._stop_reason is not None and self._blocks and self._close_open(chunks.append):
            self._emitted = True
        return chunks

    # ------------------------------------------------------------ outcome

    def conclude(self, failure: Failure | None = None) -> Finish | Failure:
        """The outcome, once the stream is over (or will not be read further).

        In order: a failure the stream carried; with a ``stop_reason``, the
        finish it maps to (``refusal`` is a ``refusal`` failure; ``pause_turn``
        a ``pause-turn`` failure, which the provider turns into a continuation
        while it may, see :attr:`content`); else ``failure`` (why the stream
        ended early) or a ``no-finish`` failure.
        """
        if self._failure is not None:
            return self._failure
        reason = self._stop_reason
        if reason is None:
            if self._stopped:
                return Failure("no-finish", f"{self.name}: message_stop came without a stop_reason")
            return failure or Failure("no-finish", f"{self.name}: stream ended without a stop_reason or message_stop")
        if reason == "refusal":
            return Finish(
                reason="error",
                failure=Failure("refusal", f"{self.name}: the model refused to answer (stop_reason 'refusal')"),
            )
        if reason == "pause_turn":
            return Finish(
                reason="error",
                failure=Failure(
                    "pause-turn", f"{self.name}: the server paused a long-running turn (stop_reason 'pause_turn')"
                ),
            )
        mapped = STOP_REASONS.get(reason)
        if mapped is None:
            mapped = "tool-calls" if self._tools else "stop"
        return Finish(reason=mapped)

    # ------------------------------------------------------------ events

    def _index(self, obj: dict[str, Any], data: str) -> int:
        index = obj.get("index")
        if type(index) is not int or index < 0:
            raise self._malformed(f"an event has no valid content block index: {data[:200]!r}")
        return index

    def _on_start(self, obj: dict[str, Any], data: str, emit: Callable[[Chunk], None]) -> bool:
        index = self._index(obj, data)
        raw = obj.get("content_block")
        if type(raw) is not dict or type(kind := raw.get("type")) is not str:
            raise self._malformed(f"content_block_start has no typed content_block: {data[:200]!r}")
        if index in self._blocks or index + self._offset in self._content:
            raise self._malformed(f"content block {index} started twice: {data[:200]!r}")
        tool = -1
        emitted = False
        before = anchor(self._chars, self._tools)
        if kind == "tool_use":
            call_id, name = raw.get("id"), raw.get("name")
            if type(call_id) is not str or type(name) is not str or not call_id or not name:
                raise self._malformed(f"a tool_use block needs an id and a name: {data[:200]!r}")
            tool = self._tools
            self._tools += 1
            emit(ToolCallDelta(index=tool, id=call_id, name=name))
            emitted = True
        elif kind == "text":
            text = raw.get("text")
            if type(text) is str and text:
                self._chars += len(text)
                emit(TextDelta(text))
                emitted = True
        elif kind == "thinking":
            thinking = raw.get("thinking")
            if type(thinking) is str and thinking:
                emit(ReasoningDelta(thinking))
                emitted = True
        block = _Block(kind, raw, tool, before)
        if kind == "tool_use":
            given = raw.get("input")
            if type(given) is dict and given:
                # A server that sends the whole input up front, not as deltas.
                emit(ToolCallDelta(index=tool, arguments=json.dumps(given, ensure_ascii=False)))
                block.streamed = True
        self._blocks[index] = block
        return emitted

    def _on_delta(self, obj: dict[str, Any], delta: object, data: str, emit: Callable[[Chunk], None]) -> bool:
        index = self._index(obj, data)
        block = self._blocks.get(index)
        if block is None:
            raise self._malformed(f"a delta for content block {index}, which is not open: {data[:200]!r}")
        if type(delta) is not dict:
            raise self._malformed(f"content_block_delta has no delta object: {data[:200]!r}")
        kind = delta.get("type")
        takes = _DELTAS.get(block.kind)
        if takes is not None and kind in _KNOWN_DELTAS and kind not in takes:
            raise self._malformed(f"a {kind} for content block {index}, a {block.kind} block: {data[:200]!r}")
        if kind == "input_json_delta":
            partial = delta.get("partial_json")
            if type(partial) is not str:
                raise self._malformed(f"a bad input_json_delta: {data[:200]!r}")
            if partial:
                block.parts.append(partial)
                if block.kind == "tool_use":  # a server_tool_use runs on the server: not a call to make
                    block.streamed = True
                    emit(ToolCallDelta(index=block.tool, arguments=partial))
                    return True
            return False
        if kind == "thinking_delta":
            thinking = delta.get("thinking")
            if type(thinking) is not str:
                raise self._malformed(f"a thinking_delta has no thinking text: {data[:200]!r}")
            block.parts.append(thinking)
            if thinking:
                emit(ReasoningDelta(thinking))
                return True
            return False
        if kind == "signature_delta":
            signature = delta.get("signature")
            if type(signature) is not str:
                raise self._malformed(f"a signature_delta has no signature: {data[:200]!r}")
            block.signature = (block.signature or "") + signature
            return False
        if kind == "text_delta":  # a text of the wrong type, or text for a block of a kind added later
            if type(delta.get("text")) is not str:
                raise self._malformed(f"a text_delta has no text: {data[:200]!r}")
            return False
        return False  # citations_delta and later kinds carry nothing this harness keeps

    def _close_open(self, emit: Callable[[Chunk], None]) -> bool:
        """Complete the blocks the server did not stop, in index order (the message is over)."""
        emitted = False
        blocks = self._blocks
        for index in sorted(blocks):
            if self._on_stop(index, blocks.pop(index), emit):
                emitted = True
        return emitted

    def _on_stop(self, index: int, block: _Block, emit: Callable[[Chunk], None]) -> bool:
        raw = dict(block.raw)
        position = index + self._offset
        self._content[position] = raw
        kind = block.kind
        if kind == "text":
            if block.parts:
                raw["text"] = str(raw.get("text") or "") + "".join(block.parts)
            return False
        if kind in ("tool_use", "server_tool_use"):
            if block.parts:
                try:
                    raw["input"] = json.loads("".join(block.parts))
                except (ValueError, RecursionError):
                    raw["input"] = {}  # the call's arguments are reported as they came; the tool refuses them
            if kind == "tool_use":
                if not block.streamed:
                    emit(ToolCallDelta(index=block.tool, arguments="{}"))  # a call without arguments
                return False
        elif kind == "thinking":
            raw["thinking"] = str(raw.get("thinking") or "") + "".join(block.parts)
            if block.signature is not None:
                raw["signature"] = block.signature
        # Every other block (thinking, redacted thinking, server tools and their results, kinds added
        # later) goes back exactly as received, where it stood among the text and the tool calls.
        emit(ReasoningBlock(PROVIDER, {"index": position, "block": raw, BEFORE: block.before}))
        return True

    def _on_message_delta(self, obj: dict[str, Any], data: str) -> None:
        delta = obj.get("delta")
        if delta is not None and type(delta) is not dict:
            raise self._malformed(f"message_delta's delta is not an object: {data[:200]!r}")
        reason = delta.get("stop_reason") if delta else None
        if reason is not None:
            if type(reason) is not str:
                raise self._malformed(f"stop_reason is not a string: {data[:200]!r}")
            self._stop_reason = reason
        usage = obj.get("usage")
        if usage is not None:
            if type(usage) is not dict:
                raise self._malformed(f"message_delta's usage is not an object: {data[:200]!r}")
            # Counts here are cumulative; null ones (some servers) keep the start's.
            self._usage.update({key: value for key, value in usage.items() if value is not None})

    # ------------------------------------------------------------ failures

    def _error_event(self, error: object, data: str) -> Failure:
        kind = error.get("type") if isinstance(error, dict) else None
        message = error.get("message") if isinstance(error, dict) else None
        text = str(message) if message else data[:200]
        label = f"{kind}: {text}" if kind else text
        status = _RETRYABLE_ERRORS.get(kind) if type(kind) is str else None
        if status is not None:
            return Failure(f"http-{status}", f"{self.name}: error in the stream: {label}", retryable=True)
        return Failure("stream-error", f"{self.name}: error in the stream: {label}")
