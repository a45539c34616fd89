"""Tools from typed Python functions: :func:`tool`.

The signature is the contract.  pydantic derives the parameters' JSON schema
from the type hints and builds a validator for it once, when the tool is made;
each call then validates and converts the model's JSON arguments in one pass
(``validate_json``) and calls the function with the converted values.  The
model-facing schema is cleaned: no pydantic ``title`` noise, ``$ref`` inlined
where nothing is recursive, ``"additionalProperties": false`` at the top.

pydantic knows neither attrs classes nor (on Python 3.11) ``typing.TypedDict``:
both are rewritten, at any depth, into ``typing_extensions.TypedDict`` clones
before pydantic sees them; an attrs clone carries an after-validator that
builds the attrs instance (so its validators and converters run, and their
errors come back as argument errors).

pydantic is imported when the first function tool is made, not with the
package: code that only uses raw-schema tools does not pay its import time.
"""

from __future__ import annotations

import functools
import inspect
import json
import operator
import re
import sys
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, ParamSpec, TypeVar, overload

import attrs
import trio

from .._errors import ToolError
from .._util import describe
from ._docstrings import parse_docstring
from ._tools import _NAME, Tool, ToolContext, ToolOutput, parse_arguments

if TYPE_CHECKING:
    import pydantic_core

__all__ = ["FunctionTool", "OutputAdapter", "function_tool", "output_adapter", "tool"]

P = ParamSpec("P")
R = TypeVar("R")

_MAX_ERRORS = 5  # argument errors listed in one result, as for raw-schema tools
_MAX_INPUT = 60  # characters of an offending value quoted back to the model


