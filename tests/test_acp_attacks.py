"""Attacks on the ACP bridge: lying image blocks, and a client that is hostile or broken (docs/acp.rst).

The bounds on what the server asks the client (late and missing answers) are
tested in tests/test_acp_bounds.py.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest
import trio
import trio.testing
from _acp_clients import connected
from _acp_editor import editor

from trio_harness import ScriptedModel
from trio_harness.acp._jsonrpc import RpcError
from trio_harness.acp._params import PromptParams, decode_params
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

PNG = b"\x89PNG\r\n\x1a\n" + bytes(32)
JPEG = b"\xff\xd8\xff\xe0" + bytes(32)


def prompt(data: bytes, mime: str) -> dict[str, object]:
    block = {"type": "image", "data": base64.b64encode(data).decode(), "mimeType": mime}
    return {"sessionId": "s", "prompt": [{"type": "text", "text": "look"}, block]}


@pytest.mark.parametrize(
    ("data", "mime", "message"),
    [
        (JPEG, "image/png", "prompt[1] has mimeType 'image/png' but its data is an image/jpeg image"),
        (b"<svg onload=alert(1)>", "image/png", "its data is not a PNG, JPEG, GIF or WebP image"),
        (PNG, "image/webp", "mimeType 'image/webp' but its data is an image/png image"),
    ],
)
def test_an_image_whose_data_is_not_its_mime_type_is_invalid(data: bytes, mime: str, message: str) -> None:
    """Logged and resent in every later request, a lying image would make the provider refuse them all."""
    with pytest.raises(RpcError, match="invalid") as caught:
        decode_params(PromptParams, prompt(data, mime))
    assert caught.value.code == -32602 and message in caught.value.message


def test_an_image_that_is_what_it_says_is_taken() -> None:
    params = decode_params(PromptParams, prompt(PNG, "image/png"))
    assert [image.media_type for image in params.images] == ["image/png"]


# ---------------------------------------------------------------- a hostile or broken client


async def test_session_new_in_a_cwd_that_is_not_a_directory_is_invalid_params(tmp_path: Path) -> None:
    """It was accepted: every command and relative path of that session would fail."""
    a_file = tmp_path / "file.txt"
    a_file.write_text("x")
    async with open_test_harness(ScriptedModel([])) as harness, connected(harness) as (peer, server, _):
        for cwd in (tmp_path / "missing", a_file):
            message = peer.request("session/new", {"cwd": str(cwd), "mcpServers": []})
            await peer.send(message)
            error = (await peer.response(message["id"]))["error"]
            assert error["code"] == -32602 and error["data"] == {"field": "cwd"}
            assert f"'cwd' must be an existing directory, got {str(cwd)!r}" in error["message"]
        assert server.session_ids == [] and harness.agents.list() == []


async def test_session_cancel_sent_as_a_request_for_an_unknown_session_is_an_error() -> None:
    async with open_test_harness(ScriptedModel([])) as harness, connected(harness) as (peer, _, _):
        message = peer.request("session/cancel", {"sessionId": "no-such"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == -32002 and "unknown session 'no-such'" in error["message"]
        # The notification has nobody to answer: still ignored.
        await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": "no-such"}})
        assert (await peer.call("initialize", {"protocolVersion": 1}))["protocolVersion"] == 1


async def test_a_permission_granted_after_the_cancel_runs_nothing(tmp_path: Path) -> None:
    marker = tmp_path / "ran.txt"
    model = ScriptedModel([{"tool_calls": [{"name": "bash", "arguments": {"command": f"touch {marker}"}}]}])
    async with open_test_harness(model, builtin_tools=["bash"]) as harness:
        async with editor(harness, terminal=False) as (peer, _):
            late = peer.hold["session/request_permission"] = trio.Event()
            session_id = (await peer.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
            message = await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: "session/request_permission" in peer.asked)
            await peer.notify("session/cancel", {"sessionId": session_id})
            assert (await peer.response(message))["result"] == {"stopReason": "cancelled"}
            late.set()  # the user clicks "allow once" after all
            await trio.testing.wait_all_tasks_blocked()
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert not [e for e in agent.session.events if isinstance(e, ev.ToolStarted)]
    assert not marker.exists()


async def test_loading_a_session_live_on_another_connection_is_refused_and_leaves_it_alone(tmp_path: Path) -> None:
    model = ScriptedModel([{"text": "first"}, {"text": "still mine"}])
    async with open_test_harness(model) as harness, connected(harness) as (owner, _, _):
        await owner.call("initialize", {"protocolVersion": 1})
        session_id = (await owner.call("session/new", {"cwd": str(tmp_path), "mcpServers": []}))["sessionId"]
        async with connected(harness) as (other, other_server, _):
            await other.call("initialize", {"protocolVersion": 1})
            load = other.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
            close = other.request("session/close", {"sessionId": session_id})
            await other.send(load, close)
            error = (await other.response(load["id"]))["error"]
            assert error["code"] == -32602 and f"cannot load session {session_id!r}" in error["message"]
            assert "is live" in error["message"]
            assert (await other.response(close["id"]))["error"]["code"] == -32002
            assert other_server.session_ids == []
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
        assert await owner.call("session/prompt", prompt) == {"stopReason": "end_turn"}


async def test_a_slash_command_cancelled_in_the_same_read_answers_cancelled() -> None:
    """The command's task had not started when the cancel was read: the cancel was lost (end_turn)."""
    async with open_test_harness(ScriptedModel([])) as harness, connected(harness) as (peer, _, _):
        await peer.call("initialize", {"protocolVersion": 1})
        session_id = (await peer.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        prompt = peer.request(
            "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "/status"}]}
        )
        cancel = {"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}}
        await peer.send(prompt, cancel)
        assert (await peer.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
        assert not [u for u in peer.updates if u["sessionUpdate"] == "agent_message_chunk"]
        # The session takes the next command.
        again = {"sessionId": session_id, "prompt": [{"type": "text", "text": "/status"}]}
        assert await peer.call("session/prompt", again) == {"stopReason": "end_turn"}
