"""The background task runtime: TaskService (docs/guarantees.rst, "Background tasks")."""

from __future__ import annotations

import functools
import logging
from collections.abc import AsyncIterator
from typing import Any

import attrs
import pytest
import trio
import trio.testing
from _fakes import FakeOwner, FakeProducer, make_owner

from trio_harness._bus import Notice
from trio_harness._errors import TaskError, TaskNotFoundError, TaskStartError
from trio_harness._scope import Scope, open_scope
from trio_harness.tasks import (
    TaskHooks,
    TaskOutcome,
    TaskRuntimeOptions,
    TaskService,
    TaskSnapshot,
    TaskSpec,
    open_task_service,
)
from trio_harness.testing import open_test_harness

# ---------------------------------------------------------------- helpers


def spec(
    producer: FakeProducer,
    owner: FakeOwner | None = None,
    *,
    kind: str = "bash",
    label: str = "sleep 10",
    limit: int | None = None,
) -> TaskSpec:
    return TaskSpec(kind=kind, label=label, owner=owner, run=producer.run, output_limit_bytes=limit)


@pytest.fixture
async def tasks() -> AsyncIterator[TaskService]:
    async with open_task_service() as service:
        service.attach_controller("test")
        yield service


@pytest.fixture
async def root(tasks: TaskService) -> AsyncIterator[Scope]:
    # Depends on `tasks`, so agent scopes close before the service does.
    async with open_scope("test") as scope:
        yield scope


def collect(tasks: TaskService) -> list[TaskSnapshot]:
    seen: list[TaskSnapshot] = []
    tasks.on_task_done(seen.append)
    return seen


# ---------------------------------------------------------------- ids and preflight


async def test_ids_count_per_kind(tasks: TaskService) -> None:
    ids = [
        (await tasks.start(spec(FakeProducer(), kind=kind))).id
        for kind in ("bash", "bash", "subagent", "bash", "subagent")
    ]
    assert ids == ["bash-1", "bash-2", "subagent-1", "bash-3", "subagent-2"]


async def test_snapshot_projects_the_spec(tasks: TaskService, autojump_clock: object) -> None:
    await trio.sleep(7)
    snap = await tasks.start(spec(FakeProducer(), label="make test", limit=4096))
    assert snap.kind == "bash"
    assert snap.label == "make test"
    assert snap.status == "running"
    assert snap.owner_id is None
    assert snap.output_limit_bytes == 4096
    assert snap.started_at == trio.current_time() == 7
    assert snap.ended_at is None
    assert not snap.reported
    assert not snap.terminal


@pytest.mark.parametrize(
    ("kind", "label", "limit", "message"),
    [
        ("Bash", "x", None, "task kind"),
        ("1bash", "x", None, "task kind"),
        ("", "x", None, "task kind"),
        ("bash run", "x", None, "task kind"),
        ("b" * 33, "x", None, "task kind"),
        ("bash", "", None, "label"),
        ("bash", "   ", None, "label"),
        ("bash", "x", 0, "output_limit_bytes"),
        ("bash", "x", -5, "output_limit_bytes"),
        ("bash", "x", True, "output_limit_bytes"),
    ],
)
async def test_invalid_spec_is_refused_before_run(
    tasks: TaskService, kind: str, label: str, limit: int | None, message: str
) -> None:
    producer = FakeProducer()
    with pytest.raises(TaskStartError, match=message):
        await tasks.start(spec(producer, kind=kind, label=label, limit=limit))
    assert producer.runs == 0
    assert (await tasks.start(spec(FakeProducer()))).id == "bash-1"


async def test_raising_run_creates_no_task_and_consumes_no_number(tasks: TaskService) -> None:
    async def broken() -> TaskHooks:
        raise OSError("spawn failed")

    with pytest.raises(TaskStartError, match="spawn failed") as info:
        await tasks.start(TaskSpec(kind="bash", label="x", owner=None, run=broken))
    assert isinstance(info.value.__cause__, OSError)
    assert tasks.list() == []
    assert (await tasks.start(spec(FakeProducer()))).id == "bash-1"


async def test_run_is_called_exactly_once(tasks: TaskService) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    assert producer.runs == 1


async def test_no_controller_fence(tasks: TaskService) -> None:
    async with open_task_service() as bare:
        producer = FakeProducer()
        with pytest.raises(TaskStartError, match="no task controller is attached"):
            await bare.start(spec(producer))
        assert producer.runs == 0
        detach = bare.attach_controller("ui")
        assert list(bare.controllers) == ["ui"]
        assert (await bare.start(spec(producer))).id == "bash-1"
        detach()
        detach()  # idempotent
        assert list(bare.controllers) == []
        other = FakeProducer()
        with pytest.raises(TaskStartError, match="no task controller is attached"):
            await bare.start(spec(other))
        assert other.runs == 0
        bare.attach_controller("ui")
        assert (await bare.start(spec(other))).id == "bash-2"


