"""The agent's plan (the ``todo_write`` tool) as an ACP ``plan`` session update."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..tools._plan import PlanEntry


def plan_update(entries: Sequence[PlanEntry]) -> dict[str, Any]:
    """The ``plan`` update carrying the whole plan (a client replaces its plan with each one)."""
    return {
        "sessionUpdate": "plan",
        "entries": [
            {"content": entry.content, "priority": entry.priority, "status": entry.status} for entry in entries
        ],
    }
