"""Lifecycle scopes (``trio_harness._scope``); the event bus is in ``tests/test_bus.py``.

Every wait is on Trio's clock: ``autojump_clock`` where virtual time must pass,
``wait_all_tasks_blocked`` where a test needs everything else to be parked.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import cast

import attrs
import pytest
import trio
import trio.testing

from trio_harness._errors import PluginError, ScopeClosedError
from trio_harness._harness import open_harness
from trio_harness._scope import Scope, current_scope, open_scope
from trio_harness.model._scripted import ScriptedModel

# ------------------------------------------------------------------ helpers


def state(scope: Scope) -> str:
    """``open``, ``closing`` or ``closed`` (a function, so type checkers do not narrow it)."""
    return "closed" if scope.closed else "closing" if scope.closing else "open"


@attrs.define
class RecordingPlugin:
    """A plugin that logs its life: apply, a task, an exit callback; may fail."""

    name: str
    log: list[str]
    fail: bool = False
    applied: list[Scope] = attrs.field(factory=list)

    async def apply(self, scope: Scope) -> None:
        self.applied.append(scope)
        self.log.append(f"apply {self.name}")
        scope.add_exit_callback(lambda: self.log.append(f"unwind {self.name}"))

        async def task() -> None:
            try:
                await trio.sleep_forever()
            finally:
                self.log.append(f"task of {self.name} cancelled")

        scope.spawn(task)
        await trio.lowlevel.checkpoint()
        if self.fail:
            raise ValueError(f"bad config for {self.name}")


# ------------------------------------------------------------------ close order


async def test_children_close_newest_first_and_completely_before_parent_callbacks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    async def slow_exit(label: str) -> None:
        await trio.sleep(1)  # virtual time: the parent must wait for it
        order.append(label)

    async with open_scope() as root:
        root.add_exit_callback(lambda: order.append("root callback"))
        parent = await root.open_child("parent")
        parent.add_exit_callback(lambda: order.append("parent callback 1"))
        first = await parent.open_child("first")
        second = await parent.open_child("second")
        grandchild = await second.open_child("grandchild")
        first.add_exit_callback(lambda: slow_exit("first callback"))
        second.add_exit_callback(lambda: slow_exit("second callback"))
        grandchild.add_exit_callback(lambda: order.append("grandchild callback"))
        parent.add_exit_callback(lambda: order.append("parent callback 2"))
        assert list(parent.children) == [first, second]
        assert list(root.children) == [parent]
        assert first.parent is parent and first.name == "root/parent/first"

        await parent.close()

        assert order == [
            "grandchild callback",
            "second callback",
            "first callback",
            "parent callback 2",
            "parent callback 1",
        ]
        assert [state(s) for s in (parent, first, second, grandchild)] == ["closed"] * 4
        assert parent.children == () and root.children == ()
        assert state(root) == "open"
    assert order[-1] == "root callback"
    assert state(root) == "closed"


async def test_exit_callbacks_run_lifo_sync_and_async_each_awaited(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[int] = []

    def sync_callback(i: int) -> None:
        order.append(i)

    async def async_callback(i: int) -> None:
        # Sleep longer for later callbacks: run concurrently they would finish
        # shortest first, run one by one newest first they finish in LIFO order.
        await trio.sleep(i)
        order.append(i)

    async with open_scope() as root:
        scope = await root.open_child("s")
        for i in range(6):
            if i % 2:
                scope.add_exit_callback(functools.partial(async_callback, i))
            else:
                scope.add_exit_callback(functools.partial(sync_callback, i))
        started = trio.current_time()
        await scope.close()
        assert order == [5, 4, 3, 2, 1, 0]
        assert trio.current_time() - started == pytest.approx(5 + 3 + 1)


async def test_remover_unregisters_exactly_its_own_registration() -> None:
    order: list[str] = []

    def x() -> None:
        order.append("x")

    async with open_scope() as root:
        scope = await root.open_child("s")
        remove_first_x = scope.add_exit_callback(x)
        remove_y = scope.add_exit_callback(lambda: order.append("y"))
        scope.add_exit_callback(x)  # the same function, registered again
        remove_first_x()
        remove_first_x()  # idempotent
        await scope.close()
        assert order == ["x", "y"]  # the second registration of x survived
        remove_y()  # after close: a no-op, not an error
        assert order == ["x", "y"]


async def test_remover_after_callback_ran_does_not_touch_other_callbacks() -> None:
    order: list[str] = []
    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(lambda: order.append("kept"))
        remove = scope.add_exit_callback(lambda: order.append("removed"))
        remove()
        await scope.close()
    assert order == ["kept"]


async def test_close_cancels_the_nursery_and_awaits_its_tasks_before_callbacks(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    async def worker(label: str, task_status: trio.TaskStatus[str] = trio.TASK_STATUS_IGNORED) -> None:
        task_status.started(f"{label} ready")
        try:
            await trio.sleep_forever()
        finally:
            with trio.CancelScope(shield=True):
                await trio.sleep(3)  # a slow, shielded cleanup must be awaited
            order.append(f"{label} cleaned up")

    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(lambda: order.append("callback"))
        scope.spawn(worker, "spawned")
        assert await scope.start(worker, "started") == "started ready"
        await trio.testing.wait_all_tasks_blocked()
        assert order == []
        began = trio.current_time()
        await scope.close()
        assert sorted(order[:2]) == ["spawned cleaned up", "started cleaned up"]
        assert order[2:] == ["callback"]
        # Both tasks were cancelled together, then awaited.
        assert trio.current_time() - began == pytest.approx(3)


async def test_close_hooks_run_first_oldest_first_before_children_and_tasks() -> None:
    order: list[str] = []
    async with open_scope() as root:
        scope = await root.open_child("s")
        child = await scope.open_child("child")
        child.add_exit_callback(lambda: order.append("child callback"))

        async def task() -> None:
            try:
                await trio.sleep_forever()
            finally:
                order.append("task cancelled")

        scope.spawn(task)
        scope.add_exit_callback(lambda: order.append("callback"))
        scope.add_close_hook(lambda: order.append("hook 1"))

        async def hook_2() -> None:
            await trio.lowlevel.checkpoint()
            # Still before the children close; and the scope refuses new work.
            order.append(f"hook 2 (child closed={child.closed}, closing={scope.closing})")
            try:
                scope.spawn(trio.sleep_forever)
            except ScopeClosedError:
                order.append("spawn refused")

        scope.add_close_hook(hook_2)
        await trio.testing.wait_all_tasks_blocked()
        await scope.close()
    assert order == [
        "hook 1",
        "hook 2 (child closed=False, closing=True)",
        "spawn refused",
        "child callback",
        "task cancelled",
        "callback",
    ]


# ------------------------------------------------------------------ close() contract


async def test_close_is_idempotent_and_every_concurrent_closer_awaits_the_one_teardown() -> None:
    gate = trio.Event()
    runs: list[str] = []
    returned: list[int] = []

    async def slow() -> None:
        runs.append("start")
        await gate.wait()
        runs.append("end")

    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(slow)

        async def closer(i: int) -> None:
            await scope.close()
            assert state(scope) == "closed"  # nobody returns before the teardown finished
            returned.append(i)

        async with trio.open_nursery() as nursery:
            for i in range(3):
                nursery.start_soon(closer, i)
            await trio.testing.wait_all_tasks_blocked()
            assert runs == ["start"]  # one teardown, in progress
            assert returned == []
            assert state(scope) == "closing"
            gate.set()
        assert sorted(returned) == [0, 1, 2]
        assert runs == ["start", "end"]
        await scope.close()  # closed already: returns at once, runs nothing
        assert runs == ["start", "end"]


async def test_a_cancelled_closer_does_not_stop_the_teardown() -> None:
    gate = trio.Event()
    order: list[str] = []

    async def slow() -> None:
        await gate.wait()
        order.append("slow callback done")

    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(lambda: order.append("first callback"))
        scope.add_exit_callback(slow)
        closer_scope = trio.CancelScope()

        async def closer() -> None:
            with closer_scope:
                await scope.close()
            order.append("closer gave up")

        async with trio.open_nursery() as nursery:
            nursery.start_soon(closer)
            await trio.testing.wait_all_tasks_blocked()
            closer_scope.cancel()
        assert order == ["closer gave up"]
        assert state(scope) == "closing"
        gate.set()
        await scope.close()
        assert state(scope) == "closed"
        assert order == ["closer gave up", "slow callback done", "first callback"]


async def test_teardown_completes_when_the_owner_of_the_root_is_cancelled(
    autojump_clock: trio.testing.MockClock,
) -> None:
    order: list[str] = []

    async def slow(label: str) -> None:
        await trio.sleep(2)  # would raise Cancelled at once if teardown were not shielded
        order.append(label)

    with trio.CancelScope() as owner:
        async with open_scope() as root:
            root.add_exit_callback(lambda: slow("root callback"))
            child = await root.open_child("child")
            child.add_close_hook(lambda: slow("child hook"))
            child.add_exit_callback(lambda: slow("child callback"))
            owner.cancel()
            await trio.sleep_forever()
    assert owner.cancelled_caught
    assert order == ["child hook", "child callback", "root callback"]
    assert state(child) == "closed" and state(root) == "closed"


async def test_a_slow_async_callback_is_abandoned_after_teardown_timeout(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture
) -> None:
    order: list[str] = []

    async def stuck() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            order.append("stuck callback cancelled")
            raise

    caplog.set_level(logging.WARNING, logger="trio_harness.scope")
    async with open_scope() as root:
        scope = await root.open_child("slow", teardown_timeout=5)
        scope.add_exit_callback(lambda: order.append("registered first"))
        scope.add_exit_callback(stuck)
        scope.add_exit_callback(lambda: order.append("registered last"))
        began = trio.current_time()
        await scope.close()
        assert trio.current_time() - began == pytest.approx(5)
    assert order == ["registered last", "stuck callback cancelled", "registered first"]
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1
    assert "did not finish in 5" in warnings[0].getMessage()
    assert "root/slow" in warnings[0].getMessage()


@pytest.mark.parametrize("after_timeout", ["returns", "raises"])
async def test_a_callback_that_swallows_the_timeout_does_not_take_later_callbacks_down(
    autojump_clock: trio.testing.MockClock, caplog: pytest.LogCaptureFixture, after_timeout: str
) -> None:
    order: list[str] = []

    async def stubborn() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            order.append("stubborn gave up")
            if after_timeout == "raises":
                raise RuntimeError("cleanup failed") from None

    async def later() -> None:
        await trio.sleep(1)
        order.append("later done")

    caplog.set_level(logging.WARNING, logger="trio_harness.scope")
    async with open_scope() as root:
        scope = await root.open_child("s", teardown_timeout=5)
        scope.add_exit_callback(later)
        scope.add_exit_callback(stubborn)
        began = trio.current_time()
        await scope.close()
        assert trio.current_time() - began == pytest.approx(5 + 1)
    assert order == ["stubborn gave up", "later done"]
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "stubborn" in warnings[0]


async def test_a_raising_callback_is_logged_and_contained(caplog: pytest.LogCaptureFixture) -> None:
    order: list[str] = []

    def sync_boom() -> None:
        raise RuntimeError("sync boom")

    async def async_boom() -> None:
        await trio.lowlevel.checkpoint()
        raise KeyError("async boom")

    caplog.set_level(logging.ERROR, logger="trio_harness.scope")
    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(lambda: order.append("first"))
        scope.add_exit_callback(sync_boom)
        scope.add_exit_callback(lambda: order.append("middle"))
        scope.add_exit_callback(async_boom)
        scope.add_close_hook(sync_boom)
        await scope.close()  # does not raise
        assert scope.closed
    assert order == ["middle", "first"]
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    raised = sorted(str(r.exc_info[1]) for r in errors if r.exc_info)
    assert raised == ["'async boom'", "sync boom", "sync boom"]
    assert all("root/s" in r.getMessage() for r in errors)


async def test_new_work_is_refused_once_the_scope_closed() -> None:
    async with open_scope() as root:
        scope = await root.open_child("s")
        await scope.close()
        assert state(scope) == "closed" and scope.closing
        with pytest.raises(ScopeClosedError, match="root/s"):
            scope.spawn(trio.sleep_forever)
        with pytest.raises(ScopeClosedError, match="root/s"):
            await scope.start(trio.sleep_forever)
        with pytest.raises(ScopeClosedError):
            scope.add_exit_callback(lambda: None)
        with pytest.raises(ScopeClosedError):
            scope.add_close_hook(lambda: None)
        with pytest.raises(ScopeClosedError):
            await scope.open_child("late")
        with pytest.raises(ScopeClosedError):
            await scope.load(RecordingPlugin("late", []))
    with pytest.raises(ScopeClosedError, match="'root'"):
        root.spawn(trio.sleep_forever)


async def test_root_scope_close_raises_and_leaves_it_open() -> None:
    async with open_scope("app") as root:
        with pytest.raises(ScopeClosedError, match="async with"):
            await root.close()
        assert state(root) == "open"
        root.spawn(trio.sleep_forever)  # still usable; cancelled on exit
    assert state(root) == "closed"
    await root.close()  # after the block: closed already, returns


async def test_root_block_error_propagates_unwrapped_after_teardown() -> None:
    order: list[str] = []

    async def run() -> None:
        async with open_scope() as root:
            root.add_exit_callback(lambda: order.append("callback"))
            child = await root.open_child("child")
            child.add_exit_callback(lambda: order.append("child callback"))
            raise KeyError("from the block")

    with pytest.raises(KeyError, match="from the block"):
        await run()
    assert order == ["child callback", "callback"]


async def test_root_block_error_keeps_its_own_cause_and_context() -> None:
    cause = OSError("the cause")
    context = LookupError("handled when raised")

    async def run() -> None:
        async with open_scope() as root:
            await root.open_child("child")
            try:
                raise context
            except LookupError:
                raise KeyError("from the block") from cause

    with pytest.raises(KeyError, match="from the block") as info:
        await run()
    assert info.value.__cause__ is cause
    assert info.value.__context__ is context
    assert info.value.__suppress_context__


@pytest.mark.parametrize("timeout", [0, -1, math.nan])
async def test_open_scope_rejects_a_non_positive_teardown_timeout(timeout: float) -> None:
    with pytest.raises(ValueError, match="teardown_timeout"):
        async with open_scope(teardown_timeout=timeout):
            pass  # pragma: no cover


@pytest.mark.parametrize("timeout", [0, -1, math.nan, True, "30"])
async def test_open_harness_rejects_a_teardown_timeout_that_is_not_a_positive_number(timeout: object) -> None:
    with pytest.raises(ValueError, match="teardown_timeout must be a positive number"):
        async with open_harness(teardown_timeout=cast(float, timeout)):
            pass  # pragma: no cover


async def test_open_harness_teardown_timeout_reaches_every_scope(autojump_clock: object) -> None:
    async with open_harness(model=ScriptedModel([]), teardown_timeout=4.5, builtin_tools=False) as harness:
        agent = (await harness.agents.create()).agent
        assert harness.scope.teardown_timeout == 4.5
        assert agent.scope.teardown_timeout == 4.5
        assert harness.tasks.teardown_timeout == 4.5


# ------------------------------------------------------------------ async contexts


async def test_enter_async_context_enters_and_exits_in_one_scope_task_on_close() -> None:
    seen: list[tuple[str, trio.lowlevel.Task | None]] = []

    @asynccontextmanager
    async def resource() -> AsyncIterator[str]:
        seen.append(("enter", trio.lowlevel.current_task()))
        try:
            yield "the value"
        finally:
            seen.append(("exit", trio.lowlevel.current_task()))

    async with open_scope() as root:
        scope = await root.open_child("s")
        scope.add_exit_callback(lambda: seen.append(("callback", None)))
        assert await scope.enter_async_context(resource()) == "the value"
        await trio.testing.wait_all_tasks_blocked()
        assert [label for label, _ in seen] == ["enter"]  # held open until close
        await scope.close()
        assert [label for label, _ in seen] == ["enter", "exit", "callback"]
        holder = seen[0][1]
        assert holder is not None and holder is seen[1][1]  # same task in and out
        assert holder is not trio.lowlevel.current_task()  # a task of the scope


async def test_enter_async_context_can_hold_a_nursery_of_the_scope() -> None:
    # A nursery must be exited by the task that entered it: proves the same-task rule.
    cancelled: list[str] = []

    async def sleeper() -> None:
        try:
            await trio.sleep_forever()
        except trio.Cancelled:
            cancelled.append("sleeper")
            raise

    async with open_scope() as root:
        scope = await root.open_child("s")
        nursery = await scope.enter_async_context(trio.open_nursery())
        nursery.start_soon(sleeper)
        await trio.testing.wait_all_tasks_blocked()
        await scope.close()
        assert cancelled == ["sleeper"]


async def test_enter_async_context_raises_the_entering_error_and_keeps_the_scope_open() -> None:
    def open_device() -> None:
        raise OSError("cannot open")

    @asynccontextmanager
    async def broken() -> AsyncIterator[None]:
        open_device()
        yield  # pragma: no cover

    async with open_scope() as root:
        scope = await root.open_child("s")
        with pytest.raises(OSError, match="cannot open"):
            await scope.enter_async_context(broken())
        assert not scope.closing
        scope.spawn(trio.sleep_forever)


# ------------------------------------------------------------------ plugins


async def test_load_installs_a_plugin_into_its_own_child_scope() -> None:
    log: list[str] = []
    plugin = RecordingPlugin("tools", log)
    async with open_scope() as root:
        loaded = await root.load(plugin)
        assert loaded.plugin is plugin
        assert plugin.applied == [loaded.scope]
        assert loaded.scope.parent is root and loaded.scope in root.children
        assert loaded.scope.name == "root/plugin:tools"
        assert root.plugins == {"tools": loaded}
        assert log == ["apply tools"]
    # Closing the root unloads it too.
    assert loaded.scope.closed
    assert log == ["apply tools", "task of tools cancelled", "unwind tools"]


async def test_unload_closes_the_plugin_scope_and_unwinds_everything_it_registered() -> None:
    log: list[str] = []
    async with open_scope() as root:
        loaded = await root.load(RecordingPlugin("tools", log))
        await trio.testing.wait_all_tasks_blocked()
        await root.unload("tools")
        assert loaded.scope.closed
        assert log == ["apply tools", "task of tools cancelled", "unwind tools"]
        assert root.plugins == {} and root.children == ()
        with pytest.raises(PluginError, match="no plugin named 'tools'"):
            await root.unload("tools")


async def test_reload_unloads_the_old_version_completely_before_loading_the_new() -> None:
    log: list[str] = []
    async with open_scope() as root:
        old = await root.load(RecordingPlugin("tools", log))
        new_plugin = RecordingPlugin("tools", log)
        await trio.testing.wait_all_tasks_blocked()
        new = await root.reload(new_plugin)
        assert log == [
            "apply tools",
            "task of tools cancelled",
            "unwind tools",
            "apply tools",
        ]
        assert (state(old.scope), state(new.scope)) == ("closed", "open")
        assert new.plugin is new_plugin and root.plugins == {"tools": new}
        # Reloading a plugin that is not loaded just loads it.
        other = await root.reload(RecordingPlugin("other", log))
        assert root.plugins == {"tools": new, "other": other}


async def test_a_plugin_whose_apply_raises_is_unwound_and_reported() -> None:
    log: list[str] = []
    async with open_scope() as root:
        with pytest.raises(PluginError, match="plugin 'tools' failed to load") as info:
            await root.load(RecordingPlugin("tools", log, fail=True))
        assert isinstance(info.value.__cause__, ValueError)
        assert "bad config for tools" in str(info.value)
        # The task it spawned was cancelled and its exit callback ran.
        assert log == ["apply tools", "task of tools cancelled", "unwind tools"]
        assert root.plugins == {} and root.children == ()
        # The name is free again.
        loaded = await root.load(RecordingPlugin("tools", log))
        assert root.plugins == {"tools": loaded}


async def test_a_duplicate_plugin_name_is_refused_without_applying_it() -> None:
    log: list[str] = []
    async with open_scope() as root:
        first = await root.load(RecordingPlugin("tools", log))
        second = RecordingPlugin("tools", log)
        with pytest.raises(PluginError, match="already loaded"):
            await root.load(second)
        assert second.applied == []
        assert root.plugins == {"tools": first}
        assert list(root.children) == [first.scope] and state(first.scope) == "open"


async def test_open_child_cancelled_while_opening_leaves_no_child() -> None:
    closed: list[str] = []
    async with open_scope() as root:
        with trio.CancelScope() as cancelled:
            cancelled.cancel()
            await root.open_child("orphan")
        assert cancelled.cancelled_caught
        assert root.children == ()
        child = await root.open_child("kept")
        child.add_exit_callback(lambda: closed.append("kept"))
        assert list(root.children) == [child]
    assert closed == ["kept"]


# ------------------------------------------------------------------ current_scope


async def test_current_scope_names_the_scope_a_task_or_hook_runs_in() -> None:
    seen: dict[str, Scope | None] = {}

    async def note(where: str, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        seen[where] = current_scope()
        task_status.started()
        seen[f"{where} after start"] = current_scope()

    class Noting:
        name = "noting"

        async def apply(self, scope: Scope) -> None:
            seen["apply"] = current_scope()

    assert current_scope() is None
    async with open_scope("root") as root:
        seen["root block"] = current_scope()
        child = await root.open_child("child")
        assert current_scope() is None  # opening a child changes nothing for the caller
        child.spawn(note, "spawn")
        await child.start(note, "start")
        assert current_scope() is None
        loaded = await root.load(Noting())
        assert current_scope() is None
        grandchild = await child.open_child("grand")

        async def spawn_elsewhere() -> None:
            # A task of ``child`` spawning into ``grandchild``: the new task belongs to grandchild.
            grandchild.spawn(note, "spawned from another scope")

        child.spawn(spawn_elsewhere)
        child.add_close_hook(lambda: seen.__setitem__("close hook", current_scope()))
        child.add_exit_callback(lambda: seen.__setitem__("exit callback", current_scope()))
        root.add_close_hook(lambda: seen.__setitem__("root close hook", current_scope()))
        await trio.testing.wait_all_tasks_blocked()
        await child.close()
    assert current_scope() is None
    assert seen == {
        "root block": None,
        "spawn": child,
        "spawn after start": child,
        "start": child,
        "start after start": child,
        "apply": loaded.scope,
        "spawned from another scope": grandchild,
        "spawned from another scope after start": grandchild,
        "close hook": child,
        "exit callback": child,
        "root close hook": root,
    }


async def test_current_scope_is_restored_when_apply_raises() -> None:
    class Broken:
        name = "broken"

        async def apply(self, scope: Scope) -> None:
            raise RuntimeError("no")

    async with open_scope() as root:
        with pytest.raises(PluginError):
            await root.load(Broken())
        assert current_scope() is None


async def test_encloses_tells_whether_closing_the_scope_cancels_a_task() -> None:
    async with open_scope() as root:
        child = await root.open_child("child")
        other = await root.open_child("other")
        found: dict[str, tuple[bool, bool, bool]] = {}

        async def probe(where: str) -> None:
            task = trio.lowlevel.current_task()
            found[where] = (root.encloses(task), child.encloses(task), other.encloses(task))

        async def nested() -> None:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(probe, "nested in child")

        child.spawn(probe, "child task")
        child.spawn(nested)
        await trio.testing.wait_all_tasks_blocked()
        await probe("caller")
    assert found == {
        "child task": (True, True, False),
        "nested in child": (True, True, False),
        "caller": (False, False, False),
    }


async def test_close_hook_remover_unregisters_only_its_hook_and_keeps_the_list_short() -> None:
    async with open_scope() as root:
        child = await root.open_child("child")
        ran: list[int] = []

        def hook(i: int) -> Callable[[], None]:
            return lambda: ran.append(i)

        removers = [child.add_close_hook(hook(i)) for i in range(100)]
        for i, remove in enumerate(removers):
            if i != 50:
                remove()
                remove()  # idempotent
        assert len(child._close_hooks) == 51  # trailing removals are dropped
        removers[50]()
        assert child._close_hooks == []
        kept = child.add_close_hook(lambda: ran.append(-1))
        removers[50]()  # a stale remover does not touch a later hook
        await child.close()
        kept()  # after teardown: no effect
    assert ran == [-1]
