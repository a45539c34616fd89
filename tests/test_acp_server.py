"""The ACP server in process: methods, races, ownership on disconnect, backpressure, fuzzing.

The server runs over ``trio.testing.memory_stream_pair`` (or a real socket pair,
for backpressure) against a harness with an in-memory store and a scripted
model, driven by the ``Peer`` of ``tests/_acp_clients.py``; hypothesis feeds it
random bytes and random JSON-RPC-shaped messages and checks that it answers or
ignores every one of them, never dies, and still answers a valid ``initialize``
afterwards.  The line framing itself (parsing, ``LineReader``, ``MessageWriter``,
``Outbox``) is tested without a server in ``tests/test_acp_framing.py``; the
server over real stdio in ``tests/test_acp_e2e.py``.  What a disconnect and
backpressure promise: docs/guarantees.rst, "The ACP bridge".
"""

from __future__ import annotations

import contextlib
import json
import socket
from decimal import Decimal

import genai_prices
import pytest
import trio
import trio.testing
from _acp_clients import Msg, Peer, check_envelope, connected, conversation, tool_statuses
from _sse_server import DONE, Stream, sse_finish, sse_text, sse_usage, start_server
from _util import WAIT, echo_tool, wait_until
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trio_harness import Harness, ScriptedModel
from trio_harness.acp import AcpServer
from trio_harness.acp import _jsonrpc as rpc
from trio_harness.acp._auth import EnvKeyAuth
from trio_harness.acp._updates import replay_updates
from trio_harness.agents import ReactAgent
from trio_harness.model import OpenAIProvider, UsageTotals, usage_cost
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness


def scripted(responses: list[Msg]) -> ScriptedModel:
    """A scripted model answering ``responses`` in order."""
    return ScriptedModel(responses)


# ---------------------------------------------------------------- methods


async def test_initialize_new_prompt_in_process() -> None:
    model = scripted([{"text": "hello there"}])
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        result = await peer.call("initialize", {"protocolVersion": 7})
        assert result["protocolVersion"] == 1
        session_id = (await peer.call("session/new", {"cwd": "/", "mcpServers": []}))["sessionId"]
        reply = await peer.call(
            "session/prompt",
            {
                "sessionId": session_id,
                "prompt": [
                    {"type": "text", "text": "look at"},
                    {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "A"}},
                    {"type": "resource_link", "uri": "file:///b.txt", "name": "b.txt"},
                ],
            },
        )
        assert reply == {"stopReason": "end_turn"}
        sent = model.requests[0].messages[-1]
        assert getattr(sent, "text", None) == (
            'look at\n\n<context uri="file:///a.txt">\nA\n</context>\n\n[b.txt](file:///b.txt)'
        )


async def test_unsupported_prompt_blocks_are_invalid_params() -> None:
    async with open_test_harness(scripted([])) as harness, connected(harness) as (peer, _, _d):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        for prompt, field in [
            ([], "prompt"),
            ([{"type": "image", "data": "", "mimeType": "image/png"}], "prompt[0]"),
            ([{"type": "text"}], "prompt[0]"),
            ([{"type": "text", "text": "ok"}, 5], "prompt[1]"),
        ]:
            message = peer.request("session/prompt", {"sessionId": session_id, "prompt": prompt})
            await peer.send(message)
            reply = await peer.response(message["id"])
            assert reply["error"]["code"] == rpc.INVALID_PARAMS
            assert field in reply["error"]["message"]


