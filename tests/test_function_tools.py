"""Tools from typed functions: ``@tool`` / ``tool(fn, ...)``, end to end through a scripted model."""

from __future__ import annotations

import dataclasses
import enum
import functools
import json
import subprocess
import sys
import threading
import typing
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Literal, Optional, TypedDict

import attrs
import jsonschema
import pydantic
import pytest
import trio
import trio.testing
import typing_extensions

import trio_harness
from trio_harness import FunctionTool, ScriptedModel, Tool, ToolContext, ToolError, ToolOutput, tool
from trio_harness import events as ev
from trio_harness.model import ModelRequest, ToolMessage
from trio_harness.testing import assert_balanced, open_test_harness

if TYPE_CHECKING:
    from decimal import Decimal  # only for typing: a tool naming it cannot resolve its hints


# ---------------------------------------------------------------- types the tools use


class Color(enum.Enum):
    """A colour."""

    RED = "red"
    BLUE = "blue"


class Size(enum.IntEnum):
    SMALL = 1
    LARGE = 2


class Options(TypedDict):  # typing.TypedDict: pydantic refuses it on 3.11 unless rewritten
    """Drawing options."""

    depth: int
    label: typing.NotRequired[str]


@attrs.frozen
class Point:
    """A point on the canvas.

    Attributes:
        x: horizontal position.
        y: vertical position.
    """

    x: float
    y: float = 0.0


@attrs.frozen
class Shape:
    points: list[Point]
    color: Color = Color.RED
    _tag: str = attrs.field(default="", alias="tag")  # private attribute: its init name is the key


@attrs.frozen
class Positive:
    value: int = attrs.field(validator=attrs.validators.gt(0))


@attrs.define
class Node:  # refers to itself: not describable as a tool parameter
    children: list[Node]


class Report(pydantic.BaseModel):
    total: int
    items: list[str]


class Tree(pydantic.BaseModel):  # recursive: its schema keeps $defs
    name: str
    children: list[Tree] = []


class Folder(typing_extensions.TypedDict):  # recursive, and a TypedDict pydantic accepts on 3.11
    name: str
    children: list[Folder]


class StdFolder(TypedDict):  # recursive typing.TypedDict: pydantic refuses it on 3.11
    name: str
    children: list[StdFolder]


@dataclasses.dataclass
class Pair:
    left: int
    right: int


@attrs.frozen
class Reading:
    city: str
    _celsius: float = attrs.field(alias="celsius")


# ---------------------------------------------------------------- helpers


def call(name: str, arguments: Mapping[str, Any] | str, call_id: str | None = None) -> dict[str, Any]:
    one: dict[str, Any] = {"name": name, "arguments": arguments}
    if call_id is not None:
        one["id"] = call_id
    return one


async def run_calls(
    tools: Sequence[Tool], calls: Sequence[Mapping[str, Any]]
) -> tuple[list[ev.ToolResult], ScriptedModel]:
    """One turn: the model makes ``calls`` in one step, then answers; returns the results in model order."""
    model = ScriptedModel([{"tool_calls": list(calls)}, {"text": "done"}])
    async with open_test_harness(model) as h:
        for one in tools:
            h.tools.add(one)
        async with h.agents.open() as agent:
            agent.followup("go")
            await agent.when_idle()
            assert_balanced(agent.session)
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "completed"
            results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
    # the model read every result in its next request
    seen = [m for m in model.requests[1].messages if isinstance(m, ToolMessage)]
    assert [(m.content, m.is_error) for m in seen] == [(r.content, r.is_error) for r in results]
    return results, model


def walk(schema: Any) -> Iterator[Mapping[str, Any]]:
    """Every schema object in ``schema`` (properties maps are containers, not schemas)."""
    if isinstance(schema, Mapping):
        yield schema
        for key, value in schema.items():
            if key in ("properties", "$defs") and isinstance(value, Mapping):
                for sub in value.values():
                    yield from walk(sub)
            elif isinstance(value, Mapping):
                yield from walk(value)
            elif isinstance(value, list):
                for sub in value:
                    yield from walk(sub)


def assert_clean(one: Tool) -> None:
    """The model-facing schema passes the raw-Tool checks and carries no pydantic noise."""
    jsonschema.Draft202012Validator.check_schema(one.parameters)
    assert one.parameters["type"] == "object"
    assert one.parameters["additionalProperties"] is False
    assert all("title" not in node for node in walk(one.parameters))


