"""Interoperability: the official ACP Python SDK's client drives ``trio-harness acp``.

The SDK (``acp``) is asyncio-based, so its client runs in a separate Python
subprocess (the script below); the test itself stays on Trio and only checks
the JSON summary the script prints.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import WAIT

pytest.importorskip("acp")

CLIENT_SCRIPT = r'''
"""An ACP SDK client: spawns the trio-harness agent and records what it sees."""

import asyncio
import json
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
    client = tmp_path / "sdk_client.py"
    client.write_text(CLIENT_SCRIPT, encoding="utf-8")
    first = write_script(
        tmp_path / "first.json",
        [
            {"tool_calls": [{"name": "task_list", "arguments": {}}]},
            {"text": "You have no tasks.", "reasoning": "Checked the list."},
        ],
    )
    second = write_script(tmp_path / "second.json", [{"text": "Still none."}])
    with trio.fail_after(WAIT):
        result = await trio.run_process(
            [sys.executable, str(client), first, second, str(tmp_path / "store"), str(tmp_path)],
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    summary = json.loads(result.stdout.decode().strip().splitlines()[-1])
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
    done = next(u for u in live if u["sessionUpdate"] == "tool_call_update")
    assert call["title"] == "task_list"
    assert done["toolCallId"] == call["toolCallId"]
    assert done["status"] == "completed"
    text = "".join(u["content"]["text"] for u in live if u["sessionUpdate"] == "agent_message_chunk")
    assert text == "You have no tasks."

    replayed = summary["replayed"]
    assert [u["sessionUpdate"] for u in replayed] == [
        "user_message_chunk",
        "tool_call",
        "tool_call_update",
        "agent_thought_chunk",
        "agent_message_chunk",
    ]
    assert replayed[0]["content"]["text"] == "list my tasks"
    assert replayed[-1]["content"]["text"] == "You have no tasks."
    assert summary["secondStopReason"] == "end_turn"
