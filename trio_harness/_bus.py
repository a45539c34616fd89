"""Live notifications: a synchronous event bus with contained listener errors.

The names the harness emits, with their subjects and data, are listed once, in
:data:`NOTICES` (rendered as a table in the API reference).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Final, Protocol

import attrs

__all__ = ["NOTICES", "EventBus", "Notice", "NoticeSubject"]

log = logging.getLogger("trio_harness.bus")

NOTICES: Final[Mapping[str, str]] = {
    "session/created": "a Session: the session is live (created or resumed), announced before ``agent/created``",
    "session/disposed": "a Session: the session left the registry, its log closed",
    "session/restored": (
        "a Session: ``events`` (how many) that the PostgreSQL server lost were stored again by a retake"
    ),
    "agent/created": "an Agent: the agent is registered and usable",
    "agent/session-start": 'an Agent: ``source`` (``"startup"`` or ``"resume"``), after ``agent/created``',
    "agent/disposed": "an Agent: the agent was disposed (its scope is closed)",
    "agent/status": 'an Agent: ``status`` (``"running"``, ``"idle"``), only when it changes',
    "agent/cancel-requested": "an Agent: ``cause`` (who cancelled), before the turn is cancelled",
    "agent/inbox/inserted": "an Agent: ``message`` (an InboxMessage), ``turn`` (None: not claimed yet)",
    "agent/inbox/claimed": "an Agent: ``message``, ``turn`` (the turn that took it)",
    "agent/inbox/discarded": "an Agent: ``message``, ``turn``",
    "agent/compaction-failed": "an Agent: ``error`` (the exception); a compaction between turns failed",
    "agent/tool/started": "an Agent: ``turn``, ``step``, ``call_id``, ``tool``; right before a tool's handler runs",
    "task/done": "a TaskSnapshot: a background task settled",
    "mcp/restarted": (
        "an McpConnection: ``reason`` (why the server had stopped), ``restarts`` (how many so far), "
        '``transport`` (``"stdio"``, ``"http"``); the server was started again'
    ),
    "mcp/restart-failed": (
        "an McpConnection: ``reason``, ``error`` (why the attempt failed), ``retry_in`` (seconds until "
        "the next attempt), ``transport``"
    ),
    "mcp/tool-skipped": (
        "an McpConnection: ``tool`` (its name, or ``#N``), ``reason``; a tool declaration was left out "
        "(once per declaration, not again on every listing)"
    ),
}
"""Every notice the harness emits: its name, then its subject and ``data`` (and when it is sent)."""


class NoticeSubject(Protocol):
    """What a notice is about: anything with an ``id``.

    The harness's subjects are a :class:`~trio_harness.Session`
    (``session/*``, the id is the session id), an
    :class:`~trio_harness.Agent` (``agent/*``, its id is its session's), a
    :class:`~trio_harness.tasks.TaskSnapshot` (``task/done``, the task id) and
    an :class:`~trio_harness.tools.McpConnection` (``mcp/*``, the server's name).
    The bus sits below all of them, so it names only what they share; a
    listener that needs more narrows the subject (``isinstance(notice.subject,
    TaskSnapshot)``) or knows it from the notice's name.
    """

    @property
    def id(self) -> str:
        """The subject's id."""
        ...


@attrs.frozen
class Notice:
    """One live notification.

    Attributes:
        name: the notification name, e.g. ``"agent/created"``.
        subject: the object concerned (a Session, an Agent, a task snapshot).
        data: extra facts (e.g. ``{"source": "startup"}``); their keys and
            types depend on the notification.
    """

    name: str
    subject: NoticeSubject
    data: Mapping[str, Any] = attrs.field(factory=dict)


Listener = Callable[[Notice], None]


@attrs.define(eq=False)
class EventBus:
    """Synchronous publish / subscribe; a listener that raises is logged and skipped."""

    _listeners: dict[str, list[Listener]] = attrs.field(factory=dict, init=False)

    def on(self, name: str, listener: Listener) -> Callable[[], None]:
        """Call ``listener`` for every notice named ``name`` (``"*"`` for all); returns a remover."""
        self._listeners.setdefault(name, []).append(listener)

        def remove() -> None:
            listeners = self._listeners.get(name)
            if listeners and listener in listeners:
                listeners.remove(listener)

        return remove

    def emit(self, name: str, subject: NoticeSubject, **data: Any) -> None:
        """Deliver a notice to its listeners, in registration order."""
        specific = self._listeners.get(name)
        wildcard = self._listeners.get("*")
        if not specific and not wildcard:
            return
        notice = Notice(name, subject, data)
        for listener in (*(specific or ()), *(wildcard or ())):
            try:
                listener(notice)
            except Exception:
                log.exception("listener %r for %s failed", listener, name)
