"""A streaming provider for OpenAI-compatible chat completion endpoints.

:class:`OpenAIProvider` speaks the ``POST {base_url}/chat/completions`` protocol
with ``stream: true`` that OpenAI, DeepSeek, vLLM, Ollama, llama.cpp and most
hosted gateways implement.  It turns the server-sent event stream into the
chunks of :mod:`trio_harness.model._protocol` and reports every failure (HTTP
status, refused connection, timeout, malformed or truncated stream) as a
``Finish(reason="error")`` value, retrying transient failures only while
nothing has been emitted yet.

The protocol work is done without I/O by two parsers this module only feeds:
:class:`~trio_harness.model._sse.SSEDecoder` (bytes to server-sent events) and
:class:`~trio_harness.model._chunks.ChunkParser` (events to chunks and the
outcome); the HTTP loop here reads bytes, feeds them, emits what comes out and
decides about retries.  Reading ``response.aiter_bytes()`` directly (rather
than through ``httpx_sse``, about half as fast on the many tiny events a model
streams, see ``bench/bench_provider.py``) also lets the provider stop reading
without leaving httpx's internal async generators suspended (Trio warns about
those when they are garbage collected).
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Callable, Mapping
from typing import Any, Literal

import attrs
import httpx
import trio

from .._errors import ModelError
from .._redact import redact_urls
from .._util import is_positive_int
from ._catalog import model_info
from ._chunks import ChunkParser
from ._context import context_window_for
from ._http import Exchange, HTTPStreamer, StreamParser, json_default, make_rng
from ._http import _retry_after as _retry_after
from ._images import has_images, images_unsupported
from ._protocol import (
    AssistantMessage,
    Emit,
    Finish,
    ModelRequest,
    ModelSettings,
    ToolMessage,
    UserMessage,
)


def _copy_body(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(extra) if extra is not None else {}


@attrs.define(eq=False, kw_only=True)
class OpenAIProvider(HTTPStreamer):
    """A :class:`~trio_harness.model.ModelProvider` for OpenAI-compatible servers.

    Each :meth:`stream` call POSTs one streaming chat completion request and
    reports its chunks.  Transient failures (HTTP 429 and 5xx, refused
    connections, timeouts, dropped connections) are retried with exponential
    backoff and jitter, honouring ``Retry-After``, but only while nothing has
    been emitted for the request, so output is never duplicated.  No wait is
    longer than ``backoff_max`` or than what is left of the caller's
    deadline: when the server asks for longer (``Retry-After``,
    ``retry-after-ms``, an HTTP date), the request ends at once with that
    failure, its message naming the wait asked for and the wait allowed.

    The provider owns an :class:`httpx.AsyncClient` created on first use unless
    one is given; close it with :meth:`aclose` or ``async with provider:``.

    Attributes:
        model: the default model name, used when a request does not name one.
        base_url: the API root; ``/chat/completions`` is appended to it.
        api_key: sent as ``Authorization: Bearer ...`` when set.
        api_key_env: the environment variable ``api_key`` was read from
            (:func:`~trio_harness.model.resolve_model` sets it), or None; the
            harness hides that variable from the commands and MCP servers it
            starts (:class:`~trio_harness.bash.EnvPolicy`).
        request_timeout: the overall deadline, in seconds, of one attempt
            (connecting, sending, and reading the whole stream).
        connect_timeout: the deadline for establishing a connection.
        read_timeout: the longest silence tolerated between two reads.
        max_retries: how many times a retryable failure is retried.
        backoff_base: the delay before the first retry; it doubles each time.
        backoff_max: the cap on every wait before a retry, the backoff delay
            and a server's ``Retry-After`` alike.
        jitter: the relative random spread applied to backoff delays (0 to 1).
        wall_clock: the wall-clock time source (POSIX seconds) an HTTP-date
            ``Retry-After`` is measured against; the wait itself is on Trio's clock.
        extra_body: extra top-level JSON fields merged into every request body
            (e.g. ``{"temperature": 0}``); they override the provider's own.
        settings: default model settings of this route (a spec string's
            query parameters); a request's settings win over them.
        output_format: how a request's :class:`~trio_harness.model.OutputFormat`
            is sent: ``"json_schema"`` (``response_format`` with the schema,
            OpenAI and most compatible servers), ``"json_object"`` (JSON mode
            without a schema: DeepSeek) or ``"none"`` (only the system
            prompt asks for JSON).  Only ``"json_schema"`` declares
            ``json_schema_output``: on the others ``agent.run(output=TYPE)``
            uses the final-answer tool unless ``output_mode="native"``.
        supports_images: whether the route takes images in user messages
            (``image_url`` content parts with ``data:`` URLs); when False a
            request carrying images fails at once with code
            ``images-unsupported`` naming the model.  True by default,
            False for ``deepseek:`` and for a model the catalog
            (:func:`~trio_harness.model.catalog_entry`) says takes none.
        context_window: the model's context window in tokens; None (the
            default) takes it from the known models' table
            (the built-in table of known models), and stays
            None for a model not in it.

    ``math.inf`` disables any of the three timeouts.
    """

    model: str
    base_url: str = attrs.field(repr=lambda url: repr(redact_urls(url)))
    api_key: str | None = attrs.field(default=None, repr=False)
    api_key_env: str | None = None
    _name: str | None = attrs.field(default=None, alias="name", repr=lambda name: repr(name and redact_urls(name)))
    request_timeout: float = 600.0
    connect_timeout: float = 10.0
    read_timeout: float = 120.0
    max_retries: int = 4
    backoff_base: float = 0.5
    backoff_max: float = 30.0
    jitter: float = 0.2
    _rng: random.Random = attrs.field(default=None, converter=make_rng, alias="rng", repr=False)
    _wall_clock: Callable[[], float] = attrs.field(default=time.time, alias="wall_clock", repr=False)
    _http_client: httpx.AsyncClient | None = attrs.field(default=None, alias="http_client", repr=False)
    extra_body: dict[str, Any] = attrs.field(default=None, converter=_copy_body, repr=False)
    settings: ModelSettings = attrs.field(factory=ModelSettings)
    context_window: int | None = None
    output_format: Literal["json_schema", "json_object", "none"] = "json_schema"
    supports_images: bool = True
    _owned_client: httpx.AsyncClient | None = attrs.field(init=False, default=None, repr=False)
    _url: str = attrs.field(init=False, default="", repr=False)
    _timeout: httpx.Timeout = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.model:
            raise ModelError("OpenAIProvider needs a non-empty model name")
        if not self.base_url.startswith(("http://", "https://")):
            raise ModelError(
                f"OpenAIProvider base_url {redact_urls(self.base_url)!r} must start with http:// or https://"
            )
        self._check_transport("OpenAIProvider")
        self._url = self.base_url.rstrip("/") + "/chat/completions"
        if self.output_format not in ("json_schema", "json_object", "none"):
            raise ModelError(
                f"OpenAIProvider output_format must be json_schema, json_object or none, got {self.output_format!r}"
            )
        known = model_info(self.model)
        if known is not None and not known.images:
            self.supports_images = False  # the catalog knows the model takes none
        if self.context_window is None:
            self.context_window = context_window_for(self.model)
        elif not is_positive_int(self.context_window):
            raise ModelError(f"OpenAIProvider context_window must be a positive int, got {self.context_window!r}")

    # ------------------------------------------------------------ lifecycle

    @property
    def json_schema_output(self) -> bool:
        """Whether the endpoint takes a JSON-schema response format (``output_format == "json_schema"``).

        When False (DeepSeek's JSON mode takes no schema), ``agent.run(output=TYPE)``
        asks through the final-answer tool instead.
        """
        return self.output_format == "json_schema"

    @property
    def name(self) -> str:
        """The route description, e.g. ``"deepseek:deepseek-chat"``, with the base URL's userinfo and
        query values ``***`` (it is logged in ``request/header`` events and shown in messages)."""
        return redact_urls(self._name or f"openai:{self.model}@{self.base_url}")

    @property
    def url(self) -> str:
        """The chat completions endpoint requests are sent to."""
        return self._url

    # ------------------------------------------------------------ requests

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request`` (OpenAI wire format).

        Args:
            request: the model request to encode.

        Returns:
            A JSON-serialisable dict with ``model``, ``messages``, ``stream``,
            ``stream_options``, and ``tools`` / ``max_tokens`` when set, updated
            with ``extra_body``.
        """
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for message in request.messages:
            if isinstance(message, UserMessage):
                if message.images:
                    messages.append({"role": "user", "content": _user_content(message)})
                else:
                    messages.append({"role": "user", "content": message.text})
            elif isinstance(message, AssistantMessage):
                wire: dict[str, Any] = {"role": "assistant", "content": message.text}
                if message.tool_calls:
                    if not message.text:
                        wire["content"] = None
                    wire["tool_calls"] = [
                        {
                            "id": call.id,
                            "type": "function",
                            "function": {"name": call.name, "arguments": call.arguments},
                        }
                        for call in message.tool_calls
                    ]
                messages.append(wire)
            elif isinstance(message, ToolMessage):
                messages.append({"role": "tool", "tool_call_id": message.call_id, "content": message.content})
            else:  # pragma: no cover - exhaustive over Message
                raise TypeError(f"unknown message type {type(message).__name__}")
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "messages": messages,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "function": {
                        "name": tool.name,
                        "description": tool.description,
                        "parameters": tool.parameters,
                    },
                }
                for tool in request.tools
            ]
        settings = self.settings.merge(request.settings)
        max_tokens = request.max_tokens if request.max_tokens is not None else settings.max_tokens
        if max_tokens is not None:
            body["max_tokens"] = max_tokens
        _apply_settings(body, settings, tools=bool(request.tools))
        if request.output is not None and self.output_format != "none":
            if self.output_format == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    "json_schema": {"name": request.output.name, "schema": dict(request.output.schema)},
                }
            else:
                body["response_format"] = {"type": "json_object"}
        body.update(self.extra_body)
        if settings.extra_body:
            body.update(settings.extra_body)
        return body

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "text/event-stream"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        return headers

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Run one chat completion, reporting its chunks through ``emit``.

        Always ends with exactly one :class:`Finish`; failures are reported as
        ``Finish(reason="error", failure=...)``.  Before each retry a
        :class:`Retry` chunk is emitted.  Only :class:`trio.Cancelled` (and
        whatever ``emit`` itself raises) escapes; cancellation closes the HTTP
        connection.

        Args:
            request: what to ask the model.
            emit: called synchronously with each chunk, in order.
        """
        if not self.supports_images and has_images(request):
            await trio.lowlevel.checkpoint()
            emit(Finish("error", images_unsupported(self.name, request.model or self.model)))
            return
        content = json.dumps(self.build_body(request), ensure_ascii=False, default=json_default).encode()
        await self._run(content, self._headers(), emit, Exchange(self._new_parser))

    def _new_parser(self) -> StreamParser:
        """The sans-io parser of one attempt's stream (a subclass speaking another format returns its own)."""
        return ChunkParser(self.name)


# ---------------------------------------------------------------- helpers


def _apply_settings(body: dict[str, Any], settings: ModelSettings, *, tools: bool) -> None:
    """Write the OpenAI wire fields of ``settings`` into ``body`` (``max_tokens`` and ``extra_body`` aside)."""
    if settings.temperature is not None:
        body["temperature"] = settings.temperature
    if settings.top_p is not None:
        body["top_p"] = settings.top_p
    if settings.seed is not None:
        body["seed"] = settings.seed
    if settings.stop is not None:
        body["stop"] = list(settings.stop)
    if settings.reasoning_effort is not None:
        body["reasoning_effort"] = settings.reasoning_effort
    if settings.parallel_tool_calls is not None and tools:
        # Servers refuse parallel_tool_calls on a request without tools.
        body["parallel_tool_calls"] = settings.parallel_tool_calls


def _user_content(message: UserMessage) -> list[dict[str, Any]]:
    """A user message's content parts: its text, then each image as a ``data:`` URL."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.text}] if message.text else []
    for image in message.images:
        url = f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts
