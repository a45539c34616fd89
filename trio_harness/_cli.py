"""The ``trio-harness`` command line (also ``python -m trio_harness``).

Subcommands:

* ``acp``: serve the Agent Client Protocol on stdin / stdout;
* ``run PROMPT``: send one prompt to a new (or ``--session ID``) agent and
  stream the answer to stdout, tool calls to stderr;
* ``sessions list`` / ``sessions show ID``: inspect the session store;
* ``models``: the known models (:mod:`trio_harness._cli_models`).

``acp`` and ``run`` take ``--mcp-config FILE``: MCP servers (the
``mcpServers`` JSON users already have) whose tools every agent gets.

Every subcommand takes ``--store DIR`` or ``--store postgresql://...``
(default: the per-user data directory's ``sessions``); ``acp`` and ``run`` take
``--model SPEC`` (default: ``$TRIO_HARNESS_MODEL`` or ``deepseek:deepseek-chat``).
``sessions`` never needs a model.  ``acp`` and ``run`` take ``--temperature T`` and
``--max-tokens N`` (model settings of every request) and ``--system TEXT`` or
``--system-file PATH`` (the system prompt).

``run --image FILE`` (repeatable) attaches image files to the prompt.
``run`` reads the prompt from stdin when none is given and stdin is not a
terminal, shows progress on stderr when it is a terminal
(:mod:`trio_harness._cli_progress`) and ends with the line that resumes the
session.

Exit codes: 0 success; 1 a failed turn or an unreadable session; 2 a usage
error (bad ``--model``, missing API key for ``run``, unknown session, ``--sandbox`` without
a working bubblewrap, ``--sandbox-hide`` without ``--sandbox``, a bad ``--mcp-config`` or an MCP server that does not
start, an unreadable ``--system-file``); 3 a turn stopped by a limit (max
tokens, max steps, a budget); 130 interrupted (Ctrl-C, after cancelling
the turn cleanly).

Approval (docs/approval.rst): ``run`` asks ``y / n / always`` on the terminal
before each call that requires approval (``bash`` commands); without a
terminal it denies them and says so on stderr; ``--yes`` runs them without
asking.  ``acp`` asks the client with ``session/request_permission``;
``acp --yes`` turns asking off.  Text from the model or a tool written to a terminal is made
inert (:func:`trio_harness._cli_progress.inert`); to a file or pipe it is exact.

``acp`` without the model's API key still answers the handshake: it
advertises the key as an ``env_var`` auth method and ``authenticate`` says
which variable to set (docs/acp.rst, "Authentication").  ``acp --fs-timeout S``,
``--write-timeout S`` and ``--max-sessions N`` set the server's bounds
(:mod:`trio_harness._cli_acp`).
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import trio

from ._cli_acp import acp_bound_options, add_acp_bounds
from ._cli_common import (
    EXIT_FAILED,
    EXIT_INTERRUPTED,
    EXIT_LIMIT,
    EXIT_OK,
    EXIT_USAGE,
    PROG,
    _error,
    _store_name,
)
from ._cli_models import add_models_command
from ._errors import (
    HarnessError,
    InvalidSessionIdError,
    McpConfigError,
    McpStartError,
    ModelError,
    SessionNotFoundError,
    SessionStoreError,
)
from .bash._options import BashRuntimeOptions
from .bash._sandbox import SandboxPolicy, SandboxUnavailableError

if TYPE_CHECKING:
    from ._cli_progress import Printer
    from ._records import Failure, Image, ModelSettings
    from .agents._agent import Agent
    from .agents._inbox import Prompt
    from .agents._options import AgentOptions
    from .agents._turns import TurnOutcome
    from .model._protocol import ModelProvider
    from .session._events import Event
    from .tools._mcp_config import McpServerConfig


DEFAULT_MODEL: Final = "deepseek:deepseek-chat"
"""The model spec used when neither ``--model`` nor ``$TRIO_HARNESS_MODEL`` is given."""


_TOOL_NAMES: Final = ("tasks", "bash", "subagent", "files", "plan")


def default_store() -> Path:
    """The default session store directory: ``<user data dir>/trio-harness/sessions``."""
    import platformdirs

    return Path(platformdirs.user_data_dir("trio-harness")) / "sessions"


def _tools_arg(value: str) -> bool | list[str]:
    text = value.strip().lower()
    if text == "all":
        return True
    if text in ("none", ""):
        return False
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = sorted(set(names) - set(_TOOL_NAMES))
    if unknown:
        raise argparse.ArgumentTypeError(
            f"unknown built-in tools {unknown}; choose from {', '.join(_TOOL_NAMES)}, all or none"
        )
    return names


def _hidden_path(value: str) -> str:
    if not value.strip():
        raise argparse.ArgumentTypeError("an empty path")
    return os.path.abspath(os.path.expanduser(value))


def _positive_int(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not an integer") from None
    if number <= 0:
        raise argparse.ArgumentTypeError(f"{value!r} must be positive")
    return number


def _temperature(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not 0 <= number <= 2:
        raise argparse.ArgumentTypeError(f"{value!r} must be within [0, 2]")
    return number


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``trio-harness`` command."""
    from ._version import __version__

    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--store",
        metavar="DIR|URL",
        type=_store_arg,
        default=None,
        help=f"session store: a directory, or a postgresql:// URL (default: {default_store()})",
    )
    tools = argparse.ArgumentParser(add_help=False)
    tools.add_argument(
        "--model",
        metavar="SPEC",
        action="append",
        default=None,
        help="the model (acp: repeat it to offer several, the first the default; a session switches with its "
        "model config option): deepseek:MODEL (DeepSeek, needs $DEEPSEEK_API_KEY), openai:MODEL (OpenAI, "
        "needs $OPENAI_API_KEY), openai:MODEL@BASE_URL (any OpenAI-compatible server), "
        "openai-responses:MODEL[@BASE_URL] (the Responses API), "
        "anthropic:MODEL (Anthropic, needs $ANTHROPIC_API_KEY), anthropic:MODEL@BASE_URL, scripted:PATH "
        "(answers from a JSON script file, offline) or replay:SESSION_LOG (answers recorded in a "
        f"session log, offline) (default: $TRIO_HARNESS_MODEL or {DEFAULT_MODEL})",
    )
    tools.add_argument(
        "--tools",
        metavar="LIST",
        type=_tools_arg,
        default=True,
        help="built-in tools to offer: all (default), none, or a comma list of tasks,bash,subagent,files,plan",
    )
    tools.add_argument(
        "--sandbox",
        action="store_true",
        help="run bash commands in a bubblewrap sandbox: only the session's directory writable, "
        "a private /tmp, no network (needs bwrap)",
    )
    tools.add_argument(
        "--sandbox-hide",
        metavar="PATH",
        action="append",
        type=_hidden_path,
        default=None,
        help="with --sandbox: cover PATH inside the sandbox (a directory by an empty one, a file by an "
        "unreadable one); repeat for several paths",
    )
    tools.add_argument(
        "--durability",
        choices=("step", "sync", "turn"),
        default="step",
        help="when a turn's events reach the store: step (default: before each model request, tool call and "
        "approval, without waiting for the disk; the turn end synced), sync (each of those synced), "
        "turn (at the turn end only)",
    )
    tools.add_argument(
        "--mcp-config",
        metavar="FILE",
        type=Path,
        default=None,
        help='MCP servers whose tools the agents get: a JSON file, {"mcpServers": {NAME: {"command": ...}}} '
        'or {NAME: {"type": "http", "url": ...}}',
    )

    model_flags = argparse.ArgumentParser(add_help=False)
    model_flags.add_argument(
        "--temperature", metavar="T", type=_temperature, default=None, help="sampling temperature, within [0, 2]"
    )
    model_flags.add_argument(
        "--max-tokens",
        metavar="N",
        type=_positive_int,
        default=None,
        help="cap on the tokens generated per model request (a turn that hits it exits with code 3)",
    )
    system = model_flags.add_mutually_exclusive_group()
    system.add_argument("--system", metavar="TEXT", default=None, help="the system prompt")
    system.add_argument(
        "--system-file", metavar="PATH", type=Path, default=None, help="read the system prompt from a UTF-8 file"
    )

    parser = argparse.ArgumentParser(
        prog=PROG,
        description="A Trio runtime for LLM agents: serve ACP, run a prompt, inspect sessions.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    acp = commands.add_parser(
        "acp",
        parents=[common, tools, model_flags],
        help="serve the Agent Client Protocol on stdin/stdout",
        description="Serve the Agent Client Protocol (JSON-RPC, one message per line) on "
        "stdin/stdout until stdin closes.  Logs go to stderr.",
    )
    acp.add_argument(
        "--max-line-bytes",
        metavar="N",
        type=_positive_int,
        default=None,
        help="longest accepted message line (default: 8 MiB)",
    )
    acp.add_argument(
        "--yes",
        action="store_true",
        help="run tool calls that require approval without asking the client (session/request_permission)",
    )
    add_acp_bounds(acp)
    acp.set_defaults(handler=_cmd_acp)

    run = commands.add_parser(
        "run",
        parents=[common, tools, model_flags],
        help="send one prompt and stream the answer",
        description="Send one prompt to a new agent (or resume --session ID), stream the answer "
        "to stdout and tool calls to stderr.  Exit 0 when the turn completes, 1 on an error, "
        "3 when a limit stopped it, 130 on Ctrl-C.",
    )
    run.add_argument(
        "prompt",
        metavar="PROMPT",
        nargs="?",
        default=None,
        help="the prompt text; '-', or none when stdin is not a terminal, reads it from stdin",
    )
    run.add_argument(
        "--quiet",
        "-q",
        action="store_true",
        help="write only the answer and errors: no progress line, tool lines or session lines",
    )
    run.add_argument(
        "--show-reasoning",
        action="store_true",
        help="write the model's reasoning to stderr (dimmed on a terminal) as it streams",
    )
    run.add_argument("--session", metavar="ID", help="resume this stored session instead of creating one")
    run.add_argument(
        "--image",
        metavar="FILE",
        action="append",
        default=[],
        help="attach an image file (PNG, JPEG, GIF or WebP, at most 5 MiB) to the prompt; repeatable",
    )
    run.add_argument(
        "--max-steps",
        metavar="N",
        type=_positive_int,
        default=None,
        help="model requests per turn before it stops (exit code 3)",
    )
    run.add_argument(
        "--yes",
        action="store_true",
        help="run tool calls that require approval (bash commands) without asking; without it they are "
        "asked y / n / always on the terminal, and denied when there is no terminal",
    )
    run.set_defaults(handler=_cmd_run)

    sessions = commands.add_parser(
        "sessions",
        help="list or show stored sessions",
        description="Inspect the session store (no model needed).",
    )
    actions = sessions.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser(
        "list",
        parents=[common],
        help="list stored sessions",
        description="List stored sessions: id, creation time, events, last activity and the first user prompt.",
    )
    listing.set_defaults(handler=_sessions_command("list"))
    show = actions.add_parser(
        "show",
        parents=[common],
        help="show a session's transcript",
        description="Print a readable transcript of a stored session: prompts, answers, tool "
        "calls and results (truncated) and how each turn ended.",
    )
    show.add_argument("session_id", metavar="ID", help="the session id, or a prefix of exactly one")
    show.add_argument(
        "--width",
        metavar="N",
        type=_positive_int,
        default=500,
        help="truncate tool arguments and results to N characters (default: %(default)s)",
    )
    show.set_defaults(handler=_sessions_command("show"))
    add_models_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if hasattr(args, "model"):  # repeatable: args.models all of them, args.model the first (the default)
        args.models = args.model or [os.environ.get("TRIO_HARNESS_MODEL") or DEFAULT_MODEL]
        args.model = args.models[0]
        if args.command != "acp" and len(args.models) > 1:
            parser.error(f"{args.command} takes one --model (only acp offers several)")
    if args.store is None:
        args.store = default_store()
    handler: Callable[[argparse.Namespace], int] = args.handler
    try:
        return handler(args)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SandboxUnavailableError as exc:  # --sandbox on a machine where bwrap cannot run
        _error(str(exc))
        return EXIT_USAGE


# ---------------------------------------------------------------- helpers


def _store_arg(value: str) -> str | Path:
    """``--store``: a ``postgresql://`` URL stays a string, anything else is a directory path."""
    if value.startswith(("postgresql://", "postgres://")):
        return value
    return Path(value)


async def _with_model(spec: str, main: Callable[[ModelProvider], Awaitable[int]], *, require_key: bool = True) -> int:
    """Run ``main`` with the provider ``spec`` names, closed after it; a bad spec is one line and exit 2."""
    from .model._spec import open_model

    async with contextlib.AsyncExitStack() as stack:
        try:
            provider = await stack.enter_async_context(open_model(spec, require_key=require_key))
        except ModelError as exc:
            _error(str(exc))
            return EXIT_USAGE
        return await main(provider)


async def _with_models(
    specs: Sequence[str], main: Callable[[list[ModelProvider]], Awaitable[int]], *, require_key: bool = True
) -> int:
    """Run ``main`` with the providers ``specs`` name (only the first needs its key), closed after it."""
    from .model._spec import open_model

    async with contextlib.AsyncExitStack() as stack:
        providers: list[ModelProvider] = []
        for index, spec in enumerate(specs):
            try:
                model = open_model(spec, require_key=require_key if index == 0 else True)
                providers.append(await stack.enter_async_context(model))
            except ModelError as exc:
                _error(str(exc))
                return EXIT_USAGE
        return await main(providers)


