"""What the ACP server keeps per session (records), the errors it answers with, and a session's MCP setup."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Final

import attrs
import trio

from .._errors import HarnessError, InvalidSessionIdError, McpStartError, SessionNotFoundError
from ..model._cost import load_prices
from ..session import _events as ev
from ..tools._mcp import connect_mcp_servers, mcp_notice_line
from . import _jsonrpc as rpc
from ._modes import MODE_ASK
from ._updates import iso_time, session_title

if TYPE_CHECKING:
    from .._bus import EventBus, Notice
    from .._harness import Harness
    from ..agents._agent import Agent
    from ..agents._follow import FollowedPrompt
    from ..agents._registry import AgentHandle, Setup
    from ..session._events import SessionHeader
    from ..tools._mcp_config import McpServerConfig
    from ._config import ModelChoice

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
    # A prompt that is a slash command runs in this scope (session/cancel cancels it).
    scope: trio.CancelScope | None = None

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
    # The session's model choice (the ``model`` config option), None when no model is known.
    model: ModelChoice | None = None

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


# ---------------------------------------------------------------- session/list and usage


LIST_PAGE_SIZE: Final = 50
"""The sessions of one ``session/list`` page."""


async def list_sessions(harness: Harness, cwd: str | None, cursor: str | None) -> dict[str, Any]:
    """The result of ``session/list``: stored and live sessions, newest first, a page at a time."""
    sessions = harness.sessions
    headers: dict[str, SessionHeader] = {h.id: h for h in await sessions.stored()}
    for live in sessions.list():
        headers.setdefault(live.id, live.header)
    ordered = sorted(headers.values(), key=lambda h: (-h.created_at, h.id))
    if cwd is not None:
        ordered = [h for h in ordered if h.cwd == cwd]
    start = int(cursor) if cursor is not None else 0
    page = ordered[start : start + LIST_PAGE_SIZE]
    infos: list[dict[str, Any]] = []
    for header in page:
        info: dict[str, Any] = {"sessionId": header.id, "cwd": header.cwd or "/"}
        events: tuple[ev.Event, ...] = ()
        try:
            _, events = await sessions.load_events(header.id)
        except HarnessError as exc:
            log.warning("acp: session/list cannot read session %r: %s", header.id, exc)
        title = session_title(events)
        if title:
            info["title"] = title
        info["updatedAt"] = iso_time(events[-1].ts if events else header.created_at)
        infos.append(info)
    result: dict[str, Any] = {"sessions": infos}
    if start + LIST_PAGE_SIZE < len(ordered):
        result["nextCursor"] = str(start + LIST_PAGE_SIZE)
    return result


def context_estimate(agent: Agent) -> int | None:
    """The driver's estimate of the tokens of ``agent``'s next request (None when it has none)."""
    estimate = getattr(agent, "context_estimate", None)
    if not callable(estimate):
        return None
    try:
        value = estimate()
    except Exception:  # a failing prompt hook: the next step reports it as the turn's error
        log.debug("acp: the context estimate of %s failed", agent.id, exc_info=True)
        return None
    return value if type(value) is int and value >= 0 else None


def context_window(agent: Agent, harness: Harness) -> int | None:
    """The context window of ``agent``'s requests, as its driver sees it (None when unknown)."""
    window: object = agent.options.context.window
    if window is None:
        model = agent.options.model if agent.options.model is not None else harness.model
        window = getattr(model, "context_window", None)
    return window if type(window) is int and window > 0 else None


async def _warm_prices() -> None:
    """Load the price table off the Trio thread; a failure is left to the first lookup to report."""
    try:
        await load_prices()
    except Exception:
        log.debug("loading the price table failed; the first usage_update will report it", exc_info=True)
