"""Resume: turns and seqs continue, inbox kept, identical requests (docs/guarantees.rst, "Sessions")."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _util import echo_tool

from trio_harness.agents import Agent, AgentHandle, AgentOptions, ReactAgent
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness

ECHO = echo_tool()

SCRIPT: list[dict[str, Any]] = [
    {"tool_calls": [{"name": "echo", "arguments": {"x": "1"}}]},
    {"text": "first done"},
    {"text": "second done"},
]


@pytest.mark.parametrize("store", ["memory", "jsonl"])
async def test_resume_continues_and_rebuilds_the_same_request(tmp_path: Path, store: str) -> None:
    where: object = tmp_path if store == "jsonl" else None
    # a never-restarted agent
    straight = ScriptedModel([*SCRIPT, {"text": "third"}])
    async with open_test_harness(straight) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="s") as agent:
            agent.followup("one")
            await agent.when_idle()
            agent.followup("two")
            await agent.when_idle()
            agent.inject("parked note")
            agent.followup("three")
            await agent.when_idle()
            straight_len = len(agent.session)

    first = ScriptedModel(SCRIPT)
    second = ScriptedModel([{"text": "third"}])
    kwargs: dict[str, Any] = {"store": where} if where is not None else {}
    async with open_test_harness(first, **kwargs) as h:
        h.tools.add(ECHO)
        handle = await h.agents.create(session_id="s")
        agent = handle.agent
        agent.followup("one")
        await agent.when_idle()
        agent.followup("two")
        await agent.when_idle()
        agent.inject("parked note")  # pending idle inject survives the restart
        before = len(agent.session)
        await handle.dispose()
        if where is None:
            # same harness, same in-memory store: resume in place
            agent2_handle = await h.agents.resume("s", options=AgentOptions(model=second))
            await _finish(agent2_handle, second, before, straight, straight_len)
            return
    async with open_test_harness(second, **kwargs) as h:
        h.tools.add(ECHO)
        await _finish(await h.agents.resume("s"), second, before, straight, straight_len)


async def _finish(
    handle: AgentHandle, second: ScriptedModel, before: int, straight: ScriptedModel, straight_len: int
) -> None:
    agent = handle.agent
    assert isinstance(agent, ReactAgent)
    assert len(agent.session) == before
    assert [m.text for m in agent.inbox.next_step] == ["parked note"]
    agent.followup("three")
    await agent.when_idle()
    starts = [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)]
    assert starts == [1, 2, 3]
    assert [e.seq for e in agent.session.events] == list(range(len(agent.session)))
    assert second.requests[0] == straight.requests[-1]
    assert len(agent.session) == straight_len
    assert_balanced(agent.session)
    await handle.dispose()


async def test_resume_after_crash_mid_turn_closes_the_turn(
    tmp_path: Path, autojump_clock: trio.testing.MockClock
) -> None:
    """A log that died mid-turn is closed with interrupted on resume; the inbox is intact."""
    from trio_harness.model._protocol import ToolCall
    from trio_harness.session import JsonlStore, SessionHeader

    store = JsonlStore(tmp_path)
    header = SessionHeader(id="crashed", created_at=1.0)
    writer = await store.open_writer(header)
    from trio_harness.session import Session

    session = Session(header=header, events=[], writer=writer)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(ev.InboxMessage("m1", "run it"),))
    session.append(ev.InboxSpliced, queue="next-turn", start=1, inserted=(ev.InboxMessage("m2", "later"),))
    session.append(ev.TurnStart, turn=1)
    session.append(ev.StepStart, turn=1, step=1)
    session.append(ev.InboxSpliced, queue="next-turn", start=0, removed=("m1",), outcome="claimed", turn=1)
    session.append(ev.UserMessage, turn=1, step=1, message_id="m1", text="run it")
    session.append(ev.AssistantMessage, turn=1, step=1, text="", tool_calls=(ToolCall("c1", "bash", "{}"),))
    await session.flush()
    await writer.aclose()

    model = ScriptedModel([{"text": "resumed"}])
    async with open_test_harness(model, store=tmp_path) as h:
        async with h.agents.open(session_id="crashed", resume=True) as agent:
            types = [e.type for e in agent.session.events[-3:]]
            assert types == ["tool/result", "step/end", "turn/end"]
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "interrupted"
            assert [m.id for m in agent.inbox.next_turn] == ["m2"]
            agent.followup("go on")
            await agent.when_idle()
            assert [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)] == [1, 2, 3]
            assert_balanced(agent.session)


async def test_keep_inbox_cancel_dispose_resume_keeps_pending_and_turn_numbers(
    autojump_clock: trio.testing.MockClock,
) -> None:
    model = ScriptedModel([{"text": "one"}, {"hang": True}, {"text": "parked ran"}, {"text": "wake ran"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create(session_id="s1")
        agent = handle.agent
        agent.followup("one")
        await agent.when_idle()
        agent.followup("two")
        parked = agent.followup("parked")
        await trio.testing.wait_all_tasks_blocked()
        agent.inject("mid-turn inject")
        agent.cancel(keep_inbox=True)
        await agent.when_idle()
        await handle.dispose()
        handle2 = await h.agents.resume("s1")
        again = handle2.agent
        assert parked in again.inbox and len(again.inbox.next_step) == 1
        assert again.status == "idle"
        again.followup("wake")
        await again.when_idle()
        starts = [e.turn for e in again.session.events if isinstance(e, ev.TurnStart)]
        assert starts == [1, 2, 3, 4]
        assert_balanced(again.session)
        await handle2.dispose()


# ---------------------------------------------------------------- the resume pipeline


async def _store_one_turn(tmp_path: Path, session_id: str = "kept") -> None:
    async with open_test_harness(ScriptedModel([{"text": "stored"}]), store=tmp_path) as h:
        async with h.agents.open(session_id=session_id) as agent:
            agent.followup("one")
            await agent.when_idle()
            agent.inject("parked")


async def test_resume_announces_session_start_with_source_resume(tmp_path: Path) -> None:
    await _store_one_turn(tmp_path)
    async with open_test_harness(store=tmp_path) as h:
        seen: list[tuple[str, str, object]] = []
        for name in ("session/created", "agent/created", "agent/session-start"):
            h.bus.on(name, lambda n: seen.append((n.name, n.subject.id, n.data.get("source"))))
        handle = await h.agents.resume("kept")
        assert seen == [
            ("session/created", "kept", None),
            ("agent/created", "kept", None),
            ("agent/session-start", "kept", "resume"),
        ]
        await handle.dispose()
        seen.clear()
        fresh = await h.agents.create(session_id="fresh")
        assert seen[-1] == ("agent/session-start", "fresh", "startup")
        await fresh.dispose()


async def test_resume_runs_setup_on_the_loaded_session_before_publication(tmp_path: Path) -> None:
    await _store_one_turn(tmp_path)
    model = ScriptedModel([{"tool_calls": [{"name": "echo", "arguments": {"x": "again"}}]}, {"text": "done"}])
    async with open_test_harness(model, store=tmp_path) as h:
        observed: list[tuple[object, ...]] = []
        committed: list[bool] = []

        async def setup(agent: Agent) -> Callable[[], None]:
            await trio.lowlevel.checkpoint()
            observed.append(
                (
                    h.agents.get("kept"),
                    h.sessions.get("kept"),
                    [e.type for e in agent.session.events if isinstance(e, ev.TurnEnd)],
                    [m.text for m in agent.inbox.next_step],
                )
            )
            agent.tools.add(ECHO, scope=agent.scope)  # this agent's own tool, for this life only
            return lambda: committed.append(True)

        handle = await h.agents.resume("kept", setup=setup)
        assert observed == [(None, None, ["turn/end"], ["parked"])] and committed == [True]
        agent = handle.agent
        agent.followup("use the tool")
        await agent.when_idle()
        (result,) = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
        assert result.content == "echo again"
        assert [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)] == [1, 2]
        await handle.dispose()


@pytest.mark.parametrize("log", ["clean", "died-mid-turn"])
@pytest.mark.parametrize("where", ["setup", "commit"])
async def test_a_failing_setup_on_resume_leaves_the_stored_log_untouched(
    tmp_path: Path, autojump_clock: trio.testing.MockClock, log: str, where: str
) -> None:
    if log == "clean":
        await _store_one_turn(tmp_path)
    else:
        # Killed mid-turn: resume appends closers (in memory) before setup runs.
        from trio_harness.session import JsonlStore, Session, SessionHeader

        header = SessionHeader(id="kept", created_at=1.0)
        writer = await JsonlStore(tmp_path).open_writer(header)
        session = Session(header=header, events=[], writer=writer)
        session.append(ev.TurnStart, turn=1)
        session.append(ev.StepStart, turn=1, step=1)
        await session.flush()
        await writer.aclose()
    path = tmp_path / "kept" / "session.jsonl"
    before = path.read_bytes()
    listing = sorted(p.name for p in (tmp_path / "kept").iterdir())

    async def setup(agent: Agent) -> Callable[[], None]:
        if log == "died-mid-turn":
            end = agent.session.events[-1]  # the closers are there, in memory only
            assert isinstance(end, ev.TurnEnd) and end.reason == "interrupted"
        if where == "setup":
            raise RuntimeError("setup broke")

        def commit() -> None:
            raise RuntimeError("commit broke")

        return commit

    async with open_test_harness(store=tmp_path) as h:
        seen: list[str] = []
        h.bus.on("*", lambda n: seen.append(n.name))
        with pytest.raises(RuntimeError, match=f"{where} broke"):
            await h.agents.resume("kept", setup=setup)
        assert path.read_bytes() == before
        assert sorted(p.name for p in (tmp_path / "kept").iterdir()) == listing
        assert seen == [] and h.agents.list() == [] and h.sessions.list() == []
        async with h.agents.open(session_id="kept", resume=True) as agent:  # still resumable
            assert agent.id == "kept"
