"""Recorded Anthropic Messages event streams, as published in Anthropic's streaming documentation.

Taken from the examples of "Streaming Messages" (docs.anthropic.com /
platform.claude.com, build-with-claude/streaming): the basic request, the
tool-use request, the extended-thinking request (signature as printed there)
and the error event; the redacted-thinking block is the extended-thinking
page's example.  The server sends each event as ``event: TYPE`` then
``data: JSON`` and a blank line, with the JSON spaced as printed.
"""

from __future__ import annotations

import json
from typing import Any


def event(obj: dict[str, Any]) -> bytes:
    """One named event, its JSON spaced as in the documentation."""
    return f"event: {obj['type']}\ndata: {json.dumps(obj)}\n\n".encode()


def message_start(input_tokens: int = 25, output_tokens: int = 1, **usage: int) -> bytes:
    return event(
        {
            "type": "message_start",
            "message": {
                "id": "msg_1nZdL29xx5MUA1yADyHTEsnR8uuvGzszyY",
                "type": "message",
                "role": "assistant",
                "content": [],
                "model": "claude-opus-4-6",
                "stop_reason": None,
                "stop_sequence": None,
                "usage": {"input_tokens": input_tokens, "output_tokens": output_tokens, **usage},
            },
        }
    )


def block_start(index: int, block: dict[str, Any]) -> bytes:
    return event({"type": "content_block_start", "index": index, "content_block": block})


def delta(index: int, body: dict[str, Any]) -> bytes:
    return event({"type": "content_block_delta", "index": index, "delta": body})


def text(index: int, piece: str) -> bytes:
    return delta(index, {"type": "text_delta", "text": piece})


def block_stop(index: int) -> bytes:
    return event({"type": "content_block_stop", "index": index})


def message_delta(stop_reason: str | None, output_tokens: int, **usage: int) -> bytes:
    return event(
        {
            "type": "message_delta",
            "delta": {"stop_reason": stop_reason, "stop_sequence": None},
            "usage": {"output_tokens": output_tokens, **usage},
        }
    )


PING = event({"type": "ping"})
MESSAGE_STOP = event({"type": "message_stop"})
OVERLOADED = event({"type": "error", "error": {"type": "overloaded_error", "message": "Overloaded"}})

BASIC = [
    message_start(),
    block_start(0, {"type": "text", "text": ""}),
    PING,
    text(0, "Hello"),
    text(0, "!"),
    block_stop(0),
    message_delta("end_turn", 15),
    MESSAGE_STOP,
]
"""The basic streaming request's response: "Hello!"."""

TOOL_ID = "toolu_01T1x1fJ34qAmk2tNTrN7Up6"
TOOL_PIECES = [
    "",
    '{"location":',
    ' "San',
    " Francisc",
    "o,",
    ' CA"',
    ", ",
    '"unit": "fah',
    'renheit"}',
]
TOOL_USE = [
    message_start(472, 2),
    block_start(0, {"type": "text", "text": ""}),
    text(0, "Okay"),
    text(0, ","),
    text(0, " let"),
    text(0, "'s"),
    text(0, " check"),
    text(0, " the"),
    text(0, " weather"),
    text(0, " for"),
    text(0, " San"),
    text(0, " Francisco"),
    text(0, ","),
    text(0, " CA"),
    text(0, ":"),
    block_stop(0),
    block_start(1, {"type": "tool_use", "id": TOOL_ID, "name": "get_weather", "input": {}}),
    *[delta(1, {"type": "input_json_delta", "partial_json": piece}) for piece in TOOL_PIECES],
    block_stop(1),
    message_delta("tool_use", 89),
    MESSAGE_STOP,
]
"""The tool-use request's response: some text, then a get_weather call."""

SIGNATURE = "EqQBCgIYAhIM1gbcDa9GJwZA2b3hGgxBdjrkzLoky3dl1pkiMOYds..."
THINKING_PIECES = [
    "I need to find the GCD of 1071 and 462 using the Euclidean algorithm.\n\n1071 = 2 × 462 + 147",
    "\n462 = 3 × 147 + 21\n147 = 7 × 21 + 0\n\nSo GCD(1071, 462) = 21",
]
THINKING = [
    message_start(),
    block_start(0, {"type": "thinking", "thinking": ""}),
    *[delta(0, {"type": "thinking_delta", "thinking": piece}) for piece in THINKING_PIECES],
    delta(0, {"type": "signature_delta", "signature": SIGNATURE}),
    block_stop(0),
    block_start(1, {"type": "text", "text": ""}),
    text(1, "The greatest common divisor of 1071 and 462 is **21**."),
    block_stop(1),
    message_delta("end_turn", 150),
    MESSAGE_STOP,
]
"""The extended-thinking request's response: a signed thinking block, then the answer."""

REDACTED = {
    "type": "redacted_thinking",
    "data": "EmwKAhgBEgy3va3pzix/LafPsn4aDFIT2Xlxh0L5L8rLVyIwxtE3rAFBa8cr3qpPkNRj2YfWXGmKDxH4mPnZ5sQ7vB5URj",
}
