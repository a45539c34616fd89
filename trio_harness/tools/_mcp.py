"""MCP servers as tool sources: a connection owned by a scope, its tools in a tool set.

:func:`connect_mcp` opens a child scope of the scope it is given (the
harness's ``mcp`` scope, an agent's scope, an ACP session's agent scope),
starts the server there (a child process in its own process group, or a
streamable HTTP client), runs the MCP handshake with the official SDK's
:class:`~mcp.client.session.ClientSession`, and registers every tool of the
server into a :class:`~trio_harness.agents.ToolSet` as ``mcp__<server>__<tool>``
with the server's JSON schema.  The scope owns all of it:

* closing the scope first ends the calls still in flight (each sends the MCP
  ``notifications/cancelled``), removes the tools, closes the client session,
  then stops the server: stdin closed, SIGTERM to its process group after the
  grace period, SIGKILL after another (docs/mcp.rst, "Lifetime");
* ``notifications/tools/list_changed`` refreshes the registered tools; it is
  noticed on the receive path, in wire order, so a call whose answer follows
  the notification returns only once the new tools are registered;
* a call ends within the server's ``call_timeout``, its writes included
  (the session writes into a queue that never blocks, see ``_Outbox``),
  at once when its turn is cancelled (the SDK sends
  ``notifications/cancelled``), or when the server goes away; every failure
  is an error result naming the server and fails that call only
  (docs/mcp.rst, "Results and failures");
* a server that stopped is started again by the next call (one run of it is
  a :class:`_Link`), with a backoff and a bounded number of attempts per
  window (docs/mcp.rst, "Restarts");
* a tool declaration the SDK would refuse is taken out of the listing on the
  read path, so the other tools are offered.

This module is the connection: the session, the tool list, bounded calls
and restarts.  Beside it: :mod:`._mcp_transport` starts and stops the server
(the stdio process and its group, or the HTTP client), :mod:`._mcp_link`
holds one run of it and the streams its client session is given (``_Outbox``,
``_WatchedStream``), :mod:`._mcp_tools` names the tools and renders their
results, and :mod:`._mcp_config` is the configuration.
"""

from __future__ import annotations

import logging
import math
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import McpConfigError, McpError, McpStartError, ToolError
from .._redact import redact_urls
from .._util import describe
from .._util import split_cancelled as _split_cancelled
from .._version import __version__
from ..agents._tools import Tool, ToolContext, ToolOutput, ToolSet
from ._mcp_config import McpHttpServer, McpServerConfig, McpStdioServer
from ._mcp_link import _Link, _WatchedStream
from ._mcp_tools import _dangling_ref, _model_names, render_mcp_result
from ._mcp_transport import CannotRunError, _HttpFacts, _open_http, _open_stdio, _ProcessFacts

if TYPE_CHECKING:
    from mcp.client.session import ClientSession, IncomingMessage
    from mcp.shared.exceptions import MCPError
    from mcp.types import LoggingMessageNotificationParams
    from mcp.types import Tool as McpTool

    from .._bus import EventBus, Notice
    from .._scope import Scope

# The MCP SDK (and anyio, httpx2 and starlette with it) is imported when a
# server is connected, not with the package: it would double the import time
# of ``import trio_harness`` for programs that use no MCP server.


log = logging.getLogger("trio_harness.mcp")

# How long a call that saw the connection close waits to learn the exit status.
_EXIT_WAIT = 2.0
# Bound on the polite end of an HTTP session (its DELETE) before it is abandoned.
_HTTP_STOP_BOUND = 5.0
# How long a stopping session waits for its last messages (the cancels of its calls) to be written.
_DRAIN_BOUND = 1.0
# The wait after a failed restart, doubled after each further failure, up to the maximum.
_RESTART_BACKOFF = 1.0
_RESTART_BACKOFF_MAX = 60.0


def _describe(exc: BaseException) -> str:
    """``Type: message`` of an error, through exception groups, on one line (URLs redacted)."""
    return describe(exc, leaf=_describe_leaf)


def _describe_leaf(exc: BaseException) -> str:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        return exc.message
    text = redact_urls(" ".join(str(exc).split()))
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


