"""The ``bash`` tool: foreground commands, and background commands as ``bash-N`` tasks.

Ownership lives in the executor: a background command is started
with the calling agent's id as its owner token, and the task service records
the agent as the task's owner.  Nothing about a running command lives in this
plugin's scope, so reloading the plugin neither kills a task nor makes it
visible to another session.

Approval: a ``bash`` call requires approval by default (it is asked when an
approver is configured, denied when none is), except a command that :func:`command_allowed` finds
on the plugin's allow-list of command prefixes (docs/approval.rst).
"""

from __future__ import annotations

import shlex
from collections.abc import Awaitable, Callable, Collection, Mapping
from typing import TYPE_CHECKING, Any, ClassVar, TypeAlias

import attrs
import trio

from .._errors import BashError
from ..agents._tools import Tool, ToolContext, ToolOutput, ToolSet
from ..bash._executor import BashExecutor
from ..bash._records import BashRequest, BashResult, BashSpec
from ..bash._render import render_result
from ..bash._sandbox import describe_sandbox
from ..tasks._render import render_started
from ..tasks._service import TaskService
from ..tasks._types import TaskHooks, TaskOutcome, TaskSpec

if TYPE_CHECKING:
    from .._scope import Scope


BashRunner: TypeAlias = Callable[[ToolContext, BashSpec], Awaitable[BashResult]]
"""What runs an agent's foreground ``bash`` commands instead of the executor
(``AgentOptions.bash_runner``): given the call's context and the validated
spec, it returns the same :class:`~trio_harness.bash.BashResult` the executor
would (output tails, exit code or signal, ``timed_out`` after
``spec.timeout``), and kills what it started when cancelled.  The tool renders
it the same way, so the model sees one shape whatever runs the command."""


SHELL_METACHARACTERS: frozenset[str] = frozenset(";&|<>()$`\\{}*?[]")
"""Characters that keep a command off the allow-list of command prefixes.

They chain commands (``;`` ``&`` ``|``), redirect (``<`` ``>``), open subshells
or substitutions (``(`` ``)`` ``$`` `````), escape (``\\``), or expand words
(``{`` ``}`` ``*`` ``?`` ``[`` ``]``: a glob can turn a planted file name into
an option).  A command containing any of them, anywhere, even quoted, is asked
(see :func:`command_allowed`)."""


def _words(command: str) -> list[str] | None:
    """The words of a plain command line, or None when it is not plain."""
    if any(char in SHELL_METACHARACTERS or char < " " or char == "\x7f" for char in command):
        return None
    try:
        return shlex.split(command)
    except ValueError:  # an unbalanced quote
        return None


def command_allowed(command: object, prefixes: Collection[str]) -> bool:
    """Whether ``command`` runs without asking because it starts with an allowed prefix.

    A command matches a prefix when it is plain and its first words are the
    prefix's words.  Plain means: it contains no character of
    :data:`SHELL_METACHARACTERS` and no control character (newline, tab, ...)
    anywhere, even inside quotes, and its quotes are balanced.  Words are split
    as the shell splits them (``shlex``, POSIX rules; quotes are removed), so
    ``git status --short`` and ``git 'status'`` match the prefix ``git
    status``, while ``git statusx``, ``git status; rm -rf /``, ``git status &&
    rm x``, ``git status $(rm x)``, ``git status > ~/.bashrc`` and ``FOO=1 git
    status`` do not.  A prefix allows any further arguments: list commands
    whose arguments cannot do harm.
    """
    if not isinstance(command, str) or not prefixes:
        return False
    words = _words(command)
    if not words:
        return False
    for prefix in prefixes:
        expected = prefix.split()
        if expected and words[: len(expected)] == expected:
            return True
    return False


def _prefix_tuple(value: object) -> tuple[str, ...]:
    if isinstance(value, str) or not isinstance(value, Collection):
        raise TypeError(
            f"allow_prefixes must be a list of command prefixes (e.g. ['git status']), got {type(value).__name__}"
        )
    return tuple(value)


