"""resolve_model: every spec form, API keys from the environment, bad specs.

open_model: a provider built from a spec is closed when its block, harness or
agent ends (however it ends); a provider object passed in is left open.  The
witness is a real loopback server seeing the client close its kept-alive
connection.
"""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _sse_server import DONE, ScriptedServer, Stream, sse_finish, sse_text, start_server

from trio_harness import AgentOptions, ScriptedModel, open_harness, open_model
from trio_harness._errors import ModelError
from trio_harness.model import ResponseInfo
from trio_harness.model._openai import OpenAIProvider
from trio_harness.model._protocol import (
    Emit,
    Finish,
    ModelProvider,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    UserMessage,
)
from trio_harness.model._spec import DEEPSEEK_BASE_URL, OPENAI_BASE_URL, missing_api_key, resolve_model


def openai_provider(spec: str, env: dict[str, str]) -> OpenAIProvider:
    provider = resolve_model(spec, env=env)
    assert isinstance(provider, OpenAIProvider)
    assert isinstance(provider, ModelProvider)
    return provider


def test_deepseek() -> None:
    provider = openai_provider("deepseek:deepseek-chat", {"DEEPSEEK_API_KEY": "sk-ds"})
    assert provider.model == "deepseek-chat"
    assert provider.base_url == DEEPSEEK_BASE_URL == "https://api.deepseek.com"
    assert provider.url == "https://api.deepseek.com/chat/completions"
    assert provider.api_key == "sk-ds"
    assert provider.name == "deepseek:deepseek-chat"


def test_deepseek_requires_its_key() -> None:
    for env in ({}, {"DEEPSEEK_API_KEY": ""}, {"DEEPSEEK_API_KEY": "  "}, {"OPENAI_API_KEY": "x"}):
        with pytest.raises(ModelError, match="DEEPSEEK_API_KEY"):
            resolve_model("deepseek:deepseek-reasoner", env=env)


@pytest.mark.parametrize(
    ("spec", "env", "missing"),
    [
        ("deepseek:deepseek-chat", {}, "DEEPSEEK_API_KEY"),
        ("deepseek:deepseek-chat", {"DEEPSEEK_API_KEY": "  "}, "DEEPSEEK_API_KEY"),
        ("deepseek:deepseek-chat", {"DEEPSEEK_API_KEY": "k"}, None),
        ("openai:gpt-4o", {}, "OPENAI_API_KEY"),
        ("openai:gpt-4o?temperature=0", {}, "OPENAI_API_KEY"),
        ("openai:m@http://localhost:8000/v1", {}, None),
        ("scripted:x.json", {}, None),
        ("nonsense", {}, None),
    ],
)
def test_missing_api_key_names_the_variable(spec: str, env: dict[str, str], missing: str | None) -> None:
    assert missing_api_key(spec, env=env) == missing


def test_a_provider_without_its_key_can_be_built_on_request() -> None:
    """``require_key=False``: built with no key (``trio-harness acp`` answers the handshake, then asks for it)."""
    provider = resolve_model("deepseek:deepseek-chat", env={}, require_key=False)
    assert isinstance(provider, OpenAIProvider)
    assert provider.api_key is None
    assert provider.base_url == DEEPSEEK_BASE_URL
    with pytest.raises(ModelError, match="DEEPSEEK_API_KEY"):
        resolve_model("deepseek:deepseek-chat", env={})


def test_openai_default_base_url() -> None:
    provider = openai_provider("openai:gpt-4o-mini", {"OPENAI_API_KEY": "sk-oa"})
    assert provider.model == "gpt-4o-mini"
    assert provider.base_url == OPENAI_BASE_URL == "https://api.openai.com/v1"
    assert provider.url == "https://api.openai.com/v1/chat/completions"
    assert provider.api_key == "sk-oa"
    assert provider.name == "openai:gpt-4o-mini"


def test_openai_default_base_url_requires_key() -> None:
    with pytest.raises(ModelError, match="OPENAI_API_KEY"):
        resolve_model("openai:gpt-4o-mini", env={})


@pytest.mark.parametrize(
    ("spec", "model", "base_url"),
    [
        ("openai:llama3@http://localhost:11434/v1", "llama3", "http://localhost:11434/v1"),
        ("openai:Qwen/Qwen2.5-7B@http://10.0.0.5:8000", "Qwen/Qwen2.5-7B", "http://10.0.0.5:8000"),
        ("openai:m@https://gw.example.com/api/v1/", "m", "https://gw.example.com/api/v1/"),
        # An "@" inside the model name is kept; the base URL starts at "@http".
        ("openai:claude@2024@https://x.example/v1", "claude@2024", "https://x.example/v1"),
    ],
)
def test_openai_with_base_url_key_optional(spec: str, model: str, base_url: str) -> None:
    provider = openai_provider(spec, {})
    assert provider.model == model
    assert provider.base_url == base_url
    assert provider.api_key is None
    assert provider.name == f"openai:{model}@{base_url}"
    with_key = openai_provider(spec, {"OPENAI_API_KEY": "sk-local"})
    assert with_key.api_key == "sk-local"


