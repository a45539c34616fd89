"""End-to-end ACP tests: a real ``python -m trio_harness acp`` subprocess over pipes.

Each test writes a scripted model file to ``tmp_path``, spawns the server with
``--model scripted:PATH --store DIR`` and speaks JSON-RPC to it with the small
Trio client of ``tests/_acp_clients.py``.  Every wait is bounded with ``trio.fail_after``; nothing
sleeps on the real clock except while waiting for the subprocess.
"""

from __future__ import annotations

import os
from pathlib import Path

import trio
from _acp_clients import Msg, conversation, open_server, tool_ends, tool_statuses
from _util import WAIT

from trio_harness._errors import HarnessError
from trio_harness.acp._modes import mode_state
from trio_harness.session import JsonlStore
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced


async def stored_events(store: Path, session_id: str) -> tuple[ev.Event, ...]:
    loaded = await JsonlStore(store).load(session_id)
    return loaded.events


async def test_initialize_advertises_capabilities(tmp_path: Path) -> None:
    async with open_server(tmp_path, []) as client:
        result = await client.initialize()
    assert result["protocolVersion"] == 1
    caps = result["agentCapabilities"]
    assert caps["loadSession"] is True
    assert caps["promptCapabilities"]["embeddedContext"] is True
    assert caps["promptCapabilities"]["image"] is True  # the scripted model takes images (tests/test_acp_images.py)
    assert caps["sessionCapabilities"] == {"list": {}, "close": {}}
    assert result["authMethods"] == []
    assert result["agentInfo"]["name"] == "trio-harness"


async def test_prompt_with_tool_calls_streams_updates(tmp_path: Path) -> None:
    script: list[Msg] = [
        {
            "tool_calls": [
                {"name": "task_list", "arguments": {}},
                {"name": "bash", "arguments": {"command": "echo hi", "run_in_background": False}},
            ]
        },
        {"text": "All done here.", "reasoning": "The tools ran."},
    ]
    async with open_server(tmp_path, script, extra=("--yes",)) as client:
        await client.initialize()
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "list my tasks, then say hi")
        await client.send(prompt)
        reply = await client.response(prompt["id"])
        assert reply["result"] == {"stopReason": "end_turn"}
        updates = conversation(client.updates(session_id))
        # Every update of the prompt arrived before its answer.
        assert all(client.position(m) < client.position(reply) for m in client.received if m.get("method"))
    kinds = [u["sessionUpdate"] for u in updates]
    assert kinds[:6] == ["tool_call", "tool_call_update", "tool_call_update"] * 2
    calls = [u for u in updates if u["sessionUpdate"] == "tool_call"]
    results = tool_ends(updates)
    assert [c["title"] for c in calls] == ["task_list", "bash: echo hi"]
    assert [c["kind"] for c in calls] == ["read", "execute"]
    # pending until it runs, in_progress while it runs, then how it ended: never back
    assert tool_statuses(updates) == {c["toolCallId"]: ["pending", "in_progress", "completed"] for c in calls}
    assert calls[1]["rawInput"] == {"command": "echo hi", "run_in_background": False}
    assert [r["toolCallId"] for r in results] == [c["toolCallId"] for c in calls]
    assert [r["status"] for r in results] == ["completed", "completed"]
    bash_output = results[1]["content"][0]["content"]["text"]
    assert "hi" in bash_output
    thought = "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_thought_chunk")
    text = "".join(u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk")
    assert thought == "The tools ran."
    assert text == "All done here."
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    assert isinstance(events[-1], ev.TurnEnd)
    assert events[-1].reason == "completed"


async def test_failed_tool_call_reports_failed_status(tmp_path: Path) -> None:
    script: list[Msg] = [
        {"tool_calls": [{"name": "no_such_tool", "arguments": {}}]},
        {"text": "ok"},
    ]
    async with open_server(tmp_path, script) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "go")
        await client.send(prompt)
        reply = await client.response(prompt["id"])
    assert reply["result"]["stopReason"] == "end_turn"
    result = next(u for u in client.updates(session_id) if u["sessionUpdate"] == "tool_call_update")
    assert result["status"] == "failed"
    assert "unknown tool" in result["content"][0]["content"]["text"]


