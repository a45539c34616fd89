"""Value records shared by the session log and the model protocol.

A session log stores what the model produced (its tool calls, its token usage)
and how things failed; the model protocol reports the same facts while a call
streams.  Both layers use these records, so they live here, in a leaf module
that imports nothing from the package: :mod:`trio_harness.session` and
:mod:`trio_harness.model` both depend on it, and neither on the other for
them (docs/architecture.rst, "Layers").

Users import them from their public homes: ``trio_harness.model.Failure``,
``trio_harness.model.ToolCall``, ``trio_harness.model.Usage``.
"""

from __future__ import annotations

import attrs

__all__ = ["Failure", "ToolCall", "Usage"]


@attrs.frozen
class Failure:
    """A failure reported as a value.

    Attributes:
        code: a short stable code, e.g. ``"http-429"``, ``"connect"``, ``"timeout"``,
            ``"malformed-stream"``, ``"no-finish"``, ``"scripted"``.
        message: a human-readable explanation naming what went wrong.
        retryable: whether retrying the same request may succeed.
        retry_after: seconds the server asked us to wait, when it said so.
    """

    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None


@attrs.frozen
class ToolCall:
    """One complete tool call requested by the model.

    Attributes:
        id: the provider's call id, echoed back in the tool result.
        name: the tool name.
        arguments: the raw JSON text of the arguments, exactly as the model wrote it.
    """

    id: str
    name: str
    arguments: str


@attrs.frozen
class Usage:
    """Token usage of one model call."""

    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
