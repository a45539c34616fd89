"""Tests of the model-facing text of bash output, from records (no processes).

The executor tests (``test_bash_executor.py``) render results of real runs;
these pin every marker and their order.
"""

from __future__ import annotations

import signal

import pytest

from trio_harness.bash import BashResult
from trio_harness.bash._output import Taken
from trio_harness.bash._render import format_seconds, render_read, render_result, signal_name


def result(
    stdout: str = "",
    stderr: str = "",
    *,
    exit_code: int | None = 0,
    sig: int | None = None,
    timed_out: bool = False,
    stdout_dropped: int = 0,
    stderr_dropped: int = 0,
    timeout: float | None = None,
) -> BashResult:
    return BashResult(stdout, stderr, exit_code, sig, timed_out, stdout_dropped, stderr_dropped, timeout)


# ------------------------------------------------------------------ render_result


def test_render_result_markers() -> None:
    killed = result("partial", exit_code=None, sig=signal.SIGKILL, timed_out=True, timeout=2.5)
    assert render_result(killed) == "partial\n[killed by signal SIGKILL]\n[timed out after 2.5s]"
    only_err = BashResult("", "boom\n", 1, None, False, 0, 0)
    assert render_result(only_err) == "[stderr]\nboom\n[exit code: 1]"


@pytest.mark.parametrize(
    ("given", "text"),
    [
        (result(), "(no output)"),
        (result("a\nb"), "a\nb"),
        (result("a\n\n"), "a\n"),  # one trailing newline is removed, not all
        (result("out\n", "err\n", exit_code=3), "out\n[stderr]\nerr\n[exit code: 3]"),
        (result(exit_code=2), "(no output)\n[exit code: 2]"),
        (result("x", exit_code=None, sig=200), "x\n[killed by signal signal 200]"),
        (result(exit_code=None, timed_out=True), "(no output)\n[timed out]"),
        (
            result(exit_code=None, sig=signal.SIGTERM, timed_out=True, timeout=2.0),
            "(no output)\n[killed by signal SIGTERM]\n[timed out after 2s]",
        ),
    ],
)
def test_render_result_cases(given: BashResult, text: str) -> None:
    assert render_result(given) == text


def test_render_result_truncation_lines() -> None:
    both = result("tail\n", "etail\n", stdout_dropped=10, stderr_dropped=20)
    assert render_result(both) == (
        "[output truncated: 10 earlier bytes of stdout not shown]\n"
        "tail\n"
        "[stderr]\n"
        "[output truncated: 20 earlier bytes of stderr not shown]\n"
        "etail"
    )
    # Standard error that was all dropped still gets its marker; output is not "(no output)".
    lost = result(stderr_dropped=5)
    assert render_result(lost) == "[stderr]\n[output truncated: 5 earlier bytes of stderr not shown]"


def test_signal_name_and_seconds() -> None:
    assert signal_name(signal.SIGTERM) == "SIGTERM"
    assert signal_name(250) == "signal 250"
    assert format_seconds(2.0) == "2s"
    assert format_seconds(0.25) == "0.25s"
    assert format_seconds(600.0) == "600s"


# ------------------------------------------------------------------ render_read


NOTHING = Taken("", 0, "")


@pytest.mark.parametrize(
    ("stdout", "stderr", "text"),
    [
        (NOTHING, NOTHING, ""),
        (Taken("one\n", 0, ""), NOTHING, "one\n"),
        (Taken("out", 0, ""), Taken("err\n", 0, ""), "out\n[stderr]\nerr\n"),
        (Taken("out\n", 0, ""), Taken("err", 0, ""), "out\n[stderr]\nerr"),
        (NOTHING, Taken("err\n", 0, ""), "[stderr]\nerr\n"),
        (
            Taken("€", 9, "full stdout in /tmp/x.stdout"),
            NOTHING,
            "[output truncated: 9 bytes not shown; full stdout in /tmp/x.stdout]\n€",
        ),
        (
            Taken("", 3, "stdout is not kept"),
            Taken("", 4, "the stderr spill file was removed"),
            "[output truncated: 3 bytes not shown; stdout is not kept]\n"
            "[stderr]\n"
            "[output truncated: 4 bytes not shown; the stderr spill file was removed]\n",
        ),
    ],
)
def test_render_read(stdout: Taken, stderr: Taken, text: str) -> None:
    assert render_read(stdout, stderr) == text
