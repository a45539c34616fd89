"""Value records shared by the session log and the model protocol.

A session log stores what the model produced (its tool calls, its token usage)
and how things failed; the model protocol reports the same facts while a call
streams.  Both layers use these records, so they live here, in a leaf module
that imports nothing from the package: :mod:`trio_harness.session` and
:mod:`trio_harness.model` both depend on it, and neither on the other for
them (docs/architecture.rst, "Layers").

Users import them from their public homes: ``trio_harness.model.Failure``,
``trio_harness.model.ToolCall``, ``trio_harness.model.Usage``,
``trio_harness.model.ModelSettings``, ``trio_harness.model.UsageTotals``.

Fields added after the first log format carry ``metadata={"omit_if_default":
True}``: the codec leaves them out of a line while they hold their default, and
a line without them reads back with their defaults.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable, Mapping
from types import MemberDescriptorType
from typing import Any, Final

import attrs

OMIT_IF_DEFAULT: Final[Mapping[str, Any]] = {"omit_if_default": True}
"""Field metadata: the codec writes the field only when it differs from its default."""


@attrs.frozen
class Failure:
    """A failure reported as a value.

    Attributes:
        code: a short stable code, e.g. ``"http-429"``, ``"connect"``, ``"timeout"``,
            ``"malformed-stream"``, ``"no-finish"``, ``"scripted"``.
        message: a human-readable explanation naming what went wrong.
        retryable: whether retrying the same request may succeed.
        retry_after: seconds the server asked us to wait, when it said so.
    """

    code: str
    message: str
    retryable: bool = False
    retry_after: float | None = None


@attrs.frozen
class ToolCall:
    """One complete tool call requested by the model.

    Attributes:
        id: the provider's call id, echoed back in the tool result.
        name: the tool name.
        arguments: the raw JSON text of the arguments, exactly as the model wrote it.
    """

    id: str
    name: str
    arguments: str


@attrs.frozen
class ReasoningBlock:
    """An opaque piece of an assistant message that its provider needs back verbatim.

    Anthropic's ``thinking`` / ``redacted_thinking`` blocks (with their
    ``signature``) and OpenAI Responses' reasoning items (with their encrypted
    content) must be sent back exactly as received in the later requests of a
    turn.  A provider reports each one, once complete, as a chunk; the driver
    logs it with the assistant message and puts it back in
    ``AssistantMessage.reasoning_blocks`` of every later request.  A
    provider sends back only the blocks whose ``provider`` is its own family
    and ignores the rest (a session may switch models).

    Attributes:
        provider: the provider family that produced it, e.g. ``"anthropic"`` or
            ``"openai-responses"``.
        data: the JSON object as the provider needs it back (plain JSON values
            only; the provider may keep its own position keys in it).
    """

    provider: str
    data: Mapping[str, Any] = attrs.field(hash=False)


IMAGE_MEDIA_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
"""The image formats every image-capable provider takes."""


def _media_type(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if value not in IMAGE_MEDIA_TYPES:
        raise ValueError(f"Image.media_type must be one of {sorted(IMAGE_MEDIA_TYPES)}, got {value!r}")


def _image_bytes(instance: object, attribute: attrs.Attribute[bytes], value: object) -> None:
    if not isinstance(value, bytes) or not value:
        raise TypeError(f"Image.data must be non-empty bytes, got {type(value).__name__}")


@attrs.frozen
class Image:
    """An image in a user message.

    Attributes:
        data: the encoded image file's bytes.
        media_type: one of ``image/png``, ``image/jpeg``, ``image/gif``, ``image/webp``, e.g. ``"image/png"``.
    """

    data: bytes = attrs.field(validator=_image_bytes, repr=lambda data: f"<{len(data)} bytes>")
    media_type: str = attrs.field(validator=_media_type)


@attrs.frozen
class Usage:
    """Token usage of one model call.

    Attributes:
        input_tokens: prompt tokens (the whole request, cache hits included).
        output_tokens: generated tokens (reasoning included).
        cache_hit_tokens: prompt tokens served from the provider's cache.
        reasoning_tokens: the part of ``output_tokens`` spent on reasoning,
            when the provider reports it.
        cache_write_tokens: prompt tokens written to the provider's cache by
            this call (part of ``input_tokens``; priced differently where the
            provider charges for cache writes, e.g. Anthropic).
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
    reasoning_tokens: int = attrs.field(default=0, metadata=OMIT_IF_DEFAULT)
    cache_write_tokens: int = attrs.field(default=0, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class UsageTotals:
    """Usage summed over several model calls: a turn's, a compaction's, a session's.

    Attributes:
        input_tokens: prompt tokens of every call.
        output_tokens: generated tokens of every call.
        cache_hit_tokens: prompt tokens served from a cache.
        reasoning_tokens: generated tokens spent on reasoning.
        requests: model requests made (a retried request counts once).
        cache_write_tokens: prompt tokens written to a cache.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_hit_tokens: int = 0
    reasoning_tokens: int = 0
    requests: int = 0
    cache_write_tokens: int = attrs.field(default=0, metadata=OMIT_IF_DEFAULT)

    @property
    def total_tokens(self) -> int:
        """``input_tokens + output_tokens``: what token budgets count."""
        return self.input_tokens + self.output_tokens

    def add(self, usage: Usage | None, *, requests: int = 0) -> UsageTotals:
        """These totals plus one call's ``usage`` (None adds no tokens) and ``requests``."""
        if usage is None:
            if not requests:
                return self
            return attrs.evolve(self, requests=self.requests + requests)
        return _plain_totals(
            input_tokens=self.input_tokens + usage.input_tokens,
            output_tokens=self.output_tokens + usage.output_tokens,
            cache_hit_tokens=self.cache_hit_tokens + usage.cache_hit_tokens,
            reasoning_tokens=self.reasoning_tokens + usage.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens + usage.cache_write_tokens,
            requests=self.requests + requests,
        )

    def __add__(self, other: UsageTotals) -> UsageTotals:
        if not isinstance(other, UsageTotals):
            return NotImplemented
        return _plain_totals(
            input_tokens=self.input_tokens + other.input_tokens,
            output_tokens=self.output_tokens + other.output_tokens,
            cache_hit_tokens=self.cache_hit_tokens + other.cache_hit_tokens,
            reasoning_tokens=self.reasoning_tokens + other.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens + other.cache_write_tokens,
            requests=self.requests + other.requests,
        )

    def __sub__(self, other: UsageTotals) -> UsageTotals:
        if not isinstance(other, UsageTotals):
            return NotImplemented
        return _plain_totals(
            input_tokens=self.input_tokens - other.input_tokens,
            output_tokens=self.output_tokens - other.output_tokens,
            cache_hit_tokens=self.cache_hit_tokens - other.cache_hit_tokens,
            reasoning_tokens=self.reasoning_tokens - other.reasoning_tokens,
            cache_write_tokens=self.cache_write_tokens - other.cache_write_tokens,
            requests=self.requests - other.requests,
        )


# ---------------------------------------------------------------- model settings


def _number_in(low: float, high: float) -> Any:
    def check(instance: object, attribute: attrs.Attribute[float | None], value: object) -> None:
        if value is None:
            return
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise TypeError(f"ModelSettings.{attribute.name} must be a number, got {type(value).__name__} {value!r}")
        if not (math.isfinite(value) and low <= value <= high):
            raise ValueError(f"ModelSettings.{attribute.name} must be within [{low:g}, {high:g}], got {value!r}")

    return check


def _to_float(value: object) -> object:
    # 0 and 0.0 are the same setting; one type keeps a record equal to its decoded copy.
    if type(value) is int:
        return float(value)
    return value


def _positive_int(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is None:
        return
    if type(value) is not int:
        raise TypeError(f"ModelSettings.{attribute.name} must be an int, got {type(value).__name__} {value!r}")
    if value <= 0:
        raise ValueError(f"ModelSettings.{attribute.name} must be positive, got {value!r}")


def _int(instance: object, attribute: attrs.Attribute[int | None], value: object) -> None:
    if value is not None and type(value) is not int:
        raise TypeError(f"ModelSettings.{attribute.name} must be an int, got {type(value).__name__} {value!r}")


def _stop(value: object) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        value = (value,)
    if not isinstance(value, Iterable):
        raise TypeError(f"ModelSettings.stop must be a string or a list of strings, got {type(value).__name__}")
    items = tuple(value)
    for item in items:
        if not isinstance(item, str) or not item:
            raise TypeError(f"ModelSettings.stop must hold non-empty strings, got {item!r}")
    return items


def _text(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and (not isinstance(value, str) or not value.strip()):
        raise TypeError(f"ModelSettings.{attribute.name} must be a non-empty string, got {value!r}")


def _flag(instance: object, attribute: attrs.Attribute[bool | None], value: object) -> None:
    if value is not None and type(value) is not bool:
        raise TypeError(f"ModelSettings.{attribute.name} must be a bool, got {type(value).__name__} {value!r}")


def _json_object(value: object) -> dict[str, Any] | None:
    """A JSON object's plain copy (what the log stores and reads back), or a TypeError naming the problem."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise TypeError(f"ModelSettings.extra_body must be a mapping, got {type(value).__name__}")
    for key in value:
        if not isinstance(key, str):
            raise TypeError(f"ModelSettings.extra_body keys must be strings, got {key!r}")
    try:
        copied: dict[str, Any] = json.loads(json.dumps(dict(value), allow_nan=False))
    except (TypeError, ValueError) as exc:
        raise TypeError(f"ModelSettings.extra_body must be JSON-serialisable: {exc}") from None
    return copied


@attrs.frozen
class ModelSettings:
    """How the model should answer: sampling, limits and provider extras.

    Every field is optional; None means "not set here".  Settings are given
    per harness (``open_harness(model_settings=...)``), per agent
    (``AgentOptions.model_settings``) and per turn
    (``agent.followup(text, settings=...)``), and merged field by field with
    :meth:`merge`: a turn's value wins over an agent's, an agent's over the
    harness's, the harness's over the model spec's query parameters.  The
    merged settings of every request are recorded in its ``request/header``.

    Attributes:
        temperature: sampling temperature, within [0, 2].
        top_p: nucleus sampling mass, within [0, 1].
        max_tokens: a positive cap on generated tokens per request.
        seed: a seed for providers that sample deterministically with one.
        stop: stop sequences (a string is one sequence).
        reasoning_effort: for reasoning models (``"low"``, ``"medium"``,
            ``"high"``; the provider defines the values).
        parallel_tool_calls: whether the model may call several tools at once.
        extra_body: extra top-level JSON fields of the request body; merged
            key by key, and applied last (they win over the fields above).

    Raises:
        TypeError: a field has the wrong type (``extra_body`` not JSON, ...).
        ValueError: a number is out of its range.
    """

    temperature: float | None = attrs.field(
        default=None, metadata=OMIT_IF_DEFAULT, converter=_to_float, validator=_number_in(0.0, 2.0)
    )
    top_p: float | None = attrs.field(
        default=None, metadata=OMIT_IF_DEFAULT, converter=_to_float, validator=_number_in(0.0, 1.0)
    )
    max_tokens: int | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT, validator=_positive_int)
    seed: int | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT, validator=_int)
    stop: tuple[str, ...] | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT, converter=_stop)
    reasoning_effort: str | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT, validator=_text)
    parallel_tool_calls: bool | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT, validator=_flag)
    extra_body: dict[str, Any] | None = attrs.field(
        default=None, metadata=OMIT_IF_DEFAULT, converter=_json_object, hash=False
    )

    def merge(self, override: ModelSettings | None) -> ModelSettings:
        """These settings with every field ``override`` sets replacing ours (``extra_body`` key by key)."""
        if override is None or override is self:
            return self
        changes: dict[str, Any] = {}
        for field in attrs.fields(ModelSettings):
            value = getattr(override, field.name)
            if value is None:
                continue
            if field.name == "extra_body" and self.extra_body:
                value = {**self.extra_body, **value}
            changes[field.name] = value
        return attrs.evolve(self, **changes) if changes else self

    @property
    def empty(self) -> bool:
        """Whether no field is set."""
        return self == _EMPTY


_EMPTY: Final = ModelSettings()


# attrs.Factory is typed as a function; its instances' class is what a default is checked against.
_FACTORY: Final[type[Any]] = type(attrs.Factory(list))


def plain_constructor(cls: type[Any]) -> Any:
    """A faster stand-in for the attrs ``__init__`` of a frozen, slotted record, or None.

    attrs' ``__init__`` of a frozen class stores each field through
    ``object.__setattr__``; the stand-in stores it through the slot's own
    descriptor, which skips the attribute lookup by name.  It takes the same
    parameters in the same order with the same defaults and gives an object
    equal to the public constructor's, field by field.  Only classes whose
    ``__init__`` does nothing else qualify (no validators, converters,
    factories, aliases, keyword-only or ``init=False`` fields, no pre/post-init
    hooks, no hash cache, every slot a field): for any other class this
    returns None and callers use the class itself.  The session log uses it
    for events, whose fields the driver already builds from checked values.
    """
    if not attrs.has(cls) or "__slots__" not in cls.__dict__:
        return None
    if hasattr(cls, "__attrs_pre_init__") or hasattr(cls, "__attrs_post_init__"):
        return None
    fields = attrs.fields(cls)
    slots = {slot for klass in cls.__mro__ for slot in klass.__dict__.get("__slots__", ())} - {"__weakref__"}
    if slots != {field.name for field in fields}:
        return None  # e.g. a hash cache the attrs __init__ resets
    params: list[str] = []
    body: list[str] = []
    namespace: dict[str, Any] = {"_new": object.__new__, "_cls": cls}
    for index, field in enumerate(fields):
        if (
            field.validator is not None
            or field.converter is not None
            or not field.init
            or field.kw_only
            or field.alias != field.name
            or isinstance(field.default, _FACTORY)
        ):
            return None
        descriptor: Any = getattr(cls, field.name, None)
        if type(descriptor) is not MemberDescriptorType:
            return None
        namespace[f"_set{index}"] = descriptor.__set__
        if field.default is attrs.NOTHING:
            params.append(field.name)
        else:
            namespace[f"_default{index}"] = field.default
            params.append(f"{field.name}=_default{index}")
        body.append(f"    _set{index}(self, {field.name})")
    source = f"def __init__({', '.join(params)}):\n    self = _new(_cls)\n" + "\n".join(body) + "\n    return self\n"
    exec(compile(source, f"<plain constructor of {cls.__qualname__}>", "exec"), namespace)
    function = namespace["__init__"]
    # Argument errors read as the class's own: "ToolResult.__init__() missing ...".
    function.__qualname__ = f"{cls.__qualname__}.__init__"
    return function


# Usage arithmetic builds totals from ints it has just summed (docs/long-sessions.rst, "Usage and budgets").
_plain_totals: Callable[..., UsageTotals] = plain_constructor(UsageTotals) or UsageTotals
