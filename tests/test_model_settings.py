"""Model settings: one record, merged turn > agent > harness > spec, logged, and sent on the wire."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _sse_server import DONE, Stream, sse_finish, sse_text, sse_usage, start_server
from _util import WAIT, echo_tool, wait_until

from trio_harness import ModelError, ModelSettings, ScriptedModel, open_harness
from trio_harness.agents import AgentOptions, Tool, ToolContext
from trio_harness.model import OpenAIProvider, resolve_model
from trio_harness.session import JsonlStore, decode_event, encode_event
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

ECHO = echo_tool()


def headers(events: Any) -> list[ev.RequestHeader]:
    return [e for e in events if isinstance(e, ev.RequestHeader)]


# ---------------------------------------------------------------- the record


def test_merge_is_field_by_field_and_extra_body_key_by_key() -> None:
    harness = ModelSettings(temperature=0.1, top_p=0.5, seed=1, extra_body={"a": 1, "b": 1})
    agent = ModelSettings(temperature=0.2, stop="END", extra_body={"b": 2})
    turn = ModelSettings(temperature=0.3, max_tokens=7)
    merged = harness.merge(agent).merge(turn)
    assert merged == ModelSettings(
        temperature=0.3, top_p=0.5, seed=1, stop=("END",), max_tokens=7, extra_body={"a": 1, "b": 2}
    )
    assert harness.merge(None) is harness
    assert ModelSettings().empty and not turn.empty


@pytest.mark.parametrize(
    ("fields", "error", "needle"),
    [
        ({"temperature": 3}, ValueError, r"temperature must be within \[0, 2\]"),
        ({"temperature": "hot"}, TypeError, "temperature must be a number"),
        ({"temperature": True}, TypeError, "temperature must be a number"),
        ({"top_p": 1.5}, ValueError, "top_p must be within"),
        ({"max_tokens": 0}, ValueError, "max_tokens must be positive"),
        ({"max_tokens": 2.0}, TypeError, "max_tokens must be an int"),
        ({"seed": "1"}, TypeError, "seed must be an int"),
        ({"stop": [""]}, TypeError, "stop must hold non-empty strings"),
        ({"reasoning_effort": ""}, TypeError, "reasoning_effort must be a non-empty string"),
        ({"parallel_tool_calls": 1}, TypeError, "parallel_tool_calls must be a bool"),
        ({"extra_body": {"x": {1, 2}}}, TypeError, "extra_body must be JSON-serialisable"),
        ({"extra_body": {1: "x"}}, TypeError, "extra_body keys must be strings"),
    ],
)
def test_bad_values_are_refused_naming_the_field(fields: dict[str, Any], error: type[Exception], needle: str) -> None:
    with pytest.raises(error, match=needle):
        ModelSettings(**fields)


def test_settings_round_trip_in_the_log_and_are_left_out_when_unset() -> None:
    settings = ModelSettings(temperature=0, stop=["a", "b"], extra_body={"k": [1, {"x": None}]})
    header = ev.RequestHeader(seq=3, ts=1.0, turn=1, step=1, provider="p", model="m", settings=settings)
    line = encode_event(header)
    assert json.loads(line)["settings"] == {
        "temperature": 0.0,
        "stop": ["a", "b"],
        "extra_body": {"k": [1, {"x": None}]},
    }
    assert decode_event(line) == header
    # A message without settings is written exactly as before settings existed, and such old lines load.
    plain = ev.InboxSpliced(seq=0, ts=1.0, queue="next-turn", start=0, inserted=(ev.InboxMessage(id="m", text="t"),))
    assert '"settings"' not in encode_event(plain)
    old = (
        '{"type":"request/header","seq":1,"ts":1.0,"turn":1,"step":1,'
        '"provider":"p","model":"m","tools":[],"max_tokens":null}'
    )
    decoded = decode_event(old)
    assert isinstance(decoded, ev.RequestHeader) and decoded.settings is None


# ---------------------------------------------------------------- merging in the driver


async def test_turn_beats_agent_beats_harness_beats_spec_and_the_header_records_it() -> None:
    model = ScriptedModel([{"text": "one"}, {"text": "two"}], settings=ModelSettings(seed=9, top_p=0.9))
    async with open_test_harness(model, model_settings=ModelSettings(temperature=0.1, top_p=0.5)) as h:
        options = AgentOptions(model_settings=ModelSettings(temperature=0.2, max_tokens=50))
        async with h.agents.open(options=options) as agent:
            agent.followup("first", settings=ModelSettings(temperature=0.7, stop="STOP"))
            await agent.when_idle()
            agent.followup("second")
            await agent.when_idle()
            first, second = headers(agent.session.events)
    assert first.settings == ModelSettings(seed=9, top_p=0.5, temperature=0.7, max_tokens=50, stop=("STOP",))
    assert first.max_tokens == 50
    # the turn's settings applied to that turn only
    assert second.settings == ModelSettings(seed=9, top_p=0.5, temperature=0.2, max_tokens=50)
    assert [r.settings for r in model.requests] == [first.settings, second.settings]


async def test_every_step_of_a_turn_uses_that_turns_settings_and_the_next_turn_its_own() -> None:
    async def noop(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    call = {"tool_calls": [{"name": "noop"}]}
    model = ScriptedModel([call, call, {"text": "a"}, call, {"text": "b"}, {"text": "c"}])
    async with open_test_harness(model, model_settings=ModelSettings(seed=1)) as h:
        h.tools.add(Tool("noop", "n", {"type": "object"}, noop))
        async with h.agents.open() as agent:
            agent.followup("one", settings=ModelSettings(temperature=0.5))
            await agent.when_idle()
            agent.followup("two", settings=ModelSettings(temperature=0.9))
            await agent.when_idle()
            agent.followup("three", settings=ModelSettings())  # sets nothing: the base settings
            await agent.when_idle()
            recorded = [header.settings for header in headers(agent.session.events)]
    one, two = ModelSettings(seed=1, temperature=0.5), ModelSettings(seed=1, temperature=0.9)
    assert [r.settings for r in model.requests] == [one, one, one, two, two, ModelSettings(seed=1)]
    assert recorded == [one, one, one, two, two, ModelSettings(seed=1)]


async def test_agent_options_max_tokens_is_a_setting_and_model_settings_win() -> None:
    model = ScriptedModel([{"text": "a"}, {"text": "b"}])
    async with open_test_harness(model) as h:
        async with h.agents.open(options=AgentOptions(max_tokens=10)) as agent:
            agent.followup("x")
            await agent.when_idle()
        both = AgentOptions(max_tokens=10, model_settings=ModelSettings(max_tokens=20))
        async with h.agents.open(options=both) as agent:
            agent.followup("y")
            await agent.when_idle()
    assert [r.max_tokens for r in model.requests] == [10, 20]


async def test_a_queued_turn_keeps_its_settings_across_a_restart(tmp_path: Path) -> None:
    hanging = ScriptedModel([{"hang": True}])
    async with open_test_harness(hanging, store=tmp_path) as h:
        handle = await h.agents.create(session_id="s")
        handle.agent.followup("first")
        handle.agent.followup("second", settings=ModelSettings(temperature=1.5, seed=4))
        await wait_until(lambda: len(hanging.requests) == 1)  # after the log is created (a worker thread)
        await handle.dispose()  # the running turn is aborted; "second" stays queued in the log
    resumed_model = ScriptedModel([{"text": "done"}])
    async with (
        open_test_harness(resumed_model, store=tmp_path) as h,
        h.agents.open(session_id="s", resume=True) as agent,
    ):
        assert [m.text for m in agent.inbox.next_turn] == ["second"]
        agent.followup("third")
        resumed_model.push({"text": "third done"})
        await agent.when_idle()
        second, third = headers(agent.session.events)[-2:]
    assert second.settings == ModelSettings(temperature=1.5, seed=4)
    assert third.settings is None


async def test_settings_of_the_wrong_type_are_refused() -> None:
    async with open_test_harness() as h, h.agents.open() as agent:
        with pytest.raises(TypeError, match="settings must be a ModelSettings"):
            agent.followup("x", settings={"temperature": 1})  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="model_settings must be a ModelSettings"):
        async with open_harness(model=ScriptedModel([]), model_settings={"temperature": 1}):  # type: ignore[arg-type]
            pass
    with pytest.raises(TypeError, match="model_settings must be a ModelSettings or None"):
        AgentOptions(model_settings={"seed": 1})  # type: ignore[arg-type]


# ---------------------------------------------------------------- the HTTP body


def _answer() -> Stream:
    return Stream([sse_text("ok"), sse_finish("stop"), sse_usage(5, 1), DONE])


async def test_settings_reach_the_http_body_of_the_openai_provider(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, _answer())
    provider = OpenAIProvider(
        model="m",
        base_url=server.base_url,
        api_key="k",
        max_retries=0,
        settings=ModelSettings(seed=3, extra_body={"provider_key": 1}),
    )
    async with provider:
        harness_settings = ModelSettings(top_p=0.4, reasoning_effort="low", extra_body={"shared": "harness"})
        async with open_test_harness(provider, model_settings=harness_settings) as h:
            h.tools.add(ECHO)
            options = AgentOptions(model_settings=ModelSettings(temperature=0.3, parallel_tool_calls=False))
            async with h.agents.open(options=options) as agent:
                agent.followup(
                    "hi", settings=ModelSettings(max_tokens=64, stop=["END", "STOP"], extra_body={"shared": "turn"})
                )
                await agent.when_idle()
            async with h.agents.open(options=AgentOptions(tool_filter=lambda tool: False)) as agent:
                agent.followup("no tools", settings=ModelSettings(parallel_tool_calls=True))
                await agent.when_idle()
    body = server.requests[0].json
    assert body["temperature"] == 0.3
    assert body["top_p"] == 0.4
    assert body["seed"] == 3
    assert body["max_tokens"] == 64
    assert body["stop"] == ["END", "STOP"]
    assert body["reasoning_effort"] == "low"
    assert body["parallel_tool_calls"] is False
    assert body["provider_key"] == 1 and body["shared"] == "turn"
    # parallel_tool_calls is only sent with tools (servers refuse it otherwise)
    assert "parallel_tool_calls" not in server.requests[1].json
    assert "temperature" not in server.requests[1].json


# ---------------------------------------------------------------- spec strings


def test_spec_query_parameters_set_the_route_defaults() -> None:
    env = {"DEEPSEEK_API_KEY": "k"}
    provider = resolve_model(
        "deepseek:deepseek-chat?temperature=0.2&max_tokens=100&stop=a&stop=b&parallel_tool_calls=false"
        "&reasoning_effort=high&seed=7&top_p=1&context_window=5000",
        env=env,
    )
    assert isinstance(provider, OpenAIProvider)
    assert provider.model == "deepseek-chat" and provider.name == "deepseek:deepseek-chat"
    assert provider.settings == ModelSettings(
        temperature=0.2,
        max_tokens=100,
        stop=("a", "b"),
        parallel_tool_calls=False,
        reasoning_effort="high",
        seed=7,
        top_p=1.0,
    )
    assert provider.context_window == 5000
    plain = resolve_model("deepseek:deepseek-chat", env=env)
    assert isinstance(plain, OpenAIProvider) and plain.settings.empty and plain.context_window == 128_000
    local = resolve_model("openai:llama@http://localhost:8000/v1?temperature=0", env={})
    assert isinstance(local, OpenAIProvider)
    assert local.base_url == "http://localhost:8000/v1" and local.settings == ModelSettings(temperature=0)


@pytest.mark.parametrize(
    ("spec", "needle"),
    [
        ("deepseek:deepseek-chat?temprature=0.2", r"unknown parameter 'temprature'; known parameters: temperature"),
        ("deepseek:deepseek-chat?temperature=warm", r"temperature='warm' is not a number"),
        ("deepseek:deepseek-chat?temperature=9", r"temperature must be within \[0, 2\]"),
        ("deepseek:deepseek-chat?max_tokens=1.5", r"max_tokens='1.5' is not an integer"),
        ("deepseek:deepseek-chat?max_tokens=-3", r"max_tokens must be positive"),
        ("deepseek:deepseek-chat?parallel_tool_calls=maybe", r"parallel_tool_calls='maybe' is not true or false"),
        ("deepseek:deepseek-chat?seed=1&seed=2", r"parameter 'seed' is given twice"),
        ("deepseek:deepseek-chat?context_window=0", r"context_window must be positive"),
        ("deepseek:deepseek-chat?temperature", r"cannot read the query"),
        ("replay:/tmp/x.jsonl?temperature=1", r"a replay takes no query parameters"),
    ],
)
def test_bad_spec_queries_name_the_parameter(spec: str, needle: str) -> None:
    with pytest.raises(ModelError, match=needle):
        resolve_model(spec, env={"DEEPSEEK_API_KEY": "k"})


async def test_spec_settings_are_the_lowest_layer(tmp_path: Path) -> None:
    script = tmp_path / "s.json"
    script.write_text(json.dumps({"responses": [{"text": "ok"}]}))
    async with open_harness(
        model=f"scripted:{script}?temperature=0.5&seed=2&context_window=999",
        model_settings=ModelSettings(seed=3),
        builtin_tools=False,
    ) as h:
        assert isinstance(h.model, ScriptedModel) and h.model.context_window == 999
        async with h.agents.open() as agent:
            agent.followup("x")
            await agent.when_idle()
            (header,) = headers(agent.session.events)
    assert header.settings == ModelSettings(temperature=0.5, seed=3)


# ---------------------------------------------------------------- the command line


async def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def test_cli_flags_reach_the_request(nursery: trio.Nursery, tmp_path: Path) -> None:
    server = await start_server(nursery, _answer())
    store = tmp_path / "store"
    spec = f"openai:m@{server.base_url}"
    common = ("--model", spec, "--store", str(store), "--tools", "none")
    result = await cli(
        "run", "hello", *common, "--temperature", "0.25", "--max-tokens", "32", "--system", "Be terse.", cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    body = server.requests[0].json
    assert body["temperature"] == 0.25 and body["max_tokens"] == 32
    assert body["messages"][0] == {"role": "system", "content": "Be terse."}
    # recorded in the stored session's request header
    (session_id,) = [header.id for header in await JsonlStore(store).list()]
    loaded = await JsonlStore(store).load(session_id)
    (header,) = headers(loaded.events)
    assert header.settings == ModelSettings(temperature=0.25, max_tokens=32)

    prompt_file = tmp_path / "system.txt"
    prompt_file.write_text("From a file ✓", encoding="utf-8")
    result = await cli("run", "again", *common, "--system-file", str(prompt_file), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert server.requests[1].json["messages"][0] == {"role": "system", "content": "From a file ✓"}
    assert "temperature" not in server.requests[1].json


async def test_cli_flag_errors(tmp_path: Path) -> None:
    missing = tmp_path / "nope.txt"
    result = await cli("run", "x", "--model", "deepseek:deepseek-chat", "--system-file", str(missing), cwd=tmp_path)
    assert result.returncode == 2
    assert b"cannot read --system-file" in result.stderr and str(missing).encode() in result.stderr
    result = await cli("run", "x", "--temperature", "3", cwd=tmp_path)
    assert result.returncode == 2 and b"must be within [0, 2]" in result.stderr
    result = await cli("run", "x", "--system", "a", "--system-file", "b", cwd=tmp_path)
    assert result.returncode == 2 and b"not allowed with argument" in result.stderr


async def test_cli_acp_takes_the_flags(tmp_path: Path) -> None:
    result = await cli("acp", "--help", cwd=tmp_path)
    assert result.returncode == 0
    for flag in (b"--temperature", b"--max-tokens", b"--system", b"--system-file"):
        assert flag in result.stdout
