"""The background task runtime (``harness.tasks``): ids, authorization, reads, waits, cleanup.

Long-running tools are *producers*: they hand the service a :class:`TaskSpec`
whose ``run`` starts the work and returns :class:`TaskHooks` (``cancel``,
``done`` and optionally ``read_output``).  The service owns everything generic:

* ids ``<kind>-N`` (one counter per kind, consumed only by a committed start);
* central authorization: an owned task is visible only to the caller whose
  ``id`` is the owner's session id, an unowned task only to non-agent callers
  (``caller=None``); everything else looks exactly like an unknown id;
* consuming stream reads and idempotent final reads; bounded waits; kills;
* first-wins settlement, completion listeners with contained errors;
* owner lifecycle: the first task of an owner attaches one exit callback to the
  owner's scope, which cancels and awaits the owner's tasks when it closes;
* retention: reported finished tasks beyond a per-owner cap are forgotten
  (collected ones before merely notified ones, oldest first), and their
  producers' ``release`` hooks run;
* lost tasks: a resumed session's tasks that an earlier run started and never
  reported are registered as terminal ``lost`` records of their owner
  (:meth:`TaskService.add_lost`), and the ids its log names are never issued
  again (:meth:`TaskService.reserve_id`);
* teardown: leaving :func:`open_task_service` cancels every live task and
  awaits its producer.  Both waits are bounded by the teardown timeout; a task
  that has not stopped by then is force-settled ``failed`` (see
  ``docs/guarantees.rst``, "Background tasks").

The producers' ``done`` awaitables run as tasks of the service's own nursery,
never in the scope of the tool or plugin that started them, so unloading or
reloading a tool plugin does not touch running tasks.
"""

from __future__ import annotations

import builtins
import logging
import math
import re
from collections.abc import AsyncIterator, Callable, Iterable, Mapping
from contextlib import asynccontextmanager
from types import MappingProxyType
from typing import TYPE_CHECKING, NoReturn

import attrs
import trio

from .._errors import ScopeClosedError, TaskError, TaskNotFoundError, TaskStartError
from .._scope import DEFAULT_TEARDOWN_TIMEOUT
from .._util import is_positive_int, is_positive_number
from ._options import TaskRuntimeOptions
from ._state import EMPTY, LOST_HOOKS, OwnerEntry, Pending, Record, Waiter
from ._types import (
    _OUTCOME_STATUSES,
    TaskHooks,
    TaskListener,
    TaskOutcome,
    TaskOwner,
    TaskRead,
    TaskSnapshot,
    TaskSpec,
    TerminalStatus,
)

if TYPE_CHECKING:
    from .._scope import Scope


log = logging.getLogger("trio_harness.tasks")

_KIND = re.compile(r"[a-z][a-z0-9_-]{0,31}")
_TASK_ID = re.compile(r"([a-z][a-z0-9_-]{0,31})-([1-9][0-9]{0,17})")


def _unknown(task_id: str) -> TaskNotFoundError:
    return TaskNotFoundError(f"unknown task {task_id!r}")


def _freeze(detail: Mapping[str, object]) -> Mapping[str, object]:
    return MappingProxyType(dict(detail)) if detail else EMPTY


# ---------------------------------------------------------------- the service


