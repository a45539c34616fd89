"""Secrets the model must not read: what commands and MCP stdio servers inherit (docs/bash.rst, "Environment").

Real agents with a scripted model run real ``env`` commands; the secrets are
set in this process's environment, as a user's shell would set them.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _acp_clients import open_server as open_acp_server
from _util import WAIT

from trio_harness import BashRuntimeOptions, BashToolOptions, McpStdioServer, ScriptedModel, open_harness
from trio_harness.bash import DEFAULT_ENV_DENY, BashRequest, EnvPolicy, open_bash_executor
from trio_harness.session import _events as ev

SERVERS = Path(__file__).resolve().parent / "mcp_servers"

SECRETS = {
    "DEEPSEEK_API_KEY": "sk-deep-0000secret",
    "OPENAI_API_KEY": "sk-open-1111secret",
    "FOO_TOKEN": "tok-2222secret",
    "github_token": "ghp-3333secret",
    "DB_PASSWORD": "pw-4444secret",
    "APP_SECRET": "app-5555secret",
    "PGPASSWORD": "pg-6666secret",
}
PLAIN = {"TRIO_TEST_PLAIN": "plain-value-7777"}


@pytest.fixture
def secret_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {**SECRETS, **PLAIN}.items():
        monkeypatch.setenv(name, value)


def bash_call(command: str, call_id: str = "c1") -> dict[str, Any]:
    return {"tool_calls": [{"id": call_id, "name": "bash", "arguments": {"command": command}}]}


def leaked(text: str) -> list[str]:
    return [name for name, value in SECRETS.items() if value in text]


async def run_env_through_agent(tmp_path: Path, **harness: Any) -> tuple[str, ScriptedModel, str]:
    """A real agent runs ``env`` in bash; returns the tool result, the model, and the stored log."""
    model = ScriptedModel([bash_call("env"), {"text": "done"}])
    store = tmp_path / "store"
    async with (
        open_harness(
            model=model,
            store=store,
            builtin_tools=["bash"],
            bash_tool_options=BashToolOptions(requires_approval=False),
            **harness,
        ) as h,
        h.agents.open(cwd=str(tmp_path)) as agent,
    ):
        agent.followup("show the environment")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        session_id = agent.id
    assert len(results) == 1 and not results[0].is_error, results
    log = next(store.glob("*/session.jsonl")).read_text(encoding="utf-8")
    assert session_id in log
    return results[0].content, model, log


async def test_bash_env_lacks_api_keys_tokens_secrets_and_passwords(tmp_path: Path, secret_env: None) -> None:
    output, model, log = await run_env_through_agent(tmp_path)
    assert "TRIO_TEST_PLAIN=plain-value-7777" in output  # the rest of the environment is there
    assert leaked(output) == []
    assert leaked(log) == []
    # What went back to the model (the request after the call) holds the result without them.
    sent = json.dumps([repr(request.messages) for request in model.requests])
    assert "plain-value-7777" in sent
    assert leaked(sent) == []


async def test_the_allow_list_passes_a_variable_on_purpose(tmp_path: Path, secret_env: None) -> None:
    policy = EnvPolicy(allow=("FOO_TOKEN",))
    output, _, _ = await run_env_through_agent(tmp_path, bash_options=BashRuntimeOptions(env_policy=policy))
    assert "FOO_TOKEN=tok-2222secret" in output
    assert leaked(output) == ["FOO_TOKEN"]


async def test_the_policy_holds_in_the_sandbox(tmp_path: Path, secret_env: None) -> None:
    output, _, log = await run_env_through_agent(tmp_path, bash_options=BashRuntimeOptions(sandbox=True))
    assert "TRIO_TEST_PLAIN=plain-value-7777" in output
    assert leaked(output) == [] and leaked(log) == []


async def test_the_models_key_variable_is_hidden_even_with_an_empty_deny_list(tmp_path: Path, secret_env: None) -> None:
    """The harness hides the variable its model's key came from; everything else passes with deny=()."""
    options = BashRuntimeOptions(env_policy=EnvPolicy(deny=()))
    async with open_harness(model="deepseek:deepseek-chat", builtin_tools=False, bash_options=options) as h:
        spec = h.bash.resolve(BashRequest(command="env", workdir=str(tmp_path)))
        result = await h.bash.run(spec)
    assert "DEEPSEEK_API_KEY" not in result.stdout and SECRETS["DEEPSEEK_API_KEY"] not in result.stdout
    assert "FOO_TOKEN=tok-2222secret" in result.stdout  # deny=() passes the rest
    assert h.bash.env_policy.hide == ("DEEPSEEK_API_KEY",)


async def test_an_explicit_request_env_is_passed_as_given(tmp_path: Path, secret_env: None) -> None:
    async with open_bash_executor() as bash:
        spec = bash.resolve(BashRequest(command="env", workdir=str(tmp_path), env={"MY_TOKEN": "given"}))
        result = await bash.run(spec)
    assert "MY_TOKEN=given" in result.stdout
    assert leaked(result.stdout) == []


