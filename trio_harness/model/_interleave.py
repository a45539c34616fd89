"""Putting an assistant message's opaque blocks back among its text and tool calls, in the order received.

A provider whose assistant output is a sequence of blocks or items (Anthropic's
content blocks, the Responses API's output items) reports the ones the harness
cannot rebuild from the message's text and tool calls (thinking, reasoning,
server-tool blocks ...) as :class:`~trio_harness.model.ReasoningBlock` s, each
with where it stood: how much of the message's text, and how many of its tool
calls, came before it (:func:`anchor`).  :func:`interleave` puts them back
there, so the rebuilt message has the order the server sent.

Within the stretch between two such blocks, the text comes before the tool
calls (the order both APIs produce); text split over several blocks or items
of one stretch goes back as one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final, TypeVar

from ._protocol import ToolCall

BEFORE: Final = "before"
"""The key of a block's anchor in its ``data``: ``{"text": CHARS, "tool_calls": COUNT}``."""

_Block = TypeVar("_Block")


def anchor(text: int, tool_calls: int) -> dict[str, int]:
    """The anchor recorded with a block: the characters of text and the tool calls that came before it."""
    return {"text": text, "tool_calls": tool_calls}


def anchor_of(data: Mapping[str, Any]) -> tuple[int, int] | None:
    """The ``(text, tool_calls)`` anchor of a block's data, or None when it has none (older logs)."""
    found = data.get(BEFORE)
    if not isinstance(found, Mapping):
        return None
    text, calls = found.get("text"), found.get("tool_calls")
    if type(text) is not int or type(calls) is not int or text < 0 or calls < 0:
        return None
    return text, calls


def interleave(
    text: str, calls: Sequence[ToolCall], blocks: Sequence[tuple[tuple[int, int], _Block]]
) -> list[str | ToolCall | _Block]:
    """The message's pieces in the order received: text pieces, tool calls and the anchored blocks.

    ``blocks`` are in the order they were reported, each with its anchor; an
    anchor beyond the text or the calls (or behind an earlier block's) is
    clamped, so the result always holds all of the text, every call and every
    block exactly once.  Empty text pieces are left out.
    """
    pieces: list[str | ToolCall | _Block] = []
    at_text = at_call = 0
    for (before_text, before_calls), block in blocks:
        upto_text = min(max(before_text, at_text), len(text))
        upto_call = min(max(before_calls, at_call), len(calls))
        if upto_text > at_text:
            pieces.append(text[at_text:upto_text])
        pieces.extend(calls[at_call:upto_call])
        pieces.append(block)
        at_text, at_call = upto_text, upto_call
    if at_text < len(text):
        pieces.append(text[at_text:])
    pieces.extend(calls[at_call:])
    return pieces
