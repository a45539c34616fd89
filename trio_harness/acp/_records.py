"""What the ACP server keeps per session (records), the errors it answers with, and a session's MCP setup."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from .._errors import HarnessError, InvalidSessionIdError, McpStartError, SessionNotFoundError
from ..session import _events as ev
from ..tools._mcp import connect_mcp_servers, mcp_notice_line
from . import _jsonrpc as rpc
from ._modes import MODE_ASK

if TYPE_CHECKING:
    from .._bus import EventBus, Notice
    from .._harness import Harness
    from ..agents._agent import Agent
    from ..agents._follow import FollowedPrompt
    from ..agents._registry import AgentHandle, Setup
    from ..tools._mcp_config import McpServerConfig

log = logging.getLogger("trio_harness.acp")


# ---------------------------------------------------------------- errors


def _harness_error(exc: HarnessError) -> rpc.RpcError:
    if isinstance(exc, McpStartError):  # reported to the client, naming the servers (docs/mcp.rst)
        data = {"error": type(exc).__name__, "mcpServers": list(exc.servers)}
        return rpc.RpcError(rpc.INTERNAL_ERROR, str(exc), data)
    if isinstance(exc, SessionNotFoundError):
        return rpc.RpcError(rpc.RESOURCE_NOT_FOUND, str(exc))
    if isinstance(exc, InvalidSessionIdError):
        return rpc.RpcError(rpc.INVALID_PARAMS, f"invalid params: sessionId: {exc}", {"field": "sessionId"})
    return rpc.RpcError(rpc.INTERNAL_ERROR, str(exc), {"error": type(exc).__name__})


def _sandbox_meta(harness: Harness, cwd: str | None) -> dict[str, Any]:
    """``_meta`` of session/new and session/load naming the bash sandbox, if any (docs/acp.rst)."""
    policy = harness.bash.sandbox
    if policy is None:
        return {}
    writable = [cwd or os.getcwd(), *policy.writable]
    sandbox = {"network": policy.network, "writable": writable, "hidden": list(policy.hidden)}
    return {"_meta": {"trio-harness/sandbox": sandbox}}


# ---------------------------------------------------------------- records


@attrs.define(eq=False)
class _Prompt:
    """The one in-flight prompt of a session."""

    request_id: rpc.RequestId
    followed: FollowedPrompt | None = None

    @property
    def message_id(self) -> str | None:
        return self.followed.message_id if self.followed is not None else None

    @property
    def turn(self) -> int | None:
        return self.followed.turn if self.followed is not None else None


@attrs.define(eq=False)
class _SessionRecord:
    """A session opened by this connection, and the handle that disposes it."""

    id: str
    handle: AgentHandle
    prompt: _Prompt | None = None
    closing: bool = False
    mode: str = MODE_ASK
    # Turns the agent starts by itself (a background-task notice woke it with no
    # prompt in flight) are streamed too: the ids claimed in the current turn's
    # first step, and whether this turn is streamed by the unsolicited observer.
    first_step_ids: list[str] = attrs.field(factory=list)
    first_step_messages: list[ev.UserMessage] = attrs.field(factory=list)
    unsolicited: bool = False
    in_first_step: bool = False
    remove_observer: Callable[[], None] = lambda: None
    # The title sent with session_info_update (None until the first prompt).
    title: str | None = None

    @property
    def agent(self) -> Agent:
        return self.handle.agent


def _mcp_setup(servers: Sequence[McpServerConfig], bus: EventBus) -> Setup | None:
    """The agent setup that starts a session's MCP servers in the agent's scope (tools for it alone).

    Their notices (``mcp/restarted``, ...) go to the harness bus, as the harness's own servers' do.
    """
    if not servers:
        return None

    async def setup(agent: Agent) -> None:
        await connect_mcp_servers(agent.scope, agent.tools, servers, bus=bus)

    return setup


def _log_mcp_notice(notice: Notice) -> None:
    log.warning("%s", mcp_notice_line(notice).removeprefix("[mcp] "))
