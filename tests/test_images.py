"""Images in user messages: the library's prompt types, the log, the rebuilt request, the chat-completions wire."""

from __future__ import annotations

import base64
import json
import os
import random
import struct
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any

import pytest
import trio
from _postgres import postgres_cluster, schema, store
from _sse_server import DONE, Stream, sse_finish, sse_text, start_server
from _util import WAIT

from trio_harness import Image, ModelError
from trio_harness.events import MAX_IMAGE_BYTES, ImagePart, InboxMessage
from trio_harness.model import ModelRequest, UserMessage, resolve_model
from trio_harness.model._images import load_image, sniff_media_type
from trio_harness.model._openai import OpenAIProvider
from trio_harness.model._replay import ReplayModel
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import JsonlStore, PostgresStore
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest


def png(width: int = 2, height: int = 1, seed: int = 0) -> bytes:
    """A real (valid) PNG file of random RGB pixels."""
    rng = random.Random(seed)

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    rows = b"".join(b"\x00" + bytes(rng.randrange(256) for _ in range(3 * width)) for _ in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


PNG = Image(png(), "image/png")
GIF = Image(b"GIF89a" + b"\x01\x00\x01\x00\x00\x00\x00;", "image/gif")


def last_user(request: ModelRequest) -> UserMessage:
    users = [m for m in request.messages if isinstance(m, UserMessage)]
    return users[-1]


# ---------------------------------------------------------------- the library


async def test_followup_with_text_and_images_reaches_the_model_and_the_log() -> None:
    model = ScriptedModel([{"text": "a cat"}, {"text": "ok"}, {"text": "fine"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup(["what is this?", PNG, "and this", GIF])
        await agent.when_idle()
        result = await agent.run(["and now?", PNG])
        agent.followup("plain text")
        await agent.when_idle()
        users = [e for e in agent.session.events if isinstance(e, ev.UserMessage)]
    assert result.output == "ok"
    first = last_user(model.requests[0])
    assert first.text == "what is this?\n\nand this"
    assert first.images == (PNG, GIF)
    assert last_user(model.requests[1]).images == (PNG,)
    # every later request carries the earlier images again, unchanged
    assert [m.images for m in model.requests[2].messages if isinstance(m, UserMessage)] == [(PNG, GIF), (PNG,), ()]
    assert users[0].images == (ImagePart.of(PNG), ImagePart.of(GIF))
    assert users[0].images[0].data == base64.b64encode(PNG.data).decode()
    assert users[2].images == ()


async def test_plain_text_messages_are_written_as_before() -> None:
    async with open_test_harness(ScriptedModel([{"text": "hi"}])) as h, h.agents.open() as agent:
        agent.followup("hello")
        await agent.when_idle()
        lines = [json.loads(line) for line in map(ev_line, agent.session.events)]
    assert all("images" not in line for line in lines)
    assert all("images" not in m for line in lines for m in line.get("inserted", ()))


def ev_line(event: ev.Event) -> str:
    from trio_harness.session import encode_event

    return encode_event(event)


async def test_bad_message_parts_are_refused_with_a_clear_error() -> None:
    async with open_test_harness(ScriptedModel([])) as h, h.agents.open() as agent:
        with pytest.raises(TypeError, match="message part 1 must be text or an Image, got int"):
            agent.followup(["text", 3])  # type: ignore[list-item]
        with pytest.raises(ValueError, match="empty sequence"):
            agent.followup([])
        with pytest.raises(TypeError, match="sequence of text and images, got bytes"):
            agent.followup(b"raw")  # type: ignore[arg-type]
        too_big = Image(b"\x89PNG\r\n\x1a\n" + bytes(MAX_IMAGE_BYTES), "image/png")
        with pytest.raises(ValueError, match=rf"{MAX_IMAGE_BYTES + 8} bytes, more than the {MAX_IMAGE_BYTES}"):
            agent.followup(["big", too_big])
        assert len(agent.inbox) == 0 and len(agent.session) == 0  # nothing was queued or logged
    with pytest.raises(ValueError, match="media_type must be one of"):
        Image(b"abc", "image/svg+xml")


async def check_resume(where: Any) -> None:
    """A resumed agent's request carries the same images as a never-restarted one's."""
    straight = ScriptedModel([{"text": "seen"}, {"text": "again"}])
    async with open_test_harness(straight) as h, h.agents.open(session_id="s") as agent:
        agent.followup(["look", PNG])
        await agent.when_idle()
        agent.followup("more")
        await agent.when_idle()
    first = ScriptedModel([{"text": "seen"}])
    async with open_test_harness(first, store=where) as h, h.agents.open(session_id="s") as agent:
        agent.followup(["look", PNG])
        await agent.when_idle()
        agent.inject(["pending", GIF])  # a pending message with an image survives too
    second = ScriptedModel([{"text": "again"}])
    async with open_test_harness(second, store=where) as h:
        handle = await h.agents.resume("s")
        assert [m.images for m in handle.agent.inbox.next_step] == [(ImagePart.of(GIF),)]
        handle.agent.inbox.clear()
        handle.agent.followup("more")
        await handle.agent.when_idle()
        await handle.dispose()
    assert second.requests[0] == straight.requests[-1]
    assert [m.images for m in second.requests[0].messages if isinstance(m, UserMessage)] == [(PNG,), ()]


async def test_images_survive_a_resume_jsonl(tmp_path: Path) -> None:
    await check_resume(tmp_path)
    log = (tmp_path / "s" / "session.jsonl").read_text()
    assert base64.b64encode(PNG.data).decode() in log  # inline, in the message's line


async def test_images_survive_a_resume_postgres(store: PostgresStore) -> None:
    await check_resume(store)


async def test_a_strict_replay_compares_the_images(tmp_path: Path) -> None:
    async with (
        open_test_harness(ScriptedModel([{"text": "seen"}]), store=tmp_path) as h,
        h.agents.open(session_id="rec") as agent,
    ):
        agent.followup(["look", PNG])
        await agent.when_idle()
    path = tmp_path / "rec" / "session.jsonl"
    replay = ReplayModel.from_file(path, strict=True)
    async with open_test_harness(replay) as h, h.agents.open() as agent:
        agent.followup(["look", PNG])
        await agent.when_idle()
        assert agent.session.events[-1].reason == "completed"  # type: ignore[attr-defined]
    assert last_user(replay.requests[0]).images == (PNG,)
    replay = ReplayModel.from_file(path, strict=True)
    async with open_test_harness(replay) as h, h.agents.open() as agent:
        agent.followup(["look", GIF])
        await agent.when_idle()
        end = agent.session.events[-1]
    assert isinstance(end, ev.TurnEnd) and end.failure is not None
    assert end.failure.code == "replay-diverged" and "image" in end.failure.message


async def test_an_agent_whose_model_takes_no_images_refuses_them_at_send() -> None:
    model = ScriptedModel([{"text": "text only"}], supports_images=False)
    async with open_test_harness(model) as h, h.agents.open() as agent:
        refused = r"cannot send images: scripted: model 'scripted' does not take images"
        for send in (agent.followup, agent.steer, agent.inject):
            with pytest.raises(ModelError, match=refused):
                send(["look", PNG])
        with pytest.raises(ModelError, match="does not take images"):
            await agent.run(["look", PNG])
        assert len(agent.inbox) == 0 and len(agent.session) == 0  # nothing queued or logged
        assert (await agent.run("text")).output == "text only"


async def test_a_session_with_images_resumed_on_a_model_without_fails_its_turns_naming_it(tmp_path: Path) -> None:
    async with open_test_harness(ScriptedModel([{"text": "seen"}]), store=tmp_path) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup(["look", PNG])
            await agent.when_idle()
    text_only = ScriptedModel([{"text": "never"}], supports_images=False)
    async with open_test_harness(text_only, store=tmp_path) as h:
        handle = await h.agents.resume("s")
        handle.agent.followup("and now?")
        await handle.agent.when_idle()
        end = handle.agent.session.events[-1]
        await handle.dispose()
    assert isinstance(end, ev.TurnEnd) and end.reason == "error" and end.failure is not None
    assert end.failure.code == "images-unsupported" and "does not take images" in end.failure.message
    assert text_only.remaining == 1


# ---------------------------------------------------------------- image files


def test_image_files_are_read_and_sniffed(tmp_path: Path) -> None:
    path = tmp_path / "shot.dat"  # the name does not matter, the content does
    path.write_bytes(PNG.data)
    assert load_image(path) == PNG
    jpeg = tmp_path / "a.jpg"
    jpeg.write_bytes(b"\xff\xd8\xff\xe0" + bytes(16))
    assert load_image(jpeg).media_type == "image/jpeg"
    assert sniff_media_type(b"RIFF\x00\x00\x00\x00WEBPVP8 ") == "image/webp"
    with pytest.raises(ModelError, match="does not exist"):
        load_image(tmp_path / "missing.png")
    svg = tmp_path / "x.png"
    svg.write_text("<svg/>")
    with pytest.raises(ModelError, match="is not a PNG, JPEG, GIF or WebP image"):
        load_image(svg)
    big = tmp_path / "big.png"
    big.write_bytes(PNG.data + bytes(MAX_IMAGE_BYTES))
    with pytest.raises(ModelError, match=f"larger than the {MAX_IMAGE_BYTES} bytes"):
        load_image(big)


# ---------------------------------------------------------------- the chat-completions wire format


async def test_chat_completions_sends_images_as_data_url_parts(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, Stream([sse_text("a cat"), sse_finish("stop"), DONE]))
    provider = OpenAIProvider(model="gpt-4o", base_url=server.base_url, api_key="k", max_retries=0)
    async with provider:
        async with open_test_harness(provider) as h, h.agents.open() as agent:
            result = await agent.run(["what is this?", PNG, GIF])
    assert result.output == "a cat"
    body = server.requests[0].json
    assert body["messages"][-1] == {
        "role": "user",
        "content": [
            {"type": "text", "text": "what is this?"},
            {"type": "image_url", "image_url": {"url": "data:image/png;base64," + base64.b64encode(PNG.data).decode()}},
            {"type": "image_url", "image_url": {"url": "data:image/gif;base64," + base64.b64encode(GIF.data).decode()}},
        ],
    }


async def test_chat_completions_without_images_refuses_before_sending(nursery: trio.Nursery) -> None:
    server = await start_server(nursery, Stream([sse_text("never"), sse_finish("stop"), DONE]))
    provider = resolve_model(f"openai:text-only@{server.base_url}")
    assert isinstance(provider, OpenAIProvider) and provider.supports_images
    provider.supports_images = False  # what a model catalog sets for a text-only model
    chunks: list[Any] = []
    async with provider:
        request = ModelRequest(model="", system="", messages=(UserMessage("look", images=(PNG,)),))
        await provider.stream(request, chunks.append)
    (finish,) = chunks
    assert finish.reason == "error" and finish.failure.code == "images-unsupported"
    assert "'text-only'" in finish.failure.message and "does not take images" in finish.failure.message
    assert server.requests == []


def test_deepseek_routes_take_no_images() -> None:
    provider = resolve_model("deepseek:deepseek-chat", env={"DEEPSEEK_API_KEY": "k"})
    assert isinstance(provider, OpenAIProvider) and not provider.supports_images


# ---------------------------------------------------------------- the command line


async def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def test_cli_run_attaches_image_files(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text(json.dumps({"responses": [{"text": "two pictures"}]}))
    (tmp_path / "a.png").write_bytes(PNG.data)
    (tmp_path / "b.gif").write_bytes(GIF.data)
    store = tmp_path / "store"
    result = await cli(
        "run", "compare", "--image", "a.png", "--image", "b.gif", "--model", f"scripted:{tmp_path / 'script.json'}",
        "--store", str(store), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "two pictures\n"
    session_id = next(line for line in result.stderr.decode().splitlines() if line.startswith("[session] "))
    loaded = await JsonlStore(store).load(session_id.split(" ", 1)[1])
    (user,) = [e for e in loaded.events if isinstance(e, ev.UserMessage)]
    assert user.text == "compare" and [part.image() for part in user.images] == [PNG, GIF]
    shown = await cli("sessions", "show", session_id.split(" ", 1)[1], "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    out = shown.stdout.decode()
    images = f"  [image] image/png, {len(PNG.data)} bytes\n  [image] image/gif, {len(GIF.data)} bytes"
    assert f"user: compare\n{images}" in out


async def test_cli_run_refuses_images_for_a_model_that_takes_none(tmp_path: Path) -> None:
    (tmp_path / "script.json").write_text(json.dumps({"responses": [{"text": "x"}], "supports_images": False}))
    (tmp_path / "a.png").write_bytes(PNG.data)
    result = await cli(
        "run", "look", "--image", "a.png", "--model", f"scripted:{tmp_path / 'script.json'}",
        "--store", str(tmp_path / "store"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert "--image: cannot send images: " in result.stderr.decode()
    assert "does not take images" in result.stderr.decode()
    assert not (tmp_path / "store").exists() or not any((tmp_path / "store").iterdir())


@pytest.mark.parametrize(
    ("content", "message"),
    [(None, "does not exist"), (b"<svg/>", "is not a PNG, JPEG, GIF or WebP image")],
    ids=["missing", "bad-type"],
)
async def test_cli_run_refuses_a_bad_image_file_before_the_model(
    tmp_path: Path, content: bytes | None, message: str
) -> None:
    if content is not None:
        (tmp_path / "x.png").write_bytes(content)
    result = await cli(
        "run", "look", "--image", "x.png", "--model", "scripted:/no/such/script.json",
        "--store", str(tmp_path / "store"), cwd=tmp_path,
    )  # fmt: skip
    assert result.returncode == 2
    assert f"--image: image file 'x.png' {message}" in result.stderr.decode()
    assert not (tmp_path / "store").exists()


async def test_a_message_with_images_posted_through_postgres_keeps_them(store: PostgresStore) -> None:
    async with (
        open_test_harness(ScriptedModel([{"text": "ok"}]), store=store) as h,
        h.agents.open(session_id="mail") as agent,
    ):
        agent.followup("hi")
        await agent.when_idle()
    message = InboxMessage("m1", "look", images=(ImagePart.of(PNG), ImagePart.of(GIF)))
    await store.post("mail", message)
    assert await store.pending_mail("mail") == [message]


async def test_estimates_and_summaries_account_for_images() -> None:
    from trio_harness.model import AssistantMessage
    from trio_harness.model._context import IMAGE_CHARS, message_chars

    assert message_chars(UserMessage("ab", images=(PNG, GIF))) == 2 + 2 * IMAGE_CHARS
    model = ScriptedModel([{"text": "seen"}, {"text": "next"}], summary="the summary")
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup(["look", PNG])
        await agent.when_idle()
        agent.followup("more")
        await agent.when_idle()
        assert await agent.compact(keep_tokens=0) is not None
    (summary_request,) = [r for r in model.requests if r.purpose == "compaction"]
    last = summary_request.messages[-1]
    assert isinstance(last, UserMessage)
    assert "User: look\n\nUser attached an image (image/png)\n\nAssistant: seen" in last.text
    assert not any(isinstance(m, AssistantMessage) for m in summary_request.messages)


def test_inbox_message_images_must_be_a_tuple_of_image_parts() -> None:
    # The validator's fast path for () (every message without images) still refuses the rest.
    assert InboxMessage("m1", "hi", images=()).images == ()
    for bad in ([], [ImagePart.of(PNG)], (PNG,), ("x",), None):
        with pytest.raises(TypeError, match="must be a tuple of ImagePart"):
            InboxMessage("m1", "hi", images=bad)  # type: ignore[arg-type]
