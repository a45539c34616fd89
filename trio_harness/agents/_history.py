"""Deriving the model conversation from the session log alone."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import overload

import attrs

from .._records import plain_constructor
from ..model._context import message_chars, tokens_for_chars
from ..model._protocol import AssistantMessage, Message, ToolMessage, UserMessage
from ..session import _events as ev
from ..session._session import Session

# The event types _consume reads (every other type is skipped).
_CONVERSATION: frozenset[type[ev.Event]] = frozenset(
    {ev.UserMessage, ev.AssistantMessage, ev.ToolResult, ev.TurnStart, ev.TurnEnd, ev.ContextCompacted}
)


class MessagesView(Sequence[Message]):
    """A read-only, fixed-length view of the first ``length`` messages of a list
    that is only ever appended to: O(1) to take, equal to any sequence with the
    same items."""

    __slots__ = ("_items", "_length")

    def __init__(self, items: list[Message], length: int) -> None:
        self._items = items
        self._length = length

    def __len__(self) -> int:
        return self._length

    @overload
    def __getitem__(self, index: int) -> Message: ...

    @overload
    def __getitem__(self, index: slice) -> Sequence[Message]: ...

    def __getitem__(self, index: int | slice) -> Message | Sequence[Message]:
        if isinstance(index, slice):
            return tuple(self._items[: self._length][index])
        if index < 0:
            index += self._length
        if not 0 <= index < self._length:
            raise IndexError("message index out of range")
        return self._items[index]

    def __iter__(self) -> Iterator[Message]:
        items = self._items
        for index in range(self._length):
            yield items[index]

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, Sequence) or isinstance(other, str):
            return NotImplemented
        return len(other) == self._length and all(a == b for a, b in zip(self, other, strict=True))

    def __hash__(self) -> int:
        return hash(tuple(self))

    def __repr__(self) -> str:
        return f"MessagesView({list(self)!r})"


@attrs.frozen
class TurnMark:
    """Where a turn starts in the derived conversation: a possible compaction boundary.

    Attributes:
        seq: the seq of the turn's ``turn/start``.
        index: how many messages come before it.
        chars: the characters of those messages.
    """

    seq: int
    index: int
    chars: int


# The derived messages are built from logged values: their plain constructors
# (the same objects, without attrs' per-field object.__setattr__) do it.
_user_message = plain_constructor(UserMessage) or UserMessage
_assistant_message = plain_constructor(AssistantMessage) or AssistantMessage
_tool_message = plain_constructor(ToolMessage) or ToolMessage
_turn_mark = plain_constructor(TurnMark) or TurnMark


@attrs.define(eq=False)
class History:
    """The conversation of a session, maintained incrementally.

    :meth:`messages` consumes only the events appended since the last call and
    returns an O(1) view, so building each request costs only the new events.
    The result is a pure function of the log: a resumed agent derives exactly
    what a never-restarted one would.

    A ``context/compacted`` event replaces everything before its ``boundary``
    by its ``summary`` (:attr:`summary`): the messages are rebuilt from the
    events between the boundary and the compaction (O(kept part), once), and
    later events are added one at a time.  Beside the messages, the history keeps
    what the size estimate needs (docs/long-sessions.rst): their characters,
    the last usage a provider reported with the characters at that point, and
    where each kept turn starts.
    """

    session: Session
    _messages: list[Message] = attrs.field(factory=list, init=False)
    _position: int = attrs.field(default=0, init=False)
    _chars: int = attrs.field(default=0, init=False)
    _summary: str | None = attrs.field(default=None, init=False)
    _boundary: int = attrs.field(default=0, init=False)
    # (input + output tokens the provider last reported, self._chars right after that message)
    _anchor: tuple[int, int] | None = attrs.field(default=None, init=False)
    _marks: list[TurnMark] = attrs.field(factory=list, init=False)
    # The last turn ended paused (its continuation's start is no compaction boundary).
    _paused: bool = attrs.field(default=False, init=False)

    def messages(self) -> Sequence[Message]:
        """The conversation so far (a view that does not change later)."""
        events = self.session.events
        end = len(events)
        if self._position != end:
            self._consume(events, self._position, end, replaying=False)
            self._position = end
        return MessagesView(self._messages, len(self._messages))

    def _consume(self, events: Sequence[ev.Event], start: int, end: int, *, replaying: bool) -> None:
        """Add the messages of ``events[start:end]``; ``replaying`` skips compactions (superseded)."""
        out = self._messages
        chars = self._chars
        for index in range(start, end):
            event = events[index]
            if type(event) not in _CONVERSATION:
                continue  # most events (steps, chunks, headers, calls) add nothing: one set lookup
            # ``type(event) is`` narrows like isinstance, and is cheaper.
            if type(event) is ev.UserMessage:
                if event.images:
                    message = _user_message(text=event.text, images=tuple(part.image() for part in event.images))
                    out.append(message)
                    chars += message_chars(message)
                else:
                    out.append(_user_message(text=event.text))
                    chars += len(event.text)
            elif type(event) is ev.AssistantMessage:
                # A failed or cancelled step's reasoning blocks are not sent back (docs/models.rst).
                blocks = event.reasoning_blocks if event.finish not in ("error", "aborted") else ()
                if event.text or event.tool_calls or event.reasoning or blocks:
                    message = _assistant_message(
                        text=event.text, tool_calls=event.tool_calls, reasoning=event.reasoning, reasoning_blocks=blocks
                    )
                    out.append(message)
                    chars += message_chars(message)
                usage = event.usage
                # A replayed (kept) message's usage measured the request before the compaction.
                if usage is not None and not replaying and event.finish not in ("error", "aborted"):
                    self._anchor = (usage.input_tokens + usage.output_tokens, chars)
            elif type(event) is ev.ToolResult:
                out.append(
                    _tool_message(
                        call_id=event.call_id, name=event.name, content=event.content, is_error=event.is_error
                    )
                )
                chars += len(event.content) + len(event.name) + len(event.call_id)
            elif type(event) is ev.TurnStart:
                # A paused turn's continuation is no boundary: it answers the paused turn's calls.
                if not self._paused:
                    self._marks.append(_turn_mark(seq=event.seq, index=len(out), chars=chars))
            elif type(event) is ev.TurnEnd:
                self._paused = event.reason == "paused"
            elif type(event) is ev.ContextCompacted and not replaying:
                self._chars = chars
                self._compact(event)
                out, chars = self._messages, self._chars
        self._chars = chars

    def _compact(self, event: ev.ContextCompacted) -> None:
        """Restart the conversation at ``event.boundary``, under ``event.summary``."""
        self._messages = []
        self._chars = 0
        self._anchor = None
        self._marks = []
        self._summary = event.summary
        self._boundary = event.boundary
        # Earlier compactions inside the kept part are superseded by this one's summary.
        self._consume(self.session.events, event.boundary, event.seq, replaying=True)

    # ------------------------------------------------------------ compaction state

    @property
    def summary(self) -> str | None:
        """The summary standing for the events before :attr:`boundary` (None before any compaction)."""
        if self._position != len(self.session.events):
            self.messages()
        return self._summary

    @property
    def boundary(self) -> int:
        """The seq of the first event the conversation holds verbatim (0 before any compaction)."""
        self.messages()
        return self._boundary

    @property
    def chars(self) -> int:
        """The characters of the conversation's messages."""
        self.messages()
        return self._chars

    @property
    def marks(self) -> Sequence[TurnMark]:
        """Where each turn of the verbatim part starts (the possible boundaries of a compaction)."""
        self.messages()
        return tuple(self._marks)

    @property
    def last_mark(self) -> TurnMark | None:
        """Where the latest turn of the verbatim part starts (O(1), unlike :attr:`marks`)."""
        self.messages()
        return self._marks[-1] if self._marks else None

    def estimate(self, fixed_chars: Callable[[], int]) -> int:
        """Estimate the tokens of the next request, in O(events appended since the last call).

        The last usage a provider reported (prompt plus answer) anchors the
        estimate; only the characters added since are estimated.  Without an
        anchor (no usage yet, or just after a compaction) the whole request is
        estimated once: ``fixed_chars()`` (system prompt, summary, tools) plus
        the messages.
        """
        self.messages()
        if self._anchor is not None:
            tokens, chars = self._anchor
            return tokens + tokens_for_chars(self._chars - chars)
        return tokens_for_chars(fixed_chars() + self._chars)
