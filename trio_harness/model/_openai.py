"""A streaming provider for OpenAI-compatible chat completion endpoints.

:class:`OpenAIProvider` speaks the ``POST {base_url}/chat/completions`` protocol
with ``stream: true`` that OpenAI, DeepSeek, vLLM, Ollama, llama.cpp and most
hosted gateways implement.  It turns the server-sent event stream into the
chunks of :mod:`trio_harness.model._protocol` and reports every failure (HTTP
status, refused connection, timeout, malformed or truncated stream) as a
``Finish(reason="error")`` value, retrying transient failures only while
nothing has been emitted yet.

The event stream is parsed by a small hand-written decoder working directly on
``response.aiter_bytes()``: on the many tiny events a model streams it is about
twice as fast as ``httpx_sse`` (see ``bench/bench_provider.py``), and it lets
the provider stop reading without leaving httpx's internal async generators
suspended (Trio warns about those when they are garbage collected).
"""

from __future__ import annotations

import codecs
import email.utils
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Mapping
from types import TracebackType
from typing import Any, Final, Literal, Self

import attrs
import httpx
import trio

from .._errors import ModelError
from ._context import context_window_for
from ._protocol import (
    AssistantMessage,
    Emit,
    Failure,
    Finish,
    FinishReason,
    ModelRequest,
    ModelSettings,
    ReasoningDelta,
    Retry,
    TextDelta,
    ToolCallDelta,
    ToolMessage,
    Usage,
    UserMessage,
)

__all__ = ["OpenAIProvider"]

_ERROR_BODY_LIMIT: Final = 64 * 1024
"""How much of an error response body is read to find the server's message."""

_DRAIN_GRACE: Final = 0.5
"""Seconds to wait, after ``[DONE]``, for the server to end the response body.

Reading the body to its end lets httpx return the connection to its pool; a
server that keeps the body open after ``[DONE]`` only costs this much.
"""

_DECODER: Final = json.JSONDecoder()

# The decoder's C scanner, called directly: ``raw_decode`` minus a Python-level
# wrapper (a third of the parse time of a tiny chunk).  It raises StopIteration
# or JSONDecodeError (a ValueError) on bad JSON.
_SCAN: Final[Callable[[str, int], tuple[Any, int]]] = getattr(_DECODER, "scan_once", _DECODER.raw_decode)

_MAX_EVENT: Final = 16 * 1024 * 1024
"""The longest event (in characters) the parser buffers before giving up."""

_FINISH_REASONS: Final[Mapping[str, FinishReason]] = {
    "stop": "stop",
    "eos": "stop",
    "end_turn": "stop",
    "tool_calls": "tool-calls",
    "function_call": "tool-calls",
    "tool_use": "tool-calls",
    "length": "max-tokens",
    "max_tokens": "max-tokens",
}


def _make_rng(rng: random.Random | None) -> random.Random:
    return rng if rng is not None else random.Random()


