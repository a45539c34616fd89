"""A cancelled AnthropicProvider.stream closes its connection at once, wherever it was waiting.

Mid event stream is pinned in tests/test_anthropic_provider.py; here: waiting
for the response's head, reading a whole JSON Message (a server that ignores
``stream: true``), reading an error body, and draining the body after
``message_stop``.  A real loopback server sees the connection go.
"""

from __future__ import annotations

import gc
import math

import pytest
import trio
import trio.testing
from _anthropic_streams import MESSAGE_STOP, message_delta, message_start
from _sse_server import Behaviour, Hang, Pause, Stream, start_server

from trio_harness.model import AnthropicProvider
from trio_harness.model._protocol import Chunk, ModelRequest, UserMessage

REQUEST = ModelRequest(model="", system="", messages=(UserMessage("hi"),))

CASES: dict[str, Behaviour] = {
    "head": Hang(),
    "json-message": Stream([b'{"type": "message", "content": [', Pause(1000.0)], content_type="application/json"),
    "error-body": Stream([b'{"type": "error", ', Pause(1000.0)], status=529, content_type="application/json"),
    "sse": Stream([message_start(), Pause(1000.0)]),
}


@pytest.mark.parametrize("where", CASES)
async def test_cancel_closes_the_connection_at_once(nursery: trio.Nursery, where: str) -> None:
    server = await start_server(nursery, CASES[where])
    base = server.base_url.removesuffix("/v1")
    chunks: list[Chunk] = []
    cancelled_at = math.inf
    async with AnthropicProvider(model="m", base_url=base, api_key="k", max_retries=3) as provider:
        with trio.fail_after(10):
            with trio.CancelScope() as scope:

                async def cancel() -> None:
                    nonlocal cancelled_at
                    while not server.requests:
                        await trio.sleep(0.005)
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    cancelled_at = trio.current_time()
                    scope.cancel()

                nursery.start_soon(cancel)
                await provider.stream(REQUEST, chunks.append)
                pytest.fail("stream() returned instead of raising Cancelled")
            assert scope.cancelled_caught
            await server.client_disconnected.wait()
            assert trio.current_time() - cancelled_at < 1.0
    assert chunks == [] and len(server.requests) == 1 and server.disconnects == 1
    gc.collect()


async def test_cancel_while_draining_after_message_stop_closes_the_connection(nursery: trio.Nursery) -> None:
    # message_stop ends the message; the provider then reads on briefly for the body's end (to reuse the
    # connection).  A cancellation there still closes it at once.
    pieces: list[bytes | Pause] = [message_start(), message_delta("end_turn", 1), MESSAGE_STOP, Pause(1000.0)]
    server = await start_server(nursery, Stream(pieces))
    base = server.base_url.removesuffix("/v1")
    chunks: list[Chunk] = []
    async with AnthropicProvider(model="m", base_url=base, api_key="k", max_retries=0) as provider:
        with trio.fail_after(10):
            with trio.CancelScope() as scope:
                cancelled_at = math.inf

                async def cancel() -> None:
                    # Once the server sent message_stop and everything waits (the provider in its
                    # 0.5 s drain), not at a fixed time: a loaded machine may not have connected yet.
                    nonlocal cancelled_at
                    while not server.requests:
                        await trio.sleep(0.005)
                    await trio.testing.wait_all_tasks_blocked(cushion=0.05)
                    cancelled_at = trio.current_time()
                    scope.cancel()

                nursery.start_soon(cancel)
                await provider.stream(REQUEST, chunks.append)
            assert scope.cancelled_caught
            await server.client_disconnected.wait()
            assert trio.current_time() - cancelled_at < 1.0
    assert chunks == []  # cancelled before the usage and finish were reported
