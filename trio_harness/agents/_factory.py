"""The default agent factory: builds :class:`ReactAgent` instances."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .._errors import ModelError
from ._driver import ReactAgent
from ._durability import DEFAULT_DURABILITY, Durability, durability_field
from ._options import AgentOptions

if TYPE_CHECKING:
    from .._bus import EventBus
    from .._scope import Scope
    from ..model._protocol import ModelProvider, ModelSettings
    from ..session._session import Session
    from ._approval import Approver
    from ._registry import AgentRegistry
    from ._tools import ToolSet


@attrs.define(eq=False)
class ReactLoopFactory:
    """Builds the default ReAct loop agent; resolves each agent's model route.

    It holds what every agent it builds shares; :func:`~trio_harness.open_harness`
    builds one from the harness's services.

    Attributes:
        bus: where agents report live notifications (``agent/status``, ...).
        tools: the shared tool set (harness-wide tools and prompt sections)
            every agent sees beside its own.
        agents: the registry the agents live in (handed to tools through
            :class:`~trio_harness.agents.ToolContext`).
        model: the default model provider, used when an agent's options name
            none; None to require one per agent.
        approver: the default approver (``open_harness(approver=...)``), used
            when an agent's options name none; None: calls that require
            approval run without asking.
        model_settings: harness-wide model settings (an agent's and a turn's
            win over them, field by field).
        durability: the default durability policy (``open_harness(durability=...)``),
            used when an agent's options name none.
    """

    bus: EventBus
    tools: ToolSet
    agents: AgentRegistry
    model: ModelProvider | None = None
    approver: Approver | None = None
    model_settings: ModelSettings | None = None
    durability: Durability = attrs.field(default=DEFAULT_DURABILITY, validator=durability_field)

    async def build(
        self,
        *,
        session: Session,
        options: AgentOptions,
        scope: Scope,
        parent_id: str | None,
    ) -> ReactAgent:
        """Build a :class:`ReactAgent` (its inbox is replayed from the log here).

        A model given as a spec string is opened for this agent alone: held by
        its scope and closed when the agent is disposed.
        """
        if isinstance(options.model, str):
            from ..model._spec import open_model

            provider = await scope.enter_async_context(open_model(options.model))
        elif options.model is not None:
            from ..model._spec import resolve_model

            provider = resolve_model(options.model)  # checks it is a provider
        elif self.model is not None:
            provider = self.model
        else:
            raise ModelError("no model: pass model=... to open_harness() or AgentOptions(model=...)")
        return ReactAgent._create(
            session=session,
            options=options,
            scope=scope,
            provider=provider,
            bus=self.bus,
            shared_tools=self.tools,
            agents=self.agents,
            parent_id=parent_id,
            approver=options.approver or self.approver,
            model_settings=self.model_settings,
            durability=options.durability or self.durability,
        )
