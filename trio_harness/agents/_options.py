"""Per-agent options."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import attrs

from .._records import ModelSettings
from .._util import positive_int
from ._budget import Budget
from ._compaction import ContextPolicy, HistoryProcessor
from ._durability import Durability, durability_or_none

if TYPE_CHECKING:
    from ..model._protocol import ModelProvider
    from ._approval import Approver
    from ._tools import Tool


DEFAULT_SYSTEM_PROMPT = "You are a helpful assistant. Use the tools you are given when they help."


def _settings_or_none(instance: object, attribute: attrs.Attribute[ModelSettings | None], value: object) -> None:
    if value is not None and not isinstance(value, ModelSettings):
        raise TypeError(f"{attribute.name} must be a ModelSettings or None, got {type(value).__name__}")


def _callable_or_none(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if value is not None and not callable(value):
        raise TypeError(f"{attribute.name} must be callable or None, got {type(value).__name__}")


@attrs.frozen
class AgentOptions:
    """How one agent instance runs.  Not part of the durable history: a resume may
    pick a different model.

    Attributes:
        model: a provider object or spec string; None uses the harness default.
        model_name: the model name sent in requests; None uses the provider's.
        system_prompt: the base system prompt (tool guidance sections are appended).
        max_tokens: optional positive cap on tokens per model call.
        max_steps: steps per turn before the turn ends ``blocked``.
        tool_concurrency: parallel-safe tool calls run at once in one step.
        tool_filter: when set, only tools for which it returns True are offered
            (used to restrict a subagent's tool set).
        approver: asked before each call of a tool that requires approval
            (:doc:`/approval`); it wins over the harness's
            ``open_harness(approver=...)``.  None uses the harness's; with
            neither, such calls are denied.  A subagent inherits its
            parent's approver unless its own options name one.
        model_settings: this agent's model settings; a turn's settings win
            over them, they win over the harness's (field by field, see
            :class:`~trio_harness.model.ModelSettings`).  ``max_tokens`` above
            is the same as ``model_settings.max_tokens``, which wins when both
            are set.
        turn_budget: limits on one turn's model usage; reaching one ends the
            turn with reason ``budget`` before its next request.
        session_budget: limits on the whole session's model usage (its log,
            across resumes); reaching one ends each turn the same way.
        context: when the conversation is compacted and how much of it is
            kept (:class:`~trio_harness.agents.ContextPolicy`).
        history_processor: a hook from the conversation derived from the log
            (after compaction) to the messages sent; it must be a pure
            function of its input, so that a resumed agent sends the same.
        durability: when a turn's events reach the store: ``"step"`` (a
            checkpoint before each model request, tool call and approval
            wait and at each step end, written without waiting for the disk;
            the turn end synced), ``"sync"`` (every checkpoint synced) or
            ``"turn"`` (at the turn end only).  None uses the harness's
            (``open_harness(durability=...)``, default ``"step"``;
            docs/sessions.rst, "Durability").
        bash_runner: runs this agent's foreground ``bash`` commands instead
            of the harness's executor: ``async (ctx, spec) -> BashResult``
            (a :class:`~trio_harness.agents.ToolContext` and a
            :class:`~trio_harness.bash.BashSpec`; see
            :data:`trio_harness.tools.BashRunner`).  The ACP bridge sets it to
            run them in the client's terminal (docs/acp.rst, "Terminals").
            None: the executor runs them.  Background commands always run in
            the executor.

    Raises:
        ValueError: ``durability`` names no policy.
    """

    model: ModelProvider | str | None = None
    model_name: str | None = None
    system_prompt: str = DEFAULT_SYSTEM_PROMPT
    max_tokens: int | None = attrs.field(default=None, validator=positive_int("AgentOptions", optional=True))
    max_steps: int = attrs.field(default=50, validator=positive_int("AgentOptions"))
    tool_concurrency: int = attrs.field(default=10, validator=positive_int("AgentOptions"))
    tool_filter: Callable[[Tool], bool] | None = None
    approver: Approver | None = attrs.field(default=None, validator=_callable_or_none)
    model_settings: ModelSettings | None = attrs.field(default=None, validator=_settings_or_none)
    turn_budget: Budget | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Budget))
    )
    session_budget: Budget | None = attrs.field(
        default=None, validator=attrs.validators.optional(attrs.validators.instance_of(Budget))
    )
    context: ContextPolicy = attrs.field(factory=ContextPolicy, validator=attrs.validators.instance_of(ContextPolicy))
    history_processor: HistoryProcessor | None = None
    durability: Durability | None = attrs.field(default=None, validator=durability_or_none)
    bash_runner: Callable[[Any, Any], Awaitable[Any]] | None = attrs.field(default=None, validator=_callable_or_none)
