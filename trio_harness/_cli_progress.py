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

:func:`inert` is the one place that makes text from the model or a tool
harmless for a terminal; everything ``run`` and ``sessions`` write to a
terminal goes through it, while output to a file or pipe stays exact
(docs/cli.rst, "What reaches the terminal").
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Final, TextIO

import attrs
import trio

from .acp._updates import shorten

if TYPE_CHECKING:
    from .session._events import Event


_ERASE: Final = "\r\x1b[2K"

KEPT_CONTROLS: Final = frozenset("\n\t")
"""The control characters :func:`inert` keeps as they are: newline and tab."""

# C0 controls but newline and tab, DEL, C1 controls; the bidirectional
# embeddings, overrides and isolates and the invisible direction marks (they
# reorder what is shown: "Trojan source"); lone surrogates (no terminal
# encoding can write them).
_UNSAFE: Final = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    code = ord(match.group())
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}"


def inert(text: str) -> str:
    """``text`` made harmless for a terminal: what could drive it is shown escaped.

    C0 and C1 control characters (escape, carriage return, backspace, bell ...)
    and DEL become ``\\x1b``-style escapes; the bidirectional overrides,
    embeddings, isolates and marks (U+202A-U+202E, U+2066-U+2069, U+200E,
    U+200F, U+061C) and lone surrogates become ``\\u202e``-style escapes.
    Newline and tab (:data:`KEPT_CONTROLS`) and every other character are kept.
    """
    if _UNSAFE.search(text) is None:
        return text
    return _UNSAFE.sub(_escape, text)


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


RESULT_HEAD: Final = 15
"""A tool result longer than ``RESULT_HEAD + RESULT_TAIL + 1`` lines shows its first ``RESULT_HEAD`` lines ..."""
RESULT_TAIL: Final = 5
"""... and its last ``RESULT_TAIL`` lines, with a line counting what was left out between them."""
RESULT_WIDTH: Final = 300
"""A tool result's line longer than this is cut, with a count of the characters left out."""


def _cut_line(line: str) -> str:
    if len(line) <= RESULT_WIDTH:
        return line
    return f"{line[:RESULT_WIDTH]}… ({len(line) - RESULT_WIDTH} more characters)"


def result_lines(label: str, content: str) -> list[str]:
    """How ``run`` shows a tool result: ``label`` and, for one line, the line beside it; else each line indented.

    Lines are cut at :data:`RESULT_WIDTH` characters and a long result to its
    first :data:`RESULT_HEAD` and last :data:`RESULT_TAIL` lines, each cut
    saying how much it left out.
    """
    lines = content.removesuffix("\n").split("\n")
    if len(lines) == 1:
        return [f"{label} {_cut_line(lines[0])}".rstrip()]
    if len(lines) > RESULT_HEAD + RESULT_TAIL + 1:
        hidden = lines[RESULT_HEAD:-RESULT_TAIL]
        left_out = f"… {len(hidden)} more lines ({sum(len(line) + 1 for line in hidden)} characters) not shown"
        lines = [*lines[:RESULT_HEAD], left_out, *lines[-RESULT_TAIL:]]
    return [label, *(f"  {_cut_line(line)}".rstrip() for line in lines)]


def _seconds(remaining: float) -> str:
    """A countdown's remaining wait: whole seconds, rounded up, from one second on."""
    return f"{math.ceil(remaining)}s" if remaining >= 1 else f"{max(remaining, 0):.1f}s"


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
        inert_out: ``out`` is a terminal: pass the model's text through :func:`inert`.
        inert_err: ``err`` is a terminal: pass what came from the model or a
            tool through :func:`inert` (see :meth:`show`).
    """

    out: TextIO
    err: TextIO
    style: Style = Style()
    status: bool = False
    quiet: bool = False
    show_reasoning: bool = False
    max_retries: int | None = None
    inert_out: bool = False
    inert_err: bool = False
    mid_line: bool = False
    _reasoning_mid_line: bool = False
    _status_text: str | None = None
    # The retry being waited for: (its status text without the wait, when the wait ends on Trio's clock).
    _retry: tuple[str, float] | None = None

    def show(self, text: str) -> str:
        """``text`` (from the model or a tool) as it may be written to ``err``: inert on a terminal."""
        return inert(text) if self.inert_err else text

    # ------------------------------------------------------------ status line

    def set_status(self, text: str) -> None:
        """Show ``text`` as the status line (replacing the previous one)."""
        self._retry = None
        self._draw_status(text)

    def _draw_status(self, text: str) -> None:
        if not self.status or text == self._status_text:
            return
        self.break_line()
        self.err.write(_ERASE + self.style.dim(f"… {shorten(self.show(text), 100)}"))
        self.err.flush()
        self._status_text = text

    def tick(self) -> None:
        """Redraw a retry's countdown (``run`` calls this a few times a second)."""
        if self._retry is not None and self._status_text is not None:
            text, until = self._retry
            self._draw_status(f"{text} in {_seconds(until - trio.current_time())}")

    def clear_status(self) -> None:
        """Erase the status line, if one is drawn."""
        self._retry = None
        if self._status_text is not None:
            self.err.write(_ERASE)
            self.err.flush()
            self._status_text = None

    # ------------------------------------------------------------ output

    def break_line(self) -> None:
        """End a partly written answer or reasoning line, so the next line starts clean."""
        if self._status_text is not None:
            self.err.write(_ERASE)
            self.err.flush()
            self._status_text = None
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
                    self.err.write(self.style.dim(self.show(event.text)))
                    self.err.flush()
                    self._reasoning_mid_line = not event.text.endswith("\n")
                else:
                    self.set_status("thinking")
                return
            self.clear_status()
            if self._reasoning_mid_line:
                self.break_line()
            self.out.write(inert(event.text) if self.inert_out else event.text)
            self.out.flush()
            self.mid_line = not event.text.endswith("\n")
        elif isinstance(event, ev.RequestRetry):
            # The reason first, then the wait, counted down by tick().
            of = f" of {self.max_retries}" if self.max_retries is not None else ""
            # The reason is cut so that the status line always shows the countdown.
            reason = f"{shorten(event.failure.message, 60)} ({shorten(event.failure.code, 12)})"
            text = f"{reason}: retry {event.attempt}{of}"
            self.set_status(f"{text} in {_seconds(event.delay)}")
            self._retry = (text, trio.current_time() + event.delay)
        elif isinstance(event, ev.ToolCallRequested):
            if not self.quiet:
                self.line(self.style.tool(self.show(f"[tool] {event.name} {shorten(_compact(event.arguments), 200)}")))
            self.set_status(f"running tool {event.name}")
        elif isinstance(event, ev.ApprovalDecided):
            if event.outcome.startswith("allow"):
                self.set_status(f"running tool {event.name}")
        elif isinstance(event, ev.ToolResult):
            if event.name == "todo_write" and not event.is_error:
                # The plan, whole, even with --quiet: the todo_write result after its first line.
                self.break_line()
                for line in ["[plan]", *(f"  {line}" for line in event.content.split("\n")[1:])]:
                    print(self.style.tool(self.show(line)), file=self.err)
                self.err.flush()
            elif not self.quiet:
                label = "[tool error]" if event.is_error else "[tool result]"
                self.break_line()
                for line in result_lines(label, self.show(event.content)):
                    print(self.style.dim(line), file=self.err)
                self.err.flush()
            else:
                self.clear_status()
        elif isinstance(event, ev.StepEnd):
            self.clear_status()
        elif isinstance(event, ev.TurnEnd):
            self.break_line()
