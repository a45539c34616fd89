"""The private event codec: one cattrs converter, a tagged union, no extra keys.

Every line of a session log is a JSON object whose ``"type"`` key is the
record's wire tag.  Decoding refuses unknown types, unknown or missing keys and
wrongly typed values with :class:`EventDecodeError`, and refuses headers of an
unknown format version with :class:`UnsupportedFormatError`.
"""

from __future__ import annotations

import json
import math
from typing import Any, get_args, get_origin

import cattrs
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.preconf.json import make_converter

from .._errors import EventDecodeError, UnsupportedFormatError
from ._events import EVENT_TYPES, FORMAT_VERSION, AnyEvent, Event, SessionHeader

__all__ = ["decode_event", "decode_header", "encode_event", "encode_header"]

_converter = make_converter(forbid_extra_keys=True, detailed_validation=False)


def _strict(kind: type[Any]) -> Any:
    def structure(value: Any, _: Any) -> Any:
        # bool is an int subclass; JSON true must not pass as a number.
        if type(value) is kind or (kind is float and type(value) is int):
            # NaN / Infinity (and 1e400) parse, but encode_event refuses them.
            if kind is float and not math.isfinite(value):
                raise ValueError(f"expected a finite number, got {value!r}")
            return value
        raise TypeError(f"expected {kind.__name__}, got {type(value).__name__} {value!r}")

    return structure


for _kind in (int, float, str, bool):
    _converter.register_structure_hook(_kind, _strict(_kind))


def _is_homogeneous_tuple(kind: Any) -> bool:
    args = get_args(kind)
    return get_origin(kind) is tuple and len(args) == 2 and args[1] is Ellipsis


def _strict_tuple(kind: Any, converter: Any) -> Any:
    # cattrs turns any iterable into a tuple: "ab" would become ("a", "b").
    elements = homogenous_tuple_structure_factory(kind, converter)

    def structure(value: Any, _: Any) -> Any:
        if type(value) is not list:
            raise TypeError(f"expected a JSON array, got {type(value).__name__} {value!r}")
        return elements(value, kind)

    return structure


_converter.register_structure_hook_factory(_is_homogeneous_tuple, _strict_tuple)

_TAGS: dict[str, type[Event]] = {cls.type: cls for cls in EVENT_TYPES}

_unstructure: dict[type[Event], Any] = {}
_structure: dict[str, Any] = {}
for _cls in EVENT_TYPES:
    _unstructure[_cls] = _converter.get_unstructure_hook(_cls)
    _structure[_cls.type] = _converter.get_structure_hook(_cls)

_dumps_utf8 = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False).encode
_dumps_ascii = json.JSONEncoder(ensure_ascii=True, separators=(",", ":"), allow_nan=False).encode
_loads = json.loads


def _dumps(data: Any) -> str:
    """One JSON line that always encodes as UTF-8.

    A lone surrogate (e.g. half of an emoji split across two streamed chunks)
    cannot be written as UTF-8, and would make every later flush of the log
    fail; such a line is written with ``\\uXXXX`` escapes instead, which decode
    back to the same string (except that a high surrogate directly followed by
    a low one decodes as the one character the pair stands for).
    """
    line = _dumps_utf8(data)
    if not line.isascii():
        try:
            line.encode("utf-8")
        except UnicodeEncodeError:
            return _dumps_ascii(data)
    return line


def encode_event(event: Event) -> str:
    """Encode an event as one JSON line (without the newline)."""
    data = _unstructure[type(event)](event)
    return _dumps({"type": event.type, **data})


def event_to_dict(event: Event) -> dict[str, Any]:
    """The JSON-ready dict of an event, ``"type"`` first."""
    data: dict[str, Any] = {"type": event.type}
    data.update(_unstructure[type(event)](event))
    return data


def decode_event_dict(data: Any) -> AnyEvent:
    """Decode an already-parsed JSON object into an event."""
    if not isinstance(data, dict):
        raise EventDecodeError(f"an event must be a JSON object, got {type(data).__name__}")
    tag = data.get("type")
    cls = _TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise EventDecodeError(f"unknown event type {tag!r}; known types: {', '.join(sorted(_TAGS))}")
    fields = dict(data)
    del fields["type"]
    try:
        event: AnyEvent = _structure[cls.type](fields, cls)
    except Exception as exc:
        raise EventDecodeError(f"invalid {tag!r} event: {_describe(exc)}") from exc
    return event


def decode_event(line: str | bytes) -> AnyEvent:
    """Decode one JSON line into an event.

    Raises:
        EventDecodeError: the line is not JSON, names an unknown type, or has
            extra, missing or wrongly typed keys.
    """
    try:
        data = _loads(line)
    except ValueError as exc:
        raise EventDecodeError(f"not valid JSON: {exc}") from exc
    return decode_event_dict(data)


def encode_header(header: SessionHeader) -> str:
    """Encode a session header as one JSON line (without the newline)."""
    return _dumps({"type": SessionHeader.type, **_converter.unstructure(header)})


def decode_header(line: str | bytes) -> SessionHeader:
    """Decode a session header line.

    Raises:
        EventDecodeError: the line is not a valid header.
        UnsupportedFormatError: the header names a format version other than
            :data:`FORMAT_VERSION`.
    """
    try:
        data = _loads(line)
    except ValueError as exc:
        raise EventDecodeError(f"session header is not valid JSON: {exc}") from exc
    if not isinstance(data, dict) or data.get("type") != SessionHeader.type:
        raise EventDecodeError("the first line is not a session header (type 'session')")
    version = data.get("version")
    if version != FORMAT_VERSION:
        raise UnsupportedFormatError(
            f"session format version {version!r} is not supported (this library reads version "
            f"{FORMAT_VERSION}); upgrade trio_harness to read it"
        )
    fields = dict(data)
    del fields["type"]
    try:
        return _converter.structure(fields, SessionHeader)
    except Exception as exc:
        raise EventDecodeError(f"invalid session header: {_describe(exc)}") from exc


def _describe(exc: BaseException) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unexpected keys {sorted(exc.extra_fields)}"
    if isinstance(exc, KeyError):
        return f"missing key {exc}"
    return str(exc) or type(exc).__name__
