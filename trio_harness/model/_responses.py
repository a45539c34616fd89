"""A streaming provider for OpenAI's Responses API (``POST {base_url}/responses``).

:class:`ResponsesProvider` is an :class:`~trio_harness.model.OpenAIProvider`
with another wire format: the request is a Responses body (``instructions``,
``input`` items, flat function tools) and the stream is parsed by
:class:`~trio_harness.model._responses_stream.ResponsesParser`.  The HTTP
loop is the chat-completions provider's own, so retries (429 / 5xx /
``Retry-After`` / dropped connections, only while nothing was emitted),
timeouts, cancellation (the connection is closed at once) and failures as
``Finish(reason="error")`` values are the same.

The transport is httpx, measured against the official ``openai`` SDK (which
does run under ``trio.run``: its httpx client goes through anyio, and a
cancelled stream closes its connection): the SDK's stream parser builds a
pydantic object per event and is slower than this module's parser on the
same bytes (``bench/bench_responses.py``), its items come back as models
rather than the JSON the server sent (a reasoning item must go back as it
came), and it would bring a second retry and timeout policy to disable.

State stays in the harness's log: requests are sent with ``store: false``
(the server keeps nothing) and ``include: ["reasoning.encrypted_content"]``,
so each reasoning item arrives with its encrypted content; it is reported as
a :class:`~trio_harness.model.ReasoningBlock` (``provider="openai-responses"``,
``data`` ``{"item": ITEM, "before": {"text": CHARS, "tool_calls": N}}``, the
item as received and how much of the message's text and how many of its calls
came before it), logged with the assistant message, and sent back as an input
item exactly where it stood among the message's text and function calls (each
reasoning item before the call it led to, as ``store: false`` requires).
``store=True`` lets the server keep responses (the items then go back without
encrypted content, by id, and so do the items of hosted tools such as
``web_search_call``, which are logged but left out with ``store`` off).
"""

from __future__ import annotations

import base64
from collections.abc import Mapping
from typing import Any, ClassVar, Final, Literal

import attrs

from .._errors import ModelError
from .._redact import redact_urls
from ._catalog import ModelInfo, catalog_entry
from ._http import StreamParser
from ._images import has_images, images_unsupported
from ._interleave import anchor_of, interleave
from ._openai import OpenAIProvider
from ._protocol import (
    AssistantMessage,
    Emit,
    Failure,
    Finish,
    ModelRequest,
    ModelSettings,
    ToolCall,
    ToolMessage,
    UserMessage,
)
from ._responses_stream import PROVIDER, ResponsesParser

ROUTE: Final = "openai-responses"
"""The spec prefix (``openai-responses:MODEL[@BASE_URL]``)."""


