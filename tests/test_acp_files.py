"""The file tools over ACP with the official Python SDK as the client (docs/editors.rst).

Edits show as ``kind: "edit"`` tool calls with ``locations`` and ``diff``
content (in the permission question too), reads as ``kind: "read"``, live and
after ``session/load``; a client that offers ``fs/read_text_file`` and
``fs/write_text_file`` gets the reads and writes, so the agent sees its unsaved
buffer and the edit lands in the editor, not on disk; a user typing into the
buffer between the agent's read and its edit makes the edit refused as stale.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _acp_clients import INFO_KINDS, run_python_client

pytest.importorskip("acp")

CLIENT_SCRIPT = r'''
"""An ACP SDK client holding an unsaved buffer: it serves fs/* and records every message, schema-checked."""

import asyncio
import json
import os
import sys

from acp import PROTOCOL_VERSION, spawn_agent_process, text_block
from acp.schema import (
    AllowedOutcome,
    ClientCapabilities,
    FileSystemCapabilities,
    ReadTextFileResponse,
    RequestPermissionResponse,
    SessionNotification,
    WriteTextFileResponse,
)


class Editor:
    def __init__(self, buffers, fs):
        self.buffers = buffers  # path -> unsaved text
        self.fs = fs
        self.updates = []
        self.questions = []
        self.fs_calls = []

    def observe(self, event):
        message = event.message
        if message.get("method") == "session/update":
            notification = SessionNotification.model_validate(message["params"])
            self.updates.append(notification.update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def session_update(self, session_id, update, **kwargs):
        pass

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        asked = tool_call.model_dump(mode="json", by_alias=True, exclude_none=True)
        self.questions.append(asked)
        if "'final'" in json.dumps(asked):  # the user types into the buffer while the edit is asked about
            path = asked["locations"][0]["path"]
            self.buffers[path] = self.buffers[path] + "# typed by the user\n"
        return RequestPermissionResponse(outcome=AllowedOutcome(outcome="selected", option_id="allow_once"))

    async def read_text_file(self, session_id, path, line=None, limit=None, **kwargs):
        self.fs_calls.append(["read", path])
        if path in self.buffers:
            return ReadTextFileResponse(content=self.buffers[path])
        with open(path, encoding="utf-8") as file:
            return ReadTextFileResponse(content=file.read())

    async def write_text_file(self, session_id, path, content, **kwargs):
        self.fs_calls.append(["write", path])
        self.buffers[path] = content
        return WriteTextFileResponse()


def spawn(editor, model, store, cwd):
    return spawn_agent_process(
        editor, sys.executable, "-m", "trio_harness", "acp", "--model", model, "--store", store,
        "--tools", "files", cwd=cwd, env=dict(os.environ), observers=[editor.observe],
    )


async def main():
    first, second, store, cwd, buffer_path = sys.argv[1:6]
    summary = {}
    editor = Editor({buffer_path: "value = 'unsaved'\n"}, True)
    caps = ClientCapabilities(fs=FileSystemCapabilities(read_text_file=True, write_text_file=True))
    async with spawn(editor, first, store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION, client_capabilities=caps)
        new = await conn.new_session(cwd=cwd, mcp_servers=[])
        sid = summary["sessionId"] = new.session_id
        summary["stop"] = (await conn.prompt(session_id=sid, prompt=[text_block("fix it")])).stop_reason
    summary["live"] = editor.updates
    summary["questions"] = editor.questions
    summary["fsCalls"] = editor.fs_calls
    summary["buffers"] = editor.buffers

    plain = Editor({}, False)  # no fs capabilities: the local disk
    async with spawn(plain, second, store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await conn.load_session(cwd=cwd, session_id=sid, mcp_servers=[])
        summary["replayed"] = list(plain.updates)
        plain.updates.clear()
        summary["secondStop"] = (await conn.prompt(session_id=sid, prompt=[text_block("again")])).stop_reason
    summary["secondLive"] = plain.updates
    summary["secondFsCalls"] = plain.fs_calls
    print(json.dumps(summary))


asyncio.run(main())
'''


def write_script(path: Path, responses: list[dict[str, Any]]) -> str:
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def by_call(updates: list[dict[str, Any]]) -> dict[str, list[dict[str, Any]]]:
    seen: dict[str, list[dict[str, Any]]] = {}
    for update in updates:
        if update["sessionUpdate"] in ("tool_call", "tool_call_update"):
            seen.setdefault(update["toolCallId"], []).append(update)
    return seen


async def test_edits_as_diffs_reads_and_fs_round_trips_against_an_unsaved_buffer_live_and_after_load(
    tmp_path: Path,
) -> None:
    work = tmp_path / "work"
    work.mkdir()
    target = work / "a.py"
    target.write_text("value = 'on disk'\n")
    first = write_script(
        tmp_path / "first.json",
        [
            {"tool_calls": [call("read_file", path="a.py")]},
            # old_text is the buffer's text, which the disk does not have: only the editor's read shows it.
            {"tool_calls": [call("edit_file", path="a.py", old_text="'unsaved'", new_text="'fixed'")]},
            {"tool_calls": [call("write_file", path="new.txt", content="hello\n")]},
            {"tool_calls": [call("edit_file", path="a.py", old_text="'fixed'", new_text="'final'")]},
            {"text": "Fixed."},
        ],
    )
    second = write_script(
        tmp_path / "second.json",
        [
            {"tool_calls": [call("read_file", path="a.py", offset=1, limit=1)]},
            {"tool_calls": [call("edit_file", path="a.py", old_text="'on disk'", new_text="'local'")]},
            {"text": "Done."},
        ],
    )
    args = (first, second, str(tmp_path / "store"), str(work), str(target))
    summary = await run_python_client(tmp_path / "editor_client.py", CLIENT_SCRIPT, *args)
    assert summary["stop"] == "end_turn" and summary["secondStop"] == "end_turn"

    # The editor served every read and write; the disk kept its text, and the edit is in the buffer.
    new_path = str(work / "new.txt")
    assert summary["fsCalls"] == [
        ["read", str(target)],  # read_file
        ["read", str(target)],  # the diff of edit_file's permission question
        ["read", str(target)],  # edit_file
        ["write", str(target)],
        ["read", new_path],  # write_file's question: no such file in the editor
        ["read", new_path],  # write_file
        ["write", new_path],
        ["read", str(target)],  # the second edit's question (then the user types into the buffer)
        ["read", str(target)],  # the second edit: stale, refused, nothing written
    ]
    writes = [c for c in summary["fsCalls"] if c[0] == "write"]
    assert writes == [["write", str(target)], ["write", new_path]]
    assert summary["buffers"][str(target)] == "value = 'fixed'\n# typed by the user\n"
    assert summary["buffers"][new_path] == "hello\n"
    assert not (work / "new.txt").exists()  # the disk of a.py is checked below: the second run's diff

    # The questions carry the diff.
    edit_q, write_q, _ = summary["questions"]
    assert edit_q["kind"] == "edit" and edit_q["locations"] == [{"path": str(target)}]
    assert edit_q["content"] == [
        {"type": "diff", "path": str(target), "oldText": "value = 'unsaved'\n", "newText": "value = 'fixed'\n"}
    ]
    assert write_q["content"] == [{"type": "diff", "path": new_path, "newText": "hello\n"}]  # oldText null

    live = by_call(summary["live"])
    read, edit, write, stale = live.values()
    assert stale[-1]["status"] == "failed"
    assert "has changed since it was last read" in stale[-1]["content"][0]["content"]["text"]
    assert read[0]["kind"] == "read" and read[0]["locations"] == [{"path": str(target)}]
    assert [u.get("status") for u in read] == ["pending", "in_progress", "completed"]
    assert read[-1]["locations"] == [{"path": str(target), "line": 1}]
    assert "1\tvalue = 'unsaved'" in read[-1]["content"][0]["content"]["text"]
    assert edit[0]["kind"] == "edit" and edit[0]["locations"] == [{"path": str(target)}]
    assert [u.get("status") for u in edit] == ["pending", "in_progress", "completed"]
    assert edit[-1]["content"] == edit_q["content"]
    assert write[-1]["content"] == [{"type": "diff", "path": new_path, "newText": "hello\n"}]

    # Replayed on load: the same kinds, locations and diffs.
    replayed = by_call([u for u in summary["replayed"] if u["sessionUpdate"] not in INFO_KINDS])
    r_read, r_edit, r_write, r_stale = replayed.values()
    assert r_stale[-1]["status"] == "failed" and r_stale[-1]["content"] == stale[-1]["content"]
    assert r_read[0]["kind"] == "read" and r_read[0]["locations"] == [{"path": str(target)}]
    assert r_edit[0]["kind"] == "edit" and r_edit[-1]["content"] == edit_q["content"]
    assert [u.get("status") for u in r_edit] == ["pending", "in_progress", "completed"]
    assert r_write[-1]["content"] == write[-1]["content"]

    # The second client offers no fs: the local disk, whose text differs from what the first run
    # wrote into the buffer, so the resumed agent's guard makes it read first (it did), then edit.
    assert summary["secondFsCalls"] == []
    second_live = by_call(summary["secondLive"])
    s_read, s_edit = second_live.values()
    assert s_read[0]["locations"] == [{"path": str(target), "line": 1}]
    assert s_edit[-1]["status"] == "completed", s_edit
    assert s_edit[-1]["content"] == [
        {"type": "diff", "path": str(target), "oldText": "value = 'on disk'\n", "newText": "value = 'local'\n"}
    ]
    assert target.read_text() == "value = 'local'\n"
