"""The scripted model: a deterministic test double for offline runs and tests.

Responses are consumed one per model request, in order.  Each response is a
mapping in the script-file format (``--model scripted:PATH``)::

    {"responses": [
        {"text": "Hello!"},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "text": "optional"},
        {"hang": true},
        {"error": {"message": "overloaded", "code": "http-529"}}
    ]}

Three optional keys extend the format: ``"reasoning"`` (streamed as reasoning
deltas before the text), ``"reasoning_blocks"`` (a list of
``{"provider": ..., "data": {...}}`` objects, reported as
:class:`~trio_harness.model.ReasoningBlock` chunks after the reasoning) and
``"delay"`` (seconds of Trio time to wait before answering; deterministic
under a mock clock).  In process, a response may also
be a callable taking the :class:`ModelRequest` and returning a mapping.

Two optional top-level keys of the file (and constructor arguments) help test
long sessions offline: ``"context_window"`` (tokens; a request larger than it
fails with a ``context-length`` failure and consumes no response) and
``"summary"`` (the text answering every context-compaction request, which then
consumes no response either).  A third, ``"supports_images"`` (true by
default), says whether it takes images.  The reported usage follows the text's length,
about four characters a token (:data:`~trio_harness.model.CHARS_PER_TOKEN`),
measured incrementally, so a long session costs no more per request.  A
scripted model is an endpoint with a JSON response format: for a request with
an ``output`` format, its text answer is the JSON to validate.

Every request is recorded in :attr:`ScriptedModel.requests`.  When the script
runs out, further requests fail with a ``script-exhausted`` failure naming the
script.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import trio

from .._errors import ModelError
from .._util import is_positive_int
from ._context import message_chars, tokens_for_chars, tools_chars
from ._images import has_images, images_unsupported
from ._protocol import (
    Emit,
    Failure,
    Finish,
    Message,
    ModelRequest,
    ModelSettings,
    ReasoningBlock,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

Response = Mapping[str, Any] | Callable[[ModelRequest], Mapping[str, Any]]

_KEYS = frozenset({"text", "tool_calls", "hang", "error", "reasoning", "reasoning_blocks", "delay"})


def _check_response(response: object, where: str) -> None:
    if callable(response):
        return
    if not isinstance(response, Mapping):
        raise ModelError(f"{where}: a response must be an object, got {type(response).__name__}")
    extra = set(response) - _KEYS
    if extra:
        raise ModelError(f"{where}: unknown keys {sorted(extra)}; allowed: {sorted(_KEYS)}")
    if not (set(response) & {"text", "tool_calls", "hang", "error"}):
        raise ModelError(f"{where}: a response needs one of text, tool_calls, hang or error")
    if "text" in response and not isinstance(response["text"], str):
        raise ModelError(f"{where}: 'text' must be a string")
    calls = response.get("tool_calls", [])
    if not isinstance(calls, list):
        raise ModelError(f"{where}: 'tool_calls' must be a list")
    for i, call in enumerate(calls):
        if not isinstance(call, Mapping) or not isinstance(call.get("name"), str):
            raise ModelError(f"{where}: tool_calls[{i}] needs a string 'name'")
        if set(call) - {"name", "arguments", "id"}:
            raise ModelError(
                f"{where}: tool_calls[{i}] has unknown keys {sorted(set(call) - {'name', 'arguments', 'id'})}"
            )
    blocks = response.get("reasoning_blocks", [])
    if not isinstance(blocks, list) or not all(
        isinstance(b, Mapping)
        and set(b) == {"provider", "data"}
        and isinstance(b["provider"], str)
        and isinstance(b["data"], Mapping)
        for b in blocks
    ):
        raise ModelError(
            f"{where}: 'reasoning_blocks' must be a list of objects with a string 'provider' and an object 'data'"
        )
    error = response.get("error")
    if error is not None and (not isinstance(error, Mapping) or not isinstance(error.get("message"), str)):
        raise ModelError(f"{where}: 'error' must be an object with a string 'message'")
    delay = response.get("delay", 0)
    if not isinstance(delay, int | float) or isinstance(delay, bool) or delay < 0:
        raise ModelError(f"{where}: 'delay' must be a non-negative number")


def _responses(value: Iterable[Response]) -> tuple[Response, ...]:
    return tuple(value)


def _split(text: str, parts: int = 3) -> list[str]:
    if len(text) <= 1:
        return [text] if text else []
    size = max(1, -(-len(text) // parts))
    return [text[i : i + size] for i in range(0, len(text), size)]


def _check_window(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and not is_positive_int(value):
        raise ModelError(f"ScriptedModel context_window must be a positive int or None, got {value!r}")


@attrs.define(eq=False)
class ScriptedModel:
    """A model provider that answers from a script.

    Args:
        responses: the responses, consumed in order.
        source: where the script came from (named in errors).
        chunks: how many pieces each text is streamed in.
        context_window: the window in tokens; a larger request fails with a
            ``context-length`` failure (consuming no response).
        summary: the answer to every context-compaction request (a text, or
            a callable of the request); None to answer them from the script.
        settings: default model settings of the route (a spec's query).
        supports_images: whether it takes images (True); when False a request
            carrying images fails with code ``images-unsupported``, as a
            provider that cannot take them does.
        json_schema_output: whether it counts as an endpoint with a JSON-schema
            response format (True: ``agent.run(output=TYPE)`` validates its
            text answer; False: it is offered the final-answer tool).
    """

    responses: Sequence[Response] = attrs.field(converter=_responses)
    source: str = "in-process script"
    chunks: int = 3
    context_window: int | None = attrs.field(default=None, kw_only=True, validator=_check_window)
    summary: str | Callable[[ModelRequest], str] | None = attrs.field(default=None, kw_only=True)
    settings: ModelSettings = attrs.field(factory=ModelSettings, kw_only=True)
    json_schema_output: bool = attrs.field(default=True, kw_only=True)
    supports_images: bool = attrs.field(default=True, kw_only=True)
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)
    # Internal counters, set at every request: no converter or validator to run on
    # assignment (NO_OP skips attrs' per-assignment hook; the public fields keep theirs).
    _next: int = attrs.field(default=0, init=False, on_setattr=attrs.setters.NO_OP)
    _calls: int = attrs.field(default=0, init=False, on_setattr=attrs.setters.NO_OP)
    # The last conversation measured: (first message, last message, count, characters).
    _measured: tuple[Message | None, Message | None, int, int] = attrs.field(
        default=(None, None, 0, 0), init=False, on_setattr=attrs.setters.NO_OP
    )
    _tools_measured: tuple[tuple[ToolSpec, ...], int] = attrs.field(
        default=((), 0), init=False, on_setattr=attrs.setters.NO_OP
    )

    def __attrs_post_init__(self) -> None:
        for index, response in enumerate(self.responses):
            _check_response(response, f"{self.source}: responses[{index}]")

    @classmethod
    def from_file(cls, path: str | Path) -> ScriptedModel:
        """Load a script file (``{"responses": [...]}``).

        Raises:
            ModelError: the file is missing, not JSON, or not in the format.
        """
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelError(f"scripted model file {str(path)!r} does not exist") from None
        except (OSError, ValueError) as exc:
            raise ModelError(f"scripted model file {str(path)!r} is not readable JSON: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("responses"), list):
            raise ModelError(f"scripted model file {str(path)!r} must be an object with a 'responses' list")
        known = {"responses", "context_window", "summary", "supports_images"}
        if set(data) - known:
            raise ModelError(
                f"scripted model file {str(path)!r} has unknown keys {sorted(set(data) - known)}; "
                f"allowed: {sorted(known)}"
            )
        summary = data.get("summary")
        if summary is not None and not isinstance(summary, str):
            raise ModelError(f"scripted model file {str(path)!r}: 'summary' must be a string")
        images = data.get("supports_images", True)
        if type(images) is not bool:
            raise ModelError(f"scripted model file {str(path)!r}: 'supports_images' must be true or false")
        source = f"scripted model file {str(path)!r}"
        try:
            return cls(
                data["responses"],
                source=source,
                context_window=data.get("context_window"),
                summary=summary,
                supports_images=images,
            )
        except ModelError as exc:
            if str(exc).startswith(source):  # the response checks name the file already
                raise
            raise ModelError(f"{source}: {exc}") from None

    def push(self, *responses: Response) -> None:
        """Append responses to the script (validated like the constructor's)."""
        for offset, response in enumerate(responses):
            _check_response(response, f"{self.source}: responses[{len(self.responses) + offset}]")
        self.responses = (*self.responses, *responses)

    @property
    def name(self) -> str:
        """``"scripted"``."""
        return "scripted"

    @property
    def remaining(self) -> int:
        """How many responses are left."""
        return len(self.responses) - self._next

    def prompt_tokens(self, request: ModelRequest) -> int:
        """The prompt tokens this model reports for ``request`` (about four characters a token).

        The conversation is measured incrementally: when ``request`` extends
        the previous request's messages (the same first and last-seen
        message objects), only the new messages are measured.
        """
        messages = request.messages
        count = len(messages)
        first, last, seen, chars = self._measured
        if not (seen and count >= seen and messages[0] is first and messages[seen - 1] is last):
            seen, chars = 0, 0
        for index in range(seen, count):
            chars += message_chars(messages[index])
        if count:
            self._measured = (messages[0], messages[count - 1], count, chars)
        tools, size = self._tools_measured
        if tools != request.tools:
            size = tools_chars(request.tools)
            self._tools_measured = (request.tools, size)
        return tokens_for_chars(len(request.system) + size + chars)

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Answer ``request`` with the next scripted response."""
        self.requests.append(request)
        prompt = self.prompt_tokens(request)
        if self.context_window is not None and prompt > self.context_window:
            await trio.lowlevel.checkpoint()
            emit(
                Finish(
                    "error",
                    Failure(
                        "context-length",
                        f"{self.source}: the request has about {prompt} tokens, more than the context window "
                        f"of {self.context_window}",
                    ),
                )
            )
            return
        if not self.supports_images and has_images(request):
            await trio.lowlevel.checkpoint()
            emit(Finish("error", images_unsupported(self.source, request.model or "scripted")))
            return
        if request.purpose == "compaction" and self.summary is not None:
            await trio.lowlevel.checkpoint()
            text = self.summary if isinstance(self.summary, str) else self.summary(request)
            for piece in _split(text, self.chunks):
                emit(TextDelta(piece))
            emit(Usage(input_tokens=prompt, output_tokens=tokens_for_chars(len(text))))
            emit(Finish("stop"))
            return
        if self._next >= len(self.responses):
            emit(
                Finish(
                    "error",
                    Failure(
                        "script-exhausted",
                        f"{self.source} has no response left for request {len(self.requests)} "
                        f"(it has {len(self.responses)})",
                    ),
                )
            )
            return
        response = self.responses[self._next]
        self._next += 1
        if callable(response):
            response = response(request)
            _check_response(response, f"{self.source}: response {self._next - 1} (from a callable)")
        delay = response.get("delay", 0)
        if delay:
            await trio.sleep(delay)
        else:
            await trio.lowlevel.checkpoint()
        if response.get("hang"):
            await trio.sleep_forever()
        error = response.get("error")
        if error is not None:
            emit(Finish("error", Failure(str(error.get("code", "scripted")), error["message"])))
            return
        for piece in _split(response.get("reasoning", ""), self.chunks):
            emit(ReasoningDelta(piece))
        for block in response.get("reasoning_blocks", ()):
            emit(ReasoningBlock(block["provider"], dict(block["data"])))
        text = response.get("text", "")
        for piece in _split(text, self.chunks):
            emit(TextDelta(piece))
        calls = response.get("tool_calls", [])
        output = len(text) + len(response.get("reasoning", ""))
        for index, call in enumerate(calls):
            self._calls += 1
            arguments = call.get("arguments", {})
            call_id = call.get("id") or f"call_{self._calls}"
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            output += len(call_id) + len(call["name"]) + len(arguments)
            emit(ToolCallDelta(index=index, id=call_id, name=call["name"], arguments=arguments))
        # Follows the text's length; measured incrementally (prompt_tokens), so O(new messages).
        emit(Usage(input_tokens=prompt, output_tokens=tokens_for_chars(output)))
        emit(Finish("tool-calls" if calls else "stop"))
