"""A tiny scripted HTTP/1.1 server, written with Trio, for provider tests.

The server listens on 127.0.0.1 (an ephemeral port), reads each request (head
and ``Content-Length`` body), records it, and plays the next scripted
:data:`Behaviour`:

* :class:`Respond` - a status, headers and a body (framed by ``Content-Length``);
* :class:`Stream` - a status and headers, then raw byte pieces written one by
  one with optional :class:`Pause` s between them and an optional :class:`Drop`
  (the connection is closed, or reset, mid-response); framed with chunked
  transfer encoding (the default) or by closing the connection;
* :class:`Hang` - never answer;
* :class:`Drop` - close the connection without answering.

While a response is being played, a watcher task reads the socket so the
server notices a client that hangs up early (EOF or reset): it is counted in
:attr:`ScriptedServer.disconnects` and :attr:`ScriptedServer.client_disconnected`
is set, and the rest of the response is abandoned.  A client closing a
kept-alive connection between requests (as closing its connection pool does) is
counted in :attr:`ScriptedServer.idle_closes`.

Typical use::

    server = await start_server(nursery, Stream([sse_text("hi"), sse_finish("stop"), DONE]))
    provider = OpenAIProvider(model="m", base_url=server.base_url, api_key="k")
"""

from __future__ import annotations

import http
import json
import socket
import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any, Literal, TypeAlias

import attrs
import trio

# ---------------------------------------------------------------- script


@attrs.frozen
class Pause:
    """Sleep (with ``trio.sleep``) before writing the next piece."""

    seconds: float


@attrs.frozen
class Drop:
    """Close the connection abruptly, mid-response.

    Attributes:
        reset: send a TCP reset (``SO_LINGER`` 0) instead of a clean FIN.
    """

    reset: bool = False


@attrs.frozen
class Respond:
    """A complete response: status, headers and a ``Content-Length`` body.

    ``body`` may be bytes, a str (UTF-8), or any other JSON value (encoded,
    with ``Content-Type: application/json``).
    """

    status: int
    body: Any = b""
    headers: Mapping[str, str] = attrs.field(factory=dict)


@attrs.frozen
class Stream:
    """A streamed response written piece by piece.

    Attributes:
        pieces: raw bytes written as they are (each one a separate write; with
            chunked framing, a separate chunk), :class:`Pause` s and at most a
            final :class:`Drop`.
        status: the status code.
        headers: extra response headers.
        framing: ``"chunked"`` (ends with the zero-length chunk, connection kept
            alive) or ``"close"`` (the body ends when the server closes).
        content_type: the ``Content-Type`` header.
    """

    pieces: Sequence[bytes | Pause | Drop]
    status: int = 200
    headers: Mapping[str, str] = attrs.field(factory=dict)
    framing: Literal["chunked", "close"] = "chunked"
    content_type: str = "text/event-stream"


@attrs.frozen
class Hang:
    """Read the request and never answer (until the client hangs up)."""


Behaviour: TypeAlias = Respond | Stream | Hang | Drop
"""What the server does with one request (a :class:`Drop` here closes the
connection without sending any response)."""


# ---------------------------------------------------------------- SSE helpers


def sse(obj: object) -> bytes:
    """One ``data:`` event carrying ``obj`` as compact JSON."""
    return b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def sse_delta(finish_reason: str | None = None, **delta: Any) -> bytes:
    """A chat completion chunk event with one choice carrying ``delta``."""
    choice: dict[str, Any] = {"index": 0, "delta": delta}
    if finish_reason is not None:
        choice["finish_reason"] = finish_reason
    return sse({"id": "c1", "object": "chat.completion.chunk", "choices": [choice]})


def sse_text(text: str) -> bytes:
    """An event with a content delta."""
    return sse_delta(content=text)


def sse_finish(reason: str = "stop") -> bytes:
    """An event with an empty delta and a finish_reason."""
    return sse_delta(finish_reason=reason)


def sse_usage(prompt: int, completion: int, **extra: Any) -> bytes:
    """A usage-only event (``choices`` empty), as sent with ``include_usage``."""
    usage = {"prompt_tokens": prompt, "completion_tokens": completion, **extra}
    return sse({"id": "c1", "choices": [], "usage": usage})


DONE = b"data: [DONE]\n\n"
"""The OpenAI end-of-stream marker."""


# ---------------------------------------------------------------- server


@attrs.frozen
class RecordedRequest:
    """A request the server received.

    Attributes:
        method: the request method.
        path: the request target.
        headers: the header fields, names lower-cased.
        body: the raw body.
    """

    method: str
    path: str
    headers: Mapping[str, str]
    body: bytes

    @property
    def json(self) -> Any:
        """The body parsed as JSON."""
        return json.loads(self.body)


class _ClientGone(Exception):
    pass


