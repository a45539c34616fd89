"""Benchmark: how fast OpenAIProvider parses a stream of tiny text deltas.

A minimal HTTP/1.1 server in the same process (127.0.0.1, Trio) answers one
chat completion request with 100,000 ``data: {"choices":[{"delta":{"content":"x"}}]}``
events written in large batches (chunked transfer encoding), then a finish
chunk and ``[DONE]``.  The figure is deltas emitted per second of wall time
for the whole ``provider.stream()`` call (connection included), best of
:data:`RUNS` runs (the machine may be shared).

Run with ``python bench/bench_provider.py``.
"""

from __future__ import annotations

import json
import time

import httpx
import trio
from httpx_sse import aconnect_sse

from trio_harness.model._openai import OpenAIProvider
from trio_harness.model._protocol import Chunk, Finish, ModelRequest, TextDelta, UserMessage

DELTAS = 100_000
BATCH = 2_000  # events per write
RUNS = 5
TARGET = 200_000.0

_EVENT = b'data: {"choices":[{"delta":{"content":"x"}}]}\n\n'
_TAIL = b'data: {"choices":[{"delta":{},"finish_reason":"stop"}]}\n\ndata: [DONE]\n\n'


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_one(stream: trio.SocketStream) -> None:
    """Answer every request on this connection with the benchmark stream."""
    buffer = b""
    batch = _chunk(_EVENT * BATCH)
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


async def _httpx_sse_rate(url: str) -> float:
    """The same stream read with ``httpx_sse`` and ``json.loads`` (the generic route)."""
    async with httpx.AsyncClient() as client:
        count = 0
        start = time.perf_counter()
        async with aconnect_sse(client, "POST", url, json={}) as source:
            async for event in source.aiter_sse():  # read to the end: no early break
                if event.data != "[DONE]" and json.loads(event.data)["choices"][0]["delta"].get("content"):
                    count += 1
        return count / (time.perf_counter() - start)


async def bench() -> list[dict[str, object]]:
    """Run the benchmark and return its figure rows.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``: text deltas parsed and
        emitted per second of wall time (best of :data:`RUNS` runs; the target
        applies), the same per second of process CPU time (steadier on a shared
        machine), and the ``httpx_sse`` route on the same stream for comparison.
    """
    request = ModelRequest(model="", system="", messages=(UserMessage("go"),))
    rates: list[float] = []
    cpu_rates: list[float] = []
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _serve_one, listeners)
        base_url = f"http://127.0.0.1:{port}/v1"
        async with OpenAIProvider(model="bench", base_url=base_url, max_retries=0) as provider:
            for _ in range(RUNS):
                sink = _Sink()
                start, cpu_start = time.perf_counter(), time.process_time()
                await provider.stream(request, sink.emit)
                elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu_start
                if sink.count != DELTAS or sink.others != [Finish("stop")]:
                    raise RuntimeError(f"bad benchmark stream: {sink.count} deltas, then {sink.others}")
                rates.append(sink.count / elapsed)
                cpu_rates.append(sink.count / cpu)
        generic = max([await _httpx_sse_rate(f"{base_url}/chat/completions") for _ in range(RUNS)])
        nursery.cancel_scope.cancel()
    return [
        {
            "figure": "OpenAIProvider text deltas parsed per second (100k tiny SSE events, local)",
            "value": max(rates),
            "unit": "deltas/s",
            "target": f">= {TARGET:,.0f} deltas/s",
        },
        {
            "figure": "OpenAIProvider text deltas per CPU second (process time, server included)",
            "value": max(cpu_rates),
            "unit": "deltas/s",
            "target": "report",
        },
        {
            "figure": "for comparison: httpx_sse + json.loads on the same stream",
            "value": generic,
            "unit": "deltas/s",
            "target": "report",
        },
    ]


def main() -> None:
    """Print the benchmark rows."""
    for row in trio.run(bench):
        value = row["value"]
        assert isinstance(value, float)
        print(f"{row['figure']}: {value:,.0f} {row['unit']} (target {row['target']})")


if __name__ == "__main__":
    main()
