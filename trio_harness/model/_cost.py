"""Cost in US dollars of model usage, from the ``genai-prices`` price table when it is installed.

The price table is an optional extra (``pip install trio-harness[cost]``):
without it every cost is None, never an error.  Prices are looked up by
provider and model (docs/long-sessions.rst, "Usage and budgets").
"""

from __future__ import annotations

import datetime
from decimal import Decimal

import trio

from .._records import UsageTotals

# Whether the price table is loaded (True), not installed (False), or not tried yet (None).
_loaded: bool | None = None


def _load() -> bool:
    """Import the price table and build its indexes (a few hundred milliseconds, once per process)."""
    try:
        import genai_prices
    except ImportError:
        return False
    try:  # the first lookup builds what later ones reuse
        genai_prices.calc_price(genai_prices.Usage(input_tokens=1, output_tokens=1), "gpt-4o", provider_id="openai")
    except LookupError:
        pass
    return True


async def load_prices() -> bool:
    """Load the ``genai-prices`` table in a worker thread, once; returns whether it is installed.

    Importing the table takes a few hundred milliseconds, which the first
    :func:`usage_cost` would otherwise spend on the Trio thread, stalling
    every task.  :meth:`Agent.run <trio_harness.agents.Agent.run>` and the ACP server call this
    first; call it yourself before the first ``agent.cost`` or ``cost_of``.
    A cancelled load goes on in its thread and is finished by the next call
    or lookup.
    """
    global _loaded
    if _loaded is None:
        _loaded = await trio.to_thread.run_sync(_load, abandon_on_cancel=True)
    else:
        await trio.lowlevel.checkpoint()
    return _loaded


def usage_cost(
    usage: UsageTotals | None,
    model: str,
    *,
    provider: str | None = None,
    api_url: str | None = None,
    at: datetime.datetime | None = None,
) -> Decimal | None:
    """The cost of ``usage`` in US dollars at ``model``'s prices, or None when it is not known.

    Args:
        usage: token totals (input tokens include the cache hits, which are
            priced at the cache-read rate where the model has one).
        model: the model name, e.g. ``"deepseek-chat"``.
        provider: the price table's provider id (``"openai"``,
            ``"deepseek"`` ...); None lets it match the model alone, or
            ``api_url``.
        api_url: the endpoint's base URL, matched against the known providers'.
        at: when the requests were made (prices can depend on the time:
            off-peak rates, price changes); None means now.

    Returns:
        The price, or None when ``genai-prices`` is not installed, ``usage``
        is None, or the provider and model are not in its table.  Totals over
        several requests are priced as one request, so a model whose price
        depends on the size of each request is approximated.
    """
    if usage is None or not model:
        return None
    try:
        import genai_prices
    except ImportError:
        return None
    tokens = genai_prices.Usage(
        input_tokens=usage.input_tokens,
        cache_read_tokens=min(usage.cache_hit_tokens, usage.input_tokens),
        cache_write_tokens=min(usage.cache_write_tokens, max(usage.input_tokens - usage.cache_hit_tokens, 0)),
        output_tokens=usage.output_tokens,
    )
    try:
        if api_url is not None:
            price = genai_prices.calc_price(tokens, model, provider_api_url=api_url, genai_request_timestamp=at)
        else:
            price = genai_prices.calc_price(tokens, model, provider_id=provider, genai_request_timestamp=at)
    except LookupError:
        return None  # not in the table: unknown, not an error
    total = price.total_price
    return total if isinstance(total, Decimal) else Decimal(str(total))


def price_route(provider: object) -> tuple[str | None, str | None]:
    """The price table's (provider id, API URL) for a model provider, from its route name.

    A named route (``deepseek:deepseek-chat``, ``openai:gpt-4o``) gives its
    prefix; a route to a custom endpoint (``openai:MODEL@URL``) gives the URL,
    which prices only when it is a known provider's.
    """
    name = getattr(provider, "name", "")
    if not isinstance(name, str) or ":" not in name:
        return None, None
    prefix, _, rest = name.partition(":")
    if "@" in rest:
        url = getattr(provider, "base_url", None)
        return None, url if isinstance(url, str) else rest.partition("@")[2]
    return prefix, None