@attrs.define(eq=False)
class _Connection:
    stream: trio.SocketStream
    buffer: bytearray = attrs.field(factory=bytearray)

    async def _fill(self) -> bool:
        try:
            data = await self.stream.receive_some(65536)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            data = b""
        self.buffer += data
        return bool(data)

    async def read_request(self) -> RecordedRequest | None:
        while b"\r\n\r\n" not in self.buffer:
            if not await self._fill():
                if self.buffer:
                    raise _ClientGone
                return None
        head, _, rest = bytes(self.buffer).partition(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        method, path, _version = lines[0].split(" ", 2)
        headers: dict[str, str] = {}
        for line in lines[1:]:
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        length = int(headers.get("content-length", "0"))
        self.buffer = bytearray(rest)
        while len(self.buffer) < length:
            if not await self._fill():
                raise _ClientGone
        body = bytes(self.buffer[:length])
        del self.buffer[:length]
        return RecordedRequest(method=method, path=path, headers=headers, body=body)


@attrs.define(eq=False)
class ScriptedServer:
    """The scripted HTTP server (see the module docstring).

    Attributes:
        script: the behaviours, one per request in order (the last one repeats),
            or a function from the 0-based request number to a behaviour.
        requests: every request received, in order.
        connections: how many TCP connections were accepted.
        disconnects: how many times the client hung up before a response ended.
        client_disconnected: set the first time the client hangs up early.
        idle_closes: how many times the client closed a connection between requests.
        client_closed_idle: set the first time it does.
        port: the listening port, once started.
    """

    script: Sequence[Behaviour] | Callable[[int], Behaviour]
    requests: list[RecordedRequest] = attrs.field(factory=list)
    connections: int = 0
    disconnects: int = 0
    client_disconnected: trio.Event = attrs.field(factory=trio.Event)
    idle_closes: int = 0
    client_closed_idle: trio.Event = attrs.field(factory=trio.Event)
    port: int = 0

    @property
    def base_url(self) -> str:
        """The URL a provider should use as ``base_url``."""
        return f"http://127.0.0.1:{self.port}/v1"

    async def serve(self, *, task_status: trio.TaskStatus[ScriptedServer]) -> None:
        """Listen and serve until cancelled; ``task_status.started(self)`` once listening."""
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        self.port = listeners[0].socket.getsockname()[1]
        task_status.started(self)
        await trio.serve_listeners(self._handle, listeners)

    def _behaviour(self, number: int) -> Behaviour:
        if callable(self.script):
            return self.script(number)
        return self.script[min(number, len(self.script) - 1)]

    def _record_disconnect(self) -> None:
        self.disconnects += 1
        self.client_disconnected.set()

    async def _handle(self, stream: trio.SocketStream) -> None:
        self.connections += 1
        conn = _Connection(stream)
        try:
            while True:
                try:
                    request = await conn.read_request()
                except _ClientGone:
                    self._record_disconnect()
                    return
                if request is None:
                    self.idle_closes += 1
                    self.client_closed_idle.set()
                    return
                self.requests.append(request)
                behaviour = self._behaviour(len(self.requests) - 1)
                if not await self._play_watched(conn, behaviour):
                    return
        finally:
            with trio.CancelScope(shield=True):
                await stream.aclose()

    async def _play_watched(self, conn: _Connection, behaviour: Behaviour) -> bool:
        """Play ``behaviour`` while watching for the client hanging up; True to keep alive."""
        keep_alive = False
        gone = False

        async def watch(cancel_scope: trio.CancelScope) -> None:
            nonlocal gone
            while await conn._fill():
                pass
            gone = True
            cancel_scope.cancel()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(watch, nursery.cancel_scope)
            try:
                keep_alive = await self._play(conn.stream, behaviour)
            except (trio.BrokenResourceError, trio.ClosedResourceError):
                gone = True
            nursery.cancel_scope.cancel()
        if gone:
            self._record_disconnect()
            return False
        return keep_alive

    async def _play(self, stream: trio.SocketStream, behaviour: Behaviour) -> bool:
        if isinstance(behaviour, Hang):
            await trio.sleep_forever()
        if isinstance(behaviour, Drop):
            if behaviour.reset:
                _reset_on_close(stream)
            return False
        if isinstance(behaviour, Respond):
            body = behaviour.body
            headers = dict(behaviour.headers)
            if isinstance(body, str):
                body = body.encode()
            elif not isinstance(body, bytes | bytearray):
                body = json.dumps(body).encode()
                headers.setdefault("Content-Type", "application/json")
            headers["Content-Length"] = str(len(body))
            await stream.send_all(_head(behaviour.status, headers) + body)
            return True
        assert isinstance(behaviour, Stream)
        headers = {"Content-Type": behaviour.content_type, "Cache-Control": "no-cache"}
        headers.update(behaviour.headers)
        chunked = behaviour.framing == "chunked"
        if chunked:
            headers["Transfer-Encoding"] = "chunked"
        else:
            headers["Connection"] = "close"
        await stream.send_all(_head(behaviour.status, headers))
        for piece in behaviour.pieces:
            if isinstance(piece, Pause):
                await trio.sleep(piece.seconds)
            elif isinstance(piece, Drop):
                if piece.reset:
                    _reset_on_close(stream)
                return False
            elif piece:
                if chunked:
                    piece = b"%x\r\n%s\r\n" % (len(piece), piece)
                await stream.send_all(piece)
        if chunked:
            await stream.send_all(b"0\r\n\r\n")
            return True
        return False


def _reset_on_close(stream: trio.SocketStream) -> None:
    stream.socket.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))


def _head(status: int, headers: Mapping[str, str]) -> bytes:
    try:
        phrase = http.HTTPStatus(status).phrase
    except ValueError:
        phrase = "Unknown"
    lines = [f"HTTP/1.1 {status} {phrase}"]
    lines += [f"{name}: {value}" for name, value in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


async def start_server(
    nursery: trio.Nursery, *script: Behaviour, plan: Callable[[int], Behaviour] | None = None
) -> ScriptedServer:
    """Start a :class:`ScriptedServer` in ``nursery`` and return it once listening.

    Args:
        nursery: where the server runs (e.g. pytest-trio's ``nursery`` fixture).
        *script: the behaviours, one per request (the last one repeats).
        plan: instead of ``script``, a function of the request number.

    Returns:
        The listening server.
    """
    server = ScriptedServer(plan if plan is not None else script)
    started: ScriptedServer = await nursery.start(server.serve)
    return started


def closed_port() -> int:
    """A local port with nothing listening on it (connections are refused)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port