def _bash_options(args: argparse.Namespace) -> BashRuntimeOptions:
    """The executor settings the flags ask for (``--sandbox``, ``--sandbox-hide``).

    Under the sandbox the ``--mcp-config`` file is hidden too (from bash and
    the file tools): its servers' ``env`` and headers may hold tokens.
    """
    if not args.sandbox:
        return BashRuntimeOptions()
    hidden = tuple(args.sandbox_hide or ())
    config = getattr(args, "mcp_config", None)
    if config is not None:
        hidden += (os.path.abspath(os.path.expanduser(str(config))),)
    if hidden:
        return BashRuntimeOptions(sandbox=SandboxPolicy(hidden=hidden))
    return BashRuntimeOptions(sandbox=SandboxPolicy())


def _sandbox_hide_without_sandbox(args: argparse.Namespace) -> bool:
    """Report ``--sandbox-hide`` given without ``--sandbox`` (nothing would be hidden)."""
    if args.sandbox_hide and not args.sandbox:
        _error("--sandbox-hide needs --sandbox: without the sandbox nothing is hidden from bash commands")
        return True
    return False


def _mcp_servers(args: argparse.Namespace) -> tuple[McpServerConfig, ...] | None:
    """The servers of ``--mcp-config`` (none without it); None after reporting a bad file."""
    if args.mcp_config is None:
        return ()
    from .tools._mcp_config import load_mcp_config

    try:
        return load_mcp_config(args.mcp_config)
    except McpConfigError as exc:
        _error(str(exc))
        return None


