"""Opening a harness for tests (no pytest needed)."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

from .._harness import Harness, open_harness
from ..model._protocol import ModelProvider
from ..model._scripted import ScriptedModel
from ..session._jsonl import JsonlStore


@asynccontextmanager
async def open_test_harness(
    model: ModelProvider | None = None, *, builtin_tools: bool | Sequence[str] = False, **kwargs: Any
) -> AsyncIterator[Harness]:
    """Open a harness on an in-memory store with a scripted model (empty by default).

    Built-in tools are off unless asked for, so a test sees only its own tools.
    A directory given as ``store`` is a :class:`~trio_harness.session.JsonlStore`
    that fsyncs on the loop's thread (``inline_fsync=True``): it uses no worker
    thread, so under a mock clock (``autojump_clock``) Trio time does not jump
    while a write is under way (docs/testing.rst, "Deterministic time").
    """
    store = kwargs.pop("store", ":memory:")
    if (
        isinstance(store, str | os.PathLike)
        and os.fspath(store) != ":memory:"
        and not (isinstance(store, str) and store.startswith(("postgresql://", "postgres://")))
    ):
        store = JsonlStore(Path(store), inline_fsync=True)
    async with open_harness(
        model=model if model is not None else ScriptedModel([]),
        store=store,
        builtin_tools=builtin_tools,
        **kwargs,
    ) as harness:
        yield harness
