"""Durable steps (issue 24): checkpoints, the durability policy, and recovery of started calls.

docs/sessions.rst ("Durability") and docs/guarantees.rst ("Durable steps").
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _postgres import Cluster, postgres_cluster, schema

from trio_harness import JsonlStore, ScriptedModel, SessionNotFoundError, open_harness
from trio_harness._cli import build_parser
from trio_harness.agents import AgentOptions, ReactAgent, Tool, ToolContext
from trio_harness.agents._approval import ApprovalDecision, ApprovalRequest
from trio_harness.agents._factory import ReactLoopFactory
from trio_harness.model._protocol import Emit, ModelRequest, ToolCall
from trio_harness.session import _events as ev
from trio_harness.session._events import Event, SessionHeader
from trio_harness.session._persistence import LoadedSession, MemoryStore
from trio_harness.session._recovery import INTERRUPTED_TOOL_RESULT, NOT_STARTED_TOOL_RESULT, closers_for
from trio_harness.session._session import SessionWriter
from trio_harness.testing import assert_balanced

__all__ = ["postgres_cluster", "schema"]  # the fixtures, imported for pytest

OBJ = {"type": "object", "properties": {"x": {"type": "string"}}}


def two_steps(call_id: str = "c1") -> list[dict[str, Any]]:
    """A tool call step, then a text answer."""
    return [{"tool_calls": [{"name": "act", "arguments": {"x": "1"}, "id": call_id}]}, {"text": "done"}]


@attrs.define(eq=False)
class PeekingModel(ScriptedModel):
    """A scripted model that runs ``peek`` before answering each request."""

    peek: Any = attrs.field(default=None, kw_only=True)

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        if self.peek is not None:
            await self.peek()
        await super().stream(request, emit)


async def on_disk(root: Path, session_id: str = "s") -> list[str]:
    """The event types another store object reads from the JSONL log now (empty: no log yet)."""
    try:
        loaded = await JsonlStore(root).load(session_id)
    except SessionNotFoundError:
        return []
    return [event.type for event in loaded.events]


# ---------------------------------------------------------------- what is on disk at each checkpoint


async def test_the_prompt_the_step_and_tool_started_are_on_disk_before_a_handler_runs(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seen: dict[str, list[str]] = {}
    requests = 0

    async def peek() -> None:
        nonlocal requests
        requests += 1
        seen[f"request {requests}"] = await on_disk(root)

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        seen["handler"] = await on_disk(root)
        return "acted"

    model = PeekingModel(two_steps(), peek=peek)
    async with open_harness(model=model, store=root, builtin_tools=False) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
    # Before the first model request: the prompt and the request's header.
    assert seen["request 1"][-2:] == ["user/message", "request/header"]
    assert {"turn/start", "step/start"} <= set(seen["request 1"])
    # Before the handler: the step's assistant message, the call and tool/started.
    assert seen["handler"][-4:] == ["request/header", "assistant/message", "tool/call", "tool/started"]
    # Before the second request: the first step's result and end, the second step's header.
    assert seen["request 2"][len(seen["handler"]) :] == ["tool/result", "step/end", "step/start", "request/header"]


async def test_durability_turn_writes_nothing_before_the_turn_end(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seen: list[list[str]] = []

    async def peek() -> None:
        seen.append(await on_disk(root))

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        seen.append(await on_disk(root))
        return "acted"

    model = PeekingModel([*two_steps("c1"), *two_steps("c2")], peek=peek)
    async with open_harness(model=model, store=root, builtin_tools=False, durability="turn") as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("one")
            await agent.when_idle()
            first = await on_disk(root)
            agent.followup("two")
            await agent.when_idle()
    assert seen[:3] == [[], [], []]  # a new session: no log at all until its first turn ends
    assert first[-1] == "turn/end"
    assert seen[3:] == [first, first, first]  # the second turn: nothing of it before its end


async def test_a_per_agent_policy_wins_over_the_harness_one(tmp_path: Path) -> None:
    root = tmp_path / "store"
    seen: list[list[str]] = []

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        seen.append(await on_disk(root))
        return "acted"

    async with open_harness(model=ScriptedModel(two_steps()), store=root, builtin_tools=False) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s", options=AgentOptions(durability="turn")) as agent:
            agent.followup("go")
            await agent.when_idle()
    assert seen == [[]]


@pytest.mark.parametrize(("durability", "fsyncs"), [("step", 1), ("sync", 5), ("turn", 1)])
async def test_sync_waits_for_the_disk_at_every_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, durability: str, fsyncs: int
) -> None:
    calls: list[int] = []
    real_fsync = os.fsync

    def counting_fsync(fd: int) -> None:
        calls.append(fd)
        real_fsync(fd)

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "acted"

    model = ScriptedModel([{"text": "first"}, *two_steps()])
    async with open_harness(model=model, store=tmp_path, builtin_tools=False, durability=durability) as harness:  # type: ignore[arg-type]
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("create the log")
            await agent.when_idle()
            monkeypatch.setattr(os, "fsync", counting_fsync)
            agent.followup("go")
            await agent.when_idle()
            monkeypatch.setattr(os, "fsync", real_fsync)
    # A 2-step tool turn: 4 checkpoints (2 requests, tool/started, the first step's end), then the turn end.
    assert len(calls) == fsyncs


@pytest.mark.parametrize("durability", ["step", "sync"])
async def test_postgres_checkpoints_commit_before_a_handler_runs(
    postgres_cluster: Cluster, schema: str, durability: str
) -> None:
    from trio_harness.session import PostgresStore

    seen: list[tuple[list[str], bool]] = []
    session: Any = None

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        async with PostgresStore(postgres_cluster.dsn(), schema=schema) as other:  # another store object
            loaded = await other.load("s")
        # step: committed without waiting for the WAL (the writer knows it unsynced); sync: synchronous.
        seen.append(([event.type for event in loaded.events], session._writer._unsynced))
        return "acted"

    store = PostgresStore(postgres_cluster.dsn(), schema=schema)
    model = ScriptedModel(two_steps())
    async with open_harness(model=model, store=store, builtin_tools=False, durability=durability) as harness:  # type: ignore[arg-type]
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            session = agent.session
            agent.followup("go")
            await agent.when_idle()
    ((types, unsynced),) = seen
    assert types[-3:] == ["assistant/message", "tool/call", "tool/started"] and "user/message" in types
    assert unsynced == (durability == "step")


# ---------------------------------------------------------------- a store that refuses a checkpoint


@attrs.define(eq=False)
class _Writer:
    inner: SessionWriter
    store: _RefusingStore

    def write(self, event: Event) -> None:
        self.store.pending.append(event.type)
        self.inner.write(event)

    async def flush(self, *, sync: bool = True) -> None:
        store = self.store
        store.flushes.append((tuple(store.pending), sync))
        if store.block is not None and store.block in store.pending:
            store.block = None  # once
            store.blocked.set()
            await trio.sleep_forever()  # a store that hangs: only a cancel ends this flush
        if store.refuse is not None and store.refuse in store.pending:
            store.refuse = None  # once
            raise OSError(5, "Input/output error")
        store.pending.clear()
        await self.inner.flush(sync=sync)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class _RefusingStore:
    """A memory store that refuses, once, the flush that would store an event of type ``refuse``."""

    refuse: str | None = None
    # Hang, once, the flush that would store an event of type ``block`` (setting ``blocked``).
    block: str | None = None
    blocked: trio.Event = attrs.field(factory=trio.Event)
    inner: MemoryStore = attrs.field(factory=MemoryStore)
    pending: list[str] = attrs.field(factory=list)
    flushes: list[tuple[tuple[str, ...], bool]] = attrs.field(factory=list)

    async def exists(self, session_id: str) -> bool:
        return await self.inner.exists(session_id)

    async def list(self) -> list[SessionHeader]:
        return await self.inner.list()

    async def load(self, session_id: str) -> LoadedSession:
        return await self.inner.load(session_id)

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        return _Writer(await self.inner.open_writer(header), self)

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        loaded, writer = await self.inner.resume(session_id)
        return loaded, _Writer(writer, self)

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        await self.inner.save(header, events)

    async def check(self) -> None:
        return None


@pytest.mark.parametrize(
    ("durability", "syncs"),
    [
        ("step", [False, False, False, False, False, True]),
        ("sync", [True, True, True, True, False, True]),
        ("turn", [False, True]),
    ],
)
async def test_the_checkpoints_of_each_policy(durability: str, syncs: list[bool]) -> None:
    store = _RefusingStore()

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "acted"

    async with open_harness(model=ScriptedModel(two_steps()), store=store, builtin_tools=False) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        options = AgentOptions(durability=durability)  # type: ignore[arg-type]
        async with harness.agents.open(session_id="s", options=options) as agent:
            agent.followup("go")
            await agent.when_idle()
            # The turn's flushes (then the turn end's two: sync=False, then synced).
            assert [sync for _, sync in store.flushes] == syncs
            if durability != "turn":
                assert [types[-1] for types, _ in store.flushes[:4]] == [
                    "request/header",
                    "tool/started",
                    "step/end",
                    "request/header",
                ]


async def test_a_refused_checkpoint_before_a_handler_does_not_run_it() -> None:
    store = _RefusingStore(refuse="tool/started")
    ran: list[str] = []

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        ran.append(ctx.call_id)
        return "acted"

    async with open_harness(model=ScriptedModel(two_steps()), store=store, builtin_tools=False) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()  # the turn end stored the turn (the store refused once)
            events = agent.session.events
    assert ran == []
    (result,) = [e for e in events if isinstance(e, ev.ToolResult)]
    assert result.is_error and result.content.startswith("error: not run: the session could not be stored")
    assert "Input/output error" in result.content and "did not run" in result.content
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and end.reason == "error"
    assert end.failure is not None and end.failure.code == "store-error"
    assert not any(isinstance(e, ev.AssistantMessage) and e.step == 2 for e in events)  # no further request
    assert_balanced(agent.session)


async def test_a_refused_checkpoint_before_an_approval_asks_nobody_and_runs_nothing() -> None:
    store = _RefusingStore(refuse="approval/requested")
    asked: list[ApprovalRequest] = []
    ran: list[str] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision.allow_once()

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        ran.append(ctx.call_id)
        return "acted"

    model = ScriptedModel(two_steps())
    async with open_harness(model=model, store=store, builtin_tools=False, approver=approver) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act, requires_approval=True))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            events = agent.session.events
    assert asked == [] and ran == []
    (decided,) = [e for e in events if isinstance(e, ev.ApprovalDecided)]
    assert (decided.outcome, decided.source) == ("cancelled", "error")
    assert decided.message is not None and "could not be stored" in decided.message
    (result,) = [e for e in events if isinstance(e, ev.ToolResult)]
    assert result.is_error and "approval was not asked and the call did not run" in result.content
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and end.failure is not None and end.failure.code == "store-error"
    assert_balanced(agent.session)


async def test_a_refused_checkpoint_before_a_request_ends_the_turn_before_it() -> None:
    store = _RefusingStore(refuse="request/header")
    model = ScriptedModel([{"text": "never sent"}])
    async with open_harness(model=model, store=store, builtin_tools=False) as harness:
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await agent.when_idle()
            events = agent.session.events
    assert model.requests == []
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and end.failure is not None and end.failure.code == "store-error"


@pytest.mark.parametrize("at", ["tool/started", "approval/requested"])
async def test_a_cancel_during_a_checkpoint_runs_nothing_and_keeps_the_log_balanced(at: str) -> None:
    store = _RefusingStore(block=at)
    asked: list[ApprovalRequest] = []
    ran: list[str] = []

    async def approver(request: ApprovalRequest) -> ApprovalDecision:
        asked.append(request)
        return ApprovalDecision.allow_once()

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        ran.append(ctx.call_id)
        return "acted"

    model = ScriptedModel(two_steps())
    async with open_harness(model=model, store=store, builtin_tools=False, approver=approver) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act, requires_approval=at == "approval/requested"))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await store.blocked.wait()
            agent.cancel()
            await agent.when_idle()
            events = agent.session.events
    assert asked == [] and ran == []
    (result,) = [e for e in events if isinstance(e, ev.ToolResult)]
    assert result.is_error and "the turn was aborted" in result.content
    if at == "approval/requested":
        (decided,) = [e for e in events if isinstance(e, ev.ApprovalDecided)]
        assert (decided.outcome, decided.source, decided.cause) == ("cancelled", "cancelled", "user")
    end = events[-1]
    assert isinstance(end, ev.TurnEnd) and (end.reason, end.cause) == ("aborted", "user")
    assert_balanced(agent.session)
    assert (await store.inner.load("s")).events == tuple(events)  # the turn end stored everything


# ---------------------------------------------------------------- recovery


def _cut_log(started: bool) -> list[Event]:
    call = ToolCall(id="c1", name="act", arguments="{}")
    events: list[Event] = [
        ev.TurnStart(seq=0, ts=1.0, turn=1),
        ev.StepStart(seq=1, ts=1.0, turn=1, step=1),
        ev.AssistantMessage(seq=2, ts=1.0, turn=1, step=1, text="", tool_calls=(call,)),
        ev.ToolCallRequested(seq=3, ts=1.0, turn=1, step=1, call_id="c1", name="act", arguments="{}"),
    ]
    if started:
        events.append(ev.ToolStarted(seq=4, ts=1.0, turn=1, step=1, call_id="c1", name="act"))
    return events


@pytest.mark.parametrize("started", [True, False])
def test_recovery_says_whether_an_unanswered_call_had_started(started: bool) -> None:
    (result, step_end, turn_end) = closers_for(_cut_log(started))
    assert result[0] is ev.ToolResult and step_end[0] is ev.StepEnd and turn_end[0] is ev.TurnEnd
    fields = result[1]
    assert fields["call_id"] == "c1" and fields["is_error"] is True
    if started:
        assert fields["content"] == INTERRUPTED_TOOL_RESULT.format(call_id="c1")
        assert "may have had effects" in fields["content"] and "c1" in fields["content"]
    else:
        assert fields["content"] == NOT_STARTED_TOOL_RESULT
        assert "not run" in fields["content"]


def test_a_tool_started_of_an_earlier_step_does_not_count() -> None:
    events = [*_cut_log(True), ev.ToolResult(seq=5, ts=1.0, turn=1, step=1, call_id="c1", name="act", content="ok")]
    events.append(ev.StepEnd(seq=6, ts=1.0, turn=1, step=1))
    again = [e for e in _cut_log(False)[1:]]  # the same call id in step 2, not started
    for offset, event in enumerate(again):
        events.append(attrs.evolve(event, seq=7 + offset, step=2))  # type: ignore[call-arg]
    result = closers_for(events)[0][1]
    assert result["content"] == NOT_STARTED_TOOL_RESULT


async def test_a_call_killed_while_running_is_closed_as_interrupted_with_the_same_call_id(tmp_path: Path) -> None:
    live, crashed = tmp_path / "live", tmp_path / "crashed"
    running = trio.Event()
    ids: list[str] = []

    async def act(ctx: ToolContext, args: dict[str, Any]) -> str:
        ids.append(ctx.call_id)
        running.set()
        await trio.sleep_forever()
        raise AssertionError("unreachable")

    async with open_harness(model=ScriptedModel(two_steps("call-7")), store=live, builtin_tools=False) as harness:
        harness.tools.add(Tool("act", "acts", OBJ, act))
        async with harness.agents.open(session_id="s") as agent:
            agent.followup("go")
            await running.wait()
            shutil.copytree(live, crashed)  # what a process killed now leaves on disk (no flush by the test)
            agent.cancel()
    assert ids == ["call-7"]

    model = ScriptedModel([{"text": "checked"}])
    async with open_harness(model=model, store=crashed, builtin_tools=False) as harness:
        async with harness.agents.open(session_id="s", resume=True) as agent:
            events = agent.session.events
            assert [e.type for e in events[-4:]] == ["tool/started", "tool/result", "step/end", "turn/end"]
            result = events[-3]
            assert isinstance(result, ev.ToolResult) and result.is_error
            assert result.content == INTERRUPTED_TOOL_RESULT.format(call_id="call-7")
            # The id the handler saw is the one the log keeps, the resumed request sends, and the result names.
            assert result.call_id == "call-7"
            assert isinstance(agent, ReactAgent)
            request = agent.build_request()
            sent = [call.id for message in request.messages for call in getattr(message, "tool_calls", ())]
            assert sent == ["call-7"]
            agent.followup("did it happen?")
            await agent.when_idle()
            assert_balanced(agent.session)


# ---------------------------------------------------------------- the setting


@pytest.mark.parametrize("bad", ["always", "", "STEP", 1, None])
def test_agent_options_refuse_an_unknown_policy(bad: object) -> None:
    if bad is None:
        assert AgentOptions(durability=None).durability is None
        return
    with pytest.raises(ValueError, match=r"AgentOptions\.durability must be one of 'step', 'sync', 'turn'") as caught:
        AgentOptions(durability=bad)  # type: ignore[arg-type]
    assert repr(bad) in str(caught.value)


async def test_open_harness_and_the_factory_refuse_an_unknown_policy() -> None:
    with pytest.raises(ValueError, match="durability must be one of 'step', 'sync', 'turn', got 'often'"):
        async with open_harness(durability="often"):  # type: ignore[arg-type]
            pass
    with pytest.raises(ValueError, match=r"ReactLoopFactory\.durability must be one of"):
        ReactLoopFactory(bus=None, tools=None, agents=None, durability="often")  # type: ignore[arg-type]


@pytest.mark.parametrize("command", ["run", "acp"])
def test_the_cli_flag_parses_and_refuses_a_bad_value(command: str, capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    extra = ["hi"] if command == "run" else []
    assert parser.parse_args([command, *extra]).durability == "step"
    assert parser.parse_args([command, "--durability", "sync", *extra]).durability == "sync"
    with pytest.raises(SystemExit):
        parser.parse_args([command, "--durability", "often", *extra])
    assert "invalid choice: 'often'" in capsys.readouterr().err


def test_the_cli_run_flag_reaches_the_agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_harness import _cli
    from trio_harness.agents import _factory

    policies: list[str] = []
    real = _factory.ReactAgent  # type: ignore[attr-defined]

    class Spy:
        @staticmethod
        def _create(**kwargs: Any) -> ReactAgent:
            policies.append(kwargs["durability"])
            return real._create(**kwargs)

    monkeypatch.setattr(_factory, "ReactAgent", Spy)
    script = tmp_path / "script.json"
    script.write_text('{"responses": [{"text": "hello"}]}', encoding="utf-8")
    store = str(tmp_path / "store")
    assert (
        _cli.main(["run", "-q", "--durability", "turn", "--model", f"scripted:{script}", "--store", store, "hi"]) == 0
    )
    assert policies == ["turn"]


def test_the_cli_acp_flag_reaches_the_harness(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from trio_harness import _cli, _harness

    policies: list[str] = []
    real = _harness.open_harness

    def spying(**kwargs: Any) -> Any:
        policies.append(kwargs["durability"])
        return real(**kwargs)

    monkeypatch.setattr(_harness, "open_harness", spying)
    script = tmp_path / "script.json"
    script.write_text('{"responses": [{"text": "hello"}]}', encoding="utf-8")
    with open(os.devnull) as nothing:  # a client that closes at once
        monkeypatch.setattr("sys.stdin", nothing)
        store = str(tmp_path / "store")
        assert _cli.main(["acp", "--durability", "sync", "--model", f"scripted:{script}", "--store", store]) == 0
    assert policies == ["sync"]


async def test_a_compaction_inside_a_turn_checkpoints_before_its_summary_request(tmp_path: Path) -> None:
    from trio_harness.agents import ContextPolicy

    root = tmp_path / "store"
    seen: list[tuple[str, list[str]]] = []

    @attrs.define(eq=False)
    class Watching(ScriptedModel):
        async def stream(self, request: ModelRequest, emit: Emit) -> None:
            seen.append((request.purpose, await on_disk(root)))
            await super().stream(request, emit)

    model = Watching([{"text": "hello"}, {"text": "long answer"}], context_window=2_000, summary="sum")
    options = AgentOptions(context=ContextPolicy(summary_tokens=100))
    async with open_harness(model=model, store=root, builtin_tools=False) as harness:
        async with harness.agents.open(session_id="s", options=options) as agent:
            agent.followup("hi")
            await agent.when_idle()
            agent.followup("y" * 8_000)  # this prompt passes the threshold: compacted inside its turn
            await agent.when_idle()
            compacted = [e for e in agent.session.events if isinstance(e, ev.ContextCompacted)]
    assert compacted and compacted[0].turn == 2, compacted
    summaries = [types for purpose, types in seen if purpose == "compaction"]
    assert summaries, seen
    # Before the summary request: turn 2 and its prompt are on disk.
    assert summaries[0][-1] == "user/message" and summaries[0].count("turn/start") == 2
