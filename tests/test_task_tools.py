"""The task controller: task_output / task_list / task_kill, notices and rendering
(docs/guarantees.rst, "Background tasks")."""

from __future__ import annotations

import json
import re
from collections.abc import AsyncIterator
from typing import Any, cast

import attrs
import pytest
import trio
import trio.testing
from _fakes import FakeOwner, FakeProducer, make_owner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness import ScriptedModel, TaskToolOptions
from trio_harness._errors import TaskStartError
from trio_harness._scope import Scope, open_scope
from trio_harness.agents._tools import ToolContext, ToolOutput, ToolSet
from trio_harness.session import _events as ev
from trio_harness.tasks import (
    TASKS_GUIDANCE,
    TaskHooks,
    TaskOutcome,
    TaskRead,
    TaskService,
    TaskSnapshot,
    TaskSpec,
    TaskStatus,
    open_task_service,
)
from trio_harness.tasks._render import (
    cut_utf8,
    cut_utf8_tail,
    render_kill_result,
    render_notice,
    render_task_list,
    render_task_output,
    truncation_marker,
)
from trio_harness.testing import open_test_harness
from trio_harness.tools import TaskToolsPlugin, task_tools

# ---------------------------------------------------------------- helpers


def spec(
    producer: FakeProducer,
    owner: FakeOwner | None,
    *,
    kind: str = "bash",
    label: str = "make test",
    limit: int | None = None,
) -> TaskSpec:
    return TaskSpec(kind=kind, label=label, owner=owner, run=producer.run, output_limit_bytes=limit)


@pytest.fixture
async def tasks() -> AsyncIterator[TaskService]:
    async with open_task_service() as service:
        yield service


@pytest.fixture
async def root(tasks: TaskService) -> AsyncIterator[Scope]:
    async with open_scope("test") as scope:
        yield scope


@pytest.fixture
async def toolset() -> ToolSet:
    return ToolSet()


async def load(root: Scope, tasks: TaskService, toolset: ToolSet, **options: Any) -> TaskToolsPlugin:
    plugin = TaskToolsPlugin(tasks, toolset, TaskToolOptions(**options))
    await root.load(plugin)
    return plugin


async def call(toolset: ToolSet, agent: FakeOwner, name: str, **args: Any) -> ToolOutput:
    """Run a tool as the driver would: validate the JSON arguments, then call the handler."""
    tool = toolset.get(name)
    assert tool is not None, name
    ctx = ToolContext(agent=cast(Any, agent), agents=cast(Any, None), call_id="call-1", turn=1, step=1)
    result = await tool.handler(ctx, tool.validate(json.dumps(args)))
    return result if isinstance(result, ToolOutput) else ToolOutput(result)


async def settle() -> None:
    await trio.testing.wait_all_tasks_blocked()


# ---------------------------------------------------------------- tool definitions


async def test_three_tools_with_their_schemas(tasks: TaskService) -> None:
    tools = task_tools(tasks)
    assert [t.name for t in tools] == ["task_output", "task_list", "task_kill"]
    output, listing, kill = tools
    assert output.parameters["required"] == ["task_id"]
    assert set(output.parameters["properties"]) == {"task_id", "wait", "timeout_ms"}
    assert output.parameters["properties"]["timeout_ms"]["minimum"] == 0
    assert listing.parameters["properties"] == {}
    assert kill.parameters["required"] == ["task_id"]
    assert set(kill.parameters["properties"]) == {"task_id", "reason"}
    with pytest.raises(ValueError, match="schema"):
        output.validate('{"task_id": "bash-1", "timeout_ms": -1}')
    with pytest.raises(ValueError, match="schema"):
        output.validate("{}")


def test_tool_options_are_validated() -> None:
    service = cast(TaskService, object())
    with pytest.raises(ValueError, match="wait"):
        task_tools(service, TaskToolOptions(default_wait=-1))
    with pytest.raises(ValueError, match="output_limit_bytes"):
        task_tools(service, TaskToolOptions(output_limit_bytes=0))
    with pytest.raises(ValueError, match="output_limit_bytes"):
        TaskToolsPlugin(service, ToolSet(), TaskToolOptions(output_limit_bytes=-3))


async def test_plugin_registers_tools_guidance_and_controller(
    tasks: TaskService, root: Scope, toolset: ToolSet
) -> None:
    owner = await make_owner(root)
    with pytest.raises(TaskStartError, match="no task controller is attached"):
        await tasks.start(spec(FakeProducer(), owner))
    await load(root, tasks, toolset)
    assert [t.name for t in toolset.tools()] == ["task_output", "task_list", "task_kill"]
    assert toolset.prompt_sections() == (TASKS_GUIDANCE,)
    assert list(tasks.controllers) == ["task-tools"]
    await tasks.start(spec(FakeProducer(), owner))
    await root.unload("task-tools")
    assert toolset.tools() == ()
    assert toolset.prompt_sections() == ()
    assert list(tasks.controllers) == []
    with pytest.raises(TaskStartError, match="no task controller is attached"):
        await tasks.start(spec(FakeProducer(), owner))