@attrs.frozen(eq=False)
class FunctionTool(Tool, Generic[P, R]):
    """A :class:`Tool` made from a typed function by :func:`tool`.

    It is a tool like any other (register it with ``ToolSet.add``), and calling
    it calls the function, so the decorated name stays usable in plain code
    and tests.

    Attributes:
        function: the function the tool calls.
        thread: whether a plain function runs in a worker thread.
    """

    function: Callable[P, R] = attrs.field(kw_only=True)
    thread: bool = attrs.field(default=False, kw_only=True)
    # Validates the model's JSON text and converts it to the annotated types (pydantic-core's
    # validate_json of the arguments TypedDict, built once): returns a plain dict, raises ValidationError.
    _arguments: Callable[[str], dict[str, Any]] = attrs.field(kw_only=True, repr=False, alias="arguments")

    def __call__(self, *args: P.args, **kwargs: P.kwargs) -> R:
        """Call the function itself."""
        return self.function(*args, **kwargs)

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse, validate and convert raw JSON arguments to the annotated types.

        Unlike a raw-schema tool, the values are the converted ones (an
        ``Enum`` member, an attrs instance ...); parameters the model left out
        are absent, so the function's own defaults apply.

        Raises:
            ValueError: with a message the model can act on, worded as for a
                raw-schema tool.
        """
        try:
            result: dict[str, Any] = self._arguments(arguments)
            return result
        except Exception as exc:
            from pydantic_core import ValidationError

            if not isinstance(exc, ValidationError):  # a user's validator or converter failing in its own way
                raise ValueError(f"arguments for tool {self.name!r} could not be converted: {describe(exc)}") from None
            errors = exc
        parsed = parse_arguments(arguments)  # not JSON, or not an object: the usual wording
        if not arguments.strip():  # empty text means {}
            try:
                empty: dict[str, Any] = self._arguments(json.dumps(parsed))
                return empty
            except ValidationError as exc:
                errors = exc
        raise ValueError(f"arguments for tool {self.name!r} do not match its schema: {_describe_errors(errors)}")


@overload
def tool(
    fn: Callable[P, R],
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parallel_safe: bool = True,
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    thread: bool = False,
) -> FunctionTool[P, R]: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    parallel_safe: bool = True,
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    thread: bool = False,
) -> Callable[[Callable[P, R]], FunctionTool[P, R]]: ...


def tool(
    fn: Callable[P, R] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    parallel_safe: bool = True,
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    thread: bool = False,
) -> FunctionTool[P, R] | Callable[[Callable[P, R]], FunctionTool[P, R]]:
    """Make a :class:`Tool` from a typed function: ``@tool``, ``@tool(name=...)`` or ``tool(fn, name=...)``.

    ::

        @tool
        async def get_temperature(city: str, units: Literal["celsius", "fahrenheit"] = "celsius") -> str:
            \"\"\"The current temperature in a city.

            Args:
                city: a city name, e.g. "Paris".
                units: the unit of the answer.
            \"\"\"

        agent.tools.add(get_temperature, scope=agent.scope)

    The name is the function's, the description its docstring's text before
    the first section, and the parameters schema comes from the type hints
    (``str``, ``int``, ``float``, ``bool``, ``Literal``, ``Enum``, lists,
    dicts, ``Optional``, ``TypedDict``, attrs classes, dataclasses and
    pydantic models), the defaults and the docstring's per-parameter texts
    (Google, NumPy or Sphinx style).  A first parameter annotated
    :class:`ToolContext` receives the call's context and is not in the schema.

    The model's arguments are validated and converted to the annotated types
    before the call (pydantic, lax mode: ``"3"`` is accepted for an ``int``);
    a mismatch is an error result the model can read, and the function is not
    called.  The function may return a ``str`` (the result as is), a
    :class:`ToolOutput`, or any JSON-serialisable value (pydantic models,
    dataclasses and attrs instances included), which the model reads as JSON.

    Args:
        fn: the function (``async def`` or plain ``def``).
        name: the tool's name (default: the function's ``__name__``).
        description: what the model is told (default: from the docstring).
        parallel_safe: see ``Tool.parallel_safe``.
        requires_approval: see ``Tool.requires_approval``.
        thread: run a plain function in a worker thread
            (``trio.to_thread.run_sync``) instead of inline on the event loop.
            A cancelled turn waits for the function to return (a thread
            cannot be killed, and teardown leaves nothing running); the
            function stops early if it calls
            :func:`trio.from_thread.check_cancelled`, which raises
            :class:`trio.Cancelled` in the thread once the turn is cancelled.

    Returns:
        A :class:`FunctionTool` (or, called with arguments only, a decorator
        making one).

    Raises:
        ToolError: the function cannot be described to a model (a parameter
            without a type hint, ``*args``, a type pydantic has no schema for,
            ...); the message names the parameter and what to do.
    """
    localns = caller_namespace(sys._getframe(1))

    def decorate(function: Callable[P, R]) -> FunctionTool[P, R]:
        return function_tool(
            function,
            name=name,
            description=description,
            parallel_safe=parallel_safe,
            requires_approval=requires_approval,
            thread=thread,
            localns=localns,
        )

    return decorate if fn is None else decorate(fn)


def function_tool(
    fn: Callable[P, R],
    *,
    name: str | None = None,
    description: str | None = None,
    parallel_safe: bool = True,
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = False,
    thread: bool = False,
    localns: Mapping[str, Any] | None = None,
) -> FunctionTool[P, R]:
    """Build a :class:`FunctionTool` (what :func:`tool` calls).

    ``localns`` resolves annotations naming types local to the caller's
    function (a class defined next to the tool inside a function).
    """
    import pydantic

    if isinstance(fn, FunctionTool):  # re-made (another name, other options): from its function
        fn = fn.function
    if not callable(fn) or inspect.isclass(fn):
        raise TypeError(f"a function tool needs a function, got {fn!r}")
    tool_name = name if name is not None else getattr(fn, "__name__", None)
    if not isinstance(tool_name, str) or not _NAME.match(tool_name):
        raise ToolError(f"cannot name a tool after {fn!r}: {tool_name!r} does not match {_NAME.pattern}; pass name=...")
    target = _unwrap(fn)
    if inspect.isgeneratorfunction(target) or inspect.isasyncgenfunction(target):
        raise ToolError(f"tool {tool_name!r}: a generator cannot be a tool; return the whole result instead")
    is_async = inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(target)
    if thread and is_async:
        raise ToolError(f"tool {tool_name!r}: thread=True is for plain functions; {tool_name} is async")
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError) as exc:
        raise ToolError(f"tool {tool_name!r}: cannot read the signature of {fn!r} ({exc})") from None
    try:
        hints = typing.get_type_hints(target, localns=dict(localns) if localns else None, include_extras=True)
    except Exception as exc:
        raise ToolError(
            f"tool {tool_name!r}: cannot resolve the type hints of {fn!r} ({describe(exc)}); import the types "
            "its annotations name at module level (not only under TYPE_CHECKING)"
        ) from None

    params = list(signature.parameters.values())
    takes_context = bool(params) and _is_context(hints.get(params[0].name))
    if takes_context:
        if params[0].kind not in (params[0].POSITIONAL_ONLY, params[0].POSITIONAL_OR_KEYWORD):
            raise ToolError(f"tool {tool_name!r}: the ToolContext parameter must be positional (first)")
        params = params[1:]

    docstring = getattr(target, "__doc__", None)
    if docstring is None and not inspect.isroutine(target):
        docstring = type(fn).__doc__
    doc = parse_docstring(docstring)
    adapter = _TypeRewriter(tool_name, localns)
    fields: dict[str, Any] = {}
    for param in params:
        where = f"tool {tool_name!r}: parameter {param.name!r}"
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            star = "*" if param.kind is param.VAR_POSITIONAL else "**"
            raise ToolError(
                f"tool {tool_name!r}: {star}{param.name} cannot be described to a model; name each parameter"
            )
        if param.kind is param.POSITIONAL_ONLY:
            raise ToolError(f"{where} is positional-only; the model passes arguments by name")
        if param.name not in hints:
            raise ToolError(f"{where} has no type annotation; annotate it (e.g. `{param.name}: str`)")
        hint = hints[param.name]
        if _is_context(hint):
            raise ToolError(f"{where}: only the first parameter may take the ToolContext")
        default = param.default if param.default is not param.empty else attrs.NOTHING
        fields[param.name] = adapter.field(hint, doc.params.get(param.name), default)

    arguments_type = _make_typed_dict(f"{tool_name}_arguments", fields, forbid_extra=True)
    try:
        type_adapter = pydantic.TypeAdapter(arguments_type)
        raw_schema = type_adapter.json_schema()
    except pydantic.PydanticUserError as exc:
        raise ToolError(_explain_schema_error(tool_name, fields, exc)) from None

    render = _renderer(tool_name)
    handler = _handler(fn, is_async=is_async, thread=thread, takes_context=takes_context, render=render)
    return FunctionTool(
        name=tool_name,
        description=doc.description if description is None else description,
        parameters=clean_schema(raw_schema),
        handler=handler,
        parallel_safe=parallel_safe,
        requires_approval=requires_approval,
        function=fn,
        thread=thread,
        arguments=type_adapter.validator.validate_json,
    )


def caller_namespace(frame: types.FrameType) -> Mapping[str, Any] | None:
    """The locals of the frame that made a tool, when it is a function's (its types may be local)."""
    return None if frame.f_locals is frame.f_globals else frame.f_locals


