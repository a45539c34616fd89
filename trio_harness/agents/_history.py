"""Deriving the model conversation from the session log alone."""

from __future__ import annotations

import attrs

from ..model._protocol import AssistantMessage, Message, ToolMessage, UserMessage
from ..session import _events as ev
from ..session._session import Session

__all__ = ["History"]


@attrs.define(eq=False)
class History:
    """The conversation of a session, maintained incrementally.

    :meth:`messages` consumes the events appended since the last call, so
    building each request costs only the new events.  The result is a pure
    function of the log: a resumed agent derives exactly what a never-restarted
    one would.
    """

    session: Session
    _messages: list[Message] = attrs.field(factory=list, init=False)
    _position: int = attrs.field(default=0, init=False)

    def messages(self) -> tuple[Message, ...]:
        """The conversation so far."""
        events = self.session.events
        out = self._messages
        for index in range(self._position, len(events)):
            event = events[index]
            if isinstance(event, ev.UserMessage):
                out.append(UserMessage(text=event.text))
            elif isinstance(event, ev.AssistantMessage):
                if event.text or event.tool_calls or event.reasoning:
                    out.append(
                        AssistantMessage(text=event.text, tool_calls=event.tool_calls, reasoning=event.reasoning)
                    )
            elif isinstance(event, ev.ToolResult):
                out.append(
                    ToolMessage(call_id=event.call_id, name=event.name, content=event.content, is_error=event.is_error)
                )
        self._position = len(events)
        return tuple(out)
