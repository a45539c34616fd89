"""The scripted model: a deterministic test double for offline runs and tests.

Responses are consumed one per model request, in order.  Each response is a
mapping in the script-file format (``--model scripted:PATH``)::

    {"responses": [
        {"text": "Hello!"},
        {"tool_calls": [{"name": "bash", "arguments": {"command": "ls"}}], "text": "optional"},
        {"hang": true},
        {"error": {"message": "overloaded", "code": "http-529"}}
    ]}

Two optional keys extend the format: ``"reasoning"`` (streamed as reasoning
deltas before the text) and ``"delay"`` (seconds of Trio time to wait before
answering; deterministic under a mock clock).  In process, a response may also
be a callable taking the :class:`ModelRequest` and returning a mapping.

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
from ._protocol import (
    Emit,
    Failure,
    Finish,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
)

__all__ = ["ScriptedModel"]

Response = Mapping[str, Any] | Callable[[ModelRequest], Mapping[str, Any]]

_KEYS = frozenset({"text", "tool_calls", "hang", "error", "reasoning", "delay"})


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


@attrs.define(eq=False)
class ScriptedModel:
    """A model provider that answers from a script.

    Args:
        responses: the responses, consumed in order.
        source: where the script came from (named in errors).
        chunks: how many pieces each text is streamed in.
    """

    responses: Sequence[Response] = attrs.field(converter=_responses)
    source: str = "in-process script"
    chunks: int = 3
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)
    _next: int = attrs.field(default=0, init=False)
    _calls: int = attrs.field(default=0, init=False)

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
        if set(data) - {"responses"}:
            raise ModelError(f"scripted model file {str(path)!r} has unknown keys {sorted(set(data) - {'responses'})}")
        return cls(data["responses"], source=f"scripted model file {str(path)!r}")

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

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Answer ``request`` with the next scripted response."""
        self.requests.append(request)
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
        text = response.get("text", "")
        for piece in _split(text, self.chunks):
            emit(TextDelta(piece))
        calls = response.get("tool_calls", [])
        for index, call in enumerate(calls):
            self._calls += 1
            arguments = call.get("arguments", {})
            emit(
                ToolCallDelta(
                    index=index,
                    id=call.get("id") or f"call_{self._calls}",
                    name=call["name"],
                    arguments=arguments if isinstance(arguments, str) else json.dumps(arguments),
                )
            )
        # A cheap deterministic estimate: O(1) per request however long the history is.
        prompt = 32 * len(request.messages)
        emit(
            Usage(
                input_tokens=(len(request.system) + prompt) // 4 + 1,
                output_tokens=len(text) // 4 + 1,
            )
        )
        emit(Finish("tool-calls" if calls else "stop"))
