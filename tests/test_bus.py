"""The event bus (``trio_harness._bus``): listeners, wildcard, removal, containment.

A listener that raises is logged and contained (docs/guarantees.rst, "Publication").
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

import attrs
import pytest

import trio_harness
from trio_harness._bus import NOTICES, EventBus, Notice


@attrs.frozen
class Subject:
    """A notice subject: the bus needs only an id."""

    id: str


def test_a_throwing_listener_is_logged_and_the_next_listener_still_runs(
    caplog: pytest.LogCaptureFixture,
) -> None:
    bus = EventBus()
    got: list[str] = []

    def boom(notice: Notice) -> None:
        raise RuntimeError("listener failed")

    bus.on("session/created", boom)
    bus.on("session/created", lambda n: got.append(f"specific {n.subject.id}"))
    bus.on("*", lambda n: got.append(f"wildcard {n.name} {dict(n.data)}"))
    caplog.set_level(logging.ERROR, logger="trio_harness.bus")
    bus.emit("session/created", Subject("s1"), source="startup")
    assert got == ["specific s1", "wildcard session/created {'source': 'startup'}"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1
    assert "session/created" in errors[0].getMessage()
    assert errors[0].exc_info is not None and str(errors[0].exc_info[1]) == "listener failed"


def test_bus_remover_unsubscribes_only_that_listener() -> None:
    bus = EventBus()
    got: list[str] = []
    remove_a = bus.on("x", lambda n: got.append("a"))
    bus.on("x", lambda n: got.append("b"))
    remove_any = bus.on("*", lambda n: got.append("any"))
    bus.emit("x", Subject("s"))
    remove_a()
    remove_a()  # idempotent
    remove_any()
    bus.emit("x", Subject("s"))
    bus.emit("y", Subject("s"))  # nobody listens
    assert got == ["a", "b", "any", "b"]


def test_notice_carries_name_subject_and_data() -> None:
    bus = EventBus()
    got: list[Notice] = []
    bus.on("agent/status", got.append)
    subject = Subject("a")
    bus.emit("agent/status", subject, status="running")
    assert got == [Notice("agent/status", subject, {"status": "running"})]


def _emitted_names() -> tuple[set[str], set[str]]:
    """The notice names the package emits: (literal names, prefixes of f-string names)."""
    names: set[str] = set()
    prefixes: set[str] = set()
    for path in Path(trio_harness.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.args):
                continue
            if node.func.attr not in ("emit", "_emit"):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                names.add(first.value)
            elif isinstance(first, ast.JoinedStr) and isinstance(first.values[0], ast.Constant):
                prefixes.add(str(first.values[0].value))
    return names, prefixes


def test_every_notice_emitted_is_listed_and_every_listed_notice_is_emitted() -> None:
    names, prefixes = _emitted_names()
    assert names and prefixes == {"agent/inbox/"}
    assert names - set(NOTICES) == set()
    for prefix in prefixes:
        assert any(listed.startswith(prefix) for listed in NOTICES), prefix
    unused = {listed for listed in NOTICES if listed not in names and not listed.startswith(tuple(prefixes))}
    assert unused == set()
