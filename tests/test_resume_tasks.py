"""A background subagent task outlives its process (issue 28 item 3; docs/tasks.rst, "After a restart").

A worker process (``tests/_subagent_worker.py``) starts a background subagent
and a background bash, then is killed with SIGKILL while the child's model
request is in flight; a new process resumes the owner: the subagent task
completes there with the same task id and the child's answer (the child is
told its run was interrupted), and the bash task is reported lost.  On JSONL
and on PostgreSQL, in both its modes (the pooled one: the killed worker's
leases are taken over once its liveness lock is gone).
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import psycopg
import pytest
import trio
from _postgres import Cluster, postgres_cluster
from _subagent_worker import CHILD_ANSWER
from _util import WAIT

from trio_harness.session import JsonlStore, PostgresStore
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced
from trio_harness.tools._resume_tasks import INTERRUPTED_NOTE, child_session_id

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

WORKER = Path(__file__).resolve().with_name("_subagent_worker.py")


@pytest.fixture(params=["jsonl", "postgres", "postgres-pooled"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return str(tmp_path / "store")
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    database = f"resume_{uuid.uuid4().hex[:12]}"
    cluster.psql(f"CREATE DATABASE {database}")
    return f"{cluster.dsn(database)}#trio_harness" + ("#pooled" if request.param == "postgres-pooled" else "")


async def load(where: str, session_id: str) -> tuple[ev.Event, ...]:
    """A session's stored events, read by a fresh store (as another process would)."""
    if where.startswith("postgresql://"):
        dsn, _, rest = where.partition("#")
        async with PostgresStore(dsn, schema=rest.partition("#")[0]) as store:
            return (await store.load(session_id)).events
    return (await JsonlStore(where).load(session_id)).events


async def run_worker(where: str, phase: str, tmp_path: Path, *, until: str) -> list[dict[str, Any]]:
    """Run a worker until it prints ``{"at": until}``; kill it with SIGKILL then if it still runs."""
    stderr_path = tmp_path / f"{phase}.stderr"
    with stderr_path.open("wb") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(WORKER), where, "owner", phase], stdout=subprocess.PIPE, stderr=stderr
        )
    assert process.stdout is not None
    markers: list[dict[str, Any]] = []
    buffer = b""
    try:
        with trio.fail_after(WAIT):  # a bound on a real process
            while not markers or markers[-1]["at"] != until:
                data = await process.stdout.receive_some(65536)
                assert data, f"the {phase} worker ended early: {stderr_path.read_text()}"
                buffer += data
                while b"\n" in buffer:
                    line, buffer = buffer.split(b"\n", 1)
                    markers.append(json.loads(line))
            if phase == "start":
                process.kill()  # SIGKILL: no teardown at all
            await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    errors = stderr_path.read_text(encoding="utf-8", errors="replace")
    assert "Traceback" not in errors, errors
    assert process.returncode == (-9 if phase == "start" else 0), errors
    return markers


async def test_a_subagent_task_resumed_in_a_new_process_after_a_kill_completes_under_its_id(
    where: str, tmp_path: Path
) -> None:
    (running,) = [m for m in await run_worker(where, "start", tmp_path, until="running") if m["at"] == "running"]
    (child_id,) = running["children"]
    markers = await run_worker(where, "resume", tmp_path, until="done")
    done = markers[-1]
    # The subagent carried on under its id, with the child's answer, as if nothing had happened.
    assert (done["status"], done["output"], done["detail"]["session"]) == ("completed", CHILD_ANSWER, child_id)
    lost, completed = sorted(done["notices"], key=lambda n: "subagent-1" in n)
    assert lost.startswith("background task bash-1 [bash] lost — server. ")  # bash cannot move
    assert completed.startswith("background task subagent-1 [subagent] completed — review.")
    assert done["tasks"] == [["bash-1", "lost"], ["subagent-1", "completed"]]
    assert done["answers"][-1] == "noted"  # the notice woke the owner, as a completion does
    child, owner = await load(where, child_id), await load(where, "owner")
    # The child's id is in the owner's log: derived from the owner's id and its subagent call (turn, step, id).
    (call,) = [e for e in owner if isinstance(e, ev.ToolCallRequested) and e.name == "subagent"]
    (result,) = [e for e in owner if isinstance(e, ev.ToolResult) and e.call_id == call.call_id]
    assert child_id == child_session_id("owner", result.turn, result.step, call.call_id)
    # The child resumed: the killed turn was closed as interrupted, then it was told so and answered.
    assert [e.text for e in child if isinstance(e, ev.UserMessage)] == ["review the code", INTERRUPTED_NOTE]
    assert [e.reason for e in child if isinstance(e, ev.TurnEnd)] == ["interrupted", "completed"]
    assert [e.text for e in child if isinstance(e, ev.AssistantMessage)][-1] == CHILD_ANSWER
    assert_balanced(child)
    assert_balanced(owner)
    if where.endswith("#pooled"):  # the second worker took over the killed one's leases (a new epoch), then let go
        dsn = where.partition("#")[0]
        with psycopg.connect(dsn, autocommit=True) as conn:
            leases = conn.execute("SELECT session_id, worker_id, epoch FROM trio_harness.leases").fetchall()
        assert {row[0]: (row[1], row[2]) for row in leases} == {"owner": (None, 2), child_id: (None, 2)}


