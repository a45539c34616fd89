"""JSON-RPC framing of the ACP bridge, without a server: parsing, ``LineReader``,
``MessageWriter`` and ``Outbox`` (``trio_harness.acp._jsonrpc``).

Plain function calls over byte strings, and Trio memory streams where a reader or
writer needs one.  The server that uses them: ``tests/test_acp_server.py``.
"""

from __future__ import annotations

import json

import pytest
import trio
import trio.testing

from trio_harness.acp import _jsonrpc as rpc

# ---------------------------------------------------------------- LineReader


async def read_lines(data: list[bytes], *, limit: int, chunk: int = 7) -> list[object]:
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = rpc.LineReader(receive, max_line_bytes=limit, chunk_bytes=chunk)
    for piece in data:
        await send.send_all(piece)
    await send.aclose()
    out: list[object] = []
    while (line := await reader.receive_line()) is not None:
        out.append(line)
    return out


async def test_line_reader_splits_lines_across_chunks() -> None:
    lines = await read_lines([b'{"a":1}\r\n{"b"', b":2}\n\n", b"tail-without-newline"], limit=100)
    assert lines == [b'{"a":1}', b'{"b":2}', b"", b"tail-without-newline"]


async def test_line_reader_refuses_oversized_lines_and_recovers() -> None:
    data = [b"short\n", b"x" * 50, b"x" * 50, b"\nafter\n", b"y" * 30 + b"\nlast\n"]
    lines = await read_lines(data, limit=20)
    assert lines == [b"short", rpc.OVERSIZED, b"after", rpc.OVERSIZED, b"last"]


async def test_line_reader_never_buffers_more_than_the_limit_plus_a_chunk() -> None:
    send, receive = trio.testing.memory_stream_one_way_pair()
    reader = rpc.LineReader(receive, max_line_bytes=64, chunk_bytes=16)
    async with trio.open_nursery() as nursery:

        async def feed() -> None:
            for _ in range(1000):
                await send.send_all(b"z" * 16)
                assert len(reader._buffer) <= 64 + 16
            await send.send_all(b"\nok\n")
            await send.aclose()

        nursery.start_soon(feed)
        assert await reader.receive_line() is rpc.OVERSIZED
        assert await reader.receive_line() == b"ok"
        assert await reader.receive_line() is None


# ---------------------------------------------------------------- parsing and encoding


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        (b"not json", (rpc.Invalid, rpc.PARSE_ERROR, None)),
        (b"\xff\xfe", (rpc.Invalid, rpc.PARSE_ERROR, None)),
        (b"[" * 100000, (rpc.Invalid, rpc.PARSE_ERROR, None)),
        (b"[]", (rpc.Invalid, rpc.INVALID_REQUEST, None)),
        (b"42", (rpc.Invalid, rpc.INVALID_REQUEST, None)),
        (b'{"id": 3, "method": "x"}', (rpc.Invalid, rpc.INVALID_REQUEST, 3)),
        (
            b'{"jsonrpc": "2.0", "id": {"a": 1}, "method": "x"}',
            (rpc.Invalid, rpc.INVALID_REQUEST, None),
        ),
        (
            b'{"jsonrpc": "2.0", "id": true, "method": "x"}',
            (rpc.Invalid, rpc.INVALID_REQUEST, None),
        ),
        (b'{"jsonrpc": "2.0", "id": 4, "method": 5}', (rpc.Invalid, rpc.INVALID_REQUEST, 4)),
        (
            b'{"jsonrpc": "2.0", "id": "s", "method": "m", "params": 1}',
            (rpc.Invalid, rpc.INVALID_PARAMS, "s"),
        ),
        (b'{"jsonrpc": "2.0", "id": 5}', (rpc.Invalid, rpc.INVALID_REQUEST, 5)),
        (b'{"jsonrpc": "2.0", "id": 6, "result": null}', (rpc.Response, None, 6)),
        (b'{"jsonrpc": "2.0", "method": "m"}', (rpc.Notification, None, None)),
        (b'{"jsonrpc": "2.0", "id": null, "method": "m", "params": []}', (rpc.Request, None, None)),
    ],
)
def test_parse_message_classifies(line: bytes, expected: tuple[type, int | None, object]) -> None:
    kind, code, request_id = expected
    message = rpc.parse_message(line)
    assert type(message) is kind
    if isinstance(message, rpc.Invalid):
        assert message.error.code == code
    if not isinstance(message, rpc.Notification):
        assert message.id == request_id


