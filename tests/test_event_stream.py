"""``agent.events()``: a bounded stream that never blocks the agent and ends with it."""

from __future__ import annotations

from typing import Any

import pytest
import trio
import trio.testing
from _util import echo_tool

from trio_harness import AgentDisposedError, ScriptedModel
from trio_harness.agents import Agent, EventStream, StreamGap, StreamItem
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

ECHO = echo_tool()
TURN: list[dict[str, Any]] = [{"tool_calls": [{"name": "echo", "arguments": {}}]}, {"text": "done"}]


async def drain(stream: EventStream, into: list[StreamItem]) -> None:
    async for item in stream:
        into.append(item)


async def test_a_stream_yields_the_events_in_order_and_ends_when_the_agent_is_disposed() -> None:
    async with open_test_harness(ScriptedModel(TURN)) as h:
        h.tools.add(ECHO)
        handle = await h.agents.create()
        agent = handle.agent
        seen: list[StreamItem] = []
        ended = trio.Event()
        start = len(agent.session)
        async with agent.events() as stream, trio.open_nursery() as nursery:

            async def consume() -> None:
                await drain(stream, seen)
                ended.set()

            nursery.start_soon(consume)
            agent.followup("go")
            await agent.when_idle()
            await trio.testing.wait_all_tasks_blocked()
            assert not ended.is_set()  # still open while the agent lives
            await handle.dispose()
            with trio.fail_after(5):
                await ended.wait()
        assert stream.closed and stream.dropped == 0
        assert seen == list(agent.session.events[start:])
        assert isinstance(seen[-1], ev.TurnEnd)


async def test_a_consumer_that_never_reads_never_blocks_the_agent_and_gets_counted_gaps() -> None:
    async with open_test_harness(ScriptedModel([*TURN, *TURN])) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent, agent.events(buffer=3) as stream:
            start = len(agent.session)
            agent.followup("go")
            with trio.fail_after(5):  # the agent finishes its turn although nobody reads
                await agent.when_idle()
            total = len(agent.session) - start
            assert total > 3
            first = [await stream.__anext__() for _ in range(4)]
            events = agent.session.events
            assert first[:3] == list(events[start : start + 3])
            gap = first[3]
            assert gap == StreamGap(dropped=total - 3, first_seq=start + 3, last_seq=start + total - 1)
            assert stream.dropped == total - 3
            # the log holds exactly what the gap names
            assert len(events[gap.first_seq : gap.last_seq + 1]) == gap.dropped
            # once read, the stream delivers again, in order
            agent.followup("again")
            await agent.when_idle()
            more = [await stream.__anext__() for _ in range(3)]
            assert more == list(events[start + total : start + total + 3])


async def test_a_gap_is_delivered_in_order_before_later_events() -> None:
    async with open_test_harness(ScriptedModel([*TURN, *TURN])) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent, agent.events(buffer=2) as stream:
            start = len(agent.session)
            agent.followup("one")
            await agent.when_idle()
            # read the two buffered events: space frees, the next event sends the gap first
            assert [await stream.__anext__() for _ in range(2)] == list(agent.session.events[start : start + 2])
            middle = len(agent.session)
            agent.followup("two")
            await agent.when_idle()
            gap = await stream.__anext__()
            assert isinstance(gap, StreamGap) and gap.first_seq == start + 2 and gap.last_seq == middle - 1
            assert await stream.__anext__() == agent.session.events[middle]


async def test_a_pending_gap_is_delivered_after_the_agent_is_disposed() -> None:
    async with open_test_harness(ScriptedModel(TURN)) as h:
        h.tools.add(ECHO)
        handle = await h.agents.create()
        agent = handle.agent
        async with agent.events(buffer=2) as stream:
            start = len(agent.session)
            agent.followup("go")
            await agent.when_idle()
            await handle.dispose()
            seen: list[StreamItem] = []
            with trio.fail_after(5):
                await drain(stream, seen)
    end = len(agent.session)
    assert seen[:2] == list(agent.session.events[start : start + 2])
    assert seen[2:] == [StreamGap(dropped=end - start - 2, first_seq=start + 2, last_seq=end - 1)]


async def test_leaving_the_block_stops_the_stream_and_streams_are_independent() -> None:
    async with open_test_harness(ScriptedModel([*TURN, *TURN])) as h:
        h.tools.add(ECHO)
        async with h.agents.open() as agent:
            async with agent.events() as short:
                pass
            assert short.closed
            with pytest.raises(StopAsyncIteration):
                await short.__anext__()
            async with agent.events(buffer=1) as small, agent.events() as large:
                agent.followup("go")
                await agent.when_idle()
                assert small.dropped > 0 and large.dropped == 0
                assert small.buffer == 1 and large.buffer == 256
            agent.followup("after")  # no stream observes it any more
            await agent.when_idle()


async def test_a_disposed_agent_refuses_a_stream_and_a_bad_buffer_is_refused() -> None:
    async with open_test_harness() as h:
        handle = await h.agents.create()
        agent: Agent = handle.agent
        with pytest.raises(ValueError, match="buffer must be a positive int"):
            async with agent.events(buffer=0):
                pass
        await handle.dispose()
        with pytest.raises(AgentDisposedError, match="cannot stream its events"):
            async with agent.events():
                pass