def _copy_body(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(extra) if extra is not None else {}


def _json_default(value: object) -> object:
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


class _StreamFailure(Exception):
    """Internal: the stream is unusable; carries the failure to report."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


class _State:
    """What one attempt has seen so far (a plain slotted class: it is on the hot path)."""

    __slots__ = ("emitted", "finish_reason", "ids", "last_index", "outcome", "usage")

    def __init__(self) -> None:
        self.emitted = False
        self.finish_reason: str | None = None
        self.usage: Mapping[str, Any] | None = None
        self.ids: dict[str, int] = {}
        self.last_index: int | None = None
        # Set once the outcome of the attempt is known: a Finish to report, or a
        # Failure (which may still be retried).
        self.outcome: Finish | Failure | None = None


@attrs.define(eq=False, kw_only=True)
class OpenAIProvider:
    """A :class:`~trio_harness.model.ModelProvider` for OpenAI-compatible servers.

    Each :meth:`stream` call POSTs one streaming chat completion request and
    reports its chunks.  Transient failures (HTTP 429 and 5xx, refused
    connections, timeouts, dropped connections) are retried with exponential
    backoff and jitter, honouring ``Retry-After``, but only while nothing has
    been emitted for the request, so output is never duplicated.  No wait is
    longer than :attr:`backoff_max` or than what is left of the caller's
    deadline: when the server asks for longer (``Retry-After``,
    ``retry-after-ms``, an HTTP date), the request ends at once with that
    failure, its message naming the wait asked for and the wait allowed.

    The provider owns an :class:`httpx.AsyncClient` created on first use unless
    one is given; close it with :meth:`aclose` or ``async with provider:``.

    Attributes:
        model: the default model name, used when a request does not name one.
        base_url: the API root; ``/chat/completions`` is appended to it.
        api_key: sent as ``Authorization: Bearer ...`` when set.
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
            prompt asks for JSON).
        context_window: the model's context window in tokens; None (the
            default) takes it from the known models' table
            (:data:`~trio_harness.model.KNOWN_CONTEXT_WINDOWS`), and stays
            None for a model not in it.

    ``math.inf`` disables any of the three timeouts.
    """

    model: str
    base_url: str
    api_key: str | None = attrs.field(default=None, repr=False)
    _name: str | None = attrs.field(default=None, alias="name")
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
    _owned_client: httpx.AsyncClient | None = attrs.field(init=False, default=None, repr=False)
    _url: str = attrs.field(init=False, default="", repr=False)
    _timeout: httpx.Timeout = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        if not self.model:
            raise ModelError("OpenAIProvider needs a non-empty model name")
        if not self.base_url.startswith(("http://", "https://")):
            raise ModelError(f"OpenAIProvider base_url {self.base_url!r} must start with http:// or https://")
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
        if self.context_window is None:
            self.context_window = context_window_for(self.model)
        elif type(self.context_window) is not int or self.context_window <= 0:
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
    def name(self) -> str:
        """The route description, e.g. ``"deepseek:deepseek-chat"``."""
        return self._name or f"openai:{self.model}@{self.base_url}"

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
            with :attr:`extra_body`.
        """
        messages: list[dict[str, Any]] = []
        if request.system:
            messages.append({"role": "system", "content": request.system})
        for message in request.messages:
            if isinstance(message, UserMessage):
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

        Every delay is capped by :attr:`backoff_max` and by what is left of the
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
        content = json.dumps(self.build_body(request), ensure_ascii=False, default=_json_default).encode()
        headers = self._headers()
        client = self._client()
        attempt = 0
        while True:
            state = _State()
            with trio.move_on_after(self.request_timeout):
                await self._attempt(client, content, headers, state, emit)
            outcome = state.outcome
            if outcome is None:
                # The overall deadline expired before the outcome was known.
                outcome = self._conclude(
                    state,
                    Failure(
                        "timeout",
                        f"{self.name}: no complete response within request_timeout={self.request_timeout:g}s",
                        retryable=True,
                    ),
                )
            if isinstance(outcome, Finish):
                self._emit_usage(state, emit)
                emit(outcome)
                return
            failure = outcome
            if failure.retryable and not state.emitted and attempt < self.max_retries:
                delay, refusal = self._retry_delay(failure, attempt + 1)
                if refusal is None:
                    attempt += 1
                    emit(Retry(attempt=attempt, delay=delay, failure=failure))
                    await trio.sleep(delay)
                    continue
                verdict = f"gave up after {attempt} retries" if attempt else "not retried"
                failure = attrs.evolve(failure, message=f"{failure.message} ({verdict}: {refusal})")
            elif failure.retryable and state.emitted:
                failure = attrs.evolve(failure, message=failure.message + " (not retried: output was already emitted)")
            elif failure.retryable and attempt:
                failure = attrs.evolve(failure, message=f"{failure.message} (gave up after {attempt} retries)")
            self._emit_usage(state, emit)
            emit(Finish(reason="error", failure=failure))
            return

    # ------------------------------------------------------------ one attempt

    async def _attempt(
        self,
        client: httpx.AsyncClient,
        content: bytes,
        headers: dict[str, str],
        state: _State,
        emit: Emit,
    ) -> None:
        """Make one HTTP request; leaves its outcome in ``state.outcome``."""
        try:
            async with client.stream(
                "POST", self._url, content=content, headers=headers, timeout=self._timeout
            ) as response:
                status = response.status_code
                if not 200 <= status < 300:
                    body = await _read_limited(response, _ERROR_BODY_LIMIT)
                    state.outcome = self._http_failure(response, body)
                    return
                ctype = response.headers.get("content-type", "")
                if "json" in ctype and "event-stream" not in ctype:
                    body = await _read_limited(response, 16 * 1024 * 1024)
                    self._whole_json(body, state, emit)
                    return
                await self._read_stream(response, ctype, state, emit)
        except _StreamFailure as exc:
            if state.outcome is None:
                state.outcome = exc.failure
        except httpx.HTTPError as exc:
            if state.outcome is None:
                state.outcome = self._conclude(state, self._transport_failure(exc))

    async def _read_stream(self, response: httpx.Response, ctype: str, state: _State, emit: Emit) -> None:
        """Parse the event stream of a successful response (the hot path).

        The text is cut into events at blank lines; an event that is a single
        ``data: {...}`` line (nearly all of them) is handled inline, and a plain
        text delta is emitted without any further call.
        """
        decode = codecs.getincrementaldecoder("utf-8")().decode
        on_data = self._on_data
        on_object = self._on_object
        scan = _SCAN
        pending = ""  # the text of an event not yet ended by a blank line
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
                    text = decode(raw)
                except UnicodeDecodeError as exc:
                    raise _StreamFailure(
                        Failure("malformed-stream", f"{self.name}: stream is not UTF-8: {exc}")
                    ) from None
                if pending:
                    text = pending + text
                if "\r" in text:
                    # Hold back a trailing CR: its LF may be in the next read.
                    held = text.endswith("\r")
                    if held:
                        text = text[:-1]
                    text = text.replace("\r\n", "\n").replace("\r", "\n")
                    blocks = text.split("\n\n")
                    pending = blocks.pop() + ("\r" if held else "")
                else:
                    blocks = text.split("\n\n")
                    pending = blocks.pop()
                if len(pending) > _MAX_EVENT:
                    raise self._malformed(f"an event is longer than {_MAX_EVENT} characters")
                for block in blocks:
                    if block[:6] == "data: " and "\n" not in block:
                        payload = block[6:]
                        event = ""
                    else:
                        parsed, event = _parse_block(block)
                        if parsed is None:
                            continue  # comments, blank lines, fields without data
                        payload = parsed
                    if payload[:1] == "{":
                        # Inlined for speed: parse, and emit plain text deltas
                        # (the bulk of every stream) without further calls.
                        try:
                            obj, end = scan(payload, 0)
                        except (StopIteration, ValueError):
                            raise self._bad_json(payload) from None
                        if end != len(payload) and not payload[end:].isspace():
                            raise self._bad_json(payload)
                        choices = obj.get("choices")
                        if (
                            type(choices) is list
                            and len(choices) == 1
                            and type(choice := choices[0]) is dict
                            and type(delta := choice.get("delta")) is dict
                            and len(delta) == 1
                            and type(content := delta.get("content")) is str
                            and choice.get("finish_reason") is None
                            and obj.get("usage") is None
                            and not event
                        ):
                            if content:
                                state.emitted = True
                                emit(TextDelta(content))
                        else:
                            on_object(obj, payload, event, state, emit)
                    elif on_data(payload, event, state, emit):
                        state.outcome = self._conclude(state, None)
                        # Let the body end so the connection can be reused.
                        with trio.move_on_after(_DRAIN_GRACE):
                            while True:
                                try:
                                    await body.__anext__()
                                except StopAsyncIteration:
                                    break
                        finished = True
                        return
            # End of body: an event may lack its final blank line.
            rest = pending.replace("\r", "\n")
            if rest and not rest.endswith("\n") and state.finish_reason is None:
                raise _StreamFailure(
                    Failure(
                        "truncated-stream",
                        f"{self.name}: stream ended in the middle of a line",
                        retryable=True,
                    )
                )
            last, event = _parse_block(rest.rpartition("\n")[0])
            if last is not None and on_data(last, event, state, emit):
                state.outcome = self._conclude(state, None)
                return
            state.outcome = self._conclude(
                state,
                Failure(
                    "no-finish",
                    f"{self.name}: stream ended without a finish_reason or [DONE]"
                    + ("" if "event-stream" in ctype else f" (content-type {ctype!r})"),
                ),
            )
        finally:
            if not finished:
                await _abandon(body)

    def _on_data(self, payload: str, event: str, state: _State, emit: Emit) -> bool:
        """Handle one event's data; return True at ``[DONE]``."""
        if payload == "[DONE]":
            return True
        if not payload or payload.isspace():
            return False
        try:
            obj = json.loads(payload)
        except ValueError:
            raise self._bad_json(payload) from None
        if type(obj) is not dict:
            raise self._malformed(f"a data line is not a JSON object: {payload[:200]!r}")
        self._on_object(obj, payload, event, state, emit)
        return False

    def _on_object(self, obj: dict[str, Any], payload: str, event: str, state: _State, emit: Emit) -> None:
        """Handle one parsed chunk object."""
        choices = obj.get("choices")
        if choices:
            if type(choices) is not list or type(choice := choices[0]) is not dict:
                raise self._malformed(f"'choices' is not a list of objects: {payload[:200]!r}")
            delta = choice.get("delta")
            if delta:
                if type(delta) is not dict:
                    raise self._malformed(f"'delta' is not an object: {payload[:200]!r}")
                self._on_delta(delta, payload, state, emit)
            reason = choice.get("finish_reason")
            if reason:
                if type(reason) is not str:
                    raise self._malformed(f"'finish_reason' is not a string: {payload[:200]!r}")
                if reason == "error":
                    raise _StreamFailure(self._error_object(obj.get("error"), payload))
                state.finish_reason = reason
        elif event == "error" or "error" in obj:
            raise _StreamFailure(self._error_object(obj.get("error", obj), payload))
        usage = obj.get("usage")
        if usage:
            if type(usage) is not dict:
                raise self._malformed(f"'usage' is not an object: {payload[:200]!r}")
            state.usage = usage

    def _on_delta(self, delta: dict[str, Any], payload: str, state: _State, emit: Emit) -> None:
        reasoning = delta.get("reasoning_content") or delta.get("reasoning")
        if reasoning:
            if type(reasoning) is not str:
                raise self._malformed(f"reasoning is not a string: {payload[:200]!r}")
            state.emitted = True
            emit(ReasoningDelta(reasoning))
        content = delta.get("content")
        if content:
            if type(content) is not str:
                raise self._malformed(f"'content' is not a string: {payload[:200]!r}")
            state.emitted = True
            emit(TextDelta(content))
        calls = delta.get("tool_calls")
        if calls:
            if type(calls) is not list:
                raise self._malformed(f"'tool_calls' is not a list: {payload[:200]!r}")
            for position, call in enumerate(calls):
                self._on_tool_call(call, position, payload, state, emit)

    def _on_tool_call(self, call: object, position: int, payload: str, state: _State, emit: Emit) -> None:
        if type(call) is not dict:
            raise self._malformed(f"a tool call delta is not an object: {payload[:200]!r}")
        function = call.get("function") or {}
        if type(function) is not dict:
            raise self._malformed(f"a tool call 'function' is not an object: {payload[:200]!r}")
        call_id = call.get("id") or None
        name = function.get("name") or None
        arguments = function.get("arguments") or ""
        if type(arguments) is dict:  # some servers send parsed arguments
            arguments = json.dumps(arguments, ensure_ascii=False)
        if (
            not (call_id is None or type(call_id) is str)
            or not (name is None or type(name) is str)
            or type(arguments) is not str
        ):
            raise self._malformed(f"a tool call delta has the wrong shape: {payload[:200]!r}")
        index = call.get("index")
        if type(index) is not int:
            if index is not None:
                raise self._malformed(f"a tool call index is not an integer: {payload[:200]!r}")
            # Servers that omit the index: a new id starts a new call, a piece
            # without an id continues the last call (or is the n-th of a list).
            if call_id is not None:
                index = state.ids.setdefault(call_id, len(state.ids))
            elif position == 0 and state.last_index is not None:
                index = state.last_index
            else:
                index = position
        elif call_id is not None:
            state.ids.setdefault(call_id, index)
        state.last_index = index
        if call_id is None and name is None and not arguments:
            return
        state.emitted = True
        emit(ToolCallDelta(index=index, id=call_id, name=name, arguments=arguments))

    def _whole_json(self, body: bytes, state: _State, emit: Emit) -> None:
        """Handle a server that answered with one JSON document instead of a stream."""
        try:
            obj = json.loads(body)
        except ValueError:
            obj = None
        if type(obj) is dict and "error" in obj:
            raise _StreamFailure(self._error_object(obj["error"], body.decode(errors="replace")))
        choices = obj.get("choices") if type(obj) is dict else None
        if (
            type(obj) is not dict
            or type(choices) is not list
            or not choices
            or type(choices[0]) is not dict
            or type(choices[0].get("message")) is not dict
        ):
            raise self._malformed("expected an event stream, got a JSON body: " + body[:200].decode(errors="replace"))
        choice = choices[0]
        # A complete message has the same fields as a delta.
        chunk: dict[str, Any] = {
            "choices": [{"delta": choice["message"], "finish_reason": choice.get("finish_reason")}]
        }
        if "usage" in obj:
            chunk["usage"] = obj["usage"]
        self._on_object(chunk, body[:200].decode(errors="replace"), "", state, emit)
        state.outcome = self._conclude(state, None)

    # ------------------------------------------------------------ outcomes

    def _bad_json(self, payload: str) -> _StreamFailure:
        return self._malformed(f"bad JSON in a data line: {payload[:200]!r}")

    def _malformed(self, message: str) -> _StreamFailure:
        return _StreamFailure(Failure("malformed-stream", f"{self.name}: {message}"))

    def _conclude(self, state: _State, failure: Failure | None) -> Finish | Failure:
        """The outcome once the stream is over: ``failure`` applies only without a finish_reason.

        Once the server has sent a finish_reason the answer is complete; losing
        the connection afterwards only loses trailing usage, so it is not an error.
        """
        reason = state.finish_reason
        if reason is None:
            return failure or Failure("no-finish", f"{self.name}: stream sent [DONE] without a finish_reason")
        if reason == "content_filter":
            return Finish(
                reason="error",
                failure=Failure("refusal", f"{self.name}: the response was stopped by the content filter"),
            )
        mapped = _FINISH_REASONS.get(reason, "stop")
        if mapped == "stop" and state.last_index is not None:
            # Some local servers say "stop" after streaming tool calls.
            mapped = "tool-calls"
        return Finish(reason=mapped)

    def _emit_usage(self, state: _State, emit: Emit) -> None:
        usage = state.usage
        if usage is None:
            return
        cached = usage.get("prompt_cache_hit_tokens")
        if type(cached) is not int:
            details = usage.get("prompt_tokens_details")
            cached = details.get("cached_tokens") if type(details) is dict else 0
        completion = usage.get("completion_tokens_details")
        reasoning = completion.get("reasoning_tokens") if type(completion) is dict else 0
        emit(
            Usage(
                input_tokens=_count(usage.get("prompt_tokens")),
                output_tokens=_count(usage.get("completion_tokens")),
                cache_hit_tokens=_count(cached),
                reasoning_tokens=_count(reasoning),
            )
        )

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

    def _error_object(self, error: object, payload: str) -> Failure:
        """A failure for an error object the server sent inside the stream."""
        message = _message_of(error) or payload[:200]
        code = error.get("code") if isinstance(error, dict) else None
        if type(code) is str and code.isdigit():
            code = int(code)
        if type(code) is int and 400 <= code <= 599:
            return Failure(
                f"http-{code}",
                f"{self.name}: error {code} in the stream: {message}",
                retryable=code == 429 or code >= 500,
            )
        return Failure("stream-error", f"{self.name}: error in the stream: {message}")

    def _transport_failure(self, exc: httpx.HTTPError) -> Failure:
        detail = str(exc) or type(exc).__name__
        if isinstance(exc, httpx.TimeoutException):
            what = {
                httpx.ConnectTimeout: f"connecting took longer than {self.connect_timeout:g}s",
                httpx.ReadTimeout: f"no data for {self.read_timeout:g}s",
                httpx.WriteTimeout: f"sending took longer than {self.read_timeout:g}s",
            }.get(type(exc), detail)
            return Failure("timeout", f"{self.name}: timed out: {what}", retryable=True)
        if isinstance(exc, httpx.ConnectError):
            return Failure("connect", f"{self.name}: cannot connect to {self._url}: {detail}", retryable=True)
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


def _parse_block(block: str) -> tuple[str | None, str]:
    """Parse the lines of one event (no blank line inside): ``(data, event type)``.

    ``data`` is None when the event has no data line (only comments or fields).
    """
    data: list[str] = []
    event = ""
    for line in block.split("\n"):
        if not line or line[0] == ":":
            continue  # a leading blank line, or a comment
        field, _, value = line.partition(":")
        if value[:1] == " ":
            value = value[1:]
        if field == "data":
            data.append(value)
        elif field == "event":
            event = value
    return ("\n".join(data) if data else None), event


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


def _count(value: object) -> int:
    return value if type(value) is int and value >= 0 else 0


def _message_of(error: object) -> str:
    if isinstance(error, str):
        return error
    if isinstance(error, dict):
        for key in ("message", "detail", "error", "msg"):
            found = error.get(key)
            if found:
                return _message_of(found) if isinstance(found, dict) else str(found)
    return ""


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
        found = _message_of(obj.get("error", obj))
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
