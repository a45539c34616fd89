"""Small shared pieces of the test suite."""

from __future__ import annotations

import json
import os
import pty
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import attrs
import pytest
import trio

from trio_harness.agents import Agent, Tool, ToolContext
from trio_harness.session import _events as ev
from trio_harness.tools import BashToolOptions

__all__ = [
    "APPROVAL_PROMPT",
    "NEEDS_BUBBLEWRAP",
    "UNASKED_BASH",
    "WAIT",
    "LineProcess",
    "cli_on_a_terminal",
    "echo_tool",
    "group_alive",
    "read_line",
    "turn_end_events",
    "turn_ends",
    "wait_until",
]

NEEDS_BUBBLEWRAP = pytest.mark.skipif(
    shutil.which("bwrap") is None and not os.environ.get("CI"),
    reason="the bash sandbox needs bubblewrap, which is not installed (apt-get install bubblewrap); "
    "with CI set these tests fail instead",
)
"""For tests of the bash sandbox: skipped, naming the package, where bubblewrap is missing, unless
``CI`` is set (then they run and fail: ``.ci/run`` installs it)."""

UNASKED_BASH = BashToolOptions(requires_approval=False)
"""``open_harness(bash_tool_options=UNASKED_BASH)``: ``bash`` commands run without an approver
(without it, a harness with no approver denies them; docs/approval.rst)."""

WAIT = 60.0
"""The bound, in seconds of real time, on any wait for something real: a subprocess,
a pipe or socket peer, a process group to die, a disk read.  Generous on purpose:
the suite must pass on a loaded 2-core machine; it only turns a hang into a failure.
Virtual-time bounds under ``autojump_clock`` are assertions, not waits, and stay literal."""


def echo_tool(*, padding: int = 0) -> Tool:
    """A tool ``echo`` answering ``echo X`` for ``{"x": "X"}`` (``echo`` without ``x``).

    ``padding`` appends a space and that many ``r`` characters: bulk for tests of sizes.
    """

    async def echo(ctx: ToolContext, args: dict[str, Any]) -> str:
        words = ["echo", *([str(args["x"])] if "x" in args else []), *(["r" * padding] if padding else [])]
        return " ".join(words)

    return Tool("echo", "echo", {"type": "object", "properties": {"x": {"type": "string"}}}, echo)


async def wait_until(predicate: Callable[[], bool], bound: float = WAIT) -> None:
    """Poll ``predicate`` (every 10 ms of real time) until it holds; fail after ``bound`` seconds."""
    with trio.fail_after(bound):
        while not predicate():
            await trio.sleep(0.01)


def turn_ends(agent: Agent) -> list[tuple[int, str, str | None]]:
    """Each ``turn/end`` of the agent's log as ``(turn, reason, cause)``."""
    return [(e.turn, e.reason, e.cause) for e in turn_end_events(agent.session.events)]


def turn_end_events(events: Iterable[ev.Event]) -> list[ev.TurnEnd]:
    """The ``turn/end`` events among ``events``."""
    return [e for e in events if isinstance(e, ev.TurnEnd)]


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


APPROVAL_PROMPT = b"allow? [y]es / [n]o / [a]lways: "
"""The question ``trio-harness run`` asks on its terminal before a call that requires approval."""

# Runs ``python -m trio_harness ARGS`` with stdout and stderr on a pty that is its controlling terminal.
_ON_A_TERMINAL = (
    "import fcntl, os, sys, termios; fcntl.ioctl(2, termios.TIOCSCTTY, 0); "
    "os.execv(sys.executable, [sys.executable, '-m', 'trio_harness', *sys.argv[1:]])"
)


async def cli_on_a_terminal(
    args: Sequence[str],
    *,
    cwd: Path,
    env: Mapping[str, str],
    answers: Sequence[str] = (),
    stdin: bytes | None = None,
) -> tuple[int, str, int]:
    """Run ``trio-harness ARGS`` with stdout and stderr on a pty, answering each approval question in turn.

    ``stdin``: bytes written to a pipe on standard input, then closed (None: ``/dev/null``), so
    answers can only come from the terminal.  Returns the exit code, everything the terminal
    showed (``\r\n`` as ``\n``) and how many questions were answered.
    """
    master, slave = pty.openpty()
    try:
        process = await trio.lowlevel.open_process(
            [sys.executable, "-c", _ON_A_TERMINAL, *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
            stdout=slave,
            stderr=slave,
            start_new_session=True,
        )
    finally:
        os.close(slave)
    terminal = trio.lowlevel.FdStream(master)
    output = b""
    asked = 0
    try:
        with trio.fail_after(WAIT):
            if stdin is not None:
                assert process.stdin is not None
                await process.stdin.send_all(stdin)
                await process.stdin.aclose()
            while True:
                try:
                    data = await terminal.receive_some()
                except (trio.BrokenResourceError, OSError):  # EIO: the other side is closed
                    data = b""
                if not data:
                    break
                output += data
                while output.count(APPROVAL_PROMPT) > asked:
                    await terminal.send_all(answers[asked].encode() + b"\n")
                    asked += 1
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await terminal.aclose()
    return code, output.decode().replace("\r\n", "\n"), asked


async def read_line(stream: trio.abc.ReceiveStream, what: str) -> bytes:
    """The first line a child process writes (bounded by :data:`WAIT`); ``what`` says who, if it exits first."""
    line = b""
    with trio.fail_after(WAIT):
        while not line.endswith(b"\n"):
            chunk = await stream.receive_some(100)
            assert chunk, f"{what} exited early"
            line += chunk
    return line


@attrs.define
class LineProcess:
    """A child process of the tests that answers in JSON lines on stdout (the checkout on its path)."""

    process: trio.Process
    _pending: bytearray = attrs.field(factory=bytearray)

    @classmethod
    async def start(cls, argv: list[str]) -> Self:
        env = dict(os.environ)
        root = Path(__file__).resolve().parent.parent
        env["PYTHONPATH"] = os.pathsep.join([str(root), env.get("PYTHONPATH", "")])
        process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
        return cls(process)

    async def line(self) -> dict[str, Any]:
        """The next JSON line; fails if the process exits first."""
        assert self.process.stdout is not None
        with trio.fail_after(WAIT):
            while b"\n" not in self._pending:
                chunk = await self.process.stdout.receive_some()
                if not chunk:
                    name = type(self).__name__.lower()
                    raise AssertionError(f"{name} {self.process.pid} exited ({self.process.poll()}) without answering")
                self._pending.extend(chunk)
        raw, _, rest = bytes(self._pending).partition(b"\n")
        self._pending[:] = rest
        value: dict[str, Any] = json.loads(raw)
        return value