async def test_cap_counts_running_and_stopping(root: Scope) -> None:
    async with open_task_service(TaskRuntimeOptions(per_owner_cap=2)) as tasks:
        tasks.attach_controller("test")
        owner = await make_owner(root)
        slow = FakeProducer(settle_on_cancel=False)
        await tasks.start(spec(slow, owner))
        await tasks.start(spec(FakeProducer(), owner))
        refused = FakeProducer()
        with pytest.raises(TaskStartError, match="limit"):
            await tasks.start(spec(refused, owner))
        await tasks.kill("bash-1", owner)
        assert tasks.get("bash-1", owner).status == "stopping"
        with pytest.raises(TaskStartError, match="limit"):
            await tasks.start(spec(refused, owner))
        assert refused.runs == 0
        # The cap is per owner: another owner and the unowned pool are unaffected.
        other = await make_owner(root, "s2")
        await tasks.start(spec(FakeProducer(), other))
        await tasks.start(spec(FakeProducer()))
        slow.finish(TaskOutcome("killed"))
        await tasks.wait("bash-1", 10, owner)
        snap = await tasks.start(spec(refused, owner))
        assert snap.id == "bash-5"  # refused starts consumed no number


async def test_cap_counts_starts_in_progress(root: Scope) -> None:
    async with open_task_service(TaskRuntimeOptions(per_owner_cap=1)) as tasks:
        tasks.attach_controller("test")
        owner = await make_owner(root)
        gate = trio.Event()
        producer = FakeProducer()

        async def slow_run() -> TaskHooks:
            await gate.wait()
            return producer.hooks()

        async with trio.open_nursery() as nursery:
            nursery.start_soon(tasks.start, TaskSpec("bash", "slow", owner, slow_run))
            await trio.testing.wait_all_tasks_blocked()
            with pytest.raises(TaskStartError, match="limit"):
                await tasks.start(spec(FakeProducer(), owner))
            gate.set()
        assert [s.id for s in tasks.list(owner)] == ["bash-1"]


async def test_closing_owner_scope_is_refused(tasks: TaskService, root: Scope) -> None:
    owner = await make_owner(root)
    await owner.scope.close()
    producer = FakeProducer()
    with pytest.raises(TaskStartError, match="scope is closing"):
        await tasks.start(spec(producer, owner))
    assert producer.runs == 0


# ---------------------------------------------------------------- authorization


async def test_owned_task_visible_only_to_owning_session(tasks: TaskService, root: Scope) -> None:
    alice = await make_owner(root, "alice")
    bob = await make_owner(root, "bob")
    producer = FakeProducer()
    await tasks.start(spec(producer, alice))
    assert tasks.get("bash-1", alice).owner_id == "alice"
    for caller in (bob, None):
        with pytest.raises(TaskNotFoundError) as info:
            tasks.get("bash-1", caller)
        assert str(info.value) == "unknown task 'bash-1'"
        with pytest.raises(TaskNotFoundError, match="unknown task 'bash-1'"):
            tasks.read("bash-1", caller)
        with pytest.raises(TaskNotFoundError, match="unknown task 'bash-1'"):
            await tasks.kill("bash-1", caller)
        with pytest.raises(TaskNotFoundError, match="unknown task 'bash-1'"):
            await tasks.wait("bash-1", 1, caller)
        assert tasks.list(caller) == []
    assert producer.cancels == []
    # Session equality grants access: another live object with the same session id.
    alias = FakeOwner(id="alice", scope=alice.scope)
    assert [s.id for s in tasks.list(alias)] == ["bash-1"]


async def test_unowned_task_visible_only_to_non_agent_callers(tasks: TaskService, root: Scope) -> None:
    alice = await make_owner(root, "alice")
    await tasks.start(spec(FakeProducer()))
    assert tasks.get("bash-1").owner_id is None
    assert [s.id for s in tasks.list()] == ["bash-1"]
    with pytest.raises(TaskNotFoundError, match="unknown task 'bash-1'"):
        tasks.get("bash-1", alice)
    assert tasks.list(alice) == []


async def test_unknown_id_has_the_same_message(tasks: TaskService, root: Scope) -> None:
    alice = await make_owner(root, "alice")
    for caller in (alice, None):
        with pytest.raises(TaskNotFoundError) as info:
            tasks.get("bash-99", caller)
        assert str(info.value) == "unknown task 'bash-99'"
        assert isinstance(info.value, LookupError)


# ---------------------------------------------------------------- reads


async def test_stream_reads_consume(tasks: TaskService) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    producer.emit("one\n")
    first = tasks.read("bash-1")
    assert first.stream
    assert first.output == "one\n"
    assert first.snapshot.status == "running"
    assert tasks.read("bash-1").output == ""
    producer.emit("two\n")
    producer.emit("three\n")
    assert tasks.read("bash-1").output == "two\nthree\n"
    assert not tasks.get("bash-1").reported
    producer.emit("last\n")
    producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))
    await tasks.wait("bash-1", 10)
    final = tasks.read("bash-1")
    assert final.output == "last\n"
    assert final.snapshot.status == "completed"
    assert final.snapshot.detail == {"exit_code": 0}
    assert final.snapshot.reported
    assert tasks.read("bash-1").output == ""


