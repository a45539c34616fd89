"""How file tool calls and started calls are rendered as ACP updates (trio_harness/acp/_updates.py)."""

from __future__ import annotations

import json

from _acp_clients import tool_statuses

from trio_harness.acp._updates import live_update, replay_updates
from trio_harness.session import _events as ev
from trio_harness.session._recovery import INTERRUPTED_TOOL_RESULT


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
    assert read is not None and read["kind"] == "read"
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
