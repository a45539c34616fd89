"""The exception families of trio_harness.

Every failure a caller can act on has its own type, and every message names the
thing that was wrong (a session id, a file and line, a task id) and, where it
helps, what to do about it.
"""

from __future__ import annotations

from typing import Any


class HarnessError(Exception):
    """Base class of every error raised by trio_harness."""


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
