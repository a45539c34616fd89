"""The ACP server's live streaming: turns nobody prompted, calls that start running, titles, usage.

:class:`SessionStreaming` is a part of :class:`~trio_harness.acp.AcpServer`
(its base class), kept here so the server module stays the connection's
mechanics.  A prompt's own turn is streamed by the prompt's watcher
(``_start_prompt``); everything a session does besides is sent from here
(docs/acp.rst, "Task notices", "What the harness knows").
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..session import _events as ev
from ._records import _SessionRecord, context_estimate, context_window
from ._updates import (
    compaction_failed_update,
    iso_time,
    live_update,
    message_updates,
    title_of,
    tool_started_update,
    turn_end_update,
    usage_update,
)

if TYPE_CHECKING:
    from .._bus import Notice
    from .._harness import Harness
    from ..session._events import Event


class SessionStreaming:
    """The updates of :class:`~trio_harness.acp.AcpServer` that no prompt's watcher sends."""

    if TYPE_CHECKING:  # provided by AcpServer
        harness: Harness
        _records: dict[str, _SessionRecord]
        _update: Callable[[str, dict[str, Any]], None]
        _plan_after: Callable[[_SessionRecord, Event], None]

    def _watch_unsolicited(self, record: _SessionRecord, event: Event) -> None:
        """Stream turns nobody prompted (e.g. a completion notice woke the agent).

        A turn belongs to the in-flight prompt when its first step claimed the
        prompt's message; that prompt's watcher streams it.  Any other turn is
        streamed from here, starting with the messages its first step claimed
        (a paused turn's continuation claims none: from its first call).
        """
        if isinstance(event, ev.UserMessage) and record.title is None and event.origin == "user":
            self._send_title(record, event.text)
        if isinstance(event, ev.TurnStart):
            record.first_step_ids.clear()
            record.first_step_messages.clear()
            record.unsolicited = False
            record.in_first_step = True
        elif isinstance(event, ev.UserMessage) and record.in_first_step:
            record.first_step_ids.append(event.message_id)
            record.first_step_messages.append(event)
        elif isinstance(event, ev.RequestHeader | ev.StepEnd | ev.ToolCallRequested) and record.in_first_step:
            record.in_first_step = False
            prompt = record.prompt
            record.unsolicited = prompt is None or prompt.message_id not in record.first_step_ids
            if record.unsolicited:
                # A user's message as user text, a task notice as the agent's (docs/acp.rst).
                for message in record.first_step_messages:
                    for shown in message_updates(message, record.id):
                        self._update(record.id, shown)
                cwd = record.agent.session.header.cwd
                if isinstance(event, ev.ToolCallRequested) and (update := live_update(event, record.id, cwd)):
                    self._update(record.id, update)  # a paused turn's continuation: from its first call
        elif isinstance(event, ev.CompactionFailed) and event.turn is None:
            self._update(record.id, compaction_failed_update(event, record.id))
        elif isinstance(event, ev.ContextCompacted) and event.turn is None:
            # A compaction between turns shrank the context: say so (docs/acp.rst, "Usage").
            self._after_turn(record, None, activity=False)
        elif isinstance(event, ev.TurnEnd):
            if record.unsolicited:
                # No prompt answers this turn: say here how it ended when it did not
                # finish normally, as a replay does (docs/acp.rst, "Replaying how a turn ended").
                note = turn_end_update(event, record.id)
                if note is not None:
                    self._update(record.id, note)
            record.unsolicited = False
            record.in_first_step = False
            self._after_turn(record, event)
        elif record.unsolicited:
            update = live_update(event, record.id, record.agent.session.header.cwd)
            if update is not None:
                self._update(record.id, update)
                self._plan_after(record, event)

    def _tool_started(self, notice: Notice) -> None:
        """A call of a turn this connection streams runs now: ``in_progress``."""
        agent_id = getattr(notice.subject, "id", None)
        record = self._records.get(agent_id) if isinstance(agent_id, str) else None
        if record is None or record.agent is not notice.subject:
            return  # not a session of this connection (another client's, or a subagent)
        turn = notice.data["turn"]
        prompt = record.prompt
        if record.unsolicited or (prompt is not None and prompt.turn == turn):
            self._update(record.id, tool_started_update(turn, notice.data["call_id"]))

    def _send_title(self, record: _SessionRecord, text: str) -> None:
        """``session_info_update`` with the title the first prompt gives (docs/acp.rst, "Session info")."""
        title = title_of(text)
        if title is None:
            return
        record.title = title
        self._update(record.id, {"sessionUpdate": "session_info_update", "title": title})

    def _after_turn(self, record: _SessionRecord, end: ev.TurnEnd | None, *, activity: bool = True) -> None:
        """What the harness knows after a turn: ``usage_update`` (when known) and ``updatedAt`` (with ``activity``)."""
        agent = record.agent
        events = agent.session.events
        update = usage_update(
            events,
            context_window(agent, self.harness),
            end.usage if end is not None else None,
            agent.usage,
            agent.cost,
            lambda: context_estimate(agent),
        )
        if update is not None:
            self._update(record.id, update)
        if events and activity:
            self._update(record.id, {"sessionUpdate": "session_info_update", "updatedAt": iso_time(events[-1].ts)})
