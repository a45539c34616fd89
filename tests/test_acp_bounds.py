"""The bounds on what the ACP bridge asks the client: late and missing answers, cleanup at shutdown.

- ``terminal/create`` answered after the call gave up: that terminal is killed
  and released when the answer arrives (tests/_acp_editor.py runs it as a real
  process), and the call already failed with an error naming the bound.
- ``fs/read_text_file`` / ``fs/write_text_file`` never answered: the call fails
  within the server's ``fs_timeout``, naming the request and the bound (a
  write: its outcome unknown); the late answer is dropped.
- The server shutting down (end of input, SIGTERM) releases every terminal of
  its running calls: over the real stdio transport, against a client that
  records the ``terminal/release`` it gets.
"""

from __future__ import annotations

import json
import signal
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _acp_clients import Msg, connected, open_server
from _acp_editor import EditorPeer, editor
from _util import wait_until
from test_acp_server import socket_streams

from trio_harness import ScriptedModel, allow_all
from trio_harness.acp import AcpServer
from trio_harness.acp import _jsonrpc as rpc
from trio_harness.bash import BashRuntimeOptions
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness


def call(name: str, **arguments: Any) -> Msg:
    return {"tool_calls": [{"name": name, "arguments": arguments}]}


def results(events: Any) -> list[ev.ToolResult]:
    return [e for e in events if isinstance(e, ev.ToolResult)]


async def prompt(peer: EditorPeer, session_id: str, text: str) -> Msg:
    result: Msg = await peer.call("session/prompt", peer.prompt_params(session_id, text))
    return result