# ---------------------------------------------------------------- structured output

_OUTPUT_NAME = re.compile(r"[^A-Za-z0-9_-]+")


@attrs.frozen
class OutputAdapter:
    """The JSON schema of an output type and a validator of the model's answer (``agent.run(output=...)``).

    Attributes:
        name: a short name of the type, usable as a schema name.
        schema: the answer's JSON schema; always an object (a type that is
            not one is wrapped as ``{"result": ...}``).
        wrapped: whether the answer is ``{"result": value}``.
    """

    name: str
    schema: dict[str, Any]
    wrapped: bool
    _validate: Callable[[str], Any] = attrs.field(alias="validate", repr=False)

    def validate(self, text: str) -> Any:
        """The answer converted to the output type.

        Accepts the JSON alone or inside one Markdown code fence.

        Raises:
            ValueError: the answer is not JSON or does not match; the message
                lists the mismatches as argument errors do, for the model.
        """
        from pydantic_core import ValidationError

        body = _unfence(text)
        try:
            value = self._validate(body)
        except ValidationError as exc:
            raise ValueError(_describe_errors(exc)) from None
        except Exception as exc:  # a user's validator or converter
            raise ValueError(describe(exc)) from None
        return value["result"] if self.wrapped else value


def _unfence(text: str) -> str:
    stripped = text.strip()
    if stripped.startswith("```") and stripped.endswith("```") and stripped.count("```") == 2:
        inner = stripped[3:-3]
        first, newline, rest = inner.partition("\n")
        return rest if newline and (not first.strip() or first.strip().isalpha()) else inner
    return stripped


