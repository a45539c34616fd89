"""The one streaming interface every model provider implements.

A provider receives a :class:`ModelRequest` (rebuilt by the driver from the
session log alone) and reports what the model produces by calling ``emit`` with
chunks, in order, ending with exactly one :class:`Finish`.  Failures are values:
a provider reports an HTTP error, a refused connection or a malformed stream as
``Finish(reason="error", failure=Failure(...))`` and returns normally.  The only
exception a provider lets escape is :class:`trio.Cancelled` (the turn was
cancelled); the driver records that as an aborted turn.

A callback sink is used instead of an async generator on purpose: Trio cannot
safely suspend an async generator inside a cancel scope or nursery, and a plain
call per chunk is the cheapest thing the hot path can do.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Final, Literal, Protocol, TypeAlias, runtime_checkable

import attrs

from .._records import Failure as Failure
from .._records import Image as Image
from .._records import ModelSettings as ModelSettings
from .._records import ReasoningBlock as ReasoningBlock
from .._records import ToolCall as ToolCall
from .._records import Usage as Usage
from .._records import UsageTotals as UsageTotals

FinishReason: TypeAlias = Literal["stop", "tool-calls", "max-tokens", "error", "aborted"]


# ---------------------------------------------------------------- requests


@attrs.frozen
class UserMessage:
    """A user (or harness-injected) message in a model request.

    ``images`` follow the text; a provider that cannot take images refuses a
    request carrying any with a failure naming the model.
    """

    text: str
    role: Literal["user"] = "user"
    images: tuple[Image, ...] = ()


@attrs.frozen
class AssistantMessage:
    """An assistant message in a model request, with any tool calls it made.

    ``reasoning_blocks`` are the opaque blocks its provider reported (see
    :class:`ReasoningBlock`), in the order they were reported.
    """

    text: str
    tool_calls: tuple[ToolCall, ...] = ()
    reasoning: str = ""
    role: Literal["assistant"] = "assistant"
    reasoning_blocks: tuple[ReasoningBlock, ...] = ()


@attrs.frozen
class ToolMessage:
    """The result of one tool call, sent back to the model."""

    call_id: str
    name: str
    content: str
    is_error: bool = False
    role: Literal["tool"] = "tool"


Message: TypeAlias = UserMessage | AssistantMessage | ToolMessage
"""One message of a model request's conversation."""


@attrs.frozen
class ToolSpec:
    """What the model is told about one tool: name, description, JSON schema."""

    name: str
    description: str
    parameters: Mapping[str, Any]


@attrs.frozen
class OutputFormat:
    """The shape the final answer must have: a JSON value matching ``schema``.

    Providers with a JSON-schema response format send it (OpenAI's
    ``response_format: {"type": "json_schema", ...}``); others are asked in
    the system prompt, and the driver validates the answer either way.

    Attributes:
        name: a short name of the expected type (``[A-Za-z0-9_-]``).
        schema: the JSON schema of the answer (an object schema).
    """

    name: str
    schema: Mapping[str, Any] = attrs.field(eq=False)


OutputMode: TypeAlias = Literal["auto", "native", "tool"]
"""How ``agent.run(output=TYPE)`` asks for a typed answer.

``"native"``: the request carries an :class:`OutputFormat`, sent as the
provider's JSON response format; ``"tool"``: the model is offered a
``final_answer`` tool whose parameters are the type's schema, and the answer is
the arguments of its call; ``"auto"``: native where the provider declares a
JSON-schema response format (a true ``json_schema_output`` attribute), the
tool otherwise.
"""


FINAL_ANSWER: Final = "final_answer"
"""The name of the tool a typed answer is given through in ``"tool"`` output mode."""


def supports_json_schema(provider: object) -> bool:
    """Whether ``provider`` declares a JSON-schema response format (its ``json_schema_output`` is True).

    The attribute is optional: a provider without it is asked for typed
    answers through the final-answer tool.
    """
    return getattr(provider, "json_schema_output", False) is True