async def test_stream_outcome_output_is_delivered_once_after_the_last_delta(
    tasks: TaskService,
) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    producer.emit("tail\n")
    producer.finish(TaskOutcome("failed", output="[sandbox denied write]"))
    await tasks.wait("bash-1", 10)
    assert tasks.read("bash-1").output == "tail\n[sandbox denied write]"
    assert tasks.read("bash-1").output == ""


async def test_final_reads_are_idempotent(tasks: TaskService) -> None:
    producer = FakeProducer(stream=False)
    await tasks.start(spec(producer, kind="subagent"))
    live = tasks.read("subagent-1")
    assert not live.stream
    assert live.output == ""
    assert live.snapshot.status == "running"
    assert not tasks.get("subagent-1").reported  # a live read delivers nothing
    producer.finish(TaskOutcome("completed", output="the answer"))
    await trio.testing.wait_all_tasks_blocked()
    for _ in range(3):
        read = tasks.read("subagent-1")
        assert read.output == "the answer"
        assert read.snapshot.status == "completed"
        assert read.snapshot.reported


async def test_read_output_error_is_a_task_error(tasks: TaskService) -> None:
    def broken() -> str:
        raise RuntimeError("pipe closed")

    producer = FakeProducer()
    hooks = attrs.evolve(producer.hooks(), read_output=broken)

    async def run() -> TaskHooks:
        return hooks

    await tasks.start(TaskSpec("bash", "x", None, run))
    with pytest.raises(TaskError, match="pipe closed"):
        tasks.read("bash-1")


# ---------------------------------------------------------------- waits


async def test_wait_returns_terminal_snapshot(tasks: TaskService, autojump_clock: object) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    seen = collect(tasks)
    async with trio.open_nursery() as nursery:

        async def finish_later() -> None:
            await trio.sleep(5)
            producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))

        nursery.start_soon(finish_later)
        snap = await tasks.wait("bash-1", 30)
    assert snap.status == "completed"
    assert snap.ended_at == 5
    assert snap.reported
    assert trio.current_time() == 5
    # The waiter claimed delivery at settlement, so listeners see it reported.
    assert [s.reported for s in seen] == [True]
    # Waiting on a terminal task returns at once.
    again = await tasks.wait("bash-1", 30)
    assert again.status == "completed"
    assert trio.current_time() == 5


async def test_wait_timeout_returns_live_snapshot_without_stopping(tasks: TaskService, autojump_clock: object) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    snap = await tasks.wait("bash-1", 2.5)
    assert snap.status == "running"
    assert not snap.reported
    assert trio.current_time() == 2.5
    assert producer.cancels == []
    assert tasks.get("bash-1").status == "running"
    zero = await tasks.wait("bash-1", 0)
    assert zero.status == "running"


async def test_wait_rejects_bad_timeouts(tasks: TaskService) -> None:
    await tasks.start(spec(FakeProducer()))
    for bad in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="timeout"):
            await tasks.wait("bash-1", bad)


async def test_cancelling_the_waiter_cancels_only_the_wait(tasks: TaskService, autojump_clock: object) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    seen = collect(tasks)
    with trio.move_on_after(1) as bound:
        await tasks.wait("bash-1", 100)
    assert bound.cancelled_caught
    assert trio.current_time() == 1
    assert tasks.get("bash-1").status == "running"
    assert producer.cancels == []
    # The aborted waiter unregistered synchronously: it does not claim the result.
    producer.finish(TaskOutcome("completed"))
    await trio.testing.wait_all_tasks_blocked()
    assert [s.reported for s in seen] == [False]


async def _wait_cancelled_in_the_settling_step(tasks: TaskService, order: str) -> tuple[list[TaskSnapshot], bool]:
    """Cancel a waiter in the very task step in which its task settles, in the given order.

    Both actions run in the producer's watcher task with no checkpoint between
    them: ``cancel-then-settle`` cancels from ``done`` right before it returns
    the outcome, ``settle-then-cancel`` from a completion listener.  Returns
    what the wait returned and whether the waiter saw Cancelled.
    """
    release = trio.Event()
    waiter_scope = trio.CancelScope()

    async def done() -> TaskOutcome:
        await release.wait()
        if order == "cancel-then-settle":
            waiter_scope.cancel()
        return TaskOutcome("completed", output="result")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=lambda reason: None, done=done)

    await tasks.start(TaskSpec("job", "job", None, run))
    if order == "settle-then-cancel":
        tasks.on_task_done(lambda snapshot: waiter_scope.cancel())
    returned: list[TaskSnapshot] = []

    async def waiter() -> None:
        with waiter_scope:
            returned.append(await tasks.wait("job-1", 100))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    return returned, waiter_scope.cancelled_caught