@attrs.define(eq=False)
class TaskService:
    """The registry of background tasks.

    Obtain one from :func:`open_task_service`.  All methods are meant to be
    called from the Trio thread.

    Attributes:
        per_owner_cap: how many running or stopping tasks (plus starts in
            progress) one exact owner, or the unowned pool, may have.
        finished_cap: how many finished, reported tasks one exact owner (or
            the unowned pool) keeps; beyond it the oldest are forgotten (their
            ids become unknown and their producers' ``release`` hooks run).
            Tasks whose result was collected (read, waited for, killed) go
            before tasks that were only notified; running and unreported tasks
            are never forgotten.
        teardown_timeout: how long (Trio seconds) the service's own teardown
            waits for live tasks to stop before force-settling them ``failed``.
    """

    _nursery: trio.Nursery
    per_owner_cap: int
    finished_cap: int
    teardown_timeout: float
    # Visible records by id (owner-disposed records are removed).
    _records: dict[str, Record] = attrs.field(factory=dict, init=False)
    # Every record not yet settled, visible or not: teardown cancels these.
    _live: set[Record] = attrs.field(factory=set, init=False)
    _counters: dict[str, int] = attrs.field(factory=dict, init=False)
    # Owner bookkeeping keyed by id() of the exact owner object (kept alive by the entry).
    _owners: dict[int, OwnerEntry] = attrs.field(factory=dict, init=False)
    _unowned: OwnerEntry = attrs.field(factory=lambda: OwnerEntry(owner=None), init=False)
    _pending: set[Pending] = attrs.field(factory=set, init=False)
    # Records whose producer's done is still being awaited.
    _watching: set[Record] = attrs.field(factory=set, init=False)
    _listeners: dict[object, TaskListener] = attrs.field(factory=dict, init=False)
    _controllers: dict[object, str] = attrs.field(factory=dict, init=False)
    # Lost tasks (add_lost) by owner session id: the exact owner that resumed
    # the session, and its lost records by task id.
    _lost: dict[str, tuple[TaskOwner, dict[str, Record]]] = attrs.field(factory=dict, init=False)
    _closing: bool = attrs.field(default=False, init=False)
    # Set when teardown stopped waiting: a start still in progress is refused.
    _closed: bool = attrs.field(default=False, init=False)

    # ------------------------------------------------------------ controllers, listeners

    def attach_controller(self, name: str) -> Callable[[], None]:
        """Declare that a task controller (something that can collect and stop tasks) is live.

        :meth:`start` refuses while no controller is attached, so no producer
        can start work nobody can collect or stop.

        Args:
            name: the controller's name (for diagnostics).

        Returns:
            An idempotent function that detaches the controller again.
        """
        token = object()
        self._controllers[token] = name

        def detach() -> None:
            self._controllers.pop(token, None)

        return detach

    @property
    def controllers(self) -> tuple[str, ...]:
        """The names of the attached controllers, oldest first."""
        return tuple(self._controllers.values())

    def on_task_done(self, listener: TaskListener, *, scope: Scope | None = None) -> Callable[[], None]:
        """Call ``listener(snapshot)`` once for every task that settles.

        The listener runs synchronously at settlement, after waiters were
        resolved; an exception it raises is logged and contained (later
        listeners still run).  Nothing awaits it.

        Args:
            listener: the callback.
            scope: if given, the listener is removed when this scope closes.

        Returns:
            An idempotent function that removes the listener.

        Raises:
            ScopeClosedError: ``scope`` is already closing.
        """
        token = object()
        self._listeners[token] = listener

        def remove() -> None:
            self._listeners.pop(token, None)

        if scope is not None:
            try:
                scope.add_exit_callback(remove)
            except BaseException:
                remove()
                raise
        return remove

    # ------------------------------------------------------------ start

    def _preflight(self, spec: TaskSpec) -> OwnerEntry:
        """Every check that can refuse a start; returns the owner entry to use."""
        if self._closing:
            raise TaskStartError("the task service is closed")
        if not self._controllers:
            raise TaskStartError("no task controller is attached")
        if not isinstance(spec.kind, str) or not _KIND.fullmatch(spec.kind):
            raise TaskStartError(f"task kind {spec.kind!r} is invalid: use [a-z][a-z0-9_-]* (at most 32 characters)")
        if not isinstance(spec.label, str) or not spec.label.strip():
            raise TaskStartError(f"task label must be a non-empty string, got {spec.label!r}")
        limit = spec.output_limit_bytes
        if limit is not None and not is_positive_int(limit):
            raise TaskStartError(f"output_limit_bytes must be a positive integer or None, got {limit!r}")
        owner = spec.owner
        if owner is None:
            entry = self._unowned
        else:
            if owner.scope.closing:
                raise TaskStartError(f"cannot start a task for {owner.id!r}: its scope is closing")
            entry = self._owners.get(id(owner)) or OwnerEntry(owner=owner)
            if entry.disposing:
                raise TaskStartError(f"cannot start a task for {owner.id!r}: it is being disposed")
        if len(entry.live) + len(entry.pending) >= self.per_owner_cap:
            who = "unowned callers" if owner is None else repr(owner.id)
            raise TaskStartError(
                f"{who} already have {self.per_owner_cap} running background tasks "
                "(the limit); collect or kill some first"
            )
        if owner is not None and entry.detach is None:
            # The first task of this exact owner: one exit callback on its scope.
            try:
                entry.detach = owner.scope.add_exit_callback(lambda: self._dispose_owner(entry))
            except ScopeClosedError as exc:
                raise TaskStartError(f"cannot start a task for {owner.id!r}: its scope is closing") from exc
            self._owners[id(owner)] = entry
        return entry

    async def start(self, spec: TaskSpec) -> TaskSnapshot:
        """Preflight, run the producer's starter once, and register the task atomically.

        Every check that can refuse (service open, controller attached, valid
        kind, label and limit, owner scope open, per-owner cap) happens before
        ``spec.run`` is called; a refused start calls nothing and consumes no
        id number.  Once ``run`` returns hooks, registration cannot fail.

        Args:
            spec: what to start.

        Returns:
            The snapshot of the new task (status ``running``).

        Raises:
            TaskStartError: a preflight check refused, or ``run`` raised (the
                error is chained), or the owner or service closed while ``run``
                was starting and cancelled it.
        """
        await trio.lowlevel.checkpoint()
        entry = self._preflight(spec)
        pending = Pending()
        entry.pending.add(pending)
        self._pending.add(pending)
        try:
            with pending.cancel_scope:
                try:
                    hooks: object = await spec.run()
                except Exception as exc:
                    raise TaskStartError(f"starting the {spec.kind} task failed: {exc}") from exc
            if pending.cancel_scope.cancelled_caught:
                raise TaskStartError(f"the {spec.kind} task was not started: its owner or the task service closed")
            if not isinstance(hooks, TaskHooks):
                raise TaskStartError(f"the {spec.kind} starter returned {hooks!r}, not TaskHooks")
            if entry.disposed or self._closed:
                self._refuse_late(spec, hooks)
            record = self._commit(spec, entry, hooks)
        finally:
            entry.pending.discard(pending)
            self._pending.discard(pending)
            pending.finished.set()
        # If the owner or the service began closing while run() was in
        # progress, it waited for this start and now cancels the new task.
        return record.snapshot()

    def _refuse_late(self, spec: TaskSpec, hooks: TaskHooks) -> NoReturn:
        """A starter outlived the teardown bound of its owner or of the service: stop its work."""
        reason = "task service closed" if self._closed else "owner disposed"
        try:
            hooks.cancel(reason)
        except Exception as exc:
            log.warning("a late %s start could not be cancelled (%r); its work may be orphaned", spec.kind, exc)
            raise TaskStartError(
                f"the {spec.kind} task was not registered: its owner or the task service closed while it "
                f"was starting, and cancelling its work failed ({exc!r}); the work may be orphaned"
            ) from exc
        raise TaskStartError(
            f"the {spec.kind} task was not registered: its owner or the task service closed while it was "
            "starting; its work was cancelled"
        )

    def adopt(self, spec: TaskSpec, task_id: str, hooks: TaskHooks) -> TaskSnapshot:
        """Register, under its own id, a task an earlier run of ``spec.owner``'s session started.

        A producer that can carry on a task of a dead process (a background
        subagent, whose child session resumes here: tools/_resume_tasks.py)
        builds its hooks itself and registers them with the id the model
        already knows; from then on the task is like any other (reads,
        kills, completion notices).  ``spec.run`` is not called.

        Raises:
            TaskStartError: a preflight check refused (as for :meth:`start`),
                or ``task_id`` is visible already.
            ValueError: ``task_id`` is not ``<kind>-N`` of ``spec.kind``.
        """
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if match is None or match.group(1) != spec.kind:
            raise ValueError(f"task id {task_id!r} is not <kind>-N of kind {spec.kind!r}")
        if task_id in self._records:
            raise TaskStartError(f"task {task_id} is already registered")
        entry = self._preflight(spec)
        self.reserve_id(task_id)
        return self._commit(spec, entry, hooks, task_id).snapshot()

    def _commit(self, spec: TaskSpec, entry: OwnerEntry, hooks: TaskHooks, task_id: str | None = None) -> Record:
        """Register the task; nothing here can fail."""
        if task_id is None:
            number = self._counters.get(spec.kind, 0) + 1
            self._counters[spec.kind] = number
            task_id = f"{spec.kind}-{number}"
        record = Record(
            id=task_id,
            kind=spec.kind,
            label=spec.label,
            owner=entry,
            owner_id=None if spec.owner is None else spec.owner.id,
            output_limit_bytes=spec.output_limit_bytes,
            hooks=hooks,
            started_at=trio.current_time(),
        )
        self._records[record.id] = record
        self._live.add(record)
        entry.live.add(record)
        entry.records[record.id] = record
        self._watching.add(record)
        self._nursery.start_soon(self._watch, record, name=f"task {record.id}")
        log.debug("task %s started (%s)", record.id, record.label)
        return record

    async def _watch(self, record: Record) -> None:
        """Await the producer's ``done`` and settle the record with its outcome.

        Runs shielded: cancelling the scope that hosts the service must not
        kill the watchers before teardown has cancelled and awaited the tasks.
        """
        try:
            with record.watch_scope:
                try:
                    outcome: object = await record.hooks.done()
                except Exception as exc:  # done must never raise; contain it anyway
                    log.exception("done of task %s raised (producer contract violation)", record.id)
                    self._settle(record, "failed", error=f"done raised: {exc!r}")
                    return
                if not isinstance(outcome, TaskOutcome) or outcome.status not in _OUTCOME_STATUSES:
                    self._settle(record, "failed", error=f"done returned an invalid outcome: {outcome!r}")
                    return
                self._settle(record, outcome.status, output=outcome.output, detail=outcome.detail)
        finally:
            self._watching.discard(record)

    def _settle(
        self,
        record: Record,
        status: TerminalStatus,
        *,
        output: str | None = None,
        detail: Mapping[str, object] = EMPTY,
        error: str | None = None,
    ) -> None:
        """Record the first terminal outcome; later ones are ignored."""
        if record.terminal:
            log.debug("task %s: ignoring a later %s outcome (first outcome wins)", record.id, status)
            return
        record.status = status
        record.ended_at = trio.current_time()
        record.detail = _freeze(detail)
        record.error = error
        if record.hooks.read_output is None:
            record.final_output = output
        else:
            record.trailing_output = output or None
        self._live.discard(record)
        record.owner.live.discard(record)
        if record.waiters:
            # A registered waiter is certain to return (a cancelled one left in
            # its abort callback), so handing it the snapshot delivers the result.
            record.reported = record.collected = True
            snapshot = record.snapshot()
            for waiter in record.waiters:
                waiter.result = snapshot
                waiter.wake()
            record.waiters.clear()
        record.settled.set()
        log.debug("task %s settled: %s", record.id, status)
        snapshot = record.snapshot()
        for listener in tuple(self._listeners.values()):
            try:
                listener(snapshot)
            except Exception:
                log.exception("task-done listener %r failed for task %s", listener, record.id)
        self._retire(record)

    def _retire(self, record: Record) -> None:
        """Make a finished, reported, visible record prunable; forget the oldest beyond the cap.

        Collected records go first; a record only notified (its notice tells
        the model to read it) goes only when no collected record is left.
        Running and unreported records are never forgotten.
        """
        entry = record.owner
        if not (record.terminal and record.reported) or entry.records.get(record.id) is not record:
            return
        if record.collected:
            entry.notified.pop(record.id, None)
            entry.collected.setdefault(record.id, record)
        else:
            entry.notified.setdefault(record.id, record)
        while len(entry.collected) + len(entry.notified) > self.finished_cap:
            pool = entry.collected or entry.notified
            self._forget(pool[next(iter(pool))])

    def _forget(self, record: Record) -> None:
        """Drop a finished record: its id becomes unknown, its producer releases what it kept."""
        entry = record.owner
        entry.collected.pop(record.id, None)
        entry.notified.pop(record.id, None)
        if entry.records.get(record.id) is record:
            del entry.records[record.id]
        if self._records.get(record.id) is record:
            del self._records[record.id]
        release = record.hooks.release
        if release is not None:
            try:
                release()
            except Exception:
                log.exception("release of task %s failed (producer contract violation)", record.id)

    # ------------------------------------------------------------ lookup

    def _lookup(self, task_id: str, caller: TaskOwner | None) -> Record:
        """The record for ``task_id`` if ``caller`` may see it, else TaskNotFoundError.

        A task of this process wins over a lost task of the same id (ids are
        reserved past the lost ones, so only another owner's task can share one).
        """
        record = self._records.get(task_id)
        if record is not None:
            # Unowned: non-agent callers only.  Owned: the owning session only
            # (session equality grants access; cleanup uses object identity).
            owner_id = record.owner_id
            if caller is None if owner_id is None else (caller is not None and caller.id == owner_id):
                return record
        lost = None if caller is None else self._lost.get(caller.id)
        if lost is not None and task_id in lost[1]:
            return lost[1][task_id]
        raise _unknown(task_id)

    def get(self, task_id: str, caller: TaskOwner | None = None) -> TaskSnapshot:
        """The snapshot of a task visible to ``caller`` (non-consuming).

        Raises:
            TaskNotFoundError: ``unknown task '<id>'`` for unknown ids and for
                tasks the caller may not see alike.
        """
        return self._lookup(task_id, caller).snapshot()

    @property
    def live_count(self) -> int:
        """How many tasks are live (running or stopping), whoever owns them (the telemetry gauge)."""
        return len(self._live)

    def list(self, caller: TaskOwner | None = None) -> builtins.list[TaskSnapshot]:
        """Snapshots of the tasks visible to ``caller``, oldest first."""
        caller_id = None if caller is None else caller.id
        lost = () if caller_id is None or caller_id not in self._lost else self._lost[caller_id][1].values()
        return [r.snapshot() for r in (*lost, *self._records.values()) if r.owner_id == caller_id]

    # ------------------------------------------------------------ lost tasks of resumed sessions

    def reserve_id(self, task_id: str) -> None:
        """Never issue ``task_id`` (nor a lower number of its kind) again.

        A resumed session's log names the tasks of the agent's earlier runs;
        reserving their ids keeps a new task from taking the id of one the
        model already knows.  An id not of the form ``<kind>-N`` is ignored.
        """
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if match is not None:
            kind, number = match.group(1), int(match.group(2))
            self._counters[kind] = max(self._counters.get(kind, 0), number)

    def add_lost(self, owner: TaskOwner, task_id: str, *, kind: str, label: str, error: str) -> TaskSnapshot:
        """Register a task of ``owner``'s session that an earlier run started and never reported.

        The task is terminal with status ``lost`` from the start: nothing runs,
        reads return no output (the ``error`` says why), a kill reports the
        status and a wait returns at once.  It is visible to the callers whose
        id is ``owner.id``, beside the tasks of this process, until ``owner``'s
        scope closes; its id is reserved (:meth:`reserve_id`).  It gets no
        completion listener call: it did not settle in this process (the
        caller delivers its notice).  Registering an id again for the same
        owner returns the first registration.

        Raises:
            ValueError: ``task_id`` is not ``<kind>-N`` with this ``kind``, or
                ``label`` or ``error`` is empty.
            TaskStartError: ``owner``'s scope is closing.
        """
        match = _TASK_ID.fullmatch(task_id) if isinstance(task_id, str) else None
        if match is None or match.group(1) != kind:
            raise ValueError(f"task id {task_id!r} is not <kind>-N of kind {kind!r}")
        if not (isinstance(label, str) and label.strip() and isinstance(error, str) and error.strip()):
            raise ValueError("a lost task needs a non-empty label and error")
        self.reserve_id(task_id)
        entry = self._lost.get(owner.id)
        if entry is None or entry[0] is not owner:
            records: dict[str, Record] = {}

            def forget() -> None:
                if self._lost.get(owner.id, (None,))[0] is owner:
                    del self._lost[owner.id]

            try:
                owner.scope.add_exit_callback(forget)
            except ScopeClosedError as exc:
                raise TaskStartError(f"cannot register a lost task for {owner.id!r}: its scope is closing") from exc
            entry = self._lost[owner.id] = (owner, records)
        existing = entry[1].get(task_id)
        if existing is not None:
            return existing.snapshot()
        now = trio.current_time()
        record = Record(
            id=task_id,
            kind=kind,
            label=label,
            owner=OwnerEntry(owner=owner),
            owner_id=owner.id,
            output_limit_bytes=None,
            hooks=LOST_HOOKS,
            started_at=now,
            status="lost",
            ended_at=now,
            reported=True,
            error=error,
        )
        record.settled.set()
        entry[1][task_id] = record
        return record.snapshot()

    def owner_of(self, task_id: str) -> TaskOwner | None:
        """The exact owner object recorded when the task started (for delivery, not access).

        Returns:
            The owner, or None for an unowned task, an unknown id or a task
            whose owner was disposed.
        """
        record = self._records.get(task_id)
        if record is None or record.owner_disposed:
            return None
        return record.owner.owner

    def claim_report(self, task_id: str) -> bool:
        """Mark a task reported on behalf of a controller delivering its result.

        Returns:
            True if this call marked it, False if it was already reported or
            the id is unknown (so exactly one deliverer wins).
        """
        record = self._records.get(task_id)
        if record is None or record.reported:
            return False
        record.reported = True
        self._retire(record)
        return True

    # ------------------------------------------------------------ control

    def read(self, task_id: str, caller: TaskOwner | None = None) -> TaskRead:
        """Read a task's output.

        A stream task returns the output produced since the previous read
        (consuming, one shared cursor).  A final-output task returns ``""``
        while live and its result once settled, the same on every read.  A
        read that delivers a terminal task marks it reported.

        Raises:
            TaskNotFoundError: the id is unknown or not visible to ``caller``.
            TaskError: the producer's ``read_output`` raised.
        """
        record = self._lookup(task_id, caller)
        read_output = record.hooks.read_output
        if read_output is None:
            output = (record.final_output or "") if record.terminal else ""
        else:
            terminal_before = record.terminal
            try:
                output = read_output()
            except Exception as exc:
                raise TaskError(f"reading the output of task {task_id!r} failed: {exc!r}") from exc
            if terminal_before and record.trailing_output is not None:
                output += record.trailing_output
                record.trailing_output = None
        if record.terminal:
            record.reported = record.collected = True
        read = TaskRead(output=output, snapshot=record.snapshot(), stream=read_output is not None)
        self._retire(record)
        return read

    async def kill(self, task_id: str, caller: TaskOwner | None = None, reason: str | None = None) -> TaskSnapshot:
        """Request cancellation of a task.

        A running task becomes ``stopping`` and its producer's ``cancel(reason)``
        is called; a stopping task is left as is; a terminal task reports its
        existing status.  A successful kill of a live task marks it reported.

        Returns:
            The snapshot after the request.

        Raises:
            TaskNotFoundError: the id is unknown or not visible to ``caller``.
            TaskError: the producer's cancel raised; the task stays running.
        """
        await trio.lowlevel.checkpoint()
        record = self._lookup(task_id, caller)
        if record.terminal:
            return record.snapshot()
        if record.status == "running":
            try:
                record.hooks.cancel(reason)
            except Exception as exc:
                raise TaskError(f"cancelling task {task_id!r} failed: {exc!r}; it is still running") from exc
            if record.status == "running":
                record.status = "stopping"
                record.kill_reason = reason
            log.info("task %s kill requested%s", record.id, f": {reason}" if reason else "")
        record.reported = record.collected = True
        return record.snapshot()

    async def wait(
        self,
        task_id: str,
        timeout: float,  # noqa: ASYNC109 (a bounded wait is the documented contract)
        caller: TaskOwner | None = None,
    ) -> TaskSnapshot:
        """Wait up to ``timeout`` seconds (Trio time) for a task to settle.

        Cancelling the waiter cancels only the wait, and delivery is atomic:
        a settlement either hands the terminal snapshot to this wait, which
        then returns it (even if its caller is cancelled in the same instant;
        the cancellation arrives at the caller's next checkpoint), or happens
        after the cancelled wait unregistered, leaving the task unreported (so
        a completion notice still goes out).  A settlement that coincides with
        the timeout is delivered to the wait.

        Returns:
            The terminal snapshot if the task settled (it is then marked
            reported), else the live snapshot at the timeout; the task keeps
            running.

        Raises:
            TaskNotFoundError: the id is unknown or not visible to ``caller``.
            ValueError: ``timeout`` is negative or NaN.
        """
        if math.isnan(timeout) or timeout < 0:
            raise ValueError(f"timeout must be >= 0, got {timeout!r}")
        await trio.lowlevel.checkpoint()
        record = self._lookup(task_id, caller)
        if record.terminal:
            record.reported = record.collected = True
            snapshot = record.snapshot()
            self._retire(record)
            return snapshot
        waiter = Waiter(trio.lowlevel.current_task())
        deadline = trio.current_time() + timeout

        def abort(raise_cancel: trio.lowlevel.RaiseCancelT) -> trio.lowlevel.Abort:
            if trio.current_time() >= deadline:
                # Our own timeout: this wait will return normally, so it stays
                # registered until it runs again and a settlement meanwhile
                # still counts as delivered to it.
                waiter.wake()
                return trio.lowlevel.Abort.FAILED
            # Cancelled from outside: unregister now, in the same synchronous
            # step as the abort, so no later settlement counts this waiter.
            record.waiters.discard(waiter)
            return trio.lowlevel.Abort.SUCCEEDED

        record.waiters.add(waiter)
        try:
            with trio.CancelScope(deadline=deadline):
                await trio.lowlevel.wait_task_rescheduled(abort)
        finally:
            record.waiters.discard(waiter)
        if waiter.result is not None:
            return waiter.result
        return record.snapshot()

    # ------------------------------------------------------------ owner disposal and teardown

    def _request_stop(self, record: Record, reason: str, during: str) -> None:
        """Cancel a live record for disposal/teardown; force-fail it if cancel raises."""
        if record.status != "running":
            return
        try:
            record.hooks.cancel(reason)
        except Exception as exc:
            message = f"cancel raised: {exc!r}; work may be orphaned"
            log.warning("task %s: cancel raised %r during %s; work may be orphaned", record.id, exc, during)
            self._settle(record, "failed", error=message, detail={"error": message})
            return
        if record.status == "running":
            record.status = "stopping"
            record.kill_reason = reason

    def _give_up(self, records: Iterable[Record], bound: float, during: str) -> None:
        """Force-settle live records that did not stop within a teardown bound.

        Called after the bound ended the wait: each still-live record is
        settled ``failed`` with an error naming the timeout, which listeners
        (the harness's ``task/done`` event) observe like any settlement.
        """
        for record in tuple(records):
            if record.terminal:
                continue
            message = (
                f"did not stop within the teardown timeout ({bound:g} s) of {during}; "
                "it was given up and its work may still be running"
            )
            log.warning("task %s %s", record.id, message)
            self._settle(record, "failed", error=message, detail={"error": message})

    async def _dispose_owner(self, entry: OwnerEntry) -> None:
        """The exit callback of an owner's scope: cancel, await and forget its tasks.

        The owner's scope bounds this callback by its ``teardown_timeout``; a
        task still live when the bound ends the wait is force-settled
        ``failed`` with an error naming the timeout.
        """
        entry.disposing = True
        owner = entry.owner
        assert owner is not None
        during = f"the disposal of {owner.id!r}"
        try:
            for pending in tuple(entry.pending):
                pending.cancel_scope.cancel()
            for pending in tuple(entry.pending):
                await pending.finished.wait()
            live = tuple(entry.live)
            for record in live:
                record.owner_disposed = True
            for record in live:
                self._request_stop(record, "owner disposed", during)
            for record in live:
                await record.settled.wait()
        finally:
            # Normally nothing is live here; after the teardown bound (the only
            # thing that ends the waits above early) the rest is given up.
            for record in tuple(entry.live):
                record.owner_disposed = True
                self._request_stop(record, "owner disposed", during)
            self._give_up(entry.live, owner.scope.teardown_timeout, during)
            entry.disposed = True
            for task_id, record in entry.records.items():
                record.owner_disposed = True
                if self._records.get(task_id) is record:
                    del self._records[task_id]
            entry.records.clear()
            entry.collected.clear()
            entry.notified.clear()
            if self._owners.get(id(owner)) is entry:
                del self._owners[id(owner)]
            entry.detach = None

    async def _shutdown(self) -> None:
        """Refuse new starts, detach owner callbacks, cancel and await every live task.

        The waits are bounded by ``teardown_timeout``; what is still live then
        is force-settled ``failed``.
        """
        self._closing = True
        for pending in tuple(self._pending):
            pending.cancel_scope.cancel()
        for entry in tuple(self._owners.values()):
            if entry.detach is not None:
                entry.detach()
                entry.detach = None
        with trio.move_on_after(self.teardown_timeout):
            for pending in tuple(self._pending):
                await pending.finished.wait()
            live = tuple(self._live)
            for record in live:
                self._request_stop(record, "task service closed", "task service teardown")
            for record in live:
                await record.settled.wait()
        self._closed = True
        for record in tuple(self._live):
            self._request_stop(record, "task service closed", "task service teardown")
        self._give_up(self._live, self.teardown_timeout, "the task service's teardown")
        self._listeners.clear()
        # What is still watched was force-failed (its cancel raised, or it did
        # not stop in time): stop waiting for its producer.
        for record in tuple(self._watching):
            record.watch_scope.cancel()


