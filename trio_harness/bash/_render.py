"""The model-facing text of bash output: a finished foreground run, and a background read.

Pure functions over records: no process, no I/O.  The ``bash`` tool returns
:func:`render_result` as a tool result; :meth:`BashProcess.read_output` is
:func:`render_read` of what each stream has new.
"""

from __future__ import annotations

from signal import Signals

from ._output import Taken
from ._records import BashResult


def signal_name(number: int) -> str:
    """``SIGTERM`` for 15; ``signal N`` for a number Python does not name."""
    try:
        return Signals(number).name
    except ValueError:
        return f"signal {number}"


def format_seconds(seconds: float) -> str:
    """``2s``, ``2.5s``: seconds as the markers show them."""
    return f"{seconds:g}s"


def render_result(result: BashResult) -> str:
    """Render a foreground result as text for the model.

    Standard output comes first, then standard error under a ``[stderr]``
    marker line when there is any, then marker lines such as
    ``[exit code: 1]``, ``[killed by signal SIGTERM]`` and
    ``[timed out after 5s]``.  ``(no output)`` stands in for empty output.
    The text is the same whatever the outcome; the ``bash`` tool marks a call
    whose command exited nonzero, was killed by a signal or timed out as
    failed (``is_error``), see :doc:`/bash`.

    Args:
        result: the result of :meth:`BashExecutor.run`.

    Returns:
        The rendered text, without a trailing newline.
    """
    parts: list[str] = []

    def add(text: str) -> None:
        if text:
            parts.append(text if text.endswith("\n") else text + "\n")

    if result.stdout_dropped:
        add(f"[output truncated: {result.stdout_dropped} earlier bytes of stdout not shown]")
    add(result.stdout)
    if result.stderr or result.stderr_dropped:
        add("[stderr]")
        if result.stderr_dropped:
            add(f"[output truncated: {result.stderr_dropped} earlier bytes of stderr not shown]")
        add(result.stderr)
    if not parts:
        add("(no output)")
    if result.exit_code is not None and result.exit_code != 0:
        add(f"[exit code: {result.exit_code}]")
    if result.signal is not None:
        add(f"[killed by signal {signal_name(result.signal)}]")
    if result.timed_out:
        if result.timeout is not None:
            add(f"[timed out after {format_seconds(result.timeout)}]")
        else:
            add("[timed out]")
    return "".join(parts).removesuffix("\n")


def render_read(stdout: Taken, stderr: Taken) -> str:
    """Render what a background read took from each stream.

    New standard output first, then new standard error under a ``[stderr]``
    line (only when there is some).  A stream that lost bytes before being
    read starts with ``[output truncated: N bytes not shown; WHERE]``, WHERE
    naming the spill file that holds it in full.

    Args:
        stdout: what was taken from standard output.
        stderr: what was taken from standard error.

    Returns:
        The text; empty when neither stream has anything new.
    """
    parts: list[str] = []
    if stdout.dropped:
        parts.append(_truncation_line(stdout))
    parts.append(stdout.text)
    if stderr.text or stderr.dropped:
        if stdout.text and not stdout.text.endswith("\n"):
            parts.append("\n")
        parts.append("[stderr]\n")
        if stderr.dropped:
            parts.append(_truncation_line(stderr))
        parts.append(stderr.text)
    return "".join(parts)


def _truncation_line(taken: Taken) -> str:
    return f"[output truncated: {taken.dropped} bytes not shown; {taken.where}]\n"