async def test_failing_tool_calls_are_failed_live_and_in_replay(tmp_path: Path) -> None:
    store = tmp_path / "store"
    calls: list[Msg] = [
        {"name": "bash", "arguments": {"command": "echo partial; exit 1", "run_in_background": False}},
        {"name": "no_such_tool", "arguments": {}},
        {"name": "bash", "arguments": {"command": "echo fine", "run_in_background": False}},
        {"name": "bash", "arguments": {"command": "kill -TERM $$", "run_in_background": False}},
    ]
    expected = ["failed", "failed", "completed", "failed"]
    async with open_server(
        tmp_path, [{"tool_calls": calls}, {"text": "ok"}], store=store, name="live", extra=("--yes",)
    ) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "go")
        await client.send(prompt)
        reply = await client.response(prompt["id"])
        assert reply["result"] == {"stopReason": "end_turn"}
        updates = client.updates(session_id)
        live = tool_ends(updates)
    assert [u["status"] for u in live] == expected
    # The unknown tool never ran: pending, then failed; the others ran (in_progress) first.
    ran = {"failed": ["pending", "in_progress", "failed"], "completed": ["pending", "in_progress", "completed"]}
    assert list(tool_statuses(updates).values()) == [
        ran["failed"],
        ["pending", "failed"],
        ran["completed"],
        ran["failed"],
    ]
    texts = [u["content"][0]["content"]["text"] for u in live]
    assert texts[0] == "partial\n[exit code: 1]"  # the text is the model's, unchanged
    assert "unknown tool" in texts[1]
    assert texts[2] == "fine"
    assert "[killed by signal SIGTERM]" in texts[3]

    async with open_server(tmp_path, [], store=store, name="replay") as client:
        load = client.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        await client.send(load)
        assert "result" in await client.response(load["id"])
        replayed_updates = client.updates(session_id)
    replayed = tool_ends(replayed_updates)
    assert [u["status"] for u in replayed] == expected
    assert [u["toolCallId"] for u in replayed] == [u["toolCallId"] for u in live]
    assert tool_statuses(replayed_updates) == tool_statuses(updates)  # in_progress replayed too, as live


async def test_model_error_is_an_agent_message_and_refusal_a_stop_reason(tmp_path: Path) -> None:
    script: list[Msg] = [
        {"error": {"message": "the provider is overloaded", "code": "http-529"}},
        {"error": {"message": "I will not do that", "code": "refusal"}},
        {"text": "fine"},
    ]
    async with open_server(tmp_path, script) as client:
        session_id = await client.new_session(tmp_path)
        first = client.prompt(session_id, "first")
        await client.send(first)
        # A failed model call is shown as agent text every editor displays, and
        # the turn ends normally; the failure is in _meta (docs/acp.rst).
        assert (await client.response(first["id"]))["result"] == {
            "stopReason": "end_turn",
            "_meta": {"trio-harness/failure": {"code": "http-529", "message": "the provider is overloaded"}},
        }
        shown = [u for u in client.updates(session_id) if u["sessionUpdate"] == "agent_message_chunk"]
        assert len(shown) == 1
        assert "The turn failed: the provider is overloaded (http-529)" in shown[0]["content"]["text"]
        refused = client.prompt(session_id, "second")
        await client.send(refused)
        assert (await client.response(refused["id"]))["result"] == {"stopReason": "refusal"}
        third = client.prompt(session_id, "third")
        await client.send(third)
        assert (await client.response(third["id"]))["result"] == {"stopReason": "end_turn"}