async def test_authentication_when_configured() -> None:
    methods = ({"id": "token", "name": "Token"},)
    async with (
        open_test_harness(scripted([])) as harness,
        connected(harness, auth_methods=methods, authenticator=lambda m: m == "token") as (
            peer,
            _,
            _d,
        ),
    ):
        result = await peer.call("initialize", {"protocolVersion": 1})
        assert result["authMethods"] == [{"id": "token", "name": "Token"}]
        message = peer.request("session/new", {"cwd": "/"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == rpc.AUTH_REQUIRED
        # Clients such as Toad show only data.details: a sentence, beside the method ids.
        assert error["data"] == {"authMethods": ["token"], "details": "This agent requires authentication (token)."}
        message = peer.request("authenticate", {"methodId": "password"})
        await peer.send(message)
        assert (await peer.response(message["id"]))["error"]["code"] == rpc.INVALID_PARAMS
        assert await peer.call("authenticate", {"methodId": "token"}) == {}
        assert "sessionId" in await peer.call("session/new", {"cwd": "/"})


async def test_a_refused_authentication_says_so_in_data_details() -> None:
    methods = ({"id": "token", "name": "Token"},)
    async with (
        open_test_harness(scripted([])) as harness,
        connected(harness, auth_methods=methods, authenticator=lambda m: False) as (peer, _, _d),
    ):
        await peer.call("initialize", {"protocolVersion": 1})
        message = peer.request("authenticate", {"methodId": "token"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == rpc.AUTH_REQUIRED
        assert error["data"] == {"methodId": "token", "details": "Authentication with 'token' failed."}


async def test_session_list_pages_and_filters() -> None:
    async with open_test_harness(scripted([{"text": "a"}] * 3)) as harness:
        for index in range(3):
            handle = await harness.agents.create(session_id=f"s{index}", cwd=f"/w{index % 2}")
            handle.agent.followup(f"first prompt of s{index}")
            await handle.agent.when_idle()
            await handle.dispose()
        async with connected(harness) as (peer, _, _d):
            listed = await peer.call("session/list", {})
            assert sorted(s["sessionId"] for s in listed["sessions"]) == ["s0", "s1", "s2"]
            assert "nextCursor" not in listed
            s0 = next(s for s in listed["sessions"] if s["sessionId"] == "s0")
            assert s0["title"] == "first prompt of s0"
            assert s0["updatedAt"].endswith("Z")
            filtered = await peer.call("session/list", {"cwd": "/w1"})
            assert [s["sessionId"] for s in filtered["sessions"]] == ["s1"]
            message = peer.request("session/list", {"cursor": "bogus"})
            await peer.send(message)
            assert "cursor" in (await peer.response(message["id"]))["error"]["message"]


async def test_session_ids_that_could_escape_the_store_are_invalid_params() -> None:
    async with open_test_harness(scripted([])) as harness, connected(harness) as (peer, _, _d):
        for bad in ["../etc", "", "a/b"]:
            message = peer.request("session/load", {"sessionId": bad, "cwd": "/", "mcpServers": []})
            await peer.send(message)
            error = (await peer.response(message["id"]))["error"]
            assert error["code"] == rpc.INVALID_PARAMS
            assert "sessionId" in error["message"]
        message = peer.request("session/load", {"sessionId": 5, "cwd": "/"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == rpc.INVALID_PARAMS
        assert "sessionId" in error["message"]


async def test_turns_the_agent_starts_by_itself_are_streamed() -> None:
    """A turn nobody prompted (e.g. a completion notice woke the agent) reaches the client."""
    model = scripted([{"text": "prompted answer"}, {"text": "noticed it"}])
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        reply = await peer.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]})
        assert reply == {"stopReason": "end_turn"}
        prompted = peer.updates
        # the prompted turn is streamed once (no duplicate from the unsolicited path)
        chunks = conversation(prompted)
        assert "".join(u["content"]["text"] for u in chunks) == "prompted answer"
        agent = harness.agents.get(session_id)
        assert agent is not None
        agent.followup("background task bash-1 completed")
        await agent.when_idle()

        def answered(updates: list[Msg]) -> bool:
            texts = [u["content"]["text"] for u in updates if u["sessionUpdate"] == "agent_message_chunk"]
            return "".join(texts) == "prompted answernoticed it"

        updates = await peer.updates_until(answered)
        later = conversation(updates[len(prompted) :])
        kinds = [u["sessionUpdate"] for u in later]
        assert kinds[0] == "user_message_chunk"
        assert later[0]["content"]["text"] == "background task bash-1 completed"
        assert set(kinds[1:]) == {"agent_message_chunk"}


async def test_a_tool_call_is_pending_until_it_runs_in_prompted_and_unsolicited_turns() -> None:
    """pending -> in_progress (the driver's agent/tool/started) -> completed, and only for this session's turns."""
    call = {"tool_calls": [{"name": "echo", "arguments": {"x": "hi"}}]}
    model = scripted([call, {"text": "one"}, call, {"text": "two"}, call, {"text": "elsewhere"}])
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        harness.tools.add(echo_tool())
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        reply = await peer.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]})
        assert reply == {"stopReason": "end_turn"}
        agent = harness.agents.get(session_id)
        assert agent is not None
        agent.followup("a notice woke me")  # an unsolicited turn, streamed too
        await agent.when_idle()
        async with harness.agents.open() as other:  # not a session of this connection: nothing is sent for it
            other.followup("hi")
            await other.when_idle()

        # A round trip after everything ran: every update sent before its answer has arrived.
        await peer.call("session/list", {})
        statuses = tool_statuses(peer.updates)
    assert statuses == {
        "1/call_1": ["pending", "in_progress", "completed"],
        "2/call_2": ["pending", "in_progress", "completed"],
    }


