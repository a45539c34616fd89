"""``trio-harness run``'s approval prompt: the question on the terminal, and the answer read from it."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

import trio

from ._cli_common import PROG, _compact_arguments

if TYPE_CHECKING:
    from ._cli_progress import Printer
    from .agents._approval import ApprovalDecision, ApprovalRequest


def approval_question(request: ApprovalRequest, *, width: int = 80, diff: str | None = None) -> str:
    """What ``run`` shows before asking: the tool, where it runs, and the whole call, wrapped and inert.

    For ``bash``: the directory the command runs in (its ``workdir``, else
    the session's directory, else the harness's), ``in the background`` when
    ``run_in_background`` is set, then every line of the command.  For any
    other tool, its arguments as JSON; for a file tool's write, given its
    ``diff`` (:func:`~trio_harness.tools.file_change`), the path and the
    unified diff.  Each line of the call is indented four
    spaces; a line wider than ``width`` continues on lines starting ``  ↪ ``.
    Control characters are shown escaped (:func:`~trio_harness._cli_progress.inert`).
    """
    from ._cli_progress import inert

    arguments = request.arguments
    command = arguments.get("command") if request.tool == "bash" else None
    if diff is not None:  # a file tool's write: the change it makes (docs/tools.rst, "File tools")
        head = f"[approve] {request.tool} {arguments.get('path')}"
        body = diff.rstrip("\n")
    elif isinstance(command, str):
        workdir = arguments.get("workdir") or request.agent.session.header.cwd or os.getcwd()
        head = f"[approve] {request.tool} in {workdir}"
        if arguments.get("run_in_background"):
            head += ", in the background"
        body = command
    else:
        head = f"[approve] {request.tool}"
        body = _compact_arguments(request.raw_arguments)
    step = max(width - 4, 20)
    lines = [inert(head) + ":"]
    for line in inert(body).split("\n"):
        pieces = [line[start : start + step] for start in range(0, len(line), step)] or [""]
        lines.append("    " + pieces[0])
        lines += ["  ↪ " + piece for piece in pieces[1:]]
    return "\n".join(lines)


def _stderr_columns() -> int:
    """The width of the terminal the question goes to: ``$COLUMNS``, else stderr's, else 80."""
    try:
        return int(os.environ.get("COLUMNS", "")) or 80
    except ValueError:
        pass
    try:
        return os.get_terminal_size(sys.stderr.fileno()).columns or 80
    except (OSError, ValueError):
        return 80


class TerminalApprover:
    """The approver of ``run``: asks ``y / n / always`` on the terminal.

    The question goes to stderr and the answer is read from the controlling
    terminal (``/dev/tty``), never from stdin, which may carry the prompt.
    Without a terminal (stderr is not one, or there is no controlling
    terminal) every call that requires approval is denied, with a line on
    stderr saying how to allow it (``--yes``).  One question at a time.
    """

    def __init__(self, printer: Printer) -> None:
        self.printer = printer
        self._lock = trio.Lock()
        self._tty: trio.lowlevel.FdStream | None = None
        self._buffer = b""
        if sys.stderr.isatty():
            try:
                self._tty = trio.lowlevel.FdStream(os.open("/dev/tty", os.O_RDWR | os.O_NOCTTY | os.O_CLOEXEC))
            except OSError:
                self._tty = None

    async def aclose(self) -> None:
        if self._tty is not None:
            await self._tty.aclose()

    async def __call__(self, request: ApprovalRequest) -> ApprovalDecision:
        from .acp._updates import tool_title
        from .agents._approval import ApprovalDecision

        title = self.printer.show(tool_title(request.tool, request.raw_arguments, limit=200))
        if self._tty is None:
            self.printer.break_line()
            print(
                f"{PROG}: denied {title}: it needs approval and there is no terminal to ask on; "
                "run with --yes to allow tool calls without asking",
                file=sys.stderr,
                flush=True,
            )
            return ApprovalDecision.deny(
                "there is no terminal to ask the user for approval; "
                "the user can rerun trio-harness with --yes to allow tool calls"
            )
        from .tools._files import file_change

        change = await file_change(request) if request.tool in ("write_file", "edit_file") else None
        diff = change.unified_diff if change is not None else None
        question = approval_question(request, width=_stderr_columns(), diff=diff)
        async with self._lock:
            self.printer.break_line()
            print(question, file=sys.stderr, flush=True)
            while True:
                self.printer.break_line()
                print("allow? [y]es / [n]o / [a]lways: ", end="", file=sys.stderr, flush=True)
                line = await self._read_line()
                if line is None:
                    print(file=sys.stderr, flush=True)
                    return ApprovalDecision.deny("no answer: the terminal reached end of input")
                word, _, rest = line.strip().partition(" ")
                word = word.lower()
                if word in ("y", "yes"):
                    return ApprovalDecision.allow_once()
                if word in ("a", "always"):
                    return ApprovalDecision.allow_always()
                if word in ("n", "no"):
                    return ApprovalDecision.deny(rest.strip() or None)
                print("please answer y (yes), n (no, optionally followed by a reason) or a (always)", file=sys.stderr)

    async def _read_line(self) -> str | None:
        assert self._tty is not None
        while b"\n" not in self._buffer:
            try:
                data = await self._tty.receive_some(4096)
            except (trio.BrokenResourceError, trio.ClosedResourceError, OSError):
                data = b""
            if not data:
                line, self._buffer = self._buffer, b""
                return line.decode("utf-8", "replace") if line else None
            self._buffer += data
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line.decode("utf-8", "replace")
