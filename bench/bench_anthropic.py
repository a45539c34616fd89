"""Benchmark: how fast AnthropicProvider parses a Messages stream of tiny text deltas, vs the official SDK.

A minimal HTTP/1.1 server in the same process (127.0.0.1, Trio) answers each
``POST /v1/messages`` with ``message_start``, a text block of 50,000
``content_block_delta`` events of one character each (``event:`` and
``data:`` lines, as the API sends them) written in large batches, then the
block's stop, ``message_delta`` and ``message_stop``.  The same bytes are read
by :class:`~trio_harness.model.AnthropicProvider` and by the official
``anthropic`` SDK's own stream (``AsyncAnthropic().messages.create(stream=True)``,
iterating its events and counting the text deltas: its SSE decoder and event
objects, nothing more), side by side, both under ``trio.run``.  Figures are
deltas per second of wall time, best of :data:`RUNS` runs.

The transport was chosen on a measurement this module also makes: a stream
cancelled mid-response, through the SDK under ``trio.run`` and through the
provider, and how long until the server sees the connection closed (the
SDK closes it at once too; see docs/models.rst, "The Anthropic provider").

Run with ``python bench/bench_anthropic.py`` (needs the bench group's ``anthropic``).
"""

from __future__ import annotations

import json
import time

import trio

from trio_harness.model._anthropic import AnthropicProvider
from trio_harness.model._protocol import Chunk, Finish, ModelRequest, ResponseInfo, TextDelta, Usage, UserMessage

DELTAS = 50_000
BATCH = 1_000
RUNS = 5
TARGET_RATIO = 1.5


def _event(obj: dict[str, object]) -> bytes:
    return f"event: {obj['type']}\ndata: {json.dumps(obj, separators=(',', ':'))}\n\n".encode()


