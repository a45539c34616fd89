"""Deriving the model conversation from the session log alone."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import overload

import attrs

from ..model._protocol import AssistantMessage, Message, ToolMessage, UserMessage
from ..session import _events as ev
from ..session._session import Session

__all__ = ["History", "MessagesView"]


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


@attrs.define(eq=False)
class History:
    """The conversation of a session, maintained incrementally.

    :meth:`messages` consumes only the events appended since the last call and
    returns an O(1) view, so building each request costs only the new events.
    The result is a pure function of the log: a resumed agent derives exactly
    what a never-restarted one would.
    """

    session: Session
    _messages: list[Message] = attrs.field(factory=list, init=False)
    _position: int = attrs.field(default=0, init=False)

    def messages(self) -> Sequence[Message]:
        """The conversation so far (a view that does not change later)."""
        new = self.session.events[self._position :]
        out = self._messages
        for event in new:
            # ``type(event) is`` narrows like isinstance, and is cheaper.
            if type(event) is ev.UserMessage:
                out.append(UserMessage(text=event.text))
            elif type(event) is ev.AssistantMessage:
                if event.text or event.tool_calls or event.reasoning:
                    out.append(
                        AssistantMessage(text=event.text, tool_calls=event.tool_calls, reasoning=event.reasoning)
                    )
            elif type(event) is ev.ToolResult:
                out.append(
                    ToolMessage(call_id=event.call_id, name=event.name, content=event.content, is_error=event.is_error)
                )
        self._position += len(new)
        return MessagesView(out, len(out))