@pytest.mark.parametrize("request_id", [{"a": 1}, [1], True, 1.5])
async def test_acp_request_with_a_bad_id_type_is_answered_with_null(request_id: object) -> None:
    async with open_test_harness(scripted([])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            await peer.send({"jsonrpc": "2.0", "id": request_id, "method": "initialize", "params": {}})
            reply = await peer.response(None)
            assert reply["error"]["code"] == rpc.INVALID_REQUEST
            assert await peer.call("initialize", {"protocolVersion": 1})


# ---------------------------------------------------------------- prompts racing close, cancel and load


async def test_acp_prompt_immediately_followed_by_close() -> None:
    """The prompt is answered exactly once (cancelled), the close answers, nothing is left."""
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        async with connected(harness) as (peer, server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request(
                "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "x"}]}
            )
            close = peer.request("session/close", {"sessionId": session_id})
            await peer.send(prompt, close)
            assert (await peer.response(close["id"]))["result"] == {}
            assert (await peer.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
            await peer.call("initialize", {"protocolVersion": 1})
            answers = [m for m in peer.received if m.get("id") == prompt["id"]]
            assert len(answers) == 1
            assert server.session_ids == []
            assert harness.agents.get(session_id) is None
            # A prompt for the closed session is refused.
            late = peer.request("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "y"}]})
            await peer.send(late)
            assert (await peer.response(late["id"]))["error"]["code"] == rpc.RESOURCE_NOT_FOUND
        await assert_nothing_left(harness, [session_id])


async def test_acp_prompt_running_then_close() -> None:
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request(
                "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "x"}]}
            )
            await peer.send(prompt)
            with trio.fail_after(WAIT):
                while (agent := harness.agents.get(session_id)) is None or agent.status != "running":
                    await trio.sleep(0)
            assert await peer.call("session/close", {"sessionId": session_id}) == {}
            assert (await peer.response(prompt["id"]))["result"] == {"stopReason": "cancelled"}
            await peer.call("initialize", {"protocolVersion": 1})
            assert len([m for m in peer.received if m.get("id") == prompt["id"]]) == 1
        await assert_nothing_left(harness, [session_id])


async def test_acp_cancel_after_the_prompt_finished_is_harmless() -> None:
    async with open_test_harness(scripted([{"text": "one"}, {"text": "two"}])) as harness:
        async with connected(harness) as (peer, _server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            text = [{"type": "text", "text": "x"}]
            assert await peer.call("session/prompt", {"sessionId": session_id, "prompt": text}) == {
                "stopReason": "end_turn"
            }
            await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": session_id}})
            assert await peer.call("session/cancel", {"sessionId": session_id}) is None
            assert await peer.call("session/prompt", {"sessionId": session_id, "prompt": text}) == {
                "stopReason": "end_turn"
            }
            agent = harness.agents.get(session_id)
            assert agent is not None
            assert_balanced(agent.session)


async def test_acp_load_of_a_session_live_on_the_same_connection() -> None:
    async with open_test_harness(scripted([{"text": "one"}])) as harness:
        async with connected(harness) as (peer, server, _disconnect):
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            text = [{"type": "text", "text": "x"}]
            await peer.call("session/prompt", {"sessionId": session_id, "prompt": text})
            load = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            await peer.send(load)
            assert (await peer.response(load["id"]))["error"]["code"] == rpc.INVALID_PARAMS
            assert server.session_ids == [session_id]
            # Two loads of a closed session racing each other: exactly one wins.
            assert await peer.call("session/close", {"sessionId": session_id}) == {}
            one = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            two = peer.request("session/load", {"sessionId": session_id, "cwd": "/"})
            await peer.send(one, two)
            replies = [await peer.response(one["id"]), await peer.response(two["id"])]
            assert sorted("result" in r for r in replies) == [False, True]
            assert server.session_ids == [session_id]
        await assert_nothing_left(harness, [session_id])


# ---------------------------------------------------------------- ownership on disconnect


async def assert_nothing_left(harness: Harness, session_ids: list[str]) -> None:
    assert harness.agents.list() == []
    assert harness.sessions.list() == []
    for session_id in session_ids:
        if await harness.sessions.persistence.exists(session_id):
            assert_balanced((await harness.sessions.persistence.load(session_id)).events)


async def test_disconnect_disposes_every_session_including_a_racing_new() -> None:
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        async with connected(harness) as (peer, server, disconnect):
            busy = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            idle = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request("session/prompt", {"sessionId": busy, "prompt": [{"type": "text", "text": "x"}]})
            await peer.send(prompt)
            await peer.call("initialize", {"protocolVersion": 1})
            busy_agent = harness.agents.get(busy)
            assert busy_agent is not None
            assert busy_agent.status == "running"
            # A session/new and the disconnect arrive together.
            await peer.send(peer.request("session/new", {"cwd": "/"}), peer.request("session/new", {"cwd": "/"}))
            await disconnect()
            assert server.session_ids == []
            assert server.scope is not None
            assert server.scope.closed
        await assert_nothing_left(harness, [busy, idle])
        events = (await harness.sessions.persistence.load(busy)).events
        end = events[-1]
        assert isinstance(end, ev.TurnEnd)
        assert (end.reason, end.cause) == ("aborted", "disposed")


@pytest.mark.parametrize("delay_checkpoints", [0, 1, 2, 3, 5, 8])
async def test_session_new_racing_disconnect_at_every_point(delay_checkpoints: int) -> None:
    async with open_test_harness(scripted([])) as harness:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        server = AcpServer(harness)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_stream, server_stream)
            await client_stream.send_all(b'{"jsonrpc":"2.0","id":1,"method":"session/new","params":{"cwd":"/"}}\n')
            for _ in range(delay_checkpoints):
                await trio.lowlevel.checkpoint()
            await client_stream.send_stream.aclose()
        await assert_nothing_left(harness, [])


async def test_cancelling_the_server_disposes_its_sessions() -> None:
    async with open_test_harness(scripted([{"hang": True}])) as harness:
        client_stream, server_stream = trio.testing.memory_stream_pair()
        peer = Peer(client_stream)
        server = AcpServer(harness)
        async with trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_stream, server_stream)
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            prompt = peer.request(
                "session/prompt",
                {"sessionId": session_id, "prompt": [{"type": "text", "text": "x"}]},
            )
            await peer.send(prompt)
            await peer.call("initialize", {"protocolVersion": 1})
            nursery.cancel_scope.cancel()
        await assert_nothing_left(harness, [session_id])


async def test_one_session_cancel_does_not_touch_another() -> None:
    model = scripted([{"hang": True}, {"hang": True}])
    async with open_test_harness(model) as harness, connected(harness) as (peer, _, _d):
        a = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        b = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        prompt_a = peer.request("session/prompt", {"sessionId": a, "prompt": [{"type": "text", "text": "a"}]})
        prompt_b = peer.request("session/prompt", {"sessionId": b, "prompt": [{"type": "text", "text": "b"}]})
        await peer.send(prompt_a, prompt_b)
        await peer.call("initialize", {"protocolVersion": 1})
        await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": a}})
        assert (await peer.response(prompt_a["id"]))["result"] == {"stopReason": "cancelled"}
        agent_b = harness.agents.get(b)
        assert agent_b is not None
        assert agent_b.status == "running"
        assert len(model.requests) == 2
        await peer.send({"jsonrpc": "2.0", "method": "session/cancel", "params": {"sessionId": b}})
        assert (await peer.response(prompt_b["id"]))["result"] == {"stopReason": "cancelled"}


# ---------------------------------------------------------------- backpressure


def socket_streams(buffer: int = 4096) -> tuple[trio.SocketStream, trio.SocketStream]:
    """A connected pair of real (Unix) socket streams with small kernel buffers."""
    left, right = trio.socket.socketpair()
    for sock in (left, right):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, buffer)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, buffer)
    return trio.SocketStream(left), trio.SocketStream(right)


async def read_messages(stream: trio.abc.ReceiveStream, count: int) -> list[Msg]:
    """Read exactly ``count`` messages from ``stream``."""
    out: list[Msg] = []
    buffer = b""
    with trio.fail_after(WAIT):
        while len(out) < count:
            data = await stream.receive_some(65536)
            assert data, f"the server closed its output after {len(out)} messages"
            buffer += data
            *lines, buffer = buffer.split(b"\n")
            out.extend(json.loads(line) for line in lines)
    assert buffer == b""
    return out


async def test_a_client_that_does_not_read_its_answers_stops_being_read() -> None:
    count = 3000
    requests = [
        json.dumps({"jsonrpc": "2.0", "id": n, "method": "initialize", "params": {"protocolVersion": 1}}).encode()
        + b"\n"
        for n in range(count)
    ]
    async with open_test_harness(scripted([])) as harness:
        client, server_end = socket_streams()
        server = AcpServer(harness, outbox_limit=8)
        written = 0

        async def write_requests() -> None:
            nonlocal written
            for line in requests:
                await client.send_all(line)
                written += 1

        async with client, server_end, trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            nursery.start_soon(write_requests)
            await trio.testing.wait_all_tasks_blocked()
            # The writer is stuck on the full socket and the outbox is at its
            # limit: the server stopped reading, so the client cannot write on.
            stalled = written
            assert stalled < count // 2
            assert server.queued_messages <= 8
            await trio.testing.wait_all_tasks_blocked()
            assert written == stalled
            # Once the client reads, every answer arrives, in order.
            answers = await read_messages(client, count)
            assert [answer["id"] for answer in answers] == list(range(count))
            assert all(answer["result"]["protocolVersion"] == 1 for answer in answers)
            assert written == count
            await client.send_eof()
        assert server.session_ids == []


@pytest.mark.parametrize("reads_along", [False, True], ids=["reads-late", "reads-along"])
async def test_a_turn_streams_past_the_outbox_limit_without_deadlock(reads_along: bool) -> None:
    calls = [{"name": "no_such_tool", "arguments": {}} for _ in range(30)]
    model = scripted([{"tool_calls": calls}, {"text": "all done", "reasoning": "thinking it over"}])
    # The commands (after session/new), the updates, the title, the last activity, the prompt's
    # answer, the later request's answer.
    expected = 1 + 60 + 6 + 2 + 2
    async with open_test_harness(model) as harness:
        client, server_end = socket_streams()
        server = AcpServer(harness, outbox_limit=1)
        peer = Peer(client)
        async with client, server_end, trio.open_nursery() as nursery:
            nursery.start_soon(server.serve, server_end, server_end)
            session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
            agent = harness.agents.get(session_id)
            assert agent is not None
            prompt = peer.request(
                "session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "go"}]}
            )
            later = peer.request("initialize", {"protocolVersion": 1})
            if reads_along:
                received: list[Msg] = []

                async def read_along() -> None:
                    received.extend(await read_messages(client, expected))

                async with trio.open_nursery() as readers:
                    readers.start_soon(read_along)
                    await peer.send(prompt, later)
                messages = received
            else:
                await peer.send(prompt)
                await trio.testing.wait_all_tasks_blocked()
                # The turn ran to its end although the client read nothing: a
                # turn never waits for its client; its updates wait in the outbox.
                assert agent.status == "idle"
                assert len(model.requests) == 2
                assert server.queued_messages > 1
                await peer.send(later)  # not read while the outbox is over its limit
                await trio.testing.wait_all_tasks_blocked()
                messages = await read_messages(client, expected)
            updates = conversation([m["params"]["update"] for m in messages if m.get("method")])
            kinds = [update["sessionUpdate"] for update in updates]
            assert (
                kinds
                == ["tool_call", "tool_call_update"] * 30 + ["agent_thought_chunk"] * 3 + ["agent_message_chunk"] * 3
            )
            assert [update["status"] for update in updates[1:60:2]] == ["failed"] * 30
            # The prompt's answer follows its updates.
            answers = {m["id"]: index for index, m in enumerate(messages) if "id" in m}
            assert set(answers) == {prompt["id"], later["id"]}
            assert all(index < answers[prompt["id"]] for index, m in enumerate(messages) if m.get("method"))
            assert messages[answers[prompt["id"]]]["result"] == {"stopReason": "end_turn"}
            if not reads_along:  # the later request was read only once the client read
                assert answers[later["id"]] == len(messages) - 1
            await client.send_eof()


# ---------------------------------------------------------------- fuzz

METHODS = [
    "initialize",
    "authenticate",
    "session/new",
    "session/load",
    "session/list",
    "session/prompt",
    "session/cancel",
    "session/close",
    "session/set_mode",
    "",
]

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=10), children, max_size=4),
    max_leaves=12,
)

