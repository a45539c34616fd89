"""Tool definitions, tool sets bound to scopes, and argument validation."""

from __future__ import annotations

import json
import re
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs
import jsonschema
import jsonschema.exceptions

from .._errors import ToolError
from ..model._protocol import ToolSpec
from ._schema_check import SchemaValidator

if TYPE_CHECKING:
    from .._scope import Scope
    from ._agent import Agent
    from ._registry import AgentRegistry


_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_-]{0,63}$")


@attrs.frozen
class ToolOutput:
    """What a tool handler returns when it needs more than plain text.

    Attributes:
        content: the text the model reads.
        is_error: whether the call failed (the model sees an error result).
        detail: structured facts about the call for front ends and for the
            tool itself, logged with the result (``tool/result``'s
            ``detail``) but never sent to the model: a JSON object, e.g. the
            file tools' diff (docs/tools.rst, "File tools").
    """

    content: str
    is_error: bool = False
    detail: Mapping[str, Any] | None = None


@attrs.frozen
class ToolContext:
    """What a tool handler learns about its call.

    The handler runs inside the turn's cancel scope: when the turn is cancelled
    the handler sees :class:`trio.Cancelled` at its next checkpoint.

    A tool that needs another service (the task service, the bash executor)
    receives it when it is built, as the built-in tool plugins do
    (:mod:`trio_harness.tools`); the context carries only what every call has.

    Attributes:
        agent: the calling agent (its session, scope, inbox and own tools).
        agents: the registry the agent lives in (create, resume and look up
            agents, e.g. to start a child agent).
        call_id: the model's id for this call.  It is stored in the log
            with the model's message, so it is the same in every process that
            loads the session: the idempotency key a tool can pass to the
            systems it changes (a request id, an ``Idempotency-Key`` header, a
            unique row key).  The harness never re-runs a call; a call
            interrupted while it ran gets a result naming this id and saying
            it may have had effects, so the model, or a tool it asks, can look
            the key up before repeating the change (docs/guarantees.rst,
            "Durable steps").
        turn: the turn number.
        step: the step number.
    """

    agent: Agent
    agents: AgentRegistry
    call_id: str
    turn: int
    step: int


ToolHandler = Callable[[ToolContext, dict[str, Any]], Awaitable["str | ToolOutput"]]


def _check_name(instance: object, attribute: attrs.Attribute[str], value: str) -> None:
    if not _NAME.match(value):
        raise ToolError(f"tool name {value!r} must match {_NAME.pattern}")


def _check_schema(instance: object, attribute: attrs.Attribute[Mapping[str, Any]], value: Mapping[str, Any]) -> None:
    try:
        jsonschema.Draft202012Validator.check_schema(value)
    except jsonschema.exceptions.SchemaError as exc:
        raise ToolError(f"tool parameters schema is invalid: {exc.message}") from exc
    if value.get("type") != "object":
        raise ToolError('tool parameters schema must have "type": "object"')


def _check_requires_approval(instance: object, attribute: attrs.Attribute[Any], value: object) -> None:
    if not isinstance(value, bool) and not callable(value):
        raise ToolError(
            f"requires_approval must be a bool or a predicate taking the arguments, got {type(value).__name__}"
        )