def _check_prefixes(instance: object, attribute: attrs.Attribute[Any], value: tuple[object, ...]) -> None:
    for prefix in value:
        if not isinstance(prefix, str) or not prefix.split():
            raise ValueError(f"{attribute.name}: {prefix!r} is not a command prefix (a non-empty string of words)")
        if _words(prefix) != prefix.split() or any(char in "\"'" for char in prefix):
            raise ValueError(
                f"{attribute.name}: the prefix {prefix!r} must be plain words: no quotes, control characters "
                f"or shell metacharacters ({''.join(sorted(SHELL_METACHARACTERS))})"
            )


@attrs.frozen
class BashToolOptions:
    """Settings of the model-facing ``bash`` tool (:class:`BashToolPlugin`;
    :func:`~trio_harness.open_harness` takes them as ``bash_tool_options=``).
    The executor that runs the commands has its own,
    :class:`~trio_harness.bash.BashRuntimeOptions`.

    Attributes:
        run_in_background: offer the ``run_in_background`` parameter (default
            on).  When off, the parameter is absent from the schema and a
            forced background call is refused.
        background_default: whether a call runs in the background when the
            model does not say.
        output_limit_bytes: a byte cap on the model-facing text of background
            tasks (projected into their snapshots).
        requires_approval: ask the approver before each command (default
            on); without an approver configured, commands are denied.
        allow_prefixes: command prefixes that never ask, e.g. ``["git status",
            "ls"]`` (the rule: :doc:`/approval`, "Which calls are asked").
    """

    run_in_background: bool = True
    background_default: bool = False
    output_limit_bytes: int | None = None
    requires_approval: bool = True
    allow_prefixes: tuple[str, ...] = attrs.field(default=(), converter=_prefix_tuple, validator=_check_prefixes)


DESCRIPTION = (
    "Run a shell command with bash. Output is stdout, then stderr under a [stderr] line, then "
    "markers for a nonzero exit code, a signal or a timeout."
)
BACKGROUND = (
    " With run_in_background=true the command starts as a background task and the call returns "
    "its id at once: read its output with task_output, stop it with task_kill. Use it for long "
    "commands (builds, servers, test suites) while you keep working."
)


