"""The OpenAI Responses event stream, parsed without I/O (sans-io).

:class:`ResponsesParser` takes the server-sent events of one streamed
``POST /responses`` call (decoded by :mod:`trio_harness.model._sse`) and turns
them into the chunks of :mod:`trio_harness.model._protocol`; it has the
interface of :class:`~trio_harness.model._chunks.ChunkParser`, so the HTTP
loop of :class:`~trio_harness.model.OpenAIProvider` drives either.

Each event's JSON carries its ``type`` (the SSE ``event`` field repeats it and
is not needed):

* ``response.output_text.delta`` - a :class:`TextDelta`;
  ``response.output_text.done`` and ``response.output_item.done`` of a
  ``message`` carry the whole text, emitted only for an item that streamed
  no delta (servers that send the whole item at once);
* ``response.output_item.added`` of a ``function_call`` - a
  :class:`ToolCallDelta` with its ``call_id`` (what a ``function_call_output``
  answers, not the item ``id``) and ``name``; then
  ``response.function_call_arguments.delta`` pieces keyed by ``item_id`` (or
  ``output_index``); ``.done`` and the item's ``output_item.done`` complete
  what the deltas did not send;
* ``response.reasoning_summary_text.delta`` and
  ``response.reasoning_text.delta`` - :class:`ReasoningDelta` s;
  ``response.output_item.done`` of a ``reasoning`` item - a
  :class:`ReasoningBlock` (``provider="openai-responses"``, ``data``
  ``{"item": ITEM, "before": ANCHOR}``: the item exactly as received,
  ``encrypted_content`` included, and the characters of text and the function
  calls that came before it when it was added), sent back in later requests
  at that place; so is the finished item of any other type (hosted tools'
  calls such as ``web_search_call``), which the harness does not rebuild
  (the provider sends those back only with ``store`` on);
* ``response.refusal.delta`` / ``.done`` - the refusal text, reported as a
  ``refusal`` failure at the end;
* ``response.completed`` / ``response.incomplete`` / ``response.failed`` -
  the end: the usage (``input_tokens_details.cached_tokens``,
  ``output_tokens_details.reasoning_tokens``) and the outcome;
* ``error`` - a failure carried by the stream;
* anything else (``response.created``, ``response.in_progress``,
  ``response.content_part.*``, hosted-tool progress, ...) is read and ignored.

Failures are values: bad JSON, an event without a ``type``, a field of the
wrong type stop the parser (:attr:`ResponsesParser.done`) with a
``malformed-stream`` failure; the chunks of the events before are still
returned.  The result never depends on how the events were batched.
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
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)
from ._sse import SSEEnd, SSEEvent, SSEMessages
from ._stream_base import RETRYABLE_ERROR_CODES, StreamFailure, StreamParserBase, count

PROVIDER: Final = "openai-responses"
"""The ``provider`` of the :class:`ReasoningBlock` s this parser makes (and the provider sends back)."""

_DECODER: Final = json.JSONDecoder()
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = getattr(_DECODER, "scan_once", _DECODER.raw_decode)


_TEXT_DELTA: Final = "response.output_text.delta"


def _mark(seen: set[object], item_id: object, position: object) -> None:
    """Remember an output item by its id and by its output index (a server may give either)."""
    if type(item_id) is str and item_id:
        seen.add(item_id)
    if type(position) is int:
        seen.add(position)


def _seen(seen: set[object], item_id: object, position: object) -> bool:
    """Whether an output item was remembered (:func:`_mark`) by its id or its output index."""
    return (type(item_id) is str and item_id in seen) or (type(position) is int and position in seen)


class ResponsesParser(StreamParserBase):
    """Parser of one Responses event stream (see the module docstring).

    Args:
        name: the provider's name, which starts every failure message.
    """

    __slots__ = (
        "_anchors",
        "_args",
        "_calls",
        "_chars",
        "_finished",
        "_reasoned",
        "_refusal",
        "_status",
        "_texted",
        "_usage",
    )

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self._usage: Mapping[str, Any] | None = None
        # The terminal event seen: "completed", "incomplete" (with its reason) or None.
        self._status: str | None = None
        self._finished: str | None = None
        # Function calls by item id and by output index: (tool-call index, call id).
        self._calls: dict[object, int] = {}
        # The argument text streamed so far, by tool-call index, in its pieces (joined only to
        # compare with a done event's: a long argument in many deltas costs linear time).
        self._args: list[list[str]] = []
        # Output items (ids and indexes, see _mark) that streamed text / reasoning deltas.
        self._texted: set[object] = set()
        self._reasoned: set[object] = set()
        self._refusal: str | None = None
        # The characters of text emitted so far, and where each kept item started (by id and output index).
        self._chars = 0
        self._anchors: dict[object, dict[str, int]] = {}

    # ------------------------------------------------------------ state

    @property
    def usage(self) -> Usage | None:
        """The usage of the final response object, if the server reported one."""
        usage = self._usage
        if usage is None:
            return None
        inputs = usage.get("input_tokens_details")
        outputs = usage.get("output_tokens_details")
        return Usage(
            input_tokens=count(usage.get("input_tokens")),
            output_tokens=count(usage.get("output_tokens")),
            cache_hit_tokens=count(inputs.get("cached_tokens")) if type(inputs) is dict else 0,
            reasoning_tokens=count(outputs.get("reasoning_tokens")) if type(outputs) is dict else 0,
        )

    # ------------------------------------------------------------ input

    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None:
        """Take events in order, passing each chunk to ``emit`` at once (the hot path)."""
        if self._done:
            return
        datas: Iterable[str] = events.data if type(events) is SSEMessages else (event.data for event in events)
        scan = _SCAN
        texted = self._texted
        try:
            for data in datas:
                try:
                    obj, end = scan(data, 0)
                except (StopIteration, ValueError, RecursionError):  # too deep a nesting too
                    if data == "[DONE]":  # not OpenAI's, but some gateways add it
                        self._done = True
                        break
                    if not data or data.isspace():
                        continue
                    raise self._malformed(f"bad JSON in a data line: {data[:200]!r}") from None
                if end != len(data) and not data[end:].isspace():
                    raise self._malformed(f"bad JSON in a data line: {data[:200]!r}")
                if type(obj) is not dict:
                    raise self._malformed(f"an event is not a JSON object: {data[:200]!r}")
                kind = obj.get("type")
                if kind == _TEXT_DELTA:
                    # The bulk of every stream, handled inline.
                    delta = obj.get("delta")
                    if type(delta) is not str:
                        raise self._malformed(f"'delta' is not a string: {data[:200]!r}")
                    if delta:
                        key = obj.get("item_id")
                        if key not in texted:
                            _mark(texted, key, obj.get("output_index"))
                        self._chars += len(delta)
                        self._emitted = True
                        emit(TextDelta(delta))
                    continue
                if type(kind) is not str:
                    raise self._malformed(f"an event has no 'type': {data[:200]!r}")
                if self._on_event(kind, obj, data, emit):
                    self._done = True
                    break
        except StreamFailure as exc:
            self._failure = exc.failure
            self._done = True

    def feed_body(self, body: bytes) -> list[Chunk]:
        """Take a whole JSON response object (a server that did not stream); the parser is then done."""
        chunks: list[Chunk] = []
        if self._done:
            return chunks
        self._done = True
        try:
            obj = json.loads(body)
        except (ValueError, RecursionError):
            obj = None
        text = body.decode(errors="replace")
        try:
            if type(obj) is dict and obj.get("error") and obj.get("object") != "response":
                raise StreamFailure(self._error(obj["error"], text))
            if type(obj) is not dict or type(obj.get("output")) is not list:
                raise self._malformed(f"expected an event stream, got a JSON body: {text[:200]!r}")
            for position, item in enumerate(obj["output"]):
                self._item_done({"item": item, "output_index": position}, text, chunks.append)
            self._terminal(obj, text)
        except StreamFailure as exc:
            self._failure = exc.failure
        return chunks

    def feed_end(self, end: SSEEnd) -> list[Chunk]:
        """Take what the SSE decoder found at the end of the body.

        A body cut in the middle of a line before the response ended is a
        ``truncated-stream`` failure (retryable); a last event that lacked its
        blank line is taken like any other.
        """
        if self._done:
            return []
        if end.truncated:
            self._failure = Failure(
                "truncated-stream", f"{self.name}: stream ended in the middle of a line", retryable=True
            )
            self._done = True
            return []
        return self.feed(end.event) if end.event is not None else []

    # ------------------------------------------------------------ outcome

    def conclude(self, failure: Failure | None = None) -> Finish | Failure:
        """The outcome, once the stream is over (or will not be read further).

        In order: a failure the stream carried; after ``response.completed``,
        ``"tool-calls"`` when it made function calls, else ``"stop"`` (or a
        ``refusal`` error when the model refused); after
        ``response.incomplete``, ``"max-tokens"`` for ``max_output_tokens``
        (a ``refusal`` error for ``content_filter``); else ``failure``, why
        the stream ended early, or a ``no-finish`` failure.
        """
        if self._failure is not None:
            return self._failure
        status = self._status
        if status is None:
            if failure is not None:
                return failure
            return Failure("no-finish", f"{self.name}: stream ended without response.completed, .incomplete or .failed")
        if self._refusal is not None or (status == "incomplete" and self._finished == "content_filter"):
            detail = f": {self._refusal}" if self._refusal else ""
            return Finish(reason="error", failure=Failure("refusal", f"{self.name}: the model refused{detail}"))
        if status == "incomplete":
            if self._finished == "max_output_tokens":
                return Finish(reason="max-tokens")
            why = self._finished or "no reason given"
            return Finish(
                reason="error", failure=Failure("incomplete", f"{self.name}: the response is incomplete ({why})")
            )
        return Finish(reason="tool-calls" if self._args else "stop")

    # ------------------------------------------------------------ events

    def _on_event(self, kind: str, obj: dict[str, Any], data: str, emit: Callable[[Chunk], None]) -> bool:
        """Handle one event other than a text delta; return True at the end of the response."""
        if kind == "response.function_call_arguments.delta":
            index = self._call_index(obj, data)
            delta = obj.get("delta")
            if type(delta) is not str:
                raise self._malformed(f"'delta' is not a string: {data[:200]!r}")
            if delta:
                self._args[index].append(delta)
                self._emitted = True
                emit(ToolCallDelta(index=index, arguments=delta))
        elif kind in ("response.reasoning_summary_text.delta", "response.reasoning_text.delta"):
            delta = obj.get("delta")
            if type(delta) is not str:
                raise self._malformed(f"'delta' is not a string: {data[:200]!r}")
            if delta:
                _mark(self._reasoned, obj.get("item_id"), obj.get("output_index"))
                self._emitted = True
                emit(ReasoningDelta(delta))
        elif kind == "response.output_item.added":
            item = obj.get("item")
            if type(item) is not dict:
                raise self._malformed(f"'item' is not an object: {data[:200]!r}")
            item_kind = item.get("type")
            if item_kind == "function_call":
                self._call_started(item, obj.get("output_index"), data, emit)
            elif item_kind != "message":
                # A kept item (reasoning, hosted tools' calls): it stands after what came so far.
                before = anchor(self._chars, len(self._args))
                item_id, position = item.get("id"), obj.get("output_index")
                if type(item_id) is str and item_id:
                    self._anchors[item_id] = before
                if type(position) is int:
                    self._anchors[position] = before
        elif kind == "response.output_item.done":
            self._item_done(obj, data, emit)
        elif kind == "response.function_call_arguments.done":
            arguments = obj.get("arguments")
            if type(arguments) is not str:
                raise self._malformed(f"'arguments' is not a string: {data[:200]!r}")
            self._complete_arguments(self._call_index(obj, data), arguments, emit)
        elif kind == "response.output_text.done":
            key, position = obj.get("item_id"), obj.get("output_index")
            text = obj.get("text")
            if not _seen(self._texted, key, position) and type(text) is str and text:
                _mark(self._texted, key, position)
                self._chars += len(text)
                self._emitted = True
                emit(TextDelta(text))
        elif kind == "response.refusal.done":
            refusal = obj.get("refusal")
            if type(refusal) is str:
                self._refusal = refusal
        elif kind == "response.refusal.delta":
            delta = obj.get("delta")
            if type(delta) is str:
                self._refusal = (self._refusal or "") + delta
        elif kind in ("response.created", "response.in_progress"):
            response = obj.get("response")
            if self._info is None and type(response) is dict:
                self._take_info(response)
        elif kind in ("response.completed", "response.incomplete", "response.failed"):
            response = obj.get("response")
            if type(response) is not dict:
                raise self._malformed(f"'response' is not an object: {data[:200]!r}")
            self._terminal(response, data)
            return True
        elif kind == "error":
            raise StreamFailure(self._error(obj.get("error", obj), data))
        return False

    def _terminal(self, response: dict[str, Any], data: str) -> None:
        if self._info is None:
            self._take_info(response)
        usage = response.get("usage")
        if usage is not None:
            if type(usage) is not dict:
                raise self._malformed(f"'usage' is not an object: {data[:200]!r}")
            self._usage = usage
        status = response.get("status")
        if status == "failed" or (status != "incomplete" and response.get("error")):
            raise StreamFailure(self._error(response.get("error") or {}, data))
        if status == "incomplete":
            details = response.get("incomplete_details")
            reason = details.get("reason") if type(details) is dict else None
            self._finished = reason if type(reason) is str else None
            self._status = "incomplete"
        else:
            self._status = "completed"

    def _call_started(self, item: dict[str, Any], position: object, data: str, emit: Callable[[Chunk], None]) -> int:
        call_id, name, arguments = item.get("call_id"), item.get("name"), item.get("arguments", "")
        if type(call_id) is not str or not call_id or type(name) is not str or not name:
            raise self._malformed(f"a function_call item needs a 'call_id' and a 'name': {data[:200]!r}")
        if arguments is None:
            arguments = ""
        if type(arguments) is not str:
            raise self._malformed(f"'arguments' is not a string: {data[:200]!r}")
        index = len(self._args)
        self._args.append([arguments] if arguments else [])
        item_id = item.get("id")
        if type(item_id) is str and item_id:
            self._calls[item_id] = index
        if type(position) is int:
            self._calls[position] = index
        self._emitted = True
        emit(ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments))
        return index

    def _call_index(self, obj: dict[str, Any], data: str) -> int:
        item_id = obj.get("item_id")
        index = self._calls.get(item_id) if type(item_id) is str else None
        if index is None:
            index = self._calls.get(obj.get("output_index", -1))
        if index is None:
            raise self._malformed(f"function call arguments for an unknown item: {data[:200]!r}")
        return index

    def _complete_arguments(self, index: int, arguments: str, emit: Callable[[Chunk], None]) -> None:
        pieces = self._args[index]
        sent = pieces[0] if len(pieces) == 1 else "".join(pieces)
        pieces[:] = [sent] if sent else []
        if arguments == sent:
            return
        if not arguments.startswith(sent):
            raise StreamFailure(
                Failure(
                    "malformed-stream",
                    f"{self.name}: the final arguments of call {index} differ from the streamed ones",
                )
            )
        self._args[index] = [arguments]
        self._emitted = True
        emit(ToolCallDelta(index=index, arguments=arguments[len(sent) :]))

    def _item_done(self, obj: dict[str, Any], data: str, emit: Callable[[Chunk], None]) -> None:
        item = obj.get("item")
        if type(item) is not dict:
            raise self._malformed(f"'item' is not an object: {data[:200]!r}")
        kind = item.get("type")
        position = obj.get("output_index")
        key = item.get("id")
        if kind == "reasoning":
            if not _seen(self._reasoned, key, position):
                summary = item.get("summary")
                texts = [
                    part["text"]
                    for part in (summary if type(summary) is list else ())
                    if type(part) is dict and type(part.get("text")) is str and part["text"]
                ]
                if texts:
                    self._emitted = True
                    emit(ReasoningDelta("\n\n".join(texts)))
            self._emitted = True
            emit(ReasoningBlock(PROVIDER, {"item": item, BEFORE: self._anchor(item, position)}))
        elif kind == "function_call":
            item_id = item.get("id")
            index = self._calls.get(item_id) if type(item_id) is str else None
            if index is None and type(position) is int:
                index = self._calls.get(position)
            if index is None:
                index = self._call_started(item, position, data, emit)
            arguments = item.get("arguments")
            if type(arguments) is str:
                self._complete_arguments(index, arguments, emit)
        elif kind == "message":
            content = item.get("content")
            texted = _seen(self._texted, key, position)
            for part in content if type(content) is list else ():
                if type(part) is not dict:
                    continue
                if part.get("type") == "refusal" and type(part.get("refusal")) is str:
                    self._refusal = part["refusal"]
                elif part.get("type") == "output_text" and not texted:
                    text = part.get("text")
                    if type(text) is str and text:
                        self._chars += len(text)
                        self._emitted = True
                        emit(TextDelta(text))
            _mark(self._texted, key, position)
        elif type(kind) is str:
            # A hosted tool's call or another item added later: back as it came, where it came.
            self._emitted = True
            emit(ReasoningBlock(PROVIDER, {"item": item, BEFORE: self._anchor(item, position)}))

    def _anchor(self, item: dict[str, Any], position: object) -> dict[str, int]:
        """Where a kept item stands among the text and calls: as it was added, else as it is done."""
        item_id = item.get("id")
        found = self._anchors.get(item_id) if type(item_id) is str and item_id else None
        if found is None and type(position) is int:
            found = self._anchors.get(position)
        return found if found is not None else anchor(self._chars, len(self._args))

    # ------------------------------------------------------------ failures

    def _error(self, error: object, data: str) -> Failure:
        """A failure for an error object of the stream (an ``error`` event, a failed response)."""
        message = ""
        code: object = None
        if isinstance(error, dict):
            message = str(error.get("message") or "")
            code = error.get("code") or error.get("type")
        message = message or data[:200]
        if type(code) is str and code.isdigit():
            code = int(code)
        if type(code) is int and 400 <= code <= 599:
            return Failure(
                f"http-{code}",
                f"{self.name}: error {code} in the stream: {message}",
                retryable=code == 429 or code >= 500,
            )
        suffix = f" ({code})" if type(code) is str and code else ""
        return Failure(
            "stream-error",
            f"{self.name}: the response failed: {message}{suffix}",
            retryable=code in RETRYABLE_ERROR_CODES,
        )