def output_adapter(kind: Any, *, localns: Mapping[str, Any] | None = None) -> OutputAdapter:
    """Build the schema and validator of an output type, with the typed tools' machinery.

    Any type a typed tool's parameter may have works: attrs classes,
    ``TypedDict`` (also ``typing.TypedDict`` on 3.11), dataclasses, pydantic
    models, ``Literal``, lists, unions ...

    Raises:
        ToolError: pydantic cannot validate or describe ``kind``.
    """
    import pydantic

    name = _OUTPUT_NAME.sub("_", getattr(kind, "__name__", None) or "output")[:64] or "output"
    rewriter = _TypeRewriter(name, localns)
    try:
        hint = rewriter.rewrite(kind)
    except ToolError as exc:  # worded for a tool ("tool 'X': ..."): say it is the output type
        raise ToolError(f"output type {kind!r}: {str(exc).partition(': ')[2]}") from None
    try:
        adapter = pydantic.TypeAdapter(hint)
        schema = adapter.json_schema()
    except pydantic.PydanticUserError as exc:
        raise ToolError(
            f"output type {kind!r} cannot be validated or described ({str(exc).splitlines()[0]}); use JSON-like "
            "types (attrs, dataclasses, TypedDict, pydantic models, lists, Literal ...)"
        ) from None
    top = schema
    ref = top.get("$ref")
    if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
        top = schema.get("$defs", {}).get(ref[len(_REF_PREFIX) :], {})
    if top.get("type") == "object" and "properties" in top:
        return OutputAdapter(
            name=name, schema=clean_schema(schema), wrapped=False, validate=adapter.validator.validate_json
        )
    holder = _make_typed_dict(f"{name}_result", {"result": hint}, forbid_extra=True)
    wrapper = pydantic.TypeAdapter(holder)
    return OutputAdapter(
        name=name,
        schema=clean_schema(wrapper.json_schema()),
        wrapped=True,
        validate=wrapper.validator.validate_json,
    )


# ---------------------------------------------------------------- calling