@pytest.mark.parametrize("order", ["cancel-then-settle", "settle-then-cancel"])
async def test_a_waiter_cancelled_as_its_task_settles_gets_the_result_or_leaves_it_unreported(
    tasks: TaskService, order: str
) -> None:
    seen = collect(tasks)
    returned, cancelled = await _wait_cancelled_in_the_settling_step(tasks, order)
    (settled,) = seen
    final = tasks.get("job-1")
    # Exactly one of: the wait returned the result, or the task stays unreported
    # (so the completion listeners were told it still needs delivery).
    delivered = [s.status for s in returned] == ["completed"]
    assert delivered != (not settled.reported and not final.reported)
    if order == "cancel-then-settle":
        # The waiter unregistered when its wait was aborted: it claims nothing.
        assert cancelled and not delivered
    else:
        # The waiter was handed the result before the cancel: it returns it.
        assert delivered and final.reported and settled.reported
        assert tasks.read("job-1").output == "result"


async def test_a_wait_whose_timeout_coincides_with_a_cancel_returns_a_result_handed_to_it(
    tasks: TaskService, autojump_clock: trio.testing.MockClock
) -> None:
    """The timeout has passed when the wait is aborted: the wait returns, so it keeps its claim."""
    release = trio.Event()
    waiter_scope = trio.CancelScope()

    async def done() -> TaskOutcome:
        await release.wait()
        # In one step: the wait's timeout has passed (not yet processed by the
        # run loop), the waiter is cancelled, and the task settles.
        autojump_clock.jump(10)
        waiter_scope.cancel()
        return TaskOutcome("completed")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=lambda reason: None, done=done)

    await tasks.start(TaskSpec("job", "job", None, run))
    seen = collect(tasks)
    returned: list[TaskSnapshot] = []

    async def waiter() -> None:
        with waiter_scope:
            returned.append(await tasks.wait("job-1", 5))
            await trio.lowlevel.checkpoint()  # the cancellation arrives here

    async with trio.open_nursery() as nursery:
        nursery.start_soon(waiter)
        await trio.testing.wait_all_tasks_blocked()
        release.set()
    assert waiter_scope.cancelled_caught
    assert [s.status for s in returned] == ["completed"]
    assert [s.reported for s in seen] == [True]


# ---------------------------------------------------------------- kill


async def test_kill_requests_cancellation(tasks: TaskService, autojump_clock: object) -> None:
    producer = FakeProducer(settle_on_cancel=False)
    await tasks.start(spec(producer))
    snap = await tasks.kill("bash-1", reason="no longer needed")
    assert snap.status == "stopping"
    assert snap.kill_reason == "no longer needed"
    assert snap.reported
    assert producer.cancels == ["no longer needed"]
    # A second kill while stopping does not call cancel again.
    assert (await tasks.kill("bash-1")).status == "stopping"
    assert producer.cancels == ["no longer needed"]
    producer.finish(TaskOutcome("killed", detail={"signal": "SIGTERM"}))
    final = await tasks.wait("bash-1", 1)
    assert final.status == "killed"
    # Terminal tasks report their existing status.
    assert (await tasks.kill("bash-1")).status == "killed"
    assert producer.cancels == ["no longer needed"]


async def test_kill_of_a_completed_task_reports_its_status(tasks: TaskService) -> None:
    producer = FakeProducer()
    await tasks.start(spec(producer))
    producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))
    await trio.testing.wait_all_tasks_blocked()
    snap = await tasks.kill("bash-1")
    assert snap.status == "completed"
    assert producer.cancels == []


async def test_kill_whose_cancel_raises_fails_and_leaves_the_task_running(
    tasks: TaskService,
) -> None:
    producer = FakeProducer(cancel_error=ProcessLookupError("no such process"))
    await tasks.start(spec(producer))
    with pytest.raises(TaskError, match="no such process") as info:
        await tasks.kill("bash-1")
    assert not isinstance(info.value, TaskNotFoundError)
    snap = tasks.get("bash-1")
    assert snap.status == "running"
    assert not snap.reported


# ---------------------------------------------------------------- settlement