async def test_cancel_of_a_queued_prompt_prevents_it_from_running(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"text": "first response"}]) as client:
        session_id = await client.new_session(tmp_path)
        queued = client.prompt(session_id, "never run me")
        # Prompt and cancel arrive in one read: the cancel finds the prompt still queued.
        await client.send(queued, client.cancel(session_id))
        assert (await client.response(queued["id"]))["result"] == {"stopReason": "cancelled"}
        later = client.prompt(session_id, "run me")
        await client.send(later)
        assert (await client.response(later["id"]))["result"] == {"stopReason": "end_turn"}
        # The cancelled prompt never reached the model: the first response went to the later one.
        text = "".join(
            u["content"]["text"] for u in client.updates(session_id) if u["sessionUpdate"] == "agent_message_chunk"
        )
        assert text == "first response"
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    texts = [e.text for e in events if isinstance(e, ev.UserMessage)]
    assert texts == ["run me"]


async def test_cancel_mid_turn_answers_cancelled_and_the_session_goes_on(tmp_path: Path) -> None:
    script: list[Msg] = [
        {"tool_calls": [{"name": "task_list", "arguments": {}}]},
        {"hang": True},
        {"text": "after the cancel"},
    ]
    async with open_server(tmp_path, script) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "start")
        await client.send(prompt)
        await client.wait_for(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["update"]["sessionUpdate"] == "tool_call_update"
                and m["params"]["update"].get("status") == "completed"
            )
        )
        # The next model request hangs; cancel it.
        await client.send(client.cancel(session_id))
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
        again = client.prompt(session_id, "again")
        await client.send(again)
        assert (await client.response(again["id"]))["result"] == {"stopReason": "end_turn"}
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    ends = [e for e in events if isinstance(e, ev.TurnEnd)]
    assert [(e.reason, e.cause) for e in ends] == [("aborted", "user"), ("completed", None)]


async def test_second_prompt_on_a_busy_session_is_refused(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"hang": True}]) as client:
        session_id = await client.new_session(tmp_path)
        first = client.prompt(session_id, "one")
        await client.send(first)
        error = await client.error(client.prompt(session_id, "two"))
        assert error["code"] == -32003
        assert session_id in error["message"]
        await client.send(client.cancel(session_id))
        assert (await client.response(first["id"]))["result"] == {"stopReason": "cancelled"}


async def test_load_replays_history_before_answering(tmp_path: Path) -> None:
    store = tmp_path / "store"
    first_script: list[Msg] = [
        {"tool_calls": [{"name": "task_list", "arguments": {}}]},
        {"text": "The first answer."},
    ]
    async with open_server(tmp_path, first_script, store=store, name="first") as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "what tasks are running?")
        await client.send(prompt)
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "end_turn"}

    async with open_server(tmp_path, [{"text": "The second answer."}], store=store, name="second") as client:
        await client.initialize()
        listed = await client.call("session/list", {})
        info = next(s for s in listed["sessions"] if s["sessionId"] == session_id)
        assert info["title"] == "what tasks are running?"
        assert info["cwd"] == str(tmp_path)
        load = client.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        await client.send(load)
        reply = await client.response(load["id"])
        assert "result" in reply
        replayed = conversation(client.updates(session_id))
        assert all(
            client.position(m) < client.position(reply) for m in client.received if m.get("method") == "session/update"
        )
        assert [u["sessionUpdate"] for u in replayed] == [
            "user_message_chunk",
            "tool_call",
            "tool_call_update",  # in_progress (its tool/started)
            "tool_call_update",
            "agent_message_chunk",
        ]
        assert replayed[2]["status"] == "in_progress"
        assert replayed[0]["content"] == {"type": "text", "text": "what tasks are running?"}
        assert replayed[4]["content"] == {"type": "text", "text": "The first answer."}
        # A second load of the same session on this connection is refused.
        error = await client.error(
            client.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        )
        assert session_id in error["message"]
        # The loaded session takes prompts and continues its log.
        prompt = client.prompt(session_id, "and now?")
        await client.send(prompt)
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "end_turn"}
    events = await stored_events(store, session_id)
    assert_balanced(events)
    assert [e.turn for e in events if isinstance(e, ev.TurnStart)] == [1, 2]