# ---------------------------------------------------------------- calls end to end


async def test_a_typed_tool_called_with_good_arguments() -> None:
    calls: list[tuple[int, int]] = []

    @tool
    async def add(a: int, b: int = 2) -> int:
        """Add two integers.

        Args:
            a: the first term.
            b: the second term.
        """
        calls.append((a, b))
        return a + b

    results, model = await run_calls([add], [call("add", {"a": 1, "b": 5}), call("add", {"a": "40"})])
    assert [(r.content, r.is_error) for r in results] == [("6", False), ("42", False)]
    assert sorted(calls) == [(1, 5), (40, 2)]  # "40" converted to int; b's default applied by Python
    spec = {s.name: s for s in model.requests[0].tools}["add"]
    assert spec.description == "Add two integers."
    assert spec.parameters == {
        "type": "object",
        "properties": {
            "a": {"type": "integer", "description": "the first term."},
            "b": {"type": "integer", "description": "the second term.", "default": 2},
        },
        "required": ["a"],
        "additionalProperties": False,
    }
    assert_clean(add)


async def test_bad_arguments_are_a_readable_error_and_the_function_is_not_called() -> None:
    calls: list[int] = []

    @tool
    async def count(n: int) -> str:
        calls.append(n)
        return "ok"

    async def raw_handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        return "ok"

    raw = Tool(
        "raw_count",
        "count",
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"], "additionalProperties": False},
        raw_handler,
    )
    results, _ = await run_calls(
        [count, raw],
        [
            call("count", {"n": "three"}),
            call("count", {"n": 3, "extra": 1}),
            call("count", {}),
            call("count", "{not json"),
            call("count", "[1, 2]"),
            call("raw_count", {"n": "three"}),
            call("count", {"n": 3}),
        ],
    )
    assert [r.is_error for r in results] == [True] * 6 + [False]
    prefix = "error: arguments for tool 'count' do not match its schema: "
    assert (
        results[0].content
        == prefix + 'n: Input should be a valid integer, unable to parse string as an integer (got "three")'
    )
    assert results[1].content == prefix + "extra: Extra inputs are not permitted"
    assert results[2].content == prefix + "n: Field required"
    # not JSON / not an object: worded exactly as for a raw-schema tool
    assert results[3].content.startswith("error: arguments are not valid JSON (")
    assert results[4].content == "error: arguments must be a JSON object, got list"
    # a raw-schema tool words it alike: "error: arguments for tool X do not match its schema: path: ..."
    assert results[5].content.startswith("error: arguments for tool 'raw_count' do not match its schema: n: ")
    assert calls == [3]


async def test_the_first_parameter_annotated_tool_context_receives_the_context() -> None:
    seen: list[tuple[str, str, int, int]] = []

    @tool
    async def whoami(ctx: ToolContext, greeting: str) -> str:
        seen.append((ctx.agent.id, ctx.call_id, ctx.turn, ctx.step))
        return f"{greeting} from {ctx.call_id}"

    @tool
    def whoami_sync(context: ToolContext) -> str:
        return context.call_id

    assert list(whoami.parameters["properties"]) == ["greeting"]
    assert whoami_sync.parameters == {"type": "object", "properties": {}, "additionalProperties": False}
    results, _ = await run_calls(
        [whoami, whoami_sync], [call("whoami", {"greeting": "hi"}, "c1"), call("whoami_sync", {}, "c2")]
    )
    assert [r.content for r in results] == ["hi from c1", "c2"]
    assert [(s[1], s[2], s[3]) for s in seen] == [("c1", 1, 1)]
    assert seen[0][0]  # the calling agent's id