def _model_settings(args: argparse.Namespace) -> ModelSettings | None:
    """The harness-wide model settings the flags ask for (None: none)."""
    from ._records import ModelSettings

    if args.temperature is None and args.max_tokens is None:
        return None
    return ModelSettings(temperature=args.temperature, max_tokens=args.max_tokens)


def _system_prompt(args: argparse.Namespace) -> str | None:
    """The ``--system`` text or the ``--system-file`` contents; raises OSError / UnicodeError for a bad file."""
    if args.system is not None:
        return str(args.system)
    if args.system_file is not None:
        return Path(args.system_file).read_text(encoding="utf-8")
    return None


def _agent_options(args: argparse.Namespace, system: str | None) -> AgentOptions | None:
    from .agents._options import AgentOptions

    fields: dict[str, Any] = {}
    if getattr(args, "max_steps", None):
        fields["max_steps"] = args.max_steps
    if system is not None:
        fields["system_prompt"] = system
    return AgentOptions(**fields) if fields else None


def _read_system(args: argparse.Namespace) -> tuple[bool, str | None]:
    """``(ok, system prompt)``; not ok after reporting an unreadable ``--system-file``."""
    try:
        return True, _system_prompt(args)
    except (OSError, UnicodeError) as exc:
        _error(f"cannot read --system-file {str(args.system_file)!r}: {exc}")
        return False, None


