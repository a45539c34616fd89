"""Slash commands: ``/compact``, ``/cost``, ``/status``, ``/help``, answered by the harness, not the model.

The ACP bridge advertises them with ``available_commands_update`` after
``session/new`` and ``session/load``.  A prompt whose text starts with
``/NAME`` (a word of letters, digits, ``-`` and ``_``: ``/usr/bin/env ...``
is no command) naming one of :data:`COMMANDS` runs the command instead of a
model turn: its answer is sent as ``agent_message_chunk`` and the prompt ends
``end_turn``.  Any other ``/NAME`` is an ordinary prompt for the model: ``/tmp
is full`` is a sentence, not a mistyped command (docs/acp.rst, "Slash
commands"); ``/help`` lists the commands.  Commands are not
logged: they read the session, and ``/compact`` logs what it did itself.

The answers are plain functions of an agent (:func:`run_command`), so any
front end can offer the same commands.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import TYPE_CHECKING, Any, Final

import attrs

from .._errors import CompactionError
from ..tools._plan import current_plan

if TYPE_CHECKING:
    from ..agents._agent import Agent
    from ..bash._sandbox import SandboxPolicy

COMMANDS: Final = (
    ("compact", "Compact the conversation now: older turns are replaced by a summary"),
    ("cost", "Show the tokens used and the cost of this session so far"),
    ("status", "Show the model, durability, sandbox and approval mode of this session"),
    ("help", "List the commands"),
)
"""The commands every session offers: (name, description)."""

COMMAND_NAMES: Final = frozenset(name for name, _ in COMMANDS)

_COMMAND: Final = re.compile(r"^/([A-Za-z][A-Za-z0-9_-]*)(?:\s+(.*))?$", re.DOTALL)


def available_commands() -> list[dict[str, Any]]:
    """The ``availableCommands`` of an ``available_commands_update``."""
    return [{"name": name, "description": description} for name, description in COMMANDS]


def parse_command(text: str) -> tuple[str, str] | None:
    """``(name, rest)`` when a prompt is one of the slash commands, else None (a prompt for the model)."""
    match = _COMMAND.match(text.strip())
    if match is None or match.group(1) not in COMMAND_NAMES:
        return None
    return match.group(1), (match.group(2) or "").strip()


@attrs.frozen
class SessionStatus:
    """What ``/status`` reports besides the agent itself.

    Attributes:
        model: the model the next request goes to.
        mode: the approval mode (``ask`` / ``auto``), or None when the front end has none.
        sandbox: the bash sandbox policy, or None.
    """

    model: str
    mode: str | None = None
    sandbox: SandboxPolicy | None = None


def _help() -> str:
    lines = ["Commands:"]
    lines += [f"  /{name}: {description}" for name, description in COMMANDS]
    return "\n".join(lines)


def _tokens(value: int) -> str:
    return f"{value:,}"


def cost_text(agent: Agent) -> str:
    """The answer of ``/cost``: the session's token usage and cost."""
    usage = agent.usage
    lines = [
        f"Requests: {usage.requests}",
        f"Input tokens: {_tokens(usage.input_tokens)} (cache reads {_tokens(usage.cache_hit_tokens)})",
        f"Output tokens: {_tokens(usage.output_tokens)} (reasoning {_tokens(usage.reasoning_tokens)})",
    ]
    cost = agent.cost
    if cost is None:
        lines.append("Cost: unknown (no prices for this model)")
    else:
        lines.append(f"Cost: ${cost.quantize(Decimal('0.0001'))}")
    return "\n".join(lines)


def status_text(agent: Agent, status: SessionStatus) -> str:
    """The answer of ``/status``."""
    options = agent.options
    durability = options.durability or getattr(agent, "_durability", None) or "step"
    sandbox = status.sandbox
    if sandbox is None:
        sandboxed = "off (bash runs unconfined)"
    else:
        network = "network on" if sandbox.network else "no network"
        sandboxed = f"on ({network}; writable: the session's directory{', ' if sandbox.writable else ''}"
        sandboxed += ", ".join(sandbox.writable) + ")"
    lines = [
        f"Session: {agent.id}",
        f"Working directory: {agent.session.header.cwd or '(none)'}",
        f"Model: {status.model}",
        f"Durability: {durability}",
        f"Sandbox: {sandboxed}",
    ]
    if status.mode is not None:
        lines.append(f"Mode: {status.mode}")
    plan = current_plan(agent)
    if plan:
        done = sum(entry.status == "completed" for entry in plan)
        lines.append(f"Plan: {done} of {len(plan)} entries completed")
    return "\n".join(lines)


async def compact_text(agent: Agent) -> str:
    """Run ``agent.compact()``; the answer of ``/compact``."""
    try:
        event = await agent.compact()
    except CompactionError as exc:
        return f"Compacting the conversation failed: {exc}"
    if event is None:
        return "Nothing to compact: the conversation has a single turn since the start or the last compaction."
    return (
        f"Compacted the conversation: the turns before event {event.boundary} are now a summary "
        f"({_tokens(event.tokens_before)} tokens before)."
    )


async def run_command(name: str, rest: str, agent: Agent, status: SessionStatus) -> str:
    """The answer of the command ``/name`` (an unknown one: a message listing the commands)."""
    if name == "compact":
        return await compact_text(agent)
    if name == "cost":
        return cost_text(agent)
    if name == "status":
        return status_text(agent, status)
    if name == "help":
        return _help()
    return f"Unknown command /{name}; the model was not asked.\n{_help()}"
