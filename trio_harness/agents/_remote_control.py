"""Applying a control posted to a live agent's session (``harness.sessions.post``): a cancel or a decision.

The session registry hands each posted :class:`~trio_harness.session._control.Control`
to :func:`apply_control` with ``applied``, to call once it took effect (for
the PostgreSQL mailbox, that acknowledges the row: it is deleted in the flush
that stores what the control did).  A decision for a call the agent is asking
about ends the wait at once (the approver's own answer is no longer wanted); one
for a call a paused turn left waiting is kept and applies when the
continuation reaches the call, without asking the approver again
(docs/approval.rst).  A decision for a call no longer waiting (answered
meanwhile) is dropped, and acknowledged.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import TYPE_CHECKING

from .._errors import AgentDisposedError
from ..session._control import Control, is_pending
from ._approval import ApprovalDecision, ApprovalGate

if TYPE_CHECKING:
    from ._agent import Agent

log = logging.getLogger("trio_harness.agents")


def apply_control(agent: Agent, control: Control, applied: Callable[[], None]) -> None:
    """Apply ``control`` to ``agent``; ``applied()`` once it took effect (or was dropped)."""
    if control.kind == "cancel":
        try:
            agent.cancel("user")
        except AgentDisposedError:
            log.info("agent %s: a posted cancel arrived during its disposal", agent.id)
        applied()
        return
    gate = getattr(agent, "_approvals", None)  # the built-in loop's gate (agents/_driver.py)
    call_id = control.call_id
    if not isinstance(gate, ApprovalGate) or call_id is None or control.verdict is None:
        log.warning("agent %s cannot take posted approval decisions; the decision is dropped", agent.id)
        applied()
        return
    if not is_pending(agent.session.events, call_id) and not gate.remote.waiting(call_id):
        log.info("agent %s: the posted decision for call %s came after it was answered; dropped", agent.id, call_id)
        applied()
        return
    gate.remote.post(call_id, ApprovalDecision(control.verdict, control.message), applied)  # type: ignore[arg-type]
