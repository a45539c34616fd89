"""AnthropicProvider against a real server no one here wrote: LiteLLM's proxy, which serves ``/v1/messages``.

What LiteLLM's mock responses cover on ``/v1/messages`` (litellm 1.108):
``mock_response`` answers a whole JSON Message even with ``stream: true``
(text only; ``mock_tool_calls`` is not honoured there and falls through to
the real upstream).  So two routes are used: the mock, and a model whose
upstream is an OpenAI-compatible chat-completions server on 127.0.0.1
(``hosted_vllm/``: an ``openai/`` model would be sent to ``/v1/responses``)
(tests/_sse_server.py) - LiteLLM translates its stream into an Anthropic event
stream of its own making (``message_start``, text and ``tool_use`` blocks with
``input_json_delta``, ``message_delta``, ``message_stop``).

The proxy is a separate installation (``litellm[proxy]`` pins many packages):
``nox -s tests`` installs it into a venv of its own (``.nox/side-litellm``,
the version pinned in noxfile.py) and sets ``TRIO_HARNESS_LITELLM`` to its
``litellm`` executable.  Slow (the proxy takes seconds to start); under plain
pytest without the variable the test is skipped, saying how to enable it, and
with ``CI`` set it fails instead (tests/_receivers.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import httpx
import pytest
import trio
from _receivers import receiver
from _sse_server import DONE, Stream, sse, start_server

from trio_harness.model import AnthropicProvider
from trio_harness.model._protocol import (
    Chunk,
    Finish,
    ModelRequest,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
    UserMessage,
)

MASTER_KEY = "sk-trio-harness-test-master-key-0123456789"

pytestmark = pytest.mark.slow


@pytest.fixture
def litellm() -> str:
    """The proxy's executable (a fixture: a skip raised inside a Trio test loses its message)."""
    return receiver("TRIO_HARNESS_LITELLM", "the litellm executable of a `litellm[proxy]` installation")


def _chunk(finish: str | None = None, usage: dict[str, int] | None = None, **delta: object) -> bytes:
    """A chat-completion chunk with every field OpenAI sends."""
    choices = [] if usage is not None else [{"index": 0, "delta": delta, "finish_reason": finish, "logprobs": None}]
    obj: dict[str, object] = {
        "id": "chatcmpl-1",
        "object": "chat.completion.chunk",
        "created": 1700000000,
        "model": "backend",
        "system_fingerprint": None,
        "choices": choices,
    }
    if usage is not None:
        obj["usage"] = {**usage, "total_tokens": sum(usage.values())}
    return sse(obj)


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


async def _wait_ready(url: str, process: trio.Process) -> None:
    async with httpx.AsyncClient() as client:
        with trio.fail_after(120):
            while True:
                if process.returncode is not None:
                    raise RuntimeError(f"litellm exited with {process.returncode}")
                try:
                    if (await client.get(url + "/health/liveliness")).status_code == 200:
                        return
                except httpx.HTTPError:
                    pass
                await trio.sleep(0.2)


async def collect(provider: AnthropicProvider, request: ModelRequest) -> list[Chunk]:
    chunks: list[Chunk] = []
    with trio.fail_after(60):
        await provider.stream(request, chunks.append)
    return chunks


async def test_through_litellm_proxy(nursery: trio.Nursery, tmp_path: Path, litellm: str) -> None:
    call = {"index": 0, "id": "call_1", "type": "function", "function": {"name": "read", "arguments": ""}}
    # One upstream per model, each answering every request alike (LiteLLM also asks for /v1/models).
    upstream = await start_server(
        nursery,
        Stream(
            [
                _chunk(role="assistant", content=""),
                _chunk(content="Hello"),
                _chunk(content=" there"),
                _chunk("stop"),
                _chunk(usage={"prompt_tokens": 12, "completion_tokens": 3}),
                DONE,
            ]
        ),
    )
    tool_upstream = await start_server(
        nursery,
        Stream(
            [
                _chunk(role="assistant", content=None, tool_calls=[call]),
                _chunk(tool_calls=[{"index": 0, "function": {"arguments": '{"path": '}}]),
                _chunk(tool_calls=[{"index": 0, "function": {"arguments": '"a.txt"}'}}]),
                _chunk("tool_calls"),
                _chunk(usage={"prompt_tokens": 20, "completion_tokens": 5}),
                DONE,
            ]
        ),
    )
    port = _free_port()
    config = {
        "model_list": [
            {
                "model_name": "claude-upstream",
                "litellm_params": {"model": "hosted_vllm/backend", "api_base": upstream.base_url, "api_key": "sk-up"},
            },
            {
                "model_name": "claude-tools",
                "litellm_params": {
                    "model": "hosted_vllm/backend",
                    "api_base": tool_upstream.base_url,
                    "api_key": "sk-up",
                },
            },
            {
                "model_name": "claude-mock",
                "litellm_params": {
                    "model": "anthropic/claude-3-5-sonnet-20240620",
                    "api_key": "sk-fake",
                    "mock_response": "Hello from the mock!",
                },
            },
        ],
        "general_settings": {"master_key": MASTER_KEY},
    }
    path = tmp_path / "litellm.json"
    path.write_text(json.dumps(config))
    env = {**os.environ, "LITELLM_LOG": "ERROR", "NO_DOCS": "True"}
    log = (tmp_path / "litellm.log").open("wb")
    process = await nursery.start(
        lambda task_status: trio.run_process(
            [litellm, "--config", str(path), "--host", "127.0.0.1", "--port", str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            check=False,
            task_status=task_status,
        )
    )
    base = f"http://127.0.0.1:{port}"
    try:
        await _wait_ready(base, process)
        async with AnthropicProvider(
            model="claude-upstream", base_url=base, api_key=MASTER_KEY, max_retries=0
        ) as provider:
            request = ModelRequest(model="", system="Be brief.", messages=(UserMessage("hi"),))
            chunks = await collect(provider, request)
            assert "".join(c.text for c in chunks if isinstance(c, TextDelta)) == "Hello there", chunks
            assert chunks[-1] == Finish("stop")
            assert any(isinstance(c, Usage) and c.input_tokens == 12 and c.output_tokens == 3 for c in chunks)
            (sent,) = [json.loads(r.body) for r in upstream.requests if r.path.endswith("/chat/completions")]
            assert sent["messages"][0]["role"] == "system" and "Be brief." in json.dumps(sent["messages"][0])

            tools = (ToolSpec("read", "Read a file", {"type": "object", "properties": {"path": {"type": "string"}}}),)
            tool_request = ModelRequest(model="claude-tools", system="", messages=(UserMessage("go"),), tools=tools)
            chunks = await collect(provider, tool_request)
            calls = [c for c in chunks if isinstance(c, ToolCallDelta)]
            assert calls and calls[0].name == "read" and calls[0].id
            assert json.loads("".join(c.arguments for c in calls)) == {"path": "a.txt"}
            assert chunks[-1] == Finish("tool-calls")

            provider_mock = AnthropicProvider(model="claude-mock", base_url=base, api_key=MASTER_KEY, max_retries=0)
            async with provider_mock:
                chunks = await collect(provider_mock, request)
            assert chunks[0] == TextDelta("Hello from the mock!")
            assert chunks[-1] == Finish("stop")
    finally:
        process.terminate()
        with trio.move_on_after(10):
            await process.wait()
        log.close()
