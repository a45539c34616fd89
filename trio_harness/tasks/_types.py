"""The public data of the task runtime: statuses, owners, specs, hooks, outcomes and snapshots.

The service that uses them is in :mod:`trio_harness.tasks._service`.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Literal, Protocol, TypeAlias

import attrs

if TYPE_CHECKING:
    from .._scope import Scope

TaskStatus: TypeAlias = Literal["running", "stopping", "completed", "killed", "failed", "lost"]
"""The status of a task: live (running, stopping) or terminal."""

TerminalStatus: TypeAlias = Literal["completed", "killed", "failed", "lost"]
"""The status of a settled task.

``lost`` is never a producer's outcome: the service gives it to a task of a
resumed session that was started by an earlier run of the agent (another
process, or before the agent was disposed) and never reported
(:meth:`~trio_harness.tasks.TaskService.add_lost`).
"""

TERMINAL_STATUSES: frozenset[str] = frozenset({"completed", "killed", "failed", "lost"})
"""The terminal statuses, for membership tests."""

_OUTCOME_STATUSES: frozenset[str] = frozenset({"completed", "killed", "failed"})
"""The statuses a producer's ``done`` may report."""


class TaskOwner(Protocol):
    """Who owns a task, or who is asking about one.

    The :class:`~trio_harness.agents.Agent` protocol satisfies it.  The ``id``
    (a session id) is what authorization compares; the exact object is what
    cleanup and completion delivery use.
    """

    @property
    def id(self) -> str:
        """The owner's session id."""
        ...

    @property
    def scope(self) -> Scope:
        """The owner's scope; its owned tasks are cancelled when it closes."""
        ...


@attrs.frozen
class TaskOutcome:
    """How a producer's work ended, as reported by its ``done`` hook.

    Attributes:
        status: ``"completed"``, ``"killed"`` or ``"failed"``.
        output: the result of a final-output task, returned by every read
            after settlement.  For a stream task it is optional trailing text
            (e.g. a sandbox notice), delivered once after the last delta.
        detail: producer-specific facts (e.g. ``{"exit_code": 0}``); the
            service does not interpret them.
    """

    status: TerminalStatus
    output: str | None = None
    detail: Mapping[str, object] = attrs.field(factory=dict)


@attrs.frozen
class TaskHooks:
    """What a producer's starter returns: the controls of the running work.

    Attributes:
        cancel: a synchronous, idempotent request to stop (``cancel(reason)``);
            it must make ``done`` settle.  It may raise if the request could
            not be made.
        done: an async callable that never raises and returns the outcome only
            after the work's resources were released.  The service awaits it
            once, in its own nursery.
        read_output: for a stream task, returns the output produced since the
            previous call (consuming).  None declares a final-output task whose
            result is ``TaskOutcome.output``.
        release: optional; called once, synchronously, when the service
            forgets the finished task (it was reported and pruned beyond the
            service's ``finished_cap``), to free what the producer kept for
            reads (e.g. spill files).  An error it raises is logged.
    """

    cancel: Callable[[str | None], None]
    done: Callable[[], Awaitable[TaskOutcome]]
    read_output: Callable[[], str] | None = None
    release: Callable[[], None] | None = None


@attrs.frozen
class TaskSpec:
    """A request to start a background task.

    Attributes:
        kind: the producer family, e.g. ``"bash"``; must match
            ``[a-z][a-z0-9_-]*`` (at most 32 characters).  Ids are ``<kind>-N``.
        label: a short human-readable description (e.g. the command).
        owner: the owning agent (its tasks die with its scope), or None for an
            unowned task, visible to non-agent callers and ended with the service.
        run: the starter, called exactly once after every preflight check
            passed; it starts the work and returns its hooks.  If it raises, no
            task exists.
        output_limit_bytes: the producer's cap on model-facing text about this
            task, in UTF-8 bytes (positive), or None.  Projected unchanged into
            every snapshot.
    """

    kind: str
    label: str
    owner: TaskOwner | None
    run: Callable[[], Awaitable[TaskHooks]]
    output_limit_bytes: int | None = None


@attrs.frozen
class TaskSnapshot:
    """A point-in-time view of one task.

    Attributes:
        id: ``<kind>-N``.
        kind: the producer family.
        label: the human-readable description.
        status: running, stopping, completed, killed, failed or lost.
        owner_id: the owner's session id, or None for an unowned task.
        output_limit_bytes: the producer's byte cap for model-facing text, or None.
        started_at: Trio time of registration.
        ended_at: Trio time of settlement, or None while live.
        detail: producer-specific facts from the outcome.
        reported: whether the result was delivered (read, waited, killed or
            notified); reported tasks get no completion notice.
        error: why the task failed, when the service knows (e.g. a raising cancel).
        kill_reason: the reason given when the task was killed.
        owner_disposed: whether the task was ended by its owner's disposal
            (such tasks get no completion notice).
    """

    id: str
    kind: str
    label: str
    status: TaskStatus
    owner_id: str | None
    output_limit_bytes: int | None
    started_at: float
    ended_at: float | None = None
    detail: Mapping[str, object] = attrs.field(factory=dict)
    reported: bool = False
    error: str | None = None
    kill_reason: str | None = None
    owner_disposed: bool = False

    @property
    def terminal(self) -> bool:
        """True once the task has settled (completed, killed or failed)."""
        return self.status in TERMINAL_STATUSES


@attrs.frozen
class TaskRead:
    """The result of :meth:`TaskService.read`.

    Attributes:
        output: a stream task's output since the previous read, or a
            final-output task's result once settled (``""`` before).
        snapshot: the task's snapshot taken right after the output was read.
        stream: whether the task is a stream task (reads consume).
    """

    output: str
    snapshot: TaskSnapshot
    stream: bool


TaskListener = Callable[[TaskSnapshot], None]
"""A completion listener: called once per task that settles, with its terminal snapshot."""
