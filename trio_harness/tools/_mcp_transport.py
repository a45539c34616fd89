"""The transports of an MCP server: a child process over stdio, or a streamable HTTP client.

Each is an async context manager yielding the ``(read_stream, write_stream)``
pair the SDK's client session takes, and keeping what an error message needs
in a facts record the connection reads (:class:`_ProcessFacts`,
:class:`_HttpFacts`).

A stdio server runs in its own session and process group, with the
environment of its :class:`~trio_harness.bash.EnvPolicy` and the lifeline's
token, registered with the lifeline (:mod:`trio_harness._lifeline`) while it
runs.  Stopping it is the MCP shutdown: its stdin is closed, and once it has
exited (after ``grace_period`` if it has not) what is left of its group is
terminated as a bash command's is (``terminate_group`` of
:mod:`trio_harness.bash._process`: SIGTERM, then SIGKILL after another
``grace_period``).  A server that exits by itself takes its group with it the
same way.

The process handling is ours rather than the SDK's ``stdio_client`` because
the harness guarantees more than it does: the whole process group goes (also
children a server leaves behind when it exits by itself), the grace period is
configurable, and a crashed server's exit status and last stderr lines reach
the error the model and the user read.
"""

from __future__ import annotations

import logging
import signal
import subprocess
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import McpError
from .._lifeline import forget_group, lifeline
from .._redact import redact_urls
from ..bash._env import EnvPolicy
from ..bash._process import REAP_BOUND, signal_group, terminate_group
from ._mcp_config import McpHttpServer, McpStdioServer

if TYPE_CHECKING:
    from anyio.streams.memory import MemoryObjectReceiveStream, MemoryObjectSendStream
    from mcp.shared.message import SessionMessage

log = logging.getLogger("trio_harness.mcp")

# What is kept of a server's stderr for error messages.
_STDERR_TAIL = 4096
# A line from a server longer than this is refused (and dropped).
_MAX_LINE = 64 * 1024 * 1024
# How long an exit waits for the rest of the server's stderr (a child may hold it open).
_STDERR_DRAIN = 0.5


def _one_line(text: str, limit: int = 300, lines: int | None = None) -> str:
    """``text`` on one line (lines joined by `` | ``): its last ``lines`` lines, its last ``limit`` characters."""
    kept = [line.strip() for line in text.splitlines() if line.strip()]
    if lines is not None:
        kept = kept[-lines:]
    joined = " | ".join(kept)
    return joined if len(joined) <= limit else "…" + joined[-(limit - 1) :]


@attrs.define(eq=False)
class _ProcessFacts:
    """What is known about a stdio server's process: pid, exit status, last stderr."""

    pid: int | None = None
    returncode: int | None = None
    exited: trio.Event = attrs.field(factory=trio.Event)
    stderr: bytearray = attrs.field(factory=bytearray)
    # The stderr reader is shielded from the connection's cancellation, so the
    # last lines of a dying server are read; it stops at end of file, or when
    # cancelled through this scope once the process is gone.
    stderr_scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))
    stderr_done: trio.Event = attrs.field(factory=trio.Event)
    # Set once the connection asked the process to stop: an exit is no longer news.
    stopping: bool = False
    # Set once the handshake and the tool listing are done.  A start given up before (a
    # timeout, a sibling that cannot run) is stopped with SIGTERM at once, not after an EOF grace.
    ready: bool = False
    on_exit: Callable[[], None] = lambda: None

    def set_exit(self, returncode: int) -> None:
        if self.exited.is_set():
            return
        self.returncode = returncode
        self.exited.set()
        if not self.stopping:
            self.on_exit()

    def feed_stderr(self, data: bytes | bytearray) -> None:
        self.stderr += data
        if len(self.stderr) > _STDERR_TAIL:
            del self.stderr[: len(self.stderr) - _STDERR_TAIL]

    def summary(self) -> str:
        """The exit status and the end of stderr, on one line."""
        code = self.returncode
        if code is None:
            status = "the process is still running"
        elif code >= 0:
            status = f"exit code {code}"
        else:
            try:
                status = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                status = f"killed by signal {-code}"
        tail = _one_line(self.stderr.decode("utf-8", errors="replace"), lines=3)
        return f"{status}; stderr: {tail}" if tail else f"{status}; nothing on stderr"


