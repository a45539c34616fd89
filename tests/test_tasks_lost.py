"""Background tasks that died with their process are reported as lost on resume
(docs/tasks.rst, "After a restart"; issue 24 item 5), on JSONL and on PostgreSQL."""

from __future__ import annotations

import signal
import subprocess
import sys
import uuid
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _fakes import FakeOwner, FakeProducer, make_owner
from _postgres import Cluster, postgres_cluster
from _util import UNASKED_BASH, WAIT, group_alive, read_line, wait_until

from trio_harness import AgentOptions, ScriptedModel, SubagentOptions
from trio_harness._errors import TaskNotFoundError, TaskStartError
from trio_harness._scope import Scope, open_scope
from trio_harness.agents import Agent
from trio_harness.session import _events as ev
from trio_harness.tasks import TaskOutcome, TaskService, TaskSpec, open_task_service
from trio_harness.tasks._render import LOST_ERROR, parse_notice, render_notice
from trio_harness.testing import assert_balanced, open_test_harness
from trio_harness.tools._lost_tasks import scan_tasks
from trio_harness.tools._resume_tasks import INTERRUPTED_NOTE

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

LOST_WORDS = "The process that ran it stopped before the task reported"


def notices(agent: Agent) -> list[str]:
    """The task notices in the agent's log (inserted into its inbox, claimed or not)."""
    return [
        m.text
        for e in agent.session.events
        if isinstance(e, ev.InboxSpliced)
        for m in e.inserted
        if m.origin == "task-notice"
    ]


def lost_notices(agent: Agent) -> list[str]:
    return [text for text in notices(agent) if LOST_WORDS in text]


def results(agent: Agent) -> dict[str, str]:
    return {e.call_id: e.content for e in agent.session.events if isinstance(e, ev.ToolResult)}


async def kill_owner_process(root: Path | str, pidfile: Path) -> int:
    """Run ``_task_owner_proc.py`` until its turn ended, SIGKILL it; return its task's process group."""
    script = Path(__file__).with_name("_task_owner_proc.py")
    process = await trio.lowlevel.open_process(
        [sys.executable, str(script), str(root), "s", str(pidfile)], stdout=subprocess.PIPE
    )
    assert process.stdout is not None
    try:
        assert await read_line(process.stdout, "the harness process") == b"ready\n"
        group = int(pidfile.read_text())
        assert group_alive(group)  # bash-1 runs
        process.send_signal(signal.SIGKILL)
        with trio.fail_after(WAIT):  # a bound on a real process, not a sleep
            await process.wait()
            # The lifeline kills the dead harness's commands: the task's process is gone.
            while group_alive(group):
                await trio.sleep(0.02)
    finally:
        with trio.CancelScope(shield=True):
            if process.returncode is None:
                process.kill()
                await process.wait()
            await process.stdout.aclose()
    assert process.returncode == -signal.SIGKILL
    return group


@pytest.fixture(params=["jsonl", "postgres"])
def owner_store(request: pytest.FixtureRequest, tmp_path: Path) -> Path | str:
    """Where the owner process stores its session: a JSONL root, or a fresh PostgreSQL database."""
    if request.param == "jsonl":
        return tmp_path / "root"
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    database = f"lost_{uuid.uuid4().hex[:12]}"
    cluster.psql(f"CREATE DATABASE {database}")
    return cluster.dsn(database)


