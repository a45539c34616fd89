"""Live notifications: a synchronous event bus with contained listener errors.

Names used by the harness: ``session/created``, ``session/disposed``,
``session/restored`` (PostgreSQL: ``events`` lost by the server were stored again),
``agent/created``, ``agent/session-start``, ``agent/disposed``,
``agent/status``, ``agent/cancel-requested``, ``agent/inbox/inserted``,
``agent/inbox/claimed``, ``agent/inbox/discarded``, ``task/done``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

import attrs

log = logging.getLogger("trio_harness.bus")


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
