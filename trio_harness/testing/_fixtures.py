"""Fixtures: a harness with an in-memory store and a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

import pytest

from .._harness import Harness, open_harness
from ..model._protocol import ModelProvider
from ..model._scripted import ScriptedModel

__all__ = ["harness", "open_test_harness", "scripted_model"]


@asynccontextmanager
async def open_test_harness(
    model: ModelProvider | None = None, *, builtin_tools: bool | Sequence[str] = False, **kwargs: Any
) -> AsyncIterator[Harness]:
    """Open a harness on an in-memory store with a scripted model (empty by default).

    Built-in tools are off unless asked for, so a test sees only its own tools.
    """
    async with open_harness(
        model=model if model is not None else ScriptedModel([]),
        store=kwargs.pop("store", ":memory:"),
        builtin_tools=builtin_tools,
        **kwargs,
    ) as harness:
        yield harness


@pytest.fixture
def scripted_model() -> ScriptedModel:
    """An empty :class:`ScriptedModel`; ``push()`` responses onto it in your test."""
    return ScriptedModel([])


@pytest.fixture
async def harness(scripted_model: ScriptedModel) -> AsyncIterator[Harness]:
    """A harness using ``scripted_model`` and an in-memory store, closed after the test."""
    async with open_test_harness(scripted_model) as opened:
        yield opened
