"""Old names kept importable for one release, with a :exc:`DeprecationWarning` naming the new one.

A public package that renamed something gives itself a module ``__getattr__``
(as :mod:`trio`'s ``_deprecate`` does), hidden from type checkers so that new
code is only ever checked against the new names::

    if not TYPE_CHECKING:
        __getattr__ = renamed(__name__, {"OldName": ("trio_harness.NewName", NewName)})

The list of renamed names is in docs/sessions.rst, "Renamed in this release".
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping


def renamed(module: str, aliases: Mapping[str, tuple[str, object]]) -> Callable[[str], object]:
    """A module ``__getattr__`` that resolves each old name of ``aliases`` to its new object, warning.

    Args:
        module: the module's ``__name__``.
        aliases: old name -> (the new name as users should write it, the object).
    """

    def __getattr__(name: str) -> object:
        try:
            new_name, value = aliases[name]
        except KeyError:
            raise AttributeError(f"module {module!r} has no attribute {name!r}") from None
        warnings.warn(
            f"{module}.{name} was renamed to {new_name}; the old name goes in the next release",
            DeprecationWarning,
            stacklevel=2,
        )
        return value

    return __getattr__