@attrs.frozen(eq=False)
class Tool:
    """A tool the model can call.

    Attributes:
        name: unique within the agent's tool set.
        description: what the model is told the tool does.
        parameters: a JSON schema (``"type": "object"``) for the arguments;
            arguments are validated against it before the handler runs.
        handler: ``async def handler(ctx, args) -> str | ToolOutput``.  An
            exception it raises becomes an error result the model can read.
        parallel_safe: whether calls may run concurrently with other
            parallel-safe calls of the same step; ``False`` makes each call a
            barrier that runs alone, in model order.
        requires_approval: whether a call is asked before running (without an
            approver configured, such a call is denied): a bool, or a predicate given the validated arguments that
            says whether this call needs asking (the ``bash`` tool's
            allow-list of command prefixes is one).  See :doc:`/approval`.

    A typed function makes a tool without a hand-written schema: see
    :func:`~trio_harness.tool`.
    """

    name: str = attrs.field(validator=_check_name)
    description: str
    parameters: Mapping[str, Any] = attrs.field(validator=_check_schema)
    handler: ToolHandler
    parallel_safe: bool = True
    requires_approval: bool | Callable[[Mapping[str, Any]], bool] = attrs.field(
        default=False, validator=_check_requires_approval
    )
    _validator: SchemaValidator = attrs.field(init=False, repr=False)

    def __attrs_post_init__(self) -> None:
        object.__setattr__(self, "_validator", SchemaValidator(self.parameters))

    @property
    def spec(self) -> ToolSpec:
        """What the model is told about this tool."""
        return ToolSpec(name=self.name, description=self.description, parameters=self.parameters)

    def needs_approval(self, arguments: Mapping[str, Any]) -> bool:
        """Whether a call with these (validated) arguments must be asked before it runs.

        Raises:
            Exception: whatever the ``requires_approval`` predicate raises (the
                driver then refuses the call, naming the error).
        """
        rule = self.requires_approval
        if isinstance(rule, bool):
            return rule
        return bool(rule(arguments))

    def validate(self, arguments: str) -> dict[str, Any]:
        """Parse and validate raw JSON arguments.

        Raises:
            ValueError: with a message the model can act on.
        """
        args = parse_arguments(arguments)
        if self._validator.is_valid(args):  # the common case, without collecting errors
            return args
        errors = sorted(self._validator.iter_errors(args), key=lambda e: list(e.absolute_path))
        if errors:
            details = "; ".join(
                f"{'/'.join(str(p) for p in e.absolute_path) or '(root)'}: {e.message}" for e in errors[:5]
            )
            raise ValueError(f"arguments for tool {self.name!r} do not match its schema: {details}")
        return args


# The C scanner behind json.loads (the same decoder settings).
_scan_once: Any = getattr(json.JSONDecoder(), "scan_once")  # noqa: B009


def parse_arguments(arguments: str) -> dict[str, Any]:
    """Parse tool-call arguments (empty text means ``{}``).

    Raises:
        ValueError: the text is not a JSON object.
    """
    if not arguments.strip():
        return {}
    # json.loads without its per-call wrapper: the C scanner on the text without
    # JSON whitespace around it; anything else (an error to explain) goes through json.loads.
    text = arguments.strip(" \t\n\r")
    try:
        value, end = _scan_once(text, 0)
    except (StopIteration, ValueError):
        end = -1
    if end != len(text):
        try:
            value = json.loads(arguments)
        except ValueError as exc:
            raise ValueError(f"arguments are not valid JSON ({exc}); send a JSON object") from None
    if not isinstance(value, dict):
        raise ValueError(f"arguments must be a JSON object, got {type(value).__name__}")
    return value


@attrs.define(eq=False)
class ToolSet:
    """Tools registered in scopes; each registration unwinds with its scope.

    The harness has one (harness-wide tools) and every agent has one (tools
    local to the agent).  An agent sees the harness tools plus its own, its own
    winning on a name clash.
    """

    _tools: dict[str, Tool] = attrs.field(factory=dict, init=False)
    _sections: dict[object, str] = attrs.field(factory=dict, init=False)

    def add(self, tool: Tool, *, scope: Scope | None = None) -> Callable[[], None]:
        """Register ``tool``; it is removed when ``scope`` closes (or by the returned remover).

        Raises:
            ToolError: a tool with this name is already registered here.
        """
        if tool.name in self._tools:
            raise ToolError(f"a tool named {tool.name!r} is already registered")
        self._tools[tool.name] = tool

        def remove() -> None:
            if self._tools.get(tool.name) is tool:
                del self._tools[tool.name]

        if scope is not None:
            scope.add_exit_callback(remove)
        return remove

    def add_prompt_section(self, text: str, *, scope: Scope | None = None) -> Callable[[], None]:
        """Add a system-prompt section (e.g. tool guidance), removed with ``scope``."""
        key = object()
        self._sections[key] = text

        def remove() -> None:
            self._sections.pop(key, None)

        if scope is not None:
            scope.add_exit_callback(remove)
        return remove

    def get(self, name: str) -> Tool | None:
        """The tool named ``name``, or None."""
        return self._tools.get(name)

    def tools(self) -> tuple[Tool, ...]:
        """The registered tools, in registration order."""
        return tuple(self._tools.values())

    def prompt_sections(self) -> tuple[str, ...]:
        """The registered prompt sections, in registration order."""
        return tuple(self._sections.values())
