"""How file tool calls and started calls are rendered as ACP updates (trio_harness/acp/_updates.py)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from _acp_clients import tool_statuses

from trio_harness.acp._fs import ClientFileSystem, ClientFs, client_fs
from trio_harness.acp._jsonrpc import PeerGoneError, Response
from trio_harness.acp._updates import live_update, replay_updates
from trio_harness.session import _events as ev
from trio_harness.session._recovery import INTERRUPTED_TOOL_RESULT
from trio_harness.tools._files_fs import FileToolError, LocalFileSystem


def requested(name: str, arguments: dict[str, object], call_id: str = "c1") -> ev.ToolCallRequested:
    return ev.ToolCallRequested(
        seq=1, ts=1.0, turn=2, step=1, call_id=call_id, name=name, arguments=json.dumps(arguments)
    )


def test_a_started_call_without_a_result_replays_in_progress_then_as_interrupted() -> None:
    events: list[ev.Event] = [
        requested("bash", {"command": "make"}),
        ev.ToolStarted(seq=2, ts=1.0, turn=2, step=1, call_id="c1", name="bash"),
    ]
    assert tool_statuses(list(replay_updates(events, "s"))) == {"2/c1": ["pending", "in_progress"]}
    text = INTERRUPTED_TOOL_RESULT.format(call_id="c1")
    events.append(ev.ToolResult(seq=3, ts=1.0, turn=2, step=1, call_id="c1", name="bash", content=text, is_error=True))
    updates = list(replay_updates(events, "s"))
    assert tool_statuses(updates) == {"2/c1": ["pending", "in_progress", "failed"]}
    assert updates[-1]["content"] == [{"type": "content", "content": {"type": "text", "text": text}}]


def test_file_calls_have_kinds_and_locations_relative_paths_made_absolute() -> None:
    read = live_update(requested("read_file", {"path": "src/a.py", "offset": 3}), "s", "/work")
    assert read is not None and read["kind"] == "read" and read["title"] == "read_file: src/a.py"
    assert read["locations"] == [{"path": "/work/src/a.py", "line": 3}]
    edit = live_update(requested("edit_file", {"path": "/abs/b.py", "old_text": "a", "new_text": "b"}), "s")
    assert edit is not None and edit["kind"] == "edit" and edit["locations"] == [{"path": "/abs/b.py"}]
    unknown_cwd = live_update(requested("write_file", {"path": "rel.txt", "content": ""}), "s")
    assert unknown_cwd is not None and "locations" not in unknown_cwd  # ACP locations are absolute
    bash = live_update(requested("bash", {"command": "ls", "path": "x"}), "s", "/work")
    assert bash is not None and "locations" not in bash


def test_a_write_result_is_a_diff_and_a_failed_one_is_text() -> None:
    detail = {"path": "/w/a.py", "old_text": "a\n", "new_text": "b\n", "fingerprint": {"size": 2, "sha256": "x"}}
    done = ev.ToolResult(seq=1, ts=1.0, turn=1, step=1, call_id="c", name="edit_file", content="edited", detail=detail)
    update = live_update(done, "s")
    assert update is not None and update["status"] == "completed"
    assert update["locations"] == [{"path": "/w/a.py"}]
    assert update["content"] == [{"type": "diff", "path": "/w/a.py", "oldText": "a\n", "newText": "b\n"}]
    failed = ev.ToolResult(
        seq=1, ts=1.0, turn=1, step=1, call_id="c", name="edit_file", content="error: no", is_error=True
    )
    update = live_update(failed, "s")
    assert update is not None and update["content"][0]["type"] == "content" and "locations" not in update


# ---------------------------------------------------------------- the editor's file system (acp/_fs.py)


def fake_client(answers: dict[str, Any], seen: list[tuple[str, Any]]) -> Any:
    async def call(method: str, params: Any, *, on_late: Any = None) -> Response:
        seen.append((method, params))
        answer = answers[params["path"]]
        if isinstance(answer, Exception):
            raise answer
        if isinstance(answer, dict) and "error" in answer:
            return Response(id=1, result=None, error=answer["error"])
        return Response(id=1, result=answer, error=None)

    return call


async def test_the_client_file_system_reads_buffers_and_words_its_errors(tmp_path: Path) -> None:
    on_disk = tmp_path / "on_disk.txt"
    on_disk.write_text("disk\n")
    seen: list[tuple[str, Any]] = []
    answers: dict[str, Any] = {
        "/buffer.py": {"content": "unsaved\n"},
        str(tmp_path / "missing.txt"): {"error": {"code": -32002, "message": "not found"}},
        str(on_disk): {"error": {"code": -32603, "message": "permission denied by the editor"}},
        "/bin.dat": {"content": "a\x00b"},
        "/big.txt": {"content": "x" * 101},
        "/gone.txt": PeerGoneError("closed"),
    }
    fs = ClientFileSystem("s1", fake_client(answers, seen), ClientFs(read=True, write=True), LocalFileSystem(100))
    content = await fs.read_text("/buffer.py")
    assert content is not None and content.text == "unsaved\n" and content.mtime_ns is None
    assert seen[-1] == ("fs/read_text_file", {"sessionId": "s1", "path": "/buffer.py"})
    assert await fs.read_text(str(tmp_path / "missing.txt")) is None  # not in the editor, not on disk
    with pytest.raises(FileToolError, match=r"the editor could not read .*: permission denied by the editor"):
        await fs.read_text(str(on_disk))
    with pytest.raises(FileToolError, match="binary file"):
        await fs.read_text("/bin.dat")
    with pytest.raises(FileToolError, match="more than the 100-byte limit"):
        await fs.read_text("/big.txt")
    with pytest.raises(FileToolError, match="the editor disconnected"):
        await fs.read_text("/gone.txt")
    with pytest.raises(FileToolError, match="is a directory"):
        await fs.read_text(str(tmp_path))
    answers["/w.txt"] = {}
    assert await fs.write_text("/w.txt", "new") is None
    assert seen[-1] == ("fs/write_text_file", {"sessionId": "s1", "path": "/w.txt", "content": "new"})
    answers["/w.txt"] = {"error": {"code": -32603, "message": "read-only buffer"}}
    with pytest.raises(FileToolError, match=r"the editor could not write /w.txt: read-only buffer"):
        await fs.write_text("/w.txt", "new")


async def test_each_fs_capability_is_used_on_its_own(tmp_path: Path) -> None:
    seen: list[tuple[str, Any]] = []
    local = tmp_path / "a.txt"
    local.write_text("local\n")
    fs = ClientFileSystem("s1", fake_client({}, seen), ClientFs(read=False, write=False), LocalFileSystem(100))
    content = await fs.read_text(str(local))
    assert content is not None and content.text == "local\n"
    await fs.write_text(str(local), "written\n")
    assert local.read_text() == "written\n" and seen == []
    assert client_fs({"clientCapabilities": {"fs": {"readTextFile": True}}}) == ClientFs(read=True, write=False)
    assert client_fs({"clientCapabilities": {"fs": {"readTextFile": "yes"}}}) == ClientFs()
    assert client_fs({"clientCapabilities": None}) == ClientFs() and client_fs(None) == ClientFs()
