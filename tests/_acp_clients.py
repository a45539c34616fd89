"""The ACP test clients: one speaking to a real server subprocess, one in process.

- :class:`AcpClient` and :func:`open_server`: a ``python -m trio_harness acp``
  subprocess over its pipes, a background task reading everything it writes
  (``tests/test_acp_e2e.py``).
- :class:`Peer` and :func:`connected`: an :class:`~trio_harness.acp.AcpServer`
  over a ``trio.testing.memory_stream_pair`` (or real sockets), read only when a
  test asks, so a test can leave answers unread (``tests/test_acp_server.py``).
  Every message it reads is checked by :func:`check_envelope`.

Every wait is bounded by ``WAIT`` (``tests/_util.py``).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import trio
import trio.testing
from _util import WAIT

from trio_harness import Harness
from trio_harness.acp import AcpServer

__all__ = [
    "INFO_KINDS",
    "AcpClient",
    "Msg",
    "Peer",
    "check_envelope",
    "connected",
    "conversation",
    "open_server",
    "run_python_client",
    "tool_ends",
    "tool_statuses",
    "write_script",
]

Msg = dict[str, Any]

INFO_KINDS = frozenset({"session_info_update", "usage_update", "available_commands_update", "config_option_update"})
"""The updates about the session (title, activity, usage, commands, config) rather than its conversation."""


def conversation(updates: list[Msg]) -> list[Msg]:
    """``updates`` without the session-info and usage updates (tests of those check them separately)."""
    return [u for u in updates if u["sessionUpdate"] not in INFO_KINDS]


def tool_statuses(updates: list[Msg]) -> dict[str, list[str]]:
    """Each tool call's statuses in the order sent (its ``tool_call``, then each update that sets one)."""
    seen: dict[str, list[str]] = {}
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update") and "status" in update:
            seen.setdefault(update["toolCallId"], []).append(update["status"])
    return seen


def tool_ends(updates: list[Msg]) -> list[Msg]:
    """The ``tool_call_update`` that ended each call (``completed`` or ``failed``), in order."""
    return [
        u for u in updates if u["sessionUpdate"] == "tool_call_update" and u.get("status") in ("completed", "failed")
    ]


# ---------------------------------------------------------------- an SDK client subprocess


