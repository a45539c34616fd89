"""A hand-written stdio MCP server for the tests: JSON-RPC lines, no SDK.

The SDK's server side only declares well-formed tools, so the declarations a
client must survive are written here by hand.  Run as
``python raw_server.py [--record FILE] [--malformed] [--fail-start-if FILE]``:

* ``--record FILE``: append ``pid N`` and one line per call (``call NAME``);
* ``--malformed``: also declare tools the SDK's client refuses (an input
  schema of type string, a tool without a name);
* ``--fail-start-if FILE``: record ``refused to start``, write to stderr and
  exit 2 at once if FILE exists (a server whose restart fails).

Tools: ``echo`` (answers with the JSON of its arguments), ``size`` (answers
with the length of its ``text``), ``lookup`` (its input schema has a ``$ref``
that resolves to nothing) and ``crash`` (exits 3 in the middle of the call).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

parser = argparse.ArgumentParser()
parser.add_argument("--record", type=Path, default=None)
parser.add_argument("--malformed", action="store_true")
parser.add_argument("--fail-start-if", type=Path, default=None)
options = parser.parse_args()


def record(line: str) -> None:
    if options.record is not None:
        with options.record.open("a", encoding="utf-8") as f:
            f.write(line + "\n")


if options.fail_start_if is not None and options.fail_start_if.exists():
    record("refused to start")
    print("raw_server: the lock file is there; not starting", file=sys.stderr, flush=True)
    sys.exit(2)


TOOLS: list[dict[str, Any]] = [
    {
        "name": "echo",
        "description": "Answer with the arguments.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}},
    },
    {
        "name": "size",
        "description": "The length of text.",
        "inputSchema": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]},
    },
    {
        "name": "lookup",
        "description": "A tool whose schema refers to a definition it does not have.",
        "inputSchema": {
            "type": "object",
            "properties": {"key": {"$ref": "#/$defs/Key"}},
            "required": ["key"],
        },
    },
    {"name": "crash", "description": "Exit in the middle of the call.", "inputSchema": {"type": "object"}},
]
MALFORMED: list[dict[str, Any]] = [
    {"name": "scalar", "description": "Its input schema is not an object.", "inputSchema": {"type": "string"}},
    {"description": "A tool without a name.", "inputSchema": {"type": "object"}},
]


def answer(request_id: Any, result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request_id, "result": result}) + "\n")
    sys.stdout.flush()


def text(value: str) -> dict[str, Any]:
    return {"content": [{"type": "text", "text": value}]}


def main() -> None:
    record(f"pid {os.getpid()}")
    for line in sys.stdin:
        if not line.strip():
            continue
        message = json.loads(line)
        method, request_id = message.get("method"), message.get("id")
        if request_id is None or method is None:
            continue  # a notification, or an answer to nothing we asked
        params = message.get("params") or {}
        if method == "initialize":
            answer(
                request_id,
                {
                    "protocolVersion": params.get("protocolVersion", "2025-06-18"),
                    "capabilities": {"tools": {}},
                    "serverInfo": {"name": "raw", "version": "1"},
                },
            )
        elif method == "tools/list":
            answer(request_id, {"tools": TOOLS + (MALFORMED if options.malformed else [])})
        elif method == "tools/call":
            name, arguments = params.get("name"), params.get("arguments") or {}
            record(f"call {name}")
            if name == "crash":
                print("raw_server: fatal: asked to crash", file=sys.stderr, flush=True)
                os._exit(3)
            elif name == "size":
                answer(request_id, text(str(len(arguments.get("text", "")))))
            else:
                answer(request_id, text(json.dumps(arguments, sort_keys=True)))
        elif method == "ping":
            answer(request_id, {})
        else:
            sys.stdout.write(
                json.dumps({"jsonrpc": "2.0", "id": request_id, "error": {"code": -32601, "message": "no"}}) + "\n"
            )
            sys.stdout.flush()


main()
