"""Test doubles shared by the task service and task tool tests."""

from __future__ import annotations

import attrs

from trio_harness._scope import Scope

__all__ = ["FakeOwner"]


@attrs.define(eq=False)
class FakeOwner:
    """A stand-in for an Agent: a session id, a real scope, status and an inbox log."""

    id: str
    scope: Scope
    status: str = "idle"
    followups: list[str] = attrs.field(factory=list)
    injects: list[str] = attrs.field(factory=list)

    def followup(self, message: str) -> str:
        self.followups.append(message)
        return f"followup-{len(self.followups)}"

    def inject(self, message: str) -> str:
        self.injects.append(message)
        return f"inject-{len(self.injects)}"

    @property
    def notices(self) -> list[str]:
        """Every notice delivered: followups, then injects."""
        return self.followups + self.injects
