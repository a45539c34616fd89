"""Small shared pieces of the test suite."""

from __future__ import annotations

from trio_harness.agents import Agent
from trio_harness.session import _events as ev

__all__ = ["WAIT", "turn_ends"]

WAIT = 60.0
"""The bound, in seconds of real time, on any wait for something real: a subprocess,
a pipe or socket peer, a process group to die, a disk read.  Generous on purpose:
the suite must pass on a loaded 2-core machine; it only turns a hang into a failure.
Virtual-time bounds under ``autojump_clock`` are assertions, not waits, and stay literal."""


def turn_ends(agent: Agent) -> list[tuple[int, str, str | None]]:
    """Each ``turn/end`` of the agent's log as ``(turn, reason, cause)``."""
    return [(e.turn, e.reason, e.cause) for e in agent.session.events if isinstance(e, ev.TurnEnd)]
