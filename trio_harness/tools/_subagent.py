"""The ``subagent`` tool: run a child agent on a task prompt.

The child is created through the agent registry with the calling agent as its
runtime owner (so the parent's disposal disposes it) and its session records
the parent as lineage.  Foreground calls return the child's final text;
background calls register a final-output ``subagent`` task whose kill cancels
the child.  The child is always disposed when its work ends.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import TYPE_CHECKING, Any, ClassVar

import attrs
import trio

from ..agents._options import AgentOptions
from ..agents._tools import Tool, ToolContext, ToolOutput, ToolSet
from ..tasks._render import render_started
from ..tasks._service import TaskService
from ..tasks._types import TaskHooks, TaskOutcome, TaskSpec
from ._resume_tasks import (
    add_resumer,
    child_outcome,
    child_session_id,
    describe_end,
    final_text,
    stop_child,
    subagent_resumer,
)

if TYPE_CHECKING:
    from .._scope import Scope
    from ..agents._agent import Agent
    from ..agents._registry import AgentHandle, AgentRegistry


DESCRIPTION = (
    "Run a subagent: a fresh agent with its own context that works on the task you describe "
    "and returns its final answer. Give it a complete, self-contained prompt."
)
BACKGROUND_HELP = " With run_in_background=true it returns a task id at once; collect the answer with task_output."


def subagent_depth(agents: AgentRegistry, agent_id: str) -> int:
    """How many runtime owners stand above ``agent_id`` in ``agents`` (0 for a root agent)."""
    depth = 0
    current: str | None = agents.owner_of(agent_id)
    while current is not None:
        depth += 1
        current = agents.owner_of(current)
    return depth


@attrs.frozen
class SubagentOptions:
    """Settings of the model-facing ``subagent`` tool (:class:`SubagentToolPlugin`;
    :func:`~trio_harness.open_harness` takes them as ``subagent_options=``).

    Attributes:
        max_depth: how deep subagents may nest (a root agent has depth 0).
        run_in_background: offer the ``run_in_background`` parameter
            (default on).  When off, the parameter is absent from the schema
            and a forced background call is refused.
        background_default: whether a call runs in the background when the
            model does not say.
        child_tools: when set, the names of the tools the child may use
            (``subagent`` itself is dropped at the depth limit anyway).
        child_options: options for child agents (model, prompt, limits).
    """

    max_depth: int = 3
    run_in_background: bool = True
    background_default: bool = False
    child_tools: Collection[str] | None = None
    child_options: AgentOptions = attrs.field(factory=AgentOptions)


@attrs.define(eq=False)
class SubagentToolPlugin:
    """Registers the ``subagent`` tool into a tool set (normally the harness-wide one).

    A child is created in the calling agent's registry (``ctx.agents``), with
    the caller as its runtime owner.

    Attributes:
        tasks: the task service background children are registered in.
        tools: the tool set to register into.
        options: the tool's settings (:class:`SubagentOptions`).
    """

    name: ClassVar[str] = "subagent"
    tasks: TaskService
    tools: ToolSet
    options: SubagentOptions = attrs.field(
        factory=SubagentOptions, validator=attrs.validators.instance_of(SubagentOptions)
    )
    agents: AgentRegistry | None = attrs.field(default=None, kw_only=True)

    def tool(self) -> Tool:
        """The ``subagent`` tool definition."""
        properties: dict[str, Any] = {
            "prompt": {"type": "string", "description": "The complete task for the subagent."},
            "description": {"type": "string", "description": "A short label (3-8 words) for the task."},
        }
        if self.options.run_in_background:
            properties["run_in_background"] = {
                "type": "boolean",
                "description": "Return a task id at once instead of waiting for the answer.",
            }
        return Tool(
            name="subagent",
            description=DESCRIPTION + (BACKGROUND_HELP if self.options.run_in_background else ""),
            parameters={"type": "object", "properties": properties, "required": ["prompt"]},
            handler=self._call,
        )

    async def apply(self, scope: Scope) -> None:
        """Register the tool, bound to ``scope``; with ``agents``, also the resumer of background children."""
        self.tools.add(self.tool(), scope=scope)
        agents = self.agents
        if agents is not None:

            async def open_child(parent: Agent, session_id: str, resume: bool) -> AgentHandle:
                return await self._create_child(agents, parent, session_id=session_id, resume=resume)

            add_resumer(self.tasks, "subagent", subagent_resumer(self.tasks, open_child), scope)

    def _options(self) -> AgentOptions:
        keep = self.options.child_tools
        if keep is None:
            return self.options.child_options
        allowed = frozenset(keep)
        inner = self.options.child_options.tool_filter

        def tool_filter(tool: Tool) -> bool:
            return tool.name in allowed and (inner is None or inner(tool))

        return attrs.evolve(self.options.child_options, tool_filter=tool_filter)

    async def _create_child(
        self, agents: AgentRegistry, parent: Agent, *, session_id: str | None = None, resume: bool = False
    ) -> AgentHandle:
        options = self._options()
        if options.approver is None:
            # A child asks whoever its parent asks (docs/approval.rst): the
            # approval the parent's user gave is not bypassed by delegating.
            inherited = getattr(parent, "approver", None)
            if inherited is not None:
                options = attrs.evolve(options, approver=inherited)
        if resume and session_id is not None:
            return await agents.resume(session_id, options=options, parent=parent)
        return await agents.create(session_id=session_id, options=options, parent=parent, cwd=parent.session.header.cwd)

    async def _call(self, ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        background = args.get(
            "run_in_background", self.options.background_default if self.options.run_in_background else False
        )
        if "run_in_background" in args and not self.options.run_in_background and args["run_in_background"]:
            return ToolOutput("error: background subagents are disabled in this harness", is_error=True)
        depth = subagent_depth(ctx.agents, ctx.agent.id) + 1
        if depth > self.options.max_depth:
            return ToolOutput(
                f"error: subagent depth limit reached ({self.options.max_depth}); do this work yourself", is_error=True
            )
        prompt: str = args["prompt"]
        label: str = args.get("description") or (prompt.strip().splitlines()[0][:60] if prompt.strip() else "subagent")
        if background:
            return await self._start_background(ctx, prompt, label)
        handle = await self._create_child(ctx.agents, ctx.agent)
        try:
            handle.agent.followup(prompt)
            await handle.agent.when_idle()
            text, end = final_text(handle.agent)
        except trio.Cancelled:
            # The parent's turn is being cancelled: the parent stops its child,
            # so the child's turn ends with cause "parent" (docs/subagents.rst).
            stop_child(handle.agent)
            raise
        finally:
            with trio.CancelScope(shield=True):
                await handle.dispose()
        if end is not None and end.reason == "completed":
            return text or "(the subagent returned no text)"
        return ToolOutput(f"error: {describe_end(end)}" + (f"\npartial answer: {text}" if text else ""), True)

    async def _start_background(self, ctx: ToolContext, prompt: str, label: str) -> str:
        parent = ctx.agent
        agents = ctx.agents

        # A stable child id, so that a process resuming the owner finds the child (tools/_resume_tasks.py).
        child_id = child_session_id(parent.id, ctx.turn, ctx.step, ctx.call_id)

        async def starter() -> TaskHooks:
            handle = await self._create_child(agents, parent, session_id=child_id)
            child = handle.agent
            killed: list[str | None] = []
            child.followup(prompt)

            def cancel(reason: str | None) -> None:
                if not killed:
                    killed.append(reason)
                stop_child(child)

            async def done() -> TaskOutcome:
                try:
                    await child.when_idle()
                    return child_outcome(child, bool(killed))
                finally:
                    with trio.CancelScope(shield=True):
                        await handle.dispose()

            return TaskHooks(cancel=cancel, done=done)

        snapshot = await self.tasks.start(TaskSpec(kind="subagent", label=label, owner=parent, run=starter))
        return render_started(snapshot.id)
