"""Which variables of the harness's environment the processes it starts inherit (:class:`EnvPolicy`)."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterable, Mapping
from typing import Any, Final

import attrs

__all__ = ["DEFAULT_ENV_DENY", "EnvPolicy", "to_env_policy"]

DEFAULT_ENV_DENY: Final = (
    "*_API_KEY",
    "*_TOKEN",
    "*_SECRET",
    "*_PASSWORD",
    "AWS_SECRET_ACCESS_KEY",
    "PGPASSWORD",
)
"""The name patterns :class:`EnvPolicy` withholds by default."""


def _as_tuple(value: Any) -> Any:
    """A sequence of patterns as a tuple; anything else as it is, for :func:`_check_patterns` to refuse."""
    return value if isinstance(value, str) or not isinstance(value, Iterable) else tuple(value)


def _check_patterns(instance: object, attribute: attrs.Attribute[tuple[str, ...]], value: object) -> None:
    if not isinstance(value, tuple):
        raise TypeError(f"EnvPolicy.{attribute.name} must be a sequence of name patterns, got {value!r}")
    for item in value:
        if not isinstance(item, str) or not item or "=" in item or "\x00" in item:
            raise ValueError(
                f"EnvPolicy.{attribute.name}: {item!r} is not a variable name pattern "
                "(a non-empty string without '=' or NUL)"
            )


@attrs.frozen
class EnvPolicy:
    """Which variables of the harness's environment a command (or an MCP stdio server) inherits.

    A variable is withheld when its name is in ``hide`` or matches a
    pattern of ``deny``, unless it matches a pattern of ``allow``.
    Patterns are shell-style (``*``, ``?``, ``[...]``, :mod:`fnmatch`) and
    compared without regard to case, so ``*_TOKEN`` also withholds
    ``github_token``.  The policy applies only to what is inherited: variables
    a request or a server configuration sets explicitly are passed as given.

    The harness adds to ``hide`` the variable its model's API key was read
    from (``DEEPSEEK_API_KEY``, ``OPENAI_API_KEY``: ``OpenAIProvider.api_key_env``),
    so the key stays out of commands even with an empty deny list.

    Attributes:
        deny: name patterns withheld (default :data:`DEFAULT_ENV_DENY`:
            ``*_API_KEY``, ``*_TOKEN``, ``*_SECRET``, ``*_PASSWORD``,
            ``AWS_SECRET_ACCESS_KEY``, ``PGPASSWORD``).
        allow: name patterns passed on purpose although ``deny`` or
            ``hide`` names them (``allow=("GITHUB_TOKEN",)``);
            ``deny=(), allow=("*",)`` passes the whole environment.
        hide: exact names always withheld unless allowed.

    Raises:
        TypeError: a field is not a sequence of strings.
        ValueError: a pattern is empty or contains ``=`` or NUL.
    """

    deny: tuple[str, ...] = attrs.field(default=DEFAULT_ENV_DENY, converter=_as_tuple, validator=_check_patterns)
    allow: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple, validator=_check_patterns)
    hide: tuple[str, ...] = attrs.field(default=(), converter=_as_tuple, validator=_check_patterns)
    _deny_upper: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)
    _allow_upper: tuple[str, ...] = attrs.field(init=False, repr=False, eq=False)
    _hide_upper: frozenset[str] = attrs.field(init=False, repr=False, eq=False)
    _verdicts: dict[str, bool] = attrs.field(init=False, factory=dict, repr=False, eq=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_deny_upper", tuple(pattern.upper() for pattern in self.deny))
        object.__setattr__(self, "_allow_upper", tuple(pattern.upper() for pattern in self.allow))
        object.__setattr__(self, "_hide_upper", frozenset(name.upper() for name in self.hide))

    def passes(self, name: str) -> bool:
        """Whether a variable of this name is inherited."""
        verdict = self._verdicts.get(name)
        if verdict is None:
            upper = name.upper()
            if any(fnmatch.fnmatchcase(upper, pattern) for pattern in self._allow_upper):
                verdict = True
            elif upper in self._hide_upper:
                verdict = False
            else:
                verdict = not any(fnmatch.fnmatchcase(upper, pattern) for pattern in self._deny_upper)
            if len(self._verdicts) < 4096:
                self._verdicts[name] = verdict
        return verdict

    def apply(self, environ: Mapping[str, str]) -> dict[str, str]:
        """The variables of ``environ`` this policy passes."""
        return {name: value for name, value in environ.items() if self.passes(name)}

    def hiding(self, names: Iterable[str]) -> EnvPolicy:
        """This policy with ``names`` added to ``hide``."""
        extra = tuple(name for name in names if name not in self.hide)
        return self if not extra else attrs.evolve(self, hide=(*self.hide, *extra))


def to_env_policy(value: EnvPolicy | Mapping[str, Any] | None) -> EnvPolicy:
    """``value`` as a policy: a record as is, a dict of its fields, None for the defaults."""
    if value is None:
        return EnvPolicy()
    if isinstance(value, EnvPolicy):
        return value
    if isinstance(value, Mapping):
        return EnvPolicy(**value)
    raise TypeError(f"env_policy must be an EnvPolicy, a dict of its fields or None, got {value!r}")
