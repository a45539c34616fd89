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
import email.utils
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, Protocol, Self

import attrs
import httpx
import trio

from .._errors import ModelError
from .._redact import redact_urls
from .._util import is_positive_int
from ._catalog import model_info
from ._chunks import ChunkParser, message_of
from ._context import context_window_for
from ._images import has_images, images_unsupported
from ._protocol import (
    AssistantMessage,
    Chunk,
    Emit,
    Failure,
    Finish,
    ModelRequest,
    ModelSettings,
    Retry,
    ToolMessage,
    Usage,
    UserMessage,
)
from ._sse import SSEDecoder, SSEEnd, SSEError, SSEEvent

_ERROR_BODY_LIMIT: Final = 64 * 1024
"""How much of an error response body is read to find the server's message."""

_DRAIN_GRACE: Final = 0.5
"""Seconds to wait, after ``[DONE]``, for the server to end the response body.

Reading the body to its end lets httpx return the connection to its pool; a
server that keeps the body open after ``[DONE]`` only costs this much.
"""


class StreamParser(Protocol):
    """What the HTTP loop needs of a sans-io stream parser (:class:`ChunkParser`, the Responses parser)."""

    @property
    def done(self) -> bool: ...
    @property
    def failure(self) -> Failure | None: ...
    @property
    def emitted(self) -> bool: ...
    @property
    def usage(self) -> Usage | None: ...
    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None: ...
    def feed_body(self, body: bytes) -> list[Chunk]: ...
    def feed_end(self, end: SSEEnd) -> list[Chunk]: ...
    def fail(self, failure: Failure) -> Failure: ...
    def conclude(self, failure: Failure | None = None) -> Finish | Failure: ...


def _make_rng(rng: random.Random | None) -> random.Random:
    return rng if rng is not None else random.Random()


