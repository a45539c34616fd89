"""The task service's bookkeeping: one record per task, per owner, per wait and per start.

Internal to :mod:`trio_harness.tasks`: the service (``_service.py``) keeps one
:class:`Record` per task, lost tasks of resumed sessions included (they share
:data:`LOST_HOOKS`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from types import MappingProxyType

import attrs
import trio

from ._types import TERMINAL_STATUSES, TaskHooks, TaskOutcome, TaskOwner, TaskSnapshot, TaskStatus

EMPTY: Mapping[str, object] = MappingProxyType({})


@attrs.define(eq=False)
class Waiter:
    """One pending :meth:`~trio_harness.tasks.TaskService.wait`, parked in ``wait_task_rescheduled``.

    While it is in its record's ``waiters``, its wait is certain to return
    normally, so a settlement that hands it the terminal snapshot has delivered
    the result.  A cancelled wait leaves ``waiters`` in its abort callback,
    atomically with the abort.
    """

    task: trio.lowlevel.Task
    # The terminal snapshot, once settlement handed it over.
    result: TaskSnapshot | None = None
    # Whether the task was rescheduled (it must be exactly once).
    woken: bool = False

    def wake(self) -> None:
        if not self.woken:
            self.woken = True
            trio.lowlevel.reschedule(self.task)


@attrs.define(eq=False)
class Pending:
    """A start whose ``run`` is in progress (it counts against the cap)."""

    cancel_scope: trio.CancelScope = attrs.field(factory=trio.CancelScope)
    finished: trio.Event = attrs.field(factory=trio.Event)


@attrs.define(eq=False)
class OwnerEntry:
    """The service's bookkeeping for one exact owner object (or for unowned tasks)."""

    owner: TaskOwner | None
    live: set[Record] = attrs.field(factory=set)
    records: dict[str, Record] = attrs.field(factory=dict)
    # Visible finished records whose result was collected (read, waited for,
    # killed), in the order they became so: pruned first, oldest first.
    collected: dict[str, Record] = attrs.field(factory=dict)
    # Visible finished records only notified (a completion notice claimed
    # them): pruned only when no collected record is left, oldest first.
    notified: dict[str, Record] = attrs.field(factory=dict)
    pending: set[Pending] = attrs.field(factory=set)
    # Detaches the exit callback from the owner's scope.
    detach: Callable[[], None] | None = None
    disposing: bool = False
    # Set when the disposal ended (done or abandoned at the teardown timeout):
    # a start still in progress can no longer be picked up by it.
    disposed: bool = False


@attrs.define(eq=False)
class Record:
    """The live state of one registered task."""

    id: str
    kind: str
    label: str
    owner: OwnerEntry
    owner_id: str | None
    output_limit_bytes: int | None
    hooks: TaskHooks
    started_at: float
    status: TaskStatus = "running"
    ended_at: float | None = None
    detail: Mapping[str, object] = EMPTY
    final_output: str | None = None
    # A stream task's outcome output, delivered once after the last delta.
    trailing_output: str | None = None
    reported: bool = False
    # Whether the result reached a reader (read, wait or kill), not just a notice.
    collected: bool = False
    error: str | None = None
    kill_reason: str | None = None
    owner_disposed: bool = False
    waiters: set[Waiter] = attrs.field(factory=set)
    settled: trio.Event = attrs.field(factory=trio.Event)
    # Shields the watcher from outer cancellation (the host scope closing):
    # only the service cancels it, after teardown settled every record.
    watch_scope: trio.CancelScope = attrs.field(factory=lambda: trio.CancelScope(shield=True))

    @property
    def terminal(self) -> bool:
        return self.status in TERMINAL_STATUSES

    def snapshot(self) -> TaskSnapshot:
        return TaskSnapshot(
            id=self.id,
            kind=self.kind,
            label=self.label,
            status=self.status,
            owner_id=self.owner_id,
            output_limit_bytes=self.output_limit_bytes,
            started_at=self.started_at,
            ended_at=self.ended_at,
            detail=self.detail,
            reported=self.reported,
            error=self.error,
            kill_reason=self.kill_reason,
            owner_disposed=self.owner_disposed,
        )


def _nothing_to_cancel(reason: str | None) -> None:
    """The cancel of a lost task: nothing runs."""


async def _never_done() -> TaskOutcome:  # pragma: no cover - a lost record is never watched
    raise AssertionError("a lost task is never watched")


LOST_HOOKS = TaskHooks(cancel=_nothing_to_cancel, done=_never_done)
"""The hooks of every lost task (a final-output task without output)."""
