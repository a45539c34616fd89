"""``harness.sessions.follow``: a session's stored events, live while another process appends (issue 28 item 4)."""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import trio
from _postgres import Cluster, postgres_cluster
from _util import WAIT

from trio_harness import InvalidSessionIdError, SessionNotFoundError
from trio_harness.model import ScriptedModel
from trio_harness.session import JsonlStore, PostgresStore, SessionRegistry, SessionStore
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

WORKER = Path(__file__).resolve().with_name("_crash_worker.py")


@pytest.fixture(params=["jsonl", "postgres"])
def where(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "jsonl":
        return str(tmp_path / "store")
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    database = f"follow_{uuid.uuid4().hex[:12]}"
    cluster.psql(f"CREATE DATABASE {database}")
    return f"{cluster.dsn(database)}#trio_harness"


def store_of(where: str) -> SessionStore:
    if where.startswith("postgresql://"):
        dsn, _, schema = where.partition("#")
        return PostgresStore(dsn, schema=schema)
    return JsonlStore(where)


async def test_follow_sees_the_events_another_process_appends(where: str, tmp_path: Path) -> None:
    responses = [
        {"tool_calls": [{"name": "work", "id": "c1", "arguments": {"ms": 30}}], "delay": 0.02},
        {"text": "first answer", "delay": 0.03},
        {"text": "second answer", "delay": 0.03},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    argv = [sys.executable, str(WORKER), where, "s", str(script), str(tmp_path / "side"), "one", "two"]
    store = store_of(where)
    registry = SessionRegistry(persistence=store)
    seen: list[ev.Event] = []
    seen_live: list[bool] = []
    async with trio.open_nursery() as nursery:
        if isinstance(store, PostgresStore):
            await nursery.start(_open, store)
        process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert process.stdout is not None
        with trio.fail_after(WAIT):  # a bound on a real process
            while not await store.exists("s"):  # stored from the worker's first flush on
                await trio.sleep(0.005)
            async for event in registry.follow("s", poll_interval=0.01):
                if event.type == "turn/end" and not seen_live:
                    seen_live.append(process.poll() is None)  # the writer was still running
                seen.append(event)
                if sum(isinstance(e, ev.TurnEnd) for e in seen) == 2:
                    break
            await process.wait()
        assert process.returncode == 0
        assert seen_live == [True]  # the first turn's end was read while the second turn ran
        stored = (await store.load("s")).events
        # Every event once, in order, as stored; the worker appended them while the follower read.
        assert seen == list(stored[: len(seen)])
        assert [e.seq for e in seen] == list(range(len(seen)))
        assert [e.text for e in seen if isinstance(e, ev.AssistantMessage) and e.text] == [
            "first answer",
            "second answer",
        ]
        # From an offset: the rest only.
        async for event in registry.follow("s", start=3):
            assert event == stored[3]
            break
        nursery.cancel_scope.cancel()


async def _open(store: PostgresStore, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    await store.check()  # creates the tables, as the worker's harness would
    async with store:
        task_status.started()
        await trio.sleep_forever()


async def test_follow_refuses_unknown_sessions_and_bad_arguments(tmp_path: Path) -> None:
    async with open_test_harness(store=tmp_path) as h:
        with pytest.raises(SessionNotFoundError, match="'nobody'"):
            async for _ in h.sessions.follow("nobody"):
                pass
        with pytest.raises(InvalidSessionIdError):
            h.sessions.follow("a/b")
        with pytest.raises(ValueError, match="start"):
            h.sessions.follow("s", start=-1)
        with pytest.raises(ValueError, match="poll_interval"):
            h.sessions.follow("s", poll_interval=0)


async def test_follow_on_the_memory_store_sees_a_live_session_of_this_process() -> None:
    model = ScriptedModel([{"text": "one", "delay": 0.01}, {"text": "two", "delay": 0.01}])
    async with open_test_harness(model) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("first")
            seen: list[ev.Event] = []
            with trio.fail_after(WAIT):
                async for event in h.sessions.follow("s", poll_interval=0.01):
                    seen.append(event)
                    if event.type == "turn/end" and sum(e.type == "turn/end" for e in seen) == 1:
                        agent.followup("second")
                    if sum(e.type == "turn/end" for e in seen) == 2:
                        break
            await agent.when_idle()
            assert seen == list(agent.session.events[: len(seen)])
