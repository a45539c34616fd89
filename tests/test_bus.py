"""The event bus (``trio_harness._bus``): listeners, wildcard, removal, containment.

A listener that raises is logged and contained (docs/guarantees.rst, "Publication").
"""

from __future__ import annotations

import logging

import attrs
import pytest

from trio_harness._bus import EventBus, Notice


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
