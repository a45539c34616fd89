"""The model catalog (trio_harness/model/_catalog.py) and ``trio-harness models``."""

from __future__ import annotations

import json

import attrs
import pytest

from trio_harness._cli import main
from trio_harness.model import ModelInfo, ModelSettings, OpenAIProvider, catalog_entry, known_models, resolve_model
from trio_harness.model._context import context_window_for


def test_lookup_by_route_and_snapshot_name() -> None:
    gpt4o = catalog_entry("openai", "gpt-4o")
    assert gpt4o is not None
    assert (gpt4o.context_window, gpt4o.max_output_tokens, gpt4o.images, gpt4o.reasoning) == (
        128_000,
        16_384,
        True,
        False,
    )
    # A dated snapshot is its model's row; the longest name wins.
    assert catalog_entry("openai", "gpt-4o-2024-08-06") is gpt4o
    mini = catalog_entry("openai-responses", "gpt-4o-mini-2024-07-18")
    assert mini is not None
    assert mini.model == "gpt-4o-mini"
    assert catalog_entry("openai-responses", "gpt-5-mini-2025-08-07") == catalog_entry("openai", "gpt-5-mini")
    sonnet = catalog_entry("anthropic", "claude-sonnet-4-5-20250929")
    assert sonnet is not None
    assert (sonnet.model, sonnet.reasoning, sonnet.routes) == ("claude-sonnet-4-5", True, ("anthropic",))
    assert sonnet.settings.max_tokens is not None  # the Messages API requires one
    reasoner = catalog_entry("deepseek", "deepseek-reasoner")
    assert reasoner is not None
    assert (reasoner.images, reasoner.reasoning) == (False, True)


def test_unknown_models_and_routes() -> None:
    assert catalog_entry("openai", "llama3") is None
    assert catalog_entry("openai", "gpt-4oops") is None  # a prefix must end at "-"
    assert catalog_entry("deepseek", "gpt-4o") is None  # another family's model
    assert catalog_entry("scripted", "gpt-4o") is None
    assert known_models("scripted") == ()


def test_known_models() -> None:
    everything = known_models()
    assert {info.family for info in everything} == {"anthropic", "openai", "deepseek"}
    assert known_models("openai") == known_models("openai-responses")
    assert all(info.family == "deepseek" for info in known_models("deepseek"))
    names = [(info.family, info.model) for info in everything]
    assert len(names) == len(set(names))
    for info in everything:
        assert 0 < info.max_output_tokens <= info.context_window
        assert isinstance(info.settings, ModelSettings)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        everything[0].context_window = 1  # type: ignore[misc]
    assert isinstance(everything[0], ModelInfo)


def test_context_windows_come_from_the_catalog() -> None:
    assert context_window_for("gpt-4.1-mini") == 1_047_576
    assert context_window_for("claude-opus-4-1-20250805") == 200_000
    assert context_window_for("llama3") is None
    provider = resolve_model("deepseek:deepseek-reasoner", env={"DEEPSEEK_API_KEY": "k"})
    assert isinstance(provider, OpenAIProvider)
    assert provider.context_window == 128_000
    # A spec's own window wins.
    provider = resolve_model("openai:gpt-4o?context_window=1000", env={"OPENAI_API_KEY": "k"})
    assert getattr(provider, "context_window", None) == 1000


def test_models_command(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["models"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].split() == ["MODEL", "ROUTES", "CONTEXT", "MAX", "OUTPUT", "IMAGES", "REASONING"]
    assert len(lines) == 1 + len(known_models())
    row = next(line for line in lines if line.startswith("gpt-4.1 "))
    assert row.split() == ["gpt-4.1", "openai,openai-responses", "1,047,576", "32,768", "yes", "no"]
    assert main(["models", "--route", "deepseek", "--json"]) == 0
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [record["model"] for record in records] == ["deepseek-chat", "deepseek-reasoner"]
    assert records[1] == {
        "model": "deepseek-reasoner",
        "family": "deepseek",
        "routes": ["deepseek"],
        "context_window": 128_000,
        "max_output_tokens": 65_536,
        "images": False,
        "reasoning": True,
    }
    with pytest.raises(SystemExit) as exited:
        main(["models", "--route", "nope"])
    assert exited.value.code == 2
    assert "invalid choice: 'nope'" in capsys.readouterr().err
