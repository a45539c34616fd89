"""Fixtures: a harness with an in-memory store and a scripted model."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from .._harness import Harness
from ..model._scripted import ScriptedModel
from ._harness import open_test_harness


@pytest.fixture
def scripted_model() -> ScriptedModel:
    """An empty :class:`ScriptedModel`; ``push()`` responses onto it in your test."""
    return ScriptedModel([])


@pytest.fixture
async def harness(scripted_model: ScriptedModel) -> AsyncIterator[Harness]:
    """A harness using ``scripted_model`` and an in-memory store, closed after the test."""
    async with open_test_harness(scripted_model) as opened:
        yield opened
