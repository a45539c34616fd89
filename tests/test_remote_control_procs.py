"""Decisions posted to a session held by another process, and across a killed holder (issue 28 item 4).

The holder is ``tests/_crash_worker.py`` with an approver that never answers
(``--approve=never``); this process posts the decision through its own
:class:`~trio_harness.session.SessionRegistry` on the same PostgreSQL store.
"""

from __future__ import annotations

import json
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import trio
from _postgres import Cluster, postgres_cluster
from _util import WAIT

from trio_harness import ApprovalDecision
from trio_harness.session import PostgresStore, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

WORKER = Path(__file__).resolve().with_name("_crash_worker.py")


class Worker:
    """A ``_crash_worker.py`` process and its marker lines."""

    def __init__(self, process: trio.Process) -> None:
        self.process = process
        self.markers: list[dict[str, Any]] = []
        self._buffer = b""

    async def until(self, at: str) -> dict[str, Any]:
        assert self.process.stdout is not None
        with trio.fail_after(WAIT):  # a bound on a real process
            while True:
                while b"\n" in self._buffer:
                    line, self._buffer = self._buffer.split(b"\n", 1)
                    self.markers.append(json.loads(line))
                    if self.markers[-1]["at"] == at:
                        return self.markers[-1]
                data = await self.process.stdout.receive_some(65536)
                assert data, f"the worker ended before {at!r}: {self.markers}"
                self._buffer += data


async def start(dsn: str, tmp_path: Path, name: str, responses: list[dict[str, Any]], *prompts: str) -> Worker:
    script = tmp_path / f"{name}.json"
    script.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    argv = [sys.executable, str(WORKER), f"{dsn}#trio_harness", "s", str(script), str(tmp_path / "side")]
    argv += ["--approve=never", *prompts]
    process = await trio.lowlevel.open_process(argv, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    return Worker(process)


def decided(events: tuple[ev.Event, ...]) -> list[tuple[str, str, str]]:
    return [(e.call_id, e.outcome, e.source) for e in events if isinstance(e, ev.ApprovalDecided)]


async def test_a_decision_from_this_process_answers_the_question_another_process_asks_and_survives_a_kill(
    postgres_cluster: Cluster, tmp_path: Path
) -> None:
    database = f"control_{uuid.uuid4().hex[:12]}"
    postgres_cluster.psql(f"CREATE DATABASE {database}")
    dsn = postgres_cluster.dsn(database)
    ask = {"tool_calls": [{"name": "work", "id": "c1", "arguments": {"ask": True}}]}
    ask2 = {"tool_calls": [{"name": "work", "id": "c2", "arguments": {"ask": True}}]}
    async with PostgresStore(dsn, schema="trio_harness") as store:
        poster = SessionRegistry(store)  # holds nothing: the worker does
        # 1. Live in another process: the decision ends its approver's wait (which would never answer).
        first = await start(dsn, tmp_path, "first", [ask, {"text": "ran"}, ask2], "one", "two")
        assert (await first.until("approval"))["call_id"] == "c1"
        await poster.post("s", call_id="c1", decision=ApprovalDecision.allow_once())
        await first.until("between")
        # 2. Killed while asking about c2; the decision is posted while nobody holds the session.
        assert (await first.until("approval"))["call_id"] == "c2"
        first.process.kill()
        with trio.fail_after(WAIT):
            await first.process.wait()
        await poster.post("s", call_id="c2", decision=ApprovalDecision.deny("no"))
        # 3. The next process resumes: the paused call takes the posted decision; nobody is asked.
        second = await start(dsn, tmp_path, "second", [{"text": "denied, fine"}])
        await second.until("done")
        with trio.fail_after(WAIT):
            await second.process.wait()
        assert second.process.returncode == 0
        assert not [m for m in second.markers if m["at"] == "approval"]
        events = (await store.load("s")).events
        assert decided(events) == [("c1", "allow_once", "approver"), ("c2", "deny", "approver")]
        assert (tmp_path / "side").read_text().split() == ["c1"]  # c1 ran once, c2 never
        assert await store.pending_mail("s") == []
        assert_balanced(events)