@asynccontextmanager
async def open_task_service(options: TaskRuntimeOptions | None = None) -> AsyncIterator[TaskService]:
    """Run a :class:`TaskService` for the duration of the ``async with`` block.

    The producers' ``done`` hooks are awaited in the service's own nursery.
    Leaving the block refuses new starts, detaches the owner callbacks from
    still-open scopes, cancels every live task and awaits its producer
    (shielded, for at most ``teardown_timeout`` seconds), then stops.  A
    producer whose cancel raises is force-failed (its work may be orphaned)
    instead of awaited; one that has not settled when the timeout ends the
    wait is force-failed with an error naming the timeout.  Its ``done`` is
    then cancelled; a ``done`` that shields itself from cancellation still
    holds the exit until it returns (Trio's nurseries wait for their tasks).

    Args:
        options: the service's settings (:class:`~trio_harness.tasks.TaskRuntimeOptions`);
            None for the defaults.  Its ``teardown_timeout`` of None is
            the harness's default, 30 seconds, here
            (:func:`~trio_harness.open_harness` passes its own).

    Raises:
        ValueError: a cap is not a positive integer, or ``teardown_timeout``
            is not a positive number.
        TypeError: ``options`` is not a :class:`~trio_harness.tasks.TaskRuntimeOptions`.
    """
    if options is None:
        options = TaskRuntimeOptions()
    elif not isinstance(options, TaskRuntimeOptions):
        raise TypeError(f"options must be a TaskRuntimeOptions, got {type(options).__name__}")
    per_owner_cap, finished_cap = options.per_owner_cap, options.finished_cap
    teardown_timeout = DEFAULT_TEARDOWN_TIMEOUT if options.teardown_timeout is None else options.teardown_timeout
    for name, cap in (("per_owner_cap", per_owner_cap), ("finished_cap", finished_cap)):
        if not is_positive_int(cap):
            raise ValueError(f"{name} must be a positive integer, got {cap!r}")
    if not is_positive_number(teardown_timeout):
        raise ValueError(f"teardown_timeout must be a positive number of seconds, got {teardown_timeout!r}")
    async with trio.open_nursery() as nursery:
        service = TaskService(nursery, per_owner_cap, finished_cap, float(teardown_timeout))
        try:
            yield service
        finally:
            with trio.CancelScope(shield=True):
                await service._shutdown()
            nursery.cancel_scope.cancel()