async def test_a_terminal_created_after_the_bound_is_killed_and_released_when_the_answer_comes(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_harness.acp import _terminal

    monkeypatch.setattr(_terminal, "CLEANUP_TIMEOUT", 0.2)
    model = ScriptedModel([call("bash", command="sleep 60", timeout_ms=100), {"text": "ok"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            peer.hold_create = trio.Event()
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
            assert result.is_error and "did not answer terminal/create within 0.2s" in result.content
            assert peer.terminals == {}  # the call ended before the client created anything
            peer.hold_create.set()  # now the client creates it: the server lets it go
            await peer.wait_until(lambda: "terminal/release" in peer.asked)
            await trio.testing.wait_all_tasks_blocked()
            (terminal,) = peer.terminals.values()
            assert terminal.killed and terminal.released
            assert peer.asked == ["terminal/create", "terminal/kill", "terminal/release"]
            assert server._terminal is not None and not server._terminal.live


async def test_a_late_error_to_terminal_create_releases_nothing_and_the_connection_goes_on(tmp_path: Path) -> None:
    """A client that honours the $/cancel_request answers with an error: no terminal to release."""
    model = ScriptedModel([call("bash", command="sleep 60"), {"text": "second"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            message = await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            peer.hold["terminal/create"] = trio.Event()  # never set: the test answers the create itself
            await peer.wait_until(lambda: "terminal/create" in peer.asked)
            await peer.notify("session/cancel", {"sessionId": session_id})
            assert (await peer.response(message))["result"] == {"stopReason": "cancelled"}
            notice = await peer.wait_for(lambda m: m.get("method") == "$/cancel_request")
            # The client answers the abandoned create with the ACP cancellation error.
            cancelled = {"code": -32800, "message": "request cancelled"}
            await peer._send({"jsonrpc": "2.0", "id": notice["params"]["requestId"], "error": cancelled})
            assert await prompt(peer, session_id, "again") == {"stopReason": "end_turn"}
            assert peer.asked == ["terminal/create"] and peer.terminals == {}


@pytest.mark.parametrize("method", ["fs/read_text_file", "fs/write_text_file"])
async def test_an_unanswered_fs_request_fails_the_call_within_the_fs_timeout(tmp_path: Path, method: str) -> None:
    target = tmp_path / "notes.txt"
    first = call("read_file", path=str(target)) if method == "fs/read_text_file" else None
    step = first or call("write_file", path=str(target), content="new\n")
    model = ScriptedModel([step, {"text": "noted"}, {"text": "still here"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all) as harness:
        async with editor(harness, terminal=False, fs=True, ask_permission=False, fs_timeout=0.2) as (peer, _):
            peer.files[str(target)] = "old\n"
            if method == "fs/write_text_file":
                del peer.files[str(target)]  # a new file: the read that checks it answers "no such file"
            late = peer.hold[method] = trio.Event()
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            with trio.fail_after(10):  # the bound, not the test's WAIT, ends the call
                assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
            assert result.is_error
            assert f"the editor did not answer {method} for {target} within 0.2s (the fs_timeout)" in result.content
            if method == "fs/write_text_file":
                assert "whether the file was written is unknown" in result.content
            late.set()  # the answer comes after all: dropped, and the connection serves on
            await peer.wait_until(lambda: peer.asked.count(method) == 1)
            await trio.testing.wait_all_tasks_blocked()
            assert await prompt(peer, session_id, "again") == {"stopReason": "end_turn"}
            assert not [m for m in peer.received if "error" in m]
    assert not target.exists()  # the editor's file system, never the disk


def test_the_fs_timeout_must_be_positive() -> None:
    with pytest.raises(ValueError, match="fs_timeout must be positive"):
        AcpServer(harness=None, fs_timeout=0)  # type: ignore[arg-type]


@pytest.mark.parametrize("how", ["end of input", "SIGTERM"])
async def test_shutting_down_releases_the_terminal_of_a_running_call_over_stdio(tmp_path: Path, how: str) -> None:
    responses: list[Msg] = [call("bash", command="sleep 60")]
    async with open_server(tmp_path, responses, extra=("--yes",), tools="bash") as client:
        await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {"terminal": True}})
        session_id = await client.new_session(tmp_path)
        await client.send(client.prompt(session_id, "go"))
        create = await client.wait_for(lambda m: m.get("method") == "terminal/create")
        assert create["params"]["args"] == ["-c", "sleep 60"]
        await client.send({"jsonrpc": "2.0", "id": create["id"], "result": {"terminalId": "term-1"}})
        await client.wait_for(lambda m: m.get("method") == "terminal/wait_for_exit")  # the command runs
        if how == "SIGTERM":
            client.process.send_signal(signal.SIGTERM)
        else:
            await client.close_input()
        await client.wait_exit()
        await client.wait_for(lambda m: m.get("method") == "terminal/release")
        asked = [m for m in client.received if "id" in m and m.get("method", "").startswith("terminal/")]
        assert [m["method"] for m in asked] == [
            "terminal/create",
            "terminal/wait_for_exit",
            "terminal/kill",
            "terminal/release",
        ]
        assert {m["params"]["terminalId"] for m in asked[1:]} == {"term-1"}
        assert all(m["params"]["sessionId"] == session_id for m in asked)


async def test_a_client_that_stops_reading_is_disconnected_after_the_write_timeout() -> None:
    """Without the bound the writer waits forever, the reader too (backpressure), and serve never returns."""
    model = ScriptedModel([{"text": "x" * 200_000}])  # one answer far larger than the socket buffers
    async with open_test_harness(model) as harness:
        client, server_end = socket_streams()
        server = AcpServer(harness, write_timeout=0.5)
        async with client, server_end, trio.open_nursery() as nursery:
            served = trio.Event()

            async def serve() -> None:
                await server.serve(server_end, server_end)
                served.set()

            nursery.start_soon(serve)
            peer_messages = [
                {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}},
                {"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": {"cwd": "/tmp", "mcpServers": []}},
            ]
            await client.send_all(b"".join(json.dumps(m).encode() + b"\n" for m in peer_messages))
            await wait_until(lambda: len(server.session_ids) == 1)
            (session_id,) = server.session_ids
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "talk"}]}
            request = {"jsonrpc": "2.0", "id": 3, "method": "session/prompt", "params": prompt}
            await client.send_all(json.dumps(request).encode() + b"\n")
            with trio.fail_after(10):  # the write bound, not the test's, ends the connection
                await served.wait()
            assert server.session_ids == [] and harness.agents.get(session_id) is None
            nursery.cancel_scope.cancel()


async def test_a_client_that_ignores_the_output_byte_limit_gives_the_model_only_the_tail(tmp_path: Path) -> None:
    """The editor client of tests/_acp_editor.py answers terminal/output with everything, past outputByteLimit."""
    command = "head -c 100000 /dev/zero | tr '\\0' a; echo; echo the-end"
    model = ScriptedModel([call("bash", command=command), {"text": "ok"}])
    options = BashRuntimeOptions(tail_bytes=1000)
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all, bash_options=options) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            assert peer.asked[0] == "terminal/create"  # it ran in the client's terminal
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
    assert not result.is_error
    assert result.content.startswith("[output truncated: 99009 earlier bytes of stdout not shown]\n")
    assert result.content.endswith("\nthe-end")
    assert len(result.content) < 1100


async def test_a_late_answer_goes_to_on_late_even_when_it_races_the_cancel(monkeypatch: pytest.MonkeyPatch) -> None:
    sent: list[Msg] = []
    late: list[rpc.Response] = []
    requests = rpc.OutgoingRequests()

    async def ask(scope: trio.CancelScope) -> None:
        with scope:
            await requests.call(sent.append, "terminal/create", {}, on_late=late.append)

    # The answer arrives after the wait gave up: routed to on_late, once.
    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, scope)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()
    assert sent[-1] == {"jsonrpc": "2.0", "method": "$/cancel_request", "params": {"requestId": 1}}
    assert requests.resolve(rpc.Response(1, {"terminalId": "t1"}))
    assert not requests.resolve(rpc.Response(1, {"terminalId": "t1"}))
    assert late == [rpc.Response(1, {"terminalId": "t1"})]

    # The answer arrives after the cancel was delivered but before the waiting task ran again:
    # the call raises Cancelled, and the answer must not be lost with it.
    scope = trio.CancelScope()
    async with trio.open_nursery() as nursery:
        nursery.start_soon(ask, scope)
        await trio.testing.wait_all_tasks_blocked()
        scope.cancel()  # the waiter is rescheduled with Cancelled, not yet run
        assert requests.resolve(rpc.Response(2, {"terminalId": "t2"}))
    assert late[-1] == rpc.Response(2, {"terminalId": "t2"}) and len(late) == 2

    # At most LATE_LIMIT abandoned requests are remembered, the oldest forgotten first.
    monkeypatch.setattr(rpc, "LATE_LIMIT", 2)
    for _ in range(3):
        scope = trio.CancelScope()
        async with trio.open_nursery() as nursery:
            nursery.start_soon(ask, scope)
            await trio.testing.wait_all_tasks_blocked()
            scope.cancel()
    assert not requests.resolve(rpc.Response(3, {}))
    assert requests.resolve(rpc.Response(4, {})) and requests.resolve(rpc.Response(5, {}))
    requests.close()  # nothing is remembered past the connection
    assert requests.send_only(sent.append, "terminal/release", {}) is False


async def test_an_oversized_request_is_answered_under_its_id() -> None:
    """It was answered with a null id: the client's request (a prompt pasting a huge file) never ended."""
    async with open_test_harness(ScriptedModel([])) as harness:
        async with connected(harness, max_line_bytes=4096) as (peer, _, _):
            huge = {"sessionId": "s", "prompt": [{"type": "text", "text": "x" * 10_000}]}
            await peer.send({"jsonrpc": "2.0", "id": "big", "method": "session/prompt", "params": huge})
            error = (await peer.response("big"))["error"]
            assert error["code"] == -32600 and error["data"] == {"limit": 4096}
            assert error["message"] == (
                "invalid request (session/prompt): the message exceeds the 4096-byte line limit; discarded"
            )
            # A line whose start names no id is answered with a null id, as before.
            await peer.send({"jsonrpc": "2.0", "method": "session/prompt", "params": huge, "id": "late-id"})
            (nameless,) = [m for m in [await peer.receive()] if m.get("id") is None]
            assert "exceeds the 4096-byte line limit" in nameless["error"]["message"]
            assert (await peer.call("initialize", {"protocolVersion": 1}))["protocolVersion"] == 1


async def test_an_oversized_answer_to_fs_read_fails_the_call_at_once_naming_the_limit(tmp_path: Path) -> None:
    """It was discarded unrouted: the call waited for the whole fs_timeout, then blamed a silent editor."""
    target = tmp_path / "big.txt"
    model = ScriptedModel([call("read_file", path=str(target)), {"text": "noted"}])
    async with open_test_harness(model, builtin_tools=["files"], approver=allow_all) as harness:
        async with editor(harness, terminal=False, fs=True, ask_permission=False, max_line_bytes=4096) as (peer, _):
            peer.files[str(target)] = "y" * 10_000
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            with trio.fail_after(10):  # well within the default fs_timeout (30 s)
                assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
    assert result.is_error
    assert f"the editor could not read {target}: the client's answer was not read: " in result.content
    assert "the message exceeds the 4096-byte line limit" in result.content
    assert not [m for m in peer.received if "error" in m]  # a response is never answered


async def test_end_of_input_releases_the_terminal_of_every_session(tmp_path: Path) -> None:
    model = ScriptedModel([call("bash", command="sleep 60"), call("bash", command="sleep 61")])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            for _ in range(2):
                session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
                await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: peer.asked.count("terminal/wait_for_exit") == 2)
            assert isinstance(peer.stream, trio.StapledStream)
            await peer.stream.send_stream.aclose()  # end of input: the server shuts down
            await peer.wait_until(lambda: peer.asked.count("terminal/release") == 2)
            await trio.testing.wait_all_tasks_blocked()
            assert len(peer.terminals) == 2 and all(t.released and t.killed for t in peer.terminals.values())
            assert server._terminal is not None and not server._terminal.live


