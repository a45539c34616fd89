"""What the harness knows about the models people use: a small table, no prices.

Each :class:`ModelInfo` row gives a model's context window, its longest
output, whether it takes images and whether it reasons, and default settings
a provider applies under its own.  :func:`catalog_entry` finds the row of a
model name as a route names it (``gpt-4o-2024-08-06`` is ``gpt-4o``'s row:
a dated or suffixed snapshot matches the name it starts with, the longest
such name wins); :func:`known_models` lists them (``trio-harness models``,
the ACP model list).

A model not in the table works with stated defaults: no context window
(automatic compaction then starts only when the server reports an overflow,
docs/long-sessions.rst), images sent and left for the server to refuse,
reasoning blocks kept whenever the server returns them.

Prices are not kept here: cost comes from the ``genai-prices`` package
(:mod:`trio_harness.model._cost`), which is maintained upstream.

Sources, read 2025-12 (update the rows when these pages change):
Anthropic, "Models overview" (docs.anthropic.com/en/docs/about-claude/models/overview);
OpenAI, the model pages (platform.openai.com/docs/models/MODEL);
DeepSeek, "Models & Pricing" (api-docs.deepseek.com/quick_start/pricing).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Final

import attrs

from .._records import ModelSettings


@attrs.frozen
class ModelInfo:
    """One known model (a row of the catalog).

    Attributes:
        family: the API family serving it: ``"anthropic"``, ``"openai"``
            (chat completions and Responses) or ``"deepseek"``.
        model: the model name; a snapshot name starting with it and ``-``
            (``gpt-4o-2024-08-06``, ``claude-sonnet-4-5-20250929``) is the same row.
        context_window: the tokens one request may hold (prompt and output).
        max_output_tokens: the most tokens one response may generate.
        images: whether the model takes image input.
        reasoning: whether the model reasons before answering (thinking
            blocks, reasoning items, reasoning tokens).
        settings: defaults a provider applies under its route's settings
            (a request's and a route's settings win over them).
    """

    family: str
    model: str
    context_window: int
    max_output_tokens: int
    images: bool
    reasoning: bool
    settings: ModelSettings = attrs.field(factory=ModelSettings)

    @property
    def routes(self) -> tuple[str, ...]:
        """The spec prefixes that reach this model (``openai`` models: ``openai`` and ``openai-responses``)."""
        return _ROUTES[self.family]


_ROUTES: Final[Mapping[str, tuple[str, ...]]] = {
    "anthropic": ("anthropic",),
    "openai": ("openai", "openai-responses"),
    "deepseek": ("deepseek",),
}

_FAMILY_OF_ROUTE: Final[Mapping[str, str]] = {route: family for family, routes in _ROUTES.items() for route in routes}


def _claude(model: str, context: int, output: int, *, reasoning: bool = True) -> ModelInfo:
    # The Messages API requires max_tokens: a default every request can afford.
    return ModelInfo(
        "anthropic", model, context, output, True, reasoning, ModelSettings(max_tokens=min(output, 16_384))
    )


def _openai(model: str, context: int, output: int, *, images: bool = True, reasoning: bool = False) -> ModelInfo:
    return ModelInfo("openai", model, context, output, images, reasoning)


_TABLE: Final[tuple[ModelInfo, ...]] = (
    # Anthropic (extended thinking on the Claude 3.7 and 4 models)
    _claude("claude-opus-4-5", 200_000, 64_000),
    _claude("claude-opus-4-1", 200_000, 32_000),
    _claude("claude-opus-4", 200_000, 32_000),
    _claude("claude-sonnet-4-5", 200_000, 64_000),
    _claude("claude-sonnet-4", 200_000, 64_000),
    _claude("claude-haiku-4-5", 200_000, 64_000),
    _claude("claude-3-7-sonnet", 200_000, 64_000),
    _claude("claude-3-5-haiku", 200_000, 8_192, reasoning=False),
    # OpenAI
    _openai("gpt-5.1", 400_000, 128_000, reasoning=True),
    _openai("gpt-5", 400_000, 128_000, reasoning=True),
    _openai("gpt-5-mini", 400_000, 128_000, reasoning=True),
    _openai("gpt-5-nano", 400_000, 128_000, reasoning=True),
    _openai("gpt-5-chat-latest", 128_000, 16_384),
    _openai("gpt-4.1", 1_047_576, 32_768),
    _openai("gpt-4.1-mini", 1_047_576, 32_768),
    _openai("gpt-4.1-nano", 1_047_576, 32_768),
    _openai("gpt-4o", 128_000, 16_384),
    _openai("gpt-4o-mini", 128_000, 16_384),
    _openai("gpt-4-turbo", 128_000, 4_096),
    _openai("gpt-3.5-turbo", 16_385, 4_096, images=False),
    _openai("o1", 200_000, 100_000, reasoning=True),
    _openai("o3", 200_000, 100_000, reasoning=True),
    _openai("o3-mini", 200_000, 100_000, images=False, reasoning=True),
    _openai("o4-mini", 200_000, 100_000, reasoning=True),
    # DeepSeek (text only)
    ModelInfo("deepseek", "deepseek-chat", 128_000, 8_192, False, False),
    ModelInfo("deepseek", "deepseek-reasoner", 128_000, 65_536, False, True),
)

_BY_FAMILY: Final[Mapping[str, Mapping[str, ModelInfo]]] = {
    family: {info.model: info for info in _TABLE if info.family == family} for family in _ROUTES
}


def known_models(route: str | None = None) -> tuple[ModelInfo, ...]:
    """The catalog's rows, in table order; only those a route reaches when ``route`` is given.

    Args:
        route: a spec prefix (``"openai"``, ``"openai-responses"``,
            ``"anthropic"``, ``"deepseek"``), or None for every row.

    Returns:
        The rows (empty for a route the catalog does not know).
    """
    if route is None:
        return _TABLE
    family = _FAMILY_OF_ROUTE.get(route)
    return tuple(info for info in _TABLE if info.family == family)


def catalog_entry(provider: str, model: str) -> ModelInfo | None:
    """The catalog row of ``model`` as route ``provider`` names it, or None for a model it does not know.

    ``provider`` is a spec prefix (``"openai-responses"`` finds OpenAI's
    rows); a snapshot name matches the longest row name it starts with
    followed by ``-`` (``gpt-4o-mini-2024-07-18`` is ``gpt-4o-mini``).

    Args:
        provider: the route, e.g. ``"openai"``, ``"anthropic"``.
        model: the model name the route sends.
    """
    family = _FAMILY_OF_ROUTE.get(provider)
    if family is None:
        return None
    return _match(_BY_FAMILY[family], model)


def model_info(model: str) -> ModelInfo | None:
    """The row of ``model`` in any family (for a route that does not say whose model it serves), or None."""
    best: ModelInfo | None = None
    for family in _BY_FAMILY.values():
        found = _match(family, model)
        if found is not None and (best is None or len(found.model) > len(best.model)):
            best = found
    return best


def _match(rows: Mapping[str, ModelInfo], model: str) -> ModelInfo | None:
    exact = rows.get(model)
    if exact is not None:
        return exact
    best: ModelInfo | None = None
    for name, info in rows.items():
        if model.startswith(name + "-") and (best is None or len(name) > len(best.model)):
            best = info
    return best