def test_guidance_covers_the_protocol() -> None:
    text = TASKS_GUIDANCE.lower()
    for phrase in ("task id", "busy-poll", "task_output", "final answer", "task_kill", "same work"):
        assert phrase in text, phrase


# ---------------------------------------------------------------- task_output


async def test_task_output_reads_and_appends_status(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))
    assert (await call(toolset, owner, "task_output", task_id="bash-1")).content == ("[status: running]")
    producer.emit("compiling\n")
    assert (await call(toolset, owner, "task_output", task_id="bash-1")).content == ("compiling\n[status: running]")
    producer.emit("ok")
    producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))
    await settle()
    result = await call(toolset, owner, "task_output", task_id="bash-1")
    assert result.content == "ok\n[status: completed, exit code 0]"
    assert not result.is_error


async def test_task_output_final_task(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer(stream=False)
    await tasks.start(spec(producer, owner, kind="subagent", label="review the diff"))
    producer.finish(TaskOutcome("completed", output="LGTM"))
    await settle()
    for _ in range(2):
        result = await call(toolset, owner, "task_output", task_id="subagent-1")
        assert result.content == "LGTM\n[status: completed]"


async def test_task_output_wait_returns_when_the_task_ends(
    tasks: TaskService, root: Scope, toolset: ToolSet, autojump_clock: object
) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))

    async def finish_later() -> None:
        await trio.sleep(4)
        producer.emit("done\n")
        producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(finish_later)
        result = await call(toolset, owner, "task_output", task_id="bash-1", wait=True)
    assert result.content == "done\n[status: completed, exit code 0]"
    assert trio.current_time() == 4
    assert owner.notices == []  # the wait delivered it


async def test_task_output_wait_timeout_reports_running_and_does_not_stop(
    tasks: TaskService, root: Scope, toolset: ToolSet, autojump_clock: object
) -> None:
    await load(root, tasks, toolset, default_wait=30, max_wait=120)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))
    result = await call(toolset, owner, "task_output", task_id="bash-1", wait=True, timeout_ms=1500)
    assert result.content == "[status: running]"
    assert not result.is_error
    assert trio.current_time() == 1.5
    assert producer.cancels == []
    # Defaulted ...
    start = trio.current_time()
    await call(toolset, owner, "task_output", task_id="bash-1", wait=True)
    assert trio.current_time() - start == 30
    # ... and capped.
    start = trio.current_time()
    await call(toolset, owner, "task_output", task_id="bash-1", wait=True, timeout_ms=10**9)
    assert trio.current_time() - start == 120
    assert tasks.get("bash-1", owner).status == "running"