async def test_a_cleanup_waiting_for_an_answer_stops_waiting_when_input_ends(tmp_path: Path) -> None:
    """A close's kill the client never answers, then end of input: the release goes out at once.

    Without ``answers_stopped`` the kill's wait ran its whole CLEANUP_TIMEOUT (5 s) for an
    answer nobody could read any more, and only then was the release sent.
    """
    model = ScriptedModel([call("bash", command="sleep 60")])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            peer.mute_kill = True
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: "terminal/wait_for_exit" in peer.asked)
            await peer.send_request("session/close", {"sessionId": session_id})
            await peer.wait_until(lambda: "terminal/kill" in peer.asked)
            started = trio.current_time()
            assert isinstance(peer.stream, trio.StapledStream)
            await peer.stream.send_stream.aclose()
            await peer.wait_until(lambda: "terminal/release" in peer.asked)
            assert trio.current_time() - started < 2.5
            await trio.testing.wait_all_tasks_blocked()
            (terminal,) = peer.terminals.values()
            assert terminal.released


async def test_sessions_being_created_count_against_max_sessions() -> None:
    """Three session/new sent together with room for two: the third is refused, though none was open yet."""
    async with open_test_harness(ScriptedModel([])) as harness, connected(harness, max_sessions=2) as (peer, server, _):
        await peer.call("initialize", {"protocolVersion": 1})
        requests = [peer.request("session/new", {"cwd": "/", "mcpServers": []}) for _ in range(3)]
        await peer.send(*requests)
        replies = [await peer.response(request["id"]) for request in requests]
        refused = [reply["error"] for reply in replies if "error" in reply]
        assert len(refused) == 1 and refused[0]["code"] == rpc.TOO_MANY_SESSIONS
        assert "the cap (max_sessions = 2" in refused[0]["message"]
        assert len(server.session_ids) == 2
        # A refused or failed opening gives its slot back.
        await peer.call("session/close", {"sessionId": server.session_ids[0]})
        await peer.call("session/new", {"cwd": "/", "mcpServers": []})
        bad = peer.request("session/new", {"cwd": "/no/such/dir", "mcpServers": []})
        await peer.send(bad)
        assert (await peer.response(bad["id"]))["error"]["code"] == rpc.TOO_MANY_SESSIONS
        await peer.call("session/close", {"sessionId": server.session_ids[0]})
        for _ in range(3):  # a failing session/new (a bad cwd) holds no slot once answered
            bad = peer.request("session/new", {"cwd": "/no/such/dir", "mcpServers": []})
            await peer.send(bad)
            assert (await peer.response(bad["id"]))["error"]["code"] == rpc.INVALID_PARAMS
        await peer.call("session/new", {"cwd": "/", "mcpServers": []})


def test_max_sessions_must_be_at_least_one() -> None:
    with pytest.raises(ValueError, match="max_sessions must be at least 1"):
        AcpServer(harness=None, max_sessions=0)  # type: ignore[arg-type]
