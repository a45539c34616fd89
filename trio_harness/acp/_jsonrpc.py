"""JSON-RPC 2.0 over newline-delimited JSON on Trio streams.

One message per line, UTF-8, ``\\n``-terminated (a trailing ``\\r`` is
tolerated).  :class:`LineReader` bounds every line: a line longer than the
limit is never buffered whole; it is reported once as :data:`OVERSIZED` and
the rest of it is discarded up to the next newline.  :func:`parse_message`
classifies one line without ever raising; :class:`MessageWriter` writes one
message per line, serialized by a lock; :class:`Outbox` queues outgoing
messages in order and tells the reader when to stop reading (backpressure);
:class:`OutgoingRequests` numbers the requests this side sends and routes the
peer's responses back to the task that waits for each.
"""

from __future__ import annotations

import collections
import json
import math
from collections.abc import Callable
from typing import Any, Final, TypeAlias

import attrs
import trio

PARSE_ERROR: Final = -32700
"""The line is not valid JSON (or not UTF-8)."""
INVALID_REQUEST: Final = -32600
"""The JSON is not a valid JSON-RPC 2.0 message."""
METHOD_NOT_FOUND: Final = -32601
"""No such method."""
INVALID_PARAMS: Final = -32602
"""The params are invalid; the message names the field."""
INTERNAL_ERROR: Final = -32603
"""The request failed inside the server (also: a failed prompt turn)."""
AUTH_REQUIRED: Final = -32000
"""ACP: authenticate first."""
RESOURCE_NOT_FOUND: Final = -32002
"""ACP: the named resource (e.g. a session id) does not exist."""
SESSION_BUSY: Final = -32003
"""A prompt is already in flight on this session."""
TOO_MANY_SESSIONS: Final = -32004
"""This server's own: the connection has ``max_sessions`` sessions open (or opening); close one first."""
REQUEST_CANCELLED: Final = -32800
"""ACP: the request was cancelled (``$/cancel_request``)."""

DEFAULT_MAX_LINE_BYTES: Final = 8 * 1024 * 1024
"""The default limit on one incoming message line (8 MiB)."""

DEFAULT_OUTBOX_LIMIT: Final = 256
"""The default bound on outgoing messages queued (or owed) before input stops being read."""

LATE_LIMIT: Final = 1024
"""How many abandoned requests :class:`OutgoingRequests` remembers for their late answers."""

RequestId: TypeAlias = int | str | None