# ---------------------------------------------------------------- acp


def _cmd_acp(args: argparse.Namespace) -> int:
    logging.basicConfig(stream=sys.stderr, level=logging.WARNING, format="%(name)s: %(levelname)s: %(message)s")
    if _sandbox_hide_without_sandbox(args):
        return EXIT_USAGE
    servers = _mcp_servers(args)
    if servers is None:
        return EXIT_USAGE
    ok, args.system_prompt = _read_system(args)
    if not ok:
        return EXIT_USAGE
    from .model._spec import missing_api_key

    # Without the model's API key the server still answers the handshake and
    # advertises the key as an auth method (docs/acp.rst, "Authentication").
    missing = missing_api_key(args.model)
    saved = sys.stdout
    sys.stdout = sys.stderr  # stray prints must never reach the protocol stream
    try:
        serve = functools.partial(_serve_acp, args, servers=servers, missing_key=missing)
        return trio.run(functools.partial(_with_models, args.models, serve, require_key=missing is None))
    finally:
        sys.stdout = saved


async def _serve_acp(
    args: argparse.Namespace,
    providers: list[ModelProvider],
    servers: Sequence[McpServerConfig] = (),
    missing_key: str | None = None,
) -> int:
    from ._harness import open_harness
    from ._telemetry import otlp_from_env
    from .acp._server import serve_stdio
    from .agents._approval import allow_all

    provider = providers[0]
    options: dict[str, Any] = {"ask_permission": not args.yes}
    if len(providers) > 1:  # the model config option (docs/acp.rst, "Config options")
        options["models"] = providers
    if missing_key is not None:
        from .acp._auth import EnvKeyAuth
        from .model._anthropic import AnthropicProvider
        from .model._openai import OpenAIProvider

        log = logging.getLogger("trio_harness.acp")
        log.warning("%s is not set: sessions need authenticate, which tells the client to set it", missing_key)
        keyed = provider if isinstance(provider, OpenAIProvider | AnthropicProvider) else None
        auth = EnvKeyAuth(missing_key, keyed)
        options["auth_methods"] = [auth.method()]
        options["authenticator"] = auth
    if args.max_line_bytes is not None:
        options["max_line_bytes"] = args.max_line_bytes
    options.update(acp_bound_options(args))
    agent_options = _agent_options(args, args.system_prompt)
    if agent_options is not None:
        options["agent_options"] = agent_options
    signalled: int | None = None
    try:
        async with (
            open_harness(
                model=provider,
                store=args.store,
                builtin_tools=args.tools,
                # --yes: the server asks nobody, and every call that requires approval runs.
                approver=allow_all if args.yes else None,
                bash_options=_bash_options(args),
                mcp_servers=servers,
                model_settings=_model_settings(args),
                durability=args.durability,
                **otlp_from_env(),  # OTEL_EXPORTER_OTLP_ENDPOINT: traces and metrics (docs/tracing.rst)
            ) as harness,
            trio.open_nursery() as nursery,
        ):

            async def stop_on_signal() -> None:
                nonlocal signalled
                with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
                    async for signum in signals:
                        signalled = signum
                        nursery.cancel_scope.cancel()
                        return

            nursery.start_soon(stop_on_signal)
            await serve_stdio(harness, **options)
            nursery.cancel_scope.cancel()
    except McpStartError as exc:
        _error(str(exc))
        return EXIT_USAGE
    except SessionStoreError as exc:
        _error(str(exc))
        return EXIT_FAILED
    return 128 + signalled if signalled is not None else EXIT_OK


