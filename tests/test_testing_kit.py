"""The testing kit (``trio_harness.testing``) as a user sees it: a pytest plugin in a fresh project.

Each test writes a user's test file into a temporary project, runs pytest on
it in a subprocess with only ``-p trio_harness.testing`` and ``trio_mode``
enabled (as a user's configuration would), and checks the outcome and the
messages the user would read.
"""

from __future__ import annotations

import textwrap
from typing import Any

import pytest

from trio_harness.session import _events as ev
from trio_harness.testing import EventLogMismatch, assert_balanced, assert_events

pytest_plugins = ["pytester"]

PLUGIN_ARGS = ("-p", "trio_harness.testing", "-o", "trio_mode=true", "-p", "no:cacheprovider")

HEADER = """\
from __future__ import annotations

from typing import Any

import trio

from trio_harness import Tool, ToolContext
from trio_harness.testing import NOISE, assert_balanced, assert_events


async def instant(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "instant"


async def sleepy(ctx: ToolContext, args: dict[str, Any]) -> str:
    await trio.sleep(1)
    return "sleepy"


def two_calls(first: str, second: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": first, "arguments": {}}, {"name": second, "arguments": {}}]}


ONE_TURN = [
    "turn/start",
    "step/start",
    "user/message",
    "assistant/message",
    "step/end",
    "turn/end",
]
"""


def write_user_tests(pytester: pytest.Pytester, body: str) -> None:
    pytester.makepyfile(test_user=HEADER + "\n\n" + textwrap.dedent(body))


