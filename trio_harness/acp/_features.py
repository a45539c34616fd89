"""The ACP server's session features: modes and config options, slash commands, plans, the client's terminals.

:class:`SessionFeatures` is a part of :class:`~trio_harness.acp.AcpServer`
(its base class), kept here so the server module stays the connection's
mechanics.  Config options: :mod:`._config`; commands: :mod:`._commands`;
terminals: :mod:`._terminal`; plans: :mod:`trio_harness.tools._plan`.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._errors import AgentDisposedError, HarnessError
from ..agents._approval import ApprovalDecision, ApprovalRequest
from ..agents._options import AgentOptions
from ..model._protocol import ModelProvider
from ..session import _events as ev
from ..tools._plan import plan_result
from . import _jsonrpc as rpc
from ._commands import SessionStatus, available_commands, run_command
from ._config import (
    MODE_OPTION,
    MODEL_OPTION,
    ModelChoice,
    check_choice,
    config_options,
    config_update,
    logged_choices,
    model_ids,
)
from ._modes import MODE_AUTO, MODE_IDS, mode_state
from ._params import SetSessionModeParams
from ._permission import add_file_change, decision_of, permission_params
from ._plan import plan_update
from ._records import _harness_error, _Prompt, _SessionRecord
from ._terminal import TerminalRunner
from ._updates import shorten

log = logging.getLogger("trio_harness.acp")

if TYPE_CHECKING:
    from .._harness import Harness
    from ..agents._agent import Agent
    from ..session._events import Event


class SessionFeatures:
    """Modes, config options, slash commands, plans and terminals of :class:`~trio_harness.acp.AcpServer`."""

    if TYPE_CHECKING:  # provided by AcpServer
        harness: Harness
        agent_options: AgentOptions | None
        ask_permission: bool
        models: Sequence[ModelProvider]
        _records: dict[str, _SessionRecord]
        _requests: rpc.OutgoingRequests
        _terminal: TerminalRunner | None
        _closing: bool
        _broken: bool
        _accepting: bool
        _writing: Callable[[], bool]
        _post: Callable[[dict[str, Any]], None]
        _post_error: Callable[[rpc.RequestId, rpc.RpcError], None]
        _update: Callable[[str, dict[str, Any]], None]
        _record: Callable[[str], _SessionRecord]
        _agent_options: Callable[[], AgentOptions | None]

    def _modes_offered(self) -> bool:
        options = self.agent_options
        return self.ask_permission and (options is None or options.approver is None)

    def _modes_of(self, record: _SessionRecord) -> dict[str, Any]:
        """The ``modes`` member of a session/new or session/load result (none when modes are off)."""
        return {"modes": mode_state(record.mode)} if self._modes_offered() else {}

    def _set_mode(self, params: SetSessionModeParams) -> dict[str, Any]:
        record = self._record(params.session_id)
        if not self._modes_offered():
            raise rpc.RpcError(
                rpc.METHOD_NOT_FOUND, "this server offers no session modes (it was started without asking approval)"
            )
        if params.mode_id not in MODE_IDS:
            raise rpc.RpcError(
                rpc.INVALID_PARAMS,
                f"invalid params for session/set_mode: unknown modeId {shorten(params.mode_id, 100)!r}; "
                f"known: {sorted(MODE_IDS)}",
                {"field": "modeId"},
            )
        self._choose(record, MODE_OPTION, params.mode_id)
        return {}

    def _note_client(self, params: object) -> None:
        """Read ``initialize``'s client capabilities: with ``terminal``, foreground bash runs there."""
        capabilities = params.get("clientCapabilities") if isinstance(params, dict) else None
        if isinstance(capabilities, dict) and capabilities.get("terminal") is True and self._terminal is None:
            self._terminal = TerminalRunner(
                requests=self._requests,
                post=self._post,
                session_of=self._session_of,
                update=self._update,
                connected=self._writing,
                answers=lambda: self._accepting and not self._broken,
                shell=self.harness.bash.shell,
                output_limit=self.harness.bash.tail_bytes,
            )

    def _announce(self, result: object, params: object) -> None:
        """After a session/new or session/load answer: the session's slash commands."""
        session_id = result.get("sessionId") if isinstance(result, dict) else None
        session_id = session_id or getattr(params, "session_id", None)
        if isinstance(session_id, str) and session_id in self._records:
            self._update(
                session_id, {"sessionUpdate": "available_commands_update", "availableCommands": available_commands()}
            )

    async def _run_command(self, record: _SessionRecord, prompt: _Prompt, name: str, rest: str) -> None:
        """A prompt that is a slash command: its answer as agent text, then ``end_turn`` (docs/acp.rst)."""
        model = record.model.current if record.model is not None else getattr(self.harness.model, "name", "?")
        status = SessionStatus(str(model), record.mode if self._modes_offered() else None, self.harness.bash.sandbox)
        stop_reason = "cancelled"
        # The scope exists from the prompt's admission: a cancel read before this task runs cancels it.
        scope = prompt.scope if prompt.scope is not None else trio.CancelScope()
        try:
            with scope:
                await trio.lowlevel.checkpoint_if_cancelled()
                text = await run_command(name, rest, record.agent, status)
                chunk = {"sessionUpdate": "agent_message_chunk", "content": {"type": "text", "text": text}}
                self._update(record.id, {**chunk, "messageId": str(uuid.uuid4())})
                stop_reason = "end_turn"
        except HarnessError as exc:
            self._post_error(prompt.request_id, _harness_error(exc))
            return
        finally:
            if record.prompt is prompt:
                record.prompt = None
        self._post(rpc.result_response(prompt.request_id, {"stopReason": stop_reason}))

    def _config_options(self, record: _SessionRecord) -> list[dict[str, Any]]:
        return config_options(record.mode if self._modes_offered() else None, record.model)

    def _set_config(self, session_id: str, config_id: str, value: str) -> dict[str, Any]:
        record = self._record(session_id)
        check_choice(config_id, value, self._modes_offered(), record.model)
        self._choose(record, config_id, value)
        return {"configOptions": self._config_options(record)}

    def _choose(self, record: _SessionRecord, option: str, value: str) -> None:
        """Set a config option (logged, so a load keeps it) and tell the client; nothing when unchanged."""
        model = record.model
        if value == (record.mode if option == MODE_OPTION else model.current if model is not None else None):
            return
        record.agent.session.append(ev.ConfigChanged, option=option, value=value)
        if option == MODE_OPTION:
            record.mode = value
            self._update(record.id, {"sessionUpdate": "current_mode_update", "currentModeId": value})
        elif model is not None:
            model.current = value  # the next request goes to it
        self._update(record.id, config_update(self._config_options(record)))

    def _apply_logged(self, record: _SessionRecord) -> None:
        """A loaded session's logged choices (``session/config`` events) apply again."""
        for option, value in logged_choices(record.agent.session.events).items():
            if option == MODE_OPTION and value in MODE_IDS:
                record.mode = value
            elif option == MODEL_OPTION and record.model is not None and value in record.model.choices:
                record.model.current = value
            else:  # the server no longer offers it: the default applies, and the log says so
                log.warning("acp: session %r chose %s %r, which this server does not offer", record.id, option, value)

    def _plan_after(self, record: _SessionRecord, event: Event) -> None:
        if isinstance(event, ev.ToolResult) and (plan := plan_result(event, record.agent.session.events)) is not None:
            self._update(record.id, plan_update(plan))

    def _session_options(self) -> tuple[AgentOptions | None, ModelChoice | None]:
        """A session's agent options (with its model choice and the client's terminal) and its model choice."""
        options = self._agent_options()
        base = options.model if options is not None and options.model is not None else self.harness.model
        providers = list(self.models) or ([base] if isinstance(base, ModelProvider) else [])
        choice = None
        if providers:
            choices = model_ids(providers)
            choice = ModelChoice(choices, next(iter(choices)))
            options = attrs.evolve(options or AgentOptions(), model=choice)
        # A sandbox keeps bash local (the client's terminal is not sandboxed).
        local = self.harness.bash.sandbox is not None or (options is not None and options.bash_runner is not None)
        if self._terminal is not None and not local:
            options = attrs.evolve(options or AgentOptions(), bash_runner=self._terminal)
        return options, choice

    # ------------------------------------------------------------ approval

    def _session_of(self, agent: Agent) -> str | None:
        """The id of this connection's session that ``agent`` (or the agent that started it) serves."""
        seen: set[str] = set()
        current: Agent | None = agent
        while current is not None and current.id not in seen:
            if current.id in self._records:
                return current.id
            seen.add(current.id)
            parent = current.parent_id
            current = self.harness.agents.get(parent) if parent is not None else None
        return None

    async def _request_permission(self, request: ApprovalRequest) -> ApprovalDecision:
        """The approver of this connection's agents: ask the client (``session/request_permission``)."""
        session_id = self._session_of(request.agent)
        if session_id is None:
            return ApprovalDecision.deny(
                f"no ACP session of this connection serves agent {request.agent_id!r}, so nobody can approve the call"
            )
        record = self._records.get(session_id)
        if record is not None and record.mode == MODE_AUTO:
            return ApprovalDecision.allow_once()  # mode "auto": run without asking
        params = permission_params(session_id, request)
        await add_file_change(params, request, self.harness.tools)  # a write shows its diff (docs/editors.rst)
        response = await self._requests.call(self._post, "session/request_permission", params)
        decision = decision_of(response.result, response.error)
        if decision is not None:
            return decision
        # ACP: "the prompt turn was cancelled before the user responded".
        # Cancel the asking agent's turn; the cancel ends this wait at once.
        try:
            cancelled = request.agent.cancel("user")
        except AgentDisposedError:
            cancelled = True  # its disposal aborts the turn
        if cancelled:
            await trio.sleep_forever()
        return ApprovalDecision.deny("the client cancelled the permission request")
