"""A hypothesis state machine driving random followup / steer / inject / cancel /
dispose / resume sequences against one agent on a real Trio loop under a mock
clock, checking the inbox and log invariants after every step."""

from __future__ import annotations

import queue
import threading
from collections.abc import Awaitable, Callable
from typing import Any

import attrs
import trio
import trio.testing
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

from trio_harness._harness import Harness
from trio_harness.agents import AgentHandle, Inbox
from trio_harness.model._protocol import Emit, Finish, ModelRequest, TextDelta, UserMessage
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness


@attrs.define
class EchoModel:
    """Answers every request after one second of Trio time, echoing the prompts it saw."""

    seen: list[str] = attrs.field(factory=list)

    @property
    def name(self) -> str:
        return "echo"

    async def stream(self, request: ModelRequest, emit: Emit) -> None:
        await trio.sleep(1)
        texts = [m.text for m in request.messages if isinstance(m, UserMessage)]
        self.seen.extend(texts)
        emit(TextDelta(f"saw {len(texts)}"))
        emit(Finish("stop"))


class TrioPortal:
    """A Trio loop (mock clock, autojump) on a thread; run coroutines in it."""

    def __init__(self) -> None:
        self._ready: queue.Queue[trio.lowlevel.TrioToken] = queue.Queue()
        self._stop: trio.Event | None = None
        self.error: BaseException | None = None
        self.model = EchoModel()
        self.harness: Harness | None = None
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        self.token = self._ready.get(timeout=30)

    def _run(self) -> None:
        try:
            trio.run(self._main, clock=trio.testing.MockClock(autojump_threshold=0))
        except BaseException as exc:  # surfaced by close()
            self.error = exc

    async def _main(self) -> None:
        self._stop = trio.Event()
        async with open_test_harness(self.model) as harness:
            self.harness = harness
            self._ready.put(trio.lowlevel.current_trio_token())
            await self._stop.wait()

    def run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        return trio.from_thread.run(fn, trio_token=self.token)

    def close(self) -> None:
        def stop() -> None:
            assert self._stop is not None
            self._stop.set()

        trio.from_thread.run_sync(stop, trio_token=self.token)
        self._thread.join(timeout=30)
        if self.error is not None:
            raise self.error


def _tasks_named(name: str) -> list[trio.lowlevel.Task]:
    found: list[trio.lowlevel.Task] = []
    pending = [trio.lowlevel.current_root_task()]
    while pending:
        task = pending.pop()
        if task is None:
            continue
        if task.name == name:
            found.append(task)
        pending.extend(child for nursery in task.child_nurseries for child in nursery.child_tasks)
    return found


class AgentMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.portal = TrioPortal()
        self.handle: AgentHandle | None = None
        self.sent: list[str] = []
        # reference model: each message's queue, and the ids a cancel dropped
        self.queue_of: dict[str, str] = {}
        self.dropped: set[str] = set()
        self.portal.run(self._create)

    @property
    def h(self) -> Harness:
        assert self.portal.harness is not None
        return self.portal.harness

    async def _create(self) -> None:
        self.handle = await self.h.agents.create(session_id="machine")

    async def _settle(self) -> None:
        await trio.testing.wait_all_tasks_blocked()

    def _agent(self) -> Any:
        assert self.handle is not None
        return self.handle.agent

    @rule(mode=st.sampled_from(["followup", "steer", "inject"]))
    def send(self, mode: str) -> None:
        async def op() -> None:
            message_id = self._agent().send(f"{mode} {len(self.sent)}", mode=mode)
            self.sent.append(message_id)
            self.queue_of[message_id] = "next-turn" if mode == "followup" else "next-step"
            await self._settle()

        self.portal.run(op)

    @rule(keep=st.booleans())
    def cancel(self, keep: bool) -> None:
        async def op() -> None:
            inbox = self._agent().inbox
            before = (tuple(inbox.next_turn), tuple(inbox.next_step))
            self._agent().cancel(keep_inbox=keep)
            if keep:
                assert (tuple(inbox.next_turn), tuple(inbox.next_step)) == before
            else:
                assert len(inbox) == 0
                self.dropped.update(m.id for m in (*before[0], *before[1]))
            await self._settle()

        self.portal.run(op)

    @rule(seconds=st.sampled_from([0.5, 1, 3]))
    def advance(self, seconds: float) -> None:
        async def op() -> None:
            await trio.sleep(seconds)
            await self._settle()

        self.portal.run(op)

    @rule()
    def wait_idle(self) -> None:
        async def op() -> None:
            await self._agent().when_idle()
            assert self._agent().status == "idle"

        self.portal.run(op)

    @rule()
    def dispose_and_resume(self) -> None:
        async def op() -> None:
            assert self.handle is not None
            pending = (tuple(self._agent().inbox.next_turn), tuple(self._agent().inbox.next_step))
            empty = len(self._agent().session) == 0
            await self.handle.dispose()
            assert self.h.agents.list() == [] and self.h.sessions.list() == []
            if empty:  # nothing was ever appended, so nothing was stored: start afresh
                self.handle = await self.h.agents.create(session_id="machine")
                return
            self.handle = await self.h.agents.resume("machine")
            resumed = self._agent().inbox
            assert (tuple(resumed.next_turn), tuple(resumed.next_step)) == pending

        self.portal.run(op)

    @invariant()
    def log_is_consistent(self) -> None:
        async def check() -> None:
            agent = self._agent()
            events = list(agent.session.events)
            assert [e.seq for e in events] == list(range(len(events)))
            # balanced boundaries: only the last turn may be open, and only while running
            open_turn = None
            open_step = None
            for e in events:
                if isinstance(e, ev.TurnStart):
                    assert open_turn is None
                    open_turn = e.turn
                elif isinstance(e, ev.StepStart):
                    assert open_turn is not None and open_step is None
                    open_step = e.step
                elif isinstance(e, ev.StepEnd):
                    assert open_step == e.step
                    open_step = None
                elif isinstance(e, ev.TurnEnd):
                    assert open_turn == e.turn and open_step is None
                    open_turn = None
            if agent.status == "idle":
                assert open_turn is None
            turns = [e.turn for e in events if isinstance(e, ev.TurnStart)]
            assert turns == list(range(1, len(turns) + 1))
            # no prompt run after being cancelled, no prompt lost
            cancelled = {
                i for e in events if isinstance(e, ev.InboxSpliced) and e.outcome == "canceled" for i in e.removed
            }
            claimed = [e.message_id for e in events if isinstance(e, ev.UserMessage)]
            assert not cancelled & set(claimed)
            assert not self.dropped & set(claimed)
            assert self.dropped <= cancelled
            # order and routing: pending lists are the sent messages, in send order, per queue
            gone = cancelled | set(claimed)
            for name, live in (("next-turn", agent.inbox.next_turn), ("next-step", agent.inbox.next_step)):
                expected = [i for i in self.sent if self.queue_of[i] == name and i not in gone]
                assert [m.id for m in live] == expected
            assert len(claimed) == len(set(claimed))
            pending = {m.id for m in (*agent.inbox.next_turn, *agent.inbox.next_step)}
            assert set(self.sent) == pending | set(claimed) | cancelled
            # the inbox rebuilt from the log equals the live inbox
            rebuilt = Inbox.replay(agent.session)
            assert rebuilt.next_turn == agent.inbox.next_turn
            assert rebuilt.next_step == agent.inbox.next_step
            # one driver task at most: a disposed agent's is gone before its resumed successor's starts
            assert len(_tasks_named(f"agent {agent.id} driver")) <= 1

        self.portal.run(check)

    def teardown(self) -> None:
        async def finish() -> None:
            if self.handle is not None:
                await self.handle.dispose()
            assert self.h.agents.list() == []
            assert _tasks_named("agent machine driver") == []  # disposal ends the parked driver too

        try:
            self.portal.run(finish)
        finally:
            self.portal.close()


AgentMachine.TestCase.settings = settings(
    max_examples=40,
    stateful_step_count=25,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAgentMachine = AgentMachine.TestCase
