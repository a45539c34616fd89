"""Small shared pieces of the test suite."""

from __future__ import annotations

import os

from trio_harness.agents import Agent
from trio_harness.session import _events as ev
from trio_harness.tools import BashToolOptions

__all__ = ["UNASKED_BASH", "WAIT", "group_alive", "turn_ends"]

UNASKED_BASH = BashToolOptions(requires_approval=False)
"""``open_harness(bash_tool_options=UNASKED_BASH)``: ``bash`` commands run without an approver
(without it, a harness with no approver denies them; docs/approval.rst)."""

WAIT = 60.0
"""The bound, in seconds of real time, on any wait for something real: a subprocess,
a pipe or socket peer, a process group to die, a disk read.  Generous on purpose:
the suite must pass on a loaded 2-core machine; it only turns a hang into a failure.
Virtual-time bounds under ``autojump_clock`` are assertions, not waits, and stay literal."""


def turn_ends(agent: Agent) -> list[tuple[int, str, str | None]]:
    """Each ``turn/end`` of the agent's log as ``(turn, reason, cause)``."""
    return [(e.turn, e.reason, e.cause) for e in agent.session.events if isinstance(e, ev.TurnEnd)]


def group_alive(pgid: int) -> bool:
    """Whether any live (non-zombie) process is in the process group (read from /proc, not the library).

    Zombies are excluded: a killed grandchild is reparented to PID 1, which in a
    container may never reap it, yet it runs nothing.
    """
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rindex(")") + 2 :].split()
        if int(fields[2]) == pgid and fields[0] != "Z":
            return True
    return False
