"""Small helpers shared across the package: a leaf module (it imports nothing from the package).

Each helper is here because two or more modules need the same answer: how an
error reads on one line, how a cancellation is told apart from a failure in an
exception group, what counts as a positive number in a setting.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, TypeGuard

import trio

__all__ = ["describe", "is_positive_int", "is_positive_number", "positive_int", "split_cancelled"]


def split_cancelled(exc: BaseException) -> tuple[BaseException | None, BaseException | None]:
    """Split ``exc`` into (the cancellation part, the rest); either may be None."""
    if isinstance(exc, trio.Cancelled):
        return exc, None
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(trio.Cancelled)
    return None, exc


def describe(exc: BaseException, *, leaf: Callable[[BaseException], str | None] | None = None) -> str:
    """``Type: message`` of an error (``Type`` alone when the message is empty).

    An exception group reads as its leaves, joined by ``"; "``.  ``leaf``, when
    given, renders a leaf its own way; returning None falls back to the default.
    """
    if isinstance(exc, BaseExceptionGroup):
        return "; ".join(describe(inner, leaf=leaf) for inner in exc.exceptions)
    if leaf is not None and (text := leaf(exc)) is not None:
        return text
    message = str(exc)
    return f"{type(exc).__name__}: {message}" if message else type(exc).__name__


def is_positive_int(value: object) -> TypeGuard[int]:
    """Whether ``value`` is an ``int`` above zero (a ``bool`` is not an int here)."""
    return type(value) is int and value > 0


def is_positive_number(value: object, *, finite: bool = False) -> TypeGuard[int | float]:
    """Whether ``value`` is an ``int`` or ``float`` above zero (not a ``bool``, not NaN).

    Infinity counts as positive unless ``finite`` is true.
    """
    if isinstance(value, bool) or not isinstance(value, int | float):
        return False
    return value > 0 and (not finite or math.isfinite(value))


def positive_int(owner: str, *, optional: bool = False) -> Callable[[Any, Any, Any], None]:
    """An attrs validator: the field is a positive int (or None, when ``optional``).

    The error reads ``{owner}.{field} must be a positive int[ or None], got {value!r}``
    (no ``{owner}.`` when ``owner`` is empty).
    """
    prefix = f"{owner}." if owner else ""
    expected = "a positive int or None" if optional else "a positive int"

    def check(instance: Any, attribute: Any, value: Any) -> None:
        if optional and value is None:
            return
        if not is_positive_int(value):
            name = getattr(attribute, "name", "?")
            raise ValueError(f"{prefix}{name} must be {expected}, got {value!r}")

    return check