async def test_a_child_whose_last_turn_failed_by_itself_is_not_run_again_only_a_cut_off_one_is() -> None:
    # A resumed background subagent continues only when its turn was cut off (interrupted by its
    # process's death, aborted by a disposal); a turn that ended by itself, failed or not, stands.
    from trio_harness import ScriptedModel
    from trio_harness.testing import open_test_harness
    from trio_harness.tools._resume_tasks import _answered

    model = ScriptedModel([{"error": {"message": "bad request", "code": "http-400"}}, {"text": "done"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("fail")
        await agent.when_idle()
        assert [e.reason for e in agent.session.events if isinstance(e, ev.TurnEnd)] == ["error"]
        assert _answered(agent)  # its failure is its outcome: reported, not run again
        agent.followup("answer")
        await agent.when_idle()
        assert _answered(agent)


async def test_a_resumed_child_whose_pending_followup_runs_after_due_maintenance_gets_no_interrupted_note(
    tmp_path: Path,
) -> None:
    # The child died mid-turn with a followup spliced: its resume starts a turn for that followup, after
    # the compaction due first (the child still idle meanwhile).  That turn continues the child: no note.
    from trio_harness import AgentOptions, ContextPolicy, ScriptedModel
    from trio_harness.session import SessionRegistry
    from trio_harness.testing import open_test_harness
    from trio_harness.tools._resume_tasks import _ResumedChild

    registry = SessionRegistry(JsonlStore(tmp_path))
    session = await registry.prepare_new("child", cwd=str(tmp_path))
    entry = registry.enter(session)
    first = ev.InboxMessage("m1", "review the code " + "x" * 4000)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(first,))
    session.append(ev.TurnStart, turn=1)
    session.append(ev.StepStart, turn=1, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=("m1",), outcome="claimed", turn=1)
    session.append(ev.UserMessage, turn=1, step=1, message_id="m1", text=first.text)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(ev.InboxMessage("m2", "and the tests"),))
    await registry.detach(entry)  # (the process died: recovery closes turn 1 interrupted)

    options = AgentOptions(context=ContextPolicy(window=1_000))  # over the threshold: maintenance is due
    model = ScriptedModel([{"text": "reviewed"}, {"text": "noted"}], summary="the user wants a review")
    async with open_test_harness(model, store=tmp_path) as h, h.agents.open() as owner:

        async def open_child(parent: object, session_id: str, resume: bool) -> Any:
            handle = await h.agents.resume(session_id, options=options)
            assert handle.agent.status == "idle"  # the compaction runs first
            return handle

        outcome = await _ResumedChild(owner, "child", "review the code", open_child).done()
    events = await load(str(tmp_path), "child")
    assert any(isinstance(e, ev.ContextCompacted) for e in events)
    assert [e.text for e in events if isinstance(e, ev.UserMessage)][1:] == ["and the tests"]
    assert [e.reason for e in events if isinstance(e, ev.TurnEnd)] == ["interrupted", "completed"]
    assert outcome.status == "completed", outcome