# ---------------------------------------------------------------- run


def _cmd_run(args: argparse.Namespace) -> int:
    if _sandbox_hide_without_sandbox(args):
        return EXIT_USAGE
    prompt: str | None = args.prompt
    if prompt is None and sys.stdin.isatty():
        _error("no prompt: give one as an argument, or pipe it on stdin (echo hi | trio-harness run)")
        return EXIT_USAGE
    if prompt is None or prompt == "-":
        prompt = sys.stdin.read()
    if not prompt.strip():
        _error("the prompt is empty")
        return EXIT_USAGE
    images = _cli_images(args.image)
    if images is None:
        return EXIT_USAGE
    servers = _mcp_servers(args)
    if servers is None:
        return EXIT_USAGE
    ok, args.system_prompt = _read_system(args)
    if not ok:
        return EXIT_USAGE
    content = [prompt, *images] if images else prompt
    return trio.run(_with_model, args.model, functools.partial(_run_prompt, args, prompt=content, servers=servers))


def _cli_images(paths: Sequence[str]) -> list[Image] | None:
    """The ``--image`` files, read; None after reporting one that cannot be used."""
    from .model._images import load_image

    try:
        return [load_image(path) for path in paths]
    except ModelError as exc:
        _error(f"--image: {exc}")
        return None


