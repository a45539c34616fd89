"""Recorded OpenAI Responses event streams, as the API sends them (``event:`` and ``data:`` lines).

The event objects follow OpenAI's published examples: the API reference's
"Streaming events" page (platform.openai.com/docs/api-reference/responses-streaming,
one example object per event type), the function-calling guide's "Streaming"
section (``fc_`` item ids distinct from ``call_`` ids, arguments in deltas)
and the reasoning guide (reasoning items with ``encrypted_content`` when
``include: ["reasoning.encrypted_content"]`` and ``store: false``).  Only ids
and texts were shortened; field names, nesting and order are the API's.
"""

from __future__ import annotations

import json
from typing import Any, Final

RESPONSE_ID = "resp_67c9fdcecf488190bdd9a0409de3a1ec07b8b0ad4e5eb654"


def event(obj: dict[str, Any]) -> bytes:
    """One server-sent event as OpenAI writes it: ``event: TYPE`` then ``data: JSON``."""
    kind = str(obj["type"])
    return b"event: " + kind.encode() + b"\ndata: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n"


def _response(status: str, output: list[dict[str, Any]], usage: dict[str, Any] | None, **extra: Any) -> dict[str, Any]:
    return {
        "id": RESPONSE_ID,
        "object": "response",
        "created_at": 1741290958,
        "status": status,
        "error": None,
        "incomplete_details": None,
        "instructions": "You are a helpful assistant.",
        "max_output_tokens": None,
        "model": "gpt-4.1-2025-04-14",
        "output": output,
        "parallel_tool_calls": True,
        "previous_response_id": None,
        "reasoning": {"effort": None, "summary": None},
        "store": False,
        "temperature": 1.0,
        "text": {"format": {"type": "text"}},
        "tool_choice": "auto",
        "tools": [],
        "top_p": 1.0,
        "truncation": "disabled",
        "usage": usage,
        "user": None,
        "metadata": {},
        **extra,
    }


def _created(seq: int) -> bytes:
    return event({"type": "response.created", "response": _response("in_progress", [], None), "sequence_number": seq})


def _in_progress(seq: int) -> bytes:
    return event(
        {"type": "response.in_progress", "response": _response("in_progress", [], None), "sequence_number": seq}
    )


def usage(input_tokens: int = 37, output_tokens: int = 11, cached: int = 0, reasoning: int = 0) -> dict[str, Any]:
    """A ``usage`` object of a final response."""
    return {
        "input_tokens": input_tokens,
        "input_tokens_details": {"cached_tokens": cached},
        "output_tokens": output_tokens,
        "output_tokens_details": {"reasoning_tokens": reasoning},
        "total_tokens": input_tokens + output_tokens,
    }


MESSAGE_ID = "msg_67c9fdcf37fc8190ba82116e33fb28c507b8b0ad4e5eb654"

TEXT_ITEM = {
    "id": MESSAGE_ID,
    "type": "message",
    "status": "completed",
    "role": "assistant",
    "content": [{"type": "output_text", "text": "Hi there!", "annotations": []}],
}


def text_stream(pieces: tuple[str, ...] = ("Hi", " there", "!"), *, cached: int = 0) -> list[bytes]:
    """A plain text answer: created, in_progress, the message item, its text deltas, completed."""
    seq = iter(range(1000))
    text = "".join(pieces)
    item = {**TEXT_ITEM, "content": [{"type": "output_text", "text": text, "annotations": []}]}
    out = [
        _created(next(seq)),
        _in_progress(next(seq)),
        event(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {**TEXT_ITEM, "status": "in_progress", "content": []},
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.content_part.added",
                "item_id": MESSAGE_ID,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []},
                "sequence_number": next(seq),
            }
        ),
    ]
    for piece in pieces:
        out.append(
            event(
                {
                    "type": "response.output_text.delta",
                    "item_id": MESSAGE_ID,
                    "output_index": 0,
                    "content_index": 0,
                    "delta": piece,
                    "logprobs": [],
                    "sequence_number": next(seq),
                }
            )
        )
    out += [
        event(
            {
                "type": "response.output_text.done",
                "item_id": MESSAGE_ID,
                "output_index": 0,
                "content_index": 0,
                "text": text,
                "logprobs": [],
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.content_part.done",
                "item_id": MESSAGE_ID,
                "output_index": 0,
                "content_index": 0,
                "part": {"type": "output_text", "text": text, "annotations": []},
                "sequence_number": next(seq),
            }
        ),
        event({"type": "response.output_item.done", "output_index": 0, "item": item, "sequence_number": next(seq)}),
        event(
            {
                "type": "response.completed",
                "response": _response("completed", [item], usage(cached=cached)),
                "sequence_number": next(seq),
            }
        ),
    ]
    return out


REASONING_ITEM = {
    "id": "rs_6876cf02e0bc8192b74af0fb64b715ff06fa2fcced15a5ac",
    "type": "reasoning",
    "summary": [{"type": "summary_text", "text": "**Checking the weather**\n\nThe user wants Paris."}],
    "encrypted_content": "gAAAAABodo8C3Yq0YfYvE1kDqFBCmYd4Jm1yd0U9rLeYg2P7sn6h3h2nM9W8lQ==",
}

