"""The private event codec: one cattrs converter, a tagged union, no extra keys.

Every line of a session log is a JSON object whose ``"type"`` key is the
record's wire tag.  Decoding refuses unknown types, unknown or missing keys and
wrongly typed values with :class:`EventDecodeError`, and refuses headers of an
unknown format version with :class:`UnsupportedFormatError`.
"""

from __future__ import annotations

import json
import math
import re
import types
from collections.abc import Callable, Mapping
from typing import Any, Literal, Union, get_args, get_origin

import attrs
import cattrs
import cattrs.gen
from cattrs.cols import homogenous_tuple_structure_factory
from cattrs.preconf.json import make_converter

from .._errors import EventDecodeError, UnsupportedFormatError
from ._events import EVENT_TYPES, FORMAT_VERSION, AnyEvent, Event, InboxMessage, SessionHeader

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


def _json_object_structure(value: Any, _: Any) -> Any:
    # A free-form JSON object (ModelSettings.extra_body, ReasoningBlock.data), kept as parsed.
    if type(value) is not dict:
        raise TypeError(f"expected a JSON object, got {type(value).__name__} {value!r:.80}")
    return value


def _is_json_object(kind: Any) -> bool:
    origin: Any = get_origin(kind)
    return origin in (dict, Mapping) and get_args(kind) == (str, Any)


_converter.register_structure_hook_func(_is_json_object, _json_object_structure)


def _register_omitting(kind: type[Any], seen: set[type[Any]]) -> None:
    """Leave fields marked ``omit_if_default`` out of ``kind``'s lines (and its nested records') at their default.

    So a log line without such a field reads back with its default, and a
    field left at its default takes no space in the line.
    """
    if kind in seen:
        return
    seen.add(kind)
    attrs.resolve_types(kind)
    overrides: dict[str, Any] = {}
    for field in attrs.fields(kind):
        for inner in (field.type, *get_args(field.type), *(a for t in get_args(field.type) for a in get_args(t))):
            if isinstance(inner, type) and attrs.has(inner):
                _register_omitting(inner, seen)
        if field.metadata.get("omit_if_default"):
            overrides[field.name] = cattrs.gen.override(omit_if_default=True)
    if overrides:
        _converter.register_unstructure_hook(kind, cattrs.gen.make_dict_unstructure_fn(kind, _converter, **overrides))


_seen_records: set[type[Any]] = set()
for _cls in EVENT_TYPES:
    _register_omitting(_cls, _seen_records)

_TAGS: dict[str, type[Event]] = {cls.type: cls for cls in EVENT_TYPES}

_unstructure: dict[type[Event], Any] = {}
_structure: dict[str, Any] = {}
for _cls in EVENT_TYPES:
    _unstructure[_cls] = _converter.get_unstructure_hook(_cls)
    _structure[_cls.type] = _converter.get_structure_hook(_cls)

# ---------------------------------------------------------------- fast decoding
#
# Loading a long session decodes every line, so valid records take a direct
# path: one generated converter per type that checks exactly what the cattrs
# hooks above check (JSON types, finite numbers, literals, no extra or missing
# keys) and builds the record.  Anything it does not accept is decoded again by
# cattrs, whose error message is the one users see.


class _Fallback(Exception):
    """The fast path declines; cattrs decides (and explains)."""


_SCALAR_CHECKS = {
    int: "type({v}) is not int",
    str: "type({v}) is not str",
    bool: "type({v}) is not bool",
    float: "(type({v}) is not float and type({v}) is not int) or not _isfinite({v})",
}


