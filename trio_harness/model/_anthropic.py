"""A streaming provider for Anthropic's Messages API (``POST /v1/messages``).

:class:`AnthropicProvider` sends one streaming Messages request per
:meth:`~AnthropicProvider.stream` call and turns the event stream into the
chunks of :mod:`trio_harness.model._protocol`, with the guarantees of the
chat-completions provider (:class:`~trio_harness.model.OpenAIProvider`):
failures are ``Finish(reason="error")`` values, transient ones (429, 5xx and
529 ``overloaded``, dropped connections, timeouts, an ``overloaded_error``
event) are retried with backoff and ``retry-after`` only while nothing was
emitted, and a cancellation closes the connection at once.

The transport is httpx, as for the chat-completions provider, not the
official ``anthropic`` SDK.  Measured (2.15.0, under ``trio.run``, against a
loopback server): the SDK runs under Trio and a cancelled stream closes its
connection at once, so either would do; httpx was kept because the SDK
brings its own retry loop and exception types (the harness's retry, deadline
and failure rules would have to be rebuilt around them), builds a pydantic
object for every event (its parser is the slower one, see
``bench/bench_provider.py``), and would add a runtime dependency (pydantic,
jiter, anyio, distro) for what is one POST and an event stream.

The request body is a pure function of the :class:`ModelRequest`
(:meth:`AnthropicProvider.build_body`): the same request always gives the same
bytes, cache breakpoints and thinking blocks included, so a replayed or
resumed session sends exactly what it sent.
"""

from __future__ import annotations

import base64
import json
import random
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, Final

import attrs
import httpx

from .._errors import ModelError
from .._redact import redact_urls
from .._util import is_positive_int
from ._anthropic_stream import PROVIDER, AnthropicStreamParser
from ._context import context_window_for
from ._http import Exchange, HTTPStreamer, StreamParser, json_default, make_rng
from ._images import has_images, images_unsupported
from ._interleave import anchor_of, interleave
from ._protocol import (
    AssistantMessage,
    Emit,
    Failure,
    Finish,
    Message,
    ModelRequest,
    ModelSettings,
    ReasoningBlock,
    ToolCall,
    ToolMessage,
    Usage,
    UserMessage,
)

ANTHROPIC_BASE_URL: Final = "https://api.anthropic.com"
"""The base URL of ``anthropic:MODEL`` specs; ``/v1/messages`` is appended to it."""

ANTHROPIC_VERSION: Final = "2023-06-01"
"""The ``anthropic-version`` header sent with every request."""

DEFAULT_MAX_TOKENS: Final = 8192
"""The ``max_tokens`` sent when no setting gives one (the API requires the field)."""

THINKING_BUDGETS: Final[Mapping[str, int]] = {"low": 2048, "medium": 8192, "high": 24576}
"""Extended-thinking budgets (``budget_tokens``) for the ``reasoning_effort`` setting's words."""

MAX_BREAKPOINTS: Final = 4
"""The most ``cache_control`` breakpoints the API takes in one request."""

_EPHEMERAL: Final[Mapping[str, str]] = {"type": "ephemeral"}


def _copy_body(extra: Mapping[str, Any] | None) -> dict[str, Any]:
    return dict(extra) if extra is not None else {}


# ---------------------------------------------------------------- the wire format


def assistant_content(message: AssistantMessage) -> list[dict[str, Any]]:
    """The content blocks of an assistant message as Anthropic takes them back.

    Its text (``text`` blocks) and tool calls (``tool_use`` blocks, their
    arguments parsed), with the message's Anthropic blocks (thinking,
    redacted thinking, server-tool blocks, see
    ``trio_harness/model/_anthropic_stream.py``) put back exactly as received
    where each stood among them, so the content has the order the server
    sent; blocks of other providers are left out.  Blocks logged before
    anchors were recorded go back at their ``index`` among one text block and
    the calls.
    """
    kept = [block for block in message.reasoning_blocks if block.provider == PROVIDER]
    anchors = [anchor_of(block.data) for block in kept]
    if all(found is not None for found in anchors):
        placed = [(found, _reasoning_wire(block)) for found, block in zip(anchors, kept, strict=True) if found]
        return [_piece_wire(piece) for piece in interleave(message.text, message.tool_calls, placed)]
    others: list[dict[str, Any]] = []
    if message.text:
        others.append({"type": "text", "text": message.text})
    for call in message.tool_calls:
        others.append(_tool_use(call))
    content: list[dict[str, Any]] = []
    pending = iter(others)
    for block in kept:
        position = block.data.get("index")
        if not isinstance(position, int):
            position = len(content)
        while len(content) < position:
            nxt = next(pending, None)
            if nxt is None:
                break
            content.append(nxt)
        content.append(_reasoning_wire(block))
    content.extend(pending)
    return content