async def test_a_task_of_a_killed_process_is_reported_lost_once(tmp_path: Path, owner_store: Path | str) -> None:
    root, pidfile = owner_store, tmp_path / "pid"
    await kill_owner_process(root, pidfile)

    # A new process resumes the session: bash-1 (never reported) is lost,
    # bash-2 (collected by task_output before the kill) is not reported again.
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    {"name": "task_output", "arguments": {"task_id": "bash-1"}},
                    {"name": "task_list", "arguments": {}},
                    {"name": "task_kill", "arguments": {"task_id": "bash-1"}},
                ]
            },
            {"text": "bash-1 was lost; I will check the server"},
        ]
    )
    async with open_test_harness(model, store=root, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        handle = await h.agents.resume("s")
        agent = handle.agent
        reported_before = len(notices(agent)) - len(lost_notices(agent))  # bash-2's, by the first process: 0 or 1
        assert reported_before in (0, 1)
        (pending,) = agent.inbox.next_step  # injected: resuming does not start a turn
        assert pending.origin == "task-notice" and agent.status == "idle"
        assert pending.text == (
            f"background task bash-1 [bash] lost — echo $$ > {pidfile}; sleep 1000. {LOST_WORDS}: "
            "its output and result are gone. Check what it did before running it again."
        )
        snapshot = h.tasks.get("bash-1", caller=agent)
        assert (snapshot.status, snapshot.kind, snapshot.error) == ("lost", "bash", LOST_ERROR)
        assert snapshot.terminal and snapshot.reported
        with pytest.raises(TaskNotFoundError):
            h.tasks.get("bash-2", caller=agent)
        with pytest.raises(TaskNotFoundError):  # only its owner sees it
            h.tasks.get("bash-1")

        agent.followup("what about the server?")
        await agent.when_idle()
        claimed = [e for e in agent.session.events if isinstance(e, ev.UserMessage) and e.origin == "task-notice"]
        # bash-2's completion notice may have reached the first process's inbox before its task_output
        # did (checkpoints make that window wider on PostgreSQL): it is never reported by this one.
        assert [e.text for e in claimed if "bash-2" not in e.text] == [pending.text]
        output, listing, kill = list(results(agent).values())[-3:]
        assert output == f"error: {LOST_ERROR}\n[status: lost]"
        assert listing == f"bash-1 [bash] lost — echo $$ > {pidfile}; sleep 1000"
        assert kill.endswith("[status: lost]") and "had already ended" in kill
        assert len(lost_notices(agent)) == 1 and len(notices(agent)) - len(lost_notices(agent)) == reported_before
        await handle.dispose()

    # Resuming again: the notice is in the log, so it is not repeated; the id still answers.
    async with open_test_harness(store=root, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s", resume=True) as agent:
            assert list(agent.inbox.next_step) == []
            assert len(lost_notices(agent)) == 1 and len(notices(agent)) - 1 == reported_before
            assert h.tasks.get("bash-1", caller=agent).status == "lost"
            assert_balanced(agent.session.events)


async def test_a_task_stopped_by_a_clean_close_is_reported_lost_and_ids_are_not_reused(tmp_path: Path) -> None:
    start = {"name": "bash", "arguments": {"command": "sleep 1000", "description": "server", "run_in_background": True}}
    first = ScriptedModel([{"tool_calls": [start]}, {"text": "started"}])
    async with open_test_harness(first, store=tmp_path, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("start the server")
            await agent.when_idle()
            assert list(results(agent).values()) == ["started background task bash-1"]
    # The harness closed with bash-1 running: its disposal stopped it, no notice went out.

    again = {"name": "bash", "arguments": {"command": "sleep 1000", "run_in_background": True}}
    second = ScriptedModel([{"tool_calls": [again]}, {"text": "restarted"}])
    async with open_test_harness(second, store=tmp_path, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s", resume=True) as agent:
            (pending,) = agent.inbox.next_step
            assert pending.text.startswith("background task bash-1 [bash] lost — server. ")
            agent.followup("restart it")
            await agent.when_idle()
            # The new task does not take the id the model already knows.
            assert list(results(agent).values())[-1] == "started background task bash-2"
            assert [s.id for s in h.tasks.list(caller=agent)] == ["bash-1", "bash-2"]
            await h.tasks.kill("bash-2", caller=agent)


async def test_a_background_subagent_of_an_earlier_run_resumes_under_its_id(tmp_path: Path) -> None:
    call = {"name": "subagent", "arguments": {"prompt": "long job", "description": "review", "run_in_background": True}}
    model = ScriptedModel([{"tool_calls": [call]}, {"text": "delegated"}])
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}])))
    tools = ["tasks", "subagent"]
    async with open_test_harness(model, store=tmp_path, builtin_tools=tools, subagent_options=options) as h:
        async with h.agents.open(session_id="parent") as agent:
            agent.followup("delegate the review")
            await agent.when_idle()
            assert h.tasks.get("subagent-1", caller=agent).status == "running"
            (child_id,) = [a.id for a in h.agents.owned_by("parent")]
    # The harness closed with the child mid-turn: the next run of the owner carries the task on.

    child_model = ScriptedModel([{"text": "review done"}])
    options = SubagentOptions(child_options=AgentOptions(model=child_model))
    owner_model = ScriptedModel([{"text": "noted"}])
    async with open_test_harness(owner_model, store=tmp_path, builtin_tools=tools, subagent_options=options) as h:
        async with h.agents.open(session_id="parent", resume=True) as agent:
            assert h.tasks.get("subagent-1", caller=agent).status in ("running", "completed")
            await wait_until(lambda: bool(notices(agent)) and agent.status == "idle")
            await agent.when_idle()
            (notice,) = notices(agent)
            assert notice.startswith("background task subagent-1 [subagent] completed — review.")
            assert h.tasks.read("subagent-1", caller=agent).output == "review done"  # what task_output returns
            snapshot = h.tasks.get("subagent-1", caller=agent)
            assert (snapshot.status, snapshot.detail["session"]) == ("completed", child_id)
            # The notice woke the owner: a turn answered it.
            assert [e.text for e in agent.session.events if isinstance(e, ev.AssistantMessage)][-1] == "noted"
        child = (await h.sessions.load_events(child_id))[1]
        assert [e.text for e in child if isinstance(e, ev.UserMessage)] == ["long job", INTERRUPTED_NOTE]
        assert [e.reason for e in child if isinstance(e, ev.TurnEnd)] == ["aborted", "completed"]
        assert_balanced(child)
        # Reported now: the next resume neither resumes it again nor calls it lost.
        async with h.agents.open(session_id="parent", resume=True) as agent:
            assert list(agent.inbox.next_step) == []
            with pytest.raises(TaskNotFoundError):
                h.tasks.get("subagent-1", caller=agent)