def test_env_defaults_to_os_environ(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DEEPSEEK_API_KEY", "from-environ")
    provider = resolve_model("deepseek:deepseek-chat")
    assert isinstance(provider, OpenAIProvider)
    assert provider.api_key == "from-environ"
    monkeypatch.delenv("DEEPSEEK_API_KEY")
    with pytest.raises(ModelError, match="DEEPSEEK_API_KEY"):
        resolve_model("deepseek:deepseek-chat")


def test_whitespace_and_prefix_case_are_tolerated() -> None:
    provider = openai_provider("  DeepSeek:deepseek-chat \n", {"DEEPSEEK_API_KEY": "k"})
    assert provider.model == "deepseek-chat"


def test_provider_object_is_returned_unchanged() -> None:
    class Custom:
        @property
        def name(self) -> str:
            return "custom"

        async def stream(self, request: ModelRequest, emit: Emit) -> None:
            raise NotImplementedError

    custom = Custom()
    assert resolve_model(custom) is custom
    openai = OpenAIProvider(model="m", base_url="http://127.0.0.1:1")
    assert resolve_model(openai, env={}) is openai


def test_scripted_calls_from_file_lazily(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded: list[Any] = []

    class FakeScripted:
        name = "scripted"

        @classmethod
        def from_file(cls, path: Any) -> FakeScripted:
            loaded.append(path)
            return cls()

        async def stream(self, request: ModelRequest, emit: Emit) -> None:
            raise NotImplementedError

    fake = types.ModuleType("trio_harness.model._scripted")
    fake.ScriptedModel = FakeScripted  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "trio_harness.model._scripted", fake)
    provider = resolve_model("scripted:/tmp/some script.json", env={})
    assert isinstance(provider, FakeScripted)
    assert [str(p) for p in loaded] == ["/tmp/some script.json"]


def test_scripted_with_a_real_file(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "Hello!"}]}))
    provider = resolve_model(f"scripted:{script}", env={})
    assert isinstance(provider, ModelProvider)
    assert type(provider).__name__ == "ScriptedModel"


def test_scripted_missing_file_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError):
        resolve_model(f"scripted:{tmp_path / 'missing.json'}", env={})


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("", "accepted forms"),
        ("gpt-4o", "accepted forms"),
        ("claude:sonnet", "accepted forms"),
        ("anthropic:", "names no model"),
        ("deepseek", "accepted forms"),
        ("deepseek:", "names no model"),
        ("deepseek:   ", "names no model"),
        ("openai:", "names no model"),
        ("openai:@http://localhost:8000/v1", "names no model"),
        ("openai:llama3@localhost:8000", "must start with http:// or https://"),
        ("openai:llama3@", "must start with http:// or https://"),
        ("scripted:", "names no script file"),
    ],
)
def test_bad_specs(spec: str, needle: str) -> None:
    env = {"DEEPSEEK_API_KEY": "k", "OPENAI_API_KEY": "k"}
    with pytest.raises(ModelError, match=needle) as info:
        resolve_model(spec, env=env)
    if needle in ("names no model", "accepted forms"):
        message = str(info.value)
        for form in ("deepseek:MODEL", "openai:MODEL@BASE_URL", "scripted:PATH"):
            assert form in message


def test_not_a_spec_at_all() -> None:
    with pytest.raises(ModelError, match="accepted forms"):
        resolve_model(42, env={})  # type: ignore[arg-type]


# ---------------------------------------------------------------- open_model
# docs/guarantees.rst, "Models: one owner per provider".

OK_STREAM = Stream([sse_text("ok"), sse_finish("stop"), DONE])
REQUEST = ModelRequest(model="", system="", messages=(UserMessage("hi"),))


async def ask(provider: ModelProvider) -> list[object]:
    """One request; leaves a kept-alive connection in the provider's pool."""
    chunks: list[object] = []
    with trio.fail_after(10):
        await provider.stream(REQUEST, chunks.append)
    return [chunk for chunk in chunks if not isinstance(chunk, ResponseInfo)]  # the model's name: not what these check


async def closed_by_client(server: ScriptedServer) -> bool:
    """Whether the client closed its idle connection (checked once every task is blocked)."""
    await trio.testing.wait_all_tasks_blocked()
    return server.client_closed_idle.is_set()


