"""The HTTP streaming loop every native provider shares.

:class:`HTTPStreamer` is the part of :class:`~trio_harness.model.OpenAIProvider`,
:class:`~trio_harness.model.AnthropicProvider` and
:class:`~trio_harness.model.ResponsesProvider` that is not their wire format:
one POST per attempt through httpx, the three timeouts (``connect_timeout``,
``read_timeout``, the overall ``request_timeout``), retries of transient
failures with jittered exponential backoff and ``Retry-After`` (only while
nothing was emitted, never longer than ``backoff_max`` or the caller's
deadline), a cancellation that closes the connection at once, and every
failure reported as a ``Finish(reason="error")`` value.

A provider gives the request body, URL and headers and the sans-io
:class:`StreamParser` of one attempt; an :class:`Exchange` may continue a
finished response with another request (Anthropic's ``pause_turn``).
"""

from __future__ import annotations

import email.utils
import json
import math
import random
import time
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from types import TracebackType
from typing import ClassVar, Final, Protocol, Self

import attrs
import httpx
import trio

from .._errors import ModelError
from .._redact import redact_urls
from ._chunks import message_of
from ._protocol import Chunk, Emit, Failure, Finish, ResponseInfo, Retry, Usage
from ._sse import SSEDecoder, SSEEnd, SSEError, SSEEvent

ERROR_BODY_LIMIT: Final = 64 * 1024
"""How much of an error response body is read to find the server's message."""

JSON_BODY_LIMIT: Final = 16 * 1024 * 1024
"""How much of a non-streamed JSON answer is read."""

STREAM_BYTES_LIMIT: Final = 256 * 1024 * 1024
"""The most bytes of one event stream read (a server that never stops would otherwise fill the memory).

Generous: a 128k-token answer streamed as Responses events is about 30 MB.
"""

_EXCERPT: Final = 200
"""How much of a body that is no event stream a failure quotes."""

DRAIN_GRACE: Final = 0.5
"""Seconds to wait, after the end of the stream, for the server to end the response body.

Reading the body to its end lets httpx return the connection to its pool; a
server that keeps the body open after its last event only costs this much.
"""


class StreamParser(Protocol):
    """What the HTTP loop needs of a sans-io stream parser (chat completions, Messages, Responses)."""

    @property
    def done(self) -> bool: ...
    @property
    def failure(self) -> Failure | None: ...
    @property
    def emitted(self) -> bool: ...
    @property
    def usage(self) -> Usage | None: ...
    @property
    def response_info(self) -> ResponseInfo | None: ...
    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None: ...
    def feed_body(self, body: bytes) -> list[Chunk]: ...
    def feed_end(self, end: SSEEnd) -> list[Chunk]: ...
    def fail(self, failure: Failure) -> Failure: ...
    def conclude(self, failure: Failure | None = None) -> Finish | Failure: ...


class Exchange:
    """One :meth:`~HTTPStreamer.stream` call's state: the parser of each attempt and what follows a finish.

    The default makes one request; a subclass may continue a finished
    response with another (:meth:`after`) and sum the usage of the parts.
    """

    __slots__ = ("new_parser",)

    def __init__(self, new_parser: Callable[[], StreamParser]) -> None:
        self.new_parser = new_parser

    def after(self, parser: StreamParser, outcome: Finish) -> bytes | Finish:
        """The body of the next request continuing this response, or the finish to report."""
        return outcome

    def usage(self, parser: StreamParser) -> Usage | None:
        """The usage to report before the finish."""
        return parser.usage


def json_default(value: object) -> object:
    """``json.dumps`` ``default`` for request bodies: mappings (log-restored) as dicts."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"{type(value).__name__} is not JSON serializable")


def make_rng(rng: random.Random | None) -> random.Random:
    """The providers' ``rng`` converter: a fresh :class:`random.Random` when none is given."""
    return rng if rng is not None else random.Random()