async def test_a_resumed_subagent_task_can_be_killed_under_its_id(tmp_path: Path) -> None:
    call = {"name": "subagent", "arguments": {"prompt": "long job", "run_in_background": True}}
    model = ScriptedModel([{"tool_calls": [call]}, {"text": "delegated"}])
    options = SubagentOptions(child_options=AgentOptions(model=ScriptedModel([{"hang": True}] * 2)))
    tools = ["tasks", "subagent"]
    async with open_test_harness(model, store=tmp_path, builtin_tools=tools, subagent_options=options) as h:
        async with h.agents.open(session_id="parent") as agent:
            agent.followup("delegate")
            await agent.when_idle()
        async with h.agents.open(session_id="parent", resume=True) as agent:  # in the same process
            await wait_until(lambda: [a.status for a in h.agents.owned_by("parent")] == ["running"])
            snapshot = await h.tasks.kill("subagent-1", caller=agent, reason="enough")
            assert snapshot.id == "subagent-1"
            await h.tasks.wait("subagent-1", 60.0, caller=agent)
            assert h.tasks.get("subagent-1", caller=agent).status == "killed"
            assert h.agents.owned_by("parent") == []


async def test_a_task_reported_before_the_restart_is_not_reported_again(tmp_path: Path) -> None:
    start = {"name": "bash", "arguments": {"command": "echo hi", "run_in_background": True}}
    model = ScriptedModel([{"tool_calls": [start]}, {"text": "started"}])
    async with open_test_harness(model, store=tmp_path, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            with trio.fail_after(WAIT):  # a real process
                await agent.when_idle()
                while not notices(agent):
                    await trio.sleep(0.01)
    async with open_test_harness(store=tmp_path, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s", resume=True) as agent:
            # Its completion notice (queued, or claimed by a turn the exit cut short) is the only notice.
            (notice,) = notices(agent)
            assert "bash-1 [bash] completed" in notice
            assert all("lost" not in m.text for m in agent.inbox.next_step)
            with pytest.raises(TaskNotFoundError):
                h.tasks.get("bash-1", caller=agent)


async def test_a_fork_does_not_report_its_parents_tasks(tmp_path: Path) -> None:
    start = {"name": "bash", "arguments": {"command": "sleep 1000", "run_in_background": True}}
    model = ScriptedModel([{"tool_calls": [start]}, {"text": "started"}])
    async with open_test_harness(model, store=tmp_path, builtin_tools=True, bash_tool_options=UNASKED_BASH) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            boundary = len(agent.session)
        await h.sessions.fork("s", boundary, "f")
        async with h.agents.open(session_id="f", resume=True) as fork:
            assert list(fork.inbox.next_step) == []
            with pytest.raises(TaskNotFoundError):
                h.tasks.get("bash-1", caller=fork)
        async with h.agents.open(session_id="s", resume=True) as agent:
            (pending,) = agent.inbox.next_step  # in the same process: its disposal stopped the task
            assert pending.text.startswith("background task bash-1 [bash] lost — sleep 1000. ")


# ------------------------------------------------------------------ the log scan and the service


def _call(seq: int, call_id: str, name: str, arguments: str) -> ev.ToolCallRequested:
    return ev.ToolCallRequested(seq=seq, ts=0.0, turn=1, step=1, call_id=call_id, name=name, arguments=arguments)


def _result(seq: int, call_id: str, name: str, content: str, is_error: bool = False) -> ev.ToolResult:
    return ev.ToolResult(
        seq=seq, ts=0.0, turn=1, step=1, call_id=call_id, name=name, content=content, is_error=is_error
    )


def test_the_scan_follows_starts_reads_kills_and_notices() -> None:
    events: list[Any] = [
        _call(0, "a", "bash", '{"command": "make", "run_in_background": true}'),
        _result(1, "a", "bash", "started background task bash-1"),
        _call(2, "b", "bash", '{"command": "sleep 9", "description": "nap"}'),
        _result(3, "b", "bash", "started background task bash-2"),
        _call(4, "c", "task_output", '{"task_id": "bash-1"}'),
        _result(5, "c", "task_output", "x\n[status: running]"),  # not a report
        _call(6, "d", "task_kill", '{"task_id": "bash-2"}'),
        _result(7, "d", "task_kill", "kill requested for task bash-2 [bash] — nap\n[status: stopping]"),
        _call(8, "e", "custom", "{}"),
        _result(9, "e", "custom", "started background task custom-1"),
        _result(10, "f", "custom", "started background task custom-2", is_error=True),  # an error starts nothing
        ev.UserMessage(
            seq=11, ts=0.0, turn=2, step=1, message_id="m", text='task_output("custom-1")', origin="task-notice"
        ),
        _result(12, "g", "x", "started background task bash-3"),
        ev.UserMessage(seq=13, ts=0.0, turn=2, step=1, message_id="n", text="background task bash-3 [bash] completed"),
    ]
    found = scan_tasks(events)
    assert {k: (t.kind, t.label, t.state) for k, t in found.items()} == {
        "bash-1": ("bash", "make", "open"),
        "bash-2": ("bash", "nap", "reported"),
        "custom-1": ("custom", "custom", "reported"),
        "bash-3": ("bash", "x", "open"),  # a user's message is no notice
    }


@pytest.fixture
async def tasks() -> AsyncIterator[TaskService]:
    async with open_task_service() as service:
        service.attach_controller("test")
        yield service


@pytest.fixture
async def root(tasks: TaskService) -> AsyncIterator[Scope]:
    async with open_scope("test") as scope:  # agent scopes close before the service
        yield scope


async def test_lost_notices_parse_back_within_any_limit(tasks: TaskService, root: Scope) -> None:
    owner = await make_owner(root, "s")
    snapshot = tasks.add_lost(owner, "bash-4", kind="bash", label="ü" * 50, error=LOST_ERROR)
    for limit in (None, 400, 200, 40, 21):
        text = render_notice(snapshot, limit)
        assert parse_notice(text) == ("bash-4", limit is None or limit >= 200), limit


async def test_the_service_keeps_lost_tasks_per_owner_until_its_scope_closes(tasks: TaskService, root: Scope) -> None:
    owner, other = await make_owner(root, "s"), await make_owner(root, "t")
    first = tasks.add_lost(owner, "bash-2", kind="bash", label="make", error=LOST_ERROR)
    assert tasks.add_lost(owner, "bash-2", kind="bash", label="other", error="x") == first
    for bad in ("bash-x", "bash-0", "make-2"):
        with pytest.raises(ValueError):
            tasks.add_lost(owner, bad, kind="bash", label="make", error=LOST_ERROR)
    read = tasks.read("bash-2", caller=owner)
    assert (read.output, read.snapshot.status, read.stream) == ("", "lost", False)
    assert (await tasks.wait("bash-2", 5, caller=owner)).status == "lost"
    assert (await tasks.kill("bash-2", caller=owner)).status == "lost"
    assert [s.id for s in tasks.list(caller=owner)] == ["bash-2"]
    for caller in (other, None):
        with pytest.raises(TaskNotFoundError):
            tasks.get("bash-2", caller=caller)
    # New tasks get ids past the lost ones and the reserved ones.
    producer = FakeProducer()
    assert (await tasks.start(spec(producer, other))).id == "bash-3"
    tasks.reserve_id("bash-9")
    tasks.reserve_id("not an id")
    assert (await tasks.start(spec(FakeProducer(), owner))).id == "bash-10"
    assert [s.id for s in tasks.list(caller=owner)] == ["bash-2", "bash-10"]
    await owner.scope.close()
    with pytest.raises(TaskNotFoundError):
        tasks.get("bash-2", caller=owner)
    with pytest.raises(TaskStartError):
        tasks.add_lost(owner, "bash-5", kind="bash", label="make", error=LOST_ERROR)


def spec(producer: FakeProducer, owner: FakeOwner) -> TaskSpec:
    return TaskSpec(kind="bash", label="sleep 10", owner=owner, run=producer.run)


async def test_a_producer_cannot_report_lost(tasks: TaskService, root: Scope) -> None:
    owner, producer = await make_owner(root, "s"), FakeProducer()
    started = await tasks.start(spec(producer, owner))
    producer.finish(TaskOutcome("lost"))
    snapshot = await tasks.wait(started.id, 5, caller=owner)
    assert snapshot.status == "failed" and "invalid outcome" in (snapshot.error or "")


async def test_adopt_registers_a_task_under_its_id_and_refuses_bad_or_taken_ones(
    tasks: TaskService, root: Scope
) -> None:
    owner, producer = await make_owner(root, "s"), FakeProducer(stream=False)
    adopted = tasks.adopt(spec(producer, owner), "bash-7", producer.hooks())
    assert (adopted.id, adopted.status, producer.runs) == ("bash-7", "running", 0)  # run() is not called
    for bad in ("bash-x", "make-7"):
        with pytest.raises(ValueError, match="is not <kind>-N"):
            tasks.adopt(spec(FakeProducer(), owner), bad, FakeProducer().hooks())
    with pytest.raises(TaskStartError, match="already registered"):
        tasks.adopt(spec(FakeProducer(), owner), "bash-7", FakeProducer().hooks())
    assert (await tasks.start(spec(FakeProducer(), owner))).id == "bash-8"  # its id is reserved
    producer.finish(TaskOutcome("completed", output="done"))
    assert (await tasks.wait("bash-7", 5, caller=owner)).status == "completed"
    assert tasks.read("bash-7", caller=owner).output == "done"