async def test_first_outcome_wins_after_forced_failure(
    tasks: TaskService, root: Scope, caplog: pytest.LogCaptureFixture
) -> None:
    owner = await make_owner(root)
    producer = FakeProducer(cancel_error=RuntimeError("kill(2) failed"))
    await tasks.start(spec(producer, owner))
    seen = collect(tasks)
    waiter: list[TaskSnapshot] = []
    async with trio.open_nursery() as nursery:

        async def wait() -> None:
            waiter.append(await tasks.wait("bash-1", 100, owner))

        nursery.start_soon(wait)
        await trio.testing.wait_all_tasks_blocked()
        with caplog.at_level(logging.WARNING, logger="trio_harness.tasks"):
            await owner.scope.close()  # does not wait for the orphaned done
    assert [s.status for s in waiter] == ["failed"]
    assert len(seen) == 1
    forced = seen[0]
    assert forced.status == "failed"
    assert forced.owner_disposed
    assert forced.error is not None
    assert "cancel raised" in forced.error
    assert "orphaned" in forced.error
    assert "cancel raised" in str(forced.detail["error"])
    assert any("orphaned" in r.getMessage() and r.levelno == logging.WARNING for r in caplog.records)
    assert not producer.released
    # The producer's own outcome arrives later: ignored, no second notification.
    producer.finish(TaskOutcome("completed"))
    await trio.testing.wait_all_tasks_blocked()
    assert len(seen) == 1


async def test_done_that_raises_is_contained_as_failed(tasks: TaskService, caplog: pytest.LogCaptureFixture) -> None:
    async def done() -> TaskOutcome:
        raise RuntimeError("contract violation")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=lambda reason: None, done=done)

    with caplog.at_level(logging.ERROR, logger="trio_harness.tasks"):
        await tasks.start(TaskSpec("bash", "x", None, run))
        snap = await tasks.wait("bash-1", 1)
    assert snap.status == "failed"
    assert snap.error is not None
    assert "contract violation" in snap.error


# ---------------------------------------------------------------- owner lifecycle


async def test_owner_disposal_cancels_awaits_and_forgets_its_tasks(
    tasks: TaskService, root: Scope, autojump_clock: object
) -> None:
    owner = await make_owner(root)
    bystander = await make_owner(root, "s2")
    stream = FakeProducer(settle_on_cancel=False)
    final = FakeProducer(stream=False)
    other = FakeProducer()
    await tasks.start(spec(stream, owner))
    await tasks.start(spec(final, owner, kind="subagent"))
    await tasks.start(spec(other, bystander))
    seen = collect(tasks)

    async def slow_stop() -> None:
        # The stream producer needs 5 s to release its resources.
        while not stream.cancels:
            await trio.sleep(0.1)
        await trio.sleep(5)
        stream.finish(TaskOutcome("killed"))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(slow_stop)
        start = trio.current_time()
        await owner.scope.close()
        assert trio.current_time() - start >= 5
        assert stream.released  # close() returned only after done settled
        assert final.released
    assert stream.cancels == ["owner disposed"]
    assert final.cancels == ["owner disposed"]
    assert {s.id for s in seen} == {"bash-1", "subagent-1"}
    assert all(s.owner_disposed for s in seen)
    # Snapshots are removed; the bystander is untouched.
    for task_id in ("bash-1", "subagent-1"):
        with pytest.raises(TaskNotFoundError):
            tasks.get(task_id, owner)
    assert tasks.list(owner) == []
    assert tasks.get("bash-2", bystander).status == "running"
    assert other.cancels == []


async def test_disposal_uses_the_exact_owner_object(tasks: TaskService, root: Scope) -> None:
    old = await make_owner(root, "s1")
    await tasks.start(spec(FakeProducer(), old))
    # A replacement agent reusing the session id, with its own scope.
    new = await make_owner(root, "s1")
    replacement = FakeProducer()
    await tasks.start(spec(replacement, new))
    assert [s.id for s in tasks.list(new)] == ["bash-1", "bash-2"]  # same session
    await old.scope.close()
    assert replacement.cancels == []
    assert [s.id for s in tasks.list(new)] == ["bash-2"]
    assert tasks.owner_of("bash-2") is new


async def test_one_exit_callback_per_owner(tasks: TaskService, root: Scope) -> None:
    owner = await make_owner(root)
    before = len(owner.scope._callbacks)
    for _ in range(3):
        await tasks.start(spec(FakeProducer(), owner))
    assert len(owner.scope._callbacks) == before + 1


async def test_owner_disposal_cancels_a_start_in_progress(tasks: TaskService, root: Scope) -> None:
    owner = await make_owner(root)
    started = trio.Event()

    async def hanging_run() -> TaskHooks:
        started.set()
        await trio.sleep_forever()

    await tasks.start(spec(FakeProducer(), owner))  # registers the exit callback
    errors: list[BaseException] = []

    async def starter() -> None:
        try:
            await tasks.start(TaskSpec("bash", "hangs", owner, hanging_run))
        except TaskStartError as exc:
            errors.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(starter)
        await started.wait()
        await owner.scope.close()
    assert len(errors) == 1
    assert "not started" in str(errors[0])
    # The refused start consumed no number.
    assert (await tasks.start(spec(FakeProducer()))).id == "bash-2"


