"""The replay model: answers from a recorded session log, offline.

Each ``assistant/message`` event of the recording (that did not fail) is one
model response; the replay streams it again as it was streamed the first time
(the recorded ``assistant/chunk`` pieces, then its reasoning blocks in their
order, tool calls, usage and finish).
Responses are consumed in order, one per request, so a conversation recorded
against a real provider can be replayed in tests and examples with no network.

Context compactions are replayed too: each ``context/compacted`` event of the
recording answers the summary request(s) of one compaction with its summary,
in order among the steps, so a replayed agent compacts at the same points and
rebuilds the same requests.  A ``context/compaction-failed`` event fails its
compaction again at the first summary request; one a budget stopped or a cancel ended part-way
(``budget-*``, ``cancelled``) answers the requests it made, with their usage on the last, so
the agent's own budget check stops it where the recording stopped.

With ``strict=True`` each request must match the recording at that point: a
step's newest user message and its model settings (its ``request/header``),
and the kind of request (a step or a compaction summary); a divergence is
reported as a failure naming both sides instead of answering out of context.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Literal

import attrs
import trio

from .._errors import ModelError
from ..session import _events as ev
from ..session._events import ImagePart
from ._protocol import (
    FINAL_ANSWER,
    Emit,
    Failure,
    Finish,
    FinishReason,
    ModelRequest,
    ModelSettings,
    ReasoningDelta,
    TextDelta,
    ToolCallDelta,
    Usage,
    UserMessage,
)


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
    message: ev.AssistantMessage | None
    last_user: str | None
    settings: ModelSettings | None = None
    last_images: tuple[ImagePart, ...] = ()
    compaction: ev.ContextCompacted | ev.CompactionFailed | None = None

    @property
    def kind(self) -> Literal["turn", "compaction"]:
        return "compaction" if self.compaction is not None else "turn"


def _recordings(events: Iterable[ev.Event]) -> list[_Recorded]:
    out: list[_Recorded] = []
    chunks: list[ev.AssistantChunk] = []
    last_user: str | None = None
    last_images: tuple[ImagePart, ...] = ()
    settings: ModelSettings | None = None
    for event in events:
        if isinstance(event, ev.UserMessage):
            last_user = event.text
            last_images = event.images
        elif isinstance(event, ev.StepStart):
            chunks = []
        elif isinstance(event, ev.RequestHeader):
            settings = event.settings
            chunks = []
        elif isinstance(event, ev.AssistantChunk):
            chunks.append(event)
        elif isinstance(event, ev.AssistantMessage):
            if event.finish not in ("error", "aborted"):
                out.append(_Recorded(tuple(chunks), event, last_user, settings, last_images=last_images))
            chunks = []
        elif isinstance(event, ev.ContextCompacted | ev.CompactionFailed):
            out.append(_Recorded((), None, None, compaction=event))
    return out


@attrs.define(eq=False)
class ReplayModel:
    """A model provider replaying the assistant messages of a recorded session.

    Build it with :meth:`from_events` or :meth:`from_file`.
    """

    _recorded: list[_Recorded] = attrs.field(alias="recorded")
    source: str = "a recorded session"
    strict: bool = False
    # How the recording asked for typed answers: through the final-answer tool (False) or the
    # JSON response format (True), so ``run(output=T)`` in auto mode asks the same way again.
    json_schema_output: bool = attrs.field(default=True, kw_only=True)
    # It answers requests with images as any other (strict mode compares them with the recording's).
    supports_images: bool = attrs.field(default=True, kw_only=True)
    requests: list[ModelRequest] = attrs.field(factory=list, init=False)
    _next: int = attrs.field(default=0, init=False)
    # How many summary requests the current recording (a compaction) answered: a compaction
    # may make several (its partials, then its summary); the next step request moves past it.
    _answered: int = attrs.field(default=0, init=False)

    @classmethod
    def from_events(
        cls, events: Iterable[ev.Event], *, source: str = "a recorded session", strict: bool = False
    ) -> ReplayModel:
        """Replay the assistant messages found in ``events``."""
        events = list(events)
        by_tool = any(isinstance(e, ev.RequestHeader) and FINAL_ANSWER in e.tools for e in events)
        return cls(recorded=_recordings(events), source=source, strict=strict, json_schema_output=not by_tool)

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
        kind = request.purpose
        recorded = self._recorded
        if self._answered and kind == "turn":
            self._next += 1  # the compaction is over
            self._answered = 0
        if self._next < len(recorded) and recorded[self._next].kind != kind and not self.strict:
            # Lenient: answer from the next recording of this kind.
            found = next((i for i in range(self._next, len(recorded)) if recorded[i].kind == kind), None)
            if found is not None:
                self._next, self._answered = found, 0
        if self._next >= len(recorded):
            emit(
                Finish(
                    "error",
                    Failure("replay-exhausted", f"{self.source} has no response left for request {len(self.requests)}"),
                )
            )
            return
        current = recorded[self._next]
        if current.kind != kind:
            self._diverged(emit, f"is a {_KIND[kind]} where the recording had a {_KIND[current.kind]}")
            return
        if isinstance(current.compaction, ev.CompactionFailed):
            # A failed compaction fails again, at its first summary request.
            failed = current.compaction
            self._answered += 1
            totals = failed.usage
            stopped = failed.failure.code.startswith("budget-") or failed.failure.code == "cancelled"
            if stopped and totals is not None and self._answered <= totals.requests:
                # Stopped by a budget (or cancelled) after its requests were answered: answer them again, with the
                # usage on the last, so the agent's own budget check stops it at the same point (a cancelled one
                # fails at its next request).
                emit(TextDelta("(a summary the recording did not keep: a budget stopped the compaction)"))
                if self._answered == totals.requests:
                    emit(
                        Usage(
                            totals.input_tokens, totals.output_tokens, totals.cache_hit_tokens, totals.reasoning_tokens
                        )
                    )
                emit(Finish("stop"))
                return
            if self._answered == 1 and totals is not None:
                emit(Usage(totals.input_tokens, totals.output_tokens, totals.cache_hit_tokens, totals.reasoning_tokens))
            emit(Finish("error", failed.failure))
            return
        if current.compaction is not None:
            compaction = current.compaction
            first = not self._answered
            answers = (*compaction.partials, compaction.summary)
            emit(TextDelta(answers[min(self._answered, len(answers) - 1)]))
            self._answered += 1
            totals = compaction.usage
            if first and totals is not None:
                emit(Usage(totals.input_tokens, totals.output_tokens, totals.cache_hit_tokens, totals.reasoning_tokens))
            emit(Finish("stop"))
            return
        message = current.message
        assert message is not None
        self._next += 1
        if self.strict and current.last_user is not None:
            users = [m for m in request.messages if isinstance(m, UserMessage)]
            latest = users[-1].text if users else None
            if latest != current.last_user:
                self._diverged(emit, f"has user message {latest!r} where the recording had {current.last_user!r}")
                return
            images = tuple(ImagePart.of(image) for image in users[-1].images) if users else ()
            if images != current.last_images:
                self._diverged(
                    emit,
                    f"has {len(images)} image(s) in its newest user message where the recording had "
                    f"{len(current.last_images)} (or different ones)",
                )
                return
        if self.strict:
            sent = None if request.settings.empty else request.settings
            if sent != current.settings:
                self._diverged(emit, f"has model settings {sent!r} where the recording had {current.settings!r}")
                return
        if current.chunks:
            for chunk in current.chunks:
                emit(TextDelta(chunk.text) if chunk.kind == "text" else ReasoningDelta(chunk.text))
        else:
            if message.reasoning:
                emit(ReasoningDelta(message.reasoning))
            if message.text:
                emit(TextDelta(message.text))
        for block in message.reasoning_blocks:
            emit(block)
        for index, call in enumerate(message.tool_calls):
            emit(ToolCallDelta(index=index, id=call.id, name=call.name, arguments=call.arguments))
        if message.usage is not None:
            emit(message.usage)
        emit(Finish(_replayed_finish(message.finish)))

    def _diverged(self, emit: Emit, what: str) -> None:
        emit(
            Finish(
                "error",
                Failure("replay-diverged", f"{self.source}: request {len(self.requests)} {what}"),
            )
        )


_KIND = {"turn": "step request", "compaction": "compaction (summary) request"}
