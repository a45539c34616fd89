"""The model's response to one request: its chunks become session events, then one assistant message.

Text and reasoning deltas are logged as ``assistant/chunk`` events as they
arrive (what ``agent.events()`` streams); tool-call deltas are assembled by
index; a retry the provider reports is logged as ``request/retry``; reasoning
blocks (:class:`~trio_harness.model.ReasoningBlock`) are kept in order and
logged with the assistant message (a block holding anything but plain JSON
ends the step as an error: the log could not give it back unchanged).
Nothing counts after the finish.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from .._records import plain_constructor
from .._util import split_cancelled
from ..model._protocol import (
    Chunk,
    Failure,
    Finish,
    ReasoningBlock,
    ReasoningDelta,
    ResponseInfo,
    Retry,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)
from ..session import _events as ev
from ..session._codec import is_plain_json

if TYPE_CHECKING:
    from ..model._protocol import ModelProvider, ModelRequest
    from ..session._session import Session


log = logging.getLogger("trio_harness.agent")

_NO_INFO = ResponseInfo()

# Built from values checked here: a plain constructor (the same objects, cheaper).
_tool_call = plain_constructor(ToolCall) or ToolCall


async def stream_response(
    provider: ModelProvider, session: Session, request: ModelRequest, turn: int, step: int
) -> tuple[Finish, list[ToolCall]]:
    """Stream ``request``: its chunks, retries and the assistant message are logged; returns the finish and the calls.

    A provider that raises ends the step as an error (``provider-crashed``);
    a cancelled stream logs what it had produced as an aborted assistant
    message, then the cancellation goes on.
    """
    text: list[str] = []
    reasoning: list[str] = []
    pieces: dict[int, list[Any]] = {}
    blocks: list[ReasoningBlock] = []
    usage: Usage | None = None
    finish: Finish | None = None
    info = _NO_INFO

    def emit(chunk: Chunk) -> None:
        nonlocal usage, finish, info
        if finish is not None:
            return  # nothing counts after the finish
        # ``type(chunk) is`` narrows like isinstance and is cheaper on this hot path.
        if type(chunk) is TextDelta:
            text.append(chunk.text)
            session.append(ev.AssistantChunk, turn=turn, step=step, kind="text", text=chunk.text)
        elif type(chunk) is ReasoningDelta:
            reasoning.append(chunk.text)
            session.append(ev.AssistantChunk, turn=turn, step=step, kind="reasoning", text=chunk.text)
        elif type(chunk) is ToolCallDelta:
            entry = pieces.setdefault(chunk.index, [None, None, []])
            if chunk.id:
                entry[0] = chunk.id
            if chunk.name:
                entry[1] = chunk.name
            if chunk.arguments:
                entry[2].append(chunk.arguments)
        elif type(chunk) is Usage:
            usage = chunk
        elif type(chunk) is Finish:
            finish = chunk
        elif type(chunk) is ReasoningBlock:
            if type(chunk.provider) is str and type(chunk.data) is dict and is_plain_json(chunk.data):
                blocks.append(chunk)
            else:
                finish = Finish(
                    "error",
                    Failure(
                        "invalid-chunk",
                        f"the model provider {provider.name} reported a reasoning block that is not a provider "
                        f"name and a JSON object of plain JSON values: {chunk!r:.200}",
                    ),
                )
        elif type(chunk) is ResponseInfo:
            if type(chunk.model) is str and type(chunk.id) is str:
                info = chunk
        elif type(chunk) is Retry:
            session.append(
                ev.RequestRetry,
                turn=turn,
                step=step,
                attempt=chunk.attempt,
                delay=chunk.delay,
                failure=chunk.failure,
            )

    try:
        await provider.stream(request, emit)
    except BaseException as exc:
        cancelled, failed = split_cancelled(exc)
        if cancelled is None:
            if not isinstance(failed, Exception):
                raise
            log.exception("agent %s: model provider %s raised", session.id, provider.name)
            finish = Finish("error", Failure("provider-crashed", f"the model provider raised {failed!r}"))
        else:
            if failed is not None:
                log.error("agent %s: model provider %s raised while cancelled: %r", session.id, provider.name, failed)
            _log_partial(session, turn, step, text, reasoning, blocks, usage, info)
            if cancelled is exc:
                raise
            raise cancelled from None
    if finish is None:
        finish = Finish("error", Failure("no-finish", "the model stream ended without a finish"))
    if finish.reason == "error" and finish.failure is None:
        finish = Finish("error", Failure("unknown", "the model reported an error without details"))
    calls: list[ToolCall] = []
    if finish.reason != "error":
        for index in sorted(pieces):
            call_id, name, args = pieces[index]
            if not name:
                continue
            calls.append(_tool_call(id=call_id or f"call-{turn}-{step}-{index}", name=name, arguments="".join(args)))
    session.append(
        ev.AssistantMessage,
        turn=turn,
        step=step,
        text="".join(text),
        reasoning="".join(reasoning),
        tool_calls=tuple(calls),
        usage=usage,
        finish=finish.reason,
        reasoning_blocks=tuple(blocks),
        response_model=info.model,
        response_id=info.id,
    )
    return finish, calls


def _log_partial(
    session: Session,
    turn: int,
    step: int,
    text: list[str],
    reasoning: list[str],
    blocks: list[ReasoningBlock],
    usage: Usage | None,
    info: ResponseInfo,
) -> None:
    """Log what a cancelled stream had produced, as an aborted assistant message.

    Its complete reasoning blocks are logged too; later requests do not send
    them back (see ``assistant/message``).
    """
    if text or reasoning or blocks:
        session.append(
            ev.AssistantMessage,
            turn=turn,
            step=step,
            text="".join(text),
            reasoning="".join(reasoning),
            usage=usage,
            finish="aborted",
            reasoning_blocks=tuple(blocks),
            response_model=info.model,
            response_id=info.id,
        )