async def test_owner_disposal_picks_up_a_start_committed_meanwhile(
    tasks: TaskService, root: Scope, autojump_clock: object
) -> None:
    owner = await make_owner(root)
    await tasks.start(spec(FakeProducer(), owner))
    started = trio.Event()
    late = FakeProducer()

    async def stubborn_run() -> TaskHooks:
        started.set()
        with trio.CancelScope(shield=True):  # ignores cancellation and commits
            await trio.sleep(1)
        return late.hooks()

    async with trio.open_nursery() as nursery:
        nursery.start_soon(tasks.start, TaskSpec("bash", "late", owner, stubborn_run))
        await started.wait()
        await owner.scope.close()
    assert late.cancels == ["owner disposed"]
    assert late.released


# ---------------------------------------------------------------- service teardown


async def test_service_exit_kills_live_tasks(autojump_clock: object) -> None:
    async with open_scope("app") as app:
        owner = await make_owner(app)
        unowned = FakeProducer()
        owned = FakeProducer(stream=False)
        stubborn = FakeProducer(cancel_error=RuntimeError("EPERM"))
        seen: list[TaskSnapshot] = []
        async with open_task_service() as tasks:
            tasks.attach_controller("test")
            tasks.on_task_done(seen.append)
            await tasks.start(spec(unowned))
            await tasks.start(spec(owned, owner, kind="subagent"))
            await tasks.start(spec(stubborn, kind="pty"))
            finished = await tasks.start(spec(FakeProducer()))
        assert unowned.cancels == ["task service closed"]
        assert owned.cancels == ["task service closed"]
        assert unowned.released
        assert owned.released
        statuses = {s.id: s.status for s in seen}
        assert statuses == {
            "bash-1": "killed",
            "subagent-1": "killed",
            "pty-1": "failed",
            "bash-2": "killed",
        }
        assert finished.id == "bash-2"
        with pytest.raises(TaskStartError, match="closed"):
            await tasks.start(spec(FakeProducer()))
        # The owner's exit callback was detached from its still-live scope.
        assert all(callback is None for callback in owner.scope._callbacks)
        await owner.scope.close()


# ---------------------------------------------------------------- listeners


async def test_listeners_are_contained_and_called_once(tasks: TaskService, caplog: pytest.LogCaptureFixture) -> None:
    calls: list[str] = []

    def broken(snapshot: TaskSnapshot) -> None:
        calls.append("broken")
        raise RuntimeError("listener bug")

    tasks.on_task_done(broken)
    tasks.on_task_done(lambda snapshot: calls.append(f"ok {snapshot.id} {snapshot.status}"))
    producer = FakeProducer()
    await tasks.start(spec(producer))
    with caplog.at_level(logging.ERROR, logger="trio_harness.tasks"):
        producer.finish(TaskOutcome("completed"))
        snap = await tasks.wait("bash-1", 1)
    assert snap.status == "completed"
    assert calls == ["broken", "ok bash-1 completed"]
    assert any("listener" in r.getMessage() and r.exc_info for r in caplog.records)


async def test_listener_bound_to_a_scope_is_removed_with_it(tasks: TaskService, root: Scope) -> None:
    plugin_scope = await root.open_child("plugin")
    seen: list[str] = []
    remove = tasks.on_task_done(lambda snapshot: seen.append(snapshot.id), scope=plugin_scope)
    first = FakeProducer()
    await tasks.start(spec(first))
    first.finish(TaskOutcome("completed"))
    await tasks.wait("bash-1", 1)
    await plugin_scope.close()
    second = FakeProducer()
    await tasks.start(spec(second))
    second.finish(TaskOutcome("completed"))
    await tasks.wait("bash-2", 1)
    assert seen == ["bash-1"]
    remove()  # idempotent after the scope removed it


async def test_started_task_survives_the_starting_scope(tasks: TaskService, root: Scope) -> None:
    # The producer's done runs in the service nursery, not the tool's scope.
    tool_scope = await root.open_child("tool-call")
    producer = FakeProducer()
    snap = await tool_scope.start(_start_and_report, tasks, producer)
    assert snap.id == "bash-1"
    await tool_scope.close()
    assert tasks.get("bash-1").status == "running"
    assert producer.cancels == []


async def _start_and_report(
    tasks: TaskService, producer: FakeProducer, task_status: trio.TaskStatus[TaskSnapshot]
) -> None:
    task_status.started(await tasks.start(spec(producer)))


async def test_service_hosted_in_a_closing_scope_still_awaits_its_tasks(
    autojump_clock: object,
) -> None:
    # As in the harness: the service is entered into a scope, whose closing
    # cancels the scope's nursery.  Teardown must still cancel and await every
    # producer instead of losing the watchers to that cancellation.
    async with open_scope("app") as app:
        host = await app.open_child("tasks")
        tasks = await host.enter_async_context(open_task_service())
        tasks.attach_controller("test")
        slow = FakeProducer(settle_on_cancel=False)
        orphan = FakeProducer(cancel_error=RuntimeError("EPERM"))
        await tasks.start(spec(slow))
        await tasks.start(spec(orphan))
        seen = collect(tasks)

        async def release_later() -> None:
            while not slow.cancels:
                await trio.sleep(0.1)
            await trio.sleep(3)
            slow.finish(TaskOutcome("killed"))

        app.spawn(release_later)
        with trio.fail_after(20):
            await host.close()
        assert slow.released
        assert {s.id: s.status for s in seen} == {"bash-1": "killed", "bash-2": "failed"}


