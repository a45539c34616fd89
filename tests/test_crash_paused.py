"""Paused approvals across a kill -9: asked again in a new process; allowed runs, denied continues.

A writer process is killed with SIGKILL while its approver is asked (the
library worker of ``tests/_crash_worker.py``, or ``trio-harness acp`` waiting
for ``session/request_permission``).  The log it leaves ends the turn paused
once recovered (docs/approval.rst, "Paused approvals"); a new process resumes
it, through the library, ACP (``session/load``) or the CLI (``run
--session``): the same question goes to the approver again in a
continuation turn, an allowed call runs (its side effect happens once) and the
turn goes on; a denied one continues with the denial.  JSONL and PostgreSQL.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _acp_clients import AcpClient
from _postgres import postgres_cluster
from _util import WAIT
from test_crash import Marker, Where, check_log, check_resumed, kill, results, run_worker, side_ids, where

from trio_harness.session import _events as ev
from trio_harness.session._recovery import closers_for
from trio_harness.testing import assert_balanced

__all__ = ["postgres_cluster", "where"]  # the fixtures, imported for pytest

SESSION = "paused"


def turn_ends(events: tuple[ev.Event, ...]) -> list[tuple[int, str]]:
    return [(e.turn, e.reason) for e in events if isinstance(e, ev.TurnEnd)]


async def killed_while_asking(where: Where, tmp: Path, side: Path) -> tuple[ev.Event, ...]:
    """A library worker asks about call ``p1`` and is killed during the wait; the raw log it left."""
    ask: Marker = {"tool_calls": [{"name": "work", "id": "p1", "arguments": {"ms": 5, "ask": True}}]}
    script: tuple[list[Marker], list[str]] = ([ask, {"text": "never"}], ["needs approval"])
    rng = random.Random(0)
    run = await run_worker(where, SESSION, tmp, 0, rng, side, ("approval", 1, 0.0), "step", script, "never")
    assert run.killed and not side_ids(side)
    raw = await where.load(SESSION)
    assert raw is not None
    check_log(raw, run.markers, [], "killed while asking")
    # recovered, the turn ends paused with the question open
    closers = closers_for(raw)
    assert closers[-1][1].get("reason") == "paused", closers
    assert not [c for c in closers if c[0] is ev.ApprovalDecided], closers
    return raw


@pytest.mark.parametrize("answer", ["allow", "deny"])
async def test_a_worker_killed_while_asking_is_asked_again_by_a_new_process(
    where: Where, tmp_path: Path, answer: str
) -> None:
    side = tmp_path / "side"
    raw = await killed_while_asking(where, tmp_path, side)
    after: tuple[list[Marker], list[str]] = (
        [{"text": "went on"}],
        [],
    )  # no prompt: the continuation runs, then the worker exits
    run = await run_worker(where, SESSION, tmp_path, 1, random.Random(1), side, None, "step", after, answer)
    assert run.returncode == 0
    assert [m["call_id"] for m in run.markers if m["at"] == "approval"] == ["p1"]  # asked again, once
    events = await where.load(SESSION)
    assert events is not None
    check_resumed(raw, events, "resumed")
    assert_balanced(events)
    assert turn_ends(events) == [(1, "paused"), (2, "completed")]
    result = results(events)["p1"]
    decided = [(e.call_id, e.outcome) for e in events if isinstance(e, ev.ApprovalDecided)]
    if answer == "allow":
        assert side_ids(side) == ["p1"] and result.content == "done p1" and not result.is_error
        assert decided == [("p1", "allow_once")]
    else:
        assert side_ids(side) == [] and result.is_error and "denied" in result.content
        assert decided == [("p1", "deny")]
    answer_event = events[-3]
    assert isinstance(answer_event, ev.AssistantMessage) and answer_event.text == "went on"


# ---------------------------------------------------------------- ACP and the CLI


async def acp_killed_while_asking(where: Where, tmp: Path, side: Path) -> str:
    """``trio-harness acp`` (no ``--yes``) asks its client about a ``bash`` call and is SIGKILLed; the session id."""
    script = tmp / "first.json"
    command = f"echo p1 >> {side}"
    ask = {"tool_calls": [{"name": "bash", "id": "p1", "arguments": {"command": command}}]}
    script.write_text(json.dumps({"responses": [ask, {"text": "never"}]}), encoding="utf-8")
    argv = [sys.executable, "-m", "trio_harness", "acp", "--model", f"scripted:{script}", "--store", where.arg]
    argv += ["--tools", "bash"]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp
    )
    client = AcpClient(process)
    try:
        async with trio.open_nursery() as nursery:
            nursery.start_soon(client.pump)
            await client.initialize()
            session_id = await client.new_session(tmp)
            await client.send(client.prompt(session_id, "needs approval"))
            await client.wait_for(lambda m: m.get("method") == "session/request_permission")
            assert await kill(process)
            nursery.cancel_scope.cancel()
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
    assert not side_ids(side)
    raw = await where.load(session_id)
    assert raw is not None
    check_log(raw, [], [], "acp killed while asking")
    assert closers_for(raw)[-1][1].get("reason") == "paused"
    return session_id


def check_continued(events: tuple[ev.Event, ...] | None, side: Path, allowed: bool) -> None:
    assert events is not None
    assert_balanced(events)
    assert turn_ends(events)[:2] == [(1, "paused"), (2, "completed")]
    result = results(events)["p1"]
    if allowed:
        assert side_ids(side) == ["p1"] and not result.is_error
    else:
        assert side_ids(side) == [] and result.is_error and "denied" in result.content


@pytest.mark.slow
@pytest.mark.parametrize("answer", ["allow_once", "reject_once"])
async def test_acp_killed_while_asking_asks_again_after_session_load_in_a_new_process(
    where: Where, tmp_path: Path, answer: str
) -> None:
    side = tmp_path / "side"
    session_id = await acp_killed_while_asking(where, tmp_path, side)
    script = tmp_path / "second.json"
    script.write_text(json.dumps({"responses": [{"text": "went on"}]}), encoding="utf-8")
    argv = [sys.executable, "-m", "trio_harness", "acp", "--model", f"scripted:{script}", "--store", where.arg]
    argv += ["--tools", "bash"]
    process = await trio.lowlevel.open_process(
        argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, cwd=tmp_path
    )
    client = AcpClient(process)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(client.pump)
        await client.initialize()
        load = client.request("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        await client.send(load)
        asked = await client.wait_for(lambda m: m.get("method") == "session/request_permission")
        assert asked["params"]["toolCall"]["rawInput"] == {"command": f"echo p1 >> {side}"}
        assert "result" in await client.response(load["id"])
        outcome = {"outcome": {"outcome": "selected", "optionId": answer}}
        await client.send({"jsonrpc": "2.0", "id": asked["id"], "result": outcome})
        await client.wait_for(
            lambda m: (
                m.get("method") == "session/update"
                and m["params"]["update"]["sessionUpdate"] == "agent_message_chunk"
                and client.position(m) > client.position(asked)
            )
        )
        with trio.fail_after(WAIT):
            while turn_ends(await where.load(session_id) or ())[1:] != [(2, "completed")]:
                await trio.sleep(0.02)  # waiting for the subprocess to store the turn's end
        await client.close_input()
        assert await client.wait_exit() == 0
        nursery.cancel_scope.cancel()
    check_continued(await where.load(session_id), side, answer == "allow_once")


@pytest.mark.slow
@pytest.mark.parametrize("yes", [True, False])
async def test_a_session_paused_by_a_kill_is_asked_again_by_trio_harness_run(
    where: Where, tmp_path: Path, yes: bool
) -> None:
    """``run --session``: ``--yes`` allows the paused call; without it and without a terminal it is denied."""
    side = tmp_path / "side"
    session_id = await acp_killed_while_asking(where, tmp_path, side)
    script = tmp_path / "second.json"
    script.write_text(json.dumps({"responses": [{"text": "went on"}, {"text": "and the prompt"}]}), encoding="utf-8")
    argv = [sys.executable, "-m", "trio_harness", "run", "then?", "--session", session_id, "--tools", "bash"]
    argv += ["--model", f"scripted:{script}", "--store", where.arg, *(["--yes"] if yes else [])]
    with trio.fail_after(WAIT):
        done = await trio.run_process(argv, cwd=tmp_path, capture_stdout=True, capture_stderr=True, check=False)
    output: Any = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, output
    assert "went on" in output and "and the prompt" in output
    events = await where.load(session_id)
    check_continued(events, side, yes)
    assert events is not None and turn_ends(events) == [(1, "paused"), (2, "completed"), (3, "completed")]
