"""Cost in US dollars from the optional ``genai-prices`` price table (the ``cost`` extra).

``nox -s tests`` installs the extra, so these run with it (a missing extra fails
the import here rather than skipping); the last test simulates its absence.
"""

from __future__ import annotations

import datetime
import sys
from decimal import Decimal

import genai_prices
import pytest
import trio
from _sse_server import DONE, Stream, sse_finish, sse_text, sse_usage, start_server

from trio_harness import ScriptedModel
from trio_harness.model import OpenAIProvider, UsageTotals, resolve_model, usage_cost
from trio_harness.model._cost import price_route
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness


def reference(usage: UsageTotals, model: str, provider: str) -> Decimal:
    """The price table's own answer for the same tokens."""
    tokens = genai_prices.Usage(
        input_tokens=usage.input_tokens, cache_read_tokens=usage.cache_hit_tokens, output_tokens=usage.output_tokens
    )
    price = genai_prices.calc_price(tokens, model, provider_id=provider).total_price
    assert isinstance(price, Decimal)
    return price


def test_known_pairs_have_a_cost_and_unknown_ones_none() -> None:
    usage = UsageTotals(input_tokens=1_000_000, output_tokens=1_000_000, cache_hit_tokens=0)
    assert usage_cost(usage, "gpt-4o", provider="openai") == Decimal("12.50")
    cached = UsageTotals(input_tokens=1_000_000, cache_hit_tokens=1_000_000)
    assert usage_cost(cached, "gpt-4o", provider="openai") == Decimal("1.25")  # all at the cache-read rate
    assert usage_cost(usage, "deepseek-chat", provider="deepseek") == reference(usage, "deepseek-chat", "deepseek")
    assert usage_cost(usage, "no-such-model", provider="openai") is None
    assert usage_cost(usage, "gpt-4o", provider="no-such-provider") is None
    assert usage_cost(usage, "m", api_url="http://127.0.0.1:9/v1") is None  # a local endpoint: unknown prices
    assert usage_cost(usage, "gpt-4o", api_url="https://api.openai.com/v1") == Decimal("12.50")
    assert usage_cost(None, "gpt-4o", provider="openai") is None


def test_routes_name_the_price_tables_provider() -> None:
    deepseek = resolve_model("deepseek:deepseek-chat", env={"DEEPSEEK_API_KEY": "k"})
    assert price_route(deepseek) == ("deepseek", None)
    local = OpenAIProvider(model="m", base_url="http://127.0.0.1:9/v1")
    assert price_route(local) == (None, "http://127.0.0.1:9/v1")
    assert price_route(ScriptedModel([])) == (None, None)


async def test_turn_and_session_usage_report_their_cost(nursery: trio.Nursery) -> None:
    def answer(text: str) -> Stream:
        return Stream([sse_text(text), sse_finish("stop"), sse_usage(120_000, 3_000), DONE])

    server = await start_server(nursery, answer("one"), answer("two"))
    # a loopback server standing in for DeepSeek: the route's name says whose prices apply
    provider = OpenAIProvider(
        model="deepseek-chat", base_url=server.base_url, api_key="k", max_retries=0, name="deepseek:deepseek-chat"
    )
    async with provider, open_test_harness(provider) as h, h.agents.open() as agent:
        first = await agent.run("one?")
        second = await agent.run("two?")
        ends = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
        session = agent.cost
        turn_cost = agent.cost_of(ends[0].usage)
        assert agent.usage == UsageTotals(input_tokens=240_000, output_tokens=6_000, requests=2)
    expected_turn = reference(UsageTotals(input_tokens=120_000, output_tokens=3_000), "deepseek-chat", "deepseek")
    assert first.cost == second.cost == turn_cost == expected_turn > 0
    assert session == reference(UsageTotals(input_tokens=240_000, output_tokens=6_000), "deepseek-chat", "deepseek")


async def test_a_model_without_prices_reports_no_cost() -> None:
    async with open_test_harness(ScriptedModel([{"text": "hi"}])) as h, h.agents.open() as agent:
        result = await agent.run("hello")
        assert result.cost is None and agent.cost is None and agent.usage.requests == 1


async def test_without_genai_prices_cost_is_none_not_an_error(monkeypatch: pytest.MonkeyPatch) -> None:
    # Simulates the extra not being installed: importing it fails.
    monkeypatch.setitem(sys.modules, "genai_prices", None)
    usage = UsageTotals(input_tokens=1_000, output_tokens=1_000)
    assert usage_cost(usage, "gpt-4o", provider="openai") is None
    model = ScriptedModel([{"text": "hi"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("hello")
        assert result.cost is None and agent.cost is None and agent.cost_of(agent.usage) is None


@pytest.mark.parametrize("hour", [4, 17])  # DeepSeek's standard and off-peak hours (UTC)
async def test_cost_is_priced_at_the_time_of_the_turn_not_when_it_is_asked(nursery: trio.Nursery, hour: int) -> None:
    when = datetime.datetime(2026, 3, 2, hour, 30, tzinfo=datetime.UTC)
    server = await start_server(nursery, Stream([sse_text("one"), sse_finish("stop"), sse_usage(1_000_000, 0), DONE]))
    provider = OpenAIProvider(
        model="deepseek-chat", base_url=server.base_url, api_key="k", max_retries=0, name="deepseek:deepseek-chat"
    )
    async with provider, open_test_harness(provider, clock=when.timestamp) as h, h.agents.open() as agent:
        result = await agent.run("one?")
        session = agent.cost
    tokens = genai_prices.Usage(input_tokens=1_000_000, output_tokens=0)
    expected = genai_prices.calc_price(tokens, "deepseek-chat", provider_id="deepseek", genai_request_timestamp=when)
    assert result.cost == session == expected.total_price
    other = when.replace(hour=(hour + 12) % 24)
    elsewhen = genai_prices.calc_price(tokens, "deepseek-chat", provider_id="deepseek", genai_request_timestamp=other)
    assert elsewhen.total_price != expected.total_price  # the time matters for this model


async def test_run_loads_the_price_table_in_a_worker_thread_once(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first import of the table takes ~0.3 s: run() does it off the Trio thread, and only once."""
    import threading

    from trio_harness.model import _cost

    threads: list[threading.Thread] = []
    load = _cost._load

    def observed() -> bool:
        threads.append(threading.current_thread())
        return load()

    monkeypatch.setattr(_cost, "_loaded", None)
    monkeypatch.setattr(_cost, "_load", observed)
    async with open_test_harness(ScriptedModel([{"text": "a"}, {"text": "b"}])) as h, h.agents.open() as agent:
        await agent.run("one")
        await agent.run("two")
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert _cost._loaded is True


async def test_load_prices_says_when_the_extra_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_harness.model import _cost, load_prices

    monkeypatch.setitem(sys.modules, "genai_prices", None)
    monkeypatch.setattr(_cost, "_loaded", None)
    assert await load_prices() is False
    assert await load_prices() is False