def _handler(
    fn: Callable[..., Any],
    *,
    is_async: bool,
    thread: bool,
    takes_context: bool,
    render: Callable[[Any], str | ToolOutput],
) -> Callable[[ToolContext, dict[str, Any]], Awaitable[str | ToolOutput]]:
    """The ``(ctx, args)`` handler, specialised once so a call does no dispatching."""
    if is_async:
        if takes_context:

            async def async_with_context(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
                return render(await fn(ctx, **args))

            return async_with_context

        async def async_plain(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
            return render(await fn(**args))

        return async_plain

    if thread:

        async def in_thread(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
            call = functools.partial(fn, ctx, **args) if takes_context else functools.partial(fn, **args)
            result = await trio.to_thread.run_sync(call)
            if inspect.iscoroutine(result):  # a wrapper that hides an async function
                result = await result
            return render(result)

        return in_thread

    if takes_context:

        async def inline_with_context(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
            result = fn(ctx, **args)
            if inspect.iscoroutine(result):
                result = await result
            return render(result)

        return inline_with_context

    async def inline_plain(ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        result = fn(**args)
        if inspect.iscoroutine(result):
            result = await result
        return render(result)

    return inline_plain


def _renderer(tool_name: str) -> Callable[[Any], str | ToolOutput]:
    from pydantic_core import to_json

    def render(value: Any) -> str | ToolOutput:
        if isinstance(value, (str, ToolOutput)):
            return value
        try:
            return to_json(value, fallback=_json_fallback).decode()
        except ValueError as exc:  # PydanticSerializationError
            raise ToolError(
                f"tool {tool_name!r} returned a {type(value).__name__} that cannot be serialised as JSON ({exc}); "
                "return a str, a ToolOutput or a JSON-serialisable value"
            ) from None

    return render


def _json_fallback(value: Any) -> Any:
    """Serialise what pydantic does not know: attrs instances (by init name, as their schema)."""
    if attrs.has(type(value)):
        return {field.alias: getattr(value, field.name) for field in attrs.fields(type(value))}
    raise TypeError(f"{type(value).__name__} is not JSON-serialisable")


# ---------------------------------------------------------------- errors


def _quote(value: Any) -> str:
    try:
        text = json.dumps(value, ensure_ascii=False)
    except (TypeError, ValueError):
        text = repr(value)
    return text if len(text) <= _MAX_INPUT else text[: _MAX_INPUT - 1] + "…"


def _describe_errors(exc: pydantic_core.ValidationError) -> str:
    """``path: message (got value); ...``, the shape raw-schema tools use."""
    errors = exc.errors(include_url=False, include_context=False)
    parts = []
    for error in errors[:_MAX_ERRORS]:
        path = "/".join(str(part) for part in error["loc"]) or "(root)"
        message = error["msg"]
        if error["type"] not in ("missing", "extra_forbidden") and error["loc"]:
            message = f"{message} (got {_quote(error['input'])})"
        parts.append(f"{path}: {message}")
    if len(errors) > _MAX_ERRORS:
        parts.append(f"and {len(errors) - _MAX_ERRORS} more")
    return "; ".join(parts)


def _explain_schema_error(tool_name: str, fields: Mapping[str, Any], exc: Exception) -> str:
    """Name the parameter pydantic cannot describe (found by trying each one alone)."""
    import pydantic

    for name, hint in fields.items():
        try:
            pydantic.TypeAdapter(_make_typed_dict("probe", {name: hint}, forbid_extra=True)).json_schema()
        except pydantic.PydanticUserError as one:
            first = str(one).splitlines()[0]
            return (
                f"tool {tool_name!r}: parameter {name!r} has a type pydantic cannot validate or describe ({first}); "
                "use JSON-like types (str, int, float, bool, Literal, Enum, list, dict, TypedDict, attrs, "
                "dataclasses, pydantic models)"
            )
    return f"tool {tool_name!r}: cannot build its parameters schema ({str(exc).splitlines()[0]})"


# ---------------------------------------------------------------- types


def _unwrap(fn: Callable[..., Any]) -> Callable[..., Any]:
    """The function whose annotations and docstring describe ``fn``."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if inspect.isroutine(fn):
        return fn
    call = getattr(type(fn), "__call__", None)  # noqa: B004 - a callable object: its __call__ has the hints
    return call if call is not None else fn


def _is_context(hint: Any) -> bool:
    return isinstance(hint, type) and issubclass(hint, ToolContext)


def _make_typed_dict(name: str, fields: Mapping[str, Any], *, forbid_extra: bool) -> Any:
    import pydantic
    import typing_extensions

    make: Any = typing_extensions.TypedDict  # the functional form, with computed fields
    result = make(name, dict(fields))
    if forbid_extra:
        result.__pydantic_config__ = pydantic.ConfigDict(extra="forbid")
    return result


def _jsonable(value: Any) -> tuple[bool, Any]:
    from pydantic_core import to_jsonable_python

    try:
        return True, to_jsonable_python(value, fallback=_json_fallback)
    except (TypeError, ValueError):
        return False, None


class _TypeRewriter:
    """Rewrites annotations into what pydantic validates (attrs classes, ``typing.TypedDict``)."""

    def __init__(self, tool_name: str, localns: Mapping[str, Any] | None) -> None:
        self._tool = tool_name
        self._localns = dict(localns) if localns else None
        self._done: dict[type, Any] = {}
        self._active: set[type] = set()

    def field(self, hint: Any, description: str | None, default: Any) -> Any:
        """A TypedDict field: the rewritten type, its docstring text and default, NotRequired if defaulted."""
        import pydantic
        import typing_extensions

        hint = self.rewrite(hint)
        extra: dict[str, Any] = {}
        if description and not _has_description(hint):
            extra["description"] = description
        if default is not attrs.NOTHING and not hasattr(default, "takes_self"):  # an attrs.Factory has no value
            ok, value = _jsonable(default)
            if ok:
                extra["json_schema_extra"] = {"default": value}
        annotated: Any = typing.Annotated
        if extra:
            hint = annotated[hint, pydantic.Field(**extra)]
        if default is not attrs.NOTHING:
            not_required: Any = typing_extensions.NotRequired
            hint = not_required[hint]
        return hint

    def rewrite(self, hint: Any) -> Any:
        """``hint`` with every attrs class and stdlib TypedDict replaced; the same object when nothing changes."""
        if isinstance(hint, type):
            if attrs.has(hint):
                return self._attrs(hint)
            if _is_typed_dict(hint):
                return self._typed_dict(hint)
            return hint
        origin = typing.get_origin(hint)
        if origin is None or origin is typing.Literal:
            return hint
        args = typing.get_args(hint)
        if origin is typing.Annotated:
            inner = self.rewrite(args[0])
            if inner is args[0]:
                return hint
            annotated: Any = typing.Annotated
            return annotated[(inner, *hint.__metadata__)]
        new = tuple(self.rewrite(arg) for arg in args)
        if all(a is b for a, b in zip(new, args)):
            return hint
        if origin is types.UnionType:
            return functools.reduce(operator.or_, new)
        if hasattr(hint, "copy_with"):  # typing's generic aliases (Union, List, Optional ...)
            return hint.copy_with(new)
        return types.GenericAlias(origin, new)

    def _hints(self, cls: type, kind: str) -> dict[str, Any]:
        try:
            return typing.get_type_hints(cls, localns=self._localns, include_extras=True)
        except Exception as exc:
            raise ToolError(
                f"tool {self._tool!r}: cannot resolve the type hints of the {kind} {cls.__qualname__} "
                f"({describe(exc)}); import the types it names at module level"
            ) from None

    def _attrs(self, cls: type) -> Any:
        if cls in self._done:
            return self._done[cls]
        import pydantic

        if cls in self._active:
            raise ToolError(
                f"tool {self._tool!r}: the attrs class {cls.__qualname__} refers to itself; a recursive attrs class "
                "cannot be a tool parameter (use a pydantic model or a dataclass)"
            )
        self._active.add(cls)
        try:
            hints = self._hints(cls, "attrs class")
            doc = parse_docstring(cls.__doc__, attributes=True)
            fields: dict[str, Any] = {}
            for field in attrs.fields(cls):
                if not field.init:
                    continue
                hint = hints.get(field.name, field.type)
                if hint is None:
                    raise ToolError(
                        f"tool {self._tool!r}: field {field.name!r} of the attrs class {cls.__qualname__} "
                        "has no type; annotate it"
                    )
                described = doc.params.get(field.name) or doc.params.get(field.alias)
                fields[field.alias] = self.field(hint, described, field.default)
            clone = _make_typed_dict(cls.__name__, fields, forbid_extra=True)
            clone.__doc__ = doc.description or None
            clone.__module__, clone.__qualname__ = cls.__module__, cls.__qualname__

            def build(data: dict[str, Any]) -> Any:
                try:
                    return cls(**data)
                except Exception as exc:  # an attrs validator or converter: an argument error for the model
                    raise ValueError(f"{cls.__name__}: {describe(exc)}") from None

            annotated: Any = typing.Annotated
            result = annotated[clone, pydantic.AfterValidator(build)]
        finally:
            self._active.discard(cls)
        self._done[cls] = result
        return result

    def _typed_dict(self, cls: type) -> Any:
        import typing_extensions

        if cls in self._done:
            return self._done[cls]
        if cls in self._active:  # recursive: left as is for pydantic (which resolves it if it accepts the class)
            return cls
        self._active.add(cls)
        try:
            hints = self._hints(cls, "TypedDict")
            required: frozenset[str] = getattr(cls, "__required_keys__", frozenset())
            fields: dict[str, Any] = {}
            changed = type(cls).__module__ == "typing" and sys.version_info < (3, 12)  # pydantic refuses these
            for key, hint in hints.items():
                bare, marked = _strip_required(hint)
                new = self.rewrite(bare)
                changed = changed or new is not bare
                # An explicit Required / NotRequired wins: on 3.11 a string annotation
                # (``from __future__ import annotations``) hides it from __required_keys__.
                is_required = marked if marked is not None else key in required
                changed = changed or is_required != (key in required)
                if not is_required:
                    not_required: Any = typing_extensions.NotRequired
                    new = not_required[new]
                fields[key] = new
            if not changed:
                result: Any = cls
            else:
                result = _make_typed_dict(cls.__name__, fields, forbid_extra=False)
                config = getattr(cls, "__pydantic_config__", None)
                if config is not None:
                    result.__pydantic_config__ = config
                result.__doc__ = parse_docstring(cls.__doc__, attributes=True).description or None
                result.__module__, result.__qualname__ = cls.__module__, cls.__qualname__
        finally:
            self._active.discard(cls)
        self._done[cls] = result
        return result


def _is_typed_dict(cls: type) -> bool:
    import typing_extensions

    return bool(typing_extensions.is_typeddict(cls))


def _strip_required(hint: Any) -> tuple[Any, bool | None]:
    """``hint`` without its Required / NotRequired marker, and what the marker said (None: none)."""
    import typing_extensions

    marked: bool | None = None
    while True:
        origin = typing.get_origin(hint)
        if origin in (typing.Required, typing_extensions.Required):
            marked = True if marked is None else marked
        elif origin in (typing.NotRequired, typing_extensions.NotRequired):
            marked = False if marked is None else marked
        else:
            return hint, marked
        hint = typing.get_args(hint)[0]


def _has_description(hint: Any) -> bool:
    """Whether ``hint`` is ``Annotated`` with a pydantic ``Field(description=...)`` already."""
    if typing.get_origin(hint) is not typing.Annotated:
        return False
    return any(getattr(meta, "description", None) for meta in hint.__metadata__)


# ---------------------------------------------------------------- the model-facing schema

_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})
_SCHEMA_ONE = frozenset(
    {
        "items",
        "additionalProperties",
        "unevaluatedProperties",
        "unevaluatedItems",
        "additionalItems",
        "not",
        "contains",
        "propertyNames",
        "if",
        "then",
        "else",
    }
)
_SCHEMA_LISTS = frozenset({"anyOf", "oneOf", "allOf", "prefixItems"})
_REF_PREFIX = "#/$defs/"


def clean_schema(schema: Mapping[str, Any]) -> dict[str, Any]:
    """The schema the model sees: no ``title`` keys, ``$ref`` inlined unless recursive, ``type`` first.

    Only schema keywords are touched: a property *named* ``title`` stays.
    """
    defs: Mapping[str, Any] = schema.get("$defs", {})
    recursive = _recursive_defs(defs)

    def clean(node: Any, expanding: tuple[str, ...]) -> Any:
        if not isinstance(node, Mapping):
            return node
        ref = node.get("$ref")
        if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
            target = ref[len(_REF_PREFIX) :]
            if target in defs and target not in recursive and target not in expanding:
                inlined = clean(defs[target], (*expanding, target))
                siblings = clean({k: v for k, v in node.items() if k != "$ref"}, expanding)
                return {**inlined, **siblings}
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key == "title" or key == "$defs":
                continue
            if key in _SCHEMA_MAPS and isinstance(value, Mapping):
                out[key] = {name: clean(sub, expanding) for name, sub in value.items()}
            elif key in _SCHEMA_ONE:
                out[key] = clean(value, expanding)
            elif key in _SCHEMA_LISTS and isinstance(value, list):
                out[key] = [clean(sub, expanding) for sub in value]
            else:
                out[key] = value
        if "type" in out:  # reads better: the type, then its details
            out = {"type": out.pop("type"), **out}
        return out

    body = clean(schema, ())
    body.pop("description", None)  # the tool's description says what it does
    result: dict[str, Any] = {"type": "object", "properties": body.pop("properties", {})}
    if "required" in body:
        result["required"] = body.pop("required")
    body.pop("type", None)
    body.pop("additionalProperties", None)
    result["additionalProperties"] = False  # the arguments TypedDict forbids extra keys
    result.update(body)
    if recursive:
        result["$defs"] = {name: clean(defs[name], ()) for name in sorted(recursive)}
    return result


def _recursive_defs(defs: Mapping[str, Any]) -> frozenset[str]:
    """The definitions that reach themselves, and those they reach (kept as ``$ref``)."""

    def refs(node: Any) -> set[str]:
        found: set[str] = set()
        stack = [node]
        while stack:
            item = stack.pop()
            if isinstance(item, Mapping):
                ref = item.get("$ref")
                if isinstance(ref, str) and ref.startswith(_REF_PREFIX):
                    found.add(ref[len(_REF_PREFIX) :])
                stack.extend(item.values())
            elif isinstance(item, list):
                stack.extend(item)
        return found

    edges = {name: refs(body) for name, body in defs.items()}
    cyclic: set[str] = set()
    for start in edges:
        seen: set[str] = set()
        stack = list(edges[start])
        while stack:
            name = stack.pop()
            if name == start:
                cyclic.add(start)
                break
            if name not in seen and name in edges:
                seen.add(name)
                stack.extend(edges[name])
    keep = set(cyclic)
    stack = [name for start in cyclic for name in edges[start]]
    while stack:  # a definition a recursive one refers to must stay defined too
        name = stack.pop()
        if name not in keep and name in edges:
            keep.add(name)
            stack.extend(edges[name])
    return frozenset(keep)