def run_user_tests(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    return pytester.runpytest_subprocess(*PLUGIN_ARGS, "-v", *args)


def test_fixtures_and_assertions_pass_in_a_user_project(pytester: pytest.Pytester) -> None:
    write_user_tests(
        pytester,
        """
        async def test_one_turn(harness, scripted_model):
            scripted_model.push({"text": "hello"})
            async with harness.agents.open() as agent:
                agent.followup("hi")
                await agent.when_idle()
            assert_events(agent.session, ONE_TURN, ignore=NOISE)
            assert_balanced(agent.session)
            assert scripted_model.requests[0].messages[-1].text == "hi"


        async def test_fixtures_are_fresh_per_test(harness, scripted_model):
            assert scripted_model.requests == [] and scripted_model.remaining == 0
            assert harness.agents.list() == [] and harness.sessions.list() == []
            assert harness.tools.tools() == ()  # built-in tools are off by default


        async def test_cancel_under_autojump(harness, scripted_model, autojump_clock):
            scripted_model.push({"hang": True})
            async with harness.agents.open() as agent:
                agent.followup("wait forever")
                with trio.move_on_after(3600):
                    await agent.when_idle()
                agent.cancel()
                await agent.when_idle()
            assert trio.current_time() == 3600
            aborted = ["turn/start", "step/start", "user/message", "step/end", "turn/end"]
            assert_events(agent.session, aborted, ignore=NOISE)
            assert_balanced(agent.session)


        TOOL_STEP = [
            "turn/start",
            "step/start",
            {"request/header", "user/message"},  # a set: these two events, in any order
            "assistant/message",
            ["tool/result", "tool/result", "tool/call", "tool/call", "tool/started", "tool/started"],  # types repeat
            "step/end",
            "step/start",
            "request/header",
            "assistant/message",
            "step/end",
            "turn/end",
        ]


        async def test_set_aware_matching(harness, scripted_model, autojump_clock):
            harness.tools.add(Tool("instant", "i", {"type": "object"}, instant))
            harness.tools.add(Tool("sleepy", "s", {"type": "object"}, sleepy))
            scripted_model.push(two_calls("sleepy", "instant"), {"text": "done"})
            scripted_model.push(two_calls("instant", "sleepy"), {"text": "done"})
            async with harness.agents.open() as agent:
                agent.followup("one")
                agent.followup("two")
                await agent.when_idle()
            assert_events(agent.session, [*TOOL_STEP, *TOOL_STEP], ignore={"assistant/chunk", "agent/inbox/spliced"})
            assert_balanced(agent.session)
        """,
    )
    result = run_user_tests(pytester)
    result.assert_outcomes(passed=4)
    result.stdout.fnmatch_lines(["*test_set_aware_matching PASSED*"])


def test_wrong_expectation_fails_with_a_readable_mismatch(pytester: pytest.Pytester) -> None:
    write_user_tests(
        pytester,
        """
        async def test_expects_a_tool_call(harness, scripted_model):
            scripted_model.push({"text": "no tools today"})
            async with harness.agents.open() as agent:
                agent.followup("hi")
                await agent.when_idle()
            assert_events(
                agent.session,
                ["turn/start", "step/start", "user/message", "tool/call", "step/end", "turn/end"],
                ignore=NOISE,
            )


        async def test_expects_the_log_to_go_on(harness, scripted_model):
            scripted_model.push({"text": "short"})
            async with harness.agents.open() as agent:
                agent.followup("hi")
                await agent.when_idle()
            assert_events(agent.session, [*ONE_TURN, "turn/start"], ignore=NOISE)


        async def test_a_set_with_the_wrong_members(harness, scripted_model):
            scripted_model.push({"text": "hello"})
            async with harness.agents.open() as agent:
                agent.followup("hi")
                await agent.when_idle()
            expected = ["turn/start", "step/start", {"user/message", "tool/call"}, "assistant/message"]
            assert_events(agent.session, [*expected, "step/end", "turn/end"], ignore=NOISE)
        """,
    )
    result = run_user_tests(pytester)
    result.assert_outcomes(failed=3)
    result.stdout.fnmatch_lines(
        [
            "*EventLogMismatch: event log mismatch at expected item 3 (event 3): "
            "expected 'tool/call', found 'assistant/message'",
            "*expected:",
            "*3: 'tool/call'",
            "*actual:",
            "*3: assistant/message",
        ]
    )
    result.stdout.fnmatch_lines(
        ["*event log mismatch at expected item 6 (event 6): expected 'turn/start', found the end of the log"]
    )
    assert (  # (not fnmatch: the brackets would be a character class)
        "event log mismatch at expected item 2 (event 2): "
        "expected ['tool/call', 'user/message'] in any order, found 'user/message'"
    ) in result.stdout.str()
    # The user sees both sequences in full, not a bare "assert False".
    assert "AssertionError: assert" not in result.stdout.str()


# ---------------------------------------------------------------- the assertions in-process


def log(*events: type[ev.Event]) -> list[ev.Event]:
    """A synthetic log: each event class with the fields it needs."""
    fields: dict[type[ev.Event], dict[str, object]] = {
        ev.TurnStart: {"turn": 1},
        ev.StepStart: {"turn": 1, "step": 1},
        ev.StepEnd: {"turn": 1, "step": 1},
        ev.TurnEnd: {"turn": 1, "reason": "completed"},
    }
    return [cls(seq=i, ts=0.0, **fields[cls]) for i, cls in enumerate(events)]


def test_mismatch_message_lists_both_sequences() -> None:
    events = log(ev.TurnStart, ev.StepStart, ev.StepEnd, ev.TurnEnd)
    with pytest.raises(EventLogMismatch) as caught:
        assert_events(events, ["turn/start", "step/end"])
    assert str(caught.value).splitlines() == [
        "event log mismatch at expected item 1 (event 1): expected 'step/end', found 'step/start'",
        "expected:",
        "    0: 'turn/start'",
        "    1: 'step/end'",
        "actual:",
        "    0: turn/start",
        "    1: step/start",
        "    2: step/end",
        "    3: turn/end",
    ]
    assert isinstance(caught.value, AssertionError)


def test_set_group_is_order_insensitive_but_exact() -> None:
    events = log(ev.TurnStart, ev.StepStart, ev.StepEnd, ev.TurnEnd)
    assert_events(events, [{"step/start", "turn/start"}, ("turn/end", "step/end")])
    with pytest.raises(EventLogMismatch, match=r"expected \['step/end', 'turn/start'\] in any order"):
        assert_events(events, [{"turn/start", "step/end"}, "step/start", "turn/end"])
    with pytest.raises(EventLogMismatch, match="expected the log to end here, found 'turn/end'"):
        assert_events(events, [{"step/start", "turn/start"}, "step/end"])


def test_assert_balanced_names_the_open_turn() -> None:
    assert_balanced(log(ev.TurnStart, ev.StepStart, ev.StepEnd, ev.TurnEnd))
    with pytest.raises(EventLogMismatch, match="the log ends with turn 1 still open"):
        assert_balanced(log(ev.TurnStart, ev.StepStart, ev.StepEnd))
    with pytest.raises(
        EventLogMismatch, match=r"event 2 \(turn/end\): turn/end without an open turn, or with a step open"
    ):
        assert_balanced(log(ev.TurnStart, ev.StepStart, ev.TurnEnd))


async def test_a_store_directory_under_the_mock_clock_lets_no_trio_time_pass_during_writes(
    tmp_path: Any, autojump_clock: Any, caplog: pytest.LogCaptureFixture
) -> None:
    # Disposing an agent mid-turn flushes the session; with an fsync in a worker thread the mock clock
    # jumped past the 30 s bound of the scope's exit callbacks while the thread ran (a warning, and the
    # rest of the teardown went on without waiting for the driver).
    import logging

    import trio

    from trio_harness.model import ScriptedModel
    from trio_harness.session import JsonlStore
    from trio_harness.testing import open_test_harness

    with caplog.at_level(logging.WARNING, logger="trio_harness"):
        async with open_test_harness(ScriptedModel([{"text": "slow", "delay": 100}]), store=tmp_path) as harness:
            store = harness.sessions.persistence
            assert isinstance(store, JsonlStore) and store.inline_fsync
            handle = await harness.agents.create(cwd=str(tmp_path))
            handle.agent.followup("a turn still waiting for the model")
            await trio.sleep(1)
            began = trio.current_time()
            await handle.dispose()
            assert trio.current_time() - began < 1
    assert not [r.getMessage() for r in caplog.records if "did not finish" in r.getMessage()]
    kinds = [e.type for e in (await JsonlStore(tmp_path).load(handle.agent.id)).events]
    assert kinds[-1] == "turn/end"