async def test_a_policy_as_a_dict_and_bad_policies(tmp_path: Path, secret_env: None) -> None:
    async with open_bash_executor(BashRuntimeOptions(env_policy={"deny": ["TRIO_TEST_*"]})) as bash:
        result = await bash.run(bash.resolve(BashRequest(command="env", workdir=str(tmp_path))))
    assert "TRIO_TEST_PLAIN" not in result.stdout
    assert "FOO_TOKEN=tok-2222secret" in result.stdout  # the dict replaced the default deny list
    # The record checks its policy when it is made (the executor takes the record whole).
    with pytest.raises(ValueError, match=r"EnvPolicy.deny: '' is not a variable name pattern"):
        BashRuntimeOptions(env_policy={"deny": [""]})
    with pytest.raises(TypeError, match=r"EnvPolicy.allow must be a sequence of name patterns"):
        BashRuntimeOptions(env_policy={"allow": "FOO_TOKEN"})
    with pytest.raises(TypeError, match="env_policy must be an EnvPolicy"):
        BashRuntimeOptions(env_policy=42)  # type: ignore[arg-type]


def test_the_default_deny_list_and_matching() -> None:
    policy = EnvPolicy()
    assert policy.deny == DEFAULT_ENV_DENY
    for name in ("OPENAI_API_KEY", "GITHUB_TOKEN", "github_token", "AWS_SECRET_ACCESS_KEY", "PGPASSWORD", "X_SECRET"):
        assert not policy.passes(name), name
    for name in ("PATH", "HOME", "TOKEN", "API_KEY_FILE", "LANG"):
        assert policy.passes(name), name
    assert EnvPolicy(allow=("*",)).passes("OPENAI_API_KEY")
    assert not EnvPolicy(deny=(), hide=("PATH",)).passes("path")
    assert EnvPolicy(hide=("X",)).hiding(["Y", "X"]).hide == ("X", "Y")


# ------------------------------------------------------------------ MCP stdio servers


def where_server(tmp_path: Path, **settings: Any) -> McpStdioServer:
    return McpStdioServer(
        name="calc",
        command=sys.executable,
        args=(str(SERVERS / "calc_server.py"), "--record", str(tmp_path / "record.txt")),
        **settings,
    )


def where(variable: str, call_id: str) -> dict[str, Any]:
    return {"id": call_id, "name": "mcp__calc__where", "arguments": {"variable": variable}}


async def mcp_sees(tmp_path: Path, variables: list[str], server: McpStdioServer, **harness: Any) -> dict[str, Any]:
    calls = [where(variable, f"w{index}") for index, variable in enumerate(variables)]
    model = ScriptedModel([{"tool_calls": calls}, {"text": "done"}])
    async with (
        open_harness(model=model, builtin_tools=False, mcp_servers=[server], **harness) as h,
        h.agents.open(cwd=str(tmp_path)) as agent,
    ):
        agent.followup("where?")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
    assert len(results) == len(variables) and not any(r.is_error for r in results), results
    return {variable: json.loads(r.content)["value"] for variable, r in zip(variables, results, strict=True)}


async def test_mcp_stdio_servers_follow_the_harness_policy(tmp_path: Path, secret_env: None) -> None:
    """BashRuntimeOptions.env_policy also filters what an MCP stdio server inherits (the SDK's few variables)."""
    options = BashRuntimeOptions(env_policy=EnvPolicy(deny=(*DEFAULT_ENV_DENY, "HOME")))
    seen = await mcp_sees(tmp_path, ["HOME", "PATH", "DEEPSEEK_API_KEY"], where_server(tmp_path), bash_options=options)
    assert seen["HOME"] is None
    assert seen["PATH"] is not None
    assert seen["DEEPSEEK_API_KEY"] is None


async def test_an_mcp_servers_own_policy_and_env_win(tmp_path: Path, secret_env: None) -> None:
    server = where_server(tmp_path, env={"FOO_TOKEN": "from-config"}, env_policy=EnvPolicy(deny=("PATH",)))
    options = BashRuntimeOptions(env_policy=EnvPolicy(deny=(*DEFAULT_ENV_DENY, "HOME")))
    seen = await mcp_sees(tmp_path, ["HOME", "PATH", "FOO_TOKEN"], server, bash_options=options)
    assert seen == {"HOME": str(Path.home()), "PATH": None, "FOO_TOKEN": "from-config"}


# ------------------------------------------------------------------ over ACP


async def test_an_acp_client_never_receives_the_secrets(tmp_path: Path, secret_env: None) -> None:
    """``trio-harness acp`` over real stdio: the client's updates of an ``env`` call hold none of them."""
    responses: list[dict[str, Any]] = [bash_call("env"), {"text": "done"}]
    store = tmp_path / "store"
    async with open_acp_server(tmp_path, responses, store=store, extra=("--yes",), tools="bash") as client:
        await client.call("initialize", {"protocolVersion": 1})
        new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        prompt = {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "env"}]}
        assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        received = json.dumps(client.received)
    assert "plain-value-7777" in received  # the command's output did reach the client
    assert leaked(received) == []
    assert leaked(next(store.glob("*/session.jsonl")).read_text(encoding="utf-8")) == []
