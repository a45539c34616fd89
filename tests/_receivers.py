"""Real receivers the tests start as programs of their own (a proxy, a collector), found by environment variable.

``nox -s tests`` (what CI runs) installs each one in a venv of its own
(``_side_venv`` in noxfile.py) and names its executable in a variable; see
``docs/testing.rst``, "Real receivers".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest


def receiver(variable: str, what: str) -> str:
    """The executable ``variable`` names; a test without it is skipped, saying how to get it, or fails under ``CI``.

    A set variable naming no executable file always fails: that is a broken
    setup, not a missing optional one.
    """
    path = os.environ.get(variable, "")
    if path:
        if not (Path(path).is_file() and os.access(path, os.X_OK)):
            pytest.fail(f"{variable}={path!r}: no executable file there ({what})")
        return path
    message = (
        f"{variable} is not set: it names {what}; `python3 -m nox -s tests` installs it and sets it "
        "(or install it in a venv of its own and set the variable)"
    )
    if os.environ.get("CI"):
        pytest.fail(message + "; with CI set this test fails instead of skipping")
    pytest.skip(message)