async def test_plain_functions_run_inline_and_thread_true_runs_them_in_a_worker_thread() -> None:
    main = threading.get_ident()
    threads: dict[str, int] = {}

    @tool
    def inline(x: int) -> int:
        threads["inline"] = threading.get_ident()
        return x * 2

    @tool(thread=True)
    def threaded(ctx: ToolContext, x: int) -> int:
        threads["threaded"] = threading.get_ident()
        return x * 3

    @tool
    async def native(x: int) -> int:
        await trio.lowlevel.checkpoint()
        threads["native"] = threading.get_ident()
        return x * 4

    async def _inner(x: int) -> int:
        return x * 5

    def hides_a_coroutine(x: int) -> Any:  # a plain wrapper returning an awaitable: awaited
        return _inner(x)

    wrapped = tool(hides_a_coroutine, name="wrapped")
    results, _ = await run_calls(
        [inline, threaded, native, wrapped],
        [call("inline", {"x": 1}), call("threaded", {"x": 1}), call("native", {"x": 1}), call("wrapped", {"x": 1})],
    )
    assert [r.content for r in results] == ["2", "3", "4", "5"]
    assert threads["inline"] == main and threads["native"] == main
    assert threads["threaded"] != main
    assert threaded.thread and not inline.thread


def _thread_tool(checks: bool) -> tuple[FunctionTool[..., str], threading.Event, threading.Event, list[int]]:
    entered, gate = threading.Event(), threading.Event()
    finished: list[int] = []

    def crunch(n: int) -> str:
        entered.set()
        gate.wait()
        if checks:
            trio.from_thread.check_cancelled()  # raises Cancelled here once the turn is cancelled
        finished.append(n)
        return "crunched"

    return tool(crunch, thread=True), entered, gate, finished


@pytest.mark.parametrize("checks", [True, False], ids=["calls-check_cancelled", "ignores-cancellation"])
async def test_cancelling_a_thread_tool_waits_for_the_function_and_it_may_stop_early(checks: bool) -> None:
    crunch, entered, gate, finished = _thread_tool(checks)
    model = ScriptedModel([{"tool_calls": [call("crunch", {"n": 7})]}, {"text": "never"}])
    async with open_test_harness(model) as h:
        h.tools.add(crunch)
        async with h.agents.open() as agent:
            agent.followup("go")
            await trio.to_thread.run_sync(entered.wait)  # the function is running in its thread
            assert agent.cancel()  # delivered to the waiting call at once ...
            assert agent.status == "running"  # ... which waits for the thread: nothing is abandoned
            gate.set()
            await agent.when_idle()
            results = [e for e in agent.session.events if isinstance(e, ev.ToolResult)]
            assert len(results) == 1
            if checks:  # stopped at check_cancelled: the call reports the cancellation
                assert finished == [] and results[0].is_error and "cancelled" in results[0].content
            else:  # ran to completion before the turn ended: its real result is logged
                assert finished == [7] and (results[0].content, results[0].is_error) == ("crunched", False)
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == "aborted"
            assert len(model.requests) == 1


async def test_return_values_str_tool_output_and_json() -> None:
    def make(name: str, value: Any) -> Tool:
        def give() -> Any:
            return value

        return tool(give, name=name)

    cases: list[tuple[str, Any, str, bool]] = [
        ("text", "plain text", "plain text", False),
        ("soft_error", ToolOutput("no such city", is_error=True), "no such city", True),
        ("number", 42, "42", False),
        ("mapping", {"a": [1, 2], "ünï": None}, '{"a":[1,2],"ünï":null}', False),
        ("sequence", [1, "two", 3.5], '[1,"two",3.5]', False),
        ("nothing", None, "null", False),
        ("flag", True, "true", False),
        ("model", Report(total=2, items=["a", "b"]), '{"total":2,"items":["a","b"]}', False),
        ("attrs_instance", Reading("Oslo", celsius=7.0), '{"city":"Oslo","celsius":7.0}', False),
        (
            "nested",
            {"readings": [Reading("Lima", celsius=22.0)]},
            '{"readings":[{"city":"Lima","celsius":22.0}]}',
            False,
        ),
        ("dataclass", Pair(1, 2), '{"left":1,"right":2}', False),
        ("member", Color.BLUE, '"blue"', False),
    ]
    tools = [make(name, value) for name, value, _, _ in cases]
    results, _ = await run_calls(tools, [call(name, {}) for name, _, _, _ in cases])
    assert [(r.content, r.is_error) for r in results] == [(text, err) for _, _, text, err in cases]


async def test_a_value_that_cannot_be_serialised_is_an_error_result_naming_the_tool() -> None:
    @tool
    def opaque() -> object:
        return threading.Lock()

    results, _ = await run_calls([opaque], [call("opaque", {})])
    assert results[0].is_error
    assert results[0].content.startswith("error: tool 'opaque' failed: ToolError: tool 'opaque' returned a lock ")
    assert "return a str, a ToolOutput or a JSON-serialisable value" in results[0].content


