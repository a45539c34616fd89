"""MCP servers as tool sources, against real server processes (tests/mcp_servers/).

The servers are written with the official SDK's server side and run as real
processes: ``calc_server.py`` over stdio, ``http_server.py`` over streamable
HTTP on 127.0.0.1 (it refuses requests without the configured bearer token,
and can drop one tool's response stream or refuse the GET stream);
``raw_server.py`` speaks JSON-RPC by hand, to declare what the SDK's server
cannot (a malformed tool, a dangling ``$ref``).  A server records what it saw
(a call starting, a cancellation) in a file the test reads.  A frozen server
is a real process stopped with SIGSTOP.  Real subprocess I/O cannot run on a mock clock, so these tests run
on the real one; every wait is bounded with ``trio.fail_after`` and the few
timeouts under test are short.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, cast

import attrs
import pytest
import trio
from _acp_clients import open_server, tool_ends
from _util import WAIT, group_alive, read_line, turn_ends

from trio_harness import (
    AgentOptions,
    EventBus,
    McpConfigError,
    McpHttpServer,
    McpStartError,
    McpStdioServer,
    Notice,
    ScriptedModel,
    connect_mcp,
)
from trio_harness.agents import Tool, ToolContext, ToolOutput, ToolSet
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness
from trio_harness.tools import McpConnection, connect_mcp_servers
from trio_harness.tools._mcp_tools import _model_names, mcp_tool_name, render_mcp_result

SERVERS = Path(__file__).resolve().parent / "mcp_servers"


# ------------------------------------------------------------------ helpers


def calc(record: Path, *flags: str, name: str = "calc", **settings: Any) -> McpStdioServer:
    """The stdio test server, recording into ``record``."""
    return McpStdioServer(
        name=name,
        command=sys.executable,
        args=(str(SERVERS / "calc_server.py"), "--record", str(record), *flags),
        **settings,
    )


def raw(record: Path, *flags: str, name: str = "raw", **settings: Any) -> McpStdioServer:
    """The hand-written stdio test server (no SDK), recording into ``record``."""
    return McpStdioServer(
        name=name,
        command=sys.executable,
        args=(str(SERVERS / "raw_server.py"), "--record", str(record), *flags),
        **settings,
    )


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def results(session: Any) -> list[ev.ToolResult]:
    return [e for e in session.events if isinstance(e, ev.ToolResult)]


def recorded(record: Path) -> list[str]:
    return record.read_text(encoding="utf-8").splitlines() if record.exists() else []


async def wait_recorded(record: Path, line: str) -> None:
    """Wait until the server process wrote ``line`` (it runs on the real clock)."""
    with trio.fail_after(WAIT):
        while line not in recorded(record):
            await trio.sleep(0.01)


def server_pid(record: Path) -> int:
    (line,) = [line for line in recorded(record) if line.startswith("pid ")]
    return int(line.split()[1])


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] != "Z"


@asynccontextmanager
async def http_server(
    tmp_path: Path, *flags: str, token: str = "s3cret"
) -> AsyncIterator[tuple[str, Path, trio.Process]]:
    """Run tests/mcp_servers/http_server.py on 127.0.0.1; yields its MCP URL, record file and process."""
    record = tmp_path / "http-record.txt"
    with (tmp_path / "http-server.stderr").open("ab") as stderr:
        process = await trio.lowlevel.open_process(
            [sys.executable, str(SERVERS / "http_server.py"), "--token", token, "--record", str(record), *flags],
            stdout=subprocess.PIPE,
            stderr=stderr,
        )
    assert process.stdout is not None
    try:
        line = await read_line(process.stdout, "the HTTP test server")
        port = int(line.split()[1])
        yield f"http://127.0.0.1:{port}/mcp", record, process
    finally:
        if process.returncode is None:
            process.terminate()
        with trio.CancelScope(shield=True):
            await process.wait()
            await process.stdout.aclose()


# ------------------------------------------------------------------ names and results


def test_tool_names_are_what_the_model_apis_accept() -> None:
    assert mcp_tool_name("calc", "add") == "mcp__calc__add"
    assert mcp_tool_name("my server", "legacy.tool") == "mcp__my_server__legacy_tool"
    long = mcp_tool_name("s" * 40, "t" * 40)
    assert len(long) == 64 and long.startswith("mcp__sss") and long != mcp_tool_name("s" * 40, "t" * 41)
    # Two tools that sanitise to the same name are told apart; an unchanged name keeps its name.
    names = _model_names("calc", ["a.b", "a_b", "a/b"])
    assert names["mcp__calc__a_b"] == "a_b"
    assert sorted(names.values()) == ["a.b", "a/b", "a_b"]
    assert len(names) == 3 and all(len(name) <= 64 for name in names)


def test_results_map_every_content_kind() -> None:
    from mcp.types import CallToolResult, ImageContent, ResourceLink, TextContent

    result = CallToolResult(
        content=[
            TextContent(type="text", text="hello"),
            ImageContent(type="image", data="AAAA", mime_type="image/png"),
            ResourceLink(type="resource_link", name="doc", uri="file:///d.txt", description="the doc"),
        ],
        structured_content={"ignored": "because there is text"},
    )
    output = render_mcp_result(result)
    assert output.content == "hello\n[image: image/png, 3 bytes]\n[resource link: doc (file:///d.txt)] the doc"
    assert not output.is_error
    empty = render_mcp_result(CallToolResult(content=[], is_error=True))
    assert (empty.content, empty.is_error) == ("(no content)", True)


async def test_tool_definitions_follow_the_listing() -> None:
    from mcp.types import Tool as McpTool
    from mcp.types import ToolAnnotations

    server = McpStdioServer("srv", "unused", requires_approval=True)
    async with open_test_harness() as h:
        connection = McpConnection(server, h.scope, ToolSet())
        listed = McpTool(
            name="read",
            description=None,
            title="Read a file",
            input_schema={"properties": {"path": {"type": "string"}}},  # no "type": object is implied
            annotations=ToolAnnotations(read_only_hint=True),
        )
        tool = connection._tool("mcp__srv__read", listed)
        assert tool.description == "Read a file"
        assert dict(tool.parameters) == {"type": "object", "properties": {"path": {"type": "string"}}}
        assert tool.parallel_safe and tool.requires_approval
        broken = McpTool(name="odd", input_schema={"type": "object", "properties": {"a": {"type": 5}}})
        odd = connection._tool("mcp__srv__odd", broken)
        assert dict(odd.parameters) == {"type": "object"}  # offered anyway; the server checks arguments
        assert not odd.parallel_safe
        assert odd.description == "The 'odd' tool of MCP server 'srv'."
        # A $ref that resolves within the schema keeps it; one that resolves to nothing does not.
        defs = {"$defs": {"Key": {"type": "string"}}, "default": {"$ref": "#/nowhere"}}
        good = {"type": "object", "properties": {"key": {"$ref": "#/$defs/Key"}}, **defs}
        assert dict(connection._tool("mcp__srv__good", McpTool(name="good", input_schema=good)).parameters) == good
        dangling = {"type": "object", "properties": {"key": {"$ref": "#/$defs/Missing"}}, **defs}
        lost = connection._tool("mcp__srv__lost", McpTool(name="lost", input_schema=dangling))
        assert dict(lost.parameters) == {"type": "object"}


# ------------------------------------------------------------------ end to end over stdio


async def test_a_scripted_model_calls_an_mcp_tool_end_to_end(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel(
        [
            {"tool_calls": [call("mcp__calc__add", a=2, b=3)]},
            {"text": "2 + 3 = 5"},
        ]
    )
    async with open_test_harness(model, mcp_servers=[calc(record)]) as h:
        assert "mcp__calc__add" in [tool.name for tool in h.tools.tools()]
        async with h.agents.open() as agent:
            agent.followup("add 2 and 3")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            (result,) = results(agent.session)
            assert (result.name, result.content, result.is_error) == ("mcp__calc__add", "5", False)
            assert_balanced(agent.session)
        # The model was offered the server's tool with the server's schema.
        (spec,) = [tool for tool in model.requests[0].tools if tool.name == "mcp__calc__add"]
        assert spec.description == "Add two integers."
        assert spec.parameters["required"] == ["a", "b"]
        assert spec.parameters["properties"]["a"]["type"] == "integer"
        assert "mcp__calc__legacy_tool" in [tool.name for tool in model.requests[0].tools]
        pid = server_pid(record)
        assert group_alive(pid)
        (connection,) = h.mcp_connections
        assert connection.pid == pid and connection.name == "calc"
        # The servers' scope closes after the agents' (their calls end first), before the plugins'.
        names = [child.name for child in h.scope.children]
        assert names[-3:] == ["harness/plugins", "harness/mcp", "harness/agents"]
    assert not group_alive(pid)
    assert [tool.name for tool in h.tools.tools()] == []


async def test_harness_exit_mid_call_cancels_the_call_over_mcp_before_the_server_stops(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel([{"tool_calls": [call("mcp__calc__slow", tag="exit")]}])
    async with open_test_harness(model, mcp_servers=[calc(record)]) as h:
        agent = (await h.agents.create()).agent
        agent.followup("be slow")
        await wait_recorded(record, "started exit")
    # The agent was disposed (its call cancelled over MCP) while the server still ran.
    assert recorded(record)[-1] == "cancelled exit"
    assert not group_alive(server_pid(record))


async def test_results_map_faithfully_from_a_real_server(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            {
                "tool_calls": [
                    call("mcp__calc__media"),
                    call("mcp__calc__structured"),
                    call("mcp__calc__where", variable="CALC_TOKEN"),
                    call("mcp__calc__fail", reason="the disk is full"),
                ]
            },
            {"text": "done"},
        ]
    )
    server = calc(tmp_path / "record.txt", env={"CALC_TOKEN": "t0k"}, cwd=str(tmp_path))
    async with open_test_harness(model, mcp_servers=[server]) as h, h.agents.open() as agent:
        agent.followup("go")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        media, structured, where, fail = results(agent.session)
    assert media.content == (
        "here you go\n"
        "[image: image/png, 100 bytes]\n"
        "[audio: audio/wav, 1000 bytes]\n"
        "[resource link: report (file:///tmp/report.pdf, application/pdf, 2048 bytes)]\n"
        "[resource: memo://notes, text/plain]\nremember the milk\n"
        "[resource: memo://blob, application/octet-stream, 1000 bytes]"
    )
    assert not media.is_error
    assert json.loads(structured.content) == {"total": 3, "items": ["a", "b"]}
    # The server's env and cwd reached it; with text present, structuredContent is not repeated.
    assert json.loads(where.content) == {"cwd": str(tmp_path), "value": "t0k"}
    assert fail.is_error and "the disk is full" in fail.content


async def test_list_changed_refreshes_the_tools_before_the_next_step(tmp_path: Path) -> None:
    model = ScriptedModel(
        [
            {"tool_calls": [call("mcp__calc__grow")]},
            # The very next request already offers mul (and no longer legacy.tool).
            {"tool_calls": [call("mcp__calc__mul", a=6, b=7)]},
            {"text": "42"},
        ]
    )
    async with open_test_harness(model, mcp_servers=[calc(tmp_path / "record.txt")]) as h:
        async with h.agents.open() as agent:
            agent.followup("grow, then multiply")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            grow, mul = results(agent.session)
        assert (grow.content, mul.content, mul.is_error) == ("grown", "42", False)
        offered = [tool.name for tool in model.requests[1].tools]
        assert "mcp__calc__mul" in offered and "mcp__calc__legacy_tool" not in offered
        assert "mcp__calc__legacy_tool" not in [tool.name for tool in h.tools.tools()]


async def test_a_turn_cancelled_mid_call_sends_the_mcp_cancellation(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel(
        [
            {"tool_calls": [call("mcp__calc__slow", tag="first")]},
            {"tool_calls": [call("mcp__calc__add", a=1, b=1)]},
            {"text": "the server still works"},
        ]
    )
    async with open_test_harness(model, mcp_servers=[calc(record)]) as h, h.agents.open() as agent:
        agent.followup("be slow")
        await wait_recorded(record, "started first")
        assert agent.cancel("user")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        (slow,) = results(agent.session)
        assert slow.is_error and "cancelled" in slow.content
        # The server saw notifications/cancelled: its handler was cancelled while it runs on.
        await wait_recorded(record, "cancelled first")
        agent.followup("again")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        assert results(agent.session)[-1].content == "2"
        assert_balanced(agent.session)


async def test_a_crashed_server_gives_an_error_result_naming_it_and_restarts(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel(
        [
            {"tool_calls": [call("mcp__calc__crash")]},
            {"tool_calls": [call("mcp__calc__add", a=1, b=2)]},
            {"text": "it crashed and came back"},
        ]
    )
    async with open_test_harness(model, mcp_servers=[calc(record)]) as h:
        notices = notices_of(h.bus)
        async with h.agents.open() as agent:
            agent.followup("crash it")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            crash, add = results(agent.session)
            assert_balanced(agent.session)
    assert crash.is_error
    assert crash.content.startswith("error: MCP server 'calc' stopped during the call to 'crash': ")
    assert "the server process exited (exit code 3; stderr: " in crash.content
    assert "out of cheese" in crash.content
    # The next call started it again.
    assert (add.content, add.is_error) == ("3", False)
    assert [notice.name for notice in notices] == ["mcp/restarted"]
    assert len([line for line in recorded(record) if line.startswith("pid ")]) == 2


async def test_a_hung_server_times_out_and_the_turn_goes_on(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel([{"tool_calls": [call("mcp__calc__hang")]}, {"text": "it hung"}])
    server = calc(record, call_timeout=0.5, grace_period=0.5)
    async with open_test_harness(model, mcp_servers=[server]) as h, h.agents.open() as agent:
        agent.followup("hang")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        (hang,) = results(agent.session)
        assert hang.is_error
        assert hang.content == (
            "error: MCP server 'calc' did not answer the call to 'hang' within 0.5 s; "
            "the call was cancelled (the server may be hung)"
        )
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
        pid = server_pid(record)
    # The hung process (it reads nothing any more) was stopped with the harness.
    assert not group_alive(pid)


# ------------------------------------------------------------------ lifetime


async def test_an_agents_own_server_stops_with_it_children_included(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    connections: list[McpConnection] = []

    async def setup(agent: Any) -> None:
        connections.append(await connect_mcp(agent.scope, agent.tools, calc(record, "--child")))

    model = ScriptedModel([{"tool_calls": [call("mcp__calc__child_pid")]}, {"text": "ok"}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create(setup=setup)
        other = await h.agents.create(options=AgentOptions(model=ScriptedModel([])))
        (connection,) = connections
        assert connection.pid is not None and connection.pid == server_pid(record)
        # The tools are the agent's own: not the harness's, not another agent's.
        assert "mcp__calc__add" in [tool.name for tool in handle.agent.tools.tools()]
        assert [tool.name for tool in h.tools.tools()] == []
        assert [tool.name for tool in other.agent.tools.tools()] == []
        handle.agent.followup("which child?")
        with trio.fail_after(WAIT):
            await handle.agent.when_idle()
        child = int(results(handle.agent.session)[0].content)
        assert alive(child) and group_alive(connection.pid)
        with trio.fail_after(WAIT):
            await handle.dispose()
        assert not group_alive(connection.pid)
        assert not alive(child)
        assert connection.scope.closed
        assert connection.returncode == 0  # it exited by itself when its stdin closed


async def test_a_server_ignoring_eof_and_sigterm_is_killed(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    async with open_test_harness() as h:
        connection = await connect_mcp(h.scope, h.tools, calc(record, "--stubborn", grace_period=0.2))
        pid = connection.pid
        assert pid is not None and group_alive(pid)
        with trio.fail_after(WAIT):
            await connection.close()
        assert connection.returncode == -signal.SIGKILL
        assert not group_alive(pid)
        assert "stdin closed; staying" in recorded(record)
        assert [tool.name for tool in h.tools.tools()] == []


async def test_closing_the_connection_cancels_calls_in_flight_over_mcp(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    async with open_test_harness() as h:
        connection = await connect_mcp(h.scope, h.tools, calc(record))
        outputs = []

        async def call_slow() -> None:
            outputs.append(await connection.call("slow", {"tag": "inflight"}))

        async with trio.open_nursery() as nursery:
            nursery.start_soon(call_slow)
            await wait_recorded(record, "started inflight")
            with trio.fail_after(WAIT):
                await connection.close()
        (output,) = outputs
        assert output.is_error
        assert output.content == (
            "error: MCP server 'calc' was disconnected during the call to 'slow'; the call was cancelled over MCP"
        )
        assert "cancelled inflight" in recorded(record)
        after = await connection.call("add", {"a": 1, "b": 1})
        assert after.content == "error: MCP server 'calc' is not available: its connection is closed"


# ------------------------------------------------------------------ start failures


async def test_a_server_that_fails_to_start_is_named_with_its_stderr(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    with pytest.raises(McpStartError) as info:
        async with open_test_harness(mcp_servers=[calc(record, "--fail-start", name="db")]):
            pytest.fail("the harness opened")
    error = info.value
    assert error.servers == ("db",)
    message = str(error)
    assert message.startswith(f"MCP server 'db' ({sys.executable!r}) failed to start: ")
    assert "exit code 2; stderr: calc_server: cannot open the database (--fail-start)" in message
    assert "\n" not in message


async def test_a_missing_command_and_a_silent_server_fail_to_start(tmp_path: Path) -> None:
    pidfile = tmp_path / "silent.pid"
    async with open_test_harness() as h:
        with pytest.raises(
            McpStartError, match=r"^MCP server 'nope' \('no-such-mcp-server'\) failed to start: cannot run"
        ):
            await connect_mcp(h.scope, h.tools, McpStdioServer("nope", "no-such-mcp-server"))
        silent = McpStdioServer(
            "silent", "sh", args=("-c", f"echo $$ > {pidfile}; exec sleep 300"), startup_timeout=0.5, grace_period=0.2
        )
        with pytest.raises(McpStartError) as info:
            await connect_mcp(h.scope, h.tools, silent)
        assert "did not complete the MCP handshake and list its tools within 0.5 s" in str(info.value)
        assert "killed by SIGTERM" in str(info.value)
        # Nothing is left running and nothing was registered.
        assert not group_alive(int(pidfile.read_text()))
        assert [child.name for child in h.scope.children if "mcp:" in child.name] == []
        assert [tool.name for tool in h.tools.tools()] == []


async def test_several_servers_start_together_all_or_none(tmp_path: Path) -> None:
    good = calc(tmp_path / "good.txt", name="good")
    bad = calc(tmp_path / "bad.txt", "--fail-start", name="bad")
    async with open_test_harness() as h:
        with pytest.raises(McpStartError) as info:
            await connect_mcp_servers(h.scope, h.tools, [good, bad])
        assert info.value.servers == ("bad",)
        assert [tool.name for tool in h.tools.tools()] == []
        assert not group_alive(server_pid(tmp_path / "good.txt"))
        with pytest.raises(McpConfigError, match="MCP server 'good' is configured twice"):
            await connect_mcp_servers(h.scope, h.tools, [good, good])
        both = await connect_mcp_servers(h.scope, h.tools, [good, calc(tmp_path / "two.txt", name="two")])
        assert [connection.name for connection in both] == ["good", "two"]
        assert {"mcp__good__add", "mcp__two__add"} <= {tool.name for tool in h.tools.tools()}
        # A second server of the same name cannot take the same tool names.
        with pytest.raises(McpStartError, match="already registered"):
            await connect_mcp(h.scope, h.tools, calc(tmp_path / "three.txt", name="good"))


async def test_cancelling_a_start_of_several_servers_leaves_none_running(tmp_path: Path) -> None:
    pidfile = tmp_path / "silent.pid"
    good = calc(tmp_path / "good.txt", name="good")
    silent = McpStdioServer("silent", "sh", args=("-c", f"echo $$ > {pidfile}; exec sleep 300"), grace_period=0.2)
    async with open_test_harness() as h:
        with trio.CancelScope() as cancel_scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(connect_mcp_servers, h.scope, h.tools, [good, silent])
                with trio.fail_after(WAIT):  # one server is up, the other still starting
                    while h.tools.get("mcp__good__add") is None or not pidfile.exists():
                        await trio.sleep(0.01)
                cancel_scope.cancel()
        assert [tool.name for tool in h.tools.tools()] == []
        assert not group_alive(server_pid(tmp_path / "good.txt"))
        assert not group_alive(int(pidfile.read_text()))


# ------------------------------------------------------------------ streamable HTTP

# The SDK's streamable HTTP client leaves httpx2's response and SSE iterators
# unfinished when its streams are cancelled; Trio's async-generator finalizer
# then warns (ResourceWarning) as they are collected.  That is the client's own
# hygiene, not something these tests check.
sdk_http_iterators = pytest.mark.filterwarnings(
    r"ignore:Async generator 'httpx2\.:ResourceWarning", r"ignore:Async generator 'httpcore2\.:ResourceWarning"
)


@sdk_http_iterators
async def test_an_http_server_with_headers_end_to_end(tmp_path: Path) -> None:
    async with http_server(tmp_path) as (url, record, _):
        server = McpHttpServer("web", url, headers={"Authorization": "Bearer s3cret", "X-Client": "trio-harness"})
        model = ScriptedModel(
            [
                {"tool_calls": [call("mcp__web__whoami"), call("mcp__web__add", a=20, b=22)]},
                {"tool_calls": [call("mcp__web__slow", tag="http")]},
                {"text": "done"},
            ]
        )
        async with open_test_harness(model, mcp_servers=[server]) as h, h.agents.open() as agent:
            agent.followup("who am i")
            await wait_recorded(record, "started http")
            agent.cancel("user")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            whoami, add, slow = results(agent.session)
            assert (whoami.content, add.content) == ("client=trio-harness", "42")
            assert slow.is_error and "cancelled" in slow.content
            await wait_recorded(record, "cancelled http")
        assert "refused a request without the token" not in recorded(record)


@sdk_http_iterators
async def test_an_http_server_refusing_the_headers_fails_to_start_with_the_status(tmp_path: Path) -> None:
    async with http_server(tmp_path) as (url, record, _):
        server = McpHttpServer("web", url, headers={"Authorization": "Bearer wrong"}, startup_timeout=10)
        async with open_test_harness() as h:
            with pytest.raises(McpStartError) as info:
                await connect_mcp(h.scope, h.tools, server)
        assert str(info.value).startswith(f"MCP server 'web' ({url}) failed to start: ")
        assert f"HTTP 401 Unauthorized from {url}" in str(info.value)
        assert "refused a request without the token" in recorded(record)
    async with open_test_harness() as h:
        with pytest.raises(McpStartError, match="ConnectError"):
            await connect_mcp(h.scope, h.tools, McpHttpServer("gone", url, startup_timeout=10))


@sdk_http_iterators
async def test_an_http_server_going_away_gives_error_results_naming_it(tmp_path: Path) -> None:
    async with open_test_harness() as h, http_server(tmp_path) as (url, _, process):
        server = McpHttpServer("web", url, headers={"Authorization": "Bearer s3cret"})
        connection = await connect_mcp(h.scope, h.tools, server)
        assert (await connection.call("add", {"a": 1, "b": 2})).content == "3"
        process.kill()
        await process.wait()
        lost = await connection.call("add", {"a": 1, "b": 2})
        assert lost.is_error
        assert lost.content.startswith("error: MCP server 'web' stopped during the call to 'add': the connection ")
        later = await connection.call("add", {"a": 1, "b": 2})
        assert later.content.startswith("error: MCP server 'web' is not available: the connection ")
        assert connection.failure is not None and connection.failure in later.content


# ------------------------------------------------------------------ agent-local use from setup


async def test_connect_mcp_into_any_tool_set_and_scope(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    tools = ToolSet()
    async with open_test_harness() as h:
        child = await h.scope.open_child("mine")
        connection = await connect_mcp(child, tools, calc(record))
        assert connection.tool_names["mcp__calc__legacy_tool"] == "legacy.tool"
        add = tools.get("mcp__calc__add")
        assert add is not None
        assert await add.handler(cast(ToolContext, None), {"a": 4, "b": 5}) == ToolOutput("9")
        assert repr(connection) == "<McpConnection 'calc' stdio open tools=11>"
        await child.close()
        assert connection.scope.closed and tools.tools() == ()
        assert not group_alive(server_pid(record))


async def test_refresh_on_demand_and_on_list_changed(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    async with open_test_harness() as h:
        connection = await connect_mcp(h.scope, h.tools, calc(record))
        before = set(connection.tool_names)
        await connection.refresh()
        assert set(connection.tool_names) == before
        grown = await connection.call("grow", {})
        assert grown.content == "grown"
        # The answer came after the notification, so the new list is registered already.
        assert "mcp__calc__mul" in connection.tool_names
        assert "mcp__calc__legacy_tool" not in connection.tool_names
        assert connection.refresh_failure is None and connection.failure is None


# ------------------------------------------------------------------ the command line


async def run_cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(WAIT * 2):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def write_json(path: Path, data: object) -> Path:
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


async def test_cli_run_with_an_mcp_config(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    server = {"command": sys.executable, "args": [str(SERVERS / "calc_server.py"), "--record", str(record)]}
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"calc": server}})
    model = write_json(
        tmp_path / "script.json",
        {"responses": [{"tool_calls": [call("mcp__calc__add", a=19, b=23)]}, {"text": "It is 42."}]},
    )
    store = str(tmp_path / "store")
    args = ("--model", f"scripted:{model}", "--store", store, "--tools", "none", "--mcp-config", str(config))
    result = await run_cli("run", "add 19 and 23", *args, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode().strip() == "It is 42."
    assert '[tool] mcp__calc__add {"a": 19, "b": 23}' in result.stderr.decode()
    assert "[tool result] 42" in result.stderr.decode()
    assert not group_alive(server_pid(record))


@pytest.mark.parametrize("command", ["run", "acp"])
async def test_cli_mcp_problems_exit_2_with_one_line(tmp_path: Path, command: str) -> None:
    model = write_json(tmp_path / "script.json", {"responses": [{"text": "never"}]})
    common = ("--model", f"scripted:{model}", "--store", str(tmp_path / "store"))
    head = ("run", "hi") if command == "run" else ("acp",)
    bad = write_json(tmp_path / "bad.json", {"mcpServers": {"calc": {"command": ["python"]}}})
    failing = write_json(
        tmp_path / "failing.json",
        {"db": {"command": sys.executable, "args": [str(SERVERS / "calc_server.py"), "--fail-start"]}},
    )
    for config, expected in [
        (bad, f"trio-harness: error: {bad}: MCP server 'calc': command: must be a string, got list"),
        (tmp_path / "missing.json", "trio-harness: error: cannot read the MCP config"),
        (failing, "trio-harness: error: MCP server 'db' ("),
    ]:
        result = await run_cli(*head, *common, "--mcp-config", str(config), cwd=tmp_path)
        err = result.stderr.decode()
        assert result.returncode == 2, err
        assert err.count("\n") == 1 and err.startswith(expected), err
        assert result.stdout == b""
    assert "cannot open the database" in err


# ------------------------------------------------------------------ ACP


def acp_calc(record: Path, *flags: str, name: str = "calc") -> dict[str, Any]:
    args = [str(SERVERS / "calc_server.py"), "--record", str(record), *flags]
    return {"name": name, "command": sys.executable, "args": args, "env": [{"name": "CALC_TOKEN", "value": "acp"}]}


async def test_acp_session_mcp_servers_are_that_sessions_alone(tmp_path: Path) -> None:
    first, other, third = tmp_path / "first.txt", tmp_path / "other.txt", tmp_path / "third.txt"
    responses: list[dict[str, Any]] = [
        {"tool_calls": [call("mcp__calc__where", variable="CALC_TOKEN")]},
        {"text": "found it"},
        {"tool_calls": [call("mcp__calc__add", a=1, b=1)]},
        {"text": "no such tool here"},
    ]
    async with open_server(tmp_path, responses, tools="none") as client:
        init = await client.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
        assert init["agentCapabilities"]["mcpCapabilities"] == {"http": True, "sse": False}
        new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": [acp_calc(first)]})
        plain = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": []})
        mine = new["sessionId"]
        prompt = {"sessionId": mine, "prompt": [{"type": "text", "text": "where?"}]}
        assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        (update,) = tool_ends(client.updates(mine))
        assert update["status"] == "completed"
        assert json.loads(update["content"][0]["content"]["text"]) == {"cwd": str(tmp_path), "value": "acp"}
        # The other session does not have the first session's tools.
        prompt = {"sessionId": plain["sessionId"], "prompt": [{"type": "text", "text": "add"}]}
        assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        (update,) = tool_ends(client.updates(plain["sessionId"]))
        assert update["status"] == "failed"
        assert "unknown tool 'mcp__calc__add'" in update["content"][0]["content"]["text"]
        # Closing the session stops its server.
        pid = server_pid(first)
        assert group_alive(pid)
        assert await client.call("session/close", {"sessionId": mine}) == {}
        assert not group_alive(pid)
        # A session/load starts the servers it lists too; a disconnect stops them.
        await client.call("session/load", {"sessionId": mine, "cwd": str(tmp_path), "mcpServers": [acp_calc(other)]})
        await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": [acp_calc(third)]})
        pids = [server_pid(other), server_pid(third)]
        assert all(group_alive(pid) for pid in pids)
    assert not any(group_alive(pid) for pid in pids)


async def test_acp_a_session_server_that_crashed_restarts_and_the_log_says_so(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    responses: list[dict[str, Any]] = [
        {"tool_calls": [call("mcp__calc__crash")]},
        {"tool_calls": [call("mcp__calc__add", a=2, b=3)]},
        {"text": "back"},
    ]
    async with open_server(tmp_path, responses, tools="none") as client:
        await client.call("initialize", {"protocolVersion": 1})
        new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": [acp_calc(record)]})
        prompt = {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "crash it"}]}
        assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        crashed, added = tool_ends(client.updates(new["sessionId"]))
        assert (crashed["status"], added["status"]) == ("failed", "completed")
        assert added["content"][0]["content"]["text"] == "5"
    log = (tmp_path / "script.stderr").read_text(encoding="utf-8")
    assert "trio_harness.acp: WARNING: MCP server 'calc' restarted; it had stopped: " in log, log
    assert len([line for line in recorded(record) if line.startswith("pid ")]) == 2


async def test_acp_a_server_that_fails_to_start_fails_session_new_naming_it(tmp_path: Path) -> None:
    async with open_server(tmp_path, [], tools="none") as client:
        await client.call("initialize", {"protocolVersion": 1})
        servers = [acp_calc(tmp_path / "ok.txt", name="ok"), acp_calc(tmp_path / "db.txt", "--fail-start", name="db")]
        error = await client.error(client.request("session/new", {"cwd": str(tmp_path), "mcpServers": servers}))
        assert error["code"] == -32603
        assert error["message"].startswith(f"MCP server 'db' ({sys.executable!r}) failed to start: ")
        assert "cannot open the database" in error["message"]
        assert error["data"] == {"error": "McpStartError", "mcpServers": ["db"]}
        assert not group_alive(server_pid(tmp_path / "ok.txt"))  # the one that started was stopped again
        sse = {"type": "sse", "name": "old", "url": "http://127.0.0.1:1/sse", "headers": []}
        error = await client.error(client.request("session/new", {"cwd": str(tmp_path), "mcpServers": [sse]}))
        assert error["code"] == -32602
        assert "mcpServers[0] has type 'sse'" in error["message"]
        assert (await client.call("session/list", {}))["sessions"] == []


@sdk_http_iterators
async def test_acp_an_http_server_in_session_new(tmp_path: Path) -> None:
    async with http_server(tmp_path) as (url, record, _):
        web = {
            "type": "http",
            "name": "web",
            "url": url,
            "headers": [{"name": "Authorization", "value": "Bearer s3cret"}, {"name": "X-Client", "value": "zed"}],
        }
        responses: list[dict[str, Any]] = [{"tool_calls": [call("mcp__web__whoami")]}, {"text": "you are zed"}]
        async with open_server(tmp_path, responses, tools="none") as client:
            await client.call("initialize", {"protocolVersion": 1})
            new = await client.call("session/new", {"cwd": str(tmp_path), "mcpServers": [web]})
            prompt = {"sessionId": new["sessionId"], "prompt": [{"type": "text", "text": "who am i?"}]}
            assert await client.call("session/prompt", prompt) == {"stopReason": "end_turn"}
            (update,) = tool_ends(client.updates(new["sessionId"]))
            assert update["status"] == "completed"
            assert update["content"][0]["content"]["text"] == "client=zed"
        assert "refused a request without the token" not in recorded(record)


# ------------------------------------------------------------------ a frozen server: every call bounded


def notices_of(bus: EventBus) -> list[Notice]:
    """Every ``mcp/*`` notice the bus delivers from now on."""
    seen: list[Notice] = []
    bus.on("*", lambda notice: seen.append(notice) if notice.name.startswith("mcp/") else None)
    return seen


async def test_a_frozen_stdio_server_bounds_every_call_and_a_cancel_returns_at_once(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    model = ScriptedModel([{"tool_calls": [call("mcp__raw__echo", text="during the freeze")]}, {"text": "cancelled"}])
    server = raw(record, call_timeout=1.0, grace_period=0.2)
    async with open_test_harness(model, mcp_servers=[server]) as h:
        (connection,) = h.mcp_connections
        pid = connection.pid
        assert pid is not None
        os.kill(pid, signal.SIGSTOP)  # it reads nothing more: the pipe fills, writes block
        try:
            # A large argument (more than a pipe holds), then a small one: each ends by its call_timeout.
            for text in ("x" * (4 << 20), "small"):
                start = trio.current_time()
                with trio.fail_after(WAIT):
                    output = await connection.call("size", {"text": text})
                elapsed = trio.current_time() - start
                assert output.content == (
                    "error: MCP server 'raw' did not answer the call to 'size' within 1 s; "
                    "the call was cancelled (the server may be hung)"
                )
                assert elapsed < 3.0, elapsed  # 1 s, and never the SDK's 5 s for the cancel's write
            # A cancel of the turn during such a call returns at once.
            async with h.agents.open() as agent:
                agent.followup("echo")
                with trio.fail_after(WAIT):
                    while not any(isinstance(e, ev.ToolCallRequested) for e in agent.session.events):
                        await trio.sleep(0.01)
                await trio.sleep(0.2)
                cancelled_at = trio.current_time()
                agent.cancel("user")
                with trio.fail_after(WAIT):
                    await agent.when_idle()
                assert trio.current_time() - cancelled_at < 1.5
                (echo,) = results(agent.session)
                assert echo.is_error and "cancelled" in echo.content
        finally:
            os.kill(pid, signal.SIGCONT)
        # Once it runs again the connection works: nothing half-written was left behind.
        with trio.fail_after(WAIT):
            assert (await connection.call("echo", {"text": "back"})).content == '{"text": "back"}'
        assert connection.failure is None


@sdk_http_iterators
async def test_a_frozen_http_server_bounds_every_call(tmp_path: Path) -> None:
    async with http_server(tmp_path) as (url, _, process), open_test_harness() as h:
        server = McpHttpServer("web", url, headers={"Authorization": "Bearer s3cret"}, call_timeout=1.0)
        connection = await connect_mcp(h.scope, h.tools, server)
        os.kill(process.pid, signal.SIGSTOP)
        try:
            # The second call used to wait behind the first one's cancel notification (httpx's 300 s).
            for _ in range(2):
                start = trio.current_time()
                with trio.fail_after(WAIT):
                    output = await connection.call("add", {"a": 1, "b": 2})
                assert trio.current_time() - start < 3.0
                assert output.content.startswith("error: MCP server 'web' did not answer the call to 'add' within 1 s")
            # A cancelled call returns at once.
            with trio.CancelScope() as cancel_scope:
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(connection.call, "add", {"a": 1, "b": 2})
                    await trio.sleep(0.3)
                    cancelled_at = trio.current_time()
                    cancel_scope.cancel()
            assert trio.current_time() - cancelled_at < 1.0
        finally:
            os.kill(process.pid, signal.SIGCONT)
        with trio.fail_after(WAIT):
            assert (await connection.call("add", {"a": 1, "b": 2})).content == "3"


# ------------------------------------------------------------------ one request failing fails that call only


@sdk_http_iterators
async def test_one_dropped_response_stream_fails_that_call_only(tmp_path: Path) -> None:
    async with http_server(tmp_path, "--drop", "drop", "--no-get") as (url, record, process):
        async with open_test_harness() as h:
            server = McpHttpServer("web", url, headers={"Authorization": "Bearer s3cret"})
            connection = await connect_mcp(h.scope, h.tools, server)
            with trio.fail_after(WAIT):
                dropped = await connection.call("drop", {})
            assert dropped.is_error
            assert dropped.content == (
                "error: MCP server 'web' did not answer the call to 'drop': SSE stream ended without a response "
                "(the call may or may not have run)"
            )
            assert "dropped the response stream of drop" in recorded(record)
            # The server and the connection are fine: the next call is answered.
            with trio.fail_after(WAIT):
                assert (await connection.call("add", {"a": 1, "b": 2})).content == "3"
            assert connection.failure is None
            # The optional GET stream was refused with 405, as the protocol allows: no message blames it.
            assert "answered GET with 405" in recorded(record)
            process.kill()
            await process.wait()
            with trio.fail_after(WAIT):
                lost = await connection.call("add", {"a": 1, "b": 2})
            assert lost.content.startswith("error: MCP server 'web' stopped during the call to 'add': ")
            failure = cast("str | None", connection.failure)  # no longer the None asserted above
            assert "405" not in lost.content and failure is not None and "405" not in failure


# ------------------------------------------------------------------ a crashed server is restarted


async def test_a_crashed_stdio_server_restarts_on_the_next_call_within_its_window(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    bus = EventBus()
    notices = notices_of(bus)
    async with open_test_harness() as h:
        connection = await connect_mcp(h.scope, h.tools, raw(record, max_restarts=1, grace_period=0.2), bus=bus)
        first = connection.pid
        assert first is not None
        crash = await connection.call("crash", {})
        assert crash.content.startswith("error: MCP server 'raw' stopped during the call to 'crash': ")
        assert "the server process exited (exit code 3; stderr: raw_server: fatal: asked to crash)" in crash.content
        # While it is down its last tool list stays.
        assert "mcp__raw__echo" in [tool.name for tool in h.tools.tools()]
        with trio.fail_after(WAIT):
            echo = await connection.call("echo", {"text": "again"})
        assert echo.content == '{"text": "again"}'
        assert connection.pid not in (None, first) and not group_alive(first) and connection.failure is None
        assert [line for line in recorded(record) if line.startswith("pid ")] == [
            f"pid {first}",
            f"pid {connection.pid}",
        ]
        ((name, subject, data),) = [(n.name, n.subject, dict(n.data)) for n in notices]
        assert (name, subject, subject.id) == ("mcp/restarted", connection, "raw")
        assert data["reason"].startswith("the server process exited (exit code 3")
        assert data["transport"] == "stdio" and data["restarts"] == 1
        # One restart per window: after a second crash it stays down and says why.
        await connection.call("crash", {})
        down = await connection.call("echo", {})
        assert down.is_error
        assert down.content.startswith(
            "error: MCP server 'raw' is not available: the server process exited (exit code 3"
        )
        assert "; 1 attempt to restart it within the last 300 s (max_restarts); the next attempt is in " in down.content
        assert len([line for line in recorded(record) if line.startswith("pid ")]) == 2


async def test_a_failing_restart_is_an_error_result_and_retried_after_a_backoff(tmp_path: Path) -> None:
    record, lock = tmp_path / "record.txt", tmp_path / "lock"
    bus = EventBus()
    notices = notices_of(bus)
    async with open_test_harness() as h:
        server = raw(record, "--fail-start-if", str(lock), grace_period=0.2)
        connection = await connect_mcp(h.scope, h.tools, server, bus=bus)
        lock.touch()
        await connection.call("crash", {})
        with trio.fail_after(WAIT):
            failed = await connection.call("echo", {})
        assert failed.is_error
        assert failed.content.startswith(
            "error: MCP server 'raw' is not available: the server process exited (exit code 3"
        )
        assert "; restarting it failed: the server process exited (exit code 2; stderr: raw_server: the lock" in (
            failed.content
        )
        assert failed.content.endswith("; the next attempt is in 1 s")
        # Within the backoff no attempt is made.
        again = await connection.call("echo", {})
        assert again.is_error and "the next attempt is in " in again.content
        assert recorded(record).count("refused to start") == 1
        lock.unlink()
        await trio.sleep(1.1)  # the real clock: the server is a real process
        with trio.fail_after(WAIT):
            back = await connection.call("echo", {"text": "back"})
        assert back.content == '{"text": "back"}'
        assert [n.name for n in notices] == ["mcp/restart-failed", "mcp/restarted"]
        failed_notice = notices[0]
        assert failed_notice.data["retry_in"] == 1.0
        assert "exit code 2" in failed_notice.data["error"]


@sdk_http_iterators
async def test_an_http_server_is_reconnected_on_the_next_call_once_it_is_back(tmp_path: Path) -> None:
    bus = EventBus()
    notices = notices_of(bus)
    async with open_test_harness() as h:
        async with http_server(tmp_path) as (url, _, process):
            server = McpHttpServer("web", url, headers={"Authorization": "Bearer s3cret"})
            connection = await connect_mcp(h.scope, h.tools, server, bus=bus)
            process.kill()
            await process.wait()
            with trio.fail_after(WAIT):
                lost = await connection.call("add", {"a": 1, "b": 2})
            assert lost.content.startswith("error: MCP server 'web' stopped during the call to 'add': ")
            with trio.fail_after(WAIT):
                down = await connection.call("add", {"a": 1, "b": 2})
            assert down.content.startswith("error: MCP server 'web' is not available: the connection ")
            assert "; reconnecting it failed: " in down.content and "ConnectError" in down.content
        port = url.split(":")[2].split("/")[0]
        async with http_server(tmp_path, "--port", port) as (again, _, process):
            assert again == url
            await trio.sleep(1.1)  # the backoff after the failed attempt (real clock)
            with trio.fail_after(WAIT):
                back = await connection.call("add", {"a": 20, "b": 22})
            assert back.content == "42"
            assert [n.name for n in notices] == ["mcp/restart-failed", "mcp/restarted"]
            assert notices[1].data["transport"] == "http"
            process.kill()
            await process.wait()
        # A server restarted between two calls no longer knows the session: that call fails, the next reconnects.
        async with http_server(tmp_path, "--port", port):
            with trio.fail_after(WAIT):
                forgotten = await connection.call("add", {"a": 1, "b": 1})
            assert forgotten.content.startswith("error: MCP server 'web' stopped during the call to 'add': "), forgotten
            assert connection.failure is not None and "session" in connection.failure
            with trio.fail_after(WAIT):
                assert (await connection.call("add", {"a": 1, "b": 1})).content == "2"
            assert [n.name for n in notices][-1] == "mcp/restarted"


async def test_cli_run_shows_a_restart_and_a_skipped_tool_on_a_line(tmp_path: Path) -> None:
    record = tmp_path / "record.txt"
    flags = ["--record", str(record), "--malformed"]
    server = {"command": sys.executable, "args": [str(SERVERS / "raw_server.py"), *flags]}
    config = write_json(tmp_path / "mcp.json", {"mcpServers": {"raw": server}})
    responses = [
        {"tool_calls": [call("mcp__raw__crash")]},
        {"tool_calls": [call("mcp__raw__echo", text="hi")]},
        {"text": "it came back"},
    ]
    model = write_json(tmp_path / "script.json", {"responses": responses})
    args = ("--model", f"scripted:{model}", "--store", str(tmp_path / "store"), "--tools", "none")
    result = await run_cli("run", "crash it", *args, "--mcp-config", str(config), cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 0, err
    lines = err.splitlines()
    scalar, nameless, restart = [line for line in lines if line.startswith("[mcp] ")]
    # The tools left out are named once, before the turn; the restart where it happened.
    assert (
        scalar == "[mcp] MCP server 'raw': the tool 'scalar' is not offered: inputSchema.type: Input should be 'object'"
    )
    assert nameless == "[mcp] MCP server 'raw': the tool '#6' is not offered: name: Field required"
    assert lines.index(nameless) < lines.index("[tool] mcp__raw__crash {}")
    assert restart.startswith(
        "[mcp] MCP server 'raw' restarted; it had stopped: the server process exited (exit code 3"
    )
    assert lines.index("[tool] mcp__raw__crash {}") < lines.index(restart) < lines.index('[tool result] {"text": "hi"}')


# ------------------------------------------------------------------ schemas and declarations


async def test_a_tool_with_a_dangling_ref_is_offered_with_unchecked_arguments(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    model = ScriptedModel([{"tool_calls": [call("mcp__raw__lookup", key=42)]}, {"text": "found"}])
    async with open_test_harness(model, mcp_servers=[raw(tmp_path / "record.txt")]) as h, h.agents.open() as agent:
        agent.followup("look it up")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        (result,) = results(agent.session)
        assert (result.content, result.is_error) == ('{"key": 42}', False)
        assert turn_ends(agent) == [(1, "completed", None)]
    (spec,) = [tool for tool in model.requests[0].tools if tool.name == "mcp__raw__lookup"]
    assert dict(spec.parameters) == {"type": "object"}
    assert "MCP server 'raw': tool 'lookup' has an unusable input schema (" in caplog.text
    assert "#/$defs/Key" in caplog.text


async def test_an_exception_from_argument_validation_is_that_calls_error_result(
    autojump_clock: trio.testing.MockClock,
) -> None:
    async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ran"

    # The schema is valid JSON Schema; checking arguments against it raises (the $ref resolves to nothing).
    odd = Tool(
        name="odd",
        description="A tool whose schema cannot be checked.",
        parameters={"type": "object", "properties": {"k": {"$ref": "#/$defs/K"}}},
        handler=handler,
    )
    model = ScriptedModel([{"tool_calls": [call("odd", k=1)]}, {"text": "went on"}])
    async with open_test_harness(model) as h:
        h.tools.add(odd)
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            (result,) = results(agent.session)
            assert result.is_error
            assert result.content.startswith("error: the arguments for tool 'odd' could not be checked: ")
            assert "#/$defs/K" in result.content
            assert turn_ends(agent) == [(1, "completed", None)]


async def test_a_malformed_tool_declaration_skips_that_tool_only(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = raw(tmp_path / "record.txt", "--malformed")
    skipped = {"scalar": "inputSchema.type: Input should be 'object'", "#6": "name: Field required"}
    model = ScriptedModel([{"tool_calls": [call("mcp__raw__echo", text="ok")]}, {"text": "done"}])
    async with open_test_harness(model, mcp_servers=[server]) as h:
        (connection,) = h.mcp_connections
        offered = ["mcp__raw__crash", "mcp__raw__echo", "mcp__raw__lookup", "mcp__raw__size"]
        assert sorted(connection.tool_names) == offered
        assert connection.skipped_tools == skipped
        assert "MCP server 'raw': the tool 'scalar' is not offered: inputSchema.type: Input should be" in caplog.text
        async with h.agents.open() as agent:
            agent.followup("echo")
            with trio.fail_after(WAIT):
                await agent.when_idle()
            assert [(r.content, r.is_error) for r in results(agent.session)] == [('{"text": "ok"}', False)]
        # Each skipped tool is a notice naming it and why; a refresh does not repeat them.
        bus = EventBus()
        notices = notices_of(bus)
        other = await connect_mcp(h.scope, ToolSet(), server, bus=bus)
        assert [(n.name, n.subject, n.data["tool"], n.data["reason"]) for n in notices] == [
            ("mcp/tool-skipped", other, label, reason) for label, reason in skipped.items()
        ]
        await other.refresh()
        assert len(notices) == 2 and sorted(other.tool_names) == offered


def _silent(pidfile: Path, startup_timeout: float) -> McpStdioServer:
    """A server that starts and never answers the handshake (it ignores the end of its input too)."""
    return McpStdioServer(
        "silent", "sh", args=("-c", f"echo $$ > {pidfile}; exec sleep 300"), startup_timeout=startup_timeout
    )


async def test_a_command_that_cannot_run_fails_the_start_without_waiting_for_the_others(tmp_path: Path) -> None:
    """It waited for the slowest sibling (its whole startup_timeout) and then its stop grace, to fail anyway."""
    pidfile = tmp_path / "silent.pid"
    async with open_test_harness() as h:
        servers = [McpStdioServer("nope", "no-such-mcp-server"), _silent(pidfile, startup_timeout=30)]
        with trio.fail_after(10), pytest.raises(McpStartError) as info:  # well before the sibling's 30 s
            await connect_mcp_servers(h.scope, h.tools, servers)
        message = str(info.value)
        assert message.startswith("MCP server 'nope' ('no-such-mcp-server') failed to start: cannot run ")
        assert "No such file or directory" in message
        assert message.endswith("(not waited for, and stopped: 'silent')")
        assert info.value.servers == ("nope",)
        if pidfile.exists():  # spawned before the failure was seen: stopped, nothing of it left running
            assert not group_alive(int(pidfile.read_text()))
        assert [child.name for child in h.scope.children if "mcp:" in child.name] == []


async def test_a_failure_that_can_pass_still_waits_for_every_server(tmp_path: Path) -> None:
    """A server that exits is no reason to give up on the others: the error names each that failed."""
    pidfile = tmp_path / "silent.pid"
    async with open_test_harness() as h:
        servers = [McpStdioServer("exits", "sh", args=("-c", "exit 3")), _silent(pidfile, startup_timeout=0.5)]
        with pytest.raises(McpStartError) as info:
            await connect_mcp_servers(h.scope, h.tools, servers)
        assert info.value.servers == ("exits", "silent")
        assert "within 0.5 s" in str(info.value) and "not waited for" not in str(info.value)


async def test_acp_session_new_with_a_missing_command_answers_at_once(tmp_path: Path) -> None:
    pidfile = tmp_path / "silent.pid"
    missing = {"name": "nope", "command": "no-such-mcp-server", "args": [], "env": []}
    silent = {"name": "silent", "command": "sh", "args": ["-c", f"echo $$ > {pidfile}; exec sleep 300"], "env": []}
    async with open_server(tmp_path, []) as client:
        await client.initialize()
        request = client.request("session/new", {"cwd": str(tmp_path), "mcpServers": [missing, silent]})
        with trio.fail_after(15):  # the silent server's startup_timeout is 30 s
            error = await client.error(request)
        assert "MCP server 'nope' ('no-such-mcp-server') failed to start: cannot run" in error["message"]
        assert error["data"] == {"error": "McpStartError", "mcpServers": ["nope"]}


async def test_a_start_given_up_stops_the_server_without_the_eof_grace(tmp_path: Path) -> None:
    """It never shook hands, so closing its stdin asks nothing of it: SIGTERM at once, not after grace_period."""
    pidfile = tmp_path / "silent.pid"
    silent = attrs.evolve(_silent(pidfile, startup_timeout=0.5), grace_period=30)
    async with open_test_harness() as h:
        with trio.fail_after(10), pytest.raises(McpStartError) as info:  # not 0.5 s + the 30 s grace
            await connect_mcp(h.scope, h.tools, silent)
        assert "within 0.5 s (killed by SIGTERM" in str(info.value)
        assert not group_alive(int(pidfile.read_text()))
