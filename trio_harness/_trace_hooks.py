"""The one seam tracing needs inside the tool dispatch: a tool handler runs in its call's span.

Everything else the telemetry (``_telemetry.py``) learns from the session logs
and the bus.  What an observer cannot do is make a span *current* for code
that runs later in another frame: a tool handler (a subagent's ``followup``, an
HTTP client the application instruments) must run with the ``execute_tool``
span as its OpenTelemetry context, so that what it starts is that span's child.
The dispatch wraps each handler in :func:`tool_scope`; the telemetry of a
harness registers, for the harness's bus, what that scope does.  Without
telemetry the scope is a shared no-op (one dict lookup per call).
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from contextlib import AbstractContextManager

ToolScope = Callable[[str, str], AbstractContextManager[object]]
"""Given a session id and a call id, the context manager the call's handler runs in."""

_NULL: AbstractContextManager[object] = contextlib.nullcontext()
# Per bus (one per harness): the telemetry's scope factory.
_scopes: weakref.WeakKeyDictionary[object, ToolScope] = weakref.WeakKeyDictionary()
# Registrations not yet removed (never low; high only if a bus died unremoved): with none, a tool call
# pays one global read, not len() of the WeakKeyDictionary, a Python-level call (bench/bench_agents.py).
_registered = 0


def register_tool_scope(bus: object, scope: ToolScope) -> Callable[[], None]:
    """Run the tool handlers of the agents on ``bus`` in ``scope(session_id, call_id)``; returns a remover."""
    global _registered
    _scopes[bus] = scope
    _registered += 1
    removed = False

    def remove() -> None:
        global _registered
        nonlocal removed
        if not removed:
            removed = True
            _registered -= 1
        if _scopes.get(bus) is scope:
            del _scopes[bus]

    return remove


def tool_scope(bus: object, session_id: str, call_id: str) -> AbstractContextManager[object]:
    """The context a tool handler runs in: its span's, when telemetry is on for ``bus``."""
    if not _registered:
        return _NULL
    scope = _scopes.get(bus)
    return _NULL if scope is None else scope(session_id, call_id)