async def request_stored(store: Path, session_id: str) -> None:
    """Wait until the session's log on disk holds a ``request/header`` (polling the file)."""
    with trio.fail_after(WAIT):
        while True:
            try:
                if any(isinstance(e, ev.RequestHeader) for e in await stored_events(store, session_id)):
                    return
            except HarnessError:  # not created yet
                pass
            await trio.sleep(0.01)


async def test_two_sessions_are_independent(tmp_path: Path) -> None:
    # One model serves both sessions in request order: A's request hangs, B's answers late.
    script: list[Msg] = [{"hang": True}, {"text": "B is done", "delay": 0.3}]
    async with open_server(tmp_path, script) as client:
        a = await client.new_session(tmp_path)
        b = await client.new_session(tmp_path)
        prompt_a = client.prompt(a, "A")
        await client.send(prompt_a)
        # A's request is in flight once its header is stored (the checkpoint right before it;
        # the first one creates the log on a worker thread, so B must not be sent before).
        await request_stored(tmp_path / "store", a)
        prompt_b = client.prompt(b, "B")
        await client.send(prompt_b)
        await client.call("initialize", {"protocolVersion": 1})  # B's request is in flight now
        await client.send(client.cancel(a))
        assert (await client.response(prompt_a["id"]))["result"] == {"stopReason": "cancelled"}
        assert (await client.response(prompt_b["id"]))["result"] == {"stopReason": "end_turn"}
        assert all(u["sessionUpdate"] != "agent_message_chunk" for u in client.updates(a))
        text_b = "".join(u["content"]["text"] for u in client.updates(b) if u["sessionUpdate"] == "agent_message_chunk")
        assert text_b == "B is done"
    events_a = await stored_events(tmp_path / "store", a)
    events_b = await stored_events(tmp_path / "store", b)
    assert [(e.reason, e.cause) for e in events_a if isinstance(e, ev.TurnEnd)] == [("aborted", "user")]
    assert [e.reason for e in events_b if isinstance(e, ev.TurnEnd)] == ["completed"]


async def test_close_disposes_the_session(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"hang": True}]) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "hang")
        await client.send(prompt)
        await client.call("initialize", {"protocolVersion": 1})
        assert await client.call("session/close", {"sessionId": session_id}) == {}
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
        error = await client.error(client.prompt(session_id, "gone?"))
        assert error["code"] == -32002
        assert session_id in error["message"]
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    end = events[-1]
    assert isinstance(end, ev.TurnEnd)
    assert (end.reason, end.cause) == ("aborted", "disposed")


async def test_disconnect_mid_turn_disposes_and_exits(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"hang": True}]) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "hang forever")
        await client.send(prompt)
        await client.call("initialize", {"protocolVersion": 1})  # the model request is in flight
        await client.close_input()
        assert await client.wait_exit() == 0
        # The pending prompt was answered while the server drained its output.
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
    assert client.process.returncode == 0
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    end = events[-1]
    assert isinstance(end, ev.TurnEnd)
    assert (end.reason, end.cause) == ("aborted", "disposed")