async def test_unknown_and_foreign_tasks_are_errors(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    alice = await make_owner(root, "alice")
    bob = await make_owner(root, "bob")
    await tasks.start(spec(FakeProducer(), alice))
    await tasks.start(spec(FakeProducer(), None, kind="pty"))  # unowned: not for agents
    for task_id in ("bash-1", "pty-1", "bash-9"):
        for name in ("task_output", "task_kill"):
            result = await call(toolset, bob, name, task_id=task_id)
            assert result.is_error
            assert result.content == f"unknown task '{task_id}'"
    assert tasks.get("bash-1", alice).status == "running"


# ---------------------------------------------------------------- task_list and task_kill


async def test_task_list(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    stranger = await make_owner(root, "s2")
    assert (await call(toolset, owner, "task_list")).content == "(no background tasks)"
    done = FakeProducer()
    await tasks.start(spec(done, owner, label="pytest -x\n  tests/"))
    await tasks.start(spec(FakeProducer(stream=False), owner, kind="subagent", label="review"))
    await tasks.start(spec(FakeProducer(), stranger, label="secret"))
    done.finish(TaskOutcome("completed"))
    await settle()
    assert (await call(toolset, owner, "task_list")).content == (
        "bash-1 [bash] completed — pytest -x tests/\nsubagent-1 [subagent] running — review"
    )


async def test_task_kill(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer(settle_on_cancel=False)
    await tasks.start(spec(producer, owner, label="sleep 100"))
    result = await call(toolset, owner, "task_kill", task_id="bash-1", reason="superseded")
    assert not result.is_error
    assert result.content.startswith("kill requested for task bash-1")
    assert result.content.endswith("[status: stopping]")
    assert producer.cancels == ["superseded"]
    producer.finish(TaskOutcome("killed", detail={"signal": "SIGTERM"}))
    await settle()
    again = await call(toolset, owner, "task_kill", task_id="bash-1")
    assert "had already ended" in again.content
    assert again.content.endswith("[status: killed, signal SIGTERM]")
    assert owner.notices == []  # killed by the model: already reported


async def test_task_kill_whose_cancel_raises_is_an_error(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    await tasks.start(spec(FakeProducer(cancel_error=PermissionError("EPERM")), owner))
    result = await call(toolset, owner, "task_kill", task_id="bash-1")
    assert result.is_error
    assert "EPERM" in result.content
    assert tasks.get("bash-1", owner).status == "running"


async def test_task_list_with_unicode_labels_respects_the_byte_limit(autojump_clock: object) -> None:
    async def run() -> TaskHooks:
        stop = trio.Event()

        async def done() -> TaskOutcome:
            await stop.wait()
            return TaskOutcome("killed")

        return TaskHooks(cancel=lambda reason: stop.set(), done=done)

    model = ScriptedModel([{"tool_calls": [{"name": "task_list", "arguments": {}}]}, {"text": "ok"}])
    async with (
        open_test_harness(
            model, builtin_tools=["tasks"], task_tool_options=TaskToolOptions(output_limit_bytes=61)
        ) as h,
        h.agents.open() as agent,
    ):
        for label in ("☃☃☃☃☃ 日本語のラベル", "🎉" * 20, "a\nb\u2028c\ud800"):
            await h.tasks.start(TaskSpec(kind="job", label=label, owner=agent, run=run))
        agent.followup("go")
        await agent.when_idle()
        (listing,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        data = listing.content.encode("utf-8")
        assert len(data) <= 61
        assert listing.content.startswith("job-1 [job] running — ☃")


# ---------------------------------------------------------------- notices


async def test_notice_wakes_an_idle_owner(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner, label="make test"))
    producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))
    await settle()
    assert owner.followups == [
        "background task bash-1 [bash] completed (exit code 0) — make test. "
        'Use task_output("bash-1") to read its result.'
    ]
    assert owner.injects == []
    assert owner.origins == ["task-notice"]
    assert tasks.get("bash-1", owner).reported


async def test_notice_is_injected_into_a_running_owner(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    owner.status = "running"
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))
    producer.finish(TaskOutcome("failed", detail={"exit_code": 2}))
    await settle()
    assert owner.followups == []
    assert len(owner.injects) == 1
    assert owner.injects[0].startswith("background task bash-1 [bash] failed (exit code 2)")
    assert owner.origins == ["task-notice"]


async def test_a_notice_is_logged_as_a_task_notice_and_the_model_reads_the_same_text(autojump_clock: object) -> None:
    """Woken (idle owner) or injected (running owner): origin task-notice in the log, user text for the model."""
    model = ScriptedModel(
        [
            {"text": "started"},
            {"text": "noticed"},
            # Trio time passes while the model answers: the agent is running.
            {"tool_calls": [{"name": "task_list", "arguments": {}}], "delay": 5},
            {"text": "listed"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["tasks"]) as h, h.agents.open() as agent:
        await agent.run("start it")
        woke = FakeProducer()
        await h.tasks.start(TaskSpec("job", "build", agent, woke.run))
        woke.finish(TaskOutcome("completed"))
        await trio.testing.wait_all_tasks_blocked()
        await agent.when_idle()  # the notice woke the idle agent: a turn of its own
        injected = FakeProducer()
        await h.tasks.start(TaskSpec("job", "test", agent, injected.run))
        agent.followup("list them")
        assert agent.status == "running"
        injected.finish(TaskOutcome("failed"))
        await trio.testing.wait_all_tasks_blocked()  # delivered while the model still answers
        await agent.when_idle()
        messages = [e for e in agent.session.events if isinstance(e, ev.UserMessage)]
    notices = [
        'background task job-1 [job] completed — build. Use task_output("job-1") to read its result.',
        'background task job-2 [job] failed — test. Use task_output("job-2") to read its result.',
    ]
    assert [(m.turn, m.text, m.mode, m.origin) for m in messages] == [
        (1, "start it", "followup", "user"),
        (2, notices[0], "followup", "task-notice"),
        (3, "list them", "followup", "user"),
        (3, notices[1], "inject", "task-notice"),
    ]
    # The model reads each notice as plain user text, exactly as before.
    seen = [[m.text for m in request.messages if m.role == "user"] for request in model.requests]
    assert seen[1] == ["start it", notices[0]]
    assert seen[3] == ["start it", notices[0], "list them", notices[1]]


async def test_quiet_mode_only_injects(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset, quiet=True)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))
    producer.finish(TaskOutcome("completed"))
    await settle()
    assert owner.followups == []
    assert len(owner.injects) == 1


async def test_wake_budget(tasks: TaskService, root: Scope, toolset: ToolSet, autojump_clock: object) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    other = await make_owner(root, "s2")

    async def complete(who: FakeOwner) -> None:
        producer = FakeProducer()
        await tasks.start(spec(producer, who))
        producer.finish(TaskOutcome("completed"))
        await settle()

    for _ in range(4):
        await complete(owner)
        await trio.sleep(1)
    assert (len(owner.followups), len(owner.injects)) == (3, 1)
    await complete(other)  # the budget is per owner
    assert len(other.followups) == 1
    await trio.sleep(60)  # the window moved on
    await complete(owner)
    assert (len(owner.followups), len(owner.injects)) == (4, 1)


async def test_no_notice_after_wait_or_kill(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    waited, killed = FakeProducer(), FakeProducer()
    await tasks.start(spec(waited, owner))
    await tasks.start(spec(killed, owner))
    results: list[ToolOutput] = []

    async def wait_for_it() -> None:
        results.append(await call(toolset, owner, "task_output", task_id="bash-1", wait=True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(wait_for_it)
        await settle()
        waited.emit("result")
        waited.finish(TaskOutcome("completed"))
    assert [r.content for r in results] == ["result\n[status: completed]"]
    await call(toolset, owner, "task_kill", task_id="bash-2")
    await settle()
    assert tasks.get("bash-2", owner).status == "killed"
    assert owner.notices == []


async def test_one_notice_per_task(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    # Two controllers (say a harness-wide and a custom one) deliver only once,
    # and reading a notified task does not notify again.
    await load(root, tasks, toolset)
    second = await root.open_child("other-controller")
    await second.load(TaskToolsPlugin(tasks, ToolSet()))
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner))
    producer.finish(TaskOutcome("completed"))
    await settle()
    assert len(owner.notices) == 1
    await call(toolset, owner, "task_output", task_id="bash-1")
    await settle()
    assert len(owner.notices) == 1


# ---------------------------------------------------------------- delivery races: exactly once


@pytest.mark.parametrize("order", ["settle-then-timeout", "timeout-then-settle"])
async def test_wait_timeout_coinciding_with_completion_delivers_once(
    tasks: TaskService, root: Scope, toolset: ToolSet, autojump_clock: trio.testing.MockClock, order: str
) -> None:
    """The task ends at the instant a task_output wait times out: the read or a notice, never both or neither."""
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    release = trio.Event()

    async def done() -> TaskOutcome:
        if order == "settle-then-timeout":
            # Forced: the task ends once the wait's timeout has elapsed, in the
            # same step, before the run loop processes that timeout.
            await trio.sleep(0.5)
            autojump_clock.jump(0.5)
        else:
            # Forced: released by a task woken by the same deadline as the
            # wait, so the wait has returned before this settles.
            await release.wait()
        return TaskOutcome("completed", output="result")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=lambda reason: None, done=done)

    async def release_at_the_timeout() -> None:
        await trio.sleep(1.0)
        release.set()

    await tasks.start(TaskSpec("job", "job", owner, run))
    async with trio.open_nursery() as nursery:
        nursery.start_soon(release_at_the_timeout)
        read = await call(toolset, owner, "task_output", task_id="job-1", wait=True, timeout_ms=1000)
    await settle()
    assert trio.current_time() == 1.0
    delivered_by_read = read.content == "result\n[status: completed]"
    assert delivered_by_read != (len(owner.notices) == 1)
    if order == "settle-then-timeout":
        assert delivered_by_read and owner.notices == []
    else:
        assert read.content == "[status: running]"
        assert len(owner.notices) == 1 and 'task_output("job-1")' in owner.notices[0]


@pytest.mark.parametrize("order", ["cancel-then-settle", "settle-then-cancel"])
async def test_a_cancelled_wait_racing_completion_delivers_once(
    tasks: TaskService, root: Scope, toolset: ToolSet, order: str
) -> None:
    """A task_output wait cancelled in the step its task settles: the result or a notice, exactly one."""
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    release = trio.Event()
    turn = trio.CancelScope()

    async def done() -> TaskOutcome:
        await release.wait()
        if order == "cancel-then-settle":
            turn.cancel()  # no checkpoint between this cancel and the settlement
        return TaskOutcome("completed", output="result")

    async def run() -> TaskHooks:
        return TaskHooks(cancel=lambda reason: None, done=done)

    await tasks.start(TaskSpec("job", "job", owner, run))
    if order == "settle-then-cancel":
        tasks.on_task_done(lambda snapshot: turn.cancel())
    reads: list[ToolOutput] = []

    async def model_turn() -> None:
        with turn:
            reads.append(await call(toolset, owner, "task_output", task_id="job-1", wait=True))

    async with trio.open_nursery() as nursery:
        nursery.start_soon(model_turn)
        await settle()
        release.set()
    await settle()
    delivered_by_read = [r.content for r in reads] == ["result\n[status: completed]"]
    assert delivered_by_read != (len(owner.notices) == 1)
    assert delivered_by_read == (order == "settle-then-cancel")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(cancel_before=st.lists(st.booleans(), min_size=1, max_size=4))
def test_waiters_cancelled_around_settlement_deliver_exactly_once(cancel_before: list[bool]) -> None:
    """Several waiters, each cancelled just before or just after settlement (all in one step).

    The task is reported exactly when some waiter returned the result; else
    exactly one notice is sent.
    """

    async def scenario() -> None:
        async with open_task_service() as tasks, open_scope("test") as root:
            toolset = ToolSet()
            await load(root, tasks, toolset)
            owner = await make_owner(root)
            release = trio.Event()
            scopes = [trio.CancelScope() for _ in cancel_before]

            async def done() -> TaskOutcome:
                await release.wait()
                for scope, before in zip(scopes, cancel_before, strict=True):
                    if before:
                        scope.cancel()
                return TaskOutcome("completed")

            async def run() -> TaskHooks:
                return TaskHooks(cancel=lambda reason: None, done=done)

            await tasks.start(TaskSpec("job", "job", owner, run))
            settled: list[TaskSnapshot] = []

            def after_settlement(snapshot: TaskSnapshot) -> None:
                settled.append(snapshot)
                for scope in scopes:
                    scope.cancel()

            tasks.on_task_done(after_settlement)
            returned: list[TaskSnapshot] = []

            async def waiter(scope: trio.CancelScope) -> None:
                with scope:
                    returned.append(await tasks.wait("job-1", 100, owner))

            async with trio.open_nursery() as nursery:
                for scope in scopes:
                    nursery.start_soon(waiter, scope)
                await settle()
                release.set()
            await settle()
            assert len(returned) == cancel_before.count(False)
            assert all(s.status == "completed" for s in returned)
            # Delivered to a waiter at settlement exactly when a waiter returned it.
            assert [s.reported for s in settled] == [bool(returned)]
            assert len(owner.notices) == (0 if returned else 1)

    trio.run(scenario)


async def test_no_notice_for_owner_disposal(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producers = [FakeProducer(), FakeProducer(stream=False)]
    for producer in producers:
        await tasks.start(spec(producer, owner))
    await owner.scope.close()
    assert all(p.cancels == ["owner disposed"] for p in producers)
    assert owner.notices == []


async def test_no_notice_to_a_closing_owner_or_a_replacement(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    old = await make_owner(root, "s1")
    producer = FakeProducer()
    await tasks.start(spec(producer, old))
    replacement = await make_owner(root, "s1")
    producer.finish(TaskOutcome("completed"))
    await settle()
    assert replacement.notices == []  # delivery uses the exact owner object
    assert len(old.notices) == 1


async def test_notice_respects_the_byte_limit(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner, label="é" * 500, limit=120))
    producer.finish(TaskOutcome("completed", detail={"exit_code": 0}))
    await settle()
    (notice,) = owner.notices
    assert len(notice.encode()) <= 120
    assert notice.startswith("background task bash-1")
    assert notice.endswith('Use task_output("bash-1") to read its result.')


async def test_tool_results_respect_the_byte_limit(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset, output_limit_bytes=200)
    owner = await make_owner(root)
    producer = FakeProducer()
    await tasks.start(spec(producer, owner, label="x" * 300))
    producer.emit("汉字" * 300)
    result = await call(toolset, owner, "task_output", task_id="bash-1")
    assert len(result.content.encode()) <= 200
    assert result.content.endswith("[status: running]")
    assert result.content.startswith("[… ")
    for name, args in (("task_list", {}), ("task_kill", {"task_id": "bash-1"})):
        out = await call(toolset, owner, name, **args)
        assert len(out.content.encode()) <= 200
    long_id = "bash-" + "9" * 400
    out = await call(toolset, owner, "task_output", task_id=long_id)
    assert out.is_error
    assert len(out.content.encode()) <= 200


@pytest.mark.parametrize("limit", [1, 6, 7, 12, 40])
async def test_every_task_tool_result_stays_within_a_tiny_limit_through_the_driver(limit: int) -> None:
    """Argument errors (worded by the driver for other tools), unknown ids and lists alike."""
    calls: list[dict[str, Any]] = [
        {"name": "task_output", "arguments": {"task_id": 5, "timeout_ms": "soon"}},  # schema error
        {"name": "task_kill", "arguments": {}},  # schema error: task_id missing
        {"name": "task_list", "arguments": "not json"},  # not a JSON object
        {"name": "task_output", "arguments": {"task_id": "bash-" + "9" * 200}},  # unknown task
        {"name": "task_kill", "arguments": {"task_id": "job-" + "7" * 200}},  # kill of an unknown task
        {"name": "task_list", "arguments": {}},
        {"name": "task_output", "arguments": {"task_id": "job-1"}},
        {"name": "task_kill", "arguments": {"task_id": "job-1"}},
    ]
    model = ScriptedModel([{"tool_calls": [call]} for call in calls] + [{"text": "done"}])
    async with (
        open_test_harness(
            model, builtin_tools=["tasks"], task_tool_options=TaskToolOptions(output_limit_bytes=limit)
        ) as h,
        h.agents.open() as agent,
    ):
        producer = FakeProducer()
        await h.tasks.start(TaskSpec("job", "☃ a label far longer than any limit " * 5, agent, producer.run))
        agent.followup("go")
        await agent.when_idle()
        out = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
    assert len(out) == len(calls)
    for result in out:
        assert len(result.content.encode("utf-8")) <= limit, result
    assert [r.is_error for r in out] == [True, True, True, True, True, False, False, False]
    if limit >= 40:
        # The driver's wording, cut on a character boundary.
        assert out[0].content == "error: arguments for tool 'task_outpu…"
        assert out[2].content.startswith("error: arguments are not valid JSON")


async def test_an_unlimited_plugin_words_argument_errors_as_the_driver_does(
    tasks: TaskService, root: Scope, toolset: ToolSet
) -> None:
    await load(root, tasks, toolset)
    tool = toolset.get("task_kill")
    assert tool is not None
    with pytest.raises(ValueError, match=r"^arguments for tool 'task_kill' do not match its schema"):
        tool.validate("{}")
    limited = task_tools(tasks, TaskToolOptions(output_limit_bytes=10_000))[2]
    ctx = ToolContext(agent=cast(Any, None), agents=cast(Any, None), call_id="c", turn=1, step=1)
    result = await limited.handler(ctx, limited.validate("{}"))
    assert isinstance(result, ToolOutput) and result.is_error
    assert result.content == "error: arguments for tool 'task_kill' do not match its schema: " + (
        "(root): 'task_id' is a required property"
    )


async def test_a_task_limit_also_bounds_its_line_in_task_list(
    tasks: TaskService, root: Scope, toolset: ToolSet
) -> None:
    await load(root, tasks, toolset)  # the plugin itself has no limit
    owner = await make_owner(root)
    await tasks.start(spec(FakeProducer(), owner, label="é" * 100, limit=40))
    await tasks.start(spec(FakeProducer(), owner, label="short"))
    listing = (await call(toolset, owner, "task_list")).content
    first, second = listing.split("\n")
    assert len(first.encode()) <= 40 and first.startswith("bash-1 [bash] running — éé") and first.endswith("…")
    assert second == "bash-2 [bash] running — short"


async def _drive(toolset: ToolSet, agent: FakeOwner, name: str, raw: str) -> ToolOutput:
    """Run one call exactly as the driver does, argument errors included."""
    tool = toolset.get(name)
    assert tool is not None
    try:
        args = tool.validate(raw)
    except ValueError as exc:
        return ToolOutput(f"error: {exc}", is_error=True)
    ctx = ToolContext(agent=cast(Any, agent), agents=cast(Any, None), call_id="c", turn=1, step=1)
    result = await tool.handler(ctx, args)
    return result if isinstance(result, ToolOutput) else ToolOutput(result)


_RAW_CALLS = [
    # (tool, raw arguments, whether the result is about the task, so its own limit applies too)
    ("task_output", '{"task_id": 5, "wait": "yes", "timeout_ms": -3}', False),
    ("task_output", "[1, 2]", False),
    ("task_output", '{"task_id": "bash-1"}', True),
    ("task_output", '{"task_id": "bash-404"}', False),
    ("task_kill", '{"reason": "' + "x" * 300 + '"}', False),
    ("task_kill", '{"task_id": "ghost-' + "é" * 100 + '"}', False),
    ("task_kill", '{"task_id": "bash-1", "reason": "done"}', True),
    ("task_list", "{", False),
    ("task_list", "{}", True),
]


@settings(max_examples=60, deadline=None)
@given(plugin_limit=st.integers(1, 300), task_limit=st.none() | st.integers(1, 300), label=st.text(min_size=1))
def test_task_tool_results_never_exceed_the_limit(plugin_limit: int, task_limit: int | None, label: str) -> None:
    async def scenario() -> None:
        async with open_task_service() as tasks, open_scope("test") as root:
            toolset = ToolSet()
            await load(root, tasks, toolset, output_limit_bytes=plugin_limit)
            owner = await make_owner(root)
            producer = FakeProducer()
            await tasks.start(spec(producer, owner, label=label if label.strip() else "x", limit=task_limit))
            producer.emit(label * 3)
            strictest = plugin_limit if task_limit is None else min(plugin_limit, task_limit)
            for name, raw, about_the_task in _RAW_CALLS:
                result = await _drive(toolset, owner, name, raw)
                limit = strictest if about_the_task else plugin_limit
                assert len(result.content.encode("utf-8", "replace")) <= limit, (name, raw, result)

    trio.run(scenario)


# ---------------------------------------------------------------- plugin reload


async def test_plugin_reload_keeps_tasks_and_isolation(tasks: TaskService, root: Scope, toolset: ToolSet) -> None:
    await load(root, tasks, toolset)
    alice = await make_owner(root, "alice")
    bob = await make_owner(root, "bob")
    producer = FakeProducer()
    await tasks.start(spec(producer, alice))
    await root.reload(TaskToolsPlugin(tasks, toolset))
    assert producer.cancels == []
    assert list(tasks.controllers) == ["task-tools"]
    assert [t.name for t in toolset.tools()] == ["task_output", "task_list", "task_kill"]
    assert (await call(toolset, bob, "task_list")).content == "(no background tasks)"
    assert (await call(toolset, bob, "task_output", task_id="bash-1")).is_error
    producer.emit("still here")
    result = await call(toolset, alice, "task_output", task_id="bash-1")
    assert result.content == "still here\n[status: running]"
    # Only the reloaded plugin's listener delivers: one notice.
    producer.finish(TaskOutcome("completed"))
    await settle()
    assert len(alice.notices) == 1
    assert bob.notices == []


# ---------------------------------------------------------------- rendering


def snapshot(
    status: TaskStatus = "running",
    *,
    task_id: str = "bash-3",
    kind: str = "bash",
    label: str = "make test",
    detail: dict[str, object] | None = None,
    error: str | None = None,
    kill_reason: str | None = None,
) -> TaskSnapshot:
    return TaskSnapshot(
        id=task_id,
        kind=kind,
        label=label,
        status=status,
        owner_id="s1",
        output_limit_bytes=None,
        started_at=0.0,
        detail=detail or {},
        error=error,
        kill_reason=kill_reason,
    )


def read(output: str, status: TaskStatus = "running", **kw: Any) -> TaskRead:
    return TaskRead(output=output, snapshot=snapshot(status, **kw), stream=True)


def test_cut_utf8_keeps_character_boundaries() -> None:
    assert cut_utf8("héllo", 2) == "h"
    assert cut_utf8("héllo", 3) == "hé"
    assert cut_utf8("héllo", 100) == "héllo"
    assert cut_utf8("héllo", 0) == ""
    assert cut_utf8_tail("héllo", 4) == "llo"
    assert cut_utf8_tail("hellé", 2) == "é"
    assert cut_utf8_tail("hellé", 1) == ""
    assert cut_utf8_tail("x", 0) == ""
    assert cut_utf8("a\ud800b", 10) == "a?b"  # lone surrogates cannot be encoded


def test_render_output_status_suffix_always() -> None:
    assert render_task_output(read(""), None) == "[status: running]"
    assert render_task_output(read("a\n"), None) == "a\n[status: running]"
    assert render_task_output(read("a"), None) == "a\n[status: running]"
    done = read("ok", "completed", detail={"exit_code": 0, "pid": 42})
    assert render_task_output(done, None) == "ok\n[status: completed, exit code 0]"
    failed = read("", "failed", error="cancel raised: boom; work may be orphaned")
    assert render_task_output(failed, None) == ("error: cancel raised: boom; work may be orphaned\n[status: failed]")
    killed = read("partial", "killed", kill_reason="superseded")
    assert render_task_output(killed, None) == "partial\nkill reason: superseded\n[status: killed]"


def test_render_output_keeps_the_tail_with_a_marker() -> None:
    text = "".join(f"line {i}\n" for i in range(100))
    out = render_task_output(read(text), 80)
    assert len(out.encode()) <= 80
    assert out.endswith("line 99\n[status: running]")
    match = re.match(r"\[… (\d+) bytes cut\]\n", out)
    assert match is not None
    kept = out[match.end() : -len("[status: running]")]
    assert text.endswith(kept)
    assert int(match.group(1)) == len(text.encode()) - len(kept.encode())


def test_render_output_reuses_the_producer_marker() -> None:
    body = "x" * 300
    out = render_task_output(read(truncation_marker(1000) + body), 100)
    assert out.count("bytes cut]") == 1
    match = re.match(r"\[… (\d+) bytes cut\]\n(x*)\n?\[status: running\]$", out)
    assert match is not None
    assert int(match.group(1)) == 1000 + 300 - len(match.group(2))
    # A producer marker that fits is left alone.
    small = truncation_marker(7) + "tail"
    assert render_task_output(read(small), 100) == small + "\n[status: running]"


def test_render_output_tiny_limits() -> None:
    suffix = "[status: running]"
    assert render_task_output(read("abc" * 50), len(suffix)) == suffix
    assert render_task_output(read("abc" * 50), len(suffix) + 1) == suffix
    assert render_task_output(read("abc" * 50), 5) == "[stat"
    assert render_task_output(read("abc"), 1) == "["


def test_render_task_list() -> None:
    assert render_task_list([]) == "(no background tasks)"
    assert render_task_list(
        [snapshot(), snapshot("completed", task_id="subagent-1", kind="subagent", label="a\nb")]
    ) == ("bash-3 [bash] running — make test\nsubagent-1 [subagent] completed — a b")


def test_render_notice() -> None:
    snap = snapshot("completed", detail={"exit_code": 0})
    assert render_notice(snap, None) == (
        "background task bash-3 [bash] completed (exit code 0) — make test. "
        'Use task_output("bash-3") to read its result.'
    )
    cut = render_notice(attrs.evolve(snap, label="L" * 1000), 100)
    assert len(cut.encode()) <= 100
    assert cut.startswith("background task bash-3 [bash] completed")
    assert "…" in cut
    assert cut.endswith('. Use task_output("bash-3") to read its result.')
    assert render_notice(snap, 20) == 'task_output("bash-3")'[:20]
    assert render_notice(snap, 21) == 'task_output("bash-3")'


def test_render_kill_result() -> None:
    assert render_kill_result(snapshot("stopping")) == (
        "kill requested for task bash-3 [bash] — make test\n[status: stopping]"
    )
    assert render_kill_result(snapshot("completed", detail={"exit_code": 1})) == (
        "task bash-3 [bash] had already ended — make test\n[status: completed, exit code 1]"
    )
    bounded = render_kill_result(snapshot("stopping", label="z" * 500), 60)
    assert len(bounded.encode()) <= 60
    assert bounded.endswith("\n[status: stopping]")


def _valid_utf8(text: str) -> bytes:
    return text.encode("utf-8")  # raises on lone surrogates


_statuses = st.sampled_from(["running", "stopping", "completed", "killed", "failed"])
_details = st.one_of(
    st.just({}),
    st.builds(lambda c: {"exit_code": c}, st.integers(-300, 300)),
    st.builds(lambda s: {"signal": s}, st.text(max_size=20)),
)
_fast = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@_fast
@given(text=st.text(), limit=st.integers(0, 400))
def test_cut_utf8_property(text: str, limit: int) -> None:
    head = cut_utf8(text, limit)
    tail = cut_utf8_tail(text, limit)
    for part in (head, tail):
        assert len(_valid_utf8(part)) <= max(limit, 0)
    assert text.startswith(head)
    assert text.endswith(tail)
    # Maximal: one more character would not fit.
    if head != text:
        assert len(_valid_utf8(text[: len(head) + 1])) > limit
    if tail != text:
        assert len(_valid_utf8(text[len(text) - len(tail) - 1 :])) > limit


_with_surrogates = st.lists(st.one_of(st.characters(), st.integers(0xD800, 0xDFFF).map(chr)), max_size=60).map("".join)


@_fast
@given(text=_with_surrogates, limit=st.integers(0, 200))
def test_lone_surrogates_never_leak(text: str, limit: int) -> None:
    for cut in (cut_utf8, cut_utf8_tail):
        assert len(_valid_utf8(cut(text, limit))) <= limit
    out = render_task_output(read(text, error=text), limit)
    assert len(_valid_utf8(out)) <= limit
    notice = render_notice(snapshot("completed", label=text), limit)
    assert len(_valid_utf8(notice)) <= limit
    _valid_utf8(render_task_output(read(text), None))
    _valid_utf8(render_task_list([snapshot(label=text)]))


@_fast
@given(
    output=st.text(),
    status=_statuses,
    detail=_details,
    error=st.one_of(st.none(), st.text()),
    marker=st.one_of(st.none(), st.integers(0, 10**9)),
    limit=st.integers(1, 600),
)
def test_render_output_property(
    output: str,
    status: TaskStatus,
    detail: dict[str, object],
    error: str | None,
    marker: int | None,
    limit: int,
) -> None:
    if marker is not None:
        output = truncation_marker(marker) + output
    rendered = render_task_output(read(output, status, detail=detail, error=error), limit)
    assert len(_valid_utf8(rendered)) <= limit
    assert rendered.count("bytes cut]") <= output.count("bytes cut]") + 1
    suffix = render_task_output(read("", status, detail=detail), None)
    assert suffix.startswith("[status: ")
    if len(suffix.encode()) <= limit:
        assert rendered.endswith(suffix)
    else:
        assert suffix.startswith(rendered)
    unlimited = render_task_output(read(output, status, detail=detail, error=error), None)
    assert unlimited.endswith(suffix)


@_fast
@given(
    kind=st.from_regex(r"[a-z][a-z0-9_-]{0,31}", fullmatch=True),
    number=st.integers(1, 10**6),
    label=st.text(min_size=1),
    status=_statuses,
    detail=_details,
    limit=st.integers(1, 600),
)
def test_render_notice_property(
    kind: str, number: int, label: str, status: TaskStatus, detail: dict[str, object], limit: int
) -> None:
    task_id = f"{kind}-{number}"
    snap = snapshot(status, task_id=task_id, kind=kind, label=label, detail=detail)
    notice = render_notice(snap, limit)
    assert len(_valid_utf8(notice)) <= limit
    minimal = f'task_output("{task_id}")'
    stable = len(f"background task {task_id}. Use {minimal} to read its result.".encode())
    if limit >= stable:
        assert notice.startswith(f"background task {task_id}")
        assert notice.endswith(f". Use {minimal} to read its result.")
    elif limit >= len(minimal):
        assert minimal in notice
    unlimited = render_notice(snap, None)
    assert task_id in unlimited
    assert minimal in unlimited


@_fast
@given(
    snaps=st.lists(
        st.builds(
            lambda n, label, status: snapshot(status, task_id=f"bash-{n}", label=label),
            st.integers(1, 99),
            st.text(min_size=1),
            _statuses,
        ),
        max_size=5,
    )
)
def test_render_task_list_property(snaps: list[TaskSnapshot]) -> None:
    text = render_task_list(snaps)
    if not snaps:
        assert text == "(no background tasks)"
        return
    lines = text.split("\n")
    assert len(lines) == len(snaps)
    for line, snap in zip(lines, snaps, strict=True):
        assert line.startswith(f"{snap.id} [bash] {snap.status} — ")
