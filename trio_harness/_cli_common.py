"""What the ``trio-harness`` subcommands share: exit codes, the program name, error lines, store names."""

from __future__ import annotations

import datetime
import json
import os
import sys
from pathlib import Path
from typing import Final

PROG: Final = "trio-harness"

EXIT_OK: Final = 0
EXIT_FAILED: Final = 1
EXIT_USAGE: Final = 2
EXIT_LIMIT: Final = 3
EXIT_INTERRUPTED: Final = 130


def _store_name(store: str | Path) -> str:
    """The store for a message: a directory as given, a URL without its password."""
    if isinstance(store, Path):
        return str(store.expanduser().resolve())
    from .session._postgres import redact_dsn

    return redact_dsn(store)


def _error(message: str) -> None:
    from ._cli_progress import Style, inert, use_colour

    if sys.stderr.isatty():  # a failure's message may carry a provider's or a tool's text
        message = inert(message)
    label = Style(use_colour(sys.stderr, os.environ)).error("error:")
    print(f"{PROG}: {label} {message}", file=sys.stderr, flush=True)


def _store_is_not_a_directory(store: str | Path) -> bool:
    """Report (one line) a ``--store`` that exists but is not a directory (a URL is not checked here)."""
    if isinstance(store, Path) and store.exists() and not store.is_dir():
        _error(f"the session store {str(store)!r} is not a directory; pass --store DIR naming a directory")
        return True
    return False


def _shorten(text: str, limit: int) -> str:
    from .acp._updates import shorten

    return shorten(text, limit)


def _local_time(timestamp: float) -> str:
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def _compact_arguments(arguments: str) -> str:
    try:
        parsed = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return arguments
    return json.dumps(parsed, ensure_ascii=False)