async def test_disconnect_racing_session_new_leaves_a_clean_store(tmp_path: Path) -> None:
    async with open_server(tmp_path, []) as client:
        new = client.request("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        await client.send(new)
        await client.close_input()
        assert await client.wait_exit() == 0
    for header in await JsonlStore(tmp_path / "store").list():
        assert_balanced(await stored_events(tmp_path / "store", header.id))


async def test_bad_input_is_answered_and_the_server_keeps_serving(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"text": "still alive"}], extra=("--max-line-bytes", "4096")) as client:
        # malformed JSON
        await client.send_raw(b'{"jsonrpc": "2.0", "id": 1, "method": \n')
        parse = await client.wait_for(lambda m: m.get("error", {}).get("code") == -32700)
        assert parse["id"] is None
        # not an object / no jsonrpc member
        await client.send_raw(b"[1, 2]\n")
        await client.wait_for(lambda m: m.get("error", {}).get("code") == -32600 and m["id"] is None)
        await client.send_raw(b'{"id": 77, "method": "initialize"}\n')
        missing = await client.response(77)
        assert missing["error"]["code"] == -32600
        # unknown method
        error = await client.error(client.request("session/teleport", {}))
        assert error["code"] == -32601
        assert "session/teleport" in error["message"]
        # invalid params name the field
        error = await client.error(client.request("session/new", {"mcpServers": []}))
        assert error["code"] == -32602
        assert "cwd" in error["message"]
        error = await client.error(client.request("session/new", {"cwd": "relative/dir", "mcpServers": []}))
        assert error["code"] == -32602
        assert "cwd" in error["message"]
        error = await client.error(client.request("initialize", {"protocolVersion": "one"}))
        assert error["code"] == -32602
        assert "protocolVersion" in error["message"]
        # unknown sessions are named
        error = await client.error(client.prompt("no-such-session", "hello?"))
        assert error["code"] == -32002
        assert "no-such-session" in error["message"]
        error = await client.error(
            client.request("session/load", {"sessionId": "missing-one", "cwd": str(tmp_path), "mcpServers": []})
        )
        assert error["code"] == -32002
        assert "missing-one" in error["message"]
        # an oversized line is refused without being buffered, then serving goes on
        before = len(client.received)
        await client.send_raw(b'{"jsonrpc":"2.0","id":500,"method":"initialize","params":{"x":"' + b"y" * 20000)
        await client.send_raw(b"y" * 20000 + b'"}}\n')
        oversized = await client.wait_for(
            lambda m: m.get("error") is not None and "line limit" in m["error"]["message"]
        )
        # Answered under its id (read from the line's start), so the client's request does not hang.
        assert oversized["id"] == 500 and "invalid request (initialize)" in oversized["error"]["message"]
        assert client.received.index(oversized) >= before
        # unknown notifications and stray responses are ignored
        await client.send({"jsonrpc": "2.0", "method": "client/ping", "params": {}})
        await client.send({"jsonrpc": "2.0", "id": 4242, "result": {}})
        count = len(client.received)
        # a valid exchange still works, and nothing answered the notification or the response
        result = await client.initialize()
        assert result["protocolVersion"] == 1
        assert len(client.received) == count + 1
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "are you there?")
        await client.send(prompt)
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "end_turn"}


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    state = next((line.split() for line in status.splitlines() if line.startswith("State:")), [])
    return len(state) > 1 and state[1] != "Z"


async def test_disconnect_kills_background_processes_of_its_sessions(tmp_path: Path) -> None:
    pid_file = tmp_path / "pid.txt"
    script: list[Msg] = [
        {
            "tool_calls": [
                {
                    "name": "bash",
                    "arguments": {"command": f"echo $$ > {pid_file}; exec sleep 60", "run_in_background": True},
                }
            ]
        },
        {"hang": True},
    ]
    async with open_server(tmp_path, script, extra=("--yes",)) as client:
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "start something long")
        await client.send(prompt)
        started = await client.wait_for(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["update"]["sessionUpdate"] == "tool_call_update"
                and m["params"]["update"].get("status") == "completed"
            )
        )
        assert "bash-1" in started["params"]["update"]["content"][0]["content"]["text"]
        with trio.fail_after(WAIT):
            while not pid_file.exists() or not pid_file.read_text().strip():
                await trio.sleep(0.02)  # waiting for the subprocess's grandchild
        pid = int(pid_file.read_text())
        assert process_alive(pid)
        await client.close_input()
        assert await client.wait_exit() == 0
    assert not process_alive(pid)
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)