_START = _event(
    {
        "type": "message_start",
        "message": {
            "id": "msg_1",
            "type": "message",
            "role": "assistant",
            "content": [],
            "model": "bench",
            "stop_reason": None,
            "stop_sequence": None,
            "usage": {"input_tokens": 25, "output_tokens": 1},
        },
    }
) + _event({"type": "content_block_start", "index": 0, "content_block": {"type": "text", "text": ""}})
_DELTA = _event({"type": "content_block_delta", "index": 0, "delta": {"type": "text_delta", "text": "x"}})
_TAIL = (
    _event({"type": "content_block_stop", "index": 0})
    + _event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": "end_turn", "stop_sequence": None},
            "usage": {"output_tokens": DELTAS},
        }
    )
    + _event({"type": "message_stop"})
)


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_one(stream: trio.SocketStream) -> None:
    buffer = b""
    batch = _chunk(_DELTA * BATCH)
    try:
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + _chunk(_START)
            )
            for _ in range(DELTAS // BATCH):
                await stream.send_all(batch)
            await stream.send_all(_chunk(_TAIL) + b"0\r\n\r\n")
    except trio.BrokenResourceError:
        return


class _Sink:
    """Counts text deltas; keeps every other chunk."""

    def __init__(self) -> None:
        self.count = 0
        self.others: list[Chunk] = []

    def emit(self, chunk: Chunk) -> None:
        if type(chunk) is TextDelta:
            self.count += 1
        else:
            self.others.append(chunk)


async def _ours(base_url: str) -> float:
    request = ModelRequest(model="", system="", messages=(UserMessage("go"),))
    rates = []
    async with AnthropicProvider(model="bench", base_url=base_url, api_key="k", max_retries=0) as provider:
        for _ in range(RUNS):
            sink = _Sink()
            start = time.perf_counter()
            await provider.stream(request, sink.emit)
            elapsed = time.perf_counter() - start
            count, others = sink.count, sink.others
            if count != DELTAS or others != [ResponseInfo("bench", "msg_1"), Usage(25, DELTAS), Finish("stop")]:
                raise RuntimeError(f"bad benchmark stream: {count} deltas, then {others}")
            rates.append(count / elapsed)
    return max(rates)


async def _sdk(base_url: str) -> float:
    import anthropic

    rates = []
    async with anthropic.AsyncAnthropic(api_key="k", base_url=base_url, max_retries=0) as client:
        for _ in range(RUNS):
            count = 0
            start = time.perf_counter()
            events = await client.messages.create(
                model="bench", max_tokens=10, messages=[{"role": "user", "content": "go"}], stream=True
            )
            async for event in events:
                if event.type == "content_block_delta" and event.delta.type == "text_delta":
                    count += 1
            elapsed = time.perf_counter() - start
            if count != DELTAS:
                raise RuntimeError(f"bad benchmark stream through the SDK: {count} deltas")
            rates.append(count / elapsed)
    return max(rates)


class _Hold:
    """A server that sends the start of a stream, then holds it open and notes when the client hangs up."""

    def __init__(self) -> None:
        self.sent = trio.Event()
        self.closed_at: float | None = None
        self.closed = trio.Event()

    async def serve(self, stream: trio.SocketStream) -> None:
        buffer = b""
        while b"\r\n\r\n" not in buffer:
            buffer += await stream.receive_some(65536)
        await stream.send_all(
            b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
            + _chunk(_START + _DELTA)
        )
        self.sent.set()
        try:
            while await stream.receive_some(65536):
                pass  # the request's body, then nothing until the client closes
        except trio.BrokenResourceError:
            pass
        self.closed_at = trio.current_time()
        self.closed.set()


async def _close_delay(use_sdk: bool) -> float:
    """Seconds from cancelling a stream mid-response to the server seeing its connection closed."""
    import anthropic

    hold = _Hold()
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        nursery.start_soon(trio.serve_listeners, hold.serve, listeners)
        base_url = f"http://127.0.0.1:{listeners[0].socket.getsockname()[1]}"
        with trio.CancelScope() as scope:

            async def cancel_once_sent() -> None:
                await hold.sent.wait()
                await trio.sleep(0.05)  # the client is blocked reading the rest
                scope.cancel()

            nursery.start_soon(cancel_once_sent)
            if use_sdk:
                async with anthropic.AsyncAnthropic(api_key="k", base_url=base_url, max_retries=0) as client:
                    events = await client.messages.create(
                        model="bench", max_tokens=10, messages=[{"role": "user", "content": "go"}], stream=True
                    )
                    async for _ in events:
                        pass
            else:
                request = ModelRequest(model="", system="", messages=(UserMessage("go"),))
                async with AnthropicProvider(model="bench", base_url=base_url, api_key="k") as provider:
                    await provider.stream(request, lambda chunk: None)
        cancelled_at = trio.current_time()
        with trio.fail_after(10):
            await hold.closed.wait()
        nursery.cancel_scope.cancel()
    assert hold.closed_at is not None
    return max(0.0, hold.closed_at - cancelled_at)


async def bench() -> list[dict[str, object]]:
    """Run the benchmark and return its rows: ours, the SDK's, and the ratio (the target applies)."""
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _serve_one, listeners)
        base_url = f"http://127.0.0.1:{port}"
        ours = await _ours(base_url)
        sdk = await _sdk(base_url)
        nursery.cancel_scope.cancel()
    ours_close, sdk_close = await _close_delay(False), await _close_delay(True)
    return [
        {
            "figure": "AnthropicProvider: a cancelled stream's connection closed after",
            "value": ours_close,
            "unit": "s",
            "target": "< 0.1 s",
        },
        {
            "figure": "the anthropic SDK under trio.run: a cancelled stream's connection closed after",
            "value": sdk_close,
            "unit": "s",
            "target": "report",
        },
        {
            "figure": "AnthropicProvider text deltas parsed per second (50k tiny Messages events, local)",
            "value": ours,
            "unit": "deltas/s",
            "target": "report",
        },
        {
            "figure": "for comparison: the anthropic SDK's own stream on the same bytes",
            "value": sdk,
            "unit": "deltas/s",
            "target": "report",
        },
        {
            "figure": "AnthropicProvider speed over the anthropic SDK's stream parser",
            "value": ours / sdk,
            "unit": "x",
            "target": f">= {TARGET_RATIO}x",
        },
    ]


def main() -> None:
    """Print the benchmark rows."""
    for row in trio.run(bench):
        value = row["value"]
        assert isinstance(value, float)
        print(f"{row['figure']}: {value:,.3f} {row['unit']} (target {row['target']})")


if __name__ == "__main__":
    main()
