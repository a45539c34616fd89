"""Small helpers the driver, the tool dispatch and the approval gate share."""

from __future__ import annotations

import trio

__all__ = ["describe", "split_cancelled"]


def split_cancelled(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """Split ``exc`` into (the cancellation part, the rest); either may be None."""
    if isinstance(exc, trio.Cancelled):
        return exc, None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)
    return None, exc


def describe(exc: BaseException) -> str:
    """``Type: message`` of an error, listing the leaves of an exception group."""
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(inner) for inner in exc.exceptions)
    return f"{type(exc).__name__}: {exc}"