async def test_sigterm_disposes_sessions_and_exits(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"hang": True}]) as client:
        session_id = await client.new_session(tmp_path)
        await client.send(client.prompt(session_id, "hang"))
        await client.call("initialize", {"protocolVersion": 1})
        client.process.terminate()
        assert await client.wait_exit() == 128 + 15
    events = await stored_events(tmp_path / "store", session_id)
    assert_balanced(events)
    end = events[-1]
    assert isinstance(end, ev.TurnEnd)
    assert (end.reason, end.cause) == ("aborted", "disposed")


async def test_meta_and_fields_of_newer_clients_are_accepted_on_every_method(tmp_path: Path) -> None:
    # Clients in the wild send _meta (trace context) and fields of newer protocol versions.
    meta = {"traceparent": "00-80e1afed08e019fc1110464cfa66635c-7a085853722dc6d2-01"}
    async with open_server(tmp_path, [{"text": "answered"}]) as client:
        result = await client.call(
            "initialize",
            {
                "protocolVersion": 1,
                "clientCapabilities": {"fs": {"readTextFile": True}, "terminal": True, "_meta": meta},
                "clientInfo": {"name": "editor", "version": "9.9"},
                "_meta": meta,
            },
        )
        assert result["protocolVersion"] == 1
        assert await client.call("authenticate", {"methodId": "none", "_meta": meta}) == {}
        new = {"cwd": str(tmp_path), "mcpServers": [], "additionalDirectories": [], "_meta": meta}
        session_id = (await client.call("session/new", new))["sessionId"]
        prompt = {
            "sessionId": session_id,
            "prompt": [{"type": "text", "text": "hi", "annotations": {"priority": 1.0}, "_meta": meta}],
            "_meta": meta,
        }
        assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        await client.send(
            {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id, "_meta": 5}}
        )
        assert await client.call("session/close", {"sessionId": session_id, "_meta": meta}) == {}
        listed = await client.call("session/list", {"cwd": str(tmp_path), "_meta": meta})
        assert [s["sessionId"] for s in listed["sessions"]] == [session_id]
        load = {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": [], "_meta": meta}
        loaded = await client.call("session/load", load)
        assert loaded["modes"] == mode_state("ask") and set(loaded) == {"modes", "configOptions"}


async def test_bad_params_are_invalid_params_for_requests_and_ignored_in_notifications(tmp_path: Path) -> None:
    async with open_server(tmp_path, []) as client:
        # A notification has nobody to answer: a bad session/cancel is dropped.
        await client.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": 7}})
        # The same as a request is answered with the field.
        error = await client.error(client.request("session/cancel", {"sessionId": 7}))
        assert error == {
            "code": -32602,
            "message": "invalid params for session/cancel: 'sessionId' must be a string, got 7",
            "data": {"field": "sessionId"},
        }
        error = await client.error(client.request("initialize", {"protocolVersion": 65536}))
        assert error["code"] == -32602
        assert error["data"] == {"field": "protocolVersion"}
        error = await client.error(
            client.request("session/prompt", {"sessionId": "s", "prompt": [{"type": "text", "text": 1}]})
        )
        assert error["code"] == -32602
        assert error["message"] == "invalid params for session/prompt: prompt[0].text must be a string, got 1"
        assert error["data"] == {"field": "prompt[0].text"}
        # Nothing above stopped the server.
        assert (await client.initialize())["protocolVersion"] == 1


async def test_sandbox_is_advertised_in_session_new_and_load_and_confines_bash(tmp_path: Path) -> None:
    store = tmp_path / "store"
    work = tmp_path / "work"
    work.mkdir()
    calls: list[Msg] = [
        {"name": "bash", "arguments": {"command": "echo made > made.txt"}},
        {"name": "bash", "arguments": {"command": "touch /etc/trio-harness-sandbox-test"}},
    ]
    advertised = {"trio-harness/sandbox": {"network": False, "writable": [str(work)], "hidden": []}}
    script: list[Msg] = [{"tool_calls": calls}, {"text": "ok"}]
    async with open_server(tmp_path, script, store=store, extra=("--sandbox", "--yes")) as client:
        result = await client.call("session/new", {"cwd": str(work), "mcpServers": []})
        assert result["_meta"] == advertised
        session_id = result["sessionId"]
        prompt = client.prompt(session_id, "go")
        await client.send(prompt)
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "end_turn"}
        updates = tool_ends(client.updates(session_id))
    assert [u["status"] for u in updates] == ["completed", "failed"]
    assert "Read-only file system" in updates[1]["content"][0]["content"]["text"]
    assert (work / "made.txt").read_text() == "made\n"
    assert not os.path.exists("/etc/trio-harness-sandbox-test")

    async with open_server(tmp_path, [], store=store, name="load", extra=("--sandbox",)) as client:
        loaded = await client.call("session/load", {"sessionId": session_id, "cwd": str(work), "mcpServers": []})
        assert {k: v for k, v in loaded.items() if k != "configOptions"} == {
            "_meta": advertised,
            "modes": mode_state("ask"),
        }
    async with open_server(tmp_path, [], store=store, name="plain") as client:
        assert "_meta" not in await client.call("session/new", {"cwd": str(work), "mcpServers": []})


