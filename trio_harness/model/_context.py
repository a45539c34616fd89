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
from ._catalog import known_models, model_info
from ._protocol import AssistantMessage, Message, ToolMessage, ToolSpec, UserMessage

CHARS_PER_TOKEN: Final = 4
"""The characters-per-token ratio of every estimate (and of the scripted model's usage)."""

IMAGE_CHARS: Final = 6_000
"""What an image counts for in a size estimate, in characters (about 1,500 tokens: a
mid-sized image as OpenAI and Anthropic price it)."""

KNOWN_CONTEXT_WINDOWS: Final[Mapping[str, int]] = {info.model: info.context_window for info in known_models()}
"""Context windows (tokens) of known models, by name (the model catalog's, :mod:`trio_harness.model._catalog`)."""


def context_window_for(model: str) -> int | None:
    """The context window of a known model (``gpt-4o-2024-08-06`` matches ``gpt-4o``), or None.

    Read from the model catalog (:func:`~trio_harness.model.catalog_entry`),
    whatever family the model belongs to.
    """
    info = model_info(model)
    return info.context_window if info is not None else None


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
