"""The editor features of the ACP bridge, in process: terminals, plans, slash commands, config options.

The client (tests/_acp_editor.py) runs ``terminal/*`` commands as real
processes.  The same flows over the real stdio transport, driven by the
official Python and TypeScript SDKs: tests/test_acp_editor_sdk.py.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import trio
import trio.testing
from _acp_editor import EditorPeer, editor
from _util import NEEDS_BUBBLEWRAP, WAIT

from trio_harness import ScriptedModel, allow_all
from trio_harness.acp._commands import parse_command
from trio_harness.acp._config import ModelChoice, model_ids
from trio_harness.bash import BashRuntimeOptions, SandboxPolicy
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness
from trio_harness.tools import PlanEntry, current_plan

Msg = dict[str, Any]


def bash(command: str, **extra: Any) -> Msg:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command, **extra}}]}


def results(events: Any, name: str = "bash") -> list[ev.ToolResult]:
    return [e for e in events if isinstance(e, ev.ToolResult) and e.name == name]


async def new_session(peer: EditorPeer, cwd: Path) -> tuple[str, Msg]:
    result = await peer.call("session/new", {"cwd": str(cwd), "mcpServers": []})
    return result["sessionId"], result


async def prompt(peer: EditorPeer, session_id: str, text: str) -> Msg:
    result: Msg = await peer.call("session/prompt", peer.prompt_params(session_id, text))
    return result


# ---------------------------------------------------------------- terminals


async def test_foreground_bash_runs_in_the_clients_terminal_with_the_executors_result(tmp_path: Path) -> None:
    command = "echo hello; echo oops >&2; exit 3"
    model = ScriptedModel([bash(command), {"text": "done"}, bash(command), {"text": "done"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            via_terminal = results(agent.session.events)[0]
            assert [t.process.returncode for t in peer.terminals.values()] == [3]
            (terminal,) = peer.terminals.values()
            assert terminal.released and not terminal.killed
            assert peer.asked == ["terminal/create", "terminal/wait_for_exit", "terminal/output", "terminal/release"]
            # The terminal is embedded in the call live, and stays in its final update.
            shown = {"type": "terminal", "terminalId": terminal.id}
            embedded = [
                u
                for u in peer.updates(session_id)
                if u["sessionUpdate"] == "tool_call_update" and shown in u.get("content", [])
            ]
            assert embedded and embedded[-1]["status"] == "failed"
            assert embedded[0].get("status") is None  # live, before the call ended
            assert server._terminal is not None and not server._terminal.live and not server._terminal.terminals
        # The same command without the client's terminal: the result has the executor's shape.
        async with editor(harness, terminal=False, ask_permission=False) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            assert peer.asked == []
            agent = harness.agents.get(session_id)
            assert agent is not None
            local = results(agent.session.events)[0]
    assert local.is_error and via_terminal.is_error
    assert local.content == "hello\n[stderr]\noops\n[exit code: 3]"
    # A terminal merges the streams; the rest (exit marker, failed call) is the same.
    assert via_terminal.content in ("hello\noops\n[exit code: 3]", "oops\nhello\n[exit code: 3]")


async def test_a_cancelled_terminal_command_is_killed_and_released(tmp_path: Path) -> None:
    model = ScriptedModel([bash("echo started; sleep 60")])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            session_id, _ = await new_session(peer, tmp_path)
            message = await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: "terminal/wait_for_exit" in peer.asked)
            await peer.notify("session/cancel", {"sessionId": session_id})
            reply = await peer.response(message)
            assert reply["result"] == {"stopReason": "cancelled"}
            (terminal,) = peer.terminals.values()
            await peer.wait_until(lambda: terminal.released)
            assert terminal.killed and peer.asked[-2:] == ["terminal/kill", "terminal/release"]
            with trio.fail_after(5):
                await terminal.done.wait()
            assert server._terminal is not None and not server._terminal.live


async def test_a_terminal_created_while_the_call_is_cancelled_is_killed_and_released(tmp_path: Path) -> None:
    model = ScriptedModel([bash("sleep 60")])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            peer.hold_create = trio.Event()
            session_id, _ = await new_session(peer, tmp_path)
            message = await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: "terminal/create" in peer.asked)
            await peer.notify("session/cancel", {"sessionId": session_id})
            # The cancel ends the call at once: its answer does not wait for the client's terminal/create.
            assert (await peer.response(message))["result"] == {"stopReason": "cancelled"}
            assert peer.terminals == {}
            peer.hold_create.set()  # the client creates it after all
            await peer.wait_until(lambda: "terminal/release" in peer.asked)
            await trio.testing.wait_all_tasks_blocked()
            (terminal,) = peer.terminals.values()
            assert terminal.killed and terminal.released
            assert peer.asked == ["terminal/create", "terminal/kill", "terminal/release"]
            assert server._terminal is not None and not server._terminal.live


async def test_closing_the_session_kills_and_releases_its_running_terminal(tmp_path: Path) -> None:
    model = ScriptedModel([bash("sleep 60")])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, server):
            session_id, _ = await new_session(peer, tmp_path)
            await peer.send_request("session/prompt", peer.prompt_params(session_id, "go"))
            await peer.wait_until(lambda: "terminal/wait_for_exit" in peer.asked)
            assert await peer.call("session/close", {"sessionId": session_id}) == {}
            (terminal,) = peer.terminals.values()
            assert terminal.killed and terminal.released
            assert server._terminal is not None and not server._terminal.live


async def test_a_terminal_command_times_out_like_a_local_one(tmp_path: Path) -> None:
    model = ScriptedModel([bash("sleep 60", timeout_ms=300), {"text": "ok"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
            (terminal,) = peer.terminals.values()
            assert terminal.killed and terminal.released
    assert result.is_error and result.content == "(no output)\n[killed by signal SIGKILL]\n[timed out after 0.3s]"


async def test_a_client_that_never_answers_the_kill_does_not_hold_the_call_past_its_bound(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_harness.acp import _terminal

    monkeypatch.setattr(_terminal, "CLEANUP_TIMEOUT", 0.2)
    model = ScriptedModel([bash("sleep 60", timeout_ms=300), {"text": "ok"}])
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            peer.mute_kill = True
            session_id, _ = await new_session(peer, tmp_path)
            with trio.fail_after(WAIT):
                assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            (result,) = results(agent.session.events)
            (terminal,) = peer.terminals.values()
            assert terminal.released  # released (and killed by the release) all the same
    assert result.is_error and "did not answer terminal/kill" in result.content


async def test_background_bash_stays_local_and_approval_still_asks_first(tmp_path: Path) -> None:
    model = ScriptedModel([bash("echo bg", run_in_background=True), bash("echo fg"), {"text": "ok"}])
    async with open_test_harness(model, builtin_tools=["bash", "tasks"]) as harness:
        async with editor(harness) as (peer, _):  # asks permission (mode ask)
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            # One terminal, for the foreground call; each call asked first.
            assert len(peer.terminals) == 1
            assert peer.asked[:3] == ["session/request_permission", "session/request_permission", "terminal/create"]


@NEEDS_BUBBLEWRAP
async def test_under_a_sandbox_bash_stays_local_even_with_the_clients_terminal(tmp_path: Path) -> None:
    model = ScriptedModel([bash("echo confined > made.txt"), {"text": "ok"}])
    options = BashRuntimeOptions(sandbox=SandboxPolicy())
    async with open_test_harness(model, builtin_tools=["bash"], approver=allow_all, bash_options=options) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            assert peer.asked == [] and peer.terminals == {}
    assert (tmp_path / "made.txt").read_text() == "confined\n"


# ---------------------------------------------------------------- plans


PLAN: list[dict[str, Any]] = [
    {"content": "Read the code", "status": "completed", "priority": "high"},
    {"content": "Write the fix", "status": "in_progress", "priority": "medium"},
    {"content": "Run the tests", "status": "pending", "priority": "low"},
]


async def test_the_plan_is_sent_live_kept_in_the_log_and_replayed_on_load(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [{"name": "todo_write", "arguments": {"todos": PLAN[:1]}}]},
            {"tool_calls": [{"name": "todo_write", "arguments": {"todos": PLAN}}]},
            {"tool_calls": [{"name": "todo_write", "arguments": {"todos": [{"content": ""}]}}]},
            {"text": "planned"},
        ]
    )
    async with open_test_harness(model, builtin_tools=["plan"]) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            assert await prompt(peer, session_id, "go") == {"stopReason": "end_turn"}
            plans = [u["entries"] for u in peer.updates(session_id) if u["sessionUpdate"] == "plan"]
            assert plans == [PLAN[:1], PLAN]  # the invalid third list changed nothing
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert current_plan(agent) == tuple(PlanEntry(**entry) for entry in PLAN)
            kinds = {u.get("kind") for u in peer.updates(session_id) if u["sessionUpdate"] == "tool_call"}
            assert kinds == {"think"}
            await peer.call("session/close", {"sessionId": session_id})
        async with editor(harness, ask_permission=False) as (peer, _):
            await peer.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
            plans = [u["entries"] for u in peer.updates(session_id) if u["sessionUpdate"] == "plan"]
            assert plans == [PLAN]
            agent = harness.agents.get(session_id)
            assert agent is not None and current_plan(agent) == tuple(PlanEntry(**entry) for entry in PLAN)


# ---------------------------------------------------------------- slash commands


def test_what_counts_as_a_command() -> None:
    assert parse_command("/status") == ("status", "")
    assert parse_command("  /compact keep the tests \n") == ("compact", "keep the tests")
    assert parse_command("/usr/bin/env is broken") is None
    assert parse_command("look at /status") is None
    assert parse_command("/") is None
    assert parse_command("/tmp is full") is None  # no such command: a prompt for the model


async def test_commands_are_announced_and_answered_without_a_model_turn(tmp_path: Path) -> None:
    model = ScriptedModel(
        [{"text": "first answer"}, {"text": "second answer"}, {"text": "clear some space"}], summary="the summary"
    )
    async with open_test_harness(model) as harness:
        async with editor(harness) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            announced = await peer.wait_for(
                lambda m: (
                    m.get("method") == "session/update"
                    and m["params"]["update"]["sessionUpdate"] == "available_commands_update"
                )
            )
            names = [c["name"] for c in announced["params"]["update"]["availableCommands"]]
            assert {"compact", "cost", "status"} <= set(names)

            def answer_of(start: int) -> str:
                chunks = [u for u in peer.updates(session_id)[start:] if u["sessionUpdate"] == "agent_message_chunk"]
                return "".join(u["content"]["text"] for u in chunks)

            start = len(peer.updates(session_id))
            assert await prompt(peer, session_id, "/status") == {"stopReason": "end_turn"}
            status = answer_of(start)
            assert f"Session: {session_id}" in status and "Mode: ask" in status and "Durability: step" in status
            assert "Sandbox: off" in status and "Model: " in status
            assert model.requests == []  # no model turn

            for text in ("hello", "again"):
                assert await prompt(peer, session_id, text) == {"stopReason": "end_turn"}
            start = len(peer.updates(session_id))
            assert await prompt(peer, session_id, "/cost") == {"stopReason": "end_turn"}
            assert "Requests: 2" in answer_of(start)

            start = len(peer.updates(session_id))
            assert await prompt(peer, session_id, "/compact") == {"stopReason": "end_turn"}
            assert answer_of(start).startswith("Compacted the conversation")
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert [e.reason for e in agent.session.events if isinstance(e, ev.ContextCompacted)] == ["manual"]

            start = len(peer.updates(session_id))
            assert await prompt(peer, session_id, "/help") == {"stopReason": "end_turn"}
            listed = answer_of(start)
            assert "/compact" in listed and "/cost" in listed and "/status" in listed
            # Commands are no user messages: the model never saw them.
            texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert texts == ["hello", "again"]
            # A /word that names no command is a prompt like any other: "/tmp is full" is a sentence.
            start = len(peer.updates(session_id))
            assert await prompt(peer, session_id, "/tmp is full") == {"stopReason": "end_turn"}
            assert answer_of(start) == "clear some space"
            texts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert texts == ["hello", "again", "/tmp is full"]
            await peer.call("session/close", {"sessionId": session_id})
        async with editor(harness) as (peer, _):
            await peer.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
            kinds = [u["sessionUpdate"] for u in peer.updates(session_id)]
            assert "available_commands_update" in kinds


# ---------------------------------------------------------------- config options


def option(result: Msg, option_id: str) -> Msg:
    found: Msg = next(o for o in result["configOptions"] if o["id"] == option_id)
    return found


async def test_a_model_chosen_with_a_config_option_takes_the_next_request_and_survives_load(tmp_path: Path) -> None:
    first = ScriptedModel([{"text": "from A"}, {"text": "A again"}])
    second = ScriptedModel([{"text": "from B"}, {"text": "B after load"}])
    async with open_test_harness(first) as harness:
        async with editor(harness, models=[first, second]) as (peer, _):
            session_id, created = await new_session(peer, tmp_path)
            model = option(created, "model")
            assert model["type"] == "select" and model["category"] == "model"
            values = [o["value"] for o in model["options"]]
            assert model["currentValue"] == values[0] and len(values) == 2
            assert option(created, "mode")["currentValue"] == "ask"
            assert created["modes"]["currentModeId"] == "ask"
            assert await prompt(peer, session_id, "one") == {"stopReason": "end_turn"}
            assert len(first.requests) == 1 and second.requests == []

            answer = await peer.call(
                "session/set_config_option", {"sessionId": session_id, "configId": "model", "value": values[1]}
            )
            assert option(answer, "model")["currentValue"] == values[1]
            updates = [u for u in peer.updates(session_id) if u["sessionUpdate"] == "config_option_update"]
            assert option(updates[-1], "model")["currentValue"] == values[1]
            assert await prompt(peer, session_id, "two") == {"stopReason": "end_turn"}
            assert len(first.requests) == 1 and len(second.requests) == 1
            assert [m.text for m in second.requests[0].messages if m.role == "user"] == ["one", "two"]

            # set_mode and the mode option are one state.
            assert await peer.call("session/set_mode", {"sessionId": session_id, "modeId": "auto"}) == {}
            updates = [u for u in peer.updates(session_id) if u["sessionUpdate"] == "config_option_update"]
            assert option(updates[-1], "mode")["currentValue"] == "auto"
            agent = harness.agents.get(session_id)
            assert agent is not None
            logged = [(e.option, e.value) for e in agent.session.events if isinstance(e, ev.ConfigChanged)]
            assert logged == [("model", values[1]), ("mode", "auto")]

            bad = await peer.response(
                await peer.send_request(
                    "session/set_config_option", {"sessionId": session_id, "configId": "model", "value": "nope"}
                )
            )
            assert bad["error"]["code"] == -32602 and "unknown value 'nope'" in bad["error"]["message"]
            bad = await peer.response(
                await peer.send_request(
                    "session/set_config_option", {"sessionId": session_id, "configId": "colour", "value": "x"}
                )
            )
            assert "unknown configId 'colour'" in bad["error"]["message"]
            await peer.call("session/close", {"sessionId": session_id})

        async with editor(harness, models=[first, second]) as (peer, _):
            loaded = await peer.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
            assert option(loaded, "model")["currentValue"] == values[1]
            assert option(loaded, "mode")["currentValue"] == "auto" and loaded["modes"]["currentModeId"] == "auto"
            assert await prompt(peer, session_id, "three") == {"stopReason": "end_turn"}
            assert len(first.requests) == 1 and len(second.requests) == 2


async def test_one_model_is_the_only_value_of_the_model_option(tmp_path: Path) -> None:
    async with open_test_harness(ScriptedModel([])) as harness:
        async with editor(harness, ask_permission=False) as (peer, _):
            _, created = await new_session(peer, tmp_path)
            assert [o["id"] for o in created["configOptions"]] == ["model"]  # no modes without asking
            assert len(option(created, "model")["options"]) == 1


@pytest.mark.parametrize("value", [True, 3, ""])
async def test_a_config_value_that_is_no_string_is_invalid_params(tmp_path: Path, value: object) -> None:
    async with open_test_harness(ScriptedModel([])) as harness:
        async with editor(harness) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            params = {"sessionId": session_id, "configId": "mode", "value": value}
            reply = await peer.response(await peer.send_request("session/set_config_option", params))
            assert reply["error"]["code"] == -32602 and "value" in reply["error"]["message"]
            assert json.dumps(reply)  # a plain JSON-RPC error


def test_the_model_choice_forwards_to_the_chosen_model() -> None:
    small = ScriptedModel([], context_window=1000)
    large = ScriptedModel([], context_window=9000)
    choices = model_ids([small, large])
    assert list(choices) == ["scripted", "scripted#2"]
    choice = ModelChoice(choices, "scripted")
    assert choice.context_window == 1000 and choice.name == "scripted"
    choice.current = "scripted#2"
    assert choice.context_window == 9000 and choice.provider is large
    with pytest.raises(ValueError, match="unknown model 'nope'"):
        ModelChoice(choices, "nope")


class StallingSummaries:
    """A scripted model whose summary requests never answer (a ``/compact`` then waits)."""

    name = "stalling"

    def __init__(self, responses: list[Msg]) -> None:
        self.inner = ScriptedModel(responses)
        self.summary_asked = trio.Event()

    async def stream(self, request: Any, emit: Any) -> None:
        if request.purpose == "compaction":
            self.summary_asked.set()
            await trio.sleep_forever()
        await self.inner.stream(request, emit)


async def test_a_cancelled_command_answers_cancelled_and_the_session_goes_on(tmp_path: Path) -> None:
    model = StallingSummaries([{"text": "one"}, {"text": "two"}, {"text": "three"}])
    async with open_test_harness(model) as harness:
        async with editor(harness) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            for text in ("first", "second"):
                assert await prompt(peer, session_id, text) == {"stopReason": "end_turn"}
            message = await peer.send_request("session/prompt", peer.prompt_params(session_id, "/compact"))
            with trio.fail_after(5):
                await model.summary_asked.wait()
            busy = await peer.response(await peer.send_request("session/prompt", peer.prompt_params(session_id, "x")))
            assert "already has a prompt in flight" in busy["error"]["message"]
            await peer.notify("session/cancel", {"sessionId": session_id})
            assert (await peer.response(message))["result"] == {"stopReason": "cancelled"}
            assert await prompt(peer, session_id, "third") == {"stopReason": "end_turn"}
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert not [e for e in agent.session.events if isinstance(e, ev.ContextCompacted)]


async def test_a_logged_model_the_server_no_longer_offers_leaves_the_default_and_says_so(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    first = ScriptedModel([{"text": "A"}], context_window=1000)
    second = ScriptedModel([], context_window=2000)
    async with open_test_harness(first) as harness:
        async with editor(harness, models=[first, second]) as (peer, _):
            session_id, _ = await new_session(peer, tmp_path)
            params = {"sessionId": session_id, "configId": "model", "value": "scripted#2"}
            await peer.call("session/set_config_option", params)
            await peer.call("session/close", {"sessionId": session_id})
        async with editor(harness, models=[first]) as (peer, _):
            loaded = await peer.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
            assert option(loaded, "model")["currentValue"] == "scripted"
            assert await prompt(peer, session_id, "hi") == {"stopReason": "end_turn"}
    assert "chose model 'scripted#2', which this server does not offer" in caplog.text