@attrs.define(eq=False)
class _HttpFacts:
    """The last HTTP error status an HTTP server answered with; whether it forgot the session."""

    last_error: str | None = None
    session_gone: bool = False


def _parse_line(line: bytes) -> SessionMessage | Exception:
    from mcp.shared.message import SessionMessage
    from mcp.types import jsonrpc_message_adapter

    try:
        return SessionMessage(jsonrpc_message_adapter.validate_json(line, by_name=False))
    except ValueError as exc:  # pydantic's ValidationError is a ValueError
        return ValueError(f"not a JSON-RPC message: {_one_line(line.decode('utf-8', 'replace'), 200)} ({exc!r:.200})")


async def _pump_stdout(
    stdout: trio.abc.ReceiveStream, writer: MemoryObjectSendStream[SessionMessage | Exception]
) -> None:
    import anyio

    buffer = bytearray()
    scanned = 0
    try:
        async with writer:  # closing it is the end of the connection for the session
            while chunk := await stdout.receive_some(65536):
                buffer += chunk
                while (end := buffer.find(b"\n", scanned)) >= 0:
                    line = bytes(buffer[:end])
                    del buffer[: end + 1]
                    scanned = 0
                    if line.strip():
                        await writer.send(_parse_line(line))
                scanned = len(buffer)
                if len(buffer) > _MAX_LINE:
                    await writer.send(ValueError(f"the server sent a line longer than {_MAX_LINE} bytes; dropped"))
                    buffer.clear()
                    scanned = 0
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, trio.BrokenResourceError, trio.ClosedResourceError):
        pass


async def _pump_stdin(
    stdin: trio.abc.SendStream,
    reader: MemoryObjectReceiveStream[SessionMessage],
    read_writer: MemoryObjectSendStream[SessionMessage | Exception],
) -> None:
    try:
        async with reader:
            async for message in reader:
                data = message.message.model_dump_json(by_alias=True, exclude_unset=True) + "\n"
                await stdin.send_all(data.encode("utf-8"))
    except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
        # The server stopped reading: end the connection rather than leave requests waiting.
        await read_writer.aclose()


async def _pump_stderr(stderr: trio.abc.ReceiveStream, facts: _ProcessFacts, name: str) -> None:
    try:
        with facts.stderr_scope:
            while chunk := await stderr.receive_some(65536):
                facts.feed_stderr(chunk)
                if log.isEnabledFor(logging.DEBUG):
                    log.debug("MCP server %r stderr: %s", name, chunk.decode("utf-8", "replace").rstrip())
    except (trio.BrokenResourceError, trio.ClosedResourceError):
        pass
    finally:
        facts.stderr_done.set()


async def _settle_exit(facts: _ProcessFacts, returncode: int) -> None:
    """Record the exit once the rest of stderr is read (bounded): the error message quotes it."""
    with trio.move_on_after(_STDERR_DRAIN):
        await facts.stderr_done.wait()
    facts.set_exit(returncode)


async def _wait_exit(process: trio.Process, facts: _ProcessFacts, bound: float) -> None:
    """Reap the server (within ``bound``) and record its exit."""
    with trio.move_on_after(bound):
        await process.wait()
    if process.returncode is not None:
        await _settle_exit(facts, process.returncode)


async def _reap(process: trio.Process, facts: _ProcessFacts, grace: float) -> None:
    await _settle_exit(facts, await process.wait())
    # A server that exited by itself may leave children in its group: they go too.
    await terminate_group(process.pid, grace)


async def _stop_process(process: trio.Process, facts: _ProcessFacts, grace: float) -> None:
    """The MCP stdio shutdown: close stdin; once the server exited (or after ``grace``), end its group."""
    facts.stopping = True
    if process.stdin is not None:
        await trio.aclose_forcefully(process.stdin)
    with trio.move_on_after(grace if facts.ready else 0):
        await process.wait()
    # The server (if it ignored the end of its input) and what it started: SIGTERM, SIGKILL after grace.
    await terminate_group(process.pid, grace)
    await _wait_exit(process, facts, REAP_BOUND)