async def _run_prompt(
    args: argparse.Namespace, provider: ModelProvider, prompt: Prompt, servers: Sequence[McpServerConfig] = ()
) -> int:
    from ._cli_approval import TerminalApprover
    from ._cli_pending import QueuedTurns
    from ._cli_progress import Printer, Style, use_colour
    from ._harness import open_harness
    from ._telemetry import otlp_from_env
    from .agents._approval import allow_all
    from .model._images import refuse_images
    from .tools._mcp import MCP_NOTICES, mcp_notice_line, mcp_skipped_line

    try:
        if not isinstance(prompt, str):  # --image: refused before anything starts when the model takes none
            refuse_images(provider, str(getattr(provider, "model", "") or ""))
    except ModelError as exc:
        _error(f"--image: {exc}")
        return EXIT_USAGE
    colour = use_colour(sys.stderr, os.environ)
    printer = Printer(
        sys.stdout,
        sys.stderr,
        style=Style(colour),
        status=sys.stderr.isatty() and not args.quiet,
        quiet=args.quiet,
        show_reasoning=args.show_reasoning,
        max_retries=getattr(provider, "max_retries", None),
        inert_out=sys.stdout.isatty(),
        inert_err=sys.stderr.isatty(),
    )
    entered = False
    agent_id: str | None = None
    outcome: TurnOutcome | None = None
    queued: QueuedTurns | None = None
    terminal = None if args.yes else TerminalApprover(printer)
    try:
        async with open_harness(
            model=provider,
            store=args.store,
            builtin_tools=args.tools,
            approver=allow_all if terminal is None else terminal,
            bash_options=_bash_options(args),
            mcp_servers=servers,
            model_settings=_model_settings(args),
            durability=args.durability,
            **otlp_from_env(),  # OTEL_EXPORTER_OTLP_ENDPOINT: traces and metrics (docs/tracing.rst)
        ) as harness:
            entered = True
            if not args.quiet:  # MCP servers: a tool left out, a restart: one line each
                for connection in harness.mcp_connections:
                    for tool, reason in connection.skipped_tools.items():
                        printer.line(printer.show(mcp_skipped_line(connection.name, tool, reason)))
                for name in MCP_NOTICES:
                    harness.bus.on(name, lambda notice: printer.line(printer.show(mcp_notice_line(notice))))
            options = _agent_options(args, args.system_prompt)
            try:
                if args.session:
                    # A unique prefix names its session, as in sessions show.
                    stored = [header.id for header in await harness.sessions.stored()]
                    session_id = _unique_session(stored, args.session)
                    if session_id is None:
                        return EXIT_USAGE
                    handle = await harness.agents.resume(session_id, options=options)
                else:
                    handle = await harness.agents.create(cwd=os.getcwd(), options=options)
            except (SessionNotFoundError, InvalidSessionIdError, SessionStoreError) as exc:
                _error(str(exc))
                return EXIT_USAGE
            except HarnessError as exc:
                _error(str(exc))
                return EXIT_FAILED
            agent = handle.agent
            agent_id = agent.id
            finished = trio.Event()
            interrupts = 0

            # Once finished (a second Ctrl-C stops at once), nothing more of the turn is shown.
            def on_event(event: Event) -> None:
                if not finished.is_set():
                    printer.event(event)

            def on_done(result: TurnOutcome) -> None:
                nonlocal outcome
                if not finished.is_set():
                    outcome = result
                    finished.set()

            stop_showing = _show_continuation(agent, on_event, printer)
            from ._cli_pending import QueuedTurns

            queued = QueuedTurns(agent, on_event, printer)
            try:
                # Ctrl-C from here on cancels the turn cleanly (a second one stops at once).
                with trio.open_signal_receiver(signal.SIGINT) as signals:
                    if not args.quiet:
                        printer.line(f"[session] {agent.id}")
                    queued.prompt_id = agent.follow(prompt, on_event=on_event, on_done=on_done).message_id
                    async with trio.open_nursery() as nursery:

                        async def on_interrupt() -> None:
                            nonlocal interrupts
                            async for _ in signals:
                                interrupts += 1
                                if interrupts == 1:
                                    printer.line("[cancelling: press Ctrl-C again to stop at once]")
                                    agent.cancel("user")
                                else:
                                    finished.set()

                        nursery.start_soon(on_interrupt)
                        if printer.status:
                            nursery.start_soon(_count_down, printer)
                        await finished.wait()
                        nursery.cancel_scope.cancel()
                printer.break_line()
            finally:
                stop_showing()
                queued.stop()
                with trio.CancelScope(shield=True):
                    await handle.dispose()
    except McpStartError as exc:
        if entered:
            raise
        _error(str(exc))
        return EXIT_USAGE
    except SessionStoreError as exc:
        # Either the store is unusable (refused before any model call) or the
        # session could not be stored: never an exit 0 with nothing saved.
        printer.break_line()
        if not entered:
            _error(str(exc))
            return EXIT_USAGE
        failure = _turn_failure(outcome)
        if failure is not None:
            _error(f"{failure.message} ({failure.code})")
        if failure is None or failure.code != "store-error":
            _error(str(exc))
        return EXIT_FAILED
    finally:
        if terminal is not None:
            await terminal.aclose()
    code = _exit_code(outcome, interrupted=interrupts > 0)
    if code == EXIT_OK and queued is not None and queued.failed():
        code = EXIT_FAILED
    if agent_id is not None and not args.quiet:
        _resume_hint(args, agent_id, kept=code != EXIT_OK)
    return code


def _show_continuation(agent: Agent, on_event: Callable[[Event], None], printer: Printer) -> Callable[[], None]:
    """Show the continuation turn of a resumed paused turn (it asks again first); returns the unsubscribe."""
    from .session import _events as ev
    from .session._paused import paused_calls

    events = agent.session.events
    if not paused_calls(events):
        return lambda: None
    paused = next(e.turn for e in reversed(events) if isinstance(e, ev.TurnEnd))
    turn = paused + 1
    printer.line(f"[paused] turn {paused} waits for approval: asking again")
    return agent.session.observe(
        lambda event: on_event(event) if getattr(event, "turn", None) == turn and event.type != "turn/end" else None
    )