async def test_modes_are_advertised_and_auto_runs_commands_without_asking(tmp_path: Path) -> None:
    script: list[Msg] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": "echo ran > out.txt"}}]},
        {"text": "done"},
    ]
    async with open_server(tmp_path, script) as client:
        await client.initialize()
        created = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        assert created["modes"] == mode_state("ask")
        assert [m["id"] for m in created["modes"]["availableModes"]] == ["ask", "auto"]
        session_id = created["sessionId"]
        bad = client.request("session/set_mode", {"sessionId": session_id, "modeId": "yolo"})
        assert (await client.error(bad))["data"] == {"field": "modeId"}
        assert await client.call("session/set_mode", {"sessionId": session_id, "modeId": "auto"}) == {}
        assert {"sessionUpdate": "current_mode_update", "currentModeId": "auto"} in client.updates(session_id)
        # In mode auto the command runs without a session/request_permission.
        assert await client.call("session/prompt", client.prompt(session_id, "go")["params"]) == {
            "stopReason": "end_turn"
        }
        assert not any(m.get("method") == "session/request_permission" for m in client.received)
    assert (tmp_path / "out.txt").read_text() == "ran\n"


async def test_cancel_request_for_a_pending_prompt_cancels_it(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"hang": True}, {"hang": True}]) as client:
        session_id = await client.new_session(tmp_path)
        # Twice: the session is free again after the first cancel (not left busy).
        for text in ("wait", "again"):
            prompt = client.prompt(session_id, text)
            await client.send(prompt)
            cancel = {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": prompt["id"]}}
            await client.send(cancel)
            assert (await client.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}


async def test_a_call_the_process_died_running_replays_in_progress_then_interrupted(tmp_path: Path) -> None:
    store = tmp_path / "store"
    calls: list[Msg] = [{"name": "bash", "arguments": {"command": "sleep 60", "run_in_background": False}}]
    async with open_server(
        tmp_path, [{"tool_calls": calls}, {"text": "never"}], store=store, name="live", extra=("--yes",)
    ) as client:
        session_id = await client.new_session(tmp_path)
        await client.send(client.prompt(session_id, "go"))
        await client.wait_for(
            lambda m: m.get("method") == "session/update" and m["params"]["update"].get("status") == "in_progress"
        )
        client.process.kill()  # SIGKILL while the command runs: tool/started is stored, no result
        await client.wait_exit()
    async with open_server(tmp_path, [], store=store, name="replay") as client:
        await client.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        updates = client.updates(session_id)
    # The resume logged the recovery result: the replay shows the call ran, then was interrupted.
    (statuses,) = tool_statuses(updates).values()
    assert statuses == ["pending", "in_progress", "failed"]
    (end,) = tool_ends(updates)
    assert "interrupted while it was running" in end["content"][0]["content"]["text"]
