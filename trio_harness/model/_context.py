"""What a model can read at once: context windows and token estimates.

No tokenizer is downloaded: a request's size is estimated from its text, about
four characters a token (:data:`CHARS_PER_TOKEN`).  The driver anchors the
estimate on the prompt tokens the provider last reported and adds only what
was appended since, so an estimate costs O(new messages), never O(session)
(docs/long-sessions.rst, "Context-window management").
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Final

from .._records import Failure
from ._protocol import AssistantMessage, Message, ToolMessage, ToolSpec, UserMessage

CHARS_PER_TOKEN: Final = 4
"""The characters-per-token ratio of every estimate (and of the scripted model's usage)."""

IMAGE_CHARS: Final = 6_000
"""What an image counts for in a size estimate, in characters (about 1,500 tokens: a
mid-sized image as OpenAI and Anthropic price it)."""

KNOWN_CONTEXT_WINDOWS: Final[Mapping[str, int]] = {
    "deepseek-chat": 128_000,
    "deepseek-reasoner": 128_000,
    "gpt-3.5-turbo": 16_385,
    "gpt-4-turbo": 128_000,
    "gpt-4o": 128_000,
    "gpt-4.1": 1_047_576,
    "gpt-5": 400_000,
    "o1": 200_000,
    "o3": 200_000,
    "o4-mini": 200_000,
    "claude": 200_000,  # every current Claude model (1M-token windows are a beta header away)
}
"""Context windows (tokens) of known models, by name prefix; the longest matching prefix wins."""


def context_window_for(model: str) -> int | None:
    """The context window of a known model (``gpt-4o-2024-08-06`` matches ``gpt-4o``), or None."""
    best: str | None = None
    for prefix in KNOWN_CONTEXT_WINDOWS:
        if (model == prefix or model.startswith(prefix + "-")) and (best is None or len(prefix) > len(best)):
            best = prefix
    return KNOWN_CONTEXT_WINDOWS[best] if best is not None else None


def tokens_for_chars(chars: int) -> int:
    """The estimated tokens of ``chars`` characters (rounded up)."""
    return -(-chars // CHARS_PER_TOKEN)


def message_chars(message: Message) -> int:
    """The characters of one message that a request sends."""
    if type(message) is UserMessage:
        return len(message.text) + IMAGE_CHARS * len(message.images)
    if type(message) is ToolMessage:
        return len(message.content) + len(message.name) + len(message.call_id)
    if type(message) is AssistantMessage:
        size = len(message.text)
        for call in message.tool_calls:
            size += len(call.id) + len(call.name) + len(call.arguments)
        for block in message.reasoning_blocks:
            size += len(json.dumps(block.data, separators=(",", ":")))
        return size
    return len(getattr(message, "text", ""))


def tools_chars(tools: Sequence[ToolSpec]) -> int:
    """The characters the tool definitions add to a request (names, descriptions, schemas as JSON)."""
    return sum(
        len(spec.name) + len(spec.description) + len(json.dumps(spec.parameters, separators=(",", ":")))
        for spec in tools
    )


_OVERFLOW_HINTS: Final = (
    "context_length_exceeded",
    "context length",
    "context window",
    "maximum context",
    "prompt is too long",
    "too many tokens",
    "reduce the length",
)


def is_context_overflow(failure: Failure | None) -> bool:
    """Whether a failure says the request did not fit the model's context window.

    The code ``context-length`` (the scripted model's, or a provider's that
    recognised it), or a client error (``http-400`` / ``http-413``) whose
    message reads like one (OpenAI's ``context_length_exceeded``, DeepSeek's
    "maximum context length is ... tokens").
    """
    if failure is None:
        return False
    if failure.code == "context-length":
        return True
    if failure.code not in ("http-400", "http-413", "stream-error"):
        return False
    text = failure.message.lower()
    return any(hint in text for hint in _OVERFLOW_HINTS)