async def test_open_model_closes_the_provider_it_built(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    async with open_model(f"openai:m@{server.base_url}", env={}) as provider:
        assert isinstance(provider, OpenAIProvider)
        assert await ask(provider) == [TextDelta("ok"), Finish("stop")]
        assert not await closed_by_client(server)  # open for the whole block
    with trio.fail_after(10):
        await server.client_closed_idle.wait()
    assert server.idle_closes == 1


async def test_open_model_closes_on_error(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)

    class Boom(Exception):
        pass

    async def fail_inside() -> None:
        async with open_model(f"openai:m@{server.base_url}", env={}) as provider:
            await ask(provider)
            raise Boom

    with pytest.raises(Boom):
        await fail_inside()
    with trio.fail_after(10):
        await server.client_closed_idle.wait()


async def test_open_model_closes_on_cancel(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    with trio.CancelScope() as scope:
        async with open_model(f"openai:m@{server.base_url}", env={}) as provider:
            await ask(provider)
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    with trio.fail_after(10):
        await server.client_closed_idle.wait()


async def test_open_model_leaves_a_provider_object_open(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    async with OpenAIProvider(model="m", base_url=server.base_url) as mine:
        async with open_model(mine) as provider:
            assert provider is mine
            await ask(provider)
        assert not await closed_by_client(server)
        # Still usable, on the same connection.
        assert await ask(mine) == [TextDelta("ok"), Finish("stop")]
        assert server.connections == 1
    with trio.fail_after(10):
        await server.client_closed_idle.wait()  # closed by its owner, here


async def test_open_model_refuses_a_bad_spec_on_entering() -> None:
    with pytest.raises(ModelError, match="DEEPSEEK_API_KEY"):
        async with open_model("deepseek:deepseek-chat", env={}):
            pytest.fail("entered")  # pragma: no cover
    with pytest.raises(ModelError, match="ModelProvider"):
        async with open_model(object(), env={}):  # type: ignore[arg-type]
            pytest.fail("entered")  # pragma: no cover


async def test_a_harness_closes_the_model_it_built_from_a_spec(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    async with open_harness(model=f"openai:m@{server.base_url}", builtin_tools=False) as harness:
        assert harness.model is not None
        await ask(harness.model)
        assert not await closed_by_client(server)
    with trio.fail_after(10):
        await server.client_closed_idle.wait()


async def test_a_harness_leaves_a_provider_object_open(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    async with OpenAIProvider(model="m", base_url=server.base_url) as mine:
        async with open_harness(model=mine, builtin_tools=False) as harness:
            assert harness.model is mine
            await ask(mine)
        assert not await closed_by_client(server)
        assert await ask(mine) == [TextDelta("ok"), Finish("stop")]


async def test_an_agent_closes_the_model_it_built_from_a_spec(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    async with open_harness(builtin_tools=False) as harness:
        handle = await harness.agents.create(options=AgentOptions(model=f"openai:m@{server.base_url}"))
        provider = handle.agent.provider  # type: ignore[attr-defined]
        assert isinstance(provider, OpenAIProvider)
        await ask(provider)
        assert not await closed_by_client(server)
        await handle.dispose()
        with trio.fail_after(10):
            await server.client_closed_idle.wait()


async def test_an_agent_whose_creation_fails_closes_the_model_it_built(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, OK_STREAM)
    built: list[ModelProvider] = []

    async def setup(agent: Any) -> None:
        built.append(agent.provider)
        await ask(agent.provider)
        raise RuntimeError("setup failed")

    async with open_harness(builtin_tools=False) as harness:
        with pytest.raises(RuntimeError, match="setup failed"):
            await harness.agents.create(options=AgentOptions(model=f"openai:m@{server.base_url}"), setup=setup)
        assert len(built) == 1
        with trio.fail_after(10):
            await server.client_closed_idle.wait()


async def test_a_scripted_model_checks_assigned_fields_and_answers_in_order() -> None:
    model = ScriptedModel([{"text": "a"}, {"tool_calls": [{"name": "t", "arguments": {"x": 1}}]}])
    with pytest.raises(ModelError, match="context_window"):
        model.context_window = 0  # public fields are still validated on assignment
    model.push({"text": "c"})
    assert isinstance(model.responses, tuple) and model.remaining == 3
    request = ModelRequest(model="m", system="", messages=(UserMessage("hi"),))
    chunks: list[object] = []
    for _ in range(3):
        await model.stream(request, chunks.append)
    assert model.remaining == 0 and len(model.requests) == 3
    assert [c.text for c in chunks if isinstance(c, TextDelta)] == ["a", "c"]
    calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
    assert [(c.id, c.arguments) for c in calls] == [("call_1", '{"x": 1}')]
