"""Developer tasks: ``nox -s tests``, ``lint``, ``typecheck``, ``examples``, ``docs``, ``bench``."""

from __future__ import annotations

import os
import time
from collections.abc import Sequence
from pathlib import Path

import nox

nox.options.default_venv_backend = "venv"
nox.options.reuse_existing_virtualenvs = True
nox.options.sessions = ["lint", "typecheck", "tests"]

ROOT = Path(__file__).parent
PYPROJECT = nox.project.load_toml(ROOT / "pyproject.toml")


def _install(session: nox.Session, *groups: str, extras: str = "") -> None:
    requirements: list[str] = []
    for group in groups:
        requirements += nox.project.dependency_groups(PYPROJECT, group)
    session.install("-e", f".[{extras}]" if extras else ".", *requirements)


LITELLM = ("litellm[proxy]==1.108.7",)
PHOENIX = ("arize-phoenix==20.26.1",)  # the OTLP receiver of tests/test_telemetry_phoenix.py
"""LiteLLM's proxy, a real server for the provider tests (tests/test_anthropic_litellm.py)."""


def _side_venv(session: nox.Session, name: str, requirements: Sequence[str]) -> Path:
    """A virtual environment of its own, ``.nox/side-NAME``, holding ``requirements``; its path.

    For a real receiver the tests start as a separate program (a proxy, a
    collector) whose package pins too many others to share the tests' venv.
    It is built once, with the session's pip (``pip --python``), and reused
    while ``requirements`` stay the same (they are recorded in the venv); a
    change, or an install that did not finish, builds it again from scratch.
    Pin exact versions: the tests are written against one receiver's behaviour.
    """
    venv = ROOT / ".nox" / f"side-{name}"
    record = venv / "trio-harness-requirements.txt"
    wanted = "".join(f"{requirement}\n" for requirement in requirements)
    if record.is_file() and record.read_text() == wanted:
        session.log(f"side venv {name}: reusing {venv}")
        return venv
    started = time.monotonic()
    session.run("python", "-m", "venv", "--clear", "--without-pip", str(venv))
    session.run("python", "-m", "pip", "--python", str(venv / "bin" / "python"), "install", *requirements)
    record.write_text(wanted)
    session.log(f"side venv {name}: built in {time.monotonic() - started:.0f} s")
    return venv


@nox.session
def tests(session: nox.Session) -> None:
    """Run the whole test suite, the slow exhaustive tests included (``--run-slow``).

    This is the command CI runs (``.ci/run``); plain ``pytest`` skips the tests
    marked slow, for a quick loop while working.  The real receivers some tests
    talk to get venvs of their own (``_side_venv``), named to the tests by
    environment variables.
    """
    _install(session, "tests", extras="cost")  # the cost extra: tests/test_cost.py prices real usage
    litellm = _side_venv(session, "litellm", LITELLM)
    phoenix = _side_venv(session, "phoenix", PHOENIX)
    env = {
        "TRIO_HARNESS_LITELLM": str(litellm / "bin" / "litellm"),
        "TRIO_HARNESS_PHOENIX": str(phoenix / "bin" / "phoenix"),
    }
    session.run("pytest", "--run-slow", *session.posargs, env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (with the ASYNC rules), the format check and the import layers (import-linter)."""
    _install(session, "lint")  # lint-imports reads the installed package's import graph
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("lint-imports")


@nox.session
def typecheck(session: nox.Session) -> None:
    """mypy --strict over the package, tests, examples, benchmarks and this file."""
    _install(session, "typecheck", extras="cost")  # trio_harness/model/_cost.py and its tests import genai_prices
    session.run("mypy")


@nox.session
def examples(session: nox.Session) -> None:
    """Run every example offline (scripted model), each with a timeout."""
    # The postgres extra: examples/postgres_workers.py (it says why it is skipped when no server is installed).
    session.install("-e", ".[postgres]")
    scripts = sorted((ROOT / "examples").glob("*.py"))
    if not scripts:
        session.error("no examples found")
    for script in scripts:
        session.log(f"--- {script.name}")
        session.run("timeout", "60", "python", str(script), external=True)


@nox.session
def docs(session: nox.Session) -> None:
    """Build the documentation with warnings as errors."""
    _install(session, "docs")
    session.run("sphinx-build", "-W", "--keep-going", "-b", "html", "docs", "docs/_build/html")


@nox.session
def bench(session: nox.Session) -> None:
    """Run the benchmarks and print a table of figures against their targets."""
    _install(session, "bench")
    env = {"PYTHONHASHSEED": "0"}
    session.run("python", "bench/run.py", *session.posargs, env=env)


if os.environ.get("CI"):
    nox.options.error_on_missing_interpreters = True
