"""A small stdio MCP server for the tests, built on the official SDK's server side.

Run as ``python calc_server.py [--record FILE] [--stubborn] [--child] [--fail-start]``:

* ``--record FILE``: append one line per notable event (``started slow``,
  ``cancelled slow``) so a test can see what the server saw;
* ``--stubborn``: ignore SIGTERM and keep running after stdin ends (the
  client must escalate to SIGKILL);
* ``--child``: start a grandchild (``sleep 300``) in the server's process group;
* ``--fail-start``: write a message to stderr and exit 2 before serving.
"""

from __future__ import annotations

import argparse
import base64
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import (
    AudioContent,
    BlobResourceContents,
    CallToolResult,
    EmbeddedResource,
    ImageContent,
    ResourceLink,
    TextContent,
    TextResourceContents,
)

parser = argparse.ArgumentParser()
parser.add_argument("--record", type=Path, default=None)
parser.add_argument("--stubborn", action="store_true")
parser.add_argument("--child", action="store_true")
parser.add_argument("--fail-start", action="store_true")
options = parser.parse_args()

if options.fail_start:
    print("calc_server: cannot open the database (--fail-start)", file=sys.stderr, flush=True)
    sys.exit(2)


def record(line: str) -> None:
    if options.record is not None:
        with options.record.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


app = MCPServer("calc")
child: subprocess.Popen[bytes] | None = None
if options.child:
    child = subprocess.Popen(["sleep", "300"])


@app.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@app.tool(name="legacy.tool")
def legacy() -> str:
    """A tool with a dot in its name; removed by grow."""
    return "legacy"


@app.tool()
async def grow(ctx: Context) -> str:
    """Add the mul tool, remove legacy.tool, and announce the change."""

    def mul(a: int, b: int) -> int:
        """Multiply two integers."""
        return a * b

    app.add_tool(mul, name="mul")
    app.remove_tool("legacy.tool")
    await ctx.session.send_tool_list_changed()
    return "grown"


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
def hang() -> str:
    """Block the whole server (a hung server: it reads nothing more)."""
    record("hanging")
    time.sleep(300)
    return "unreachable"


@app.tool()
def crash() -> str:
    """Exit the process in the middle of the call."""
    print("calc_server: fatal: out of cheese", file=sys.stderr, flush=True)
    os._exit(3)


@app.tool()
def fail(reason: str) -> str:
    """Raise: the SDK answers with isError and the message."""
    raise ToolError(reason)


@app.tool()
def media() -> CallToolResult:
    """Every kind of non-text content."""
    png = base64.b64encode(b"\x89PNG" + bytes(96)).decode()
    wav = base64.b64encode(bytes(1000)).decode()
    return CallToolResult(
        content=[
            TextContent(type="text", text="here you go"),
            ImageContent(type="image", data=png, mime_type="image/png"),
            AudioContent(type="audio", data=wav, mime_type="audio/wav"),
            ResourceLink(
                type="resource_link",
                name="report",
                uri="file:///tmp/report.pdf",
                mime_type="application/pdf",
                size=2048,
            ),
            EmbeddedResource(
                type="resource",
                resource=TextResourceContents(uri="memo://notes", mime_type="text/plain", text="remember the milk"),
            ),
            EmbeddedResource(
                type="resource",
                resource=BlobResourceContents(uri="memo://blob", mime_type="application/octet-stream", blob=wav),
            ),
        ]
    )


@app.tool()
def structured() -> CallToolResult:
    """Structured content and no text."""
    return CallToolResult(content=[], structured_content={"total": 3, "items": ["a", "b"]})


@app.tool()
def child_pid() -> int:
    """The pid of the grandchild started with --child (0 without)."""
    return child.pid if child is not None else 0


@app.tool()
def where(variable: str) -> dict[str, Any]:
    """The working directory and one environment variable."""
    return {"cwd": os.getcwd(), "value": os.environ.get(variable)}


if options.stubborn:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
record(f"pid {os.getpid()}")
app.run()
if options.stubborn:
    record("stdin closed; staying")
    time.sleep(300)
