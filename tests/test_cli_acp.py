"""``trio-harness acp``'s bounds through the real command line: --fs-timeout, --write-timeout, --max-sessions.

Each test runs ``python -m trio_harness acp`` as a subprocess (``tests/_acp_clients.py``)
and speaks JSON-RPC over its pipes; waits are bounded on the real clock.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import trio
from _acp_clients import AcpClient, Msg, open_server, tool_ends, write_script
from _util import WAIT

from trio_harness.acp import _jsonrpc as rpc

ACP = [sys.executable, "-m", "trio_harness", "acp"]


@pytest.mark.parametrize(
    ("flag", "value", "complaint"),
    [
        ("--fs-timeout", "0", "'0' must be a positive number of seconds"),
        ("--fs-timeout", "soon", "'soon' is not a number of seconds"),
        ("--write-timeout", "-5", "'-5' must be a positive number of seconds"),
        ("--write-timeout", "nan", "'nan' must be a positive number of seconds"),
        ("--write-timeout", "inf", "'inf' must be a positive number of seconds"),
        ("--max-sessions", "0", "'0' must be positive"),
        ("--max-sessions", "2.5", "'2.5' is not an integer"),
    ],
)
def test_a_bad_bound_is_a_usage_error_naming_the_flag(tmp_path: Path, flag: str, value: str, complaint: str) -> None:
    script = write_script(tmp_path / "script.json", [])
    command = [*ACP, "--model", f"scripted:{script}", "--store", str(tmp_path / "store"), flag, value]
    done = subprocess.run(command, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=WAIT, check=False)
    assert done.returncode == 2
    assert done.stdout == ""  # nothing reaches the protocol stream
    assert f"trio-harness acp: error: argument {flag}: {complaint}" in done.stderr


def test_the_bounds_are_in_the_help(tmp_path: Path) -> None:
    done = subprocess.run([*ACP, "--help"], capture_output=True, text=True, timeout=WAIT, check=True)
    for flag in ("--fs-timeout SECONDS", "--write-timeout SECONDS", "--max-sessions N"):
        assert flag in done.stdout


async def test_fs_timeout_bounds_an_unanswered_fs_request(tmp_path: Path) -> None:
    """The editor advertises fs but never answers fs/read_text_file: the call fails after --fs-timeout."""
    target = tmp_path / "notes.txt"
    script: list[Msg] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": str(target)}}]},
        {"text": "noted"},
    ]
    extra = ("--yes", "--fs-timeout", "0.5")
    async with open_server(tmp_path, script, extra=extra, tools="files") as client:
        capabilities = {"fs": {"readTextFile": True, "writeTextFile": True}}
        await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": capabilities})
        session_id = await client.new_session(tmp_path)
        prompt = client.prompt(session_id, "read the notes")
        await client.send(prompt)
        with trio.fail_after(20):  # well within the default fs_timeout (30 s): the flag's bound ends the call
            reply = await client.response(prompt["id"])
        assert reply["result"] == {"stopReason": "end_turn"}
        asked = [m for m in client.received if m.get("method") == "fs/read_text_file"]
        assert len(asked) == 1 and asked[0]["params"]["path"] == str(target)
        failed = [u for u in tool_ends(client.updates(session_id)) if u["status"] == "failed"]
        assert len(failed) == 1
        text = json.dumps(failed[0])
        assert f"the editor did not answer fs/read_text_file for {target} within 0.5s (the fs_timeout)" in text


async def test_write_timeout_disconnects_a_client_that_stops_reading(tmp_path: Path) -> None:
    """The client never reads stdout: the answer (far larger than a pipe) cannot be written and the server ends."""
    script = write_script(tmp_path / "script.json", [{"text": "x" * 400_000}])
    stderr_path = tmp_path / "acp.stderr"
    command = [*ACP, "--model", f"scripted:{script}", "--store", str(tmp_path / "store"), "--tools", "none"]
    command += ["--write-timeout", "0.5"]
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=stderr, cwd=tmp_path
        )
    client = AcpClient(process)
    try:
        await client.send(client.request("initialize", {"protocolVersion": 1}))
        await client.send(client.request("session/new", {"cwd": str(tmp_path), "mcpServers": []}))
        # The session id is needed for the prompt: read just the two answers, then stop reading.
        buffer = b""
        with trio.fail_after(WAIT):
            while buffer.count(b"\n") < 2:
                buffer += await client.stdout.receive_some(1)  # one byte at a time: nothing beyond them is read
        answers = [json.loads(line) for line in buffer.splitlines()]
        session_id = next(a["result"]["sessionId"] for a in answers if a.get("id") == 2)
        await client.send(client.prompt(session_id, "talk"))
        with trio.fail_after(20):  # the write bound (default 120 s), not the test's, ends the server
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    errors = stderr_path.read_text(encoding="utf-8", errors="replace")
    assert code == 0, errors  # ended as after a disconnect
    assert "one message took over 0.5s to write" in errors
    assert "Traceback" not in errors


async def test_max_sessions_caps_the_sessions_of_one_connection(tmp_path: Path) -> None:
    async with open_server(tmp_path, [{"text": "hi"}], extra=("--max-sessions", "2")) as client:
        await client.initialize()
        first = await client.new_session(tmp_path)
        prompt = client.prompt(first, "hello")  # a session is stored from its first turn on (to load it later)
        await client.send(prompt)
        assert (await client.response(prompt["id"]))["result"] == {"stopReason": "end_turn"}
        await client.new_session(tmp_path)
        error = await client.error(client.request("session/new", {"cwd": str(tmp_path), "mcpServers": []}))
        assert error["code"] == rpc.TOO_MANY_SESSIONS
        assert "session/new refused: this connection has 2 sessions open, the cap (max_sessions = 2" in error["message"]
        assert "--max-sessions" in error["message"] and "session/close" in error["message"]
        assert error["data"] == {"maxSessions": 2}
        # session/load counts as well.
        await client.call("session/close", {"sessionId": first})
        third = await client.new_session(tmp_path)
        load = {"sessionId": first, "cwd": str(tmp_path), "mcpServers": []}
        error = await client.error(client.request("session/load", load))
        assert error["code"] == rpc.TOO_MANY_SESSIONS and "session/load refused" in error["message"]
        await client.call("session/close", {"sessionId": third})
        await client.call("session/load", load)
