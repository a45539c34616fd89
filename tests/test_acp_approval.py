"""ACP approval: the official Python client answers ``session/request_permission`` over real stdio.

The SDK (``acp``) is asyncio-based, so its client runs in a separate Python
subprocess (the script below) that spawns ``trio-harness acp``; the test stays
on Trio, checks the JSON summary the script prints, the files the commands
would have written, and the stored session log (docs/approval.rst).
"""

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
from _acp_clients import open_server, run_python_client, tool_ends, tool_statuses
from _util import WAIT

from trio_harness.acp._jsonrpc import OutgoingRequests, PeerGoneError, Response
from trio_harness.acp._updates import TURN_END_META
from trio_harness.session import JsonlStore
from trio_harness.session import _events as ev

pytest.importorskip("acp")

SOURCE = str(Path(__file__).resolve().parent.parent)  # the checkout under test

CLIENT_SCRIPT = r'''
"""An ACP SDK client answering session/request_permission as told by its first argument."""

import asyncio
import json
import sys

from acp import PROTOCOL_VERSION, RequestError, spawn_agent_process, text_block
from acp.schema import AllowedOutcome, DeniedOutcome, RequestPermissionResponse

MODE, MODEL, STORE, CWD, SOURCE = sys.argv[1:6]


def dump(model):
    return model.model_dump(mode="json", by_alias=True, exclude_none=True)


class Client:
    def __init__(self):
        self.updates = []
        self.asked = []
        self.conn = None

    async def session_update(self, session_id, update, **kwargs):
        self.updates.append(dump(update))

    async def request_permission(self, session_id, tool_call, options, **kwargs):
        self.asked.append({"sessionId": session_id, "toolCall": dump(tool_call), "options": [dump(o) for o in options]})
        if MODE == "yes":
            raise RuntimeError("with --yes the agent must not ask")
        if MODE == "error":
            raise RequestError(-32000, "the user closed the dialog")
        if MODE == "cancel":
            # What an editor does when the user presses stop: cancel, then answer "cancelled".
            await self.conn.cancel(session_id=session_id)
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        if MODE == "cancelled":
            return RequestPermissionResponse(outcome=DeniedOutcome(outcome="cancelled"))
        return RequestPermissionResponse(outcome=AllowedOutcome(option_id=MODE, outcome="selected"))


async def main():
    client = Client()
    extra = ["--yes"] if MODE == "yes" else []
    command = ["-m", "trio_harness", "acp", "--model", MODEL, "--store", STORE, "--tools", "bash", *extra]
    # The SDK passes a trimmed environment: name the checkout under test explicitly.
    env = {"PYTHONPATH": SOURCE}
    async with spawn_agent_process(client, sys.executable, *command, cwd=CWD, env=env) as (conn, process):
        client.conn = conn
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        session = await conn.new_session(cwd=CWD, mcp_servers=[])
        reply = await conn.prompt(session_id=session.session_id, prompt=[text_block("go")])
        summary = {
            "sessionId": session.session_id,
            "stopReason": reply.stop_reason,
            "asked": client.asked,
            "updates": client.updates,
        }
    print(json.dumps(summary))


asyncio.run(main())
'''


