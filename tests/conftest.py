"""Test configuration: the project's own testing kit provides the fixtures.

Tests marked ``@pytest.mark.slow`` (exhaustive ones that take tens of seconds)
run only with ``--run-slow``; ``nox -s tests``, the command CI runs, always
passes it (see ``docs/testing.rst``, "The project's own test suite").
"""

from __future__ import annotations

import pytest

pytest_plugins = ["trio_harness.testing"]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--run-slow", action="store_true", default=False, help="also run the tests marked slow")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "slow: an exhaustive test that takes tens of seconds; needs --run-slow")


def pytest_runtest_setup(item: pytest.Item) -> None:
    if item.get_closest_marker("slow") is not None and not item.config.getoption("--run-slow"):
        pytest.skip("slow test: run with --run-slow (nox -s tests does)")