CALL_ITEM = {
    "id": "fc_12345xyz",
    "call_id": "call_12345xyz",
    "type": "function_call",
    "status": "completed",
    "name": "get_weather",
    "arguments": '{"location":"Paris, France"}',
}


def _item_done(index: int, item: dict[str, Any], seq: int) -> bytes:
    return event({"type": "response.output_item.done", "output_index": index, "item": item, "sequence_number": seq})


def reasoning_call_stream() -> list[bytes]:
    """A reasoning model's step: a reasoning item (summary deltas, encrypted content), then a function call."""
    seq = iter(range(1000))
    rid = REASONING_ITEM["id"]
    summary = REASONING_ITEM["summary"][0]["text"]  # type: ignore[index]
    return [
        _created(next(seq)),
        event(
            {
                "type": "response.output_item.added",
                "output_index": 0,
                "item": {"id": rid, "type": "reasoning", "summary": [], "encrypted_content": None},
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.reasoning_summary_part.added",
                "item_id": rid,
                "output_index": 0,
                "summary_index": 0,
                "part": {"type": "summary_text", "text": ""},
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": rid,
                "output_index": 0,
                "summary_index": 0,
                "delta": summary[:24],
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.reasoning_summary_text.delta",
                "item_id": rid,
                "output_index": 0,
                "summary_index": 0,
                "delta": summary[24:],
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.reasoning_summary_text.done",
                "item_id": rid,
                "output_index": 0,
                "summary_index": 0,
                "text": summary,
                "sequence_number": next(seq),
            }
        ),
        _item_done(0, REASONING_ITEM, next(seq)),
        event(
            {
                "type": "response.output_item.added",
                "output_index": 1,
                "item": {**CALL_ITEM, "status": "in_progress", "arguments": ""},
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_12345xyz",
                "output_index": 1,
                "delta": '{"location":',
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.function_call_arguments.delta",
                "item_id": "fc_12345xyz",
                "output_index": 1,
                "delta": '"Paris, France"}',
                "sequence_number": next(seq),
            }
        ),
        event(
            {
                "type": "response.function_call_arguments.done",
                "item_id": "fc_12345xyz",
                "output_index": 1,
                "arguments": '{"location":"Paris, France"}',
                "sequence_number": next(seq),
            }
        ),
        _item_done(1, CALL_ITEM, next(seq)),
        event(
            {
                "type": "response.completed",
                "response": _response(
                    "completed", [REASONING_ITEM, CALL_ITEM], usage(80, 150, cached=64, reasoning=128)
                ),
                "sequence_number": next(seq),
            }
        ),
    ]


SERVER_ERROR: Final = "The server had an error processing your request."


def failed_stream(code: str = "server_error", message: str = SERVER_ERROR) -> list[bytes]:
    """A response that failed after it was created (``response.failed`` with its ``error``)."""
    failed = _response("failed", [], None)
    failed["error"] = {"code": code, "message": message}
    return [
        event({"type": "response.created", "response": _response("in_progress", [], None), "sequence_number": 0}),
        event({"type": "response.failed", "response": failed, "sequence_number": 1}),
    ]


def incomplete_stream(reason: str = "max_output_tokens") -> list[bytes]:
    """A response cut short (``response.incomplete``): some text, then the reason."""
    stream = text_stream(("Hi",))[:-1]
    incomplete = _response("incomplete", [TEXT_ITEM], usage(), incomplete_details={"reason": reason})
    return [*stream, event({"type": "response.incomplete", "response": incomplete, "sequence_number": 99})]


ERROR_EVENT = event(
    {"type": "error", "code": "ERR_SOMETHING", "message": "Something went wrong", "param": None, "sequence_number": 1}
)
"""The API reference's example ``error`` event."""


def items_stream(items: list[dict[str, Any]]) -> list[bytes]:
    """A response streaming ``items`` in order, as the API does: each added, its deltas, then done.

    A reasoning item is added without its summary or encrypted content (both
    come at its ``done``), a message streams its text in one delta, a function
    call its arguments in one delta; ``response.completed`` lists them all.
    """
    seq = iter(range(1000))
    out = [_created(next(seq))]
    for index, item in enumerate(items):
        kind = item["type"]
        if kind == "reasoning":
            added = {**item, "summary": [], "encrypted_content": None}
        elif kind == "message":
            added = {**item, "status": "in_progress", "content": []}
        elif kind == "function_call":
            added = {**item, "status": "in_progress", "arguments": ""}
        else:
            added = {**item, "status": "in_progress"}
        out.append(event({"type": "response.output_item.added", "output_index": index, "item": added}))
        if kind == "message":
            text = item["content"][0]["text"]
            base = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out.append(event({"type": "response.output_text.delta", **base, "delta": text}))
            out.append(event({"type": "response.output_text.done", **base, "text": text}))
        elif kind == "function_call":
            base = {"item_id": item["id"], "output_index": index}
            out.append(event({"type": "response.function_call_arguments.delta", **base, "delta": item["arguments"]}))
        out.append(_item_done(index, item, next(seq)))
    done = _response("completed", items, usage(80, 150, reasoning=128))
    out.append(event({"type": "response.completed", "response": done, "sequence_number": next(seq)}))
    return out