def _tool_use(call: ToolCall) -> dict[str, Any]:
    return {"type": "tool_use", "id": call.id, "name": call.name, "input": _tool_input(call.arguments)}


def _piece_wire(piece: str | ToolCall | dict[str, Any]) -> dict[str, Any]:
    if isinstance(piece, str):
        return {"type": "text", "text": piece}
    if isinstance(piece, ToolCall):
        return _tool_use(piece)
    return piece


def _reasoning_wire(block: ReasoningBlock) -> dict[str, Any]:
    raw = block.data.get("block")
    if not isinstance(raw, Mapping):
        raw = block.data  # a block recorded without its position
    wire: dict[str, Any] = _plain(raw)
    return wire


def _plain(value: Any) -> Any:
    """A JSON value with every mapping a dict (blocks come back from the log as mappings)."""
    if isinstance(value, Mapping):
        return {key: _plain(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(item) for item in value]
    return value


def _tool_input(arguments: str) -> Any:
    """A tool call's arguments as the ``input`` object (``{}`` when empty or not an object)."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except (ValueError, RecursionError):
        return {}
    return value if isinstance(value, dict) else {}


def _user_blocks(message: UserMessage) -> list[dict[str, Any]]:
    blocks: list[dict[str, Any]] = []
    if message.text:
        blocks.append({"type": "text", "text": message.text})
    for image in message.images:
        blocks.append(
            {
                "type": "image",
                "source": {
                    "type": "base64",
                    "media_type": image.media_type,
                    "data": base64.b64encode(image.data).decode("ascii"),
                },
            }
        )
    return blocks


def wire_messages(messages: Sequence[Message]) -> list[dict[str, Any]]:
    """The ``messages`` of a Messages request: user and tool-result content merged into user turns.

    Tool results become ``tool_result`` blocks (``is_error`` when the tool
    failed) of the user turn that follows the assistant's ``tool_use``, ahead
    of any user text of that turn, as the API requires; consecutive messages
    of one role are one turn; an assistant message with no content is left out.
    """
    wire: list[dict[str, Any]] = []
    for message in messages:
        if isinstance(message, AssistantMessage):
            blocks = assistant_content(message)
            role = "assistant"
        elif isinstance(message, ToolMessage):
            result: dict[str, Any] = {"type": "tool_result", "tool_use_id": message.call_id}
            if message.content:
                result["content"] = message.content
            if message.is_error:
                result["is_error"] = True
            blocks, role = [result], "user"
        elif isinstance(message, UserMessage):
            blocks, role = _user_blocks(message), "user"
        else:  # pragma: no cover - exhaustive over Message
            raise TypeError(f"unknown message type {type(message).__name__}")
        if not blocks:
            continue
        if wire and wire[-1]["role"] == role:
            previous = wire[-1]["content"]
            if role == "user" and blocks[0]["type"] == "tool_result":
                # Tool results lead their turn.
                cut = next((i for i, block in enumerate(previous) if block["type"] != "tool_result"), len(previous))
                previous[cut:cut] = blocks
            else:
                previous.extend(blocks)
        else:
            wire.append({"role": role, "content": blocks})
    return wire


def place_breakpoints(body: dict[str, Any]) -> None:
    """Put prompt-cache breakpoints (``cache_control``) into a request body, at most four.

    On the last tool, on the system prompt, and on the last block of the
    last two user turns: each request reads the prefix the one before wrote,
    and writes its own longer one.  Deterministic: the same body always gets
    the same breakpoints.
    """
    left = MAX_BREAKPOINTS
    tools = body.get("tools")
    if tools:
        tools[-1]["cache_control"] = dict(_EPHEMERAL)
        left -= 1
    system = body.get("system")
    if system:
        system[-1]["cache_control"] = dict(_EPHEMERAL)
        left -= 1
    turns = min(left, 2)
    for message in reversed(body["messages"]):
        if turns == 0:
            break
        if message["role"] == "user":
            message["content"][-1]["cache_control"] = dict(_EPHEMERAL)
            turns -= 1


# ---------------------------------------------------------------- the provider


@attrs.define(eq=False, kw_only=True)
class AnthropicProvider(HTTPStreamer):
    """A :class:`~trio_harness.model.ModelProvider` for Anthropic's Messages API.

    Attributes:
        model: the default model name, used when a request does not name one.
        base_url: the API root (``https://api.anthropic.com``); ``/v1/messages``
            is appended to it, as the official SDKs do.
        api_key: sent as ``x-api-key`` when set.
        api_key_env: the environment variable ``api_key`` was read from, or None.
        prompt_caching: put ``cache_control`` breakpoints into every request
            (True, the default; see :func:`~trio_harness.model._anthropic.place_breakpoints`).
        default_max_tokens: the ``max_tokens`` of a request no setting caps.
        max_pause_continuations: how many times a turn the server paused
            (``stop_reason`` ``pause_turn``, long-running server tools) is
            continued within the same :meth:`stream` call, by sending its
            content so far back as the assistant's message; one more pause is
            a ``pause-turn`` failure (0: never continued).
        context_window: as for :class:`~trio_harness.model.OpenAIProvider`,
            and so are the timeouts (``request_timeout``, ``connect_timeout``,
            ``read_timeout``), the retry fields (``max_retries``,
            ``backoff_base``, ``backoff_max``, ``jitter``, ``wall_clock``),
            ``extra_body`` and ``settings``.
        supports_images: whether the model takes images (True: every current
            Claude model does); when False a request carrying images fails
            with ``images-unsupported`` naming the model, before anything is sent.

    The ``reasoning_effort`` setting turns on extended thinking: ``low``,
    ``medium`` or ``high`` (:data:`~trio_harness.model._anthropic.THINKING_BUDGETS`) or a number of tokens
    as ``budget_tokens``; ``seed`` is not sent (the API has none).
    """

    model: str
    base_url: str = attrs.field(default=ANTHROPIC_BASE_URL, repr=lambda url: repr(redact_urls(url)))
    api_key: str | None = attrs.field(default=None, repr=False)
    api_key_env: str | None = None
    _name: str | None = attrs.field(default=None, alias="name", repr=lambda name: repr(name and redact_urls(name)))
    prompt_caching: bool = True
    default_max_tokens: int = DEFAULT_MAX_TOKENS
    max_pause_continuations: int = 4
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
    supports_images: bool = True
    _owned_client: httpx.AsyncClient | None = attrs.field(init=False, default=None, repr=False)
    _url: str = attrs.field(init=False, default="", repr=False)
    _timeout: httpx.Timeout = attrs.field(init=False, repr=False)

    json_schema_output: Final = False
    """Typed answers go through the final-answer tool."""

    _retry_statuses: ClassVar[frozenset[int]] = frozenset({408, 409, 429})
    _redirect_note: ClassVar[bool] = False
    _stream_end: ClassVar[str] = "a stop_reason or message_stop"

    def __attrs_post_init__(self) -> None:
        if not self.model:
            raise ModelError("AnthropicProvider needs a non-empty model name")
        if not self.base_url.startswith(("http://", "https://")):
            raise ModelError(
                f"AnthropicProvider base_url {redact_urls(self.base_url)!r} must start with http:// or https://"
            )
        self._check_transport("AnthropicProvider")
        if self.max_pause_continuations < 0:
            raise ModelError(
                f"AnthropicProvider max_pause_continuations must be >= 0, got {self.max_pause_continuations}"
            )
        if not is_positive_int(self.default_max_tokens):
            raise ModelError(
                f"AnthropicProvider default_max_tokens must be a positive int, got {self.default_max_tokens!r}"
            )
        self._url = self.base_url.rstrip("/") + "/v1/messages"
        if self.context_window is None:
            self.context_window = context_window_for(self.model)
        elif not is_positive_int(self.context_window):
            raise ModelError(f"AnthropicProvider context_window must be a positive int, got {self.context_window!r}")

    # ------------------------------------------------------------ lifecycle

    @property
    def name(self) -> str:
        """The route, e.g. ``"anthropic:claude-sonnet-4-5"``, base URL userinfo and query values ``***``."""
        return redact_urls(self._name or f"anthropic:{self.model}@{self.base_url}")

    @property
    def url(self) -> str:
        """The Messages endpoint requests are sent to."""
        return self._url

    # ------------------------------------------------------------ requests

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request`` (Messages wire format).

        ``model``, ``max_tokens``, ``stream``, ``system`` (a list of one text
        block), ``messages`` (:func:`~trio_harness.model._anthropic.wire_messages`), ``tools``, the settings,
        cache breakpoints unless ``prompt_caching`` is off, then
        ``extra_body`` and the settings' ``extra_body``.
        """
        settings = self.settings.merge(request.settings)
        max_tokens = request.max_tokens if request.max_tokens is not None else settings.max_tokens
        body: dict[str, Any] = {
            "model": request.model or self.model,
            "max_tokens": max_tokens if max_tokens is not None else self.default_max_tokens,
            "stream": True,
        }
        system = request.system
        if request.output is not None:
            schema = json.dumps(dict(request.output.schema), ensure_ascii=False, sort_keys=True)
            system = (system + "\n\n" if system else "") + (
                f"Answer with only a JSON value ({request.output.name}) matching this JSON schema: {schema}"
            )
        if system:
            body["system"] = [{"type": "text", "text": system}]
        body["messages"] = wire_messages(request.messages)
        if request.tools:
            body["tools"] = [
                {"name": tool.name, "description": tool.description, "input_schema": _plain(tool.parameters)}
                for tool in request.tools
            ]
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        if settings.stop is not None:
            body["stop_sequences"] = list(settings.stop)
        if settings.reasoning_effort is not None:
            budget = _thinking_budget(settings.reasoning_effort, self.name)
            if body["max_tokens"] <= _MIN_THINKING_BUDGET:
                # The API needs 1024 <= budget_tokens < max_tokens: no budget fits; refuse before sending.
                raise ModelError(
                    f"{self.name}: reasoning_effort needs max_tokens above {_MIN_THINKING_BUDGET} "
                    f"(Anthropic's smallest thinking budget), got max_tokens={body['max_tokens']}"
                )
            body["thinking"] = {"type": "enabled", "budget_tokens": min(budget, body["max_tokens"] - 1)}
        if settings.parallel_tool_calls is False and request.tools:
            body["tool_choice"] = {"type": "auto", "disable_parallel_tool_use": True}
        if self.prompt_caching:
            place_breakpoints(body)
        body.update(self.extra_body)
        if settings.extra_body:
            body.update(settings.extra_body)
        return body

    def _headers(self) -> dict[str, str]:
        headers = {
            "Content-Type": "application/json",
            "Accept": "text/event-stream",
            "anthropic-version": ANTHROPIC_VERSION,
        }
        if self.api_key:
            headers["x-api-key"] = self.api_key
        return headers

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Run one Messages request, reporting its chunks through ``emit``.

        Always ends with exactly one :class:`Finish` (failures as
        ``Finish(reason="error", failure=...)``), after the usage; a
        :class:`Retry` comes before each retry.  Only :class:`trio.Cancelled`
        (and what ``emit`` raises) escapes; cancellation closes the connection.
        """
        if not self.supports_images and has_images(request):
            emit(Finish(reason="error", failure=images_unsupported(self.name, request.model or self.model)))
            return
        try:
            body = self.build_body(request)
        except ModelError as exc:
            emit(Finish(reason="error", failure=Failure("bad-request", str(exc))))
            return
        content = json.dumps(body, ensure_ascii=False, default=json_default).encode()
        await self._run(content, self._headers(), emit, _Turn(self, body))


_MIN_THINKING_BUDGET = 1024
"""Anthropic's smallest ``thinking.budget_tokens``."""


class _Turn(Exchange):
    """One Messages call: a turn the server paused (``pause_turn``) is continued while it may."""

    __slots__ = ("body", "chars", "earlier", "paused", "provider", "tools")

    def __init__(self, provider: AnthropicProvider, body: dict[str, Any]) -> None:
        super().__init__(self._parser)
        self.provider = provider
        self.body = body
        self.paused: list[dict[str, Any]] = []  # the content of the parts of a paused turn so far
        self.earlier: list[Usage] = []
        self.tools = 0
        self.chars = 0

    def _parser(self) -> StreamParser:
        return AnthropicStreamParser(self.provider.name, tools=self.tools, offset=len(self.paused), text=self.chars)

    def after(self, parser: StreamParser, outcome: Finish) -> bytes | Finish:
        assert isinstance(parser, AnthropicStreamParser)
        if parser.stop_reason != "pause_turn" or outcome.reason != "error":
            return outcome
        limit = self.provider.max_pause_continuations
        if len(self.earlier) + 1 <= limit:
            # Continue the paused turn: its content so far goes back as the assistant's message.
            self.paused.extend(parser.content)
            self.tools = parser.tools
            self.chars = parser.text_chars
            self.earlier.append(parser.usage if parser.usage is not None else Usage())
            body = self.body
            continued = {**body, "messages": [*body["messages"], {"role": "assistant", "content": self.paused}]}
            return json.dumps(continued, ensure_ascii=False, default=json_default).encode()
        assert outcome.failure is not None
        return attrs.evolve(
            outcome,
            failure=attrs.evolve(
                outcome.failure,
                message=f"{outcome.failure.message}, again after max_pause_continuations={limit} continuations",
            ),
        )

    def usage(self, parser: StreamParser) -> Usage | None:
        """The usage of the request, the parts of a paused turn summed."""
        usage = parser.usage
        for part in self.earlier:
            usage = part if usage is None else _add(usage, part)
        return usage


def _add(a: Usage, b: Usage) -> Usage:
    return Usage(
        input_tokens=a.input_tokens + b.input_tokens,
        output_tokens=a.output_tokens + b.output_tokens,
        cache_hit_tokens=a.cache_hit_tokens + b.cache_hit_tokens,
        reasoning_tokens=a.reasoning_tokens + b.reasoning_tokens,
        cache_write_tokens=a.cache_write_tokens + b.cache_write_tokens,
    )


def _thinking_budget(effort: str, name: str) -> int:
    word = effort.strip().lower()
    if word in THINKING_BUDGETS:
        return THINKING_BUDGETS[word]
    if word.isdigit() and int(word) >= 1024:
        return int(word)
    raise ModelError(
        f"{name}: reasoning_effort {effort!r} is not low, medium, high or a thinking budget of at least 1024 tokens"
    )


def from_spec(spec: str, rest: str, environ: Mapping[str, str], *, require_key: bool) -> AnthropicProvider:
    """The provider of an ``anthropic:MODEL[@BASE_URL][?QUERY]`` spec (``rest`` is what follows the colon).

    The query takes the settings every spec takes plus ``prompt_caching``
    (``true`` / ``false``).  ``ANTHROPIC_API_KEY`` is required without a base
    URL and optional with one.
    """
    from ._spec import _BASE_URL_AT, _FORMS, _check_model, _key, _parse_query

    settings, context_window, caching = ModelSettings(), None, True
    if "?" in rest:
        rest, _, query = rest.rpartition("?")
        kept: list[str] = []
        for pair in query.split("&") if query else ():
            key, _, value = pair.partition("=")
            if key != "prompt_caching":
                kept.append(pair)
                continue
            lowered = value.strip().lower()
            if lowered not in ("true", "false", "1", "0"):
                raise ModelError(f"model spec {redact_urls(spec)!r}: prompt_caching={value!r} is not true or false")
            caching = lowered in ("true", "1")
        settings, context_window = _parse_query(spec, "&".join(kept))
    found = _BASE_URL_AT.search(rest)
    if found is not None:
        model, base_url = rest[: found.start()], rest[found.end() :]
        name = f"anthropic:{model}@{base_url}"
        required = False
    else:
        if "@" in rest:
            model, _, base_url = rest.rpartition("@")
            raise ModelError(
                redact_urls(
                    f"model spec {spec!r}: base URL {base_url!r} must start with http:// or https://"
                    f" (e.g. 'anthropic:{model or 'MODEL'}@http://localhost:4000'); {_FORMS}"
                )
            )
        model, base_url, name, required = rest, ANTHROPIC_BASE_URL, f"anthropic:{rest}", require_key
    _check_model(spec, model)
    return AnthropicProvider(
        model=model,
        base_url=base_url,
        api_key=_key(environ, "ANTHROPIC_API_KEY", spec, required=required),
        api_key_env="ANTHROPIC_API_KEY",
        name=name,
        settings=settings,
        context_window=context_window,
        prompt_caching=caching,
    )
