"""``agent.run()``: the final text and usage, or an answer validated against a type, retried, then a clear error."""

from __future__ import annotations

import dataclasses
import json
from typing import Any, Literal, TypedDict

import attrs
import pydantic
import pytest
import trio
import trio.testing
from _sse_server import DONE, Stream, sse_delta, sse_finish, sse_text, sse_usage, start_server

from trio_harness import OutputValidationError, RunError, ScriptedModel, ToolError
from trio_harness.agents import AgentOptions
from trio_harness.model import OpenAIProvider, ReplayModel, resolve_model
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced, open_test_harness


@attrs.frozen
class City:
    """A city."""

    name: str
    population: int = attrs.field(validator=attrs.validators.ge(0))


class Point(TypedDict):
    x: int
    y: int


@dataclasses.dataclass
class Reading:
    sensor: str
    value: float


class Verdict(pydantic.BaseModel):
    ok: bool
    reason: str


class Opaque:
    pass


async def test_a_plain_run_returns_the_final_text_and_the_turns_usage() -> None:
    model = ScriptedModel([{"text": "forty-two"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("What is six times seven?")
        (end,) = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
    assert result.output == result.text == "forty-two"
    assert result.end == end and result.turn == 1
    assert result.usage == end.usage and result.usage.requests == 1 and result.usage.input_tokens > 0
    assert model.requests[0].output is None


@pytest.mark.parametrize(
    ("kind", "answer", "expected"),
    [
        (City, {"name": "Paris", "population": 2_100_000}, City("Paris", 2_100_000)),
        (Point, {"x": 1, "y": 2}, {"x": 1, "y": 2}),
        (Reading, {"sensor": "t1", "value": 21.5}, Reading("t1", 21.5)),
        (Verdict, {"ok": True, "reason": "fine"}, Verdict(ok=True, reason="fine")),
        (list[int], {"result": [1, 2, 3]}, [1, 2, 3]),
        (Literal["yes", "no"], {"result": "no"}, "no"),
    ],
    ids=["attrs", "TypedDict", "dataclass", "pydantic", "list", "Literal"],
)
async def test_the_answer_is_validated_against_the_type(kind: Any, answer: Any, expected: Any) -> None:
    model = ScriptedModel([{"text": json.dumps(answer)}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("answer", output=kind)
    assert result.output == expected
    request = model.requests[0]
    assert request.output is not None and request.output.schema["type"] == "object"
    assert "matching this JSON schema" in request.system
    assert json.dumps(request.output.schema, separators=(",", ":")) in request.system


async def test_an_invalid_answer_is_sent_back_with_the_error_then_accepted() -> None:
    model = ScriptedModel(
        [
            {"text": "Paris, about two million people"},
            {"text": '{"name": "Paris", "population": -1}'},
            {"text": '```json\n{"name": "Paris", "population": 2100000}\n```'},
        ]
    )
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("Describe Paris", output=City)
        events = list(agent.session.events)
        assert_balanced(events)
    assert result.output == City("Paris", 2_100_000)
    # one turn, three steps; each retry is a logged steer message naming the problem
    assert [e.turn for e in events if isinstance(e, ev.TurnEnd)] == [1]
    retries = [e for e in events if isinstance(e, ev.UserMessage) and e.mode == "steer"]
    assert len(retries) == 2
    assert "Invalid JSON" in retries[0].text
    assert "'population' must be >= 0" in retries[1].text
    assert result.usage.requests == 3
    assert all(r.output is not None for r in model.requests)


async def test_an_answer_that_never_validates_fails_clearly_after_the_retries() -> None:
    model = ScriptedModel([{"text": "no"}, {"text": "{}"}, {"text": "still no"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        with pytest.raises(OutputValidationError) as caught:
            await agent.run("Describe Paris", output=City, retries=1)
        agent_id = agent.id
    error = caught.value
    assert len(model.requests) == 2
    assert error.end is not None and error.end.reason == "error"
    assert error.end.failure.code == "output-invalid"
    assert str(error) == (
        f"agent {agent_id!r}: turn 1 ended error: the answer did not match the output type City after 2 attempts; "
        "last error: name: Field required; population: Field required (output-invalid)"
    )


async def test_a_turn_that_fails_raises_a_run_error_with_its_end() -> None:
    model = ScriptedModel([{"error": {"message": "overloaded", "code": "http-529"}}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        with pytest.raises(RunError, match="turn 1 ended error: overloaded \\(http-529\\)") as caught:
            await agent.run("hi")
    assert caught.value.end is not None and caught.value.end.reason == "error"


async def test_a_type_that_cannot_be_json_is_refused_before_anything_runs() -> None:
    model = ScriptedModel([])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        with pytest.raises(ToolError, match=r"output type <class .*Opaque'> cannot be validated or described"):
            await agent.run("x", output=Opaque)
        with pytest.raises(ToolError, match=r"output type <class 'trio\.Event'>: cannot resolve the type hints"):
            await agent.run("x", output=trio.Event)
        assert len(agent.session) == 0


async def test_cancelling_run_cancels_its_turn_and_keeps_other_prompts() -> None:
    model = ScriptedModel([{"hang": True}, {"text": "later"}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        with trio.move_on_after(5) as scope:
            async with trio.open_nursery() as nursery:
                nursery.start_soon(agent.run, "hangs")
                await trio.testing.wait_all_tasks_blocked()
                agent.inject("parked")  # queued work that is not the run's
                nursery.cancel_scope.cancel()
        assert not scope.cancelled_caught
        await agent.when_idle()
        (end,) = [e for e in agent.session.events if isinstance(e, ev.TurnEnd)]
        assert end.reason == "aborted" and end.cause == "user"
        assert [m.text for m in agent.inbox.next_step] == ["parked"]


async def test_cancelling_run_before_its_turn_removes_its_prompt() -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        agent.followup("first")  # runs (and hangs): the run's prompt waits behind it
        async with trio.open_nursery() as nursery:
            nursery.start_soon(agent.run, "second")
            await trio.testing.wait_all_tasks_blocked()
            assert [m.text for m in agent.inbox.next_turn] == ["second"]
            nursery.cancel_scope.cancel()
        assert len(agent.inbox) == 0
        assert agent.status == "running"  # the other prompt's turn is not touched


async def test_disposing_the_agent_ends_a_waiting_run() -> None:
    model = ScriptedModel([{"hang": True}])
    async with open_test_harness(model) as h:
        handle = await h.agents.create()
        agent = handle.agent
        agent.followup("first")
        errors: list[RunError] = []

        async def run_second() -> None:
            try:
                await agent.run("second")
            except RunError as exc:
                errors.append(exc)

        async with trio.open_nursery() as nursery:
            nursery.start_soon(run_second)
            await trio.testing.wait_all_tasks_blocked()
            await handle.dispose()
    (error,) = errors
    assert error.end is None and "the prompt never ran" in str(error)


async def test_the_openai_provider_sends_a_json_schema_response_format(nursery: trio.Nursery) -> None:
    answer = '{"name": "Oslo", "population": 700000}'
    server = await start_server(nursery, Stream([sse_text(answer), sse_finish("stop"), sse_usage(9, 9), DONE]))
    async with OpenAIProvider(model="m", base_url=server.base_url, api_key="k", max_retries=0) as provider:
        async with open_test_harness(provider) as h, h.agents.open() as agent:
            result = await agent.run("Oslo?", output=City)
    assert result.output == City("Oslo", 700_000)
    body = server.requests[0].json
    assert body["response_format"] == {
        "type": "json_schema",
        "json_schema": {
            "name": "City",
            "schema": {
                "type": "object",
                "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
                "required": ["name", "population"],
                "additionalProperties": False,
            },
        },
    }


def test_deepseek_uses_json_mode_and_a_plain_request_has_no_response_format() -> None:
    from trio_harness.model import ModelRequest, OutputFormat

    deepseek = resolve_model("deepseek:deepseek-chat", env={"DEEPSEEK_API_KEY": "k"})
    assert isinstance(deepseek, OpenAIProvider) and deepseek.output_format == "json_object"
    request = ModelRequest(model="", system="s", messages=(), output=OutputFormat("City", {"type": "object"}))
    assert deepseek.build_body(request)["response_format"] == {"type": "json_object"}
    plain = ModelRequest(model="", system="s", messages=())
    assert "response_format" not in deepseek.build_body(plain)
    quiet = OpenAIProvider(model="m", base_url="http://localhost:1/v1", output_format="none")
    assert "response_format" not in quiet.build_body(request)


async def test_run_respects_the_agents_limits() -> None:
    model = ScriptedModel([{"text": "not json"}, {"text": "still not"}])
    async with open_test_harness(model) as h, h.agents.open(options=AgentOptions(max_steps=1)) as agent:
        with pytest.raises(RunError, match="ended blocked"):
            await agent.run("x", output=City)


# ---------------------------------------------------------------- the final-answer tool


CITY_SCHEMA = {
    "type": "object",
    "properties": {"name": {"type": "string"}, "population": {"type": "integer"}},
    "required": ["name", "population"],
    "additionalProperties": False,
}


def final_answer(arguments: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "final_answer", "arguments": arguments}]}


async def test_the_tool_mode_offers_a_final_answer_tool_and_returns_its_arguments() -> None:
    model = ScriptedModel([final_answer({"name": "Lyon", "population": 520_000})])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("Lyon?", output=City, output_mode="tool")
        events = list(agent.session.events)
    assert_balanced(events)
    assert result.output == City("Lyon", 520_000)
    assert json.loads(result.text) == {"name": "Lyon", "population": 520_000}
    (request,) = model.requests
    assert request.output is None  # no response format: the tool carries the schema
    (tool,) = request.tools
    assert tool.name == "final_answer" and tool.parameters == CITY_SCHEMA
    assert "call the tool final_answer" in request.system
    (end,) = [e for e in events if isinstance(e, ev.TurnEnd)]
    assert end.reason == "completed" and end.usage is not None and end.usage.requests == 1
    (logged,) = [e for e in events if isinstance(e, ev.ToolResult)]
    assert logged.name == "final_answer" and not logged.is_error


async def test_auto_mode_uses_the_tool_where_the_provider_has_no_json_schema_format() -> None:
    model = ScriptedModel([final_answer({"result": [1, 2]})], json_schema_output=False)
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("numbers?", output=list[int])
        native = ScriptedModel([{"text": '{"result": [3]}'}])
    assert result.output == [1, 2] and [t.name for t in model.requests[0].tools] == ["final_answer"]
    async with open_test_harness(native) as h, h.agents.open() as agent:
        assert (await agent.run("numbers?", output=list[int])).output == [3]
    assert native.requests[0].tools == () and native.requests[0].output is not None


async def test_invalid_final_answer_arguments_go_back_as_the_tool_result_then_succeed() -> None:
    model = ScriptedModel(
        [
            final_answer('{"name": "Lyon"'),  # not JSON
            {"text": "Lyon has about half a million people."},  # text instead of the tool
            final_answer({"name": "Lyon", "population": -5}),
            final_answer({"name": "Lyon", "population": 520_000}),
        ]
    )
    async with open_test_harness(model) as h, h.agents.open() as agent:
        result = await agent.run("Lyon?", output=City, output_mode="tool", retries=3)
        events = list(agent.session.events)
    assert_balanced(events)
    assert result.output == City("Lyon", 520_000) and result.usage.requests == 4
    assert [e.turn for e in events if isinstance(e, ev.TurnEnd)] == [1]
    results = [e for e in events if isinstance(e, ev.ToolResult)]
    assert [r.is_error for r in results] == [True, True, False]
    assert "Invalid JSON" in results[0].content and "Call final_answer again" in results[0].content
    assert "'population' must be >= 0" in results[1].content
    (steer,) = [e for e in events if isinstance(e, ev.UserMessage) and e.mode == "steer"]
    assert "Call final_answer with your final answer" in steer.text
    # each retry request shows the model its previous call and the error
    retry = model.requests[1]
    assert retry.messages[-1].role == "tool" and "Invalid JSON" in retry.messages[-1].content


async def test_final_answer_arguments_that_never_validate_fail_clearly_after_the_retries() -> None:
    model = ScriptedModel([final_answer({}), final_answer({"name": "Lyon"}), final_answer({"name": 1})])
    async with open_test_harness(model) as h, h.agents.open() as agent:
        with pytest.raises(OutputValidationError) as caught:
            await agent.run("Lyon?", output=City, output_mode="tool", retries=1)
        agent_id = agent.id
        events = list(agent.session.events)
    assert_balanced(events)
    assert len(model.requests) == 2 and model.remaining == 1
    error = caught.value
    assert error.end is not None and error.end.failure is not None and error.end.failure.code == "output-invalid"
    assert str(error) == (
        f"agent {agent_id!r}: turn 1 ended error: the answer did not match the output type City after 2 attempts; "
        "last error: population: Field required (output-invalid)"
    )
    last = [e for e in events if isinstance(e, ev.ToolResult)][-1]
    assert last.is_error and "population: Field required" in last.content


async def test_an_unknown_output_mode_is_refused() -> None:
    async with open_test_harness(ScriptedModel([])) as h, h.agents.open() as agent:
        with pytest.raises(ValueError, match="unknown output_mode 'json'; use auto, native or tool"):
            await agent.run("x", output=City, output_mode="json")  # type: ignore[call-overload]


def _call(arguments: str, call_id: str) -> bytes:
    call = {"index": 0, "id": call_id, "type": "function", "function": {"name": "final_answer", "arguments": arguments}}
    return sse_delta(tool_calls=[call])


async def test_a_json_mode_endpoint_gets_the_final_answer_tool_over_http(nursery: trio.Nursery) -> None:
    def called(arguments: str, call_id: str) -> Stream:
        return Stream([_call(arguments, call_id), sse_finish("tool_calls"), sse_usage(20, 8), DONE])

    server = await start_server(
        nursery,
        called('{"name": "Oslo", "population": "many"}', "c1"),
        called('{"name": "Oslo", "population": 700000}', "c2"),
    )
    # a DeepSeek-like endpoint: JSON mode without a schema
    provider = OpenAIProvider(
        model="m", base_url=server.base_url, api_key="k", max_retries=0, output_format="json_object"
    )
    assert not provider.json_schema_output
    async with provider, open_test_harness(provider) as h, h.agents.open() as agent:
        result = await agent.run("Oslo?", output=City)
    assert result.output == City("Oslo", 700_000)
    first, second = (r.json for r in server.requests)
    assert "response_format" not in first
    (tool,) = first["tools"]
    assert tool == {
        "type": "function",
        "function": {"name": "final_answer", "description": tool["function"]["description"], "parameters": CITY_SCHEMA},
    }
    assert "final_answer" in first["messages"][0]["content"]
    # the retry carries the call and its validation error as the tool result
    assert second["messages"][-2]["tool_calls"][0]["id"] == "c1"
    assert second["messages"][-1]["role"] == "tool" and second["messages"][-1]["tool_call_id"] == "c1"
    assert "population: Input should be a valid integer" in second["messages"][-1]["content"]


@pytest.mark.parametrize("recorded_mode", ["tool", "native"])
async def test_a_replayed_recording_asks_for_the_typed_answer_the_way_it_was_recorded(recorded_mode: str) -> None:
    """A replay of a session gives ``run(output=T)`` in auto mode the recording's way (tool or response format)."""
    step = final_answer({"name": "Lyon", "population": 520_000}) if recorded_mode == "tool" else None
    model = ScriptedModel(
        [step if step is not None else {"text": '{"name": "Lyon", "population": 520000}'}],
        json_schema_output=recorded_mode == "native",
    )
    async with open_test_harness(model) as h, h.agents.open() as agent:
        assert (await agent.run("Lyon?", output=City)).output == City("Lyon", 520_000)
        recorded = list(agent.session.events)
    replay = ReplayModel.from_events(recorded, strict=True)
    assert replay.json_schema_output is (recorded_mode == "native")
    async with open_test_harness(replay) as h, h.agents.open() as agent:
        assert (await agent.run("Lyon?", output=City)).output == City("Lyon", 520_000)
    (original,) = model.requests
    (again,) = replay.requests
    assert [t.name for t in again.tools] == [t.name for t in original.tools]
    assert (again.output is None) is (original.output is None) is (recorded_mode == "tool")
