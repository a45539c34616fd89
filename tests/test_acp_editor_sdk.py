"""The editor features over the real stdio transport, driven by the official ACP SDKs as clients.

Both clients spawn ``python -m trio_harness acp --model A --model B`` and
implement ``terminal/*`` by running the command: a foreground ``bash`` in the
client's terminal, a plan, the slash commands, a model switched with the
``model`` config option (the next answer comes from model B), then, in a
second server process, ``session/load``: the plan, the commands and the
chosen model come back, and the next prompt is still answered by B.

- The Python SDK (``agent-client-protocol``, asyncio) runs in a subprocess.
- The TypeScript SDK (``@agentclientprotocol/sdk``) runs under node
  (tests/acp_ts_editor_client.mjs): its connection parses what it handles with
  the SDK's schemas, the script checks every message the agent sends
  (requests, notifications, responses) with the SDK's zod schema of its method,
  and the test checks each raw message again against its definition in the
  SDK's ``schema.json`` (``jsonschema``).  The SDK is the one
  tests/test_acp_ts_sdk.py installs in its cache directory outside the
  repository (``$TRIO_HARNESS_NPM_CACHE``); without node or npm that test's
  rule applies (a skip naming the reason, a failure under CI).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import trio
from _acp_clients import run_python_client
from _util import WAIT
from test_acp_ts_sdk import sdk_dir

pytest.importorskip("acp")

PLAN = [
    {"content": "Look around", "status": "completed", "priority": "high"},
    {"content": "Run the check", "status": "in_progress", "priority": "medium"},
]


def scripts(tmp_path: Path) -> tuple[str, str]:
    first = tmp_path / "a.json"
    first.write_text(
        json.dumps(
            {
                "responses": [
                    {"tool_calls": [{"name": "todo_write", "arguments": {"todos": PLAN}}]},
                    {"tool_calls": [{"name": "bash", "arguments": {"command": "echo via-terminal; exit 2"}}]},
                    {"text": "done by A"},
                ]
            }
        ),
        encoding="utf-8",
    )
    second = tmp_path / "b.json"
    second.write_text(json.dumps({"responses": [{"text": "answered by B"}]}), encoding="utf-8")
    return f"scripted:{first}", f"scripted:{second}"


PYTHON_CLIENT = r'''
"""The official ACP Python SDK as an editor with terminals."""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import (
    ClientCapabilities,
    CreateTerminalResponse,
    KillTerminalResponse,
    ReleaseTerminalResponse,
    RequestPermissionResponse,
    TerminalOutputResponse,
    WaitForTerminalExitResponse,
)


class Editor:
    def __init__(self):
        self.updates = []
        self.terminals = {}
        self.log = []

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.log.append("session/request_permission")
        return RequestPermissionResponse.model_validate({"outcome": {"outcome": "selected", "optionId": "allow_once"}})

    async def create_terminal(self, session_id, command, args=None, env=None, cwd=None, output_byte_limit=None, **kw):
        self.log.append("terminal/create")
        process = await asyncio.create_subprocess_exec(
            command, *(args or []), cwd=cwd, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
        )
        terminal_id = f"t{len(self.terminals) + 1}"
        self.terminals[terminal_id] = {"process": process, "released": False, "output": b""}
        return CreateTerminalResponse.model_validate({"terminalId": terminal_id})

    async def _finish(self, terminal_id):
        entry = self.terminals[terminal_id]
        if "code" not in entry:
            entry["output"] = await entry["process"].stdout.read()
            entry["code"] = await entry["process"].wait()
        return entry

    async def wait_for_terminal_exit(self, session_id, terminal_id, **kwargs):
        self.log.append("terminal/wait_for_exit")
        entry = await self._finish(terminal_id)
        return WaitForTerminalExitResponse.model_validate({"exitCode": entry["code"]})

    async def terminal_output(self, session_id, terminal_id, **kwargs):
        self.log.append("terminal/output")
        entry = await self._finish(terminal_id)
        return TerminalOutputResponse.model_validate(
            {"output": entry["output"].decode(), "truncated": False, "exitStatus": {"exitCode": entry["code"]}}
        )

    async def kill_terminal(self, session_id, terminal_id, **kwargs):
        self.log.append("terminal/kill")
        self.terminals[terminal_id]["process"].kill()
        return KillTerminalResponse()

    async def release_terminal(self, session_id, terminal_id, **kwargs):
        self.log.append("terminal/release")
        self.terminals[terminal_id]["released"] = True
        return ReleaseTerminalResponse()


def spawn(editor, models, store, cwd):
    args = []
    for model in models:
        args += ["--model", model]
    return spawn_agent_process(
        editor, sys.executable, "-m", "trio_harness", "acp", *args, "--store", store, "--tools", "bash,plan",
        cwd=cwd, env=dict(os.environ),
    )


def dumped(options):
    return [o.model_dump(mode="json", by_alias=True, exclude_none=True) for o in options]


def text_of(updates):
    return "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")


async def main():
    first, second, store, cwd = sys.argv[1:5]
    out = {}
    editor = Editor()
    capabilities = ClientCapabilities.model_validate({"terminal": True})
    async with spawn(editor, [first, second], store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities)
        session = await conn.new_session(cwd=cwd, mcp_servers=[])
        sid = out["sessionId"] = session.session_id
        out["configOptions"] = dumped(session.config_options)
        start = len(editor.updates)
        out["statusStop"] = (await conn.prompt(session_id=sid, prompt=[text_block("/status")])).stop_reason
        out["status"] = text_of(editor.updates[start:])
        out["work"] = (await conn.prompt(session_id=sid, prompt=[text_block("plan and check")])).stop_reason
        model_values = [v["value"] for v in next(o for o in out["configOptions"] if o["id"] == "model")["options"]]
        changed = await conn.set_config_option(config_id="model", session_id=sid, value=model_values[1])
        out["changed"] = dumped(changed.config_options)
        start = len(editor.updates)
        await conn.prompt(session_id=sid, prompt=[text_block("and now?")])
        out["afterSwitch"] = text_of(editor.updates[start:])
    out["live"] = editor.updates
    out["log"] = editor.log
    out["released"] = [t["released"] for t in editor.terminals.values()]

    editor = Editor()
    async with spawn(editor, [first, second], store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=capabilities)
        loaded = await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        out["loadedOptions"] = dumped(loaded.config_options)
        out["replayed"] = list(editor.updates)
        start = len(editor.updates)
        await conn.prompt(session_id=sid, prompt=[text_block("after load")])
        out["afterLoad"] = text_of(editor.updates[start:])
    print(json.dumps(out))


asyncio.run(main())
'''


def check_summary(out: dict[str, Any]) -> None:
    """What both SDK clients must have seen."""
    options = {o["id"]: o for o in out["configOptions"]}
    assert set(options) == {"mode", "model"}
    values = [v["value"] for v in options["model"]["options"]]
    assert options["model"]["currentValue"] == values[0] and len(values) == 2
    assert out["statusStop"] == "end_turn" and "Model: " in out["status"] and "Mode: ask" in out["status"]
    assert out["work"] == "end_turn"
    live = out["live"]
    kinds = [u["sessionUpdate"] for u in live]
    assert "available_commands_update" in kinds
    commands = next(u for u in live if u["sessionUpdate"] == "available_commands_update")["availableCommands"]
    assert {"compact", "cost", "status"} <= {c["name"] for c in commands}
    plans = [u["entries"] for u in live if u["sessionUpdate"] == "plan"]
    assert plans == [PLAN]
    terminal_updates = [
        u
        for u in live
        if u["sessionUpdate"] == "tool_call_update" and any(c.get("type") == "terminal" for c in u.get("content", []))
    ]
    assert terminal_updates and terminal_updates[-1]["status"] == "failed"  # exit 2
    final_text = terminal_updates[-1]["content"][-1]["content"]["text"]
    assert final_text == "via-terminal\n[exit code: 2]"
    assert out["log"][:2] == ["session/request_permission", "terminal/create"]
    assert out["log"][-1] == "terminal/release" and out["released"] == [True]
    changed = {o["id"]: o for o in out["changed"]}
    assert changed["model"]["currentValue"] == values[1]
    assert out["afterSwitch"] == "answered by B"
    config_updates = [u for u in live if u["sessionUpdate"] == "config_option_update"]
    assert (
        config_updates
        and {o["id"]: o for o in config_updates[-1]["configOptions"]}["model"]["currentValue"] == values[1]
    )

    loaded = {o["id"]: o for o in out["loadedOptions"]}
    assert loaded["model"]["currentValue"] == values[1]
    replayed = out["replayed"]
    assert [u["entries"] for u in replayed if u["sessionUpdate"] == "plan"] == [PLAN]
    assert "available_commands_update" in [u["sessionUpdate"] for u in replayed]
    assert out["afterLoad"] == "answered by B"


async def test_the_python_sdk_as_an_editor(tmp_path: Path) -> None:
    first, second = scripts(tmp_path)
    args = (first, second, str(tmp_path / "store"), str(tmp_path))
    out = await run_python_client(tmp_path / "editor_client.py", PYTHON_CLIENT, *args)
    check_summary(out)


# ---------------------------------------------------------------- the TypeScript SDK

TS_CLIENT = Path(__file__).with_name("acp_ts_editor_client.mjs")

# The schema.json definition of each message the agent sends: by method (requests, notifications)
# or by the method of the client request it answers (responses).
AGENT_SENDS = {
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "terminal/create": "CreateTerminalRequest",
    "terminal/output": "TerminalOutputRequest",
    "terminal/wait_for_exit": "WaitForTerminalExitRequest",
    "terminal/kill": "KillTerminalRequest",
    "terminal/release": "ReleaseTerminalRequest",
}
ANSWERS = {
    "initialize": "InitializeResponse",
    "session/new": "NewSessionResponse",
    "session/load": "LoadSessionResponse",
    "session/prompt": "PromptResponse",
    "session/set_config_option": "SetSessionConfigOptionResponse",
    "session/set_mode": "SetSessionModeResponse",
    "session/close": "CloseSessionResponse",
}


def check_wire(root: Path, wire: list[dict[str, Any]]) -> int:
    """Check every raw message the agent sent against its definition in the SDK's ``schema.json``; the count."""
    schema = json.loads((root / "node_modules/@agentclientprotocol/sdk/schema/v1/schema.json").read_text("utf-8"))
    asked = {
        (e["run"], e["message"]["id"]): e["message"]["method"]
        for e in wire
        if e["from"] == "client" and "method" in e["message"] and "id" in e["message"]
    }
    checked = 0
    for entry in wire:
        message = entry["message"]
        if entry["from"] != "agent":
            continue
        assert message["jsonrpc"] == "2.0"
        if "method" in message:
            name, value = AGENT_SENDS[message["method"]], message["params"]
        else:
            assert "error" not in message, message
            name, value = ANSWERS[asked[(entry["run"], message["id"])]], message["result"]
        validator = jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})
        errors = [error.message for error in validator.iter_errors(value)]
        assert not errors, (name, value, errors)
        checked += 1
    return checked


async def test_the_typescript_sdk_as_an_editor_validating_every_message(tmp_path: Path) -> None:
    directory = sdk_dir()  # the TypeScript SDK test's cache (installed there when missing)
    first, second = scripts(tmp_path)
    env = {**os.environ, "PYTHON": sys.executable}
    # ES modules resolve packages from the script's directory: run a copy next to node_modules.
    script = directory / "acp_ts_editor_client.mjs"
    shutil.copyfile(TS_CLIENT, script)
    with trio.fail_after(WAIT * 2):
        result = await trio.run_process(
            ["node", str(script), first, second, str(tmp_path / "store"), str(tmp_path)],
            cwd=tmp_path,
            env=env,
            stdin=subprocess.DEVNULL,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert result.returncode == 0, result.stderr.decode()
    out = json.loads(result.stdout.decode().strip().splitlines()[-1])
    assert out["schemaErrors"] == [], out["schemaErrors"]
    assert out["validated"] > 20  # every message of both connections was checked
    assert check_wire(directory, out["wire"]) == sum(e["from"] == "agent" for e in out["wire"]) > 20
    check_summary(out)