params_values = st.one_of(
    json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "cwd": st.sampled_from(["/", "relative", "", "/tmp", "\x00"]) | json_values,
            "sessionId": st.text(max_size=12) | json_values,
            "protocolVersion": st.integers(-2, 3) | json_values,
            "prompt": st.lists(
                st.fixed_dictionaries({"type": st.sampled_from(["text", "image", "resource"]), "text": st.text()}),
                max_size=3,
            )
            | json_values,
            "mcpServers": st.just([]) | json_values,
            "cursor": st.text(max_size=5) | json_values,
            "methodId": st.text(max_size=5) | json_values,
        },
    ),
)

messages = st.fixed_dictionaries(
    {"method": st.sampled_from(METHODS) | st.text(max_size=20) | json_values},
    optional={
        "jsonrpc": st.just("2.0") | json_values,
        "id": st.integers() | st.text(max_size=8) | json_values,
        "params": params_values,
        "result": json_values,
    },
)

chunks = st.one_of(
    st.binary(max_size=200),
    json_values.map(lambda v: json.dumps(v).encode() + b"\n"),
    messages.map(lambda m: json.dumps(m).encode() + b"\n"),
    messages.map(lambda m: json.dumps(m).encode()),  # no newline: glued to the next chunk
    st.integers(4000, 9000).map(lambda n: b'{"jsonrpc":"2.0","id":1,"method":"' + b"m" * n + b'"}\n'),
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inputs=st.lists(chunks, max_size=12))
def test_fuzzed_input_is_answered_or_ignored_and_never_kills_the_server(
    inputs: list[bytes],
) -> None:
    async def scenario() -> None:
        model = scripted([{"text": "ok"}] * 20)
        async with open_test_harness(model) as harness:
            async with connected(harness, max_line_bytes=4096) as (peer, server, disconnect):
                for chunk in inputs:
                    await peer.send_raw(chunk)
                probe = {
                    "jsonrpc": "2.0",
                    "id": "probe",
                    "method": "initialize",
                    "params": {"protocolVersion": 1},
                }
                await peer.send_raw(b"\n" + json.dumps(probe).encode() + b"\n")
                reply = await peer.response("probe")
                assert reply["result"]["protocolVersion"] == 1
                for message in peer.received:
                    check_envelope(message)
                await disconnect()
                assert server.session_ids == []
            assert harness.agents.list() == []
            assert harness.sessions.list() == []

    trio.run(scenario)


