"""Tool-argument validation: jsonschema, with a fast path for the schemas tools usually declare.

Arguments are validated against the tool's JSON schema before every call.
:mod:`jsonschema` builds a validator object per keyword and value it visits,
which costs more than the rest of a call's dispatch; yet most tool schemas are
an object of typed properties.  For a schema made only of the keywords below,
:func:`compile_check` builds a plain function that answers True exactly when
jsonschema (Draft 2020-12, ``format`` not asserted) finds a parsed JSON value
valid.  Any other schema gets no fast check; and when the fast check says no,
jsonschema decides again and explains, so the errors a model reads are
jsonschema's.

Understood: ``type`` (a name or a list of names), ``properties``,
``required``, ``additionalProperties`` (true or false), ``items`` (a schema),
``enum`` (of strings only), boolean ``true`` subschemas, and the annotations
(``title``, ``description``, ``default``, ``examples``, ``format``, ...).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import jsonschema
import jsonschema.exceptions

Check = Callable[[Any], bool]

# Keywords that never make a value invalid (format is not asserted: no format checker).
_ANNOTATIONS = frozenset(
    {"title", "description", "default", "examples", "format", "$comment", "deprecated", "readOnly", "writeOnly"}
)
_KEYWORDS = _ANNOTATIONS | {"type", "properties", "required", "additionalProperties", "items", "enum"}
_TYPE_NAMES = frozenset({"object", "array", "string", "integer", "number", "boolean", "null"})

# The JSON type of each Python type json.loads produces (int and float aside).
_JSON_TYPE: dict[type, str] = {dict: "object", list: "array", str: "string", bool: "boolean", type(None): "null"}


class _Unsupported(Exception):
    """The schema uses something this fast path does not implement."""


def _type_check(names: object) -> Check:
    if isinstance(names, str):
        allowed = frozenset({names})
    elif isinstance(names, list) and all(isinstance(name, str) for name in names):
        allowed = frozenset(names)
    else:
        raise _Unsupported
    if not allowed <= _TYPE_NAMES:
        raise _Unsupported
    integer = "integer" in allowed
    number = "number" in allowed

    def check(value: Any) -> bool:
        kind = type(value)
        if kind is int:
            return integer or number
        if kind is float:
            # Draft 2020-12: a float with no fractional part is an integer.
            return number or (integer and value.is_integer())
        return _JSON_TYPE.get(kind) in allowed

    return check


def _compile(schema: object) -> Check | None:
    """The check of ``schema``, or None when it accepts everything."""
    if schema is True:
        return None
    if not isinstance(schema, dict) or not schema.keys() <= _KEYWORDS:
        raise _Unsupported
    checks: list[Check] = []
    if "type" in schema:
        checks.append(_type_check(schema["type"]))
    if "enum" in schema:
        options = schema["enum"]
        if not isinstance(options, list) or not all(type(option) is str for option in options):
            raise _Unsupported
        allowed = frozenset(options)
        checks.append(lambda value: type(value) is str and value in allowed)
    if {"properties", "required", "additionalProperties"} & schema.keys():
        checks.append(_object_check(schema))
    if "items" in schema:
        item = _compile(schema["items"])
        if item is not None:
            checks.append(_items_check(item))
    if not checks:
        return None
    if len(checks) == 1:
        return checks[0]
    if len(checks) == 2:
        first, second = checks
        return lambda value: first(value) and second(value)
    return lambda value: all([check(value) for check in checks])


def _items_check(item: Check) -> Check:
    # items constrains arrays only.
    return lambda value: type(value) is not list or all(map(item, value))


def _object_check(schema: Mapping[str, Any]) -> Check:
    properties = schema.get("properties", {})
    required = schema.get("required", [])
    additional = schema.get("additionalProperties", True)
    if not isinstance(properties, dict) or not isinstance(required, list):
        raise _Unsupported
    if not all(isinstance(name, str) for name in required) or type(additional) is not bool:
        raise _Unsupported
    compiled = [(name, _compile(sub)) for name, sub in properties.items()]
    named = tuple((name, check) for name, check in compiled if check is not None)
    known = frozenset(properties)
    needed = tuple(required)

    def check_object(value: Any) -> bool:
        # properties, required and additionalProperties constrain objects only.
        if type(value) is not dict:
            return True
        for name in needed:
            if name not in value:
                return False
        for name, check_one in named:
            if name in value and not check_one(value[name]):
                return False
        return additional or value.keys() <= known

    return check_object


def compile_check(schema: Mapping[str, Any]) -> Check | None:
    """A fast validity check of parsed JSON values against ``schema``, or None.

    None means the schema uses a keyword outside the fast path (or accepts
    everything): use jsonschema alone.  The check expects what
    :func:`json.loads` returns.
    """
    try:
        check = _compile(schema)
    except _Unsupported:
        return None
    return check if check is not None else lambda value: True


class SchemaValidator:
    """A Draft 2020-12 validator for one schema: the fast check when it says yes, jsonschema otherwise."""

    __slots__ = ("_check", "_jsonschema")

    def __init__(self, schema: Mapping[str, Any]) -> None:
        self._jsonschema = jsonschema.Draft202012Validator(schema)
        self._check = compile_check(schema)

    def is_valid(self, instance: Any) -> bool:
        """Whether ``instance`` (a parsed JSON value) is valid."""
        check = self._check
        if check is not None and check(instance):
            return True
        return self._jsonschema.is_valid(instance)

    def iter_errors(self, instance: Any) -> Iterator[jsonschema.exceptions.ValidationError]:
        """jsonschema's errors for ``instance``."""
        return self._jsonschema.iter_errors(instance)