def bash(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


ONE = "echo one >> out.txt"
TWO = "echo two >> out.txt"


async def run_client(tmp_path: Path, mode: str, responses: list[dict[str, Any]]) -> dict[str, Any]:
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    args = (mode, f"scripted:{model}", str(tmp_path / "store"), str(tmp_path), SOURCE)
    return await run_python_client(tmp_path / "client.py", CLIENT_SCRIPT, *args)


async def stored(tmp_path: Path, session_id: str) -> tuple[ev.Event, ...]:
    return (await JsonlStore(tmp_path / "store").load(session_id)).events


def decisions(events: tuple[ev.Event, ...]) -> list[tuple[str, str]]:
    return [(e.outcome, e.source) for e in events if isinstance(e, ev.ApprovalDecided)]


@pytest.mark.parametrize(
    ("mode", "asked", "lines", "outcomes"),
    [
        ("allow_once", 2, "one\ntwo\n", [("allow_once", "approver"), ("allow_once", "approver")]),
        ("allow_always", 1, "one\ntwo\n", [("allow_always", "approver"), ("allow_always", "remembered")]),
        ("reject_once", 2, None, [("deny", "approver"), ("deny", "approver")]),
        ("reject_always", 1, None, [("deny_always", "approver"), ("deny_always", "remembered")]),
    ],
)
async def test_the_clients_choice_applies(
    tmp_path: Path, mode: str, asked: int, lines: str | None, outcomes: list[tuple[str, str]]
) -> None:
    summary = await run_client(tmp_path, mode, [bash(ONE), bash(TWO), {"text": "done"}])
    assert summary["stopReason"] == "end_turn"
    assert len(summary["asked"]) == asked
    out = tmp_path / "out.txt"
    assert (out.read_text() if out.exists() else None) == lines
    events = await stored(tmp_path, summary["sessionId"])
    assert decisions(events) == outcomes

    # What the client was asked: the tool call it already saw, and the four options.
    request = summary["asked"][0]
    assert request["sessionId"] == summary["sessionId"]
    started = next(u for u in summary["updates"] if u["sessionUpdate"] == "tool_call")
    assert request["toolCall"] == {
        "toolCallId": started["toolCallId"],
        "title": f"bash: {ONE}",
        "kind": "execute",
        "status": "pending",
        "rawInput": {"command": ONE},
    }
    assert [(o["optionId"], o["kind"]) for o in request["options"]] == [
        ("allow_once", "allow_once"),
        ("allow_always", "allow_always"),
        ("reject_once", "reject_once"),
        ("reject_always", "reject_always"),
    ]
    # The call is pending until it is allowed, then runs; a denied one never runs (never in_progress).
    statuses = [u.get("status") for u in summary["updates"] if u.get("toolCallId") == started["toolCallId"]]
    assert statuses == (["pending", "failed"] if lines is None else ["pending", "in_progress", "completed"])
    results = tool_ends(summary["updates"])
    if lines is None:
        assert [r["status"] for r in results] == ["failed", "failed"]
        assert "error: denied" in results[0]["content"][0]["content"]["text"]
    else:
        assert [r["status"] for r in results] == ["completed", "completed"]


async def test_a_client_error_denies_the_call_with_its_message(tmp_path: Path) -> None:
    summary = await run_client(tmp_path, "error", [bash(ONE), {"text": "done"}])
    assert summary["stopReason"] == "end_turn"
    assert not (tmp_path / "out.txt").exists()
    (result,) = tool_ends(summary["updates"])
    assert result["status"] == "failed"
    assert "the user closed the dialog" in result["content"][0]["content"]["text"]
    events = await stored(tmp_path, summary["sessionId"])
    (decided,) = [e for e in events if isinstance(e, ev.ApprovalDecided)]
    assert (decided.outcome, decided.source) == ("deny", "approver")
    assert decided.message is not None and "the user closed the dialog" in decided.message


@pytest.mark.parametrize("mode", ["cancel", "cancelled"])
async def test_cancel_during_the_request_ends_it_as_cancelled(tmp_path: Path, mode: str) -> None:
    # "cancel": session/cancel, then the answer "cancelled" (what editors do);
    # "cancelled": the answer alone, which cancels the turn just the same.
    summary = await run_client(tmp_path, mode, [bash(ONE), {"text": "never reached"}])
    assert summary["stopReason"] == "cancelled"
    assert len(summary["asked"]) == 1
    assert not (tmp_path / "out.txt").exists()
    events = await stored(tmp_path, summary["sessionId"])
    (decided,) = [e for e in events if isinstance(e, ev.ApprovalDecided)]
    assert (decided.outcome, decided.source, decided.cause) == ("cancelled", "cancelled", "user")
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")


async def test_acp_yes_turns_asking_off(tmp_path: Path) -> None:
    summary = await run_client(tmp_path, "yes", [bash(ONE), {"text": "done"}])
    assert summary["stopReason"] == "end_turn"
    assert summary["asked"] == []
    assert (tmp_path / "out.txt").read_text() == "one\n"
    # Nobody was asked; the log still shows what ran (trio_harness.allow_all).
    assert decisions(await stored(tmp_path, summary["sessionId"])) == [("allow_once", "approver")]


async def test_a_disconnect_during_the_request_pauses_and_session_load_asks_again(tmp_path: Path) -> None:
    """Raw JSON lines over the server's real stdin/stdout; the client vanishes while asked.

    The turn ends paused (docs/approval.rst, "Paused approvals"); a new server
    process asked to ``session/load`` the session replays it, shows the call
    as waiting, and sends ``session/request_permission`` again; allowed, the
    command runs and the turn goes on.
    """
    model = tmp_path / "model.json"
    model.write_text(json.dumps({"responses": [bash(ONE), {"text": "never"}]}), encoding="utf-8")
    store = tmp_path / "store"
    command = [sys.executable, "-m", "trio_harness", "acp", "--model", f"scripted:{model}", "--store", str(store)]
    env = {**os.environ, "PYTHONPATH": SOURCE}
    process = await trio.lowlevel.open_process(
        command, cwd=tmp_path, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL
    )
    stdin, stdout = process.stdin, process.stdout
    assert stdin is not None and stdout is not None
    buffer = b""

    async def send(message: dict[str, Any]) -> None:
        await stdin.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def receive() -> dict[str, Any]:
        nonlocal buffer
        while b"\n" not in buffer:
            data = await stdout.receive_some()
            assert data, "the server closed its output"
            buffer += data
        line, _, buffer = buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message

    try:
        with trio.fail_after(WAIT):
            await send({"id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
            await send({"id": 2, "method": "session/new", "params": {"cwd": str(tmp_path), "mcpServers": []}})
            session_id = None
            while session_id is None:
                message = await receive()
                if message.get("id") == 2:
                    session_id = message["result"]["sessionId"]
            prompt = [{"type": "text", "text": "go"}]
            await send({"id": 3, "method": "session/prompt", "params": {"sessionId": session_id, "prompt": prompt}})
            while (message := await receive()).get("method") != "session/request_permission":
                pass
            assert message["params"]["sessionId"] == session_id
            await stdin.aclose()  # the client is gone, its answer never comes
            assert await process.wait() == 0
    finally:
        if process.returncode is None:
            process.kill()
        with trio.CancelScope(shield=True):
            await process.wait()
            await stdout.aclose()
            await stdin.aclose()
    assert not (tmp_path / "out.txt").exists()
    events = (await JsonlStore(store).load(session_id)).events
    assert [e for e in events if isinstance(e, ev.ApprovalDecided)] == []  # the question stays open
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("paused", "disposed")

    async with open_server(tmp_path, [{"text": "it ran"}], store=store, name="second") as client:
        await client.initialize()
        load = client.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        await client.send(load)
        asked = await client.wait_for(lambda m: m.get("method") == "session/request_permission")
        assert asked["params"]["sessionId"] == session_id
        assert asked["params"]["toolCall"]["rawInput"] == {"command": ONE}
        answered = await client.response(load["id"])
        assert "result" in answered
        assert client.position(asked) > client.position(answered)  # asked once the load has answered
        # The replay showed the paused call as waiting before the question came.
        replayed = client.updates(session_id)
        assert tool_statuses(replayed)[f"1/{events_call_id(events)}"] == ["pending"]
        assert any(u.get("_meta", {}).get(TURN_END_META, {}).get("reason") == "paused" for u in replayed)
        assert client.position(asked) > max(
            client.position(m) for m in client.received if m.get("method") == "session/update"
        )
        allow = {"outcome": {"outcome": "selected", "optionId": "allow_once"}}
        await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": allow})
        # The continuation turn is streamed as an unprompted turn: the call, its result, the answer.
        await client.wait_for(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["update"].get("updatedAt") is not None
                and client.position(m) > client.position(asked)
            )
        )
        after = [
            m["params"]["update"]
            for m in client.received[client.position(asked) :]
            if m.get("method") == "session/update"
        ]
        assert tool_statuses(after)["2/" + events_call_id(events)][-1] == "completed"
        assert "".join(u["content"]["text"] for u in after if u["sessionUpdate"] == "agent_message_chunk") == "it ran"
    assert (tmp_path / "out.txt").read_text() == "one\n"
    events = (await JsonlStore(store).load(session_id)).events
    assert [(e.turn, e.reason) for e in events if isinstance(e, ev.TurnEnd)] == [(1, "paused"), (2, "completed")]
    assert [(e.outcome, e.source) for e in events if isinstance(e, ev.ApprovalDecided)] == [("allow_once", "approver")]


def events_call_id(events: tuple[ev.Event, ...]) -> str:
    (asked,) = [e for e in events if isinstance(e, ev.ApprovalRequested)]
    return asked.call_id


# ---------------------------------------------------------------- outgoing requests (no I/O)


async def test_outgoing_requests_route_responses_and_forget_cancelled_waits() -> None:
    sent: list[dict[str, Any]] = []
    requests = OutgoingRequests()
    answers: list[Response] = []

    async def ask(method: str) -> None:
        answers.append(await requests.call(sent.append, method, {"q": method}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, "first")
        await trio.testing.wait_all_tasks_blocked()
        assert sent == [{"jsonrpc": "2.0", "id": 1, "method": "first", "params": {"q": "first"}}]
        assert requests.resolve(Response(1, result={"ok": True}))
    assert answers == [Response(1, result={"ok": True})] and len(requests) == 0

    # A cancelled wait stops at once, tells the peer, and ignores the late answer.
    with trio.CancelScope() as scope:
        scope.cancel()
        await requests.call(sent.append, "second", None)
    assert sent[-2:] == [
        {"jsonrpc": "2.0", "id": 2, "method": "second", "params": None},
        {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 2}},
    ]
    assert not requests.resolve(Response(2, result={"late": True}))

    # Closing the connection ends every wait with PeerGoneError; later calls fail at once.
    async with trio.open_nursery() as nursery:

        async def gone() -> None:
            with pytest.raises(PeerGoneError, match="disconnected before answering third"):
                await requests.call(sent.append, "third", None)

        nursery.start_soon(gone)
        await trio.testing.wait_all_tasks_blocked()
        requests.close()
    with pytest.raises(PeerGoneError, match="connection is closed"):
        await requests.call(sent.append, "fourth", None)
