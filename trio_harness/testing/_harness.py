"""Opening a harness for tests (no pytest needed)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from .._harness import Harness, open_harness
from ..model._protocol import ModelProvider
from ..model._scripted import ScriptedModel


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
