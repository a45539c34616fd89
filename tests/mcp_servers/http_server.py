"""A streamable HTTP MCP server for the tests, on 127.0.0.1 and a port the OS picks.

Run as ``python http_server.py --token SECRET [--record FILE]``.  It binds
``127.0.0.1:0``, prints ``port N`` on stdout, then serves the MCP endpoint at
``/mcp``.  Every request must carry ``Authorization: Bearer SECRET``; any other
request is answered 401 (and recorded), so a test sees that the client's
configured headers reach the server.
"""

from __future__ import annotations

import argparse
import socket
import sys
from pathlib import Path

import anyio
import uvicorn
from mcp.server.mcpserver import Context, MCPServer
from starlette.types import ASGIApp, Receive, Scope, Send

parser = argparse.ArgumentParser()
parser.add_argument("--token", required=True)
parser.add_argument("--record", type=Path, default=None)
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
    sock.bind(("127.0.0.1", 0))
    sock.listen(128)  # connections wait in the backlog until uvicorn accepts them
    print(f"port {sock.getsockname()[1]}", flush=True)
    asgi = RequireToken(app.streamable_http_app(host="127.0.0.1"), options.token)
    server = uvicorn.Server(uvicorn.Config(asgi, log_level="warning", lifespan="on"))
    anyio.run(server.serve, [sock])
    sys.exit(0)


main()
