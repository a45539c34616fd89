"""The default agent factory: builds :class:`ReactAgent` instances."""

from __future__ import annotations

from typing import TYPE_CHECKING

import attrs

from .._errors import ModelError
from ._driver import ReactAgent
from ._options import AgentOptions

if TYPE_CHECKING:
    from .._harness import Harness
    from .._scope import Scope
    from ..session._session import Session

__all__ = ["ReactLoopFactory"]


@attrs.define(eq=False)
class ReactLoopFactory:
    """Builds the default ReAct loop agent; resolves each agent's model route."""

    async def build(
        self,
        *,
        session: Session,
        options: AgentOptions,
        scope: Scope,
        harness: Harness,
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
        elif harness.model is not None:
            provider = harness.model
        else:
            raise ModelError("no model: pass model=... to open_harness() or AgentOptions(model=...)")
        return ReactAgent(
            session=session, options=options, scope=scope, harness=harness, provider=provider, parent_id=parent_id
        )
