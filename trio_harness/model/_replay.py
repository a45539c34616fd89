"""The replay model: answers from a recorded session log, offline.

Each ``assistant/message`` event of the recording (that did not fail) is one
model response; the replay streams it again as it was streamed the first time
(the recorded ``assistant/chunk`` pieces, then tool calls, usage and finish).
Responses are consumed in order, one per request, so a conversation recorded
against a real provider can be replayed in tests and examples with no network.

With ``strict=True`` each request's newest user message must equal the one
the recording had at that point; a divergence is reported as a failure naming
both texts instead of answering out of context.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

import attrs
import trio

from .._errors import ModelError
from ..session import _events as ev
from ._protocol import (
    Emit,
    Failure,
    Finish,
    FinishReason,
    ModelRequest,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    UserMessage,
)

__all__ = ["ReplayModel"]


def _replayed_finish(recorded: str) -> FinishReason:
    """The finish reason to replay for a recorded one (``stop`` unless it asked for tools or hit a limit)."""
    if recorded == "tool-calls":
        return "tool-calls"
    if recorded == "max-tokens":
        return "max-tokens"
    return "stop"


@attrs.frozen
class _Recorded:
    chunks: tuple[ev.AssistantChunk, ...]
    message: ev.AssistantMessage
    last_user: str | None


def _recordings(events: Iterable[ev.Event]) -> list[_Recorded]:
    out: list[_Recorded] = []
    chunks: list[ev.AssistantChunk] = []
    last_user: str | None = None
    for event in events:
        if isinstance(event, ev.UserMessage):
            last_user = event.text
        elif isinstance(event, ev.StepStart):
            chunks = []
        elif isinstance(event, ev.AssistantChunk):
            chunks.append(event)
        elif isinstance(event, ev.AssistantMessage):
            if event.finish not in ("error", "aborted"):
                out.append(_Recorded(tuple(chunks), event, last_user))
            chunks = []
    return out


@attrs.define(eq=False)
class ReplayModel:
    """A model provider replaying the assistant messages of a recorded session.

    Build it with :meth:`from_events` or :meth:`from_file`.
    """

    _recorded: list[_Recorded] = attrs.field(alias="recorded")
    source: str = "a recorded session"
    strict: bool = False
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)
    _next: int = attrs.field(default=0, init=False)

    @classmethod
    def from_events(
        cls, events: Iterable[ev.Event], *, source: str = "a recorded session", strict: bool = False
    ) -> ReplayModel:
        """Replay the assistant messages found in ``events``."""
        return cls(recorded=_recordings(events), source=source, strict=strict)

    @classmethod
    def from_file(cls, path: str | Path, *, strict: bool = False) -> ReplayModel:
        """Replay a session log file (``session.jsonl`` of the JSONL store).

        Raises:
            ModelError: the file is missing or is not a readable session log.
        """
        from .._errors import SessionError
        from ..session._jsonl import parse_log

        path = Path(path)
        try:
            loaded = parse_log(path.read_bytes(), str(path))
        except FileNotFoundError:
            raise ModelError(f"replay file {str(path)!r} does not exist") from None
        except (OSError, SessionError) as exc:
            raise ModelError(f"replay file {str(path)!r} is not a readable session log: {exc}") from None
        return cls.from_events(loaded.events, source=f"replay of {str(path)!r}", strict=strict)

    @property
    def name(self) -> str:
        """``"replay"``."""
        return "replay"

    @property
    def remaining(self) -> int:
        """How many recorded responses are left."""
        return len(self._recorded) - self._next

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        """Answer with the next recorded response."""
        self.requests.append(request)
        await trio.lowlevel.checkpoint()
        if self._next >= len(self._recorded):
            emit(
                Finish(
                    "error",
                    Failure("replay-exhausted", f"{self.source} has no response left for request {len(self.requests)}"),
                )
            )
            return
        recorded = self._recorded[self._next]
        self._next += 1
        if self.strict and recorded.last_user is not None:
            users = [m.text for m in request.messages if isinstance(m, UserMessage)]
            current = users[-1] if users else None
            if current != recorded.last_user:
                emit(
                    Finish(
                        "error",
                        Failure(
                            "replay-diverged",
                            f"{self.source}: request {len(self.requests)} has user message {current!r} "
                            f"where the recording had {recorded.last_user!r}",
                        ),
                    )
                )
                return
        message = recorded.message
        if recorded.chunks:
            for chunk in recorded.chunks:
                emit(TextDelta(chunk.text) if chunk.kind == "text" else ReasoningDelta(chunk.text))
        else:
            if message.reasoning:
                emit(ReasoningDelta(message.reasoning))
            if message.text:
                emit(TextDelta(message.text))
        for index, call in enumerate(message.tool_calls):
            emit(ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments))
        if message.usage is not None:
            emit(message.usage)
        emit(Finish(_replayed_finish(message.finish)))