# ---------------------------------------------------------------- parameter types


async def test_enum_literal_optional_list_dict_typeddict_and_attrs_parameters_are_converted() -> None:
    received: list[dict[str, Any]] = []

    @tool
    def draw(
        shape: Shape,
        where: Point,
        options: Options,
        color: Color,
        size: Size = Size.SMALL,
        mode: Literal["fill", "stroke"] = "fill",
        layer: Optional[int] = None,  # noqa: UP045 - the typing spelling is what this case covers
        tags: list[str] | None = None,
        weights: dict[str, float] | None = None,
    ) -> str:
        """Draw a shape.

        Args:
            shape: what to draw.
            where: the anchor.
        """
        received.append(locals())
        return "drawn"

    arguments = {
        "shape": {"points": [{"x": 1}, {"x": 2, "y": 3}], "color": "blue", "tag": "t1"},
        "where": {"x": "1.5"},
        "options": {"depth": 2},
        "color": "red",
        "size": 2,
        "mode": "stroke",
        "layer": None,
        "tags": ["a", "b"],
        "weights": {"a": 1},
    }
    results, _ = await run_calls(
        [draw],
        [
            call("draw", arguments),
            call(
                "draw",
                {"shape": {"points": []}, "where": {"x": 0}, "options": {"depth": 1, "label": "l"}, "color": "blue"},
            ),
        ],
    )
    assert [r.content for r in results] == ["drawn", "drawn"]
    assert len(received) == 2  # the two calls ran concurrently: tell them apart by their shape
    first, second = sorted(received, key=lambda args: -len(args["shape"].points))
    assert first["shape"] == Shape(points=[Point(1.0), Point(2.0, 3.0)], color=Color.BLUE, tag="t1")
    assert type(first["shape"].points[0]) is Point and first["where"] == Point(1.5)
    assert first["options"] == {"depth": 2}
    assert first["color"] is Color.RED and first["size"] is Size.LARGE and first["mode"] == "stroke"
    assert first["layer"] is None and first["tags"] == ["a", "b"] and first["weights"] == {"a": 1.0}
    assert second["size"] is Size.SMALL and second["mode"] == "fill" and second["tags"] is None  # defaults
    assert second["options"] == {"depth": 1, "label": "l"}

    props = draw.parameters["properties"]
    point = {
        "type": "object",
        "description": "A point on the canvas.",
        "properties": {
            "x": {"type": "number", "description": "horizontal position."},
            "y": {"type": "number", "description": "vertical position.", "default": 0.0},
        },
        "required": ["x"],
        "additionalProperties": False,
    }
    assert _sorted(props["where"]) == _sorted({**point, "description": "the anchor."})
    assert _sorted(props["shape"]) == _sorted(
        {
            "type": "object",
            "description": "what to draw.",
            "properties": {
                "points": {"type": "array", "items": point},
                "color": {"type": "string", "enum": ["red", "blue"], "description": "A colour.", "default": "red"},
                "tag": {"type": "string", "default": ""},
            },
            "required": ["points"],
            "additionalProperties": False,
        }
    )
    assert _sorted(props["options"]) == _sorted(
        {
            "type": "object",
            "description": "Drawing options.",
            "properties": {"depth": {"type": "integer"}, "label": {"type": "string"}},
            "required": ["depth"],
            "additionalProperties": False,  # a TypedDict without its own pydantic config forbids extra keys
        }
    )
    assert props["color"] == {"type": "string", "enum": ["red", "blue"], "description": "A colour."}
    assert props["size"] == {"type": "integer", "enum": [1, 2], "default": 1}
    assert props["mode"] == {"type": "string", "enum": ["fill", "stroke"], "default": "fill"}
    assert props["layer"] == {"anyOf": [{"type": "integer"}, {"type": "null"}], "default": None}
    assert props["tags"] == {
        "anyOf": [{"type": "array", "items": {"type": "string"}}, {"type": "null"}],
        "default": None,
    }
    assert props["weights"]["anyOf"][0] == {"type": "object", "additionalProperties": {"type": "number"}}
    assert draw.parameters["required"] == ["shape", "where", "options", "color"]
    assert_clean(draw)


