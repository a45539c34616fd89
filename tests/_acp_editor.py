"""An in-process ACP client that is an editor: it has terminals (it runs ``terminal/*`` commands) and approves.

:class:`EditorPeer` reads everything the server writes in a background task:
it answers ``terminal/*`` requests by running the command as a real process
(``terminal/create``), and ``session/request_permission`` with ``allow_once``
(recording the order of both); everything else is kept in ``received``.
"""

from __future__ import annotations

import contextlib
import json
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import Any

import attrs
import trio
import trio.testing
from _util import WAIT

from trio_harness import Harness
from trio_harness.acp import AcpServer

Msg = dict[str, Any]


@attrs.define(eq=False)
class Terminal:
    """A terminal the client created: its process and the output so far."""

    id: str
    process: trio.Process
    output: bytearray = attrs.field(factory=bytearray)
    done: trio.Event = attrs.field(factory=trio.Event)
    killed: bool = False
    released: bool = False

    def exit_status(self) -> Msg:
        code = self.process.returncode
        assert code is not None
        if code < 0:
            return {"exitCode": None, "signal": signal.Signals(-code).name}
        return {"exitCode": code, "signal": None}


class EditorPeer:
    """The client end of an in-process connection, with terminals."""

    def __init__(self, stream: trio.abc.Stream, nursery: trio.Nursery) -> None:
        self.stream = stream
        self.nursery = nursery
        self.received: list[Msg] = []
        self.asked: list[str] = []  # the methods of the server's requests, in order
        self.terminals: dict[str, Terminal] = {}
        self._changed = trio.Event()
        self._next = 0
        self._sending = trio.Lock()
        # When set, terminal/create waits for it (a test cancels meanwhile).
        self.hold_create: trio.Event | None = None
        # When set, terminal/kill is never answered (a client gone quiet).
        self.mute_kill = False
        # A method listed here is answered only once its event is set (a slow or silent client).
        self.hold: dict[str, trio.Event] = {}
        # The editor's buffers, for fs/read_text_file and fs/write_text_file (path -> text).
        self.files: dict[str, str] = {}

    async def pump(self) -> None:
        buffer = b""
        while True:
            data = await self.stream.receive_some(65536)
            if not data:
                return
            buffer += data
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message = json.loads(line)
                if "method" in message and "id" in message:
                    self.asked.append(message["method"])
                    self.nursery.start_soon(self._answer, message)
                else:
                    self.received.append(message)
                self._changed.set()
                self._changed = trio.Event()

    async def _send(self, message: Msg) -> None:
        async with self._sending:
            await self.stream.send_all(json.dumps(message).encode() + b"\n")

    async def _answer(self, request: Msg) -> None:
        method, params = request["method"], request["params"]
        if (held := self.hold.get(method)) is not None:
            await held.wait()
        answer: Msg = {}
        if method == "session/request_permission":
            result: Any = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        elif method == "fs/read_text_file":
            result = {"content": self.files[params["path"]]} if params["path"] in self.files else None
            if result is None:
                answer = {"error": {"code": -32002, "message": f"no such file: {params['path']}"}}
        elif method == "fs/write_text_file":
            self.files[params["path"]] = params["content"]
            result = None
        elif method == "terminal/create":
            result = await self._create(params)
        else:
            terminal = self.terminals[params["terminalId"]]
            if method == "terminal/wait_for_exit":
                await terminal.done.wait()
                result = terminal.exit_status()
            elif method == "terminal/output":
                result = {"output": terminal.output.decode(errors="replace"), "truncated": False}
                if terminal.done.is_set():
                    result["exitStatus"] = terminal.exit_status()
            elif method == "terminal/kill":
                if self.mute_kill:
                    await trio.sleep_forever()
                terminal.killed = True
                if terminal.process.returncode is None:
                    terminal.process.kill()
                result = {}
            elif method == "terminal/release":
                terminal.released = True
                if terminal.process.returncode is None:
                    terminal.process.kill()
                result = {}
            else:
                raise AssertionError(f"unexpected request {method}")
        with trio.CancelScope(shield=True), contextlib.suppress(trio.ClosedResourceError, trio.BrokenResourceError):
            await self._send({"jsonrpc": "2.0", "id": request["id"], **(answer or {"result": result})})

    async def _create(self, params: Msg) -> Msg:
        if self.hold_create is not None:
            await self.hold_create.wait()
        process = await trio.lowlevel.open_process(
            [params["command"], *params.get("args", [])],
            cwd=params.get("cwd"),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
        )
        terminal = Terminal(id=f"term-{len(self.terminals) + 1}", process=process)
        self.terminals[terminal.id] = terminal

        async def read() -> None:
            assert process.stdout is not None
            while chunk := await process.stdout.receive_some(65536):
                terminal.output += chunk
            await process.wait()
            terminal.done.set()

        self.nursery.start_soon(read)
        return {"terminalId": terminal.id}

    # ------------------------------------------------------------ requests

    def request(self, method: str, params: Any) -> Msg:
        self._next += 1
        return {"jsonrpc": "2.0", "id": f"e{self._next}", "method": method, "params": params}

    async def wait_for(self, predicate: Callable[[Msg], bool]) -> Msg:
        with trio.fail_after(WAIT):
            while True:
                for message in self.received:
                    if predicate(message):
                        return message
                await self._changed.wait()

    async def wait_until(self, predicate: Callable[[], bool]) -> None:
        with trio.fail_after(WAIT):
            while not predicate():
                await self._changed.wait()

    async def send_request(self, method: str, params: Any) -> Msg:
        message = self.request(method, params)
        await self._send(message)
        return message

    async def response(self, message: Msg) -> Msg:
        return await self.wait_for(lambda m: m.get("id") == message["id"] and "method" not in m)

    async def call(self, method: str, params: Any) -> Any:
        reply = await self.response(await self.send_request(method, params))
        assert "result" in reply, reply
        return reply["result"]

    async def notify(self, method: str, params: Any) -> None:
        await self._send({"jsonrpc": "2.0", "method": method, "params": params})

    def updates(self, session_id: str | None = None) -> list[Msg]:
        return [
            m["params"]["update"]
            for m in self.received
            if m.get("method") == "session/update" and session_id in (None, m["params"]["sessionId"])
        ]

    def prompt_params(self, session_id: str, text: str) -> Msg:
        return {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}


@asynccontextmanager
async def editor(
    harness: Harness, *, terminal: bool = True, fs: bool = False, **options: Any
) -> AsyncIterator[tuple[EditorPeer, AcpServer]]:
    """Serve one in-process connection to an initialized editor client (``terminal`` and ``fs`` advertised or not)."""
    client_stream, server_stream = trio.testing.memory_stream_pair()
    server = AcpServer(harness, **options)
    finished = trio.Event()

    async def serve() -> None:
        try:
            await server.serve(server_stream, server_stream)
        finally:
            finished.set()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(serve)
        peer = EditorPeer(client_stream, nursery)
        nursery.start_soon(peer.pump)
        capabilities: Msg = {"terminal": True} if terminal else {}
        if fs:
            capabilities["fs"] = {"readTextFile": True, "writeTextFile": True}
        await peer.call("initialize", {"protocolVersion": 1, "clientCapabilities": capabilities})
        yield peer, server
        await client_stream.send_stream.aclose()
        with trio.fail_after(WAIT):
            await finished.wait()
            for term in peer.terminals.values():  # every process reaped, its pipe read to the end
                if term.process.returncode is None:
                    term.process.kill()
                await term.done.wait()
        nursery.cancel_scope.cancel()
