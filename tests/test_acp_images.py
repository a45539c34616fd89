"""Images and resources in ACP prompts, over the real stdio transport: capability, log, model, replay on load."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest
from _acp_clients import Msg, conversation, open_server, run_python_client
from test_images import GIF, PNG

from trio_harness.session import JsonlStore
from trio_harness.session import _events as ev

PNG64 = base64.b64encode(PNG.data).decode()
GIF64 = base64.b64encode(GIF.data).decode()


def prompt_of(session_id: str, blocks: list[dict[str, Any]]) -> dict[str, Any]:
    return {"sessionId": session_id, "prompt": blocks}


def text_only_model(tmp_path: Path, responses: list[Msg]) -> tuple[str, ...]:
    """``--model`` of a scripted model that takes no images (open_server then gives no --model of its own)."""
    path = tmp_path / "text-only.json"
    path.write_text(json.dumps({"responses": responses, "supports_images": False}))
    return ("--model", f"scripted:{path}")


async def test_image_capability_follows_the_model(tmp_path: Path) -> None:
    async with open_server(tmp_path, []) as client:
        caps = (await client.initialize())["agentCapabilities"]["promptCapabilities"]
    assert caps == {"image": True, "audio": False, "embeddedContext": True}
    async with open_server(tmp_path, [], name="text", extra=text_only_model(tmp_path, [])) as client:
        caps = (await client.initialize())["agentCapabilities"]["promptCapabilities"]
    assert caps["image"] is False


async def test_images_and_resources_are_stored_reach_the_model_and_replay_on_load(tmp_path: Path) -> None:
    store = tmp_path / "store"
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": "compare these"},
        {"type": "image", "data": PNG64, "mimeType": "image/png"},
        {"type": "resource_link", "uri": "file:///work/notes.md", "name": "notes.md"},
        {"type": "resource", "resource": {"uri": "file:///work/a.py", "text": "print(1)\n", "mimeType": "text/x-py"}},
        {"type": "image", "data": GIF64, "mimeType": "image/gif", "uri": "file:///work/b.gif"},
    ]
    async with open_server(tmp_path, [{"text": "two images"}], store=store) as client:
        await client.initialize()
        session_id = await client.new_session(tmp_path)
        result = await client.call("session/prompt", prompt_of(session_id, blocks))
        assert result == {"stopReason": "end_turn"}
    loaded = await JsonlStore(store).load(session_id)
    (user,) = [e for e in loaded.events if isinstance(e, ev.UserMessage)]
    assert [part.image() for part in user.images] == [PNG, GIF]
    assert user.text == (
        'compare these\n\n[notes.md](file:///work/notes.md)\n\n<context uri="file:///work/a.py">\nprint(1)\n\n</context>'
    )
    # What the model was sent is rebuilt from this log (tests/test_images.py checks the rebuilt request).
    async with open_server(tmp_path, [], store=store, name="replay") as client:
        await client.initialize()
        await client.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        replayed = [u for u in client.updates(session_id) if u["sessionUpdate"] == "user_message_chunk"]
    assert [u["content"]["type"] for u in replayed] == ["text", "image", "image"]
    assert replayed[0]["content"]["text"] == user.text
    assert replayed[1]["content"] == {"type": "image", "data": PNG64, "mimeType": "image/png"}
    assert replayed[2]["content"] == {"type": "image", "data": GIF64, "mimeType": "image/gif"}
    assert len({u["messageId"] for u in replayed}) == 1  # one message


async def test_bad_image_blocks_are_invalid_params_naming_the_block(tmp_path: Path) -> None:
    async with open_server(tmp_path, []) as client:
        await client.initialize()
        session_id = await client.new_session(tmp_path)
        cases: list[tuple[dict[str, Any], str]] = [
            ({"type": "image", "data": PNG64, "mimeType": "image/svg+xml"}, "prompt[1] has mimeType 'image/svg+xml'"),
            ({"type": "image", "data": "not base64!", "mimeType": "image/png"}, "prompt[1] has data that is not valid"),
            ({"type": "image", "mimeType": "image/png"}, "prompt[1].data is required"),
            ({"type": "image", "data": "A" * (7 * 1024 * 1024), "mimeType": "image/png"}, "larger than the 5242880"),
            (
                {"type": "resource", "resource": {"uri": "file:///x.bin", "blob": PNG64}},
                "only text resources are supported",
            ),
        ]
        for block, message in cases:
            request = client.request("session/prompt", prompt_of(session_id, [{"type": "text", "text": "x"}, block]))
            error = await client.error(request)
            assert error["code"] == -32602, error
            assert message in error["message"], error
        assert conversation(client.updates(session_id)) == []  # nothing ran


async def test_an_image_prompt_to_a_model_that_takes_none_is_refused_naming_it(tmp_path: Path) -> None:
    extra = text_only_model(tmp_path, [{"text": "text only"}])
    async with open_server(tmp_path, [], extra=extra) as client:
        await client.initialize()
        session_id = await client.new_session(tmp_path)
        blocks = [{"type": "text", "text": "look"}, {"type": "image", "data": PNG64, "mimeType": "image/png"}]
        error = await client.error(client.request("session/prompt", prompt_of(session_id, blocks)))
        assert error["code"] == -32602
        assert "cannot send images" in error["message"] and "model 'scripted' does not take images" in error["message"]
        # nothing was queued or logged: the session goes on with text
        result = await client.call("session/prompt", prompt_of(session_id, [{"type": "text", "text": "ok"}]))
        assert result == {"stopReason": "end_turn"}


# ---------------------------------------------------------------- the official Python SDK as the client

SDK_SCRIPT = r'''
"""An ACP SDK client: an image prompt (with a link and a text resource), then session/load, validated by the SDK."""

import asyncio
import json
import os
import sys

from acp import (
    PROTOCOL_VERSION, embedded_text_resource, image_block, resource_block, resource_link_block, spawn_agent_process,
    text_block,
)
from acp.schema import SessionNotification


class Recorder:
    def __init__(self) -> None:
        self.updates = []

    def observe(self, event) -> None:
        message = event.message
        if message.get("method") == "session/update":
            notification = SessionNotification.model_validate(message["params"])
            self.updates.append(notification.update.model_dump(mode="json", by_alias=True, exclude_none=True))

    async def session_update(self, session_id, update, **kwargs):
        pass

    async def request_permission(self, *args, **kwargs):
        raise RuntimeError("the agent must not ask for permissions")


def spawn(recorder, model, store, cwd):
    return spawn_agent_process(
        recorder, sys.executable, "-m", "trio_harness", "acp", "--model", model, "--store", store,
        cwd=cwd, env=dict(os.environ), observers=[recorder.observe],
    )


async def main() -> None:
    model, store, cwd, png64 = sys.argv[1:5]
    summary = {}
    recorder = Recorder()
    async with spawn(recorder, model, store, cwd) as (conn, process):
        init = await conn.initialize(protocol_version=PROTOCOL_VERSION)
        summary["image"] = init.agent_capabilities.prompt_capabilities.image
        session = await conn.new_session(cwd=cwd, mcp_servers=[])
        summary["sessionId"] = session.session_id
        prompt = [
            text_block("what is this?"),
            image_block(png64, "image/png"),
            resource_link_block("notes.md", "file:///work/notes.md"),
            resource_block(embedded_text_resource("file:///work/a.py", "print(1)")),
        ]
        reply = await conn.prompt(session_id=session.session_id, prompt=prompt)
        summary["stopReason"] = reply.stop_reason
    recorder = Recorder()
    async with spawn(recorder, model, store, cwd) as (conn, process):
        await conn.initialize(protocol_version=PROTOCOL_VERSION)
        await conn.load_session(cwd=cwd, session_id=summary["sessionId"], mcp_servers=[])
        summary["replayed"] = [u for u in recorder.updates if u["sessionUpdate"] == "user_message_chunk"]
    print(json.dumps(summary))


asyncio.run(main())
'''


async def test_the_official_python_sdk_sends_an_image_prompt_and_validates_its_replay(tmp_path: Path) -> None:
    pytest.importorskip("acp")
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "a picture"}]}))
    args = (f"scripted:{script}", str(tmp_path / "store"), str(tmp_path), PNG64)
    summary = await run_python_client(tmp_path / "sdk_client.py", SDK_SCRIPT, *args)
    assert summary["image"] is True and summary["stopReason"] == "end_turn"
    replayed = summary["replayed"]
    assert [u["content"]["type"] for u in replayed] == ["text", "image"]
    assert replayed[0]["content"]["text"] == (
        'what is this?\n\n[notes.md](file:///work/notes.md)\n\n<context uri="file:///work/a.py">\nprint(1)\n</context>'
    )
    assert replayed[1]["content"]["data"] == PNG64 and replayed[1]["content"]["mimeType"] == "image/png"
