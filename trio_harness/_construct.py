"""Objects only the runtime may build: trio's ``NoPublicConstructor``.

A leaf module (it imports nothing of the package), so any layer can use it.
"""

from __future__ import annotations

from typing import Any, NoReturn, TypeVar, final

T = TypeVar("T")


def _public_module(module: str) -> str:
    """``trio_harness.agents`` for ``trio_harness.agents._driver``: the package that exports the class."""
    parts = module.split(".")
    while len(parts) > 1 and parts[-1].startswith("_"):
        parts.pop()
    return ".".join(parts)


@final  # a metaclass nobody derives from
class NoPublicConstructor(type):
    """Metaclass of a class whose instances only the runtime builds.

    ``Cls(...)`` raises :exc:`TypeError` naming the public way to get one
    (the ``public_way`` class keyword); the runtime builds instances with
    ``Cls._create(...)``, which takes the constructor's arguments::

        @attrs.define(eq=False)
        class Scope(metaclass=NoPublicConstructor, public_way="open_scope() or Scope.open_child()"):
            ...

        scope = Scope._create(name="root", parent=None)

    attrs builds a slotted class again from the class's namespace, with the
    same metaclass but without the keyword: the namespace keeps it
    (``_public_way``), so the two combine.
    """

    def __new__(
        mcs, name: str, bases: tuple[type, ...], namespace: dict[str, Any], *, public_way: str | None = None
    ) -> NoPublicConstructor:
        if public_way is not None:
            namespace["_public_way"] = public_way
        return super().__new__(mcs, name, bases, namespace)

    def __call__(cls, *args: object, **kwargs: object) -> NoReturn:
        way = getattr(cls, "_public_way", None)
        hint = f"; get one from {way}" if way else ""
        raise TypeError(f"{_public_module(cls.__module__)}.{cls.__qualname__} has no public constructor{hint}")

    def _create(cls: type[T], *args: Any, **kwargs: Any) -> T:
        """Build an instance (for the runtime's own use)."""
        return super().__call__(*args, **kwargs)  # type: ignore[misc,no-any-return]
