"""Interoperability: the official ACP Python SDK's client drives ``trio-harness acp``.

The SDK (``acp``) is asyncio-based, so its client runs in a separate Python
subprocess (the script below); the test itself stays on Trio and only checks
the JSON summary the script prints.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from _acp_clients import INFO_KINDS, run_python_client

pytest.importorskip("acp")

CLIENT_SCRIPT = r'''
"""An ACP SDK client: spawns the trio-harness agent and records what it sees."""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block


class Recorder:
    def __init__(self) -> None:
        self.updates = []

    async def session_update(self, session_id, update, **kwargs):
        dumped = update.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.updates.append({"sessionId": session_id, **dumped})

    async def request_permission(self, *args, **kwargs):
        raise RuntimeError("the agent must not ask for permissions")


async def open_agent(recorder, model, store, cwd):
    return spawn_agent_process(
        recorder,
        sys.executable,
        "-m",
        "trio_harness",
        "acp",
        "--model",
        model,
        "--store",
        store,
        "--tools",
        "tasks",
        cwd=cwd,
        env=dict(os.environ),  # the SDK's default environment drops PYTHONPATH (the checkout under test)
    )


async def main() -> None:
    first_model, second_model, store, cwd = sys.argv[1:5]
    summary = {}
    recorder = Recorder()
    async with await open_agent(recorder, first_model, store, cwd) as (conn, process):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        summary["protocolVersion"] = init.protocol_version
        summary["loadSession"] = init.agent_capabilities.load_session
        summary["embeddedContext"] = init.agent_capabilities.prompt_capabilities.embedded_context
        session = await conn.new_session(cwd=cwd, mcp_servers=[])
        summary["sessionId"] = session.session_id
        prompt = [text_block("list my tasks")]
        reply = await conn.prompt(session_id=session.session_id, prompt=prompt)
        summary["stopReason"] = reply.stop_reason
        listed = await conn.list_sessions()
        summary["listed"] = [s.session_id for s in listed.sessions]
    summary["liveUpdates"] = recorder.updates

    recorder = Recorder()
    async with await open_agent(recorder, second_model, store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await conn.load_session(cwd=cwd, session_id=summary["sessionId"], mcp_servers=[])
        summary["replayed"] = list(recorder.updates)
        reply = await conn.prompt(session_id=summary["sessionId"], prompt=[text_block("and again")])
        summary["secondStopReason"] = reply.stop_reason
        await conn.close_session(session_id=summary["sessionId"])
    print(json.dumps(summary))


asyncio.run(main())
'''


def write_script(path: Path, responses: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


async def test_the_official_sdk_client_drives_the_server(tmp_path: Path) -> None:
    first = write_script(
        tmp_path / "first.json",
        [
            {"tool_calls": [{"name": "task_list", "arguments": {}}]},
            {"text": "You have no tasks.", "reasoning": "Checked the list."},
        ],
    )
    second = write_script(tmp_path / "second.json", [{"text": "Still none."}])
    args = (first, second, str(tmp_path / "store"), str(tmp_path))
    summary = await run_python_client(tmp_path / "sdk_client.py", CLIENT_SCRIPT, *args)
    assert summary["protocolVersion"] == 1
    assert summary["loadSession"] is True
    assert summary["embeddedContext"] is True
    assert summary["stopReason"] == "end_turn"
    assert summary["sessionId"] in summary["listed"]

    live = summary["liveUpdates"]
    kinds = [u["sessionUpdate"] for u in live]
    assert "tool_call" in kinds
    assert "tool_call_update" in kinds
    assert "agent_thought_chunk" in kinds
    call = next(u for u in live if u["sessionUpdate"] == "tool_call")
    done = next(u for u in live if u["sessionUpdate"] == "tool_call_update" and "content" in u)
    assert [u.get("status") for u in live if u.get("toolCallId") == call["toolCallId"]] == [
        "pending",
        "in_progress",
        "completed",
    ]
    assert call["title"] == "task_list"
    assert done["toolCallId"] == call["toolCallId"]
    assert done["status"] == "completed"
    text = "".join(u["content"]["text"] for u in live if u["sessionUpdate"] == "agent_message_chunk")
    assert text == "You have no tasks."

    replayed = [u for u in summary["replayed"] if u["sessionUpdate"] not in INFO_KINDS]
    assert [u["sessionUpdate"] for u in replayed] == [
        "user_message_chunk",
        "tool_call",
        "tool_call_update",  # in_progress (its tool/started)
        "tool_call_update",
        "agent_thought_chunk",
        "agent_message_chunk",
    ]
    assert replayed[2]["status"] == "in_progress"
    assert replayed[0]["content"]["text"] == "list my tasks"
    assert replayed[-1]["content"]["text"] == "You have no tasks."
    assert summary["secondStopReason"] == "end_turn"


# ---------------------------------------------------------------- what the harness knows, seen by the SDK

SESSION_SCRIPT = r'''
"""An ACP SDK client: authentication without a key, then one session's notices, usage, title and a cancel."""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import SessionNotification