class CannotRunError(McpError):
    """The server's command could not be run at all (not found, not executable, a missing ``cwd``).

    Waiting does not change that, unlike a server that exits or is slow: a start
    of several servers stops waiting for the others (``connect_mcp_servers``).
    """


@asynccontextmanager
async def _open_stdio(config: McpStdioServer, facts: _ProcessFacts) -> AsyncIterator[tuple[Any, Any]]:
    """Start the server process (its own session and group) and bridge its pipes to the session."""
    import anyio
    from mcp.client.stdio import get_default_environment
    from mcp.shared.message import SessionMessage

    try:  # the lifeline kills the server's group if the harness process dies (trio_harness/_lifeline.py)
        line = lifeline()
    except OSError as exc:
        raise McpError(f"cannot start the lifeline watchdog for {config.command!r}: {exc}") from exc
    try:
        process = await trio.lowlevel.open_process(
            [config.command, *config.args],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            cwd=config.cwd,
            env=line.env((config.env_policy or EnvPolicy()).apply(get_default_environment()) | dict(config.env)),
            start_new_session=True,
        )
    except OSError as exc:
        where = f" in {config.cwd!r}" if config.cwd is not None else ""
        raise CannotRunError(f"cannot run {config.command!r}{where}: {exc.strerror or exc}") from exc
    line.register(process.pid)
    facts.pid = process.pid
    assert process.stdin is not None and process.stdout is not None and process.stderr is not None
    read_writer, read_stream = anyio.create_memory_object_stream[SessionMessage | Exception](0)
    write_stream, write_reader = anyio.create_memory_object_stream[SessionMessage](0)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(_pump_stdout, process.stdout, read_writer)
            nursery.start_soon(_pump_stdin, process.stdin, write_reader, read_writer)
            nursery.start_soon(_pump_stderr, process.stderr, facts, config.name)
            nursery.start_soon(_reap, process, facts, config.grace_period)
            try:
                yield read_stream, write_stream
            finally:
                with trio.CancelScope(shield=True):
                    await _stop_process(process, facts, config.grace_period)
                facts.stderr_scope.cancel()
                nursery.cancel_scope.cancel()
    finally:
        with trio.CancelScope(shield=True):
            facts.stopping = True
            facts.stderr_scope.cancel()
            if process.returncode is None:  # not stopped above (the spawn's nursery failed)
                signal_group(process.pid, signal.SIGKILL)
                await _wait_exit(process, facts, REAP_BOUND)
            for stream in (read_writer, read_stream, write_stream, write_reader):
                stream.close()
            for pipe in (process.stdin, process.stdout, process.stderr):
                await trio.aclose_forcefully(pipe)
            forget_group(process.pid)


@asynccontextmanager
async def _open_http(config: McpHttpServer, facts: _HttpFacts) -> AsyncIterator[tuple[Any, Any]]:
    """A streamable HTTP client with the configured headers; error statuses are kept for messages."""
    import httpx2
    from mcp.client.streamable_http import streamable_http_client

    async def note_status(response: httpx2.Response) -> None:
        method, status = response.request.method, response.status_code
        if method == "GET" and status == 405:
            return  # the optional stream of server messages, refused as the protocol allows: nobody's fault
        if status == 404 and "mcp-session-id" in response.request.headers:
            facts.session_gone = True  # the server no longer knows the session (it was restarted)
        if status >= 400:
            facts.last_error = f"HTTP {status} {response.reason_phrase} from {redact_urls(str(response.request.url))}"
        elif method == "POST":
            facts.last_error = None  # answered: an earlier error status no longer explains anything

    # The SDK's defaults: 30 s to connect or write, 300 s between bytes of a held stream.
    client = httpx2.AsyncClient(
        headers=dict(config.headers),
        timeout=httpx2.Timeout(30.0, read=300.0),
        event_hooks={"response": [note_status]},
    )
    async with client, streamable_http_client(config.url, http_client=client) as (read_stream, write_stream):
        yield read_stream, write_stream
