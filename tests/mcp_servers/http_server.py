"""A streamable HTTP MCP server for the tests, on 127.0.0.1 and a port the OS picks.

Run as ``python http_server.py --token SECRET [--record FILE] [--port N] [--drop TOOL] [--no-get]``.
It binds ``127.0.0.1:0`` (or port N), prints ``port N`` on stdout, then serves
the MCP endpoint at ``/mcp``.  Every request must carry ``Authorization:
Bearer SECRET``; any other request is answered 401 (and recorded), so a test
sees that the client's configured headers reach the server.

* ``--drop TOOL``: a ``tools/call`` of TOOL is answered with an event stream
  that ends without a response (a dropped response stream; recorded);
* ``--no-get``: the optional GET stream is answered 405 Method Not Allowed, as
  the protocol allows (recorded).
"""

from __future__ import annotations

import argparse
import json
import socket
import sys
from pathlib import Path

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp, Message, Receive, Scope, Send

parser = argparse.ArgumentParser()
parser.add_argument("--token", required=True)
parser.add_argument("--record", type=Path, default=None)
parser.add_argument("--port", type=int, default=0)
parser.add_argument("--drop", default=None)
parser.add_argument("--no-get", action="store_true")
options = parser.parse_args()


def record(line: str) -> None:
    if options.record is not None:
        with options.record.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


app = MCPServer("web")


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool()
def whoami(ctx: Context) -> str:
    """The X-Client header of the request."""
    headers = ctx.headers or {}
    return f"client={headers.get('x-client')}"


@app.tool()
async def slow(tag: str) -> str:
    """Wait (almost) forever, recording a cancellation."""
    record(f"started {tag}")
    try:
        await anyio.sleep(300)
    except anyio.get_cancelled_exc_class():
        record(f"cancelled {tag}")
        raise
    return "finished"


@app.tool()
def drop() -> str:
    """Never answered with --drop: its response stream ends first."""
    return "not dropped"


class Misbehave:
    """Answer GET with 405 (--no-get) and drop the response stream of one tool's calls (--drop)."""

    def __init__(self, inner: ASGIApp) -> None:
        self.inner = inner

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.inner(scope, receive, send)
            return
        if options.no_get and scope["method"] == "GET":
            record("answered GET with 405")
            await send({"type": "http.response.start", "status": 405, "headers": [(b"allow", b"POST, DELETE")]})
            await send({"type": "http.response.body", "body": b""})
            return
        if options.drop is None or scope["method"] != "POST":
            await self.inner(scope, receive, send)
            return
        chunks: list[bytes] = []
        more = True
        while more:
            message = await receive()
            chunks.append(message.get("body", b""))
            more = message.get("more_body", False)
        body = b"".join(chunks)
        try:
            parsed = json.loads(body)
        except ValueError:
            parsed = None
        if (
            isinstance(parsed, dict)
            and parsed.get("method") == "tools/call"
            and (parsed.get("params") or {}).get("name") == options.drop
        ):
            record(f"dropped the response stream of {options.drop}")
            headers = [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]
            session = dict(scope["headers"]).get(b"mcp-session-id")
            if session is not None:
                headers.append((b"mcp-session-id", session))
            await send({"type": "http.response.start", "status": 200, "headers": headers})
            await send({"type": "http.response.body", "body": b""})
            return
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": body, "more_body": False}
            return await receive()

        await self.inner(scope, replay, send)


class RequireToken:
    """Refuse every request without the expected bearer token."""

    def __init__(self, inner: ASGIApp, token: str) -> None:
        self.inner = inner
        self.expected = f"Bearer {token}".encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != self.expected:
            record("refused a request without the token")
            await send({"type": "http.response.start", "status": 401, "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"missing or wrong token"})
            return
        await self.inner(scope, receive, send)


def main() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", options.port))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"port {sock.getsockname()[1]}", flush=True)
    asgi = RequireToken(Misbehave(app.streamable_http_app(host="127.0.0.1")), options.token)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    anyio.run(server.serve, [sock])
    sys.exit(0)


main()