class Recorder:
    """Records every session/update as it arrives, in order, validated against the SDK's schema."""

    def __init__(self) -> None:
        self.updates = []
        self.changed = asyncio.Event()

    def observe(self, event) -> None:  # a stream observer: called synchronously, in arrival order
        message = event.message
        if message.get("method") == "session/update":
            notification = SessionNotification.model_validate(message["params"])
            self.updates.append(notification.update.model_dump(mode="json", by_alias=True, exclude_none=True))
            self.changed.set()

    async def wait_for(self, predicate):
        try:
            async with asyncio.timeout(30):
                while not any(predicate(u) for u in self.updates):
                    self.changed.clear()
                    await self.changed.wait()
        except TimeoutError:
            raise AssertionError(f"no such update in {self.updates}") from None

    async def session_update(self, session_id, update, **kwargs):
        pass

    async def request_permission(self, *args, **kwargs):
        raise RuntimeError("the agent must not ask for permissions")


def spawn(recorder, model, store, cwd, *extra, env=None):
    # The SDK gives the agent a minimal environment unless told: pass ours on
    # (PYTHONPATH names the checkout under test).
    env = dict(os.environ) if env is None else env
    return spawn_agent_process(
        recorder, sys.executable, "-m", "trio_harness", "acp", "--model", model, "--store", store, *extra,
        cwd=cwd, env=env, observers=[recorder.observe],
    )


def error_of(exc):
    return {"code": exc.code, "message": str(exc), "data": exc.data}


async def authentication(model, store, cwd, env):
    recorder = Recorder()
    summary = {}
    async with spawn(recorder, model, store, cwd, env=env) as (conn, process):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        methods = init.auth_methods
        summary["authMethods"] = [m.model_dump(mode="json", by_alias=True, exclude_none=True) for m in methods]
        summary["authTypes"] = [type(m).__name__ for m in init.auth_methods]
        try:
            await conn.new_session(cwd=cwd, mcp_servers=[])
        except RequestError as exc:
            summary["newError"] = error_of(exc)
        try:
            await conn.authenticate(method_id=init.auth_methods[0].id)
        except RequestError as exc:
            summary["authenticateError"] = error_of(exc)
        try:
            await conn.list_sessions()
        except RequestError as exc:
            summary["listError"] = error_of(exc)
        summary["reinitialized"] = (await conn.initialize(protocol_version=PROTOCOL_VERSION)).protocol_version
    return summary