def test_encode_message_is_one_ascii_line() -> None:
    data = rpc.encode_message({"text": "line one\nline two \u2028 \ud800 ☃", "x": float("nan")})
    assert data.endswith(b"\n")
    assert data.count(b"\n") == 1
    decoded = json.loads(data)
    assert decoded["x"] is None
    assert decoded["text"].startswith("line one\nline two")


# ---------------------------------------------------------------- in-process server

# ---------------------------------------------------------------- MessageWriter


async def test_message_writer_writes_concurrent_messages_one_whole_line_each() -> None:
    # A lockstep stream: each send_all waits until the reader took every byte, so
    # two writes that overlapped would be refused (trio.BusyResourceError).
    send, receive = trio.testing.lockstep_stream_one_way_pair()
    writer = rpc.MessageWriter(send)
    messages = [{"n": n, "text": "x" * 3000 + "\n"} for n in range(20)]
    data = b""
    async with trio.open_nursery() as nursery:
        for message in messages:
            nursery.start_soon(writer.send, message)
        while data.count(b"\n") < len(messages):
            data += await receive.receive_some(1000)
    *lines, rest = data.split(b"\n")
    assert rest == b""
    assert sorted(json.loads(line)["n"] for line in lines) == list(range(20))
    assert data == b"".join(rpc.encode_message(json.loads(line)) for line in lines)
    await send.aclose()
    with pytest.raises(trio.ClosedResourceError):
        await writer.send({"n": "late"})


# ---------------------------------------------------------------- Outbox


async def test_outbox_counts_owed_answers_and_waits_only_when_full() -> None:
    outbox = rpc.Outbox(2)
    outbox.put({"n": 1})
    outbox.reserve()  # a handler task will answer once
    assert outbox.used == 2
    async with trio.open_nursery() as nursery:
        waited = trio.Event()

        async def reader() -> None:
            await outbox.wait_for_space()
            waited.set()

        nursery.start_soon(reader)
        await trio.testing.wait_all_tasks_blocked()
        assert not waited.is_set()
        assert await outbox.get() == {"n": 1}
        await trio.testing.wait_all_tasks_blocked()
        assert waited.is_set()
    outbox.put({"n": 2})  # the handler answers...
    outbox.release()  # ...and is done
    assert (len(outbox), outbox.used) == (1, 1)
    outbox.close()
    assert not outbox.put({"n": 3})
    assert await outbox.get() == {"n": 2}
    assert await outbox.get() is None
    with pytest.raises(ValueError, match="at least 1"):
        rpc.Outbox(0)


@pytest.mark.parametrize(
    ("head", "expected"),
    [
        (b'{"jsonrpc":"2.0","id":7,"result":{"content":"xx', rpc.Head(7, "response")),
        (b' { "id" : "a" , "error": {"message": "x', rpc.Head("a", "response")),
        (
            b'{"jsonrpc":"2.0","method":"session/prompt","id":"p","params":{"id":5,"x',
            rpc.Head("p", "request", "session/prompt"),
        ),
        # The id must come before the cut, whole: a number at the very end may have been cut short.
        (b'{"jsonrpc":"2.0","id":12345', None),
        (b'{"jsonrpc":"2.0","method":"x","params":{"id":5,"y":"zz', None),  # an id inside params is not the id
        (b'{"id":true,"result":"x', None),
        (b"[1, 2", None),
        (b"garbage", None),
    ],
)
def test_read_head_finds_the_id_of_a_message_cut_short(head: bytes, expected: rpc.Head | None) -> None:
    assert rpc.read_head(head) == expected


async def test_line_reader_keeps_the_head_of_an_oversized_line() -> None:
    line = b'{"jsonrpc":"2.0","id":3,"method":"m","params":"' + b"x" * 5000 + b'"}'
    for chunk in (7, 65536):  # cut while buffering, and found whole with its newline
        send, receive = trio.testing.memory_stream_one_way_pair()
        await send.send_all(line + b"\n")
        await send.aclose()
        reader = rpc.LineReader(receive, max_line_bytes=100, chunk_bytes=chunk)
        assert await reader.receive_line() is rpc.OVERSIZED
        head = reader.oversized_head
        assert line.startswith(head) and 100 < len(head) <= rpc.HEAD_BYTES
        assert rpc.read_head(reader.oversized_head) == rpc.Head(3, "request", "m")