class HTTPStreamer:
    """The HTTP loop of a streaming provider (a mixin of attrs provider classes).

    The provider class defines the fields annotated here (its documented
    timeout and retry attributes), ``name``, and sets ``_url`` and calls
    :meth:`_check_transport` in ``__attrs_post_init__``.
    """

    request_timeout: float
    connect_timeout: float
    read_timeout: float
    max_retries: int
    backoff_base: float
    backoff_max: float
    jitter: float
    _rng: random.Random
    _wall_clock: Callable[[], float]
    _http_client: httpx.AsyncClient | None
    _owned_client: httpx.AsyncClient | None
    _url: str
    _timeout: httpx.Timeout

    _retry_statuses: ClassVar[frozenset[int]] = frozenset({429})
    """HTTP statuses below 500 that are retried (every 5xx is)."""
    _redirect_note: ClassVar[bool] = True
    """Whether a 3xx failure names the ``Location`` it redirects to."""

    @property
    def name(self) -> str:  # pragma: no cover - every provider defines it
        """The route description used in messages."""
        raise NotImplementedError

    def _check_transport(self, kind: str) -> None:
        """Validate the timeout and retry fields (errors start with ``kind``) and build the httpx timeouts."""
        for field in ("request_timeout", "connect_timeout", "read_timeout"):
            value = getattr(self, field)
            if not value > 0:  # also rejects NaN
                raise ModelError(f"{kind} {field} must be positive, got {value!r}")
        if self.max_retries < 0:
            raise ModelError(f"{kind} max_retries must be >= 0, got {self.max_retries}")
        if not (self.backoff_base >= 0 and self.backoff_max >= 0):
            raise ModelError(f"{kind} backoff_base and backoff_max must be >= 0")
        if not 0 <= self.jitter <= 1:
            raise ModelError(f"{kind} jitter must be within [0, 1], got {self.jitter!r}")

        def finite(value: float) -> float | None:
            return None if math.isinf(value) else value

        self._timeout = httpx.Timeout(
            connect=finite(self.connect_timeout),
            read=finite(self.read_timeout),
            write=finite(self.read_timeout),
            pool=None,  # waiting for a pooled connection is bounded by request_timeout
        )

    # ------------------------------------------------------------ lifecycle

    async def aclose(self) -> None:
        """Close the HTTP client this provider created, if any.

        A client passed as ``http_client`` belongs to the caller and is left
        open.  The provider stays usable: a later ``stream`` creates a new
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

    # ------------------------------------------------------------ retries

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

    # ------------------------------------------------------------ the loop

    async def _run(self, content: bytes, headers: dict[str, str], emit: Emit, exchange: Exchange) -> None:
        """POST ``content`` (retrying, continuing) until the outcome is known; report it through ``emit``.

        Always ends with exactly one :class:`Finish`, after the usage; a
        :class:`Retry` comes before each retry.
        """
        client = self._client()
        attempt = 0
        while True:
            parser = exchange.new_parser()
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
                follow = exchange.after(parser, outcome)
                if isinstance(follow, bytes):
                    content, attempt = follow, 0
                    continue
                _emit_end(parser, exchange.usage(parser), emit)
                emit(follow)
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
            _emit_end(parser, exchange.usage(parser), emit)
            emit(Finish(reason="error", failure=failure))
            return

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
                    body = await _read_limited(response, ERROR_BODY_LIMIT)
                    # Kept by the parser too: a deadline while the response closes keeps it.
                    return parser.fail(self._http_failure(response, body))
                ctype = response.headers.get("content-type", "")
                if "json" in ctype and "event-stream" not in ctype:
                    # A server that does not stream (mock responses): the whole answer at once.
                    body = await _read_limited(response, JSON_BODY_LIMIT)
                    if len(body) >= JSON_BODY_LIMIT:
                        return parser.fail(
                            Failure(
                                "malformed-stream",
                                f"{self.name}: the JSON answer is larger than {JSON_BODY_LIMIT} bytes (not read)",
                            )
                        )
                    for chunk in parser.feed_body(body):
                        emit(chunk)
                    return parser.conclude()
                return await self._read_stream(response, ctype, parser, emit)
        except httpx.HTTPError as exc:
            return parser.conclude(self._transport_failure(exc))

    _stream_end: ClassVar[str] = "a finish_reason or [DONE]"
    """What ends a complete stream of the wire format, for :meth:`_no_finish`."""

    def _no_finish(self, ctype: str) -> str:
        """The message of a stream that ended without its end (after the provider's name).

        It names the ``Content-Type`` when that was not an event stream (a
        proxy's HTML page answered with 200, say).
        """
        return f"stream ended without {self._stream_end}" + (
            "" if "event-stream" in ctype else f" (content-type {ctype!r})"
        )

    async def _read_stream(
        self, response: httpx.Response, ctype: str, parser: StreamParser, emit: Emit
    ) -> Finish | Failure:
        """Read the event stream of a successful response and feed it to the parsers (the hot path)."""
        decoder = SSEDecoder()
        feed_bytes = decoder.feed_bytes
        feed_into = parser.feed_into
        body = response.aiter_bytes()
        finished = False  # the body iterator ran to its end (or raised)
        fed = False  # an event was read
        head = b""  # the start of a body that gave no event yet
        size = 0
        limit = STREAM_BYTES_LIMIT
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
                if not fed and len(head) < _EXCERPT:
                    head += raw[: _EXCERPT - len(head)]
                size += len(raw)
                if size > limit:
                    return parser.fail(
                        Failure("malformed-stream", f"{self.name}: the stream is longer than {limit} bytes (not read)")
                    )
                try:
                    events = feed_bytes(raw)
                except SSEError as exc:
                    return parser.fail(Failure("malformed-stream", f"{self.name}: {exc}"))
                if events:
                    fed = True
                    feed_into(events, emit)
                    if parser.done:
                        if parser.failure is not None:
                            return parser.failure  # the connection is closed, not reused
                        # The end: let the body end so the connection can be reused.
                        outcome = parser.conclude()
                        with trio.move_on_after(DRAIN_GRACE):
                            while True:
                                try:
                                    await body.__anext__()
                                except StopAsyncIteration:
                                    break
                        finished = True
                        return outcome
            end = decoder.close()
            if not fed and end.event is None and "event-stream" not in ctype:
                # Not a cut stream but no stream at all (a proxy's page, say): not worth a retry.
                return parser.fail(
                    Failure(
                        "malformed-stream",
                        f"{self.name}: expected an event stream, got content-type {ctype!r} "
                        f"and no event: {head.decode(errors='replace')!r}",
                    )
                )
            for chunk in parser.feed_end(end):
                emit(chunk)
            return parser.conclude(Failure("no-finish", f"{self.name}: {self._no_finish(ctype)}"))
        finally:
            if not finished:
                await _abandon(body)

    # ------------------------------------------------------------ failures

    def _http_failure(self, response: httpx.Response, body: bytes) -> Failure:
        status = response.status_code
        detail = _error_message(body)
        message = f"{self.name}: HTTP {status} {response.reason_phrase}".rstrip()
        if detail:
            message += f": {detail}"
        if self._redirect_note and 300 <= status < 400 and "location" in response.headers:
            message += f" (redirected to {response.headers['location']})"
        retryable = status in self._retry_statuses or status >= 500
        # The server's own word, as the official SDKs take it (a 429 for an exhausted quota says false).
        should = response.headers.get("x-should-retry", "").strip().lower()
        if should in ("true", "false") and (should == "true") != retryable:
            retryable = should == "true"
            message += f" (x-should-retry: {should})"
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
            return Failure("truncated-stream", f"{self.name}: the connection was dropped: {detail}", retryable=True)
        if isinstance(exc, httpx.DecodingError):
            return Failure("malformed-stream", f"{self.name}: cannot decode the body: {detail}")
        return Failure("connect", f"{self.name}: request failed: {type(exc).__name__}: {detail}")


# ---------------------------------------------------------------- helpers


def _emit_end(parser: StreamParser, usage: Usage | None, emit: Emit) -> None:
    """Emit what comes before the finish: the response's model and id (when named), then the usage."""
    info = parser.response_info
    if info is not None and (info.model or info.id):
        emit(info)
    if usage is not None:
        emit(usage)


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
    except (ValueError, RecursionError):
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
