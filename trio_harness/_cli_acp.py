"""The ``acp`` subcommand's bounds: flags for :class:`~trio_harness.acp.AcpServer`'s limits and timeouts."""

from __future__ import annotations

import argparse
import math
from typing import Any


def _positive_seconds(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number of seconds") from None
    if not (math.isfinite(number) and number > 0):
        raise argparse.ArgumentTypeError(f"{value!r} must be a positive number of seconds")
    return number


def _positive_count(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be positive")
    return number


def add_acp_bounds(parser: argparse.ArgumentParser) -> None:
    """The flags ``--fs-timeout``, ``--write-timeout`` and ``--max-sessions`` (docs/cli.rst, "Serving ACP")."""
    parser.add_argument(
        "--fs-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=None,
        help="how long the file tools wait for the editor's answer to one fs/read_text_file or "
        "fs/write_text_file before the call fails (default: 30)",
    )
    parser.add_argument(
        "--write-timeout",
        metavar="SECONDS",
        type=_positive_seconds,
        default=None,
        help="how long writing one message to the client may take; a client that reads none of it "
        "for that long is taken as gone and the server ends as after a disconnect (default: 120)",
    )
    parser.add_argument(
        "--max-sessions",
        metavar="N",
        type=_positive_count,
        default=None,
        help="how many sessions the client may have open at once; one more session/new or "
        "session/load is refused until it closes one (default: 100)",
    )


def acp_bound_options(args: argparse.Namespace) -> dict[str, Any]:
    """The ``AcpServer`` settings the flags set (those not given keep the server's defaults)."""
    names = ("fs_timeout", "write_timeout", "max_sessions")
    return {name: getattr(args, name) for name in names if getattr(args, name) is not None}