def _sorted(schema: Any) -> Any:
    return json.loads(json.dumps(schema, sort_keys=True))


async def test_wrong_nested_values_and_attrs_validator_errors_are_argument_errors() -> None:
    calls: list[Any] = []

    @tool
    def place(where: Point, amount: Positive, color: Color = Color.RED) -> str:
        calls.append(where)
        return "placed"

    results, _ = await run_calls(
        [place],
        [
            call("place", {"where": {"x": "left", "z": 1}, "amount": {"value": 1}, "color": "green"}),
            call("place", {"where": {"x": 1}, "amount": {"value": 0}}),
            call("place", {"where": {"x": 1}, "amount": {"value": 3}}),
        ],
    )
    prefix = "error: arguments for tool 'place' do not match its schema: "
    assert results[0].content == prefix + (
        'where/x: Input should be a valid number, unable to parse string as a number (got "left"); '
        "where/z: Extra inputs are not permitted; "
        "color: Input should be 'red' or 'blue' (got \"green\")"
    )
    assert results[1].content.startswith(prefix + "amount: Value error, Positive: ValueError: 'value' must be > 0: 0")
    assert [r.is_error for r in results] == [True, True, False]
    assert calls == [Point(1.0)]


async def test_recursive_pydantic_models_keep_their_definitions() -> None:
    @tool
    def grow(tree: Tree, tags: list[str] | None = None) -> int:
        def count(node: Tree) -> int:
            return 1 + sum(count(child) for child in node.children)

        return count(tree)

    assert_clean(grow)
    assert grow.parameters["properties"]["tree"] == {"$ref": "#/$defs/Tree"}
    assert set(grow.parameters["$defs"]) == {"Tree"}
    results, _ = await run_calls([grow], [call("grow", {"tree": {"name": "a", "children": [{"name": "b"}]}})])
    assert results[0].content == "2"


def test_a_recursive_typing_extensions_typed_dict_is_accepted() -> None:
    @tool
    def size(folder: Folder) -> int:
        return 1 + sum(size(child) for child in folder["children"])

    assert_clean(size)
    assert size.parameters["properties"]["folder"] == {"$ref": "#/$defs/Folder"}
    args = size.validate('{"folder": {"name": "a", "children": [{"name": "b", "children": []}]}}')
    assert size(**args) == 2


def test_a_recursive_typing_typed_dict_needs_typing_extensions_before_python_3_12() -> None:
    if sys.version_info >= (3, 12):  # pydantic accepts typing.TypedDict from 3.12 on
        made = tool(_std_recursive)
        assert made.validate('{"folder": {"name": "a", "children": []}}') == {"folder": {"name": "a", "children": []}}
        return
    with pytest.raises(ToolError, match=r"parameter 'folder' has a type .*use `typing_extensions\.TypedDict`"):
        tool(_std_recursive)


def test_a_property_named_title_stays_and_field_metadata_is_kept() -> None:
    @tool
    def publish(
        title: str, rating: typing.Annotated[int, pydantic.Field(ge=1, le=5, description="stars, 1 to 5")] = 3
    ) -> str:
        """Publish a review.

        Args:
            title: the headline.
            rating: overridden by the Field description.
        """
        return title

    assert publish.parameters["properties"] == {
        "title": {"type": "string", "description": "the headline."},
        "rating": {"type": "integer", "minimum": 1, "maximum": 5, "description": "stars, 1 to 5", "default": 3},
    }
    assert_clean(publish)
    with pytest.raises(ValueError, match=r"rating: Input should be less than or equal to 5 \(got 9\)"):
        publish.validate('{"title": "t", "rating": 9}')


# ---------------------------------------------------------------- docstrings


