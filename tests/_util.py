"""Small shared pieces of the test suite."""

from __future__ import annotations

__all__ = ["WAIT"]

WAIT = 60.0
"""The bound, in seconds of real time, on any wait for something real: a subprocess,
a pipe or socket peer, a process group to die, a disk read.  Generous on purpose:
the suite must pass on a loaded 2-core machine; it only turns a hang into a failure.
Virtual-time bounds under ``autojump_clock`` are assertions, not waits, and stay literal."""
