"""Checkpoints: a turn's events handed to the store before each step's effects.

The driver checkpoints before every model request (a compaction inside a
turn before its summary requests too), before a tool's handler
starts (after logging ``tool/started``), before waiting for an approval, and
at every step end; the turn end syncs as always.  How a checkpoint writes is
the agent's *durability* policy (docs/sessions.rst, "Durability"):

- ``"step"`` (the default): ``flush(sync=False)``, written without waiting for
  the disk (JSONL: written, no fsync; PostgreSQL: committed without waiting
  for the WAL).  A killed process loses nothing after its last checkpoint; a
  machine crash may lose the running turn's unsynced checkpoints.
- ``"sync"``: every checkpoint waits for the disk (fsync; synchronous commit).
- ``"turn"``: no checkpoints; the turn is stored at its end only.

A checkpoint the store refuses raises :exc:`SessionStoreError`, which ends the
turn ``error`` / ``store-error`` as a failed turn-end flush does; before a
tool's handler or an approval wait, the call is not run first
(docs/guarantees.rst, "Durable steps").
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING, Any, Literal, TypeAlias, get_args

import attrs

from .._errors import SessionStoreError
from ..session import _events as ev

if TYPE_CHECKING:
    from ..session._session import Session

Durability: TypeAlias = Literal["step", "sync", "turn"]
"""When a turn's events reach the store: ``step`` (checkpoints written, the
turn end synced), ``sync`` (every checkpoint synced) or ``turn`` (only at the
turn end)."""

DURABILITIES: tuple[str, ...] = get_args(Durability)

DEFAULT_DURABILITY: Durability = "step"

# A shield's stand-in where a flush cannot wait (reusable: it does nothing).
UNSHIELDED = nullcontext()


def check_durability(value: object, what: str = "durability") -> Durability:
    """``value`` if it names a durability policy.

    Raises:
        ValueError: naming the bad value and the policies.
    """
    if not isinstance(value, str) or value not in DURABILITIES:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, DURABILITIES))}, got {value!r:.80}")
    return value  # type: ignore[return-value]  # checked against the Literal's values


def durability_field(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: ``value`` names a durability policy."""
    check_durability(value, f"{type(instance).__name__}.{attribute.name}")


def durability_or_none(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    """attrs validator: ``value`` names a durability policy, or is None."""
    if value is not None:
        durability_field(instance, attribute, value)


@attrs.define(eq=False, repr=False, slots=True)
class Checkpoints:
    """One agent's checkpoints: hand the session's events to the store as its policy says."""

    _session: Session = attrs.field(alias="session")
    policy: Durability = "step"
    # The first checkpoint of the running step that failed before a call or an approval
    # (the call did not run); the step's dispatch raises it once every call has its result.
    failure: SessionStoreError | None = attrs.field(default=None, init=False)

    async def __call__(self) -> None:
        """Checkpoint now (nothing under ``"turn"``).

        Not shielded, unlike the turn end: a cancel during a checkpoint leaves
        the events buffered (a writer keeps what it did not store, and knows
        what a cancelled commit stored), and the turn end, shielded, stores
        them.  A checkpoint before a handler that a cancel interrupts runs
        nothing.

        Raises:
            SessionStoreError: the store did not take the events (they stay
                buffered; the turn end retries them).
        """
        policy = self.policy
        if policy == "turn":
            return
        await self._session.flush(sync=policy == "sync")

    async def before_call(self, turn: int, step: int, call_id: str, name: str) -> str | None:
        """Log ``tool/started`` and checkpoint: None to run the handler, else the call's error result.

        A failed checkpoint means the call does not run (its effects would be
        unlogged): the failure is kept on :attr:`failure` for the step to raise.
        """
        self._session.append(ev.ToolStarted, turn=turn, step=step, call_id=call_id, name=name)
        return await self._guarded(f"the call to {name!r} did not run")

    async def before_approval(self, where: dict[str, object]) -> str | None:
        """Checkpoint before an approval wait: None to ask, else the call's error result (not asked, not run).

        On failure ``approval/decided`` (``cancelled``, source ``error``)
        balances the logged request.
        """
        refusal = await self._guarded("approval was not asked and the call did not run")
        if refusal is not None:
            message = f"the session could not be stored before asking: {self.failure}"
            self._session.append(ev.ApprovalDecided, **where, outcome="cancelled", source="error", message=message)
        return refusal

    async def _guarded(self, consequence: str) -> str | None:
        try:
            await self()
        except SessionStoreError as exc:
            if self.failure is None:
                self.failure = exc
            return f"error: not run: the session could not be stored ({exc}); {consequence}"
        return None

    def raise_failure(self) -> None:
        """Raise (and forget) the failure of a checkpoint before a call of the step, if one failed."""
        failure = self.failure
        if failure is not None:
            self.failure = None
            raise failure
