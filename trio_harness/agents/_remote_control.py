"""Applying a control posted to a live agent's session (``harness.sessions.post``): a cancel or a decision.

The session registry hands each posted :class:`~trio_harness.session._control.Control`
to :func:`apply_control` with ``applied``, to call once it took effect (for
the PostgreSQL mailbox, that acknowledges the row: it is deleted in the flush
that stores what the control did).  A decision goes to the agent's
:meth:`TakesDecisions.deliver_decision` (the built-in loop's approval gate,
:meth:`~trio_harness.agents._approval.ApprovalGate.deliver`): one for a call
the agent is asking about ends the wait at once (the approver's own answer is
no longer wanted); one for a call a paused turn left waiting is kept and
applies when the continuation reaches the call, without asking the approver
again (docs/approval.rst).

A decision is bound to the call it was posted for (``Control.call_seq``, the
``assistant/message`` that made it), never applied to a later call that
reuses the id.  One that cannot be applied (the call was answered meanwhile,
it reuses the id, the agent takes no decisions) is never dropped quietly:
:func:`apply_control` raises (the registry tells the poster, or logs
``control/refused`` for a control that came through the mailbox), and a kept
decision found stale later logs ``control/refused`` itself.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .._errors import AgentDisposedError, AgentError
from ..session._control import Control, refuse_control
from ._approval import ApprovalDecision

if TYPE_CHECKING:
    from ._agent import Agent

log = logging.getLogger("trio_harness.agents")


@runtime_checkable
class TakesDecisions(Protocol):
    """An agent that takes approval decisions posted through ``harness.sessions.post`` (the built-in loop does).

    A loop without the method cannot: a decision posted to its session is
    refused (the poster's error, or ``control/refused`` in the session).
    """

    def deliver_decision(
        self,
        call_id: str,
        decision: ApprovalDecision,
        *,
        call_seq: int | None,
        applied: Callable[[], None],
        refused: Callable[[str], None],
    ) -> None:
        """Answer the call ``call_id`` made by the ``assistant/message`` at ``call_seq`` with ``decision``.

        ``applied()`` once the decision is logged; ``refused(reason)`` when a
        decision kept for later turns out not to apply (its call was answered
        otherwise, or a later call reuses the id).

        Raises:
            CallNotPendingError: the call is not waiting for approval now, or
                the call waiting is a later one that reuses the id (nothing applied).
        """
        ...


def apply_control(agent: Agent, control: Control, applied: Callable[[], None]) -> None:
    """Apply ``control`` to ``agent``; ``applied()`` once it took effect.

    Raises:
        CallNotPendingError: a decision for a call not waiting for approval
            (answered meanwhile), or meant for an earlier call whose id a
            later call reuses.
        AgentError: a decision for an agent that takes none (no
            :meth:`TakesDecisions.deliver_decision`), or a control without
            its call or verdict.
    """
    if control.kind == "cancel":
        try:
            agent.cancel("user")
        except AgentDisposedError:
            log.info("agent %s: a posted cancel arrived during its disposal", agent.id)
        applied()
        return
    call_id, verdict = control.call_id, control.verdict
    if control.kind != "decision" or call_id is None or verdict is None:
        raise AgentError(f"the posted decision {control.message_id or ''} names no call or no verdict; not applied")
    if not isinstance(agent, TakesDecisions):
        raise AgentError(
            f"the agent of session {agent.id!r} ({type(agent).__name__}) cannot take posted approval decisions "
            f"(it has no deliver_decision); the decision for call {call_id!r} was not applied"
        )

    def refused(reason: str) -> None:
        refuse_control(agent.session, control, reason)
        applied()  # the refusal is logged: its mailbox row goes with that event

    decision = ApprovalDecision(verdict, control.message)  # type: ignore[arg-type]  # checked by read_control
    agent.deliver_decision(call_id, decision, call_seq=control.call_seq, applied=applied, refused=refused)
