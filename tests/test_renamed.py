"""Names renamed in this release: the old ones still resolve, with a warning naming the new one."""

from __future__ import annotations

import importlib

import pytest

import trio_harness
from trio_harness.session import JsonlStore, MemoryStore, PostgresStore, SessionRegistry, SessionStore
from trio_harness.testing import open_test_harness

# The old names, kept for one release, are what the rest of this file tests.
RENAMED = [
    ("trio_harness", "BashOptions", "trio_harness.BashRuntimeOptions"),
    ("trio_harness", "TaskOptions", "trio_harness.TaskRuntimeOptions"),
    ("trio_harness", "MemoryPersistence", "trio_harness.MemoryStore"),
    ("trio_harness", "JsonlPersistence", "trio_harness.JsonlStore"),
    ("trio_harness.session", "SessionPersistence", "trio_harness.session.SessionStore"),
    ("trio_harness.session", "MemoryPersistence", "trio_harness.session.MemoryStore"),
    ("trio_harness.session", "JsonlPersistence", "trio_harness.session.JsonlStore"),
    ("trio_harness.session", "PostgresPersistence", "trio_harness.session.PostgresStore"),
    ("trio_harness.bash", "BashOptions", "trio_harness.bash.BashRuntimeOptions"),
    ("trio_harness.tasks", "TaskOptions", "trio_harness.tasks.TaskRuntimeOptions"),
]


def _resolve(dotted: str) -> object:
    module, _, name = dotted.rpartition(".")
    return getattr(importlib.import_module(module), name)


@pytest.mark.parametrize(("module", "old", "new"), RENAMED)
def test_an_old_name_warns_and_resolves_to_the_new_object(module: str, old: str, new: str) -> None:
    with pytest.warns(DeprecationWarning, match=rf"^{module}\.{old} was renamed to {new};") as caught:
        value = getattr(importlib.import_module(module), old)
    assert value is _resolve(new)
    assert caught[0].filename == __file__  # the warning points at the caller


def test_from_import_of_an_old_name_warns_too() -> None:
    with pytest.warns(DeprecationWarning, match="trio_harness.session.MemoryStore"):
        from trio_harness.session import MemoryPersistence  # type: ignore[attr-defined]
    assert MemoryPersistence is MemoryStore


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'trio_harness' has no attribute 'NoSuchName'"):
        trio_harness.NoSuchName  # type: ignore[attr-defined]  # noqa: B018


async def test_the_harness_sessions_are_a_session_registry() -> None:
    async with open_test_harness(builtin_tools=False) as h:
        assert isinstance(h.sessions, SessionRegistry)
        assert isinstance(h.sessions.persistence, MemoryStore)


def _as_stores(memory: MemoryStore, jsonl: JsonlStore, postgres: PostgresStore) -> list[SessionStore]:
    return [memory, jsonl, postgres]  # mypy checks that each one satisfies the protocol


@pytest.mark.parametrize("store", [MemoryStore, JsonlStore, PostgresStore])
def test_each_store_has_every_member_of_the_session_store_protocol(store: type) -> None:
    members = [name for name in vars(SessionStore) if not name.startswith("_")]
    assert {"check", "exists", "list", "load", "open_writer", "resume", "save"} <= set(members)
    missing = [name for name in members if not hasattr(store, name)]
    assert missing == [], f"{store.__name__} lacks {missing}"
