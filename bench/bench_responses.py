"""Benchmark: the OpenAI Responses stream, ResponsesProvider against the official ``openai`` SDK.

A minimal HTTP/1.1 server in the same process (127.0.0.1, Trio) answers each
``POST /v1/responses`` with the same bytes: ``response.created``, then
:data:`DELTAS` ``response.output_text.delta`` events exactly as OpenAI writes
them (``event:`` line, ``data:`` with ``item_id``, ``output_index``,
``content_index``, ``delta``, ``logprobs``, ``sequence_number``), written in
large batches, then ``response.completed``.  Both clients run under
``trio.run`` against it: :class:`~trio_harness.model.ResponsesProvider`
(``stream()``, text deltas emitted) and ``openai.AsyncOpenAI().responses.create(stream=True)``
(events iterated, text-delta events counted).  The figure is text deltas per
second of wall time for the whole call, best of :data:`RUNS` runs each, side
by side; the target is the ratio.

Run with ``python bench/bench_responses.py``.
"""

from __future__ import annotations

import importlib
import json
import time
from typing import Any

import trio

from trio_harness.model import Chunk, Finish, ModelRequest, ResponsesProvider, TextDelta, Usage, UserMessage

DELTAS = 50_000
BATCH = 1_000  # events per write
RUNS = 5
TARGET_RATIO = 1.5


def _event(obj: dict[str, object]) -> bytes:
    return b"event: %s\ndata: %s\n\n" % (str(obj["type"]).encode(), json.dumps(obj, separators=(",", ":")).encode())


_RESPONSE: dict[str, object] = {
    "id": "resp_bench",
    "object": "response",
    "created_at": 1741290958,
    "status": "in_progress",
    "model": "gpt-4.1",
    "output": [],
    "parallel_tool_calls": True,
    "tool_choice": "auto",
    "tools": [],
}


def _body() -> tuple[bytes, list[bytes], bytes]:
    head = _event({"type": "response.created", "response": _RESPONSE, "sequence_number": 0})
    batches = []
    for start in range(0, DELTAS, BATCH):
        batches.append(
            b"".join(
                _event(
                    {
                        "type": "response.output_text.delta",
                        "item_id": "msg_bench",
                        "output_index": 0,
                        "content_index": 0,
                        "delta": "x",
                        "logprobs": [],
                        "sequence_number": n + 1,
                    }
                )
                for n in range(start, start + BATCH)
            )
        )
    usage = {
        "input_tokens": 10,
        "input_tokens_details": {"cached_tokens": 0},
        "output_tokens": DELTAS,
        "output_tokens_details": {"reasoning_tokens": 0},
        "total_tokens": DELTAS + 10,
    }
    done = {**_RESPONSE, "status": "completed", "usage": usage}
    tail = _event({"type": "response.completed", "response": done, "sequence_number": DELTAS + 1})
    return head, batches, tail


def _chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def _serve_one(stream: trio.SocketStream) -> None:
    head, batches, tail = _BODY
    framed = [_chunk(batch) for batch in batches]
    buffer = b""
    try:
        while True:
            while b"\r\n\r\n" not in buffer:
                data = await stream.receive_some(65536)
                if not data:
                    return
                buffer += data
            request_head, _, buffer = buffer.partition(b"\r\n\r\n")
            length = 0
            for line in request_head.split(b"\r\n")[1:]:
                name, _, value = line.partition(b":")
                if name.strip().lower() == b"content-length":
                    length = int(value)
            while len(buffer) < length:
                buffer += await stream.receive_some(65536)
            buffer = buffer[length:]
            await stream.send_all(
                b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"
                + _chunk(head)
            )
            for piece in framed:
                await stream.send_all(piece)
            await stream.send_all(_chunk(tail) + b"0\r\n\r\n")
    except trio.BrokenResourceError:
        return


_BODY = _body()


class _Sink:
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
    best = 0.0
    async with ResponsesProvider(model="gpt-4.1", base_url=base_url, api_key="k", max_retries=0) as provider:
        for _ in range(RUNS):
            sink = _Sink()
            start = time.perf_counter()
            await provider.stream(request, sink.emit)
            elapsed = time.perf_counter() - start
            if sink.count != DELTAS or sink.others[-1] != Finish("stop") or not isinstance(sink.others[-2], Usage):
                raise RuntimeError(f"bad benchmark stream: {sink.count} deltas, then {sink.others}")
            best = max(best, sink.count / elapsed)
    return best


async def _sdk(base_url: str) -> float:
    # Imported by name, like bench/peers.py's peers: type checking does not need the SDK.
    openai: Any = importlib.import_module("openai")
    best = 0.0
    async with openai.AsyncOpenAI(base_url=base_url, api_key="k", max_retries=0) as client:
        for _ in range(RUNS):
            count = 0
            start = time.perf_counter()
            stream = await client.responses.create(model="gpt-4.1", input="go", stream=True)
            async with stream:
                async for event in stream:
                    if event.type == "response.output_text.delta" and event.delta:
                        count += 1
            elapsed = time.perf_counter() - start
            if count != DELTAS:
                raise RuntimeError(f"the SDK read {count} deltas")
            best = max(best, count / elapsed)
    return best


async def bench() -> list[dict[str, object]]:
    """Run the benchmark and return its figure rows.

    Returns:
        Rows ``{"figure", "value", "unit", "target"}``: ResponsesProvider's
        text deltas per second, the SDK's on the same bytes, and their ratio
        (the target).
    """
    async with trio.open_nursery() as nursery:
        listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
        port = listeners[0].socket.getsockname()[1]
        nursery.start_soon(trio.serve_listeners, _serve_one, listeners)
        base_url = f"http://127.0.0.1:{port}/v1"
        ours = await _ours(base_url)
        sdk = await _sdk(base_url)
        nursery.cancel_scope.cancel()
    return [
        {
            "figure": f"ResponsesProvider text deltas per second ({DELTAS // 1000}k Responses events, local)",
            "value": ours,
            "unit": "deltas/s",
            "target": "report",
        },
        {
            "figure": "the openai SDK's AsyncOpenAI responses stream on the same bytes (under trio)",
            "value": sdk,
            "unit": "deltas/s",
            "target": "report",
        },
        {
            "figure": "ResponsesProvider / openai SDK, Responses stream deltas per second",
            "value": ours / sdk,
            "unit": "x",
            "target": f">= {TARGET_RATIO} x",
        },
    ]


def main() -> None:
    """Print the benchmark rows."""
    for row in trio.run(bench):
        value = row["value"]
        assert isinstance(value, float)
        print(f"{row['figure']}: {value:,.2f} {row['unit']} (target {row['target']})")


if __name__ == "__main__":
    main()