RequestPurpose: TypeAlias = Literal["turn", "compaction"]
"""Why a request is made: a step of a turn, or a summary for context compaction."""


@attrs.frozen
class ModelRequest:
    """Everything a provider needs for one model call.

    Attributes:
        model: the model name within the provider's route (e.g. ``"deepseek-chat"``).
        system: the system prompt.
        messages: the conversation derived from the session log.
        tools: the tools offered to the model, in a stable order.
        max_tokens: an optional positive cap on generated tokens (the same as
            ``settings.max_tokens`` when the driver builds the request).
        settings: sampling and provider settings (merged by the driver).
        output: when set, the final answer must be JSON of this format.
        purpose: ``"turn"`` for a step, ``"compaction"`` for a summary request.
    """

    model: str
    system: str
    messages: Sequence[Message]
    tools: tuple[ToolSpec, ...] = ()
    max_tokens: int | None = None
    settings: ModelSettings = attrs.field(factory=ModelSettings)
    output: OutputFormat | None = None
    purpose: RequestPurpose = "turn"


# ---------------------------------------------------------------- chunks


@attrs.frozen
class TextDelta:
    """A piece of the assistant's visible text."""

    text: str


@attrs.frozen
class ReasoningDelta:
    """A piece of the model's reasoning (e.g. DeepSeek's ``reasoning_content``)."""

    text: str


@attrs.frozen
class ToolCallDelta:
    """A piece of a tool call; pieces with the same ``index`` form one call.

    ``id`` and ``name`` usually arrive on the first piece only; ``arguments`` is
    a fragment of the JSON text to append.
    """

    index: int
    id: str | None = None
    name: str | None = None
    arguments: str = ""


@attrs.frozen
class Finish:
    """The last chunk of every stream.

    ``failure`` is set exactly when ``reason == "error"``.
    """

    reason: FinishReason
    failure: Failure | None = None


@attrs.frozen
class Retry:
    """Informational: the provider is about to retry after a retryable failure.

    The driver logs each one as a ``request/retry`` event in the same step.
    """

    attempt: int
    delay: float
    failure: Failure


@attrs.frozen
class ResponseInfo:
    """Informational: which model answered, and the server's id of the response.

    A provider emits it at most once per request, before the usage and the
    finish, when the server named either (chat completions chunks' ``model``
    and ``id``, Anthropic's ``message_start.message``, the Responses API's
    ``response``); the driver logs both on the ``assistant/message`` event
    (``response_model``, ``response_id``).  Empty strings when not known.
    """

    model: str = ""
    id: str = ""


Chunk: TypeAlias = TextDelta | ReasoningDelta | ToolCallDelta | ReasoningBlock | Usage | Finish | Retry | ResponseInfo
"""Anything a provider reports through ``emit``; a stream ends with one :class:`Finish`."""

Emit: TypeAlias = Callable[[Chunk], None]
"""The callback a provider reports chunks through, in order."""


@runtime_checkable
class ModelProvider(Protocol):
    """A streaming model provider.

    ``stream`` must call ``emit`` with the chunks of one response and finish
    with exactly one :class:`Finish`; it must not raise for model or transport
    failures (report them as ``Finish(reason="error")``) and must let
    :class:`trio.Cancelled` propagate promptly, releasing its connection.

    Optional attributes a provider may declare (read with ``getattr``):
    ``context_window`` (tokens), ``settings`` (default
    :class:`ModelSettings`) and ``json_schema_output`` (True when the
    endpoint honours ``ModelRequest.output`` as a JSON-schema response
    format; otherwise ``agent.run(output=TYPE)`` uses a final-answer tool,
    see :data:`OutputMode`).
    """

    @property
    def name(self) -> str:
        """A short description of the route, e.g. ``"deepseek:deepseek-chat"``."""
        ...

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Run one model call, reporting every chunk through ``emit``."""
        ...
