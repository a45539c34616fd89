"""The file tools over ACP, seen by the official TypeScript SDK (``@agentclientprotocol/sdk``) as the client.

The SDK parses every ``session/update`` and every agent-to-client request
(``session/request_permission``, ``fs/read_text_file``, ``fs/write_text_file``)
with its zod schemas before its handlers see them, and the client parses the
answers to its own requests the same way.  Those parsers are lenient (a part
they do not recognise is dropped or defaulted, so the assertions on what the
handlers saw catch it); on top, every raw line the agent wrote is checked
against its exact definition in the SDK's official ``schema.json``
(``SessionNotification``, ``RequestPermissionRequest``, ``PromptResponse``,
...) with ``jsonschema``.

The SDK is installed with ``npm`` into a cache directory outside the checkout
(``$TRIO_HARNESS_NPM_CACHE``, default ``~/.cache/trio-harness/acp-ts-sdk``) on
first use; the client is ``tests/acp_ts_client.mjs``, run with ``node``.
Without ``node`` and ``npm`` (or the registry) the test skips, unless ``CI``
is set: then it fails.
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
from _util import WAIT

SDK = "@agentclientprotocol/sdk@^2.4"
CLIENT = Path(__file__).with_name("acp_ts_client.mjs")


def _missing(reason: str) -> None:
    if os.environ.get("CI"):
        pytest.fail(f"the TypeScript SDK test cannot run: {reason}")
    pytest.skip(f"the TypeScript SDK test needs node and npm: {reason}")


def sdk_dir() -> Path:
    """The cache directory holding ``node_modules/@agentclientprotocol/sdk`` (installed when missing)."""
    default = Path.home() / ".cache" / "trio-harness" / "acp-ts-sdk"
    root = Path(os.environ.get("TRIO_HARNESS_NPM_CACHE") or default)
    if (root / "node_modules" / "@agentclientprotocol" / "sdk" / "package.json").exists():
        return root
    npm = shutil.which("npm")
    if npm is None or shutil.which("node") is None:
        _missing("node or npm is not on PATH")
    root.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        [str(npm), "install", "--prefix", str(root), "--no-audit", "--no-fund", "--no-save", SDK],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if done.returncode != 0:
        _missing(f"npm install {SDK} failed: {done.stderr[-2000:]}")
    return root


# What each message the agent sends must be, by method (requests and notifications) or by the
# method of the client request it answers (responses): the definitions of the official schema.
AGENT_SENDS = {
    "session/update": "SessionNotification",
    "session/request_permission": "RequestPermissionRequest",
    "fs/read_text_file": "ReadTextFileRequest",
    "fs/write_text_file": "WriteTextFileRequest",
}
ANSWERS = {
    "initialize": "InitializeResponse",
    "session/new": "NewSessionResponse",
    "session/load": "LoadSessionResponse",
    "session/prompt": "PromptResponse",
}


def check_wire(root: Path, wire: list[dict[str, Any]]) -> int:
    """Check every message the agent sent against its definition in the SDK's ``schema.json``; the count."""
    path = root / "node_modules" / "@agentclientprotocol" / "sdk" / "schema" / "v1" / "schema.json"
    schema = json.loads(path.read_text(encoding="utf-8"))

    def validator(name: str) -> jsonschema.Draft202012Validator:
        return jsonschema.Draft202012Validator({"$defs": schema["$defs"], "$ref": f"#/$defs/{name}"})

    asked: dict[tuple[int, Any], str] = {}
    for entry in wire:
        message = entry["message"]
        if entry["from"] == "client" and "method" in message and "id" in message:
            asked[(entry["run"], message["id"])] = message["method"]
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
        errors = [e.message for e in validator(name).iter_errors(value)]
        assert not errors, (name, value, errors)
        checked += 1
    return checked


def write_script(path: Path, responses: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def by_call(updates: list[dict[str, Any]]) -> list[list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {}
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update"):
            seen.setdefault(update["toolCallId"], []).append(update)
    return list(seen.values())


async def test_the_typescript_sdk_validates_reads_edits_as_diffs_and_fs_round_trips(tmp_path: Path) -> None:
    root = await trio.to_thread.run_sync(sdk_dir)
    work = tmp_path / "work"
    work.mkdir()
    target = work / "a.py"
    target.write_text("value = 'on disk'\n")
    first = write_script(
        tmp_path / "first.json",
        [
            {"tool_calls": [call("read_file", path="a.py")]},
            {"tool_calls": [call("edit_file", path="a.py", old_text="'unsaved'", new_text="'fixed'")]},
            {"tool_calls": [call("write_file", path="new.txt", content="hello\n")]},
            {"text": "Fixed."},
        ],
    )
    second = write_script(tmp_path / "second.json", [])
    argv = ["node", str(CLIENT), str(root), sys.executable, first, second, str(tmp_path / "store"), str(work)]
    with trio.fail_after(WAIT * 3):
        done = await trio.run_process(
            [*argv, str(target)], cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    summary = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert summary["protocolVersion"] == 1 and summary["stop"] == "end_turn"
    # Every message the agent sent, live and on load, is what the official schema defines.
    assert check_wire(root, summary["wire"]) > 20

    new_path = str(work / "new.txt")
    assert [c for c in summary["fsCalls"] if c[0] == "write"] == [["write", str(target)], ["write", new_path]]
    assert summary["buffers"] == {str(target): "value = 'fixed'\n", new_path: "hello\n"}
    assert target.read_text() == "value = 'on disk'\n" and not (work / "new.txt").exists()

    edit_diff = {"type": "diff", "path": str(target), "oldText": "value = 'unsaved'\n", "newText": "value = 'fixed'\n"}
    edit_q, write_q = summary["questions"]
    assert edit_q["kind"] == "edit" and edit_q["content"] == [edit_diff]
    assert write_q["content"] == [{"type": "diff", "path": new_path, "oldText": None, "newText": "hello\n"}]

    for updates in (summary["live"], summary["replayed"]):
        read, edit, write = by_call(updates)
        assert read[0]["kind"] == "read" and read[0]["locations"] == [{"path": str(target)}]
        assert [u.get("status") for u in read if "status" in u] == ["pending", "in_progress", "completed"]
        assert edit[0]["kind"] == "edit" and edit[-1]["content"] == [edit_diff]
        assert [u.get("status") for u in edit if "status" in u] == ["pending", "in_progress", "completed"]
        assert write[-1]["content"] == [write_q["content"][0]]
