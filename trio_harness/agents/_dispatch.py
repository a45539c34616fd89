"""Tool dispatch: the tools of each step, and running the calls of a step.

A step's calls run in the model's order; a run of consecutive
``parallel_safe`` calls runs in a nursery, at most
``AgentOptions.tool_concurrency`` at a time.  Each call is logged
(``tool/call-requested``), its arguments validated, asked about when its tool
requires approval (``ApprovalGate``, ``_approval.py``), logged as started
(``tool/started``, handed to the store first: ``_durability.py``) and run; the results
are logged in the model's order whatever order they finish in.  Whatever
interrupts the step, the ``finally`` of ``ToolDispatch.run`` gives every call
without a result the synthetic "not run" result, so the log stays balanced,
except the calls whose approval wait a disposal cut off: they stay waiting,
and the turn ends ``paused`` (docs/approval.rst, "Paused approvals").
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import trio

from .._records import plain_constructor
from .._trace_hooks import tool_scope
from .._util import describe, split_cancelled
from ..session import _events as ev
from ._tools import Tool, ToolContext, ToolOutput, ToolSet

if TYPE_CHECKING:
    from .._bus import EventBus
    from .._records import ToolCall
    from ..model._protocol import ToolSpec
    from ..session._events import CancelCause
    from ..session._session import Session
    from ._agent import Agent
    from ._approval import ApprovalGate
    from ._durability import Checkpoints
    from ._options import AgentOptions
    from ._registry import AgentRegistry


log = logging.getLogger("trio_harness.agent")

# Built from values the driver has checked: a plain constructor (the same objects, cheaper).
_tool_context = plain_constructor(ToolContext) or ToolContext


def _aborted_text(cause: CancelCause | None) -> str:
    return f"error: not run: the turn was aborted (cause: {cause or 'cancelled'})"


@attrs.define(eq=False, repr=False, weakref_slot=False)
class ToolDispatch:
    """One agent's tools: which the next step offers, and running a step's calls."""

    _session: Session = attrs.field(alias="session")
    # The calling agent (ToolContext.agent, the source of agent/tool/started).
    _agent: Agent = attrs.field(alias="agent")
    _bus: EventBus = attrs.field(alias="bus")
    # The registry tools see (ToolContext.agents).
    _agents: AgentRegistry = attrs.field(alias="agents")
    _options: AgentOptions = attrs.field(alias="options")
    _approvals: ApprovalGate = attrs.field(alias="approvals")
    # The agent's checkpoints: tool/started reaches the store before a handler runs.
    _checkpoints: Checkpoints = attrs.field(alias="checkpoints")
    # The running turn's cancel cause, named in the results of calls a cancel ended.
    _cause: Callable[[], CancelCause | None] = attrs.field(alias="cause")
    # Harness-wide tools and prompt sections; the agent's own (``own``) win on a name clash.
    shared: ToolSet
    own: ToolSet = attrs.field(factory=ToolSet, init=False)
    # The tools of the last step, their specs and names, while both tool sets hold
    # the same tools (and no tool_filter decides per step): built once, not per step.
    _tools_of: tuple[tuple[Tool, ...], tuple[Tool, ...]] | None = attrs.field(default=None, init=False)
    _tools_cached: dict[str, Tool] | None = attrs.field(default=None, init=False)
    _tool_specs: tuple[ToolSpec, ...] = attrs.field(default=(), init=False)
    _tool_names: tuple[str, ...] = attrs.field(default=(), init=False)

    def tools(self, answer_tool: Tool | None) -> dict[str, Tool]:
        """The tools of the next step (do not mutate: it may be the previous step's dict).

        ``answer_tool`` is the ``final_answer`` tool of a run() turn in
        ``"tool"`` output mode, offered beside the others.
        """
        shared, own = self.shared.tools(), self.own.tools()
        keep = self._options.tool_filter
        if keep is None and answer_tool is None:
            seen = self._tools_of
            # Tools compare by identity: the same tool objects, in the same order.
            cached = self._tools_cached
            if cached is not None and seen is not None and seen[0] == shared and seen[1] == own:
                return cached
        tools = {tool.name: tool for tool in shared}
        for tool in own:
            tools[tool.name] = tool
        if keep is not None:
            tools = {name: tool for name, tool in tools.items() if keep(tool)}
        if answer_tool is not None:
            tools[answer_tool.name] = answer_tool
        if keep is not None or answer_tool is not None:
            return tools  # decided per step: not cached
        self._tools_of = (shared, own)
        self._tools_cached = tools
        self._tool_specs = tuple(tool.spec for tool in tools.values())
        self._tool_names = tuple(tools)
        return tools

    def specs(self, tools: dict[str, Tool]) -> tuple[ToolSpec, ...]:
        """The specs of ``tools`` (a dict :meth:`tools` returned) for the request."""
        return self._tool_specs if tools is self._tools_cached else tuple(tool.spec for tool in tools.values())

    def names(self, tools: dict[str, Tool]) -> tuple[str, ...]:
        """The names of ``tools`` (a dict :meth:`tools` returned) for ``request/header``."""
        return self._tool_names if tools is self._tools_cached else tuple(tools)

    async def run(self, turn: int, step: int, calls: list[ToolCall], tools: dict[str, Tool]) -> None:
        """Run the calls of a step and log a result for each, in the model's order."""
        session = self._session
        self._checkpoints.failure = None  # a failure of an earlier, aborted step is not this one's
        count = len(calls)
        results: list[tuple[str, bool, dict[str, Any] | None] | None] = [None] * count
        logged = 0
        approvals = self._approvals
        # Approval asks are sequential, in model order, also for calls that run in
        # parallel: call i asks once every earlier call is past its approval (docs/approval.rst).
        asked = [trio.Event() for _ in range(count)] if approvals.approver is not None and count > 1 else None

        def log_result(index: int, result: tuple[str, bool, dict[str, Any] | None]) -> None:
            call = calls[index]
            extra = {} if result[2] is None else {"detail": result[2]}
            session.append(
                ev.ToolResult,
                turn=turn,
                step=step,
                call_id=call.id,
                name=call.name,
                content=result[0],
                is_error=result[1],
                **extra,
            )

        def deliver(index: int, content: str, is_error: bool, detail: Mapping[str, Any] | None = None) -> None:
            nonlocal logged
            if results[index] is not None:
                return
            results[index] = (content, is_error, None if detail is None else dict(detail))
            while logged < count and (result := results[logged]) is not None:
                log_result(logged, result)
                logged += 1

        async def run_one(index: int, limiter: trio.CapacityLimiter | None) -> None:
            call = calls[index]
            tool = tools.get(call.name)
            session.append(
                ev.ToolCallRequested, turn=turn, step=step, call_id=call.id, name=call.name, arguments=call.arguments
            )
            if tool is None:
                known = ", ".join(sorted(tools)) or "none"
                deliver(index, f"error: unknown tool {call.name!r}; available tools: {known}", True)
                if asked is not None:
                    asked[index].set()
                return
            try:
                args = tool.validate(call.arguments)
            except Exception as exc:  # bad arguments; or a schema that cannot be checked: this call's error only
                text = (
                    str(exc)
                    if isinstance(exc, ValueError)
                    else f"the arguments for tool {call.name!r} could not be checked: {describe(exc)}"
                )
                deliver(index, f"error: {text}", True)
                if asked is not None:
                    asked[index].set()
                return
            if tool.requires_approval is not False:
                refusal = await approvals.approve(tool, call, args, turn, step, asked, index)
                if refusal is not None:
                    deliver(index, refusal, True)
                    return
            elif asked is not None:
                asked[index].set()
            agent = self._agent
            ctx = _tool_context(agent=agent, agents=self._agents, call_id=call.id, turn=turn, step=step)

            async def start() -> object:
                # tool/started on the store first: from here on the call may have had effects.
                refusal = await self._checkpoints.before_call(turn, step, call.id, call.name)
                if refusal is not None:
                    return ToolOutput(refusal, is_error=True)
                self._bus.emit("agent/tool/started", agent, turn=turn, step=step, call_id=call.id, tool=call.name)
                with tool_scope(self._bus, session.id, call.id):  # the call's span is current (docs/tracing.rst)
                    return await tool.handler(ctx, args)

            try:
                if limiter is None:
                    output = await start()
                else:
                    async with limiter:
                        output = await start()
            except BaseException as exc:
                # Cancellation may arrive wrapped in an exception group (a tool
                # with its own nursery), possibly beside the tool's own errors.
                cancelled, failed = split_cancelled(exc)
                if failed is not None and not isinstance(failed, Exception):
                    raise
                if failed is not None:
                    log.debug("tool %s raised", call.name, exc_info=True)
                    deliver(index, f"error: tool {call.name!r} failed: {describe(failed)}", True)
                if cancelled is None:
                    return
                deliver(index, f"error: cancelled: the turn was aborted (cause: {self._cause() or 'cancelled'})", True)
                if cancelled is exc:
                    raise
                raise cancelled from None
            if isinstance(output, ToolOutput):
                deliver(index, output.content, output.is_error, output.detail)
            else:
                deliver(index, output if isinstance(output, str) else str(output), False)

        try:
            index = 0
            while index < count:
                tool = tools.get(calls[index].name)
                end = index + 1
                if tool is not None and tool.parallel_safe:
                    while end < count and (other := tools.get(calls[end].name)) is not None and other.parallel_safe:
                        end += 1
                if end - index == 1:
                    await run_one(index, None)
                else:
                    limiter = trio.CapacityLimiter(self._options.tool_concurrency)
                    async with trio.open_nursery() as nursery:
                        for i in range(index, end):
                            nursery.start_soon(run_one, i, limiter)
                index = end
        finally:
            if logged < count:  # some call has no result yet: it did not run to the end
                cut = approvals.cut
                for index in range(count):
                    if calls[index].id not in cut:
                        deliver(index, _aborted_text(self._cause()), True)
                if cut:  # a paused turn: the calls it cut off keep no result; log the others after them
                    for index in range(logged, count):
                        if (result := results[index]) is not None:
                            log_result(index, result)
        self._checkpoints.raise_failure()  # a call not run for a failed checkpoint ends the turn store-error