def _copy_body(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(extra) if extra is not None else {}


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


@attrs.define(eq=False, kw_only=True)
class OpenAIProvider:
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
    _rng: random.Random = attrs.field(default=None, converter=_make_rng, alias="rng", repr=False)
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
        for field in ("request_timeout", "connect_timeout", "read_timeout"):
            value = getattr(self, field)
            if not value > 0:  # also rejects NaN
                raise ModelError(f"OpenAIProvider {field} must be positive, got {value!r}")
        if self.max_retries < 0:
            raise ModelError(f"OpenAIProvider max_retries must be >= 0, got {self.max_retries}")
        if not (self.backoff_base >= 0 and self.backoff_max >= 0):
            raise ModelError("OpenAIProvider backoff_base and backoff_max must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ModelError(f"OpenAIProvider jitter must be within [0, 1], got {self.jitter!r}")
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

        def finite(value: float) -> float | None:
            return None if math.isinf(value) else value

        self._timeout = httpx.Timeout(
            connect=finite(self.connect_timeout),
            read=finite(self.read_timeout),
            write=finite(self.read_timeout),
            pool=None,  # waiting for a pooled connection is bounded by request_timeout
        )

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

    async def aclose(self) -> None:
        """Close the HTTP client this provider created, if any.

        A client passed as ``http_client`` belongs to the caller and is left
        open.  The provider stays usable: a later :meth:`stream` creates a new
        client.
        """
        client, self._owned_client = self._owned_client, None
        if client is not None:
            await client.aclose()

    async def __aenter__(self) -> Self:
        """Return the provider; :meth:`aclose` runs on exit."""
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Close the provider's own HTTP client."""
        await self.aclose()

    def _client(self) -> httpx.AsyncClient:
        if self._http_client is not None:
            return self._http_client
        if self._owned_client is None:
            self._owned_client = httpx.AsyncClient(timeout=self._timeout)
        return self._owned_client

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

    def backoff_delay(self, attempt: int) -> float:
        """Return the jittered backoff delay before retry number ``attempt`` (1-based).

        Args:
            attempt: the retry about to be made, starting at 1.

        Returns:
            ``min(backoff_max, backoff_base * 2**(attempt-1))`` spread by
            ``±jitter`` of itself, never above ``backoff_max`` nor below 0.
        """
        base = min(self.backoff_max, self.backoff_base * 2.0 ** min(attempt - 1, 64))
        spread = 1.0 + self.jitter * (2.0 * self._rng.random() - 1.0)
        return max(0.0, min(self.backoff_max, base * spread))

    def _retry_delay(self, failure: Failure, attempt: int) -> tuple[float, str | None]:
        """The delay before retry ``attempt``, or why that retry must not be made.

        Every delay is capped by ``backoff_max`` and by what is left of the
        caller's deadline (the effective deadline of the enclosing cancel
        scopes): a ``Retry-After`` asking for longer, or a backoff that would
        outlast the deadline, is not waited for (see docs/guarantees.rst,
        "Models: bounded retries").

        Returns:
            ``(delay, None)`` to wait ``delay`` seconds and retry, or
            ``(delay, reason)`` when the retry is refused, ``reason`` saying why.
        """
        remaining = trio.current_effective_deadline() - trio.current_time()
        asked = failure.retry_after
        if asked is not None:
            allowed = max(0.0, min(self.backoff_max, remaining))
            if asked > allowed:
                cap = f"backoff_max={_seconds(self.backoff_max)}" if allowed == self.backoff_max else "the deadline"
                return asked, (
                    f"the server asked to wait {_seconds(asked)}, more than the allowed {_seconds(allowed)} ({cap})"
                )
            return asked, None
        delay = self.backoff_delay(attempt)
        if delay > remaining:
            return delay, (
                f"the backoff of {_seconds(delay)} would outlast the deadline, {_seconds(max(remaining, 0.0))} away"
            )
        return delay, None

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
        content = json.dumps(self.build_body(request), ensure_ascii=False, default=_json_default).encode()
        headers = self._headers()
        client = self._client()
        attempt = 0
        while True:
            parser = self._new_parser()
            outcome: Finish | Failure | None = None
            with trio.move_on_after(self.request_timeout):
                outcome = await self._attempt(client, content, headers, parser, emit)
            if outcome is None:
                # The overall deadline expired before the outcome was known.
                outcome = parser.conclude(
                    Failure(
                        "timeout",
                        f"{self.name}: no complete response within request_timeout={self.request_timeout:g}s",
                        retryable=True,
                    )
                )
            if isinstance(outcome, Finish):
                self._emit_usage(parser, emit)
                emit(outcome)
                return
            failure = outcome
            if failure.retryable and not parser.emitted and attempt < self.max_retries:
                delay, refusal = self._retry_delay(failure, attempt + 1)
                if refusal is None:
                    attempt += 1
                    emit(Retry(attempt=attempt, delay=delay, failure=failure))
                    await trio.sleep(delay)
                    continue
                verdict = f"gave up after {attempt} retries" if attempt else "not retried"
                failure = attrs.evolve(failure, message=f"{failure.message} ({verdict}: {refusal})")
            elif failure.retryable and parser.emitted:
                failure = attrs.evolve(failure, message=failure.message + " (not retried: output was already emitted)")
            elif failure.retryable and attempt:
                failure = attrs.evolve(failure, message=f"{failure.message} (gave up after {attempt} retries)")
            self._emit_usage(parser, emit)
            emit(Finish(reason="error", failure=failure))
            return

    def _new_parser(self) -> StreamParser:
        """The sans-io parser of one attempt's stream (a subclass speaking another format returns its own)."""
        return ChunkParser(self.name)

    # ------------------------------------------------------------ one attempt

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        content: bytes,
        headers: dict[str, str],
        parser: StreamParser,
        emit: Emit,
    ) -> Finish | Failure:
        """Make one HTTP request and return its outcome (the parser keeps what it saw)."""
        try:
            async with client.stream(
                "POST", self._url, content=content, headers=headers, timeout=self._timeout
            ) as response:
                status = response.status_code
                if not 200 <= status < 300:
                    body = await _read_limited(response, _ERROR_BODY_LIMIT)
                    # Kept by the parser too: a deadline while the response closes keeps it.
                    return parser.fail(self._http_failure(response, body))
                ctype = response.headers.get("content-type", "")
                if "json" in ctype and "event-stream" not in ctype:
                    body = await _read_limited(response, 16 * 1024 * 1024)
                    for chunk in parser.feed_body(body):
                        emit(chunk)
                    return parser.conclude()
                return await self._read_stream(response, ctype, parser, emit)
        except httpx.HTTPError as exc:
            return parser.conclude(self._transport_failure(exc))

    async def _read_stream(
        self, response: httpx.Response, ctype: str, parser: StreamParser, emit: Emit
    ) -> Finish | Failure:
        """Read the event stream of a successful response and feed it to the parsers (the hot path)."""
        decoder = SSEDecoder()
        feed_bytes = decoder.feed_bytes
        feed_into = parser.feed_into
        body = response.aiter_bytes()
        finished = False  # the body iterator ran to its end (or raised)
        try:
            while True:
                try:
                    raw = await body.__anext__()
                except StopAsyncIteration:
                    finished = True
                    break
                except BaseException:
                    finished = True
                    raise
                try:
                    events = feed_bytes(raw)
                except SSEError as exc:
                    return parser.fail(Failure("malformed-stream", f"{self.name}: {exc}"))
                if events:
                    feed_into(events, emit)
                    if parser.done:
                        if parser.failure is not None:
                            return parser.failure  # the connection is closed, not reused
                        # [DONE]: let the body end so the connection can be reused.
                        outcome = parser.conclude()
                        with trio.move_on_after(_DRAIN_GRACE):
                            while True:
                                try:
                                    await body.__anext__()
                                except StopAsyncIteration:
                                    break
                        finished = True
                        return outcome
            for chunk in parser.feed_end(decoder.close()):
                emit(chunk)
            return parser.conclude(
                Failure(
                    "no-finish",
                    f"{self.name}: stream ended without a finish_reason or [DONE]"
                    + ("" if "event-stream" in ctype else f" (content-type {ctype!r})"),
                )
            )
        finally:
            if not finished:
                await _abandon(body)

    # ------------------------------------------------------------ outcomes

    def _emit_usage(self, parser: StreamParser, emit: Emit) -> None:
        usage = parser.usage
        if usage is not None:
            emit(usage)

    def _http_failure(self, response: httpx.Response, body: bytes) -> Failure:
        status = response.status_code
        detail = _error_message(body)
        message = f"{self.name}: HTTP {status} {response.reason_phrase}".rstrip()
        if detail:
            message += f": {detail}"
        if 300 <= status < 400 and "location" in response.headers:
            message += f" (redirected to {response.headers['location']})"
        retryable = status == 429 or status >= 500
        return Failure(
            f"http-{status}",
            message,
            retryable=retryable,
            retry_after=_retry_after(response.headers, self._wall_clock) if retryable else None,
        )

    def _transport_failure(self, exc: httpx.HTTPError) -> Failure:
        detail = redact_urls(str(exc) or type(exc).__name__)
        if isinstance(exc, httpx.TimeoutException):
            what = {
                httpx.ConnectTimeout: f"connecting took longer than {self.connect_timeout:g}s",
                httpx.ReadTimeout: f"no data for {self.read_timeout:g}s",
                httpx.WriteTimeout: f"sending took longer than {self.read_timeout:g}s",
            }.get(type(exc), detail)
            return Failure("timeout", f"{self.name}: timed out: {what}", retryable=True)
        if isinstance(exc, httpx.ConnectError):
            return Failure(
                "connect", f"{self.name}: cannot connect to {redact_urls(self._url)}: {detail}", retryable=True
            )
        if isinstance(exc, httpx.ReadError | httpx.RemoteProtocolError | httpx.WriteError):
            return Failure(
                "truncated-stream",
                f"{self.name}: the connection was dropped: {detail}",
                retryable=True,
            )
        if isinstance(exc, httpx.DecodingError):
            return Failure("malformed-stream", f"{self.name}: cannot decode the body: {detail}")
        return Failure("connect", f"{self.name}: request failed: {type(exc).__name__}: {detail}")


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


async def _abandon(body: AsyncIterator[bytes]) -> None:
    """Stop a partly read httpx body iterator without leaving generators suspended.

    Resuming it inside a cancelled scope makes the innermost read raise
    :class:`trio.Cancelled`, which unwinds (and so finishes) every generator of
    the httpx/httpcore chain and makes httpcore close the connection.
    """
    with trio.CancelScope() as scope:
        scope.cancel()
        try:
            while True:
                await body.__anext__()
        except StopAsyncIteration:
            pass
        except httpx.HTTPError:
            pass


async def _read_limited(response: httpx.Response, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    body = response.aiter_bytes()
    try:
        async for part in body:
            parts.append(part)
            size += len(part)
            if size >= limit:
                await _abandon(body)
                break
    except httpx.HTTPError:
        pass  # report the status with whatever body arrived
    return b"".join(parts)[:limit]


def _seconds(value: float) -> str:
    """A delay for a message: ``"7.5s"``, ``"30s"``, ``"100000s"``."""
    return f"{value:.0f}s" if value >= 100 else f"{value:.3g}s"


def _error_message(body: bytes) -> str:
    """The server's explanation in an error body: ``error.message`` or a text excerpt."""
    text = body.decode(errors="replace").strip()
    if not text:
        return ""
    try:
        obj = json.loads(text)
    except ValueError:
        obj = None
    if isinstance(obj, dict):
        found = message_of(obj.get("error", obj))
        if found:
            return found
    return text[:500]


def _retry_after(headers: httpx.Headers, wall_clock: Callable[[], float] = time.time) -> float | None:
    """Seconds to wait from ``Retry-After`` (seconds or HTTP date) or ``retry-after-ms``."""
    millis = headers.get("retry-after-ms")
    if millis is not None:
        try:
            value = float(millis) / 1000.0
        except ValueError:
            pass
        else:
            if math.isfinite(value) and value >= 0:
                return value
    raw = headers.get("retry-after")
    if raw is None:
        return None
    raw = raw.strip()
    try:
        value = float(raw)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(raw)
        except (TypeError, ValueError, IndexError, OverflowError):
            return None
        if when.tzinfo is None:
            return None
        # An HTTP date is wall-clock time; the delay it gives is slept on Trio's clock.
        return max(0.0, when.timestamp() - wall_clock())
    if math.isfinite(value) and value >= 0:
        return value
    return None


def _user_content(message: UserMessage) -> list[dict[str, Any]]:
    """A user message's content parts: its text, then each image as a ``data:`` URL."""
    parts: list[dict[str, Any]] = [{"type": "text", "text": message.text}] if message.text else []
    for image in message.images:
        url = f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"
        parts.append({"type": "image_url", "image_url": {"url": url}})
    return parts