# ---------------------------------------------------------------- teardown bound


def _stubborn(label: str = "ignores cancellation") -> tuple[TaskSpec, list[str | None]]:
    """An unowned-by-default spec whose producer ignores its cancel and shields its done."""
    cancels: list[str | None] = []

    async def done() -> TaskOutcome:
        with trio.CancelScope(shield=True):
            await trio.sleep(1000)
        return TaskOutcome("completed")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=cancels.append, done=done)

    return TaskSpec("job", label, None, run), cancels


async def test_owner_disposal_gives_up_a_task_that_does_not_stop_within_the_teardown_timeout(
    tasks: TaskService, root: Scope, autojump_clock: object, caplog: pytest.LogCaptureFixture
) -> None:
    owner = FakeOwner(id="s1", scope=await root.open_child("agent:s1", teardown_timeout=5))
    stubborn, cancels = _stubborn()
    await tasks.start(attrs.evolve(stubborn, owner=owner))
    seen = collect(tasks)
    began = trio.current_time()
    with caplog.at_level(logging.WARNING):
        await owner.scope.close()
    assert trio.current_time() - began == 5  # the bound, not the producer's 1000 s
    assert cancels == ["owner disposed"]
    (given_up,) = seen
    assert given_up.status == "failed" and given_up.terminal
    assert given_up.owner_disposed
    assert given_up.error is not None and "teardown timeout (5 s)" in given_up.error
    assert "disposal of 's1'" in given_up.error
    assert any("teardown timeout" in r.getMessage() for r in caplog.records if r.name == "trio_harness.tasks")
    with pytest.raises(TaskNotFoundError):
        tasks.get("job-1", owner)


async def test_a_start_outliving_an_abandoned_disposal_is_refused_and_its_work_cancelled(
    tasks: TaskService, root: Scope, autojump_clock: object
) -> None:
    owner = FakeOwner(id="s1", scope=await root.open_child("agent:s1", teardown_timeout=5))
    await tasks.start(spec(FakeProducer(), owner))  # attaches the disposal callback
    late = FakeProducer()
    started = trio.Event()

    async def stubborn_run() -> TaskHooks:
        started.set()
        with trio.CancelScope(shield=True):  # ignores cancellation for 10 s
            await trio.sleep(10)
        return late.hooks()

    errors: list[TaskStartError] = []

    async def starter() -> None:
        with pytest.raises(TaskStartError) as info:
            await tasks.start(TaskSpec("bash", "late", owner, stubborn_run))
        errors.append(info.value)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(starter)
        await started.wait()
        await owner.scope.close()
        assert trio.current_time() == 5
    assert trio.current_time() == 10
    (error,) = errors
    assert "closed while it was starting" in str(error)
    assert late.cancels == ["owner disposed"]
    assert [s.id for s in tasks.list()] == []


async def test_service_exit_gives_up_tasks_that_do_not_stop_within_its_teardown_timeout(
    autojump_clock: object,
) -> None:
    never = FakeProducer(settle_on_cancel=False)
    seen: list[TaskSnapshot] = []
    async with open_task_service(TaskRuntimeOptions(teardown_timeout=7)) as tasks:
        tasks.attach_controller("test")
        tasks.on_task_done(seen.append)
        await tasks.start(spec(never))
        began = trio.current_time()
    assert trio.current_time() - began == 7
    assert never.cancels == ["task service closed"]
    (given_up,) = seen
    assert given_up.status == "failed"
    assert given_up.error is not None and "teardown timeout (7 s)" in given_up.error
    assert not never.released  # its done was cancelled, not completed


@pytest.mark.parametrize("bad", [0, -1.0, float("nan"), True, "30"])
async def test_open_task_service_validates_its_options(bad: object) -> None:
    for option in ("per_owner_cap", "finished_cap", "teardown_timeout"):
        if option != "teardown_timeout" and isinstance(bad, float):
            continue
        options: dict[str, Any] = {option: bad}
        with pytest.raises(ValueError, match=option):
            async with open_task_service(TaskRuntimeOptions(**options)):
                pass  # pragma: no cover