class RpcError(Exception):
    """An error to answer a request with.

    Attributes:
        code: the JSON-RPC error code.
        message: the human-readable message (names the offending field or id).
        data: optional structured detail.
    """

    def __init__(self, code: int, message: str, data: Any = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.data = data

    def __reduce__(self) -> tuple[Any, ...]:
        # ``args`` holds the message alone: rebuilt from all three, so pickle and copy work.
        return type(self), (self.code, self.message, self.data), self.__dict__

    def to_error(self) -> dict[str, Any]:
        """The JSON-RPC ``error`` object."""
        error: dict[str, Any] = {"code": self.code, "message": self.message}
        if self.data is not None:
            error["data"] = self.data
        return error


@attrs.frozen
class Request:
    """A request: it must be answered with the same ``id``.

    Attributes:
        id: the request id (a string, an integer or null).
        method: the method name.
        params: the params (an object or an array), or None when absent.
    """

    id: RequestId
    method: str
    params: Any = None


@attrs.frozen
class Notification:
    """A notification: never answered.

    Attributes:
        method: the method name.
        params: the params (an object or an array), or None when absent.
    """

    method: str
    params: Any = None


@attrs.frozen
class Response:
    """A response from the peer to a request this side sent (see :class:`OutgoingRequests`).

    Attributes:
        id: the id of the request answered.
        result: the result, if any.
        error: the error object, if any.
    """

    id: RequestId
    result: Any = None
    error: Any = None


@attrs.frozen
class Invalid:
    """A line that is not a usable message; answer ``error`` with ``id``.

    Attributes:
        id: the request id when one could be read, else None.
        error: the error to answer with.
    """

    id: RequestId
    error: RpcError


Message: TypeAlias = Request | Notification | Response | Invalid


class _Oversized:
    """The type of :data:`OVERSIZED`."""

    def __repr__(self) -> str:
        return "OVERSIZED"


OVERSIZED: Final = _Oversized()
"""Returned by :meth:`LineReader.receive_line` for a line over the limit (discarded)."""


def _method_name(method: str) -> str:
    return method if len(method) <= 100 else method[:100] + "…"


def parse_message(line: bytes) -> Message:
    """Classify one line as a request, notification, response or invalid message.

    Never raises: bad input comes back as :class:`Invalid` with the error to
    send (``-32700`` for bad JSON, ``-32600`` for a bad envelope, ``-32602``
    for params that are neither an object nor an array).
    """
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Invalid(
            None,
            RpcError(PARSE_ERROR, f"parse error: the message is not valid UTF-8 ({exc.reason})"),
        )
    try:
        data = json.loads(text)
    except RecursionError:
        return Invalid(None, RpcError(PARSE_ERROR, "parse error: the message nests too deeply"))
    except ValueError as exc:
        return Invalid(None, RpcError(PARSE_ERROR, f"parse error: {exc}"))
    if not isinstance(data, dict):
        kind = "an array (batches are not supported)" if isinstance(data, list) else type(data).__name__
        return Invalid(
            None,
            RpcError(INVALID_REQUEST, f"invalid request: a message must be a JSON object, got {kind}"),
        )
    has_id = "id" in data
    raw_id = data.get("id")
    valid_id = raw_id is None or isinstance(raw_id, str) or (isinstance(raw_id, int) and not isinstance(raw_id, bool))
    request_id: RequestId = raw_id if valid_id else None
    if has_id and not valid_id:
        return Invalid(
            None,
            RpcError(INVALID_REQUEST, "invalid request: 'id' must be a string, an integer or null"),
        )
    if data.get("jsonrpc") != "2.0":
        return Invalid(request_id, RpcError(INVALID_REQUEST, "invalid request: 'jsonrpc' must be \"2.0\""))
    if "method" not in data:
        if has_id and ("result" in data or "error" in data):
            return Response(request_id, data.get("result"), data.get("error"))
        return Invalid(request_id, RpcError(INVALID_REQUEST, "invalid request: 'method' is missing"))
    method = data["method"]
    if not isinstance(method, str):
        return Invalid(request_id, RpcError(INVALID_REQUEST, "invalid request: 'method' must be a string"))
    params = data.get("params")
    if "params" in data and not isinstance(params, dict | list):
        error = RpcError(
            INVALID_PARAMS,
            f"invalid params for {_method_name(method)!r}: 'params' must be an object",
        )
        return Invalid(request_id, error)
    if has_id:
        return Request(request_id, method, params)
    return Notification(method, params)


DISCARDED: Final = "answer-discarded"
"""``error.data.reason`` of the error a request gets when the peer's answer to it was too long to read."""


def discarded(error: object) -> bool:
    """Whether ``error`` (a response's) stands for an answer this side discarded, not the peer's own error."""
    data = error.get("data") if isinstance(error, dict) else None
    return isinstance(data, dict) and data.get("reason") == DISCARDED


HEAD_BYTES: Final = 1024
"""How much of an oversized line is kept to find its ``id`` (:func:`read_head`)."""


@attrs.frozen
class Head:
    """What the start of a discarded message says: its ``id`` and whether it is a request or a response.

    Attributes:
        id: the message's ``id``.
        kind: ``"request"`` (a ``method`` or ``params`` member came first),
            ``"response"`` (``result`` or ``error``), or None (unknown).
        method: the ``method``, when it came before the cut.
    """

    id: RequestId
    kind: str | None
    method: str | None = None


_KIND_OF_MEMBER: Final = {"method": "request", "params": "request", "result": "response", "error": "response"}


def read_head(head: bytes) -> Head | None:
    """The top-level ``id`` of a message cut short (an oversized line), if its members before the cut name one.

    The members are read in order, each value whole; reading stops at the
    first that the cut (or bad JSON) ends.  None when no valid ``id`` came first.
    """
    text = head.decode("utf-8", "ignore")
    decoder = json.JSONDecoder()
    index = len(text) - len(text.lstrip())
    if not text.startswith("{", index):
        return None
    index += 1
    found: dict[str, Any] = {}
    kind: str | None = None
    try:
        while True:
            index = len(text) - len(text[index:].lstrip())
            key, index = decoder.raw_decode(text, index)
            index = len(text) - len(text[index:].lstrip())
            if not isinstance(key, str) or not text.startswith(":", index):
                break
            kind = kind or _KIND_OF_MEMBER.get(key)
            index = len(text) - len(text[index + 1 :].lstrip())
            value, index = decoder.raw_decode(text, index)
            index = len(text) - len(text[index:].lstrip())
            if index >= len(text):
                break  # the cut may have ended the value (a number cut short reads as a smaller one)
            found.setdefault(key, value)
            if not text.startswith(",", index):
                break
            index += 1
    except ValueError:  # the cut (or bad JSON) ends the members read
        pass
    request_id = found.get("id")
    if "id" not in found or isinstance(request_id, bool) or not isinstance(request_id, int | str | None):
        return None
    method = found.get("method")
    return Head(request_id, kind, method if isinstance(method, str) else None)


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {key: _finite(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_finite(item) for item in value]
    return value


def encode_message(message: dict[str, Any]) -> bytes:
    """One message as one line of ASCII JSON (non-finite floats become null)."""
    try:
        text = json.dumps(message, separators=(",", ":"), allow_nan=False)
    except ValueError:
        text = json.dumps(_finite(message), separators=(",", ":"), allow_nan=False)
    return text.encode("ascii") + b"\n"


def result_response(request_id: RequestId, result: Any) -> dict[str, Any]:
    """A success response."""
    return {"jsonrpc": "2.0", "id": request_id, "result": result}


def error_response(request_id: RequestId, error: RpcError) -> dict[str, Any]:
    """An error response."""
    return {"jsonrpc": "2.0", "id": request_id, "error": error.to_error()}


def notification(method: str, params: Any) -> dict[str, Any]:
    """A notification message."""
    return {"jsonrpc": "2.0", "method": method, "params": params}


def request(request_id: RequestId, method: str, params: Any) -> dict[str, Any]:
    """A request message."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method, "params": params}


class PeerGoneError(Exception):
    """The peer disconnected (or the connection closed) before answering a request."""


@attrs.define(eq=False)
class _Waiter:
    done: trio.Event = attrs.field(factory=trio.Event)
    response: Response | None = None


@attrs.define(eq=False)
class OutgoingRequests:
    """Requests this side sent to the peer, each waiting for its response.

    :meth:`call` numbers a request (ids ``1, 2, ...``: the peer numbers its own
    requests independently), queues it with ``send`` and waits for the
    response that :meth:`resolve` routes to it.  A waiter that is cancelled
    stops waiting at once: its id is forgotten (a late answer is ignored) and
    ``$/cancel_request`` tells the peer it may stop asking (ACP
    "Cancellation").  :meth:`close` ends every wait with :exc:`PeerGoneError`.
    """

    _next_id: int = attrs.field(default=1, init=False)
    _waiting: dict[RequestId, _Waiter] = attrs.field(factory=dict, init=False)
    # Requests whose waiter gave up but whose late answer still matters (``on_late``), oldest first.
    _late: dict[RequestId, Callable[[Response], None]] = attrs.field(factory=dict, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    def __len__(self) -> int:
        """The number of requests waiting for a response."""
        return len(self._waiting)

    async def call(
        self,
        send: Callable[[dict[str, Any]], None],
        method: str,
        params: Any,
        *,
        on_late: Callable[[Response], None] | None = None,
    ) -> Response:
        """Send a request with ``send`` and wait for its response (an error response included).

        A wait that ends without the response (cancelled, or a timeout around
        the call) tells the peer with ``$/cancel_request``; with ``on_late``,
        the response the peer may still send is handed to it (from the reader,
        synchronously: it must not block), so a resource the peer created
        anyway can be let go.  At most :data:`LATE_LIMIT` such requests are
        remembered (the oldest is forgotten first); :meth:`close` forgets all.

        Raises:
            PeerGoneError: the connection closed before the peer answered.
        """
        if self._closed:
            raise PeerGoneError(f"cannot send {method}: the connection is closed")
        request_id = self._next_id
        self._next_id += 1
        waiter = self._waiting[request_id] = _Waiter()
        try:
            send(request(request_id, method, params))
            await waiter.done.wait()
        except BaseException:
            if self._waiting.pop(request_id, None) is not None and not self._closed:
                if on_late is not None:
                    if len(self._late) >= LATE_LIMIT:
                        self._late.pop(next(iter(self._late)))
                    self._late[request_id] = on_late
                send(notification("$/cancel_request", {"requestId": request_id}))
            elif waiter.response is not None and on_late is not None:
                on_late(waiter.response)  # answered just as the wait ended: late all the same
            raise
        if waiter.response is None:
            raise PeerGoneError(f"the peer disconnected before answering {method}")
        return waiter.response

    def send_only(self, send: Callable[[dict[str, Any]], None], method: str, params: Any) -> bool:
        """Send a request whose answer nobody waits for (the answers can no longer be read); False once closed."""
        if self._closed:
            return False
        request_id = self._next_id
        self._next_id += 1
        send(request(request_id, method, params))
        return True

    def resolve(self, response: Response) -> bool:
        """Hand ``response`` to the request it answers; False when no request waits for its id.

        A late answer (see ``on_late`` of :meth:`call`) goes to its handler
        and counts as routed.
        """
        waiter = self._waiting.pop(response.id, None)
        if waiter is None:
            late = self._late.pop(response.id, None)
            if late is None:
                return False
            late(response)
            return True
        waiter.response = response
        waiter.done.set()
        return True

    def close(self) -> None:
        """End every wait with :exc:`PeerGoneError`; later calls fail at once."""
        self._closed = True
        self._late.clear()
        waiting = list(self._waiting.values())
        self._waiting.clear()
        for waiter in waiting:
            waiter.done.set()


@attrs.define(eq=False)
class LineReader:
    """Reads bounded lines from a Trio receive stream.

    Attributes:
        stream: where bytes come from.
        max_line_bytes: the longest line accepted (without its newline).
        chunk_bytes: how much to ask the stream for at a time.
    """

    stream: trio.abc.ReceiveStream
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES
    chunk_bytes: int = 65536
    _buffer: bytearray = attrs.field(factory=bytearray, init=False)
    # Bytes of the buffer already searched for a newline.
    _scanned: int = attrs.field(default=0, init=False)
    # Inside an oversized line: drop bytes up to the next newline.
    _discarding: bool = attrs.field(default=False, init=False)
    # The first bytes of the last oversized line (``oversized_head``).
    _head: bytes = attrs.field(default=b"", init=False)
    _eof: bool = attrs.field(default=False, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {self.max_line_bytes!r}")

    @property
    def oversized_head(self) -> bytes:
        """The first :data:`HEAD_BYTES` of the last line reported :data:`OVERSIZED` (see :func:`read_head`)."""
        return self._head

    async def receive_line(self) -> bytes | _Oversized | None:
        """The next line (without its newline), :data:`OVERSIZED`, or None at end of input.

        A stream error (the peer vanished) counts as end of input.
        """
        buffer = self._buffer
        while True:
            if self._discarding:
                index = buffer.find(b"\n")
                if index >= 0:
                    del buffer[: index + 1]
                    self._discarding = False
                    self._scanned = 0
                    continue
                buffer.clear()
            else:
                index = buffer.find(b"\n", self._scanned)
                if index >= 0:
                    line = bytes(buffer[:index])
                    del buffer[: index + 1]
                    self._scanned = 0
                    if len(line) > self.max_line_bytes:
                        self._head = line[:HEAD_BYTES]
                        return OVERSIZED
                    return line[:-1] if line.endswith(b"\r") else line
                if len(buffer) > self.max_line_bytes:
                    self._head = bytes(buffer[:HEAD_BYTES])
                    buffer.clear()
                    self._scanned = 0
                    self._discarding = True
                    return OVERSIZED
                self._scanned = len(buffer)
            if self._eof:
                if buffer and not self._discarding:
                    line = bytes(buffer)
                    buffer.clear()
                    self._scanned = 0
                    return line
                return None
            try:
                data = await self.stream.receive_some(self.chunk_bytes)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                self._eof = True
            else:
                buffer += data


@attrs.define(eq=False)
class MessageWriter:
    """Writes messages to a Trio send stream, one line each, one at a time.

    Attributes:
        stream: where lines go.
    """

    stream: trio.abc.SendStream
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)

    async def send(self, message: dict[str, Any]) -> None:
        """Encode and write one message; concurrent calls never interleave.

        Raises:
            trio.BrokenResourceError: the peer stopped reading.
            trio.ClosedResourceError: the stream was closed.
        """
        data = encode_message(message)
        async with self._lock:
            await self.stream.send_all(data)


@attrs.define(eq=False)
class Outbox:
    """The ordered queue of outgoing messages, bounded where input enters.

    :meth:`put` never waits: the updates of a running turn are produced by
    synchronous session observers, which cannot wait, and a turn must not
    stall on its client.  The bound is applied to input instead: the reader
    awaits :meth:`wait_for_space` before each line, and that wait lasts while
    ``limit`` messages are queued or owed (:meth:`reserve`: a request handler
    running as a task answers once).  A client that sends requests without
    reading the answers therefore stops being read once the writer is stuck
    and the queue is full; what is queued is bounded by ``limit`` plus the
    updates of turns already running.  Nothing waits on the reader, so a
    client that reads never deadlocks the server.

    Attributes:
        limit: the number of queued and owed messages at which input stops.
    """

    limit: int = DEFAULT_OUTBOX_LIMIT
    _queue: collections.deque[dict[str, Any]] = attrs.field(factory=collections.deque, init=False)
    _owed: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    _space: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)
    _ready: trio.lowlevel.ParkingLot = attrs.field(factory=trio.lowlevel.ParkingLot, init=False)

    def __attrs_post_init__(self) -> None:
        if self.limit < 1:
            raise ValueError(f"the outbox limit must be at least 1, got {self.limit!r}")

    def __len__(self) -> int:
        """The number of queued messages."""
        return len(self._queue)

    @property
    def used(self) -> int:
        """Queued messages plus answers owed by running handlers."""
        return len(self._queue) + self._owed

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._closed

    def put(self, message: dict[str, Any]) -> bool:
        """Queue ``message`` (never waits); False when the outbox is closed (the message is dropped)."""
        if self._closed:
            return False
        self._queue.append(message)
        self._ready.unpark()
        return True

    def reserve(self) -> None:
        """Count one answer a handler task owes (it takes a place until :meth:`release`)."""
        self._owed += 1

    def release(self) -> None:
        """The handler of a :meth:`reserve` is done (its answer, if any, is queued)."""
        self._owed -= 1
        self._wake_reader()

    async def wait_for_space(self) -> None:
        """Wait until fewer than ``limit`` messages are queued or owed, or the outbox is closed.

        Returns without a checkpoint when there is space already, so the lines
        of one read are dispatched without other tasks running in between.
        """
        while self.used >= self.limit and not self._closed:
            await self._space.park()

    async def get(self) -> dict[str, Any] | None:
        """The next message in order (waits for one); None once closed and empty."""
        await trio.lowlevel.checkpoint_if_cancelled()
        while not self._queue:
            if self._closed:
                await trio.lowlevel.cancel_shielded_checkpoint()
                return None
            await self._ready.park()
        message = self._queue.popleft()
        self._wake_reader()
        await trio.lowlevel.cancel_shielded_checkpoint()
        return message

    def close(self) -> None:
        """Take no more messages; :meth:`get` drains what is queued, then returns None."""
        self._closed = True
        self._ready.unpark_all()
        self._space.unpark_all()

    def _wake_reader(self) -> None:
        if self.used < self.limit:
            self._space.unpark_all()