async def test_env_key_authentication_succeeds_once_the_key_is_in_the_environment(nursery: trio.Nursery) -> None:
    """The agent started without its key; once the variable is set, authenticate gives the provider the key."""
    http = await start_server(nursery, Stream([sse_text("hello"), sse_finish("stop"), DONE]))
    provider = OpenAIProvider(model="m", base_url=http.base_url)  # built without a key
    env: dict[str, str] = {}
    auth = EnvKeyAuth("DEEPSEEK_API_KEY", provider, env=env)
    async with (
        contextlib.aclosing(provider),
        open_test_harness(provider) as harness,
        connected(harness, auth_methods=[auth.method()], authenticator=auth) as (peer, _, _d),
    ):
        result = await peer.call("initialize", {"protocolVersion": 1})
        assert [m["id"] for m in result["authMethods"]] == ["env:DEEPSEEK_API_KEY"]
        message = peer.request("session/new", {"cwd": "/"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == rpc.AUTH_REQUIRED
        assert "env:DEEPSEEK_API_KEY" in error["message"]
        assert "DEEPSEEK_API_KEY" in error["message"]
        assert error["data"]["details"] == auth.method()["description"]
        message = peer.request("authenticate", {"methodId": "env:DEEPSEEK_API_KEY"})
        await peer.send(message)
        error = (await peer.response(message["id"]))["error"]
        assert error["code"] == rpc.AUTH_REQUIRED
        assert "restart the agent" in error["message"]
        details = error["data"]["details"]
        assert details.startswith("The model's API key is missing: DEEPSEEK_API_KEY is not set")
        assert "restart the agent" in details
        env["DEEPSEEK_API_KEY"] = " sk-later \n"
        assert await peer.call("authenticate", {"methodId": "env:DEEPSEEK_API_KEY"}) == {}
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        reply = await peer.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]})
        assert reply == {"stopReason": "end_turn"}
    assert http.requests[0].headers["authorization"] == "Bearer sk-later"


