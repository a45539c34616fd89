"""The leaf helpers (``trio_harness._util``): one answer for what several modules ask alike."""

from __future__ import annotations

import math

import attrs
import pytest
import trio

from trio_harness._util import describe, is_positive_int, is_positive_number, positive_int, split_cancelled


def test_describe_names_the_type_and_lists_the_leaves_of_a_group() -> None:
    assert describe(ValueError("bad")) == "ValueError: bad"
    assert describe(RuntimeError()) == "RuntimeError"
    group = ExceptionGroup("many", [KeyError("k"), ExceptionGroup("inner", [OSError("disk")])])
    assert describe(group) == "KeyError: 'k'; OSError: disk"


def test_describe_renders_leaves_its_callers_way() -> None:
    group = ExceptionGroup("many", [KeyError("k"), OSError("disk")])
    assert describe(group, leaf=lambda exc: "gone" if isinstance(exc, OSError) else None) == "KeyError: 'k'; gone"


async def test_split_cancelled_separates_a_cancellation_from_the_failures() -> None:
    failure = ValueError("x")
    assert split_cancelled(failure) == (None, failure)
    with trio.CancelScope() as cancel_scope:
        cancel_scope.cancel()
        with pytest.raises(trio.Cancelled) as caught:
            await trio.sleep(1)
    cancelled = caught.value
    assert split_cancelled(cancelled) == (cancelled, None)
    part, rest = split_cancelled(BaseExceptionGroup("both", [cancelled, failure]))
    assert isinstance(part, BaseExceptionGroup) and part.exceptions == (cancelled,)
    assert isinstance(rest, BaseExceptionGroup) and rest.exceptions == (failure,)


@pytest.mark.parametrize("value", [1, 10**20])
def test_positive_ints(value: object) -> None:
    assert is_positive_int(value)


@pytest.mark.parametrize("value", [0, -1, True, 1.0, "1", None])
def test_not_positive_ints(value: object) -> None:
    assert not is_positive_int(value)


@pytest.mark.parametrize(
    ("value", "finite", "expected"),
    [
        (1, False, True),
        (0.5, False, True),
        (math.inf, False, True),
        (math.inf, True, False),
        (0, False, False),
        (-1.0, False, False),
        (math.nan, False, False),
        (True, False, False),
        ("1", False, False),
    ],
)
def test_positive_numbers(value: object, finite: bool, expected: bool) -> None:
    assert is_positive_number(value, finite=finite) is expected


def test_the_positive_int_validator_names_the_owner_and_the_field() -> None:
    @attrs.frozen
    class Limits:
        count: int = attrs.field(validator=positive_int("Limits"))
        cap: int | None = attrs.field(default=None, validator=positive_int("Limits", optional=True))

    assert Limits(3).cap is None
    with pytest.raises(ValueError, match=r"^Limits\.count must be a positive int, got 0$"):
        Limits(0)
    with pytest.raises(ValueError, match=r"^Limits\.cap must be a positive int or None, got True$"):
        Limits(1, True)
