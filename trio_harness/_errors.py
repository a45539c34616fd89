"""The exception families of trio_harness.

Every failure a caller can act on has its own type, and every message names the
thing that was wrong (a session id, a file and line, a task id) and, where it
helps, what to do about it.

Each public exception carries the module it is imported from
(``trio_harness.RunError``, not ``trio_harness._errors.RunError``), so that is
what tracebacks, reprs and pytest show: every public package ends with
:func:`publish_exceptions`, as trio's ``fixup_module_metadata`` does.
"""

from __future__ import annotations

import copyreg
from collections.abc import Mapping
from typing import Any


def publish_exceptions(module_name: str, namespace: Mapping[str, object]) -> None:
    """Give the exceptions a public package exports the package as their module.

    Only exceptions defined in a private module (a dotted part starting with
    ``_``) and exported under their own name are renamed, so pickling finds
    them in the public package.  An exception exported by two packages keeps
    the first that claims it: a subpackage (imported, and so run, before
    ``trio_harness`` finishes), where its reference entry is.  Other classes
    and functions keep the module that defines them: ``typing.get_type_hints``
    resolves a class's annotations in the namespace of its ``__module__``.
    """
    for name, obj in namespace.items():
        if name.startswith("_") or not isinstance(obj, type) or not issubclass(obj, BaseException):
            continue
        module = obj.__module__
        private = any(part.startswith("_") for part in module.split("."))
        if private and module.startswith("trio_harness.") and obj.__qualname__ == name:
            obj.__module__ = module_name


class HarnessError(Exception):
    """Base class of every error raised by trio_harness."""

    def __reduce__(self) -> tuple[Any, ...]:
        # Rebuilt without calling __init__ (whose keyword-only arguments are not in ``args``):
        # the arguments and the attributes come back as they were, so pickle and copy work.
        return copyreg.__newobj__, (type(self), *self.args), self.__dict__  # type: ignore[attr-defined]


class ScopeClosedError(HarnessError):
    """Work was offered to a scope that is closing or closed."""


class PluginError(HarnessError):
    """A plugin could not be loaded, unloaded or reloaded."""


class SessionError(HarnessError):
    """Base class of session and persistence errors."""


class InvalidSessionIdError(SessionError, ValueError):
    """A session id is empty or otherwise unusable."""


class SessionExistsError(SessionError):
    """A session id is already taken (live, or stored when creating)."""


class SessionLockedError(SessionExistsError):
    """The session's log is locked by another writer: it is live in another process.

    Attributes:
        path: the log file whose lock is held.
    """

    def __init__(self, message: str, *, path: str) -> None:
        super().__init__(message)
        self.path = path


class SessionStoreError(SessionError):
    """The session store cannot be used or written.

    Raised for a store root that is not a writable directory, a symbolic link
    or special file found where a session directory or log belongs, a log above
    the size limit, and a failed write or flush (the OS error is the
    ``__cause__``).  Events a failed flush did not store stay in the in-memory
    session, so a later flush (the next turn end, ``Agent.when_idle()``)
    retries them.

    Attributes:
        path: the file or directory the problem is about (None when the store
            has no path).
        session_id: the session whose events were not stored, when one is concerned.
    """

    def __init__(self, message: str, *, path: str | None = None, session_id: str | None = None) -> None:
        super().__init__(message)
        self.path = path
        self.session_id = session_id


class SessionNotFoundError(SessionError, LookupError):
    """No live or stored session has this id."""


class SessionCorruptError(SessionError):
    """A stored session log is damaged before its last committed turn boundary.

    Attributes:
        path: the file that is damaged.
        line: the 1-based line number of the first bad line.
    """

    def __init__(self, message: str, *, path: str, line: int) -> None:
        super().__init__(message)
        self.path = path
        self.line = line


class EventDecodeError(SessionError, ValueError):
    """An event record could not be decoded (unknown type, extra or missing keys)."""


class UnsupportedFormatError(SessionError):
    """A stored session was written by a format version this library cannot read."""


class ForkBoundaryError(SessionError, ValueError):
    """A fork boundary is out of range or falls inside an open turn."""


class CallNotFoundError(SessionError, LookupError):
    """A decision was posted for a tool call the session's log does not have (``harness.sessions.post``)."""


class CallNotPendingError(SessionError):
    """A decision was posted for a tool call that is not waiting for approval (decided, or never asked)."""


class InboxError(HarnessError):
    """An inbox operation or a persisted inbox splice is invalid."""


class AgentError(HarnessError):
    """Base class of agent lifecycle errors."""


class AgentExistsError(AgentError):
    """An agent or session with this id is already live."""


class AgentNotFoundError(AgentError, LookupError):
    """No live agent has this id."""


class FactoryError(AgentError):
    """The agent factory slot is empty, or a second factory tried to register."""


class AgentDisposedError(AgentError):
    """The agent has been disposed and accepts no more input."""


class RunError(AgentError):
    """A turn started by ``agent.run()`` did not complete.

    Attributes:
        end: the ``turn/end`` event of the turn (its ``reason``, ``cause``,
            ``failure`` and ``usage``), or None when the prompt never ran.
    """

    def __init__(self, message: str, *, end: Any = None) -> None:
        super().__init__(message)
        self.end = end


class OutputValidationError(RunError):
    """The model's final answer did not match the requested output type, after every retry."""


class CompactionError(AgentError):
    """Context compaction could not run (nothing to compact, or the summary request failed)."""


class ToolError(HarnessError):
    """A tool definition is invalid or a tool name is already registered."""


class ModelError(HarnessError):
    """A model spec is invalid or a provider cannot be configured."""


class TaskError(HarnessError):
    """Base class of background task errors."""


class TaskNotFoundError(TaskError, LookupError):
    """The task id is unknown, or not visible to the caller (same message by design)."""


class TaskStartError(TaskError):
    """A task could not be started (no controller attached, cap reached, bad spec)."""


class BashError(HarnessError):
    """A bash command or process request is invalid, or a process id is unknown."""


class McpError(HarnessError):
    """Base class of the errors about MCP servers used as tool sources."""


class McpConfigError(McpError, ValueError):
    """An MCP server configuration (a file, a record, ACP params) is invalid.

    Attributes:
        server: the server whose entry is wrong (None for the file as a whole).
        field: the offending field of that entry (``"command"``,
            ``"headers.Authorization"``), or None.
        source: where the configuration came from (a file path), or None.
    """

    def __init__(
        self, message: str, *, server: str | None = None, field: str | None = None, source: str | None = None
    ) -> None:
        super().__init__(message)
        self.server = server
        self.field = field
        self.source = source


class McpStartError(McpError):
    """One or more MCP servers could not be started or did not complete the handshake.

    The message names each server and why (the command was not found, the
    process exited and what it wrote to stderr, the handshake timed out, an
    HTTP status).

    Attributes:
        servers: the names of the servers that failed, in configuration order.
    """

    def __init__(self, message: str, *, servers: tuple[str, ...]) -> None:
        super().__init__(message)
        self.servers = servers