@attrs.define(eq=False)
class BashToolPlugin:
    """Registers the ``bash`` tool into a tool set (normally the harness-wide one).

    Attributes:
        bash: the executor that runs the commands.
        tasks: the task service background commands are registered in.
        tools: the tool set to register into.
        run_in_background: offer the ``run_in_background`` parameter (default
            on).  When off, the parameter is absent from the schema and a
            forced background call is refused.
        background_default: whether a call runs in the background when the
            model does not say.
        output_limit_bytes: a byte cap on the model-facing text of background
            tasks (projected into their snapshots).
        requires_approval: ask the approver before each command (default
            on); without an approver configured, commands are denied.
        allow_prefixes: command prefixes that never ask (the exact rule:
            :doc:`/approval`, "Which calls are asked").
    """

    name: ClassVar[str] = "bash"
    bash: BashExecutor
    tasks: TaskService
    tools: ToolSet
    options: BashToolOptions = attrs.field(
        factory=BashToolOptions, validator=attrs.validators.instance_of(BashToolOptions)
    )

    def needs_approval(self, args: Mapping[str, Any]) -> bool:
        """Whether a call with these arguments is asked (its command is not on the allow-list)."""
        return not command_allowed(args.get("command"), self.options.allow_prefixes)

    def tool(self) -> Tool:
        """The ``bash`` tool definition."""
        properties: dict[str, Any] = {
            "command": {"type": "string", "description": "The command line to run."},
            "description": {"type": "string", "description": "What the command does, in a few words."},
            "timeout_ms": {
                "type": "integer",
                "minimum": 1,
                "description": "Foreground timeout in milliseconds (capped).",
            },
            "workdir": {"type": "string", "description": "The working directory (default: the session's)."},
        }
        if self.options.run_in_background:
            properties["run_in_background"] = {
                "type": "boolean",
                "description": "Start as a background task and return its id at once.",
            }
        return Tool(
            name="bash",
            description=DESCRIPTION
            + (BACKGROUND if self.options.run_in_background else "")
            + (describe_sandbox(self.bash.sandbox) if self.bash.sandbox is not None else ""),
            parameters={"type": "object", "properties": properties, "required": ["command"]},
            handler=self._call,
            parallel_safe=False,
            requires_approval=(self.needs_approval if self.options.allow_prefixes else True)
            if self.options.requires_approval
            else False,
        )

    async def apply(self, scope: Scope) -> None:
        """Register the tool, bound to ``scope``."""
        self.tools.add(self.tool(), scope=scope)

    async def _call(self, ctx: ToolContext, args: dict[str, Any]) -> str | ToolOutput:
        if not self.options.run_in_background and args.get("run_in_background"):
            return ToolOutput("error: background commands are disabled; run it in the foreground", is_error=True)
        background = bool(
            args.get("run_in_background", self.options.background_default and self.options.run_in_background)
        )
        timeout_ms = args.get("timeout_ms")
        workdir = args.get("workdir") or ctx.agent.session.header.cwd or None
        executor = self.bash
        try:
            spec = executor.resolve(
                BashRequest(
                    command=args["command"],
                    workdir=workdir,
                    timeout=timeout_ms / 1000 if timeout_ms is not None else None,
                    owner=ctx.agent.id,
                    # A sandbox lets the command write the session's directory, whatever workdir the model picks.
                    writable_dir=ctx.agent.session.header.cwd or ".",
                )
            )
        except BashError as exc:
            return ToolOutput(f"error: {exc}", is_error=True)
        if not background:
            # The agent's runner (the ACP client's terminal) or the executor: the same result either way.
            runner = ctx.agent.options.bash_runner
            result = await (runner(ctx, spec) if runner is not None else executor.run(spec))
            # A nonzero exit, a signal or a timeout is a failed call (the text the model reads is the same).
            return ToolOutput(render_result(result), is_error=result.exit_code != 0 or result.timed_out)
        return await self._start_background(ctx, spec, args.get("description") or args["command"])

    async def _start_background(self, ctx: ToolContext, spec: BashSpec, label: str) -> str:
        executor = self.bash
        agent = ctx.agent

        async def starter() -> TaskHooks:
            process = await executor.start(spec)
            # Spill files go when the owner goes (or with the executor), or
            # earlier when the task service prunes the finished task.
            try:
                forget_on_exit = agent.scope.add_exit_callback(process.aclose)
            except BaseException:
                # The owner began closing while the shell was being spawned (the
                # spawn cannot be cancelled): no task will exist, so nobody else
                # would stop this group before the executor closes.
                with trio.CancelScope(shield=True):
                    await process.aclose()
                raise

            async def done() -> TaskOutcome:
                facts = await process.wait()
                detail: dict[str, object] = {"exit_code": facts.exit_code}
                if facts.signal is not None:
                    detail["signal"] = facts.signal
                if facts.killed:
                    return TaskOutcome("killed", detail=detail)
                return TaskOutcome("completed", detail=detail)

            def release() -> None:
                forget_on_exit()
                process.release()

            return TaskHooks(cancel=process.kill, done=done, read_output=process.read_output, release=release)

        snapshot = await self.tasks.start(
            TaskSpec(
                kind="bash",
                label=label,
                owner=agent,
                run=starter,
                output_limit_bytes=self.options.output_limit_bytes,
            )
        )
        # No checkpoint from here on: a cancellation arriving now must not
        # drop the id of a task that is already running (the driver logs this
        # result before the turn sees the cancellation).
        return render_started(snapshot.id)