async def test_harness_teardown_timeout_bounds_an_agents_disposal_and_reports_the_given_up_task(
    autojump_clock: object,
) -> None:
    async with open_test_harness(builtin_tools=["tasks"], teardown_timeout=5) as h:
        notices: list[Notice] = []
        h.bus.on("task/done", notices.append)
        handle = await h.agents.create()
        stubborn, cancels = _stubborn()
        await h.tasks.start(attrs.evolve(stubborn, owner=handle.agent))
        unowned, _ = _stubborn("unowned")
        await h.tasks.start(unowned)
        began = trio.current_time()
        await handle.dispose()
        assert trio.current_time() - began == 5
        assert cancels == ["owner disposed"]
        (notice,) = notices
        assert isinstance(notice.subject, TaskSnapshot)
        assert notice.subject.id == "job-1"
        assert notice.subject.status == "failed"
        assert notice.subject.error is not None and "teardown timeout (5 s)" in notice.subject.error
        exit_began = trio.current_time()
    # The service's exit gave up the unowned task after the same bound; its
    # shielded done then still held the exit (a nursery waits for its tasks).
    assert [n.subject.id for n in notices] == ["job-1", "job-2"]
    second = notices[1].subject
    assert isinstance(second, TaskSnapshot)
    assert second.status == "failed"
    assert second.error is not None and "task service's teardown" in second.error
    assert trio.current_time() - exit_began >= 5


# ---------------------------------------------------------------- retention


async def test_reported_finished_tasks_beyond_the_cap_are_forgotten_oldest_collected_first(root: Scope) -> None:
    released: list[int] = []
    async with open_task_service(TaskRuntimeOptions(finished_cap=2)) as tasks:
        tasks.attach_controller("test")
        owner = await make_owner(root)
        producers = [FakeProducer() for _ in range(8)]
        for n, producer in enumerate(producers, start=1):
            hooks = attrs.evolve(producer.hooks(), release=functools.partial(released.append, n))

            async def run(hooks: TaskHooks = hooks) -> TaskHooks:
                return hooks

            await tasks.start(TaskSpec("bash", "x", owner, run))

        def kept() -> list[int]:
            return [int(s.id.removeprefix("bash-")) for s in tasks.list(owner)]

        for n in (1, 2, 3, 4, 5, 7, 8):  # bash-6 keeps running
            producers[n - 1].finish(TaskOutcome("completed"))
        await trio.testing.wait_all_tasks_blocked()
        tasks.read("bash-1", owner)
        tasks.read("bash-2", owner)
        assert kept() == [1, 2, 3, 4, 5, 6, 7, 8]  # at the cap: nothing goes
        # A third reported task: the oldest collected one goes.
        assert tasks.claim_report("bash-3")  # only notified (a notice claimed it)
        assert (kept(), released) == ([2, 3, 4, 5, 6, 7, 8], [1])
        await tasks.wait("bash-4", 1, owner)  # collected: the oldest collected goes, not the notified bash-3
        assert (kept(), released) == ([3, 4, 5, 6, 7, 8], [1, 2])
        tasks.read("bash-3", owner)  # notified, now collected too
        assert (kept(), released) == ([3, 4, 5, 6, 7, 8], [1, 2])
        assert tasks.claim_report("bash-5")
        assert (kept(), released) == ([3, 5, 6, 7, 8], [1, 2, 4])
        with pytest.raises(TaskNotFoundError, match="unknown task 'bash-4'"):
            tasks.get("bash-4", owner)
        # The running bash-6 was never pruned; killed, it is collected once it settles.
        await tasks.kill("bash-6", owner)
        await trio.testing.wait_all_tasks_blocked()
        assert (kept(), released) == ([5, 6, 7, 8], [1, 2, 4, 3])
        # bash-7 and bash-8 stayed while unreported; notified, they push out
        # the collected bash-6 first, then the oldest notified bash-5.
        assert tasks.claim_report("bash-7")
        assert (kept(), released) == ([5, 7, 8], [1, 2, 4, 3, 6])
        assert tasks.claim_report("bash-8")
        assert (kept(), released) == ([7, 8], [1, 2, 4, 3, 6, 5])
        await owner.scope.close()
    # Disposal forgets the rest without release (the producer's own cleanup runs).
    assert released == [1, 2, 4, 3, 6, 5]


async def test_a_release_hook_that_raises_is_logged(tasks: TaskService, caplog: pytest.LogCaptureFixture) -> None:
    def broken() -> None:
        raise OSError("spill file busy")

    producer = FakeProducer()
    hooks = attrs.evolve(producer.hooks(), release=broken)

    async def run() -> TaskHooks:
        return hooks

    await tasks.start(TaskSpec("bash", "x", None, run))
    producer.finish(TaskOutcome("completed"))
    await trio.testing.wait_all_tasks_blocked()
    tasks.read("bash-1")
    with caplog.at_level(logging.ERROR, logger="trio_harness.tasks"):
        for _ in range(tasks.finished_cap):
            more = FakeProducer()
            snap = await tasks.start(spec(more))
            more.finish(TaskOutcome("completed"))
            await tasks.wait(snap.id, 1)
    assert any("release of task bash-1 failed" in r.getMessage() and r.exc_info for r in caplog.records)
    with pytest.raises(TaskNotFoundError):
        tasks.get("bash-1")
