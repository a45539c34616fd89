"""The OpenAI chat-completions chunk stream, parsed without I/O (sans-io).

:class:`ChunkParser` takes the events of one streamed chat completion (the
``data:`` payloads of :mod:`trio_harness.model._sse`) and turns them into the
chunks of :mod:`trio_harness.model._protocol`: text deltas, reasoning deltas
(DeepSeek's ``reasoning_content``, or ``reasoning``), tool-call deltas (with
the index inferred for servers that omit it), and, once the stream is over,
the usage (with DeepSeek's ``prompt_cache_hit_tokens`` or OpenAI's
``prompt_tokens_details.cached_tokens``) and the outcome from
:meth:`ChunkParser.conclude`: a :class:`~trio_harness.model.Finish` or a
:class:`~trio_harness.model.Failure`.

Failures are values here too: a malformed payload (bad JSON, a field of the
wrong type) or an error object sent inside the stream stops the parser
(:attr:`ChunkParser.done`) and becomes the outcome; the chunks of the events
before it are still returned.  ``[DONE]`` stops it as well.  The result never
depends on how the events were batched: ``feed_all(a + b) == feed_all(a) +
feed_all(b)``.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping
from itertools import repeat
from typing import Any, Final

import attrs

from ._protocol import (
    Chunk,
    Failure,
    Finish,
    FinishReason,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from ._sse import SSEEnd, SSEEvent, SSEMessages
from ._stream_base import RETRYABLE_ERROR_CODES, StreamFailure, StreamParserBase, count

_DECODER: Final = json.JSONDecoder()

# The decoder's C scanner, called directly: ``raw_decode`` minus a Python-level
# wrapper (a third of the parse time of a tiny chunk).  It raises StopIteration
# or JSONDecodeError (a ValueError) on bad JSON.
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = getattr(_DECODER, "scan_once", _DECODER.raw_decode)

_FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "tool_use": "tool-calls",
    "length": "max-tokens",
    "max_tokens": "max-tokens",
}


# ``TextDelta(content)`` without the attrs-made ``__init__`` of a frozen class
# (which sets each field through ``object.__setattr__``): an equal object in
# about half the time, for the one chunk nearly every event makes.  Valid while
# TextDelta is a slotted record whose only field is ``text``, with no
# validator, converter or post-init: checked here, at import.
_new: Final = object.__new__
_set_text: Final[Callable[[TextDelta, str], None]] = TextDelta.__dict__["text"].__set__
_TEXT_FIELDS: Final = attrs.fields(TextDelta)
if (
    [field.name for field in _TEXT_FIELDS] != ["text"]
    or _TEXT_FIELDS[0].validator is not None
    or _TEXT_FIELDS[0].converter is not None
    or hasattr(TextDelta, "__attrs_post_init__")
):  # pragma: no cover - a guard for whoever changes TextDelta
    raise ImportError("TextDelta changed: update the fast path of ChunkParser.feed_into in model/_chunks.py")


class ChunkParser(StreamParserBase):
    """Parser of one chat-completion stream (see the module docstring).

    A plain slotted class: its state is read and written for every event.

    Args:
        name: the provider's name, which starts every failure message.
    """

    __slots__ = ("_finish_reason", "_ids", "_last_index", "_usage")

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._finish_reason: str | None = None
        self._usage: Mapping[str, Any] | None = None
        # Tool-call ids seen, by the index they were given (servers that omit "index").
        self._ids: dict[str, int] = {}
        self._last_index: int | None = None

    # ------------------------------------------------------------ state

    @property
    def usage(self) -> Usage | None:
        """The last usage the server reported, if any."""
        usage = self._usage
        if usage is None:
            return None
        cached = usage.get("prompt_cache_hit_tokens")
        if type(cached) is not int:
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if type(details) is dict else 0
        completion = usage.get("completion_tokens_details")
        reasoning = completion.get("reasoning_tokens") if type(completion) is dict else 0
        return Usage(
            input_tokens=count(usage.get("prompt_tokens")),
            output_tokens=count(usage.get("completion_tokens")),
            cache_hit_tokens=count(cached),
            reasoning_tokens=count(reasoning),
        )

    # ------------------------------------------------------------ input

    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None:
        """Take events in order, passing each chunk to ``emit`` at once (the hot path).

        Like :meth:`feed_all`, without collecting the chunks; an
        :class:`~trio_harness.model._sse.SSEMessages` is read as its data
        strings.  Nothing is made per event but what ``emit`` receives, so a
        caller that lets the chunks go keeps the garbage collector idle.
        """
        if self._done:
            return
        pairs: Iterable[tuple[str, str]]
        if type(events) is SSEMessages:
            pairs = zip(events.data, repeat("message"))
        else:
            pairs = ((event.data, event.type) for event in events)
        scan = _SCAN
        new = _new
        set_text = _set_text
        emitted = False
        info = self._info
        try:
            for data, kind in pairs:
                if data[:1] == "{":
                    # Inlined for speed: parse, and pass plain text deltas (the
                    # bulk of every stream) on without further calls.
                    try:
                        obj, end = scan(data, 0)
                    except (StopIteration, ValueError, RecursionError):  # too deep a nesting too
                        raise self._bad_json(data) from None
                    if end != len(data) and not data[end:].isspace():
                        raise self._bad_json(data)
                    if info is None and type(obj) is dict:
                        info = self._take_info(obj)
                    choices = obj.get("choices")
                    if (
                        type(choices) is list
                        and len(choices) == 1
                        and type(choice := choices[0]) is dict
                        and type(delta := choice.get("delta")) is dict
                        and len(delta) == 1
                        and type(content := delta.get("content")) is str
                        and choice.get("finish_reason") is None
                        and obj.get("usage") is None
                        and kind == "message"
                    ):
                        if content:
                            delta = new(TextDelta)
                            set_text(delta, content)
                            emitted = True
                            emit(delta)
                    else:
                        self._on_object(obj, data, kind, emit)
                elif self._on_data(data, kind, emit):
                    self._done = True
                    break
        except StreamFailure as exc:
            self._failure = exc.failure
            self._done = True
        finally:
            if emitted:
                self._emitted = True

    def feed_body(self, body: bytes) -> list[Chunk]:
        """Take a whole JSON chat completion (a server that did not stream).

        Its ``message`` is read as one delta; the parser is :attr:`done` after it.
        """
        chunks: list[Chunk] = []
        if self._done:
            return chunks
        self._done = True
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            obj = None
        excerpt = body[:200].decode(errors="replace")
        if type(obj) is dict and "error" in obj:
            self._failure = self._error_object(obj["error"], body.decode(errors="replace"))
            return chunks
        choices = obj.get("choices") if type(obj) is dict else None
        if (
            type(obj) is not dict
            or type(choices) is not list
            or not choices
            or type(choices[0]) is not dict
            or type(choices[0].get("message")) is not dict
        ):
            self._failure = self._malformed("expected an event stream, got a JSON body: " + excerpt).failure
            return chunks
        self._take_info(obj)
        choice = choices[0]
        # A complete message has the same fields as a delta.
        delta = {"delta": choice["message"], "finish_reason": choice.get("finish_reason")}
        chunk: dict[str, Any] = {"choices": [delta]}
        if "usage" in obj:
            chunk["usage"] = obj["usage"]
        try:
            self._on_object(chunk, excerpt, "message", chunks.append)
        except StreamFailure as exc:
            self._failure = exc.failure
        return chunks

    def feed_end(self, end: SSEEnd) -> list[Chunk]:
        """Take what :meth:`SSEDecoder.close <trio_harness.model._sse.SSEDecoder.close>` found at the end of the stream.

        A stream cut in the middle of a line before any ``finish_reason`` is
        a ``truncated-stream`` failure (retryable); after one, the answer is
        complete and the cut only loses what trailed it.  Otherwise a last
        event that lacked its blank line is taken like any other.
        """
        if self._done:
            return []
        if end.truncated and self._finish_reason is None:
            self._failure = Failure(
                "truncated-stream", f"{self.name}: stream ended in the middle of a line", retryable=True
            )
            self._done = True
            return []
        return self.feed(end.event) if end.event is not None else []

    # ------------------------------------------------------------ outcome

    def conclude(self, failure: Failure | None = None) -> Finish | Failure:
        """The outcome, once the stream is over (or will not be read further).

        In order: a failure the stream itself carried (malformed, an error
        event); after ``[DONE]``, the finish the server announced; with a
        ``finish_reason``, that finish (the answer is complete, so losing the
        connection afterwards only loses trailing usage); else ``failure``,
        why the stream ended early (a dropped connection, a timeout), or a
        ``no-finish`` failure.

        Args:
            failure: what cut the stream short, if the caller knows.
        """
        if self._failure is not None:
            return self._failure
        reason = self._finish_reason
        if reason is None:
            if self._done:
                return Failure("no-finish", f"{self.name}: stream sent [DONE] without a finish_reason")
            return failure or Failure("no-finish", f"{self.name}: stream ended without a finish_reason or [DONE]")
        if reason == "content_filter":
            return Finish(
                reason="error",
                failure=Failure("refusal", f"{self.name}: the response was stopped by the content filter"),
            )
        mapped = _FINISH_REASONS.get(reason, "stop")
        if mapped == "stop" and self._last_index is not None:
            # Some local servers say "stop" after streaming tool calls.
            mapped = "tool-calls"
        return Finish(reason=mapped)

    # ------------------------------------------------------------ events

    def _on_data(self, payload: str, event: str, emit: Callable[[Chunk], None]) -> bool:
        """Handle one event's data; return True at ``[DONE]``."""
        if payload == "[DONE]":
            return True
        if not payload or payload.isspace():
            return False
        try:
            obj = json.loads(payload)
        except (ValueError, RecursionError):
            raise self._bad_json(payload) from None
        if type(obj) is not dict:
            raise self._malformed(f"a data line is not a JSON object: {payload[:200]!r}")
        self._on_object(obj, payload, event, emit)
        return False

    def _on_object(self, obj: dict[str, Any], payload: str, event: str, emit: Callable[[Chunk], None]) -> None:
        """Handle one parsed chunk object."""
        choices = obj.get("choices")
        if choices:
            if type(choices) is not list or type(choice := choices[0]) is not dict:
                raise self._malformed(f"'choices' is not a list of objects: {payload[:200]!r}")
            delta = choice.get("delta")
            if delta:
                if type(delta) is not dict:
                    raise self._malformed(f"'delta' is not an object: {payload[:200]!r}")
                self._on_delta(delta, payload, emit)
            reason = choice.get("finish_reason")
            if reason:
                if type(reason) is not str:
                    raise self._malformed(f"'finish_reason' is not a string: {payload[:200]!r}")
                if reason == "error":
                    raise StreamFailure(self._error_object(obj.get("error"), payload))
                self._finish_reason = reason
        elif event == "error" or "error" in obj:
            raise StreamFailure(self._error_object(obj.get("error", obj), payload))
        usage = obj.get("usage")
        if usage:
            if type(usage) is not dict:
                raise self._malformed(f"'usage' is not an object: {payload[:200]!r}")
            self._usage = usage

    def _on_delta(self, delta: dict[str, Any], payload: str, emit: Callable[[Chunk], None]) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            if type(reasoning) is not str:
                raise self._malformed(f"reasoning is not a string: {payload[:200]!r}")
            self._emitted = True
            emit(ReasoningDelta(reasoning))
        content = delta.get("content")
        if content:
            if type(content) is not str:
                raise self._malformed(f"'content' is not a string: {payload[:200]!r}")
            self._emitted = True
            emit(TextDelta(content))
        calls = delta.get("tool_calls")
        if calls:
            if type(calls) is not list:
                raise self._malformed(f"'tool_calls' is not a list: {payload[:200]!r}")
            for position, call in enumerate(calls):
                self._on_tool_call(call, position, payload, emit)

    def _on_tool_call(self, call: object, position: int, payload: str, emit: Callable[[Chunk], None]) -> None:
        if type(call) is not dict:
            raise self._malformed(f"a tool call delta is not an object: {payload[:200]!r}")
        function = call.get("function") or {}
        if type(function) is not dict:
            raise self._malformed(f"a tool call 'function' is not an object: {payload[:200]!r}")
        call_id = call.get("id") or None
        name = function.get("name") or None
        arguments = function.get("arguments") or ""
        if type(arguments) is dict:  # some servers send parsed arguments
            arguments = json.dumps(arguments, ensure_ascii=False)
        if (
            not (call_id is None or type(call_id) is str)
            or not (name is None or type(name) is str)
            or type(arguments) is not str
        ):
            raise self._malformed(f"a tool call delta has the wrong shape: {payload[:200]!r}")
        index = call.get("index")
        if type(index) is not int:
            if index is not None:
                raise self._malformed(f"a tool call index is not an integer: {payload[:200]!r}")
            # Servers that omit the index: a new id starts a new call, a piece
            # without an id continues the last call (or is the n-th of a list).
            if call_id is not None:
                index = self._ids.setdefault(call_id, len(self._ids))
            elif position == 0 and self._last_index is not None:
                index = self._last_index
            else:
                index = position
        elif call_id is not None:
            self._ids.setdefault(call_id, index)
        self._last_index = index
        if call_id is None and name is None and not arguments:
            return
        self._emitted = True
        emit(ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments))

    # ------------------------------------------------------------ failures

    def _bad_json(self, payload: str) -> StreamFailure:
        return self._malformed(f"bad JSON in a data line: {payload[:200]!r}")

    def _error_object(self, error: object, payload: str) -> Failure:
        """A failure for an error object the server sent inside the stream."""
        message = message_of(error) or payload[:200]
        code = error.get("code") if isinstance(error, dict) else None
        if type(code) is str and code.isdigit():
            code = int(code)
        if type(code) is int and 400 <= code <= 599:
            return Failure(
                f"http-{code}",
                f"{self.name}: error {code} in the stream: {message}",
                retryable=code == 429 or code >= 500,
            )
        kind = (code or error.get("type")) if isinstance(error, dict) else None
        if type(kind) is str and kind in RETRYABLE_ERROR_CODES:
            # OpenAI's {"error": {"type": "server_error", ...}} after a 200: as a 5xx would be.
            return Failure("stream-error", f"{self.name}: error in the stream: {message} ({kind})", retryable=True)
        return Failure("stream-error", f"{self.name}: error in the stream: {message}")


def message_of(error: object) -> str:
    """The human-readable message of an error object (``message``, ``detail``, ...), or ``""``."""
    while isinstance(error, dict):  # a loop, not recursion: a body may nest error objects deep
        for key in ("message", "detail", "error", "msg"):
            found = error.get(key)
            if found:
                if not isinstance(found, dict):
                    return str(found)
                error = found
                break
        else:
            return ""
    return error if isinstance(error, str) else ""
