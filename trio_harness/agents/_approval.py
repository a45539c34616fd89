"""Approval before dangerous tool calls: what an approver is asked, and what it answers.

An *approver* is an async callable given to :func:`~trio_harness.open_harness`
(``approver=``, every agent of the harness) or to
:class:`~trio_harness.AgentOptions` (``approver=``, one agent; it wins).  Before a
call of a tool that requires approval runs, the driver logs
``approval/requested``, awaits the approver inside the turn's cancel scope, logs
``approval/decided``, and then runs the call or gives the model an error result
saying that it was denied (docs/approval.rst).

With no approver configured, a call that requires approval is denied: the
model's error result and the log's ``approval/decided`` say how to allow it.
:func:`allow_all` is the explicit way to run every such call unasked.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import attrs

if TYPE_CHECKING:
    from ._agent import Agent


Verdict: TypeAlias = Literal["allow_once", "allow_always", "deny", "deny_always"]
"""What an approver decides: ``allow_once`` runs this call; ``allow_always`` runs
it and every later call of the same tool in this session without asking;
``deny`` refuses this call; ``deny_always`` refuses it and every later call of
the same tool in this session without asking."""

_VERDICTS: tuple[str, ...] = get_args(Verdict)


def _verdict(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or value not in _VERDICTS:
        raise ValueError(f"ApprovalDecision.verdict must be one of {', '.join(_VERDICTS)}, got {value!r:.80}")


def _message(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(f"ApprovalDecision.message must be a str or None, got {type(value).__name__} {value!r:.80}")


@attrs.frozen
class ApprovalDecision:
    """An approver's answer.

    Build one with the class methods: ``ApprovalDecision.allow_once()``,
    ``allow_always()``, ``deny("use the test database")``,
    ``deny_always()``.

    Attributes:
        verdict: see :data:`Verdict`.
        message: for a denial, the text the model reads beside "denied" (why,
            or what to do instead); logged in ``approval/decided``.

    Raises:
        ValueError: ``verdict`` is not one of the four.
        TypeError: ``message`` is not a str or None.
    """

    verdict: Verdict = attrs.field(validator=_verdict)
    message: str | None = attrs.field(default=None, validator=_message)

    @classmethod
    def allow_once(cls) -> ApprovalDecision:
        """Run this call."""
        return cls("allow_once")

    @classmethod
    def allow_always(cls) -> ApprovalDecision:
        """Run this call and, without asking, every later call of the same tool in this session."""
        return cls("allow_always")

    @classmethod
    def deny(cls, message: str | None = None) -> ApprovalDecision:
        """Refuse this call; ``message`` is given to the model."""
        return cls("deny", message)

    @classmethod
    def deny_always(cls, message: str | None = None) -> ApprovalDecision:
        """Refuse this call and, without asking, every later call of the same tool in this session."""
        return cls("deny_always", message)

    @property
    def allowed(self) -> bool:
        """Whether the call runs."""
        return self.verdict in ("allow_once", "allow_always")

    @property
    def remembered(self) -> bool:
        """Whether the decision applies to later calls of the tool in this session."""
        return self.verdict in ("allow_always", "deny_always")


@attrs.frozen
class ApprovalRequest:
    """What an approver is asked about one tool call.

    Attributes:
        tool: the tool name.
        arguments: the arguments after validation against the tool's schema
            (for a typed-function tool, converted to the annotated types).
        raw_arguments: the arguments exactly as the model sent them (JSON text).
        call_id: the model's id of the call.
        agent_id: the id of the calling agent (== its session id).
        turn: the turn number.
        step: the step number.
        agent: the calling agent (a subagent's request names the child; its
            ``parent_id`` leads to the agent that started it).
    """

    tool: str
    arguments: Mapping[str, Any]
    raw_arguments: str
    call_id: str
    agent_id: str
    turn: int
    step: int
    agent: Agent = attrs.field(eq=False, repr=False)


Approver: TypeAlias = Callable[[ApprovalRequest], Awaitable[ApprovalDecision]]
"""``async def approver(request: ApprovalRequest) -> ApprovalDecision``.

It runs inside the calling turn's cancel scope: cancelling the turn or
disposing the agent ends the wait at once (the call does not run).  An approver
that raises denies the call; the error reaches the session log and the model's
error result."""


async def allow_all(request: ApprovalRequest) -> ApprovalDecision:
    """The approver that allows every call, once, without asking anyone.

    ``open_harness(approver=allow_all)`` runs every call that requires
    approval (every ``bash`` command the model picks) as if approval did not
    exist, except that each call is still logged: ``approval/decided`` with
    outcome ``allow_once`` and source ``approver``.  Use it only where whatever
    the model may run is acceptable (a sandbox, a throw-away machine, a test);
    see docs/approval.rst, "What approval protects against".
    """
    return ApprovalDecision.allow_once()