async def session(model, store, cwd):
    summary = {}
    recorder = Recorder()
    async with spawn(recorder, model, store, cwd, "--yes", "--tools", "tasks,bash") as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        new = await conn.new_session(cwd=cwd, mcp_servers=[])
        sid = summary["sessionId"] = new.session_id
        reply = await conn.prompt(session_id=sid, prompt=[text_block("Start the build\nwith all the details")])
        summary["firstStop"] = reply.stop_reason
        open("go", "w").close()  # the background command waits for this file: it ends after the turn
        # The background task's completion notice wakes the agent: a turn nobody prompted.
        usage = lambda u: u["_meta"]["trio-harness/usage"]["turn"] if u["sessionUpdate"] == "usage_update" else {}
        await recorder.wait_for(lambda u: usage(u).get("requests") == 1)
        prompt = asyncio.ensure_future(conn.prompt(session_id=sid, prompt=[text_block("sleep now")]))
        await recorder.wait_for(lambda u: u["sessionUpdate"] == "tool_call" and u["title"] == "bash: sleep 60")
        await conn.cancel(session_id=sid)
        summary["cancelStop"] = (await prompt).stop_reason
    summary["live"] = recorder.updates

    recorder = Recorder()
    async with spawn(recorder, model, store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        summary["replayed"] = list(recorder.updates)
    return summary


async def main() -> None:
    scenario, model, store, cwd = sys.argv[1:5]
    if scenario == "authentication":
        summary = await authentication(model, store, cwd, env=json.loads(sys.argv[5]))
    else:
        summary = await session(model, store, cwd)
    print(json.dumps(summary))


asyncio.run(main())
'''


async def run_sdk_client(tmp_path: Path, *args: str) -> dict[str, Any]:
    return await run_python_client(tmp_path / "sdk_session_client.py", SESSION_SCRIPT, *args)


async def test_without_an_api_key_the_agent_answers_the_handshake_and_asks_for_it(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k not in ("DEEPSEEK_API_KEY", "OPENAI_API_KEY")}
    env["PYTHONPATH"] = os.environ.get("PYTHONPATH", "")
    summary = await run_sdk_client(
        tmp_path, "authentication", "deepseek:deepseek-chat", str(tmp_path / "store"), str(tmp_path), json.dumps(env)
    )
    # The SDK reads the method as the schema's env_var kind, naming the variable.
    assert summary["authTypes"] == ["EnvVarAuthMethod"]
    (method,) = summary["authMethods"]
    assert method["type"] == "env_var"
    assert method["id"] == "env:DEEPSEEK_API_KEY"
    assert [v["name"] for v in method["vars"]] == ["DEEPSEEK_API_KEY"]
    assert method["vars"][0]["secret"] is True
    assert "DEEPSEEK_API_KEY" in method["description"]
    # session/new before the key: ACP's auth_required.
    assert summary["newError"]["code"] == -32000
    assert "authenticate" in summary["newError"]["message"]
    # data.details, the only part some clients (Toad) show, is the method's description
    assert summary["newError"]["data"] == {"authMethods": ["env:DEEPSEEK_API_KEY"], "details": method["description"]}
    # authenticate explains what to set and that the agent must be restarted with it.
    error = summary["authenticateError"]
    assert error["code"] == -32000
    assert "DEEPSEEK_API_KEY is not set" in error["message"]
    assert "restart the agent" in error["message"]
    details = error["data"].pop("details")
    assert error["data"] == {"methodId": "env:DEEPSEEK_API_KEY", "variable": "DEEPSEEK_API_KEY"}
    assert details.startswith("The model's API key is missing: DEEPSEEK_API_KEY is not set") and details.endswith(".")
    assert summary["listError"]["code"] == -32000
    assert summary["reinitialized"] == 1


async def test_notices_usage_title_message_ids_and_a_cancelled_turn_live_and_replayed(tmp_path: Path) -> None:
    wait_for_go = "while [ ! -e go ]; do sleep 0.05; done"
    model = write_script(
        tmp_path / "session.json",
        [
            {"tool_calls": [{"name": "bash", "arguments": {"command": wait_for_go, "run_in_background": True}}]},
            {"text": "Started."},
            {"text": "The build finished.", "reasoning": "The notice says it completed."},
            {"tool_calls": [{"name": "bash", "arguments": {"command": "sleep 60", "run_in_background": False}}]},
        ],
    )
    script = json.loads((tmp_path / "session.json").read_text())
    (tmp_path / "session.json").write_text(json.dumps({**script, "context_window": 100000}))
    summary = await run_sdk_client(tmp_path, "session", model, str(tmp_path / "store"), str(tmp_path))
    assert summary["firstStop"] == "end_turn"
    assert summary["cancelStop"] == "cancelled"
    live, replayed = summary["live"], summary["replayed"]

    # A task notice is the agent's information, never user text: live and replayed alike.
    notice = "background task bash-1 [bash] completed (exit code 0) — while [ ! -e go ]; do sleep 0.05; done."
    for updates in (live, replayed):
        (shown,) = [u for u in updates if u.get("_meta", {}).get("trio-harness/origin") == "task-notice"]
        assert shown["sessionUpdate"] == "agent_thought_chunk"
        assert shown["content"]["text"].startswith(notice)
        assert not any(
            u["content"]["text"].startswith("background task") for u in updates if "user" in u["sessionUpdate"]
        )
    assert [u["sessionUpdate"] for u in live].count("user_message_chunk") == 0
    users = [u["content"]["text"] for u in replayed if u["sessionUpdate"] == "user_message_chunk"]
    assert users == ["Start the build\nwith all the details", "sleep now"]

    # The title: the first line of the first prompt, sent once live and again on load.
    for updates in (live, replayed):
        titles = [u["title"] for u in updates if u["sessionUpdate"] == "session_info_update" and "title" in u]
        assert titles == ["Start the build"]
        assert any(u["sessionUpdate"] == "session_info_update" and "updatedAt" in u for u in updates)

    # Usage after each turn (three turns live: prompted, woken, cancelled) and after the replay.
    usage = [u for u in live if u["sessionUpdate"] == "usage_update"]
    assert len(usage) == 3
    assert all(u["size"] == 100000 and 0 < u["used"] < 100000 for u in usage)
    assert [u["_meta"]["trio-harness/usage"]["turn"]["requests"] for u in usage] == [2, 1, 1]
    assert usage[-1]["_meta"]["trio-harness/usage"]["session"]["requests"] == 4
    (replayed_usage,) = [u for u in replayed if u["sessionUpdate"] == "usage_update"]
    assert replayed_usage["used"] == usage[-1]["used"]

    # Every message chunk has a messageId; reasoning and text are two messages; replay reuses the ids.
    def ids(updates: list[dict[str, Any]], kind: str) -> dict[str, str]:
        chunks = [u for u in updates if u["sessionUpdate"] == kind]
        assert all(isinstance(u.get("messageId"), str) for u in chunks)
        texts: dict[str, str] = {}  # messageId -> the text of its chunks
        for u in chunks:
            texts[u["messageId"]] = texts.get(u["messageId"], "") + u["content"]["text"]
        return {text: message_id for message_id, text in texts.items()}

    live_text, replay_text = ids(live, "agent_message_chunk"), ids(replayed, "agent_message_chunk")
    live_thought, replay_thought = ids(live, "agent_thought_chunk"), ids(replayed, "agent_thought_chunk")
    ids(replayed, "user_message_chunk")
    assert live_text["Started."] == replay_text["Started."] != live_text["The build finished."]
    assert live_thought["The notice says it completed."] == replay_thought["The notice says it completed."]
    assert live_thought["The notice says it completed."] != live_text["The build finished."]

    # The replayed cancelled turn says so at its end.
    conversation = [u for u in replayed if u["sessionUpdate"] not in INFO_KINDS]
    last = conversation[-1]
    assert last["sessionUpdate"] == "agent_message_chunk"
    assert last["content"]["text"] == "The turn was cancelled."
    assert last["_meta"]["trio-harness/turnEnd"] == {"reason": "aborted", "cause": "user", "stopReason": "cancelled"}
    assert conversation[-2]["sessionUpdate"] == "tool_call_update"
    assert conversation[-2]["status"] == "failed"