async def _count_down(printer: Printer) -> None:
    """Redraw the status line's retry countdown until cancelled."""
    while True:
        await trio.sleep(0.25)
        printer.tick()


def _resume_hint(args: argparse.Namespace, session_id: str, *, kept: bool) -> None:
    """The line that continues the session (docs/cli.rst): a failed turn's session is kept for a retry."""
    import shlex

    words = ["trio-harness", "run", "--session", session_id, *_policy_flags(args)]
    if args.store != default_store():
        words += ["--store", _store_name(args.store) if isinstance(args.store, str) else str(args.store)]
    if args.model != (os.environ.get("TRIO_HARNESS_MODEL") or DEFAULT_MODEL):
        from .model._spec import shown_spec

        words += ["--model", shown_spec(args.model)]  # a base URL's password is not printed
    command = " ".join(shlex.quote(word) for word in words) + " PROMPT"
    what = f"kept session {session_id}; retry or continue with" if kept else "continue with"
    print(f"[session] {what}: {command}", file=sys.stderr, flush=True)


def _policy_flags(args: argparse.Namespace) -> list[str]:
    """The flags given that change what the agent may do, to repeat in the "continue with" line."""
    words: list[str] = []
    if args.sandbox:
        words.append("--sandbox")
    for path in args.sandbox_hide or ():
        words += ["--sandbox-hide", path]
    if args.tools is not True:
        words += ["--tools", ",".join(args.tools) if args.tools else "none"]
    if args.mcp_config is not None:
        words += ["--mcp-config", str(args.mcp_config)]
    if args.yes:
        words.append("--yes")
    if args.max_steps is not None:
        words += ["--max-steps", str(args.max_steps)]
    return words


def _turn_failure(outcome: TurnOutcome | None) -> Failure | None:
    """The failure of a turn that ended in error, or None."""
    from ._records import Failure

    end = outcome.end if outcome is not None else None
    if end is None or end.reason != "error":
        return None
    return end.failure or Failure("unknown", "the turn failed without details")


def _exit_code(outcome: TurnOutcome | None, *, interrupted: bool) -> int:
    """The exit code of a watched prompt (see the module docstring), reporting how it ended."""
    if outcome is None:
        return EXIT_INTERRUPTED if interrupted else EXIT_FAILED
    end = outcome.end
    if end is not None and end.reason == "completed":
        return EXIT_OK
    if end is None or end.reason in ("aborted", "interrupted"):
        # The turn was cancelled, or the message never ran.
        if not interrupted:
            _error("the turn was cancelled")
        return EXIT_INTERRUPTED if interrupted else EXIT_FAILED
    if end.reason in ("max-tokens", "blocked", "budget"):
        if end.reason == "budget":
            what = end.failure.message if end.failure is not None else "a budget was used up"
        else:
            what = "the model hit its token limit" if end.reason == "max-tokens" else "the turn hit max_steps"
        print(f"[stopped] {what}", file=sys.stderr, flush=True)
        return EXIT_LIMIT
    failure = _turn_failure(outcome)
    if failure is not None:
        _error(f"{failure.message} ({failure.code})")
    else:
        _error(f"the turn ended: {end.reason}")
    return EXIT_FAILED


def _sessions_command(name: str) -> Callable[[argparse.Namespace], int]:
    """The handler of ``sessions list`` / ``sessions show`` (in :mod:`trio_harness._cli_sessions`)."""

    def handler(args: argparse.Namespace) -> int:
        from ._cli_sessions import sessions_list, sessions_show

        return (sessions_list if name == "list" else sessions_show)(args)

    return handler


def _unique_session(stored: Sequence[str], wanted: str) -> str | None:
    from ._cli_sessions import unique_session

    return unique_session(stored, wanted)