async def _usage_updates(peer: Peer, count: int) -> list[Msg]:
    """The first ``count`` ``usage_update``s the peer received, waiting for them."""
    updates = await peer.updates_until(lambda got: len(_usage(got)) >= count)
    return _usage(updates)[:count]


def _usage(updates: list[Msg]) -> list[Msg]:
    return [u for u in updates if u["sessionUpdate"] == "usage_update"]


def _failure_notes(updates: list[Msg]) -> list[Msg]:
    return [u for u in updates if "trio-harness/failure" in u.get("_meta", {})]


async def test_usage_update_carries_the_sessions_cost_when_the_model_is_priced(nursery: trio.Nursery) -> None:
    def answer(text: str) -> Stream:
        return Stream([sse_text(text), sse_finish("stop"), sse_usage(120_000, 3_000), DONE])

    assert genai_prices.__name__  # the cost extra, installed by `nox -s tests`: missing fails, not skips
    http = await start_server(nursery, answer("one"), answer("two"))
    # a loopback server standing in for DeepSeek: the route's name says whose prices apply
    provider = OpenAIProvider(
        model="deepseek-chat", base_url=http.base_url, api_key="k", max_retries=0, name="deepseek:deepseek-chat"
    )
    async with provider, open_test_harness(provider) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        for text in ("one?", "two?"):
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": text}]}
            assert await peer.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        first, second = await _usage_updates(peer, 2)
    one = UsageTotals(input_tokens=120_000, output_tokens=3_000, requests=1)
    two = UsageTotals(input_tokens=240_000, output_tokens=6_000, requests=2)
    for update, totals in ((first, one), (second, two)):
        expected = usage_cost(totals, "deepseek-chat", provider="deepseek")
        assert isinstance(expected, Decimal) and expected > 0
        assert update["cost"] == {"amount": float(expected), "currency": "USD"}
        assert update["used"] == 123_000