async def run_python_client(path: Path, source: str, *args: str) -> dict[str, Any]:
    """Write ``source`` to ``path``, run it with this Python in ``path``'s directory, and return its summary.

    For clients built on an asyncio SDK, which cannot run on Trio: the script
    prints one JSON summary as its last line of output and exits 0.
    """
    path.write_text(source, encoding="utf-8")
    with trio.fail_after(WAIT):
        result = await trio.run_process(
            [sys.executable, str(path), *args],
            cwd=path.parent,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    summary: dict[str, Any] = json.loads(result.stdout.decode().strip().splitlines()[-1])
    return summary


# ---------------------------------------------------------------- a server subprocess


class AcpClient:
    """A minimal ACP client over a subprocess's pipes (Trio only)."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.stdin = process.stdin
        self.stdout = process.stdout
        self.received: list[Msg] = []
        self.eof = False
        self._changed = trio.Event()
        self._next_id = 0

    async def pump(self) -> None:
        """Read server messages until end of output (run as a background task)."""
        buffer = b""
        while True:
            data = await self.stdout.receive_some(65536)
            if not data:
                break
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                self.received.append(json.loads(line))
                self._changed.set()
                self._changed = trio.Event()
        self.eof = True
        self._changed.set()

    async def wait_for(self, predicate: Callable[[Msg], bool]) -> Msg:
        """The first received message matching ``predicate`` (waits for it)."""
        with trio.fail_after(WAIT):
            while True:
                for message in self.received:
                    if predicate(message):
                        return message
                if self.eof:
                    raise AssertionError(f"the server closed its output; received: {self.received}")
                await self._changed.wait()

    async def send_raw(self, data: bytes) -> None:
        """Write raw bytes to the server's stdin."""
        await self.stdin.send_all(data)

    async def send(self, *messages: Msg) -> None:
        """Write messages (in one write, so they arrive together)."""
        await self.send_raw(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    def request(self, method: str, params: Any = None) -> Msg:
        """A request message with a fresh id."""
        self._next_id += 1
        message: Msg = {"jsonrpc": "2.0", "id": self._next_id, "method": method}
        if params is not None:
            message["params"] = params
        return message

    async def response(self, request_id: Any) -> Msg:
        """The response to ``request_id``."""
        return await self.wait_for(lambda m: m.get("id") == request_id and "method" not in m)

    async def call(self, method: str, params: Any = None) -> Any:
        """Send a request and return its result (fails on an error response)."""
        message = self.request(method, params)
        await self.send(message)
        reply = await self.response(message["id"])
        assert "result" in reply, f"{method} failed: {reply}"
        return reply["result"]

    async def error(self, message: Msg) -> Msg:
        """Send ``message`` and return the ``error`` of its response."""
        await self.send(message)
        reply = await self.response(message["id"])
        assert "error" in reply, f"expected an error for {message}, got {reply}"
        error: Msg = reply["error"]
        return error

    def updates(self, session_id: str) -> list[Msg]:
        """Every ``session/update`` received so far for ``session_id``."""
        return [
            m["params"]["update"]
            for m in self.received
            if m.get("method") == "session/update" and m["params"]["sessionId"] == session_id
        ]

    def position(self, message: Msg) -> int:
        """Where ``message`` is in the received order."""
        return next(i for i, m in enumerate(self.received) if m is message)

    async def initialize(self) -> Msg:
        result: Msg = await self.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        return result

    async def new_session(self, cwd: Path) -> str:
        result = await self.call("session/new", {"cwd": str(cwd), "mcpServers": []})
        session_id: str = result["sessionId"]
        return session_id

    def prompt(self, session_id: str, text: str) -> Msg:
        return self.request("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]})

    def cancel(self, session_id: str) -> Msg:
        return {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}

    async def close_input(self) -> None:
        await self.stdin.aclose()

    async def wait_exit(self) -> int:
        with trio.fail_after(WAIT):
            return await self.process.wait()


def write_script(path: Path, responses: list[Msg]) -> Path:
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return path


@asynccontextmanager
async def open_server(
    tmp_path: Path,
    responses: list[Msg],
    *,
    store: Path | None = None,
    name: str = "script",
    extra: tuple[str, ...] = (),
    tools: str = "tasks,bash",
) -> AsyncIterator[AcpClient]:
    """Spawn the ACP server (``--tools tools``); on exit close its stdin and wait for it to exit."""
    script = write_script(tmp_path / f"{name}.json", responses)
    store = store if store is not None else tmp_path / "store"
    stderr_path = tmp_path / f"{name}.stderr"
    command = [
        sys.executable,
        "-m",
        "trio_harness",
        "acp",
        *([] if "--model" in extra else ["--model", f"scripted:{script}"]),  # extra's models replace it
        "--store",
        str(store),
        "--tools",
        tools,
        *extra,
    ]
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=tmp_path
        )
    client = AcpClient(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.pump)
            yield client
            await client.close_input()  # idempotent
            await client.wait_exit()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    errors = stderr_path.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in errors, errors


# ---------------------------------------------------------------- an in-process server


class Peer:
    """The client end of an in-process connection."""

    def __init__(self, stream: trio.abc.Stream) -> None:
        self.stream = stream
        self.received: list[Msg] = []
        self._buffer = b""
        self._next = 0

    async def send_raw(self, data: bytes) -> None:
        await self.stream.send_all(data)

    async def send(self, *messages: Msg) -> None:
        await self.send_raw(b"".join(json.dumps(m).encode() + b"\n" for m in messages))

    def request(self, method: str, params: Any = None) -> Msg:
        self._next += 1
        return {"jsonrpc": "2.0", "id": f"r{self._next}", "method": method, "params": params or {}}

    async def receive(self) -> Msg:
        while b"\n" not in self._buffer:
            data = await self.stream.receive_some(65536)
            if not data:
                raise EOFError("the server closed its output")
            self._buffer += data
        line, self._buffer = self._buffer.split(b"\n", 1)
        message: Msg = json.loads(line)
        check_envelope(message)
        self.received.append(message)
        return message

    async def response(self, request_id: Any) -> Msg:
        with trio.fail_after(WAIT):
            for message in self.received:
                if message.get("id") == request_id and "method" not in message:
                    return message
            while True:
                message = await self.receive()
                if message.get("id") == request_id and "method" not in message:
                    return message

    @property
    def updates(self) -> list[Msg]:
        """The ``session/update`` payloads received so far, in order."""
        return [m["params"]["update"] for m in self.received if m.get("method") == "session/update"]

    async def updates_until(self, done: Callable[[list[Msg]], bool]) -> list[Msg]:
        """The updates received once ``done(updates)`` holds, reading more until it does (within WAIT)."""
        with trio.fail_after(WAIT):
            while not done(updates := self.updates):
                await self.receive()
            return updates

    async def call(self, method: str, params: Any = None) -> Any:
        message = self.request(method, params)
        await self.send(message)
        reply = await self.response(message["id"])
        assert "result" in reply, reply
        return reply["result"]


def check_envelope(message: Msg) -> None:
    """Every server message is a well-formed JSON-RPC 2.0 response or notification."""
    assert message["jsonrpc"] == "2.0"
    if "method" in message:
        assert message["method"] == "session/update"
        assert isinstance(message["params"]["sessionId"], str)
    else:
        assert "id" in message
        assert ("result" in message) != ("error" in message)
        if "error" in message:
            assert isinstance(message["error"]["code"], int)
            assert isinstance(message["error"]["message"], str)


@asynccontextmanager
async def connected(
    harness: Harness, **options: Any
) -> AsyncIterator[tuple[Peer, AcpServer, Callable[[], Awaitable[None]]]]:
    """Serve one in-process connection; yields the peer, the server and a disconnect function."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    server = AcpServer(harness, **options)
    finished = trio.Event()

    async def run() -> None:
        try:
            await server.serve(server_stream, server_stream)
        finally:
            finished.set()

    async def disconnect() -> None:
        await client_stream.send_stream.aclose()
        with trio.fail_after(WAIT):
            await finished.wait()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run)
        yield Peer(client_stream), server, disconnect
        await disconnect()
