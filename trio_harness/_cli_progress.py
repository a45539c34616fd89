"""What ``trio-harness run`` shows on the terminal besides the answer.

:class:`Style` decides colour (only on a terminal, never with ``NO_COLOR``);
:class:`Printer` streams one turn: answer text to stdout, tool calls,
reasoning (``--show-reasoning``) and a one-line status to stderr.

The status line says what the turn is doing while nothing streams: waiting for
the model, thinking (reasoning is streaming but not shown), retry *n* of *m*
in *X* s with the reason, running tool *NAME*.  It is drawn only when stderr
is a terminal and ``--quiet`` is off, always on one line that is erased
(carriage return and erase-line) before anything else is written to either
stream, so it never mixes with the answer or leaves debris behind
(docs/cli.rst, "Progress and colour").
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, TextIO

import attrs

from .acp._updates import shorten

if TYPE_CHECKING:
    from .session._events import Event

__all__ = ["Printer", "Style", "use_colour"]

_ERASE: Final = "\r\x1b[2K"


def use_colour(stream: TextIO, environ: Mapping[str, str]) -> bool:
    """Whether to colour ``stream``: it is a terminal and ``NO_COLOR`` is unset or empty (no-color.org)."""
    if environ.get("NO_COLOR"):
        return False
    isatty = getattr(stream, "isatty", None)
    return bool(isatty is not None and isatty())


@attrs.frozen
class Style:
    """ANSI styling, or none."""

    colour: bool = False

    def _wrap(self, code: str, text: str) -> str:
        return f"\x1b[{code}m{text}\x1b[0m" if self.colour and text else text

    def dim(self, text: str) -> str:
        return self._wrap("2", text)

    def tool(self, text: str) -> str:
        return self._wrap("36", text)

    def error(self, text: str) -> str:
        return self._wrap("31", text)


def _compact(arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
    return json.dumps(parsed, ensure_ascii=False)


@attrs.define(eq=False)
class Printer:
    """Streams one turn to the terminal: text to stdout; tool calls, reasoning and status to stderr.

    Attributes:
        out: where the answer goes.
        err: where everything else goes.
        style: colours (see :func:`use_colour`).
        status: draw the status line (stderr is a terminal and not ``--quiet``).
        quiet: leave out tool lines (errors are still written by the caller).
        show_reasoning: write reasoning to stderr, dimmed, instead of a
            "thinking" status.
        max_retries: the provider's retry limit, for "retry n of m" (None: unknown).
    """

    out: TextIO
    err: TextIO
    style: Style = Style()
    status: bool = False
    quiet: bool = False
    show_reasoning: bool = False
    max_retries: int | None = None
    mid_line: bool = False
    _reasoning_mid_line: bool = False
    _status_text: str | None = None

    # ------------------------------------------------------------ status line

    def set_status(self, text: str) -> None:
        """Show ``text`` as the status line (replacing the previous one)."""
        if not self.status or text == self._status_text:
            return
        self.break_line()
        self.err.write(_ERASE + self.style.dim(f"… {shorten(text, 100)}"))
        self.err.flush()
        self._status_text = text

    def clear_status(self) -> None:
        """Erase the status line, if one is drawn."""
        if self._status_text is not None:
            self.err.write(_ERASE)
            self.err.flush()
            self._status_text = None

    # ------------------------------------------------------------ output

    def break_line(self) -> None:
        """End a partly written answer or reasoning line, so the next line starts clean."""
        self.clear_status()
        if self.mid_line:
            self.out.write("\n")
            self.out.flush()
            self.mid_line = False
        if self._reasoning_mid_line:
            self.err.write("\n")
            self.err.flush()
            self._reasoning_mid_line = False

    def line(self, text: str) -> None:
        """Write one informational line to stderr (after erasing the status line)."""
        self.break_line()
        print(text, file=self.err, flush=True)

    def event(self, event: Event) -> None:
        """Show one event of the watched turn."""
        from .session import _events as ev

        if isinstance(event, ev.StepStart | ev.RequestHeader):
            self.set_status("waiting for the model")
        elif isinstance(event, ev.AssistantChunk):
            if not event.text:
                return
            if event.kind == "reasoning":
                if self.show_reasoning:
                    self.clear_status()
                    if self.mid_line:
                        self.break_line()
                    self.err.write(self.style.dim(event.text))
                    self.err.flush()
                    self._reasoning_mid_line = not event.text.endswith("\n")
                else:
                    self.set_status("thinking")
                return
            self.clear_status()
            if self._reasoning_mid_line:
                self.break_line()
            self.out.write(event.text)
            self.out.flush()
            self.mid_line = not event.text.endswith("\n")
        elif isinstance(event, ev.RequestRetry):
            of = f" of {self.max_retries}" if self.max_retries is not None else ""
            self.set_status(
                f"retry {event.attempt}{of} in {event.delay:.1f}s: {event.failure.message} ({event.failure.code})"
            )
        elif isinstance(event, ev.ToolCallRequested):
            if not self.quiet:
                self.line(self.style.tool(f"[tool] {event.name} {shorten(_compact(event.arguments), 200)}"))
            self.set_status(f"running tool {event.name}")
        elif isinstance(event, ev.ApprovalDecided):
            if event.outcome.startswith("allow"):
                self.set_status(f"running tool {event.name}")
        elif isinstance(event, ev.ToolResult):
            if not self.quiet:
                label = "[tool error]" if event.is_error else "[tool result]"
                self.line(self.style.dim(f"{label} {shorten(event.content, 200)}"))
            else:
                self.clear_status()
        elif isinstance(event, ev.StepEnd):
            self.clear_status()
        elif isinstance(event, ev.TurnEnd):
            self.break_line()