@attrs.define(eq=False, kw_only=True)
class ResponsesProvider(OpenAIProvider):
    """A :class:`~trio_harness.model.ModelProvider` for OpenAI's Responses API.

    Every attribute of :class:`~trio_harness.model.OpenAIProvider` applies
    (timeouts, retries, ``extra_body``, ``settings``, ``output_format``,
    ``context_window`` from the model catalog); ``base_url`` gets
    ``/responses`` appended.

    Attributes:
        store: whether the server may keep the responses (``store``); False
            (the default) keeps the state in the harness's log and asks for
            reasoning items' encrypted content.
        reasoning_summary: ``"auto"``, ``"concise"`` or ``"detailed"`` asks a
            reasoning model for a summary of its reasoning, streamed as
            reasoning deltas (``reasoning.summary``); None (the default)
            asks for none (some organisations must be verified for summaries).

    Requests with ``seed`` or ``stop`` settings (which the Responses API does
    not take), or with images when ``supports_images`` is False (the
    catalog's answer for a known model), end with a failure naming the
    setting or the model, nothing sent.
    """

    store: bool = False
    reasoning_summary: Literal["auto", "concise", "detailed"] | None = None

    _stream_end: ClassVar[str] = "response.completed, .incomplete or .failed"

    def __attrs_post_init__(self) -> None:
        super().__attrs_post_init__()
        self._url = self.base_url.rstrip("/") + "/responses"
        if self.reasoning_summary not in (None, "auto", "concise", "detailed"):
            raise ModelError(
                f"ResponsesProvider reasoning_summary must be auto, concise, detailed or None, "
                f"got {self.reasoning_summary!r}"
            )

    @property
    def name(self) -> str:
        """The route description, e.g. ``"openai-responses:gpt-5"``, with URL secrets ``***``."""
        return redact_urls(self._name or f"{ROUTE}:{self.model}@{self.base_url}")

    @property
    def url(self) -> str:
        """The Responses endpoint requests are sent to."""
        return self._url

    @property
    def catalog(self) -> ModelInfo | None:
        """The model catalog's row of :attr:`model`, or None for a model it does not know."""
        return catalog_entry(ROUTE, self.model)

    def _new_parser(self) -> StreamParser:
        return ResponsesParser(self.name)

    # ------------------------------------------------------------ requests

    def refusal(self, request: ModelRequest) -> Failure | None:
        """Why ``request`` cannot be sent to this route (a failure naming the setting or the model), or None."""
        model = request.model or self.model
        settings = self.settings.merge(request.settings)
        for field in ("seed", "stop"):
            if getattr(settings, field) is not None:
                return Failure(
                    "unsupported-setting",
                    f"{self.name}: the Responses API takes no {field!r} setting (remove it from the model settings)",
                )
        if not self.supports_images and has_images(request):
            return images_unsupported(self.name, model)
        return None

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Run one Responses call, reporting its chunks through ``emit`` (see :meth:`OpenAIProvider.stream`).

        A request :meth:`refusal` refuses ends with that failure, nothing sent.
        """
        refused = self.refusal(request)
        if refused is not None:
            emit(Finish(reason="error", failure=refused))
            return
        await super().stream(request, emit)

    def build_body(self, request: ModelRequest) -> dict[str, Any]:
        """Return the JSON body sent for ``request`` (Responses wire format).

        The same request always gives the same body (replay and resume
        rebuild it byte for byte).

        Raises:
            ModelError: the request is one :meth:`refusal` refuses.
        """
        refused = self.refusal(request)
        if refused is not None:
            raise ModelError(refused.message)
        model = request.model or self.model
        entry = catalog_entry(ROUTE, model)
        defaults = entry.settings if entry is not None else ModelSettings()
        settings = defaults.merge(self.settings).merge(request.settings)
        body: dict[str, Any] = {"model": model}
        if request.system:
            body["instructions"] = request.system
        body["input"] = self.input_items(request)
        body["stream"] = True
        body["store"] = self.store
        if not self.store and (entry is None or entry.reasoning):
            body["include"] = ["reasoning.encrypted_content"]
        if request.tools:
            body["tools"] = [
                {
                    "type": "function",
                    "name": tool.name,
                    "description": tool.description,
                    "parameters": tool.parameters,
                    "strict": False,
                }
                for tool in request.tools
            ]
        max_tokens = request.max_tokens if request.max_tokens is not None else settings.max_tokens
        if max_tokens is not None:
            body["max_output_tokens"] = max_tokens
        if settings.temperature is not None:
            body["temperature"] = settings.temperature
        if settings.top_p is not None:
            body["top_p"] = settings.top_p
        reasoning: dict[str, Any] = {}
        if settings.reasoning_effort is not None:
            reasoning["effort"] = settings.reasoning_effort
        if self.reasoning_summary is not None:
            reasoning["summary"] = self.reasoning_summary
        if reasoning:
            body["reasoning"] = reasoning
        if settings.parallel_tool_calls is not None and request.tools:
            body["parallel_tool_calls"] = settings.parallel_tool_calls
        if request.output is not None and self.output_format != "none":
            if self.output_format == "json_schema":
                schema = dict(request.output.schema)
                body["text"] = {
                    "format": {
                        "type": "json_schema",
                        "name": request.output.name,
                        "schema": schema,
                        "strict": strict_compatible(schema),
                    }
                }
            else:
                body["text"] = {"format": {"type": "json_object"}}
        body.update(self.extra_body)
        if settings.extra_body:
            body.update(settings.extra_body)
        return body

    def input_items(self, request: ModelRequest) -> list[dict[str, Any]]:
        """The ``input`` items of ``request``: its messages, reasoning items and function calls, in order.

        An assistant message becomes its text (``assistant`` messages), one
        ``function_call`` item per tool call (by ``call_id``) and its own
        kept items (the reasoning blocks whose ``provider`` is
        ``"openai-responses"``, as received), in the order the server sent
        them (``trio_harness/model/_interleave.py``; items
        logged without their place, by older versions, come first); a tool
        result becomes a ``function_call_output``; a user message's images
        follow its text as ``input_image`` data URLs.
        """
        items: list[dict[str, Any]] = []
        for message in request.messages:
            if isinstance(message, UserMessage):
                if message.images:
                    content: list[dict[str, Any]] = []
                    if message.text:
                        content.append({"type": "input_text", "text": message.text})
                    for image in message.images:
                        url = f"data:{image.media_type};base64,{base64.b64encode(image.data).decode('ascii')}"
                        content.append({"type": "input_image", "image_url": url})
                    items.append({"role": "user", "content": content})
                else:
                    items.append({"role": "user", "content": message.text})
            elif isinstance(message, AssistantMessage):
                items.extend(self._assistant_items(message))
            elif isinstance(message, ToolMessage):
                items.append({"type": "function_call_output", "call_id": message.call_id, "output": message.content})
            else:  # pragma: no cover - exhaustive over Message
                raise TypeError(f"unknown message type {type(message).__name__}")
        return items

    def _assistant_items(self, message: AssistantMessage) -> list[dict[str, Any]]:
        """The items of an assistant message, in the order received (see :meth:`input_items`).

        With ``store`` off, only reasoning items with ``encrypted_content``
        go back: one without it (the server was not asked for it, or did not
        send it) refers to nothing the server kept, and would make every
        later request fail (``Item with id 'rs_...' not found``); a hosted
        tool's item (``web_search_call`` ...) is logged but goes back only
        with ``store`` on, where its id refers to what the server kept.
        """
        items: list[dict[str, Any]] = []
        placed: list[tuple[tuple[int, int], dict[str, Any]]] = []
        for block in message.reasoning_blocks:
            if block.provider != PROVIDER:
                continue
            found, item = anchor_of(block.data), block.data.get("item")
            if found is None or not isinstance(item, Mapping):
                found, item = None, block.data  # logged as the item itself (older sessions): first
            if not self.store and (item.get("type") != "reasoning" or not item.get("encrypted_content")):
                continue
            if found is None:
                items.append(_plain(item))
            else:
                placed.append((found, _plain(item)))
        for piece in interleave(message.text, message.tool_calls, placed):
            if isinstance(piece, str):
                items.append({"role": "assistant", "content": piece})
            elif isinstance(piece, ToolCall):
                items.append(
                    {"type": "function_call", "call_id": piece.id, "name": piece.name, "arguments": piece.arguments}
                )
            else:
                items.append(piece)
        return items


def _plain(data: Mapping[str, Any]) -> dict[str, Any]:
    return dict(data)


def strict_compatible(schema: Mapping[str, Any]) -> bool:
    """Whether ``schema`` meets the rules of OpenAI's strict structured outputs.

    Every object lists all its properties in ``required`` and sets
    ``additionalProperties: false``; no ``$ref`` cycles are followed (a schema
    with ``$ref`` or a composition keyword other than ``anyOf`` is not strict).
    Such a schema is sent with ``strict: true``, others with ``strict: false``
    (the driver validates the answer either way).
    """

    def check(node: object) -> bool:
        if isinstance(node, list):
            return all(check(item) for item in node)
        if not isinstance(node, Mapping):
            return True
        if any(key in node for key in ("$ref", "allOf", "oneOf", "not", "if", "patternProperties")):
            return False
        if node.get("type") == "object" or "properties" in node:
            properties = node.get("properties", {})
            if not isinstance(properties, Mapping) or node.get("additionalProperties") is not False:
                return False
            if sorted(node.get("required", ())) != sorted(properties):
                return False
        for key, value in node.items():
            if key in ("properties", "$defs", "definitions"):
                if not isinstance(value, Mapping) or not all(check(item) for item in value.values()):
                    return False
            elif key in ("items", "anyOf", "prefixItems") and not check(value):
                return False
        return True

    return schema.get("type") == "object" and check(schema)