async def test_the_server_loads_the_price_table_in_a_worker_thread_when_it_starts(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The first price lookup (a usage_update) would import the table on the Trio thread otherwise."""
    import threading

    from trio_harness.model import _cost

    threads: list[threading.Thread] = []
    loaded = threading.Event()
    load = _cost._load

    def observed() -> bool:
        threads.append(threading.current_thread())
        try:
            return load()
        finally:
            loaded.set()

    monkeypatch.setattr(_cost, "_loaded", None)
    monkeypatch.setattr(_cost, "_load", observed)
    async with open_test_harness(ScriptedModel([])) as harness, connected(harness) as (peer, _server, _):
        assert (await peer.call("initialize", {"protocolVersion": 1}))["protocolVersion"] == 1
        # No prompt needed: it started with the connection (bounded, so a server that never loads fails).
        assert await trio.to_thread.run_sync(loaded.wait, 60)
        # The thread has returned; the task that awaited it records the result (a disconnect
        # before then abandons the thread, and the next lookup would load again).
        await wait_until(lambda: _cost._loaded is not None)
    assert len(threads) == 1 and threads[0] is not threading.main_thread()
    assert _cost._loaded is True


async def test_usage_update_has_no_cost_when_the_model_is_not_priced() -> None:
    model = ScriptedModel([{"text": "hello there"}], context_window=10_000)
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]}
        assert await peer.call("session/prompt", prompt) == {"stopReason": "end_turn"}
        (update,) = await _usage_updates(peer, 1)
    assert update["size"] == 10_000 and update["used"] > 0
    assert "cost" not in update


async def test_a_turn_the_agent_started_by_itself_that_fails_says_so_live_as_a_replay_does() -> None:
    model = scripted([{"text": "prompted answer"}, {"error": {"message": "upstream overloaded", "code": "http-503"}}])
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        reply = await peer.call("session/prompt", {"sessionId": session_id, "prompt": [{"type": "text", "text": "hi"}]})
        assert reply == {"stopReason": "end_turn"}
        agent = harness.agents.get(session_id)
        assert agent is not None
        agent.followup("background task bash-1 completed")  # nobody prompted this turn
        await agent.when_idle()
        notes = _failure_notes(await peer.updates_until(lambda got: bool(_failure_notes(got))))
        events = list(agent.session.events)
    (note,) = notes
    assert note["sessionUpdate"] == "agent_message_chunk"
    assert "upstream overloaded" in note["content"]["text"]
    replayed = _failure_notes(list(replay_updates(events, session_id)))
    assert replayed == [note]


async def test_a_compaction_between_turns_sends_the_smaller_usage_and_a_load_sends_it_too() -> None:
    responses: list[Msg] = [{"text": f"Answer {n}: " + "a" * 180} for n in range(1, 40)]
    model = ScriptedModel(responses, context_window=3_000, summary="Summary: numbered questions. " + "s" * 200)
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        agent = harness.agents.get(session_id)
        assert isinstance(agent, ReactAgent)
        turns = 0
        while not any(isinstance(e, ev.ContextCompacted) for e in agent.session.events):
            turns += 1
            assert turns < 40, "the session never compacted"
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": f"Question {turns}: " + "q" * 180}]}
            assert await peer.call("session/prompt", prompt) == {"stopReason": "end_turn"}
            await agent.when_idle()  # the compaction between turns runs after the prompt's answer
        (compacted,) = [e for e in agent.session.events if isinstance(e, ev.ContextCompacted)]
        assert compacted.turn is None
        expected = agent.context_estimate()
        updates = await _usage_updates(peer, turns + 1)  # one per turn, one after the compaction
        assert updates[-1]["used"] == expected < updates[-2]["used"]
        assert updates[-1]["_meta"]["trio-harness/usage"]["session"]["requests"] == agent.usage.requests
        assert await peer.call("session/close", {"sessionId": session_id}) == {}
        before = len(_usage(peer.updates))
        await peer.call("session/load", {"sessionId": session_id, "cwd": "/"})
        loaded = _usage(peer.updates)[before:]
    assert [u["used"] for u in loaded] == [expected]


async def test_a_compaction_that_fails_between_turns_is_shown_live_and_on_replay_as_a_thought() -> None:
    refused: Msg = {"error": {"message": "summary refused", "code": "http-503"}}
    answers: list[Msg] = [{"text": f"Answer {n}: " + "a" * 180} for n in (1, 2)]
    model = ScriptedModel([*answers, refused], context_window=300)
    async with open_test_harness(model) as harness, connected(harness) as (peer, _server, _):
        session_id = (await peer.call("session/new", {"cwd": "/"}))["sessionId"]
        agent = harness.agents.get(session_id)
        assert agent is not None
        for n in (1, 2):
            prompt = {"sessionId": session_id, "prompt": [{"type": "text", "text": f"Question {n}: " + "q" * 180}]}
            assert await peer.call("session/prompt", prompt) == {"stopReason": "end_turn"}
            await agent.when_idle()
        notes = _failure_notes(await peer.updates_until(lambda got: bool(_failure_notes(got))))
        events = list(agent.session.events)
    (note,) = notes
    assert note["sessionUpdate"] == "agent_thought_chunk"
    assert note["content"]["text"].startswith("Compacting the conversation failed: ")
    assert [e.type for e in events].count("context/compaction-failed") == 1
    replayed = _failure_notes(list(replay_updates(events, session_id)))
    assert replayed == [note]