def google(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the cached forecast when it is fresh.

    Args:
        city (str): the city, e.g.
            "Paris".
        days: how many days ahead.

    Returns:
        The forecast.
    """
    return city


def numpy_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the cached forecast when it is fresh.

    Parameters
    ----------
    city : str
        the city, e.g.
        "Paris".
    days : int, optional
        how many days ahead.

    Returns
    -------
    str
        The forecast.
    """
    return city


def sphinx_style(city: str, days: int = 1) -> str:
    """Forecast the weather.

    Uses the cached forecast when it is fresh.

    :param city: the city, e.g.
        "Paris".
    :param int days: how many days ahead.
    :returns: The forecast.
    :rtype: str
    """
    return city


@pytest.mark.parametrize("fn", [google, numpy_style, sphinx_style], ids=["google", "numpy", "sphinx"])
def test_descriptions_come_from_google_numpy_and_sphinx_docstrings(fn: Callable[[str, int], str]) -> None:
    made = tool(fn, name="forecast")
    assert made.description == "Forecast the weather.\n\nUses the cached forecast when it is fresh."
    assert made.parameters["properties"] == {
        "city": {"type": "string", "description": 'the city, e.g. "Paris".'},
        "days": {"type": "integer", "description": "how many days ahead.", "default": 1},
    }


def google_more(low: int, high: int, *, inclusive: bool = True) -> list[int]:
    """A range.

    Args:
        low: where it starts.

            Negative values count too.
        high (int): where it ends.

    Keyword Args:
        inclusive: whether ``high`` is in it.

    Raises:
        ValueError: never.
    """
    return []


def numpy_more(low: int, high: int) -> list[int]:
    """A range.

    Parameters
    ----------
    low, high : int
        the bounds.
    """
    return []


def test_docstring_sections_continuations_and_shared_entries() -> None:
    google_props = tool(google_more).parameters["properties"]
    assert [google_props[k]["description"] for k in ("low", "high", "inclusive")] == [
        "where it starts. Negative values count too.",
        "where it ends.",
        "whether ``high`` is in it.",
    ]
    numpy_props = tool(numpy_more).parameters["properties"]
    assert numpy_props["low"]["description"] == numpy_props["high"]["description"] == "the bounds."


def test_no_docstring_gives_an_empty_description_and_an_explicit_one_wins() -> None:
    def bare(x: int) -> int:
        return x

    assert tool(bare).description == ""
    assert tool(google, description="Mine.").description == "Mine."


# ---------------------------------------------------------------- the decorator and the Tool


def test_decorator_forms_and_tool_attributes() -> None:
    @tool()
    async def plain(x: int) -> int:
        return x

    @tool(name="renamed", description="Said so.", parallel_safe=False, requires_approval=True)
    def original(x: int) -> int:
        return x + 1

    assert isinstance(plain, Tool) and isinstance(original, FunctionTool)
    assert (plain.name, plain.parallel_safe, plain.requires_approval) == ("plain", True, False)
    assert (original.name, original.description) == ("renamed", "Said so.")
    assert (original.parallel_safe, original.requires_approval) == (False, True)
    assert original(1) == 2 and original.function(1) == 2  # still callable as the function
    assert trio_harness.tool is tool and trio_harness.agents.tool is tool
    made = tool(google, requires_approval=True, parallel_safe=False)
    assert (made.name, made.requires_approval, made.parallel_safe) == ("google", True, False)
    assert made.spec.parameters == made.parameters
    again = tool(original, name="again")  # a function tool re-made from its function
    assert (again.name, again.function, again.parameters) == ("again", original.function, original.parameters)


async def test_raw_schema_tools_are_unchanged_and_do_not_require_approval() -> None:
    async def handler(ctx: ToolContext, args: dict[str, Any]) -> str:
        return str(args)

    raw = Tool("raw", "r", {"type": "object"}, handler)
    assert raw.requires_approval is False
    assert Tool("raw", "r", {"type": "object"}, handler, requires_approval=True).requires_approval is True
    results, _ = await run_calls([raw], [call("raw", {"a": 1})])
    assert results[0].content == "{'a': 1}"


def test_arguments_text_edge_cases() -> None:
    @tool
    def nothing() -> str:
        return "ok"

    @tool
    def needs(n: int) -> int:
        return n

    assert nothing.validate("") == {} and nothing.validate("  ") == {} and nothing.validate("{}") == {}
    with pytest.raises(ValueError, match=r"^arguments for tool 'needs' do not match its schema: n: Field required$"):
        needs.validate("")
    with pytest.raises(ValueError, match="arguments must be a JSON object, got int"):
        needs.validate("3")


def test_types_local_to_the_defining_function_resolve() -> None:
    class Local(enum.Enum):
        A = "a"

    @attrs.frozen
    class Box:
        kind: Local

    @tool
    def pick(choice: Local, box: Box) -> str:
        return choice.value

    made = tool(pick.function, name="pick_again")
    for one in (pick, made):
        assert one.validate('{"choice": "a", "box": {"kind": "a"}}') == {"choice": Local.A, "box": Box(Local.A)}


# ---------------------------------------------------------------- refused at decoration


def _untyped(x):  # type: ignore[no-untyped-def]
    return x


def _star(*items: int) -> int:
    return 0


def _double_star(**items: int) -> int:
    return 0


def _positional(x: int, /) -> int:
    return x


async def _async_fn(x: int) -> int:
    return x


def _generator(x: int) -> Iterator[int]:
    yield x


def _context_second(x: int, ctx: ToolContext) -> int:
    return x


def _callable_param(fn: Callable[[int], int]) -> int:
    return 0


def _recursive(node: Node) -> int:
    return 0


def _std_recursive(folder: StdFolder) -> int:
    return 0


def _any(value: Any) -> str:
    return str(value)


def _unresolvable(amount: Decimal) -> int:
    return 0


class _Opaque:
    pass


def _opaque(thing: _Opaque) -> int:
    return 0


@pytest.mark.parametrize(
    ("fn", "kwargs", "message"),
    [
        (_untyped, {}, r"tool '_untyped': parameter 'x' has no type annotation; annotate it \(e\.g\. `x: str`\)"),
        (_star, {}, r"tool '_star': \*items cannot be described to a model; name each parameter"),
        (_double_star, {}, r"tool '_double_star': \*\*items cannot be described"),
        (_positional, {}, r"parameter 'x' is positional-only; the model passes arguments by name"),
        (_async_fn, {"thread": True}, r"thread=True is for plain functions; _async_fn is async"),
        (_generator, {}, r"a generator cannot be a tool"),
        (_context_second, {}, r"parameter 'ctx': only the first parameter may take the ToolContext"),
        (_callable_param, {}, r"parameter 'fn' has a type pydantic cannot validate or describe"),
        (_opaque, {}, r"parameter 'thing' has a type pydantic cannot validate or describe"),
        (_recursive, {}, r"the attrs class Node refers to itself; a recursive attrs class cannot be"),
        (_unresolvable, {}, r"cannot resolve the type hints .*Decimal.*import the types"),
        (lambda x: x, {}, r"cannot name a tool after .*'<lambda>' does not match .*pass name="),
        (functools.partial(google, "Paris"), {}, r"cannot name a tool after functools\.partial"),
    ],
    ids=[
        "untyped",
        "star-args",
        "star-kwargs",
        "positional-only",
        "thread-async",
        "generator",
        "context-second",
        "callable-param",
        "opaque-class",
        "recursive-attrs",
        "unresolvable",
        "lambda",
        "partial-without-name",
    ],
)
def test_functions_that_cannot_be_described_are_refused_with_a_clear_error(
    fn: Callable[..., Any], kwargs: dict[str, Any], message: str
) -> None:
    with pytest.raises(ToolError, match=message):
        tool(fn, **kwargs)


def test_any_is_allowed_when_written() -> None:
    made = tool(_any)
    assert made.parameters["properties"] == {"value": {}}
    assert made.validate('{"value": [1, {"a": null}]}') == {"value": [1, {"a": None}]}


def test_a_partial_with_a_name_describes_the_remaining_parameters() -> None:
    made = tool(functools.partial(google, days=3), name="forecast_3")
    assert made.description.startswith("Forecast the weather.")
    assert made.parameters["properties"]["days"]["default"] == 3
    assert made.validate('{"city": "Oslo"}') == {"city": "Oslo"}


def test_a_request_offers_the_function_tool_like_any_other() -> None:
    made = tool(google, name="forecast")
    request = ModelRequest(model="m", system="", messages=(), tools=(made.spec,))
    assert request.tools[0].name == "forecast" and request.tools[0].parameters is made.parameters


def test_pydantic_is_imported_with_the_first_function_tool_not_with_the_package() -> None:
    script = (
        "import sys, trio_harness\n"
        "assert 'pydantic' not in sys.modules, 'imported with the package'\n"
        "@trio_harness.tool\n"
        "def f(x: int) -> int:\n"
        "    return x\n"
        "assert 'pydantic' in sys.modules\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr
