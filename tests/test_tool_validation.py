"""Tool-argument validation against raw JSON schemas: the fast check agrees with jsonschema."""

from __future__ import annotations

import json
from typing import Any

import jsonschema
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from trio_harness import Tool, ToolContext
from trio_harness.agents._schema_check import SchemaValidator, compile_check
from trio_harness.agents._tools import parse_arguments

# ------------------------------------------------------------------ strategies

NAMES = st.sampled_from(["a", "b", "c"])
SHORT = st.text("ab", max_size=2)
TYPE_NAMES = st.sampled_from(["object", "array", "string", "integer", "number", "boolean", "null"])
TYPES = TYPE_NAMES | st.lists(TYPE_NAMES, min_size=1, max_size=3, unique=True)
ANNOTATIONS: dict[str, st.SearchStrategy[Any]] = {
    "description": SHORT,
    "title": SHORT,
    "default": st.integers(),
    "format": st.sampled_from(["email", "date-time", "uri"]),
}

leaf_schemas = st.fixed_dictionaries(
    {}, optional={"type": TYPES, "enum": st.lists(SHORT, max_size=3), **ANNOTATIONS}
) | st.just(True)


def _nested(children: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    return st.fixed_dictionaries(
        {},
        optional={
            "type": TYPES,
            "properties": st.dictionaries(NAMES, children, max_size=3),
            "required": st.lists(NAMES, max_size=3, unique=True),
            "additionalProperties": st.booleans(),
            "items": children,
            **ANNOTATIONS,
        },
    )


schemas = st.recursive(leaf_schemas, _nested, max_leaves=8)

# What json.loads can return (NaN and infinities included: Python's json reads them).
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.integers().map(float) | SHORT,
    lambda children: st.lists(children, max_size=3) | st.dictionaries(NAMES | SHORT, children, max_size=3),
    max_leaves=8,
).map(lambda value: json.loads(json.dumps(value)))


# ------------------------------------------------------------------ the fast check


@settings(max_examples=500)
@given(schema=schemas, value=json_values)
def test_the_fast_check_agrees_with_jsonschema(schema: Any, value: Any) -> None:
    if schema is True:
        schema = {}
    check = compile_check(schema)
    assert check is not None  # every generated schema is in the fast subset
    assert check(value) == jsonschema.Draft202012Validator(schema).is_valid(value)


@given(value=json_values)
def test_the_typical_tool_schema_is_checked_fast_and_exactly(value: Any) -> None:
    schema = {
        "type": "object",
        "properties": {
            "command": {"type": "string", "description": "what to run"},
            "timeout": {"type": "number"},
            "count": {"type": "integer"},
            "mode": {"enum": ["a", "b"]},
            "flags": {"type": "array", "items": {"type": "string"}},
            "env": {"type": "object", "additionalProperties": False, "properties": {"a": {"type": ["string", "null"]}}},
        },
        "required": ["command"],
        "additionalProperties": False,
    }
    check = compile_check(schema)
    assert check is not None
    expected = jsonschema.Draft202012Validator(schema).is_valid
    assert check(value) == expected(value)
    command = {"command": "ls", **(value if isinstance(value, dict) else {})}
    assert check(command) == expected(command)


@pytest.mark.parametrize(
    ("schema", "value", "valid"),
    [
        ({"type": "integer"}, 1.0, True),  # Draft 2020-12: an integral float is an integer
        ({"type": "integer"}, 1.5, False),
        ({"type": "integer"}, True, False),
        ({"type": "number"}, False, False),
        ({"type": "number"}, float("nan"), True),
        ({"type": "number"}, 3, True),
        ({"type": ["integer", "null"]}, None, True),
        ({"type": "boolean"}, 0, False),
        ({"type": "null"}, 0, False),
        ({"type": "object"}, [], False),
        ({"type": "array"}, {}, False),
        ({"enum": ["1"]}, 1, False),
        ({"type": "integer"}, float("inf"), False),
        ({"type": "string", "format": "email"}, "not an address", True),  # format is not asserted
        ({"properties": {"a": {"type": "string"}}}, 5, True),  # object keywords ignore non-objects
        ({"items": {"type": "string"}}, {"a": 1}, True),
        ({"type": "object", "additionalProperties": False}, {"a": 1}, False),
        ({"enum": ["a"]}, "a", True),
        ({"enum": []}, "a", False),
    ],
)
def test_edge_cases_of_the_fast_check(schema: dict[str, Any], value: Any, valid: bool) -> None:
    check = compile_check(schema)
    assert check is not None
    assert check(value) is valid
    assert jsonschema.Draft202012Validator(schema).is_valid(value) is valid


@pytest.mark.parametrize(
    "schema",
    [
        {"type": "object", "properties": {"a": {"$ref": "#/$defs/x"}}, "$defs": {"x": {"type": "string"}}},
        {"type": "string", "pattern": "^a"},
        {"type": "integer", "minimum": 0},
        {"type": "object", "additionalProperties": {"type": "string"}},
        {"type": "object", "patternProperties": {"^a": {"type": "string"}}},
        {"enum": [1, "a"]},
        {"type": "array", "items": False},
        {"anyOf": [{"type": "string"}]},
    ],
)
def test_other_keywords_leave_the_decision_to_jsonschema(schema: dict[str, Any]) -> None:
    assert compile_check(schema) is None
    validator = SchemaValidator(schema)
    for value in ("a", "b", 1, -1, {"a": 1}, {"b": "x"}, ["a"], []):
        assert validator.is_valid(value) == jsonschema.Draft202012Validator(schema).is_valid(value)


# ------------------------------------------------------------------ through Tool.validate


async def _echo(ctx: ToolContext, args: dict[str, Any]) -> str:
    return "ok"


@settings(max_examples=200)
@given(schema=schemas, value=json_values)
def test_tool_validate_accepts_and_refuses_as_jsonschema_does(schema: Any, value: Any) -> None:
    parameters = {**(schema if isinstance(schema, dict) else {}), "type": "object"}
    tool = Tool(name="t", description="d", parameters=parameters, handler=_echo)
    validator = jsonschema.Draft202012Validator(parameters)
    arguments = json.dumps(value)
    if not isinstance(value, dict):
        with pytest.raises(ValueError, match="arguments must be a JSON object"):
            tool.validate(arguments)
    elif validator.is_valid(value):
        assert tool.validate(arguments) == value
    else:
        first = sorted(validator.iter_errors(value), key=lambda e: list(e.absolute_path))[0]
        with pytest.raises(ValueError, match="do not match its schema") as raised:
            tool.validate(arguments)
        assert first.message in str(raised.value)


def _reference_parse(arguments: str) -> object:
    """parse_arguments as it was: json.loads, then the object check (the outcome: a value or an error)."""
    if not arguments.strip():
        return {}
    try:
        value = json.loads(arguments)
    except ValueError as exc:
        return ("error", f"arguments are not valid JSON ({exc}); send a JSON object")
    if not isinstance(value, dict):
        return ("error", f"arguments must be a JSON object, got {type(value).__name__}")
    return value


def _parse_outcome(arguments: str) -> object:
    try:
        return parse_arguments(arguments)
    except ValueError as exc:
        return ("error", str(exc))


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_spaces = st.text(st.sampled_from(" \t\n\r\u00a0\u2028\ufeff"), max_size=3)


@settings(max_examples=300)
@given(value=_json_values, before=_spaces, after=_spaces, tail=st.sampled_from(["", "x", "}", ",", "{}"]))
def test_arguments_parse_as_json_loads_would(value: object, before: str, after: str, tail: str) -> None:
    text = before + json.dumps(value) + after + tail
    assert repr(_parse_outcome(text)) == repr(_reference_parse(text))


@settings(max_examples=300)
@given(text=st.text(max_size=20))
def test_any_argument_text_parses_or_fails_as_json_loads_would(text: str) -> None:
    assert repr(_parse_outcome(text)) == repr(_reference_parse(text))
