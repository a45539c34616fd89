"""The current initiator: which agent's driver chain causally triggered this work.

A :class:`contextvars.ContextVar`; Trio copies the context into every task at
spawn, so concurrent chains are isolated.  It is attribution only, never proof
of liveness or authorization.
"""

from __future__ import annotations

import contextvars
from collections.abc import Iterator
from contextlib import contextmanager

_initiator: contextvars.ContextVar[str | None] = contextvars.ContextVar("trio_harness_initiator", default=None)


def current_initiator() -> str | None:
    """The id of the agent whose driver chain is running this code, or None."""
    return _initiator.get()


@contextmanager
def with_initiator(agent_id: str) -> Iterator[None]:
    """Attribute the enclosed work (and tasks spawned in it) to ``agent_id``."""
    token = _initiator.set(agent_id)
    try:
        yield
    finally:
        _initiator.reset(token)


@contextmanager
def without_initiator() -> Iterator[None]:
    """Run the enclosed work with no initiator (e.g. on behalf of a UI)."""
    token = _initiator.set(None)
    try:
        yield
    finally:
        _initiator.reset(token)


def _set_initiator(agent_id: str | None) -> None:
    """Set the initiator for the rest of the current task (driver tasks only)."""
    _initiator.set(agent_id)