class _Gen:
    """Generates one straight-line converter function per record type."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {"_Fallback": _Fallback, "_isfinite": math.isfinite}
        self.lines: list[str] = []
        self.counter = 0
        self.cache: dict[Any, str] = {}
        # Record types the fast encoder declines (see function).
        self.unsupported: set[Any] = set()

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"_{prefix}{self.counter}"

    def check(self, kind: Any, v: str, indent: str, out: list[str]) -> str:
        """Append checks of variable ``v`` against ``kind``; return the expression of the value."""
        if kind in _SCALAR_CHECKS:
            out.append(f"{indent}if {_SCALAR_CHECKS[kind].format(v=v)}: raise _Fallback")
            return v
        origin, args = get_origin(kind), get_args(kind)
        if origin is Literal:
            allowed = self.name("allowed")
            self.namespace[allowed] = frozenset(args)
            out.append(f"{indent}if type({v}) is not str or {v} not in {allowed}: raise _Fallback")
            return v
        if origin in (Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            if len(options) != 1 or len(args) != 2:
                raise TypeError(f"no fast converter for {kind!r}")
            inner: list[str] = []
            expr = self.check(options[0], v, indent + "    ", inner)
            if expr == v and not any("=" in line.split(":", 1)[0] for line in inner):
                out.append(f"{indent}if {v} is not None:")
                out.extend(inner or [f"{indent}    pass"])
                return v
            out.append(f"{indent}if {v} is not None:")
            out.extend(inner)
            out.append(f"{indent}    {v} = {expr}")
            return v
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            item = self.function(args[0])
            out.append(f"{indent}if type({v}) is not list: raise _Fallback")
            return f"tuple([{item}(_x) for _x in {v}])"
        if attrs.has(kind):
            return f"{self.function(kind)}({v})"
        if origin in (dict, Mapping) and args == (str, Any):
            # A free-form JSON object (ModelSettings.extra_body, ReasoningBlock.data): JSON keys are strings.
            out.append(f"{indent}if type({v}) is not dict: raise _Fallback")
            return v
        raise TypeError(f"no fast converter for {kind!r}")

    def function(self, kind: Any) -> str:
        """The name of a function converting one value of ``kind``."""
        if kind in self.cache:
            return self.cache[kind]
        fn = self.name("conv")
        self.cache[kind] = fn
        body: list[str] = [f"def {fn}(d):"]
        if attrs.has(kind):
            attrs.resolve_types(kind)
            fields = [f for f in attrs.fields(kind) if f.init]
            names = self.name("names")
            required = self.name("required")
            cls = self.name("cls")
            # "type" is the tag of the enclosing record; it is checked before this runs.
            self.namespace[names] = frozenset(f.name for f in fields) | (
                {"type"} if isinstance(getattr(kind, "type", None), str) else set()
            )
            self.namespace[required] = frozenset(f.name for f in fields if f.default is attrs.NOTHING)
            self.namespace[cls] = kind
            body.append("    if type(d) is not dict: raise _Fallback")
            body.append("    keys = d.keys()")
            body.append(f"    if not (keys <= {names} and {required} <= keys): raise _Fallback")
            args: list[str] = []
            for index, f in enumerate(fields):
                v = f"v{index}"
                if f.default is attrs.NOTHING:
                    body.append(f"    {v} = d[{f.name!r}]")
                else:
                    default = self.name("default")
                    self.namespace[default] = f.default
                    body.append(f"    {v} = d.get({f.name!r}, {default})")
                expr = self.check(f.type, v, "    ", body)
                args.append(f"{f.name}={expr}")
            body.append(f"    return {cls}({', '.join(args)})")
        else:
            expr = self.check(kind, "d", "    ", body)
            body.append(f"    return {expr}")
        self.lines.extend(body)
        self.lines.append("")
        return fn

    def compile(self, kinds: tuple[type[Any], ...]) -> dict[type[Any], Any]:
        names = {kind: self.function(kind) for kind in kinds}
        exec(compile("\n".join(self.lines), "<trio_harness event decoders>", "exec"), self.namespace)
        return {kind: self.namespace[name] for kind, name in names.items()}


_fast_by_class = _Gen().compile(EVENT_TYPES)
_fast: dict[str, Any] = {cls.type: fn for cls, fn in _fast_by_class.items()}


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


def _encode_general(event: Event) -> str:
    """The general encoder: cattrs unstructures, :mod:`json` writes the line."""
    data = _unstructure[type(event)](event)
    return _dumps({"type": event.type, **data})


# ---------------------------------------------------------------- fast encoding
#
# Every append encodes its event, so each event class gets a generated
# straight-line encoder: the JSON text of the keys is precomputed, strings go
# through json's own C string encoder, numbers through the ``repr`` json uses,
# and the line is built by one f-string.  The output is the general encoder's,
# byte for byte (tests/test_codec.py compares them): a value of an unexpected
# type (a bool where an int belongs, a list for a tuple, a subclass of a
# record) or a non-finite float makes the fast encoder decline, and the
# general encoder writes the line (or raises) as it always did.

_FACTORY: type[Any] = type(attrs.Factory(list))  # attrs.Factory, as a class mypy accepts
_encode_string: Any = json.encoder.encode_basestring  # the C encoder json.dumps(ensure_ascii=False) uses


class _EncoderGen:
    """Generates one encoder function per record type (see above)."""

    def __init__(self) -> None:
        self.namespace: dict[str, Any] = {
            "_Fallback": _Fallback,
            "_isfinite": math.isfinite,
            "_str": _encode_string,
            "_bools": ("false", "true"),
            "_general": _encode_general,
            "_utf8_or_general": _utf8_or_general,
            "_json_object": _json_object,
        }
        self.lines: list[str] = []
        self.counter = 0
        self.cache: dict[Any, str] = {}
        # Record types the fast encoder declines (see function).
        self.unsupported: set[Any] = set()

    def name(self, prefix: str) -> str:
        self.counter += 1
        return f"_{prefix}{self.counter}"

    def value(self, kind: Any, v: str, bad: list[str], out: list[str], indent: str) -> str:
        """The expression of the JSON text of variable ``v`` of type ``kind``.

        Conditions under which the fast encoder declines go to ``bad``
        (checked together, before ``out``); statements the expression needs go
        to ``out``.  The expression is a str, or a number, which the f-string
        writing the line formats as json does (``repr``).  A str is not
        checked: json's string encoder raises TypeError for anything else.
        """
        if kind is int:
            bad.append(f"type({v}) is not int")
            return v
        if kind is float:
            bad.append(f"((type({v}) is not float or not _isfinite({v})) and type({v}) is not int)")
            return v
        if kind is bool:
            bad.append(f"({v} is not True and {v} is not False)")
            return f"_bools[{v}]"
        origin, args = get_origin(kind), get_args(kind)
        if kind is str or (origin is Literal and all(type(a) is str for a in args)):
            return f"_str({v})"
        if origin in (Union, types.UnionType):
            options = [a for a in args if a is not type(None)]
            if len(options) != 1 or len(args) != 2:
                raise TypeError(f"no fast encoder for {kind!r}")
            inner_bad: list[str] = []
            inner: list[str] = []
            expr = self.value(options[0], v, inner_bad, inner, indent + "    ")
            out.append(f"{indent}if {v} is None:")
            out.append(f'{indent}    {v} = "null"')
            if inner_bad or inner or expr != v:
                out.append(f"{indent}else:")
                if inner_bad:
                    out.append(f"{indent}    if {' or '.join(inner_bad)}: raise _Fallback")
                out.extend(inner)
                if expr != v:
                    out.append(f"{indent}    {v} = {expr}")
            return v
        if origin is tuple and len(args) == 2 and args[1] is Ellipsis:
            item = "_str" if args[0] is str else self.function(args[0])
            bad.append(f"type({v}) is not tuple")
            out.append(f'{indent}{v} = "[" + ",".join(map({item}, {v})) + "]" if {v} else "[]"')
            return v
        if attrs.has(kind):
            return f"{self.function(kind)}({v})"
        if origin in (dict, Mapping) and args == (str, Any):
            # A free-form JSON object (ModelSettings.extra_body, ReasoningBlock.data): written by json, as the
            # general encoder does.
            bad.append(f"type({v}) is not dict")
            return f"_json_object({v})"
        raise TypeError(f"no fast encoder for {kind!r}")

    def function(self, kind: Any) -> str:
        """The name of a function returning the JSON text of one record of type ``kind``.

        Raises:
            TypeError: ``kind`` (or a record inside it) has a field the fast
                encoder does not write the general encoder's way; that event
                class is then always written by the general encoder.
        """
        if kind in self.cache:
            return self.cache[kind]
        if kind in self.unsupported or not attrs.has(kind):
            raise TypeError(f"no fast encoder for {kind!r}")
        fn = self.name("enc")
        self.cache[kind] = fn
        try:
            return self._generate(kind, fn)
        except TypeError:
            del self.cache[kind]  # nothing of it was emitted: no encoder may call it
            self.unsupported.add(kind)
            raise

    def _default(self, field: attrs.Attribute[Any]) -> str:
        """The expression of the default a field marked ``omit_if_default`` is compared with (as cattrs does)."""
        default: Any = field.default
        converter: Any = field.converter
        if isinstance(converter, attrs.Converter):
            raise TypeError(f"no fast encoder for field {field.name!r}: its converter takes the instance")
        if isinstance(default, _FACTORY):
            factory = self.name("factory")
            self.namespace[factory] = default.factory
            expr = f"{factory}(d)" if default.takes_self else f"{factory}()"
            if converter is not None:
                convert = self.name("convert")
                self.namespace[convert] = converter
                expr = f"{convert}({expr})"
            return expr
        name = self.name("default")
        self.namespace[name] = default if converter is None else converter(default)
        return name

    def _generate(self, kind: Any, fn: str) -> str:
        attrs.resolve_types(kind)
        fields = attrs.fields(kind)
        if not all(f.init for f in fields):
            raise TypeError(f"no fast encoder for {kind!r}: it has fields outside __init__")
        cls = self.name("cls")
        self.namespace[cls] = kind
        # The general encoder writes the fields in order, except that those
        # left out at their default (docs/sessions.rst) follow all the others.
        omittable = [bool(f.metadata.get("omit_if_default")) and f.default is not attrs.NOTHING for f in fields]
        ordered = [f for f, o in zip(fields, omittable) if not o] + [f for f, o in zip(fields, omittable) if o]
        # The exact type: a subclass may carry more, or differently encoded, fields.
        bad: list[str] = []
        loads: list[str] = []
        out: list[str] = []
        parts: list[str] = []
        tag = getattr(kind, "type", None)
        for index, f in enumerate(ordered):
            v = f"v{index}"
            key = _encode_string(f.name)
            if f.metadata.get("omit_if_default") and f.default is not attrs.NOTHING:
                # Checked and written only when it is not its default, as the general encoder does.
                loads.append(f"{v} = d.{f.name}")
                inner_bad: list[str] = []
                inner: list[str] = []
                expr = self.value(f.type, v, inner_bad, inner, "    ")
                part = f"p{index}"
                out.append(f"if {v} != {self._default(f)}:")
                if inner_bad:
                    out.append(f"    if {' or '.join(inner_bad)}: raise _Fallback")
                out.extend(inner)
                out.append(f"    {part} = f',{key}:{{{expr}}}'")
                out.append("else:")
                out.append(f'    {part} = ""')
                parts.append(f"{{{part}}}")
                continue
            seen = len(bad), len(out)
            expr = self.value(f.type, v, bad, out, "")
            used = re.compile(rf"\b{v}\b")
            if expr == v or any(map(used.search, bad[seen[0] :] + out[seen[1] :])):
                loads.append(f"{v} = d.{f.name}")
            else:  # used once, in the line itself
                expr = used.sub(f"d.{f.name}", expr)
            parts.append(f",{key}:".replace("{", "{{").replace("}", "}}") + f"{{{expr}}}")
        tagged = f'"type":{_encode_string(tag)}' if isinstance(tag, str) else ""
        head = "{{" + tagged.replace("{", "{{").replace("}", "}}")
        if isinstance(tag, str) or not ordered or omittable.count(False):
            # Every part starts with a comma; the first after "{" loses it.
            if not isinstance(tag, str) and ordered:
                parts[0] = parts[0][1:]
            template, wrap = head + "".join(parts) + "}}", None
        else:
            # Every field may be left out: the comma of the first one present goes.
            template, wrap = "".join(parts), '"{" + line[1:] + "}"'
        if "'" in template or "\\" in template:
            raise TypeError(f"no fast encoder for {kind!r}: a key or tag needs quoting")
        body = [*loads, f"if {' or '.join(bad)}: raise _Fallback"] if bad else loads
        body.extend(out)
        self.lines.append(f"def {fn}(d):")
        if isinstance(tag, str):
            # An event: the encoder is complete (the general encoder takes over
            # when it declines), and only ever called for its exact class.
            self.lines.append("    try:")
            self.lines.extend(f"        {line}" for line in body)
            self.lines.append(f"        line = f'{template}'")
            self.lines.append("    except (_Fallback, TypeError, ValueError):  # json refuses what it cannot write")
            self.lines.append("        return _general(d)")
            self.lines.append("    return line if line.isascii() else _utf8_or_general(line, d)")
        else:
            # A record inside an event: the exact type (a subclass may carry more fields).
            self.lines.append(f"    if type(d) is not {cls}: raise _Fallback")
            self.lines.extend(f"    {line}" for line in body)
            if wrap is None:
                self.lines.append(f"    return f'{template}'")
            else:
                self.lines.append(f"    line = f'{template}'")
                self.lines.append(f"    return {wrap}")
        self.lines.append("")
        return fn

    def compile(self, kinds: tuple[type[Any], ...]) -> dict[type[Any], Any]:
        fast = []
        for kind in kinds:
            try:
                self.function(kind)
            except TypeError:
                continue  # written by the general encoder
            fast.append(kind)
        exec(compile("\n".join(self.lines), "<trio_harness event encoders>", "exec"), self.namespace)
        return {kind: self.namespace[self.cache[kind]] for kind in fast}


def is_plain_json(value: object) -> bool:
    """Whether ``value`` holds only what json writes as the general encoder does (exact JSON types)."""
    if value is None or type(value) is str or type(value) is int or type(value) is bool:
        return True
    if type(value) is float:
        return math.isfinite(value)
    if type(value) is list:
        return all(map(is_plain_json, value))
    if type(value) is dict:
        return all(type(k) is str and is_plain_json(v) for k, v in value.items())
    return False


def _json_object(value: dict[str, Any]) -> str:
    """The JSON text of a free-form JSON object; declines anything but plain JSON values."""
    if not is_plain_json(value):
        raise _Fallback
    text: str = _dumps_utf8(value)
    return text


def _utf8_or_general(line: str, event: Event) -> str:
    """``line``, unless it cannot be written as UTF-8 (a lone surrogate): then the escaped line."""
    try:
        line.encode("utf-8")
    except UnicodeEncodeError:
        return _encode_general(event)
    return line


class _EncoderTable(dict[type[Any], Any]):
    def __missing__(self, kind: type[Any]) -> Any:
        return _encode_general  # not an event class: the general encoder explains


_encoders = _EncoderTable(_EncoderGen().compile(EVENT_TYPES))

encoder_of: Callable[[type[Event]], Callable[[Event], str]] = _encoders.__getitem__
"""The encoder of events of a class (:func:`encode_event` without its call, for the log writer)."""


def encode_event(event: Event) -> str:
    """Encode an event as one JSON line (without the newline)."""
    line: str = _encoders[type(event)](event)
    return line


def decode_event_dict(data: Any) -> AnyEvent:
    """Decode an already-parsed JSON object into an event."""
    if not isinstance(data, dict):
        raise EventDecodeError(f"an event must be a JSON object, got {type(data).__name__}")
    tag = data.get("type")
    cls = _TAGS.get(tag) if isinstance(tag, str) else None
    if cls is None:
        raise EventDecodeError(f"unknown event type {tag!r}; known types: {', '.join(sorted(_TAGS))}")
    try:
        fast_event: AnyEvent = _fast[cls.type](data)
        return fast_event
    except _Fallback:
        pass
    fields = dict(data)
    del fields["type"]
    try:
        event: AnyEvent = _structure[cls.type](fields, cls)
    except Exception as exc:
        raise EventDecodeError(f"invalid {tag!r} event: {_decode_reason(exc)}") from exc
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


# The C scanner behind json.loads, without its per-call wrapper.
_scan_once: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009


def decode_event_line(raw: bytes) -> AnyEvent:
    """Decode one line of a session log, as :func:`decode_event` does, faster.

    Log loading calls this per line: it skips :func:`json.loads`'s per-call
    encoding detection and wrapper, and falls back to :func:`decode_event`
    for anything unusual so errors read the same.
    """
    try:
        text = raw.decode("utf-8")
        data, end = _scan_once(text, 0)
    except (UnicodeDecodeError, StopIteration, ValueError):
        return decode_event(raw)
    if end != len(text):
        return decode_event(raw)
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
        raise EventDecodeError(f"invalid session header: {_decode_reason(exc)}") from exc


def _decode_reason(exc: BaseException) -> str:
    if isinstance(exc, cattrs.ForbiddenExtraKeysError):
        return f"unexpected keys {sorted(exc.extra_fields)}"
    if isinstance(exc, KeyError):
        return f"missing key {exc}"
    return str(exc) or type(exc).__name__


def encode_inbox_message(message: InboxMessage) -> str:
    """One inbox message as a JSON object, as ``inbox/spliced`` holds it (defaults left out)."""
    return _dumps(_converter.unstructure(message, InboxMessage))


def decode_inbox_message(text: str | bytes) -> InboxMessage:
    """The inbox message :func:`encode_inbox_message` wrote (fields added later read as their defaults).

    Raises:
        EventDecodeError: not an inbox message (the error names what is wrong).
    """
    try:
        data = json.loads(text)
        if not isinstance(data, dict):
            raise TypeError(f"expected a JSON object, got {type(data).__name__}")
        message: InboxMessage = _converter.structure(data, InboxMessage)
    except Exception as exc:
        raise EventDecodeError(f"invalid inbox message: {_decode_reason(exc)}") from exc
    return message
