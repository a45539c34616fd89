"""The Agent Client Protocol server: harness agents behind JSON-RPC on Trio streams.

One :class:`AcpServer` serves one client connection.  The bridge opens its
own scope (a child of the harness scope) and creates or resumes every agent
with ``owner=`` that scope, keeping each session's :class:`AgentHandle` in a
session record.  When the client disconnects (end of input) or the server is
cancelled, every session the bridge opened is disposed: its turn ends
``aborted`` with cause ``disposed``, its log is flushed, and neither the agent
nor the session stays registered (docs/guarantees.rst, "The ACP bridge").  A
``session/new`` racing the disconnect is rolled back by the registry (the owner
scope is closing) or disposed right after it returns.

Messages are read in order by one reader task.  ``session/prompt`` and
``session/cancel`` are admitted synchronously in that order, so a cancel that
follows a prompt always sees it, and lines that arrive in one read are all
dispatched before any other task runs (a prompt and its cancel sent together
cancel the prompt while it is still queued); the slower methods (new, load,
list, close) run as tasks.  Every outgoing message goes through one queue and one writer
task (holding one lock), so messages never interleave and each prompt's
updates precede its answer.  The queue is bounded where input enters
(:class:`~trio_harness.acp._jsonrpc.Outbox`): while ``outbox_limit`` messages
are queued or owed by running handlers, the reader reads nothing, so a client
that does not read its answers stops being read (docs/guarantees.rst, "The ACP
bridge").

Prompt mechanics: the prompt text is sent with ``agent.follow``, which finds
the turn that claims the message; that turn's events are streamed as
``session/update`` notifications, and the prompt is answered at its
``turn/end`` (after flushing the log) with the stop reason
``stop_reason_for`` maps it to.  A message removed from
the inbox by a cancel before any turn claimed it, or still queued when its
session is disposed, answers ``cancelled`` (same section).

Approval: unless ``ask_permission`` is off (``trio-harness acp --yes``), every
agent of the connection gets an approver that sends ``session/request_permission``
to the client (the tool call and the options allow once / allow always /
reject once / reject always) and waits for the choice; the request is one of
:class:`~trio_harness.acp._jsonrpc.OutgoingRequests`, whose responses the
reader routes back.  ``session/cancel``, ``session/close`` or a disconnect
during the request cancel the turn, which ends the wait at once
(docs/approval.rst).

The MCP servers a client lists in ``session/new`` or ``session/load`` are
started by the agent's ``setup``, in the agent's scope: their tools are that
session's alone and they stop when it is disposed; one that fails to start
fails the request with an error naming it (docs/mcp.rst, "ACP").
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final, TypeVar, TypeVarTuple

import attrs
import trio

from .._errors import (
    AgentDisposedError,
    AgentExistsError,
    HarnessError,
    ModelError,
    SessionNotFoundError,
    SessionStoreError,
)
from .._records import Failure
from .._telemetry import continue_trace
from ..agents._options import AgentOptions
from ..agents._turns import TurnOutcome
from ..model._protocol import ModelProvider
from ..session import _events as ev
from ..tools._mcp import MCP_NOTICES
from ..tools._mcp_config import with_env_policy
from ..tools._plan import plan_of
from . import _jsonrpc as rpc
from ._commands import parse_command
from ._config import (
    ModelChoice,
    parse_set_config,
)
from ._features import SessionFeatures
from ._fs import FS_TIMEOUT, ClientFs, bind_client_fs, client_fs
from ._modes import MODE_ASK, MODE_IDS
from ._params import (
    AuthenticateParams,
    CancelParams,
    CloseSessionParams,
    InitializeParams,
    ListSessionsParams,
    LoadSessionParams,
    NewSessionParams,
    PromptParams,
    SetSessionModeParams,
    decode_params,
    prompt_capabilities,
)
from ._plan import plan_update
from ._records import (
    _harness_error,
    _log_mcp_notice,
    _mcp_setup,
    _Prompt,
    _sandbox_meta,
    _SessionRecord,
    _warm_prices,
    list_sessions,
)
from ._streaming import SessionStreaming
from ._terminal import TerminalRunner
from ._updates import (
    StopReason,
    failure_update,
    live_update,
    replay_updates,
    session_title,
    shorten,
    stop_reason_for,
)

if TYPE_CHECKING:
    from .._harness import Harness
    from .._scope import Scope
    from ..agents._options import AgentOptions
    from ..agents._registry import AgentHandle
    from ..session._events import Event


log = logging.getLogger("trio_harness.acp")

PROTOCOL_VERSION: Final = 1
"""The ACP protocol version this server speaks."""

FLUSH_TIMEOUT: Final = 30.0
DRAIN_TIMEOUT: Final = 5.0
WRITE_TIMEOUT: Final = 120.0
"""The default bound on writing one message (``AcpServer.write_timeout``)."""
MAX_SESSIONS: Final = 100
"""The default cap on the sessions one connection has open (``AcpServer.max_sessions``)."""

_P = TypeVar("_P")
_Ts = TypeVarTuple("_Ts")
_Result = dict[str, Any] | None


# ---------------------------------------------------------------- server


@attrs.define(eq=False, repr=False)
class AcpServer(SessionFeatures, SessionStreaming):
    """An ACP agent server for one client connection.

    Use :meth:`serve` with a pair of Trio streams (or :func:`serve_stdio`).

    Attributes:
        harness: the harness whose agents serve the sessions.
        max_line_bytes: the longest incoming message line accepted; a longer
            one is refused with an error and discarded up to its newline.
        agent_options: options for every agent the server creates or resumes.
        auth_methods: ACP auth methods to advertise (each an object with at
            least ``id`` and ``name``).  Empty (the default): ``authenticate``
            is a no-op and nothing requires it.
        authenticator: decides an ``authenticate`` call for a method id
            (default: accept); only used when ``auth_methods`` is set.
        outbox_limit: how many outgoing messages may be queued (or owed by
            requests still being handled) before the server stops reading
            input until the client has read some (backpressure).  The updates
            of a turn already running are queued regardless, so a turn never
            waits for its client.
        ask_permission: give every agent of the connection an approver that
            asks the client (``session/request_permission``) before each call
            that requires approval (default on).  Off (``trio-harness acp
            --yes``), the approver of ``agent_options`` or of the harness
            applies, and with none such calls run without asking.  An
            approver set in ``agent_options`` wins either way.
        initial_mode: the session mode every session starts in (``ask`` or
            ``auto``, see ``trio_harness/acp/_modes.py``); modes are offered
            only while ``ask_permission`` is on and ``agent_options`` sets no
            approver (the modes switch the asking approver).
        models: the models a session may switch between (the ``model``
            config option, docs/acp.rst "Config options"); the first is the
            default.  Empty: the one model the sessions use.
        fs_timeout: how long (seconds) the file tools wait for the editor's
            answer to one ``fs/read_text_file`` or ``fs/write_text_file``
            before the call fails (docs/editors.rst).
        write_timeout: how long (seconds) writing one message may take: a
            client that reads none of it for that long is taken as gone, and
            the connection ends as after a disconnect (docs/acp.rst,
            "Backpressure").
        max_sessions: how many sessions the connection may have open at once
            (those being created or loaded count); one more ``session/new`` or
            ``session/load`` is refused with an error naming the cap until
            ``session/close`` closes one (docs/acp.rst, "Bounds").
    """

    harness: Harness
    max_line_bytes: int = rpc.DEFAULT_MAX_LINE_BYTES
    agent_options: AgentOptions | None = None
    auth_methods: Sequence[Mapping[str, Any]] = ()
    authenticator: Callable[[str], bool] | None = None
    outbox_limit: int = rpc.DEFAULT_OUTBOX_LIMIT
    ask_permission: bool = True
    initial_mode: str = MODE_ASK
    models: Sequence[ModelProvider] = ()
    fs_timeout: float = FS_TIMEOUT
    write_timeout: float = WRITE_TIMEOUT
    max_sessions: int = MAX_SESSIONS
    _records: dict[str, _SessionRecord] = attrs.field(factory=dict, init=False)
    _scope: Scope | None = attrs.field(default=None, init=False)
    _opening: int = attrs.field(default=0, init=False)  # session/new and session/load under way
    _outbox: rpc.Outbox | None = attrs.field(default=None, init=False)
    _handlers: trio.Nursery | None = attrs.field(default=None, init=False)
    _accepting: bool = attrs.field(default=False, init=False)
    _read_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    _served: bool = attrs.field(default=False, init=False)
    # Store failures of sessions disposed without a client request to answer (raised by serve).
    _unstored: list[SessionStoreError] = attrs.field(factory=list, init=False)
    _broken: bool = attrs.field(default=False, init=False)
    _authenticated: bool = attrs.field(default=False, init=False)
    # Requests sent to the client (session/request_permission), waiting for answers.
    _requests: rpc.OutgoingRequests = attrs.field(factory=rpc.OutgoingRequests, init=False)
    # The client's terminals run foreground bash when it advertises them (docs/acp.rst, "Terminals").
    _terminal: TerminalRunner | None = attrs.field(default=None, init=False)
    # The client's fs capabilities (initialize): the file tools' reads and writes go through it.
    _client_fs: ClientFs = attrs.field(factory=ClientFs, init=False)

    def __attrs_post_init__(self) -> None:
        if self.max_line_bytes <= 0:
            raise ValueError(f"max_line_bytes must be positive, got {self.max_line_bytes!r}")
        for name in ("outbox_limit", "max_sessions"):
            if not getattr(self, name) >= 1:
                raise ValueError(f"{name} must be at least 1, got {getattr(self, name)!r}")
        for name in ("fs_timeout", "write_timeout"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)!r}")
        if self.initial_mode not in MODE_IDS:
            raise ValueError(f"initial_mode must be one of {sorted(MODE_IDS)}, got {self.initial_mode!r}")

    def __repr__(self) -> str:
        return f"<AcpServer sessions={len(self._records)}{' closing' if self._closing else ''}>"

    @property
    def scope(self) -> Scope | None:
        """The bridge scope owning every agent of this connection (None before serving)."""
        return self._scope

    @property
    def queued_messages(self) -> int:
        """Outgoing messages waiting for the writer (0 before serving)."""
        return len(self._outbox) if self._outbox is not None else 0

    @property
    def session_ids(self) -> list[str]:
        """The ids of the sessions open on this connection."""
        return list(self._records)

    # ------------------------------------------------------------ connection

    async def serve(self, receive: trio.abc.ReceiveStream, send: trio.abc.SendStream) -> None:
        """Serve the connection until the client closes its side (end of input).

        On return (or cancellation) every session this connection opened has
        been disposed and flushed, and the bridge scope is closed.  The streams
        are not closed.

        Raises:
            RuntimeError: this server already served a connection.
        """
        if self._served:
            raise RuntimeError("an AcpServer serves one connection; create another for the next")
        self._served = True
        self._scope = await self.harness.scope.open_child("acp")
        # A streamed tool call turns in_progress when it starts running (docs/acp.rst).
        self._scope.add_exit_callback(self.harness.bus.on("agent/tool/started", self._tool_started))
        for name in MCP_NOTICES:  # an MCP server restarted or a tool left out: one line each in the log
            self._scope.add_exit_callback(self.harness.bus.on(name, _log_mcp_notice))
        outbox = self._outbox = rpc.Outbox(self.outbox_limit)
        writer_done = trio.Event()
        # The writer outlives a cancel of serve: what the teardown sends (the terminals'
        # kill and release) is written before it stops, within DRAIN_TIMEOUT.
        write_scope = trio.CancelScope(shield=True)
        reader = rpc.LineReader(receive, max_line_bytes=self.max_line_bytes)
        try:
            async with trio.open_nursery() as outer:
                outer.start_soon(self._write_loop, outbox, rpc.MessageWriter(send), writer_done, write_scope)
                # The price table (the cost of usage_update) loads while the client starts.
                outer.start_soon(_warm_prices)
                try:
                    async with trio.open_nursery() as handlers:
                        self._handlers = handlers
                        self._accepting = True
                        try:
                            with self._read_scope:
                                await self._read_loop(reader, outbox)
                        finally:
                            self._accepting = False
                            if self._terminal is not None:  # no answer can come now: stop waiting for one
                                self._terminal.answers_stopped()
                        handlers.cancel_scope.cancel()
                finally:
                    self._accepting = False
                    try:
                        with trio.CancelScope(shield=True):
                            await self._shutdown()
                            outbox.close()
                            with trio.move_on_after(DRAIN_TIMEOUT):
                                await writer_done.wait()
                    finally:
                        write_scope.cancel()
                        outer.cancel_scope.cancel()
        finally:
            self._accepting = False
            with trio.CancelScope(shield=True):
                await self._shutdown()
        if self._unstored:
            # Sessions disposed at disconnect whose last events were not stored.
            if len(self._unstored) == 1:
                raise self._unstored[0]
            raise SessionStoreError(
                f"{len(self._unstored)} sessions could not be stored: " + "; ".join(map(str, self._unstored))
            ) from self._unstored[0]

    async def _read_loop(self, reader: rpc.LineReader, outbox: rpc.Outbox) -> None:
        while True:
            # Backpressure: read nothing while the client has not read enough.
            await outbox.wait_for_space()
            line = await reader.receive_line()
            if line is None:
                log.debug("acp: end of input")
                return
            if line is rpc.OVERSIZED:
                self._oversized(rpc.read_head(reader.oversized_head))
                continue
            assert isinstance(line, bytes)
            if not line.strip():
                continue
            message = rpc.parse_message(line)
            try:
                self._dispatch(message)
            except Exception:  # never let one message take the connection down
                log.exception("acp: dispatching a message failed")
                if isinstance(message, rpc.Request):
                    self._post_error(message.id, rpc.RpcError(rpc.INTERNAL_ERROR, "internal error"))

    def _oversized(self, head: rpc.Head | None) -> None:
        """A discarded line: answer it under its id (when its start names one), or fail the request it answers."""
        limit = f"the message exceeds the {self.max_line_bytes}-byte line limit; discarded"
        if head is not None and head.kind == "response":
            # An answer to one of our requests: that request fails at once, naming the limit.
            message = f"the client's answer was not read: {limit}"
            answer = {"code": rpc.INVALID_REQUEST, "message": message, "data": {"reason": rpc.DISCARDED}}
            if not self._requests.resolve(rpc.Response(head.id, error=answer)):
                log.warning("acp: an answer to id %r was discarded (%s); no request waits for it", head.id, limit)
            return
        named = f" ({shorten(head.method, 100)})" if head is not None and head.method is not None else ""
        error = rpc.RpcError(rpc.INVALID_REQUEST, f"invalid request{named}: {limit}", {"limit": self.max_line_bytes})
        self._post_error(head.id if head is not None else None, error)

    async def _write_loop(
        self,
        outbox: rpc.Outbox,
        writer: rpc.MessageWriter,
        done: trio.Event,
        scope: trio.CancelScope,
    ) -> None:
        with scope:
            await self._write_messages(outbox, writer, done)

    async def _write_messages(self, outbox: rpc.Outbox, writer: rpc.MessageWriter, done: trio.Event) -> None:
        try:
            while (message := await outbox.get()) is not None:
                if self._broken:
                    continue
                try:
                    with trio.fail_after(self.write_timeout):
                        await writer.send(message)
                except (trio.BrokenResourceError, trio.ClosedResourceError, OSError, trio.TooSlowError) as exc:
                    timed_out = isinstance(exc, trio.TooSlowError)
                    reason = f"one message took over {self.write_timeout:g}s to write" if timed_out else repr(exc)
                    log.warning("acp: the client stopped reading (%s); disconnecting", reason)
                    self._broken = True
                    self._read_scope.cancel()
                except (TypeError, ValueError):  # a message that cannot be encoded is a bug
                    log.exception("acp: cannot encode an outgoing message")
                    if "id" in message and "method" not in message:  # still answer the request
                        error = rpc.RpcError(rpc.INTERNAL_ERROR, "internal error: the answer could not be encoded")
                        with contextlib.suppress(trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                            await writer.send(rpc.error_response(message["id"], error))
        finally:
            done.set()

    def _writing(self) -> bool:
        """Whether messages still reach the client (the outbox is open and the client reads)."""
        return not self._broken and self._outbox is not None and not self._outbox.closed

    def _post(self, message: dict[str, Any]) -> None:
        if self._outbox is None or not self._outbox.put(message):
            log.debug("acp: dropping a message after the connection closed")

    def _post_error(self, request_id: rpc.RequestId, error: rpc.RpcError) -> None:
        self._post(rpc.error_response(request_id, error))

    def _update(self, session_id: str, update: dict[str, Any]) -> None:
        if self._terminal is not None and "content" in update:
            update = self._terminal.decorate(session_id, update)
        self._post(rpc.notification("session/update", {"sessionId": session_id, "update": update}))

    def _spawn(self, fn: Callable[[*_Ts], Awaitable[object]], *args: *_Ts) -> bool:
        if not self._accepting or self._handlers is None:
            return False
        self._handlers.start_soon(fn, *args)
        return True

    def _spawn_request(self, request: rpc.Request, handler: Callable[[_P], Awaitable[_Result]], params: _P) -> None:
        """Run a request handler as a task; its answer takes a place in the outbox from now."""
        if not self._accepting or self._handlers is None or self._outbox is None:
            raise rpc.RpcError(rpc.INTERNAL_ERROR, "the server is shutting down")
        self._outbox.reserve()
        self._handlers.start_soon(self._run, request, handler, params)

    # ------------------------------------------------------------ dispatch

    def _dispatch(self, message: rpc.Message) -> None:
        if isinstance(message, rpc.Invalid):
            self._post_error(message.id, message.error)
        elif isinstance(message, rpc.Response):
            if not self._requests.resolve(message):
                # The wait already ended (a cancel), or the id is not ours.
                log.debug("acp: ignoring a response to id %r, which no request waits for", message.id)
        elif isinstance(message, rpc.Notification):
            if message.method == "session/cancel":
                try:
                    params = decode_params(CancelParams, message.params)
                except rpc.RpcError as error:  # a notification has nobody to answer
                    log.debug("acp: ignoring session/cancel: %s", error)
                else:
                    self._cancel(params)
            elif message.method == "$/cancel_request":
                self._cancel_request(message.params)
            else:
                log.debug("acp: ignoring notification %s", shorten(message.method, 100))
        else:
            self._on_request(message)

    def _on_request(self, request: rpc.Request) -> None:
        method = request.method
        params = request.params
        try:
            if method == "initialize":
                self._note_client(params)
                self._post(rpc.result_response(request.id, self._initialize(decode_params(InitializeParams, params))))
                self._client_fs = client_fs(params)  # the editor's files for the file tools (docs/editors.rst)
            elif method == "authenticate":
                answer = self._authenticate(decode_params(AuthenticateParams, params))
                self._post(rpc.result_response(request.id, answer))
            elif method == "session/prompt":
                self._start_prompt(request, decode_params(PromptParams, params))
            elif method == "session/cancel":  # sent as a request: an unknown session is an error
                cancel = decode_params(CancelParams, params)
                self._record(cancel.session_id)
                self._cancel(cancel)
                self._post(rpc.result_response(request.id, None))
            elif method == "session/set_mode":
                answer = self._set_mode(decode_params(SetSessionModeParams, params))
                self._post(rpc.result_response(request.id, answer))
            elif method == "session/set_config_option":
                self._post(rpc.result_response(request.id, self._set_config(*parse_set_config(params))))
            elif method == "session/close":
                record = self._take_for_close(decode_params(CloseSessionParams, params))
                self._spawn_request(request, self._close, record)
            elif method == "session/new":
                self._spawn_request(request, self._new, decode_params(NewSessionParams, params))
            elif method == "session/load":
                self._spawn_request(request, self._load, decode_params(LoadSessionParams, params))
            elif method == "session/list":
                self._spawn_request(request, self._list, decode_params(ListSessionsParams, params))
            else:
                raise rpc.RpcError(
                    rpc.METHOD_NOT_FOUND,
                    f"method not found: {shorten(method, 100)!r}",
                    {"method": shorten(method, 100)},
                )
        except rpc.RpcError as error:
            self._post_error(request.id, error)
        except HarnessError as exc:
            self._post_error(request.id, _harness_error(exc))

    async def _run(self, request: rpc.Request, handler: Callable[[_P], Awaitable[_Result]], params: _P) -> None:
        try:
            result = await handler(params)
        except rpc.RpcError as error:
            self._post_error(request.id, error)
        except HarnessError as exc:
            self._post_error(request.id, _harness_error(exc))
        except Exception as exc:
            log.exception("acp: %s failed", request.method)
            self._post_error(request.id, rpc.RpcError(rpc.INTERNAL_ERROR, f"internal error: {exc!r}"))
        else:
            self._post(rpc.result_response(request.id, result))
            if request.method == "session/new":  # the session exists for the client from its answer on
                self._announce(result, params)
        finally:
            if self._outbox is not None:
                self._outbox.release()

    def _check_auth(self) -> None:
        if self.auth_methods and not self._authenticated:
            ids = [str(method.get("id")) for method in self.auth_methods]
            described = [str(m["description"]) for m in self.auth_methods if isinstance(m.get("description"), str)]
            message = f"authentication required: call authenticate with methodId {' or '.join(map(repr, ids))} first"
            # ``details``: the human-readable part, the only one some clients (Toad) show.
            details = " ".join(described) if described else f"This agent requires authentication ({', '.join(ids)})."
            raise rpc.RpcError(
                rpc.AUTH_REQUIRED,
                message + (f" ({' '.join(described)})" if described else ""),
                {"authMethods": ids, "details": details},
            )

    def _record(self, session_id: str) -> _SessionRecord:
        record = self._records.get(session_id)
        if record is None or record.closing:
            raise rpc.RpcError(
                rpc.RESOURCE_NOT_FOUND,
                f"unknown session {shorten(session_id, 200)!r}: no such session is open "
                "on this connection (use session/new or session/load)",
                {"sessionId": session_id},
            )
        return record

    # ------------------------------------------------------------ methods

    def _initialize(self, params: InitializeParams) -> dict[str, Any]:
        # Whatever version the client speaks, the answer is the one this server speaks.
        from .._version import __version__

        return {
            "protocolVersion": PROTOCOL_VERSION,
            "agentCapabilities": {
                "loadSession": True,
                "promptCapabilities": prompt_capabilities(self.harness.model),
                "mcpCapabilities": {"http": True, "sse": False},
                "sessionCapabilities": {"list": {}, "close": {}},
            },
            "authMethods": [dict(method) for method in self.auth_methods],
            "agentInfo": {"name": "trio-harness", "title": "trio-harness", "version": __version__},
        }

    def _authenticate(self, params: AuthenticateParams) -> dict[str, Any]:
        method_id = params.method_id
        if not self.auth_methods:
            return {}
        known = [str(method.get("id")) for method in self.auth_methods]
        if method_id not in known:
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                f"invalid params for authenticate: unknown methodId {shorten(method_id, 100)!r}; known: {known}",
                {"field": "methodId"},
            )
        if self.authenticator is not None and not self.authenticator(method_id):
            failed = f"authentication with {method_id!r} failed"
            raise rpc.RpcError(rpc.AUTH_REQUIRED, failed, {"methodId": method_id, "details": f"A{failed[1:]}."})
        self._authenticated = True
        return {}

    async def _new(self, params: NewSessionParams) -> dict[str, Any]:
        self._check_auth()
        self._check_open()
        with self._session_slot("session/new"):
            return await self._new_session(params)

    async def _new_session(self, params: NewSessionParams) -> dict[str, Any]:
        if not await trio.to_thread.run_sync(os.path.isdir, params.cwd):
            # Every command and relative path of the session would fail there.
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                "invalid params for session/new: 'cwd' must be an existing directory, "
                f"got {shorten(params.cwd, 200)!r}",
                {"field": "cwd"},
            )
        options, choice = self._session_options()
        handle = await self.harness.agents.create(
            owner=self._scope,
            cwd=params.cwd,
            options=options,
            setup=_mcp_setup(with_env_policy(params.mcp_configs(), self.harness.bash.env_policy), self.harness.bus),
        )
        record = await self._adopt(handle, choice)
        return {
            "sessionId": record.id,
            **self._modes_of(record),
            "configOptions": self._config_options(record),
            **_sandbox_meta(self.harness, record.agent.session.header.cwd),
        }

    async def _load(self, params: LoadSessionParams) -> dict[str, Any] | None:
        session_id = params.session_id
        self._check_auth()
        self._check_open()
        if session_id in self._records:
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                f"session {shorten(session_id, 200)!r} is already open on this connection",
                {"sessionId": session_id},
            )
        with self._session_slot("session/load"):
            return await self._load_session(params)

    async def _load_session(self, params: LoadSessionParams) -> dict[str, Any] | None:
        session_id = params.session_id
        setup = _mcp_setup(with_env_policy(params.mcp_configs(), self.harness.bash.env_policy), self.harness.bus)
        options, choice = self._session_options()
        try:
            handle = await self.harness.agents.resume(session_id, owner=self._scope, options=options, setup=setup)
        except SessionNotFoundError:
            raise rpc.RpcError(
                rpc.RESOURCE_NOT_FOUND,
                f"unknown session {shorten(session_id, 200)!r}: nothing is stored under this id",
                {"sessionId": session_id},
            ) from None
        except AgentExistsError as exc:
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                f"cannot load session {session_id!r}: {exc}",
                {"sessionId": session_id},
            ) from None
        # No checkpoint from the resume to the answer: a paused turn's continuation (started
        # by the resume) asks its session/request_permission only after the replay and the answer.
        record = await self._adopt(handle, choice)
        self._apply_logged(record)
        # Synchronous from here: the replay is queued before the answer and before any new event.
        events = record.agent.session.events
        for update in replay_updates(events, record.id, record.agent.session.header.cwd):
            self._update(record.id, update)
        # Then what the harness knows of the session: its title, last activity and usage.
        if record.title is not None:
            self._update(record.id, {"sessionUpdate": "session_info_update", "title": record.title})
        self._announce({"sessionId": record.id}, None)
        if plan := plan_of(events):  # the plan as it stands (each plan update replaces the last)
            self._update(record.id, plan_update(plan))
        if events:
            self._after_turn(record, next((e for e in reversed(events) if isinstance(e, ev.TurnEnd)), None))
        return {
            **self._modes_of(record),
            "configOptions": self._config_options(record),
            **_sandbox_meta(self.harness, record.agent.session.header.cwd),
        }

    async def _list(self, params: ListSessionsParams) -> dict[str, Any]:
        self._check_auth()
        return await list_sessions(self.harness, params.cwd, params.cursor)

    def _take_for_close(self, params: CloseSessionParams) -> _SessionRecord:
        record = self._record(params.session_id)
        record.closing = True
        self._records.pop(record.id, None)
        return record

    async def _close(self, record: _SessionRecord) -> dict[str, Any]:
        failure = await self._dispose_record(record)
        if failure is not None:
            self._unstored.remove(failure)  # reported here, to the client that asked
            raise rpc.RpcError(rpc.INTERNAL_ERROR, str(failure), {"code": "store-error"})
        return {}

    @contextlib.contextmanager
    def _session_slot(self, method: str) -> Iterator[None]:
        """Count a session being created or loaded against ``max_sessions`` (refused at the cap)."""
        count = len(self._records) + self._opening
        if count >= self.max_sessions:
            raise rpc.RpcError(
                rpc.TOO_MANY_SESSIONS,
                f"{method} refused: this connection has {count} sessions open, the cap (max_sessions = "
                f"{self.max_sessions}, trio-harness acp --max-sessions); close one with session/close first",
                {"maxSessions": self.max_sessions},
            )
        self._opening += 1
        try:
            yield
        finally:
            self._opening -= 1

    def _check_open(self) -> None:
        if self._closing:
            raise rpc.RpcError(rpc.INTERNAL_ERROR, "the server is shutting down")

    async def _adopt(self, handle: AgentHandle, choice: ModelChoice | None = None) -> _SessionRecord:
        """Take a fresh handle into a session record (or dispose it if the server is closing)."""
        if self._closing or (self._scope is not None and self._scope.closing):
            with trio.CancelScope(shield=True):
                await handle.dispose()
            raise rpc.RpcError(rpc.INTERNAL_ERROR, "the server is shutting down")
        record = _SessionRecord(
            id=handle.agent.id,
            handle=handle,
            mode=self.initial_mode,
            title=session_title(handle.agent.session.events),
            model=choice,
        )
        self._records[record.id] = record
        call = functools.partial(self._requests.call, self._post)  # fs/* requests to the client
        bind_client_fs(self.harness.tools, handle.agent, record.id, self._client_fs, call, self.fs_timeout)
        record.remove_observer = handle.agent.session.observe(lambda event: self._watch_unsolicited(record, event))
        return record

    # ------------------------------------------------------------ prompts

    def _start_prompt(self, request: rpc.Request, params: PromptParams) -> None:
        record = self._record(params.session_id)
        text = params.content
        self._check_auth()
        if record.prompt is not None:
            raise rpc.RpcError(
                rpc.SESSION_BUSY,
                f"session {record.id!r} already has a prompt in flight; wait for its answer or send session/cancel",
                {"sessionId": record.id},
            )
        agent = record.agent
        if isinstance(text, str) and (command := parse_command(text)) is not None:  # a slash command (no images)
            record.prompt = _Prompt(request_id=request.id, scope=trio.CancelScope())
            if not self._spawn(self._run_command, record, record.prompt, *command):
                record.prompt = None
                raise rpc.RpcError(rpc.INTERNAL_ERROR, "the server is shutting down")
            return
        cwd = agent.session.header.cwd

        def on_event(event: Event) -> None:
            update = live_update(event, record.id, cwd)
            if update is not None:
                self._update(record.id, update)
                self._plan_after(record, event)

        def on_done(outcome: TurnOutcome) -> None:
            stop_reason, failure = stop_reason_for(outcome.end)
            turn = outcome.end.turn if outcome.end is not None else 0
            if not self._spawn(self._answer_after_flush, record, prompt, stop_reason, failure, turn):
                self._answer(record, prompt, stop_reason, failure, turn)

        prompt = record.prompt = _Prompt(request_id=request.id)
        try:
            with continue_trace(params.meta):  # a W3C traceparent in _meta: the turn continues that trace
                prompt.followed = agent.follow(text, on_event=on_event, on_done=on_done)
        except Exception as exc:  # e.g. the agent is being disposed, or its model takes no images (ModelError)
            record.prompt = None
            code = rpc.INVALID_PARAMS if isinstance(exc, ModelError) else rpc.INTERNAL_ERROR
            raise rpc.RpcError(code, f"session {record.id!r} cannot take this prompt: {exc}") from None

    async def _answer_after_flush(
        self,
        record: _SessionRecord,
        prompt: _Prompt,
        stop_reason: StopReason | None,
        failure: Failure | None,
        turn: int,
    ) -> None:
        # A prompt is answered only once its turn is stored: a store failure
        # (or a store too slow to answer) is the prompt's error, never a
        # stopReason for a turn nobody kept (docs/guarantees.rst).
        unstored: str | None = None
        with trio.CancelScope(shield=True):
            with trio.move_on_after(FLUSH_TIMEOUT) as waited:
                try:
                    await record.agent.session.flush()
                except SessionStoreError as exc:
                    unstored = str(exc)
            if waited.cancelled_caught:
                unstored = f"session {record.id!r} could not be stored within {FLUSH_TIMEOUT:g} s"
        if unstored is not None and stop_reason is not None:
            stop_reason, failure = None, Failure("store-error", unstored)
        self._answer(record, prompt, stop_reason, failure, turn)

    def _answer(
        self,
        record: _SessionRecord,
        prompt: _Prompt,
        stop_reason: StopReason | None,
        failure: Failure | None,
        turn: int,
    ) -> None:
        if record.prompt is prompt:
            record.prompt = None
        if stop_reason is not None:
            self._post(rpc.result_response(prompt.request_id, {"stopReason": stop_reason}))
            return
        if failure is not None and failure.code != "store-error":
            # The model (or the turn) failed, but the turn is stored: say so as
            # agent text every editor shows, and end the turn normally
            # (docs/acp.rst, "When the model fails").
            update = failure_update(turn, failure, record.id)
            self._update(record.id, update)
            meta = update["_meta"]
            self._post(rpc.result_response(prompt.request_id, {"stopReason": "end_turn", "_meta": meta}))
            return
        message = failure.message if failure is not None else "the turn failed"
        data = {"code": failure.code} if failure is not None else None
        self._post_error(prompt.request_id, rpc.RpcError(rpc.INTERNAL_ERROR, message, data))

    def _cancel_request(self, params: object) -> None:
        """``$/cancel_request`` naming a pending ``session/prompt``: cancel it like ``session/cancel``."""
        request_id = params.get("requestId") if isinstance(params, dict) else None
        if isinstance(request_id, bool) or not isinstance(request_id, int | str):
            log.debug("acp: ignoring $/cancel_request without a valid requestId")
            return
        for record in list(self._records.values()):
            prompt = record.prompt
            if prompt is not None and prompt.request_id == request_id:
                self._cancel(CancelParams(session_id=record.id))
                return
        log.debug("acp: $/cancel_request for %r, which is no pending prompt, ignored", request_id)

    def _cancel(self, params: CancelParams) -> None:
        session_id = params.session_id
        record = self._records.get(session_id)
        if record is None:
            log.debug("acp: session/cancel for unknown session %r ignored", session_id)
            return
        if record.prompt is not None and record.prompt.scope is not None:
            record.prompt.scope.cancel()  # a slash command
            return
        try:
            record.agent.cancel("user")
        except AgentDisposedError:
            # session/cancel is a notification: nothing to answer.  The session
            # is going away, so its prompt ends anyway.
            log.debug("acp: session/cancel for session %r, which is being disposed", record.id)
        except HarnessError:
            log.exception("acp: cancelling session %r failed", record.id)

    # ------------------------------------------------------------ approval

    def _agent_options(self) -> AgentOptions | None:
        """The options of a new or loaded session's agent: with the asking approver unless told otherwise."""
        options = self.agent_options
        if not self.ask_permission or (options is not None and options.approver is not None):
            return options
        return attrs.evolve(options or AgentOptions(), approver=self._request_permission)

    # ------------------------------------------------------------ teardown

    async def _dispose_record(self, record: _SessionRecord) -> SessionStoreError | None:
        """Dispose one session; a store failure is kept for :meth:`serve` to raise, and returned."""
        record.closing = True
        record.remove_observer()
        failure: SessionStoreError | None = None
        try:
            await record.handle.dispose()
        except SessionStoreError as exc:
            failure = exc
            self._unstored.append(exc)
        except Exception:
            log.exception("acp: disposing session %r failed", record.id)
        # A prompt still queued when its agent went away never runs: the agent's
        # disposal reported it (an outcome with no end), and it is answered ``cancelled``.
        return failure

    async def _shutdown(self) -> None:
        """Dispose every session of this connection and close the bridge scope (idempotent)."""
        self._closing = True
        records = list(self._records.values())
        self._records.clear()
        if records:
            async with trio.open_nursery() as nursery:
                for record in records:
                    nursery.start_soon(self._dispose_record, record)
        if self._scope is not None:
            await self._scope.close()
        # Nothing of this connection asks any more; a wait left (an agent of
        # another owner using this approver) ends with PeerGoneError: denied.
        self._requests.close()


async def serve_stdio(harness: Harness, **options: Any) -> None:
    """Serve ACP on this process's stdin / stdout until stdin reaches end of input.

    The descriptors are duplicated and wrapped in :class:`trio.lowlevel.FdStream`
    (no asyncio, no threads); ``sys.stdout`` should not be written to meanwhile.

    Args:
        harness: the harness whose agents serve the sessions.
        **options: keyword arguments for :class:`AcpServer`.
    """
    server = AcpServer(harness, **options)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    stdout = trio.lowlevel.FdStream(os.dup(1))
    async with stdin, stdout:
        await server.serve(stdin, stdout)