# ---------------------------------------------------------------- the connection


@attrs.define(eq=False, repr=False)
class McpConnection:
    """A live connection to one MCP server, owned by its own scope.

    Obtain one from :func:`connect_mcp`.  Its scope is a child of the scope
    given there; closing either (or :meth:`close`) ends the connection: calls
    in flight are cancelled over MCP, the tools leave the tool set, the client
    session closes and the server stops.  A server that stops by itself (a
    crash, a lost HTTP connection) is started again by the next call, within
    the limits of its ``max_restarts`` and ``restart_window``.

    Attributes:
        config: the server's configuration.
        scope: the connection's own scope.
    """

    config: McpServerConfig
    scope: Scope
    _tools: ToolSet
    _bus: EventBus | None = attrs.field(default=None, alias="bus")
    # The current run of the server (None before the first start).
    _link: _Link | None = attrs.field(default=None, init=False)
    _links: int = attrs.field(default=0, init=False)
    # Model-facing name -> (server tool name, registered tool, its remover).
    _registered: dict[str, tuple[str, Tool, Callable[[], None]]] = attrs.field(factory=dict, init=False)
    _skipped: dict[str, str] = attrs.field(factory=dict, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _calls: set[trio.CancelScope] = attrs.field(factory=set, init=False)
    _calls_done: trio.Event = attrs.field(factory=trio.Event, init=False)
    _refresh_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    # list_changed notifications seen / refreshes finished (counted, so a call can wait for its own).
    _changes_seen: int = attrs.field(default=0, init=False)
    _changes_applied: int = attrs.field(default=0, init=False)
    _change_signal: trio.Event = attrs.field(factory=trio.Event, init=False)
    _applied_signal: trio.Event = attrs.field(factory=trio.Event, init=False)
    _refresh_failure: str | None = attrs.field(default=None, init=False)
    # Restarts: one at a time; the times of the attempts within the window; the backoff after failures.
    _restart_lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _attempts: deque[float] = attrs.field(factory=deque, init=False)
    _failed_attempts: int = attrs.field(default=0, init=False)
    _next_attempt: float = attrs.field(default=-math.inf, init=False)
    _last_restart_error: str | None = attrs.field(default=None, init=False)
    _restarts: int = attrs.field(default=0, init=False)

    def __repr__(self) -> str:
        state = "failed" if self.failure else "closing" if self._closing else "open"
        return f"<McpConnection {self.name!r} {self.config.transport} {state} tools={len(self._registered)}>"

    # ------------------------------------------------------------ state

    @property
    def id(self) -> str:
        """The server's name: the subject id of the connection's bus notices (``mcp/*``)."""
        return self.config.name

    @property
    def name(self) -> str:
        """The server's name (from its configuration)."""
        return self.config.name

    @property
    def tool_names(self) -> dict[str, str]:
        """The registered tools: model-facing name -> the server's name for it."""
        return {name: entry[0] for name, entry in self._registered.items()}

    @property
    def skipped_tools(self) -> dict[str, str]:
        """Tools of the last listing that are not offered: the tool's name (``#N`` without one) -> why."""
        return dict(self._skipped)

    @property
    def failure(self) -> str | None:
        """Why the server is not available now (it exited, the connection failed), or None.

        The next call starts it again (see :attr:`restarts`) unless its
        ``max_restarts`` within ``restart_window`` are spent.
        """
        return self._link.failure if self._link is not None else None

    @property
    def restarts(self) -> int:
        """How many times the server was started again after it had stopped."""
        return self._restarts

    @property
    def refresh_failure(self) -> str | None:
        """Why the last refresh of the tool list failed (the previous tools stay), or None."""
        return self._refresh_failure

    @property
    def pid(self) -> int | None:
        """The server process's id (a stdio server; it leads its own process group), else None."""
        facts = self._link.process if self._link is not None else None
        return facts.pid if facts is not None else None

    @property
    def returncode(self) -> int | None:
        """The server process's exit status once it exited (negative: the signal), else None."""
        facts = self._link.process if self._link is not None else None
        return facts.returncode if facts is not None else None

    @property
    def instructions(self) -> str | None:
        """The server's ``instructions`` from the handshake, if it gave any."""
        session = self._link.session if self._link is not None else None
        return session.instructions if session is not None else None

    # ------------------------------------------------------------ opening

    def _new_link(self) -> _Link:
        self._links += 1
        link = _Link(self._links)
        if isinstance(self.config, McpStdioServer):
            link.process = _ProcessFacts(on_exit=lambda: self._on_process_exit(link))
        else:
            link.http = _HttpFacts()
        return link

    def _transport(self, link: _Link) -> AbstractAsyncContextManager[tuple[Any, Any]]:
        config = self.config
        if isinstance(config, McpStdioServer):
            assert link.process is not None
            return _open_stdio(config, link.process)
        assert link.http is not None
        return _open_http(config, link.http)

    async def _hold(self, link: _Link, task_status: trio.TaskStatus[ClientSession]) -> None:
        """Own one run's transport and client session until the link is stopped."""
        from mcp.client.session import ClientSession
        from mcp.types import Implementation

        started = False
        try:
            async with self._transport(link) as (read_stream, write_stream), trio.open_nursery() as pumps:
                pumps.start_soon(link.outbox.pump, write_stream)
                session = ClientSession(
                    _WatchedStream(read_stream, link, self._on_list_changed),
                    link.outbox,
                    message_handler=self._on_message,
                    logging_callback=self._on_log,
                    client_info=Implementation(name="trio-harness", version=__version__),
                )
                async with session:
                    started = True
                    link.session = session
                    task_status.started(session)
                    await link.stop.wait()
                # What the last calls wrote (their cancels) reaches the server before it is stopped.
                with trio.move_on_after(_DRAIN_BOUND):
                    await link.outbox.done.wait()
                pumps.cancel_scope.cancel()
        except BaseException as exc:
            if not started:
                raise
            # The transport failed under a live session (a dropped HTTP connection):
            # calls end with this reason; nothing escapes into the owner's scope.
            cancelled, failed = _split_cancelled(exc)
            if failed is not None:
                log.warning("MCP server %r: the connection failed: %s", self.name, _describe(failed))
                self._lose(link, f"the connection failed: {_describe(failed)}")
            if cancelled is not None:
                raise cancelled from None
        finally:
            link.read_ended = True
            link.held.set()

    async def _start(self, link: _Link) -> list[McpTool]:
        """Start one run: the transport, the handshake, the tool listing (bounded by ``startup_timeout``).

        On any failure what was started is stopped again before the error propagates.
        """
        try:
            with trio.fail_after(self.config.startup_timeout):
                session = await self.scope.start(self._hold, link, name=f"mcp server {self.name}")
                await session.initialize()
                listing = await self._list_tools(link, session)
        except BaseException:
            with trio.CancelScope(shield=True):
                await self._stop_link(link)
            raise
        link.ready = True
        if link.process is not None:  # from now on a stop asks it to exit first (stdin closed, then the grace)
            link.process.ready = True
        return listing

    async def _stop_link(self, link: _Link) -> None:
        link.stop.set()
        bound = _HTTP_STOP_BOUND if link.http is not None else math.inf
        with trio.move_on_after(bound):
            await link.held.wait()

    async def _open(self) -> None:
        """Start the server, shake hands and register its tools (bounded by ``startup_timeout``)."""
        link = self._link = self._new_link()
        listing = await self._start(link)
        self.scope.add_exit_callback(self._unregister)  # whatever happens next, the tools go with the scope
        self._apply(listing, strict=True)
        self.scope.add_close_hook(self._on_close)
        self.scope.spawn(self._refresher, name=f"mcp refresher {self.name}")

    def _start_reason(self, exc: BaseException, link: _Link) -> str:
        """Why one run did not start, on one line."""
        config = self.config
        if isinstance(exc, trio.TooSlowError):
            reason = f"it did not complete the MCP handshake and list its tools within {config.startup_timeout:g} s"
        elif isinstance(exc, McpError):
            reason = str(exc)
        elif link.failure is not None:  # the process exited, the transport failed: more than "connection closed"
            reason = link.failure
        elif link.process is not None and link.process.exited.is_set():  # exited while being stopped
            reason = f"the server process exited ({link.process.summary()})"
        else:
            reason = _describe(exc)
        facts = link.process
        if facts is not None and facts.pid is not None and facts.summary() not in reason:
            reason += f" ({facts.summary()})"
        if link.http is not None and link.http.last_error is not None and link.http.last_error not in reason:
            reason += f" ({link.http.last_error})"
        return redact_urls(reason)

    def _start_error(self, exc: BaseException) -> str:
        """Why the server did not start, for :class:`~trio_harness.McpStartError`."""
        config = self.config
        assert self._link is not None
        what = f"{config.command!r}" if isinstance(config, McpStdioServer) else config.url
        return redact_urls(f"MCP server {self.name!r} ({what}) failed to start: {self._start_reason(exc, self._link)}")

    async def _list_tools(self, link: _Link, session: ClientSession) -> list[McpTool]:
        from mcp.types import PaginatedRequestParams

        tools: list[McpTool] = []
        link.skipped.clear()
        cursor: str | None = None
        while True:
            params = PaginatedRequestParams(cursor=cursor) if cursor is not None else None
            result = await session.list_tools(params=params)
            tools.extend(result.tools)
            cursor = result.next_cursor
            if not cursor:
                break
        self._note_skipped(link.skipped)
        return tools

    def _note_skipped(self, skipped: Sequence[tuple[str, str]]) -> None:
        """Tell of the tools a listing left out (each once while it stays malformed)."""
        current = dict(skipped)
        for label, reason in current.items():
            if self._skipped.get(label) != reason:
                log.warning("MCP server %r: the tool %r is not offered: %s", self.name, label, reason)
                self._emit("mcp/tool-skipped", tool=label, reason=reason)
        self._skipped = current

    def _emit(self, name: str, **data: Any) -> None:
        if self._bus is not None:
            self._bus.emit(name, self, **data)

    # ------------------------------------------------------------ tools

    def _tool(self, model_name: str, listed: McpTool) -> Tool:
        server_name = listed.name
        parameters: dict[str, Any] = dict(listed.input_schema or {})
        parameters.setdefault("type", "object")
        description = listed.description or listed.title or f"The {server_name!r} tool of MCP server {self.name!r}."
        annotations = listed.annotations
        read_only = bool(annotations is not None and annotations.read_only_hint)

        async def handler(ctx: ToolContext, args: dict[str, Any]) -> ToolOutput:
            return await self.call(server_name, args)

        def make(schema: Mapping[str, Any]) -> Tool:
            return Tool(
                name=model_name,
                description=description,
                parameters=schema,
                handler=handler,
                parallel_safe=read_only,
                requires_approval=self.config.requires_approval,
            )

        try:
            dangling = _dangling_ref(parameters)
            if dangling is not None:
                raise ToolError(dangling)
            return make(parameters)
        except ToolError as exc:
            # The model still gets the tool; the server checks the arguments itself.
            log.warning(
                "MCP server %r: tool %r has an unusable input schema (%s); offering it with any arguments",
                self.name,
                server_name,
                exc,
            )
            return make({"type": "object"})

    def _apply(self, listing: Sequence[McpTool], *, strict: bool) -> None:
        """Replace the registered tools with ``listing`` (no checkpoint: no step sees half of it)."""
        unique: dict[str, McpTool] = {}
        for listed in listing:
            if listed.name in unique:
                log.warning("MCP server %r lists the tool %r twice; the first is used", self.name, listed.name)
                continue
            unique[listed.name] = listed
        names = _model_names(self.name, list(unique))
        for _, _, remove in self._registered.values():
            remove()
        self._registered.clear()
        clashes: list[str] = []
        for model_name, server_name in names.items():
            tool = self._tool(model_name, unique[server_name])
            try:
                remove = self._tools.add(tool)
            except ToolError:
                clashes.append(model_name)
                continue
            self._registered[model_name] = (server_name, tool, remove)
        if clashes:
            message = (
                f"MCP server {self.name!r}: the tool name{'s' if len(clashes) > 1 else ''} "
                f"{', '.join(map(repr, clashes))} {'are' if len(clashes) > 1 else 'is'} already registered "
                "(another server with a similar name, or another tool); give the server another name"
            )
            if strict:
                raise McpError(message)
            log.warning("%s; those tools are not offered", message)

    def _unregister(self) -> None:
        for _, _, remove in self._registered.values():
            remove()
        self._registered.clear()

    async def refresh(self) -> None:
        """List the server's tools again and register what changed (also on ``list_changed``).

        Raises:
            McpError: the server did not answer the listing within its
                ``startup_timeout``, refused it, or is not available (it
                stopped; the next call starts it again); the previous tools stay.
        """
        link = self._link
        if link is None or link.session is None or self._closing:
            return
        if link.failure is not None:
            raise McpError(f"MCP server {self.name!r} is not available: {link.failure}")
        async with self._refresh_lock:
            try:
                with trio.fail_after(self.config.startup_timeout):
                    listing = await self._list_tools(link, link.session)
            except trio.TooSlowError:
                raise McpError(
                    f"MCP server {self.name!r} did not list its tools within {self.config.startup_timeout:g} s"
                ) from None
            except Exception as exc:
                raise McpError(f"MCP server {self.name!r} could not list its tools: {_describe(exc)}") from exc
            if not self._closing:
                self._apply(listing, strict=False)

    def _on_list_changed(self) -> None:
        self._changes_seen += 1
        self._change_signal.set()

    async def _refresher(self) -> None:
        while True:
            while self._changes_applied >= self._changes_seen:
                signal_ = self._change_signal
                await signal_.wait()
                if self._change_signal is signal_:
                    self._change_signal = trio.Event()
            target = self._changes_seen
            try:
                await self.refresh()
            except McpError as exc:
                self._refresh_failure = str(exc)
                log.warning("%s; the previous tools stay", exc)
            else:
                self._refresh_failure = None
            self._changes_applied = target
            applied, self._applied_signal = self._applied_signal, trio.Event()
            applied.set()

    async def _await_refresh(self) -> None:
        """Wait (bounded) until every list_changed seen so far is applied."""
        target = self._changes_seen
        with trio.move_on_after(self.config.startup_timeout):
            while self._changes_applied < target and not self._closing:
                await self._applied_signal.wait()

    # ------------------------------------------------------------ restarts

    def _unavailable(self, reason: str, detail: str) -> ToolOutput:
        return ToolOutput(f"error: MCP server {self.name!r} is not available: {reason}; {detail}", is_error=True)

    async def _revive(self) -> _Link | ToolOutput:
        """Start the server again after it stopped (one attempt, if the limits allow); the new link or why not."""
        config = self.config
        verb = "restart" if isinstance(config, McpStdioServer) else "reconnect"
        async with self._restart_lock:
            old = self._link
            assert old is not None
            if old.failure is None or self._closing:
                return old  # another call started it again meanwhile (or the connection is closing)
            reason = old.failure
            if config.max_restarts == 0:
                return self._unavailable(reason, f"it is not {verb}ed (max_restarts is 0)")
            now = trio.current_time()
            while self._attempts and self._attempts[0] <= now - config.restart_window:
                self._attempts.popleft()
            if len(self._attempts) >= config.max_restarts:
                count = len(self._attempts)
                wait = self._attempts[0] + config.restart_window - now
                return self._unavailable(
                    reason,
                    f"{count} attempt{'s' if count != 1 else ''} to {verb} it within the last "
                    f"{config.restart_window:g} s (max_restarts); the next attempt is in {_seconds(wait)}",
                )
            if now < self._next_attempt:
                return self._unavailable(
                    reason,
                    f"{verb}ing it failed: {self._last_restart_error}; "
                    f"the next attempt is in {_seconds(self._next_attempt - now)}",
                )
            self._attempts.append(now)
            await self._stop_link(old)  # what is left of the last run goes (its process group, its client)
            link = self._new_link()
            try:
                listing = await self._start(link)
            except Exception as exc:
                error = self._start_reason(exc, link)
                self._failed_attempts += 1
                delay = min(_RESTART_BACKOFF * 2 ** (self._failed_attempts - 1), _RESTART_BACKOFF_MAX)
                self._next_attempt = trio.current_time() + delay
                self._last_restart_error = error
                log.warning("MCP server %r: %sing it failed: %s; next attempt in %g s", self.name, verb, error, delay)
                self._emit("mcp/restart-failed", transport=config.transport, reason=reason, error=error, retry_in=delay)
                return self._unavailable(reason, f"{verb}ing it failed: {error}; the next attempt is in {delay:g} s")
            self._failed_attempts = 0
            self._next_attempt = -math.inf
            self._link = link
            self._restarts += 1
            self._apply(listing, strict=False)
            log.warning("MCP server %r was %sed (it had stopped: %s)", self.name, verb, reason)
            self._emit("mcp/restarted", transport=config.transport, reason=reason, restarts=self._restarts)
            return link

    # ------------------------------------------------------------ calls

    async def call(self, tool: str, arguments: Mapping[str, Any]) -> ToolOutput:
        """Call ``tool`` (the server's name for it) and map the answer (docs/mcp.rst, "Results and failures").

        Never raises for the server's failures: a timeout, a crash, a refused
        call or a closed connection is an error result naming the server.  A
        server that stopped is started again first (bounded by its
        ``startup_timeout``, within its restart limits).  The call itself,
        its writes included, is bounded by ``call_timeout``.  A cancellation
        of the caller propagates at once (the cancel is sent over MCP).
        """
        if self._closing or self._link is None:
            text = f"error: MCP server {self.name!r} is not available: its connection is closed"
            return ToolOutput(text, is_error=True)
        with trio.CancelScope() as call_scope:
            self._calls.add(call_scope)
            try:
                return await self._call(tool, arguments)
            finally:
                self._calls.discard(call_scope)
                if not self._calls:
                    done, self._calls_done = self._calls_done, trio.Event()
                    done.set()
        return ToolOutput(
            f"error: MCP server {self.name!r} was disconnected during the call to {tool!r}; "
            "the call was cancelled over MCP",
            is_error=True,
        )

    async def _call(self, tool: str, arguments: Mapping[str, Any]) -> ToolOutput:
        from mcp.shared.exceptions import MCPError

        link = self._link
        assert link is not None
        if link.read_ended and link.failure is None:
            await self._loss_reason(link)
        if link.failure is not None:
            revived = await self._revive()
            if isinstance(revived, ToolOutput):
                return revived
            link = revived
        session = link.session
        assert session is not None
        # Our own clock for the whole call: the SDK's starts only once the request is written.
        refused: MCPError | None = None
        with trio.move_on_after(self.config.call_timeout) as deadline:
            try:
                result = await session.call_tool(tool, dict(arguments))
            except MCPError as exc:
                refused = exc
            except Exception as exc:
                log.debug("MCP server %r: calling %r failed", self.name, tool, exc_info=True)
                return ToolOutput(
                    f"error: MCP server {self.name!r} gave an unusable answer to {tool!r}: {_describe(exc)}",
                    is_error=True,
                )
        if refused is not None:
            return await self._call_error(link, tool, refused)
        if deadline.cancelled_caught:
            return self._timeout_error(tool)
        await self._await_refresh()
        return render_mcp_result(result)

    def _timeout_error(self, tool: str) -> ToolOutput:
        return ToolOutput(
            f"error: MCP server {self.name!r} did not answer the call to {tool!r} within "
            f"{self.config.call_timeout:g} s; the call was cancelled (the server may be hung)",
            is_error=True,
        )

    async def _call_error(self, link: _Link, tool: str, exc: MCPError) -> ToolOutput:
        from mcp.types import CONNECTION_CLOSED, REQUEST_TIMEOUT

        if exc.code == REQUEST_TIMEOUT:
            return self._timeout_error(tool)
        if exc.code == CONNECTION_CLOSED and not (link.read_ended or link.failure is not None):
            # One request's stream ended without its answer (HTTP); the session goes on.
            text = (
                f"error: MCP server {self.name!r} did not answer the call to {tool!r}: {exc.message} "
                "(the call may or may not have run)"
            )
        elif exc.code == CONNECTION_CLOSED:
            reason = await self._loss_reason(link)
            text = f"error: MCP server {self.name!r} stopped during the call to {tool!r}: {reason}"
        elif link.http is not None and link.http.session_gone:
            # HTTP 404 for our session id: the server no longer knows the session (it was restarted).
            self._lose(link, f"the server no longer knows the session ({exc.message}, HTTP 404)")
            text = f"error: MCP server {self.name!r} stopped during the call to {tool!r}: {link.failure}"
        else:
            text = f"error: MCP server {self.name!r} refused the call to {tool!r}: {exc.message} (code {exc.code})"
        return ToolOutput(text, is_error=True)

    async def _loss_reason(self, link: _Link) -> str:
        """Why the connection closed under a call; learns the exit status (bounded) first."""
        facts = link.process
        if link.failure is None:
            # The process's exit, or the transport's own error (a refused HTTP
            # connection), usually follows the closed connection by a moment.
            with trio.move_on_after(_EXIT_WAIT):
                await (facts.exited if facts is not None else link.held).wait()
        if link.failure is None:
            detail = f" ({link.http.last_error})" if link.http is not None and link.http.last_error else ""
            self._lose(link, f"the connection closed{detail}")
        return link.failure or "its connection is closed"

    def _on_process_exit(self, link: _Link) -> None:
        assert link.process is not None
        self._lose(link, f"the server process exited ({link.process.summary()})")
        if link.ready and link.failure is not None:  # while starting, the start error says it
            log.warning("MCP server %r: %s", self.name, link.failure)

    def _lose(self, link: _Link, reason: str) -> None:
        if link.failure is None and not self._closing:
            link.failure = reason

    # ------------------------------------------------------------ notifications

    async def _on_message(self, message: IncomingMessage) -> None:
        if isinstance(message, Exception):
            log.warning("MCP server %r sent something unreadable: %s", self.name, _describe(message))

    async def _on_log(self, params: LoggingMessageNotificationParams) -> None:
        levels = {"debug": logging.DEBUG, "info": logging.INFO, "notice": logging.INFO, "warning": logging.WARNING}
        log.log(levels.get(params.level, logging.ERROR), "MCP server %r: %s", self.name, params.data)

    # ------------------------------------------------------------ closing

    async def _on_close(self) -> None:
        """Close hook: end the calls in flight (over MCP), remove the tools, stop the server."""
        self._closing = True
        self._unregister()
        for call_scope in list(self._calls):
            call_scope.cancel()
        while self._calls:
            await self._calls_done.wait()
        if self._link is not None:
            await self._stop_link(self._link)

    async def close(self) -> None:
        """Close the connection (its scope) and wait until the server has stopped (idempotent)."""
        await self.scope.close()


def _seconds(delay: float) -> str:
    return f"{max(1, math.ceil(delay))} s"


# ---------------------------------------------------------------- connecting


async def connect_mcp(
    scope: Scope, tools: ToolSet, server: McpServerConfig, *, bus: EventBus | None = None
) -> McpConnection:
    """Start ``server`` in a child scope of ``scope`` and register its tools into ``tools``.

    Harness-wide servers are given to :func:`~trio_harness.open_harness`
    (``mcp_servers=``); for an agent's own servers call this from its
    ``setup``::

        async def setup(agent):
            await connect_mcp(agent.scope, agent.tools, McpStdioServer("files", "mcp-files"))

        await harness.agents.create(setup=setup)

    Args:
        bus: where the connection's notices go (``mcp/restarted``,
            ``mcp/restart-failed``, ``mcp/tool-skipped``; the harness passes
            its own for the servers given to it); None: only the log hears of them.

    Returns:
        The connection; it lives until ``scope`` (or the connection) closes.

    Raises:
        McpStartError: the server could not be started, did not answer the
            handshake or its tool listing within ``startup_timeout``, or a
            tool name is already taken; the message names the server and why
            (its exit status and last stderr lines for a process).  Nothing
            is left running.
        ScopeClosedError: ``scope`` is closing.
    """
    if not isinstance(server, McpStdioServer | McpHttpServer):
        raise TypeError(f"server must be an McpStdioServer or McpHttpServer, got {type(server).__name__}")
    child = await scope.open_child(f"mcp:{server.name}")
    connection = McpConnection(server, child, tools, bus=bus)
    try:
        await connection._open()
    except BaseException as exc:
        with trio.CancelScope(shield=True):
            await child.close()
        if isinstance(exc, Exception):
            raise McpStartError(connection._start_error(exc), servers=(server.name,)) from exc
        raise
    return connection


async def connect_mcp_servers(
    scope: Scope, tools: ToolSet, servers: Sequence[McpServerConfig], *, bus: EventBus | None = None
) -> tuple[McpConnection, ...]:
    """Start several servers at once (see :func:`connect_mcp`); all of them or none.

    A server whose command cannot be run at all (not found, not executable, a
    missing ``cwd``) fails the start at once: the others are not waited for
    (they are stopped, and the message names them).  Otherwise every server
    is waited for, so the error names all that failed.

    Raises:
        McpConfigError: two servers have the same name.
        McpStartError: naming every server that failed; the others were
            stopped again.
    """
    seen: set[str] = set()
    for server in servers:
        if server.name in seen:
            raise McpConfigError(f"MCP server {server.name!r} is configured twice", server=server.name, field="name")
        seen.add(server.name)
    results: list[McpConnection | McpStartError | None] = [None] * len(servers)
    waiting = trio.CancelScope()

    async def connect_one(index: int) -> None:
        try:
            results[index] = await connect_mcp(scope, tools, servers[index], bus=bus)
        except McpStartError as exc:
            results[index] = exc
            if isinstance(exc.__cause__, CannotRunError):
                # A command that cannot be run fails the start whatever the others do: they are not waited for.
                waiting.cancel()

    try:
        with waiting:
            async with trio.open_nursery() as nursery:
                for index in range(len(servers)):
                    nursery.start_soon(connect_one, index)
    except BaseException:  # cancelled: none of them stays
        with trio.CancelScope(shield=True):
            for result in results:
                if isinstance(result, McpConnection):
                    await result.close()
        raise
    failures = [result for result in results if isinstance(result, McpStartError)]
    connections = tuple(result for result in results if isinstance(result, McpConnection))
    if failures:
        with trio.CancelScope(shield=True):
            for connection in connections:
                await connection.close()
        message = "; ".join(str(failure) for failure in failures)
        if unstarted := [server.name for server, result in zip(servers, results, strict=True) if result is None]:
            message += f" (not waited for, and stopped: {', '.join(map(repr, unstarted))})"
        error = McpStartError(message, servers=tuple(name for failure in failures for name in failure.servers))
        raise error from failures[0]
    return connections


# ------------------------------------------------------------------ notice lines

MCP_NOTICES = ("mcp/restarted", "mcp/restart-failed", "mcp/tool-skipped")
"""The bus notices of a connection, each shown as one line (``run``) or logged (``acp``)."""


def mcp_skipped_line(server: str, tool: str, reason: str) -> str:
    """The line that says a server's tool is not offered, and why."""
    return f"[mcp] MCP server {server!r}: the tool {tool!r} is not offered: {reason}"


def mcp_notice_line(notice: Notice) -> str:
    """The line for an ``mcp/restarted``, ``mcp/restart-failed`` or ``mcp/tool-skipped`` notice."""
    if notice.name == "mcp/tool-skipped":
        return mcp_skipped_line(notice.subject.id, notice.data["tool"], notice.data["reason"])
    verb = "restarted" if notice.data.get("transport") == "stdio" else "reconnected"
    server = f"MCP server {notice.subject.id!r}"
    if notice.name == "mcp/restarted":
        return f"[mcp] {server} {verb}; it had stopped: {notice.data.get('reason')}"
    return (
        f"[mcp] {server} could not be {verb}: {notice.data.get('error')}; "
        f"next attempt in {notice.data.get('retry_in', 0):g} s"
    )
