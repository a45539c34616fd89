"""Approval before dangerous calls: an approver decides, the log shows who approved what.

What it shows:

* ``open_harness(approver=...)``: an async callable asked before every call of
  a tool that requires approval (``bash`` does by default);
* ``BashToolOptions(allow_prefixes=[...])``: plain commands starting with an
  allowed prefix run without asking, while ``echo hi > file`` (a redirection)
  is asked even though it starts with ``echo``;
* a typed tool marked ``requires_approval=True``;
* the answers: allow once, allow always (remembered for the session and tool:
  the next call asks nobody), deny with a message the model reads;
* the ``approval/requested`` and ``approval/decided`` events in the log.

The model is scripted (offline); the commands are real and run in a temporary
directory.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import trio

from trio_harness import ApprovalDecision, ApprovalRequest, BashToolOptions, ScriptedModel, open_harness, tool
from trio_harness import events as ev


@tool(requires_approval=True)
def send_email(to: str, subject: str) -> str:
    """Send an e-mail.

    Args:
        to: the recipient.
        subject: the subject line.
    """
    return f"sent {subject!r} to {to}"


async def approver(request: ApprovalRequest) -> ApprovalDecision:
    """A policy standing in for a person: what would you answer?"""
    print(f"  asked: {request.tool} {request.raw_arguments}")
    if request.tool == "send_email":
        if str(request.arguments["to"]).endswith("@example.com"):
            return ApprovalDecision.allow_always()
        return ApprovalDecision.deny("only addresses at example.com")
    command = str(request.arguments.get("command", ""))
    if "rm " in command:
        return ApprovalDecision.deny("do not delete files; move them to ./trash instead")
    return ApprovalDecision.allow_once()


def bash(command: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]}


def email(to: str, subject: str) -> dict[str, Any]:
    return {"tool_calls": [{"name": "send_email", "arguments": {"to": to, "subject": subject}}]}


SCRIPT: list[dict[str, Any]] = [
    bash("echo hello"),  # on the allow-list: runs without asking
    bash("echo hello > greeting.txt"),  # a redirection: asked, allowed once
    bash("rm greeting.txt"),  # asked, denied with a message
    email("ada@example.com", "report"),  # asked, allowed always
    email("bob@example.com", "follow-up"),  # remembered: nobody is asked
    email("eve@elsewhere.org", "secrets"),  # the tool was allowed always: runs too
    {"text": "All done."},
]


async def main() -> None:
    model = ScriptedModel(SCRIPT)
    with tempfile.TemporaryDirectory() as work:
        async with open_harness(
            model=model,
            builtin_tools=["bash"],
            approver=approver,
            bash_tool_options=BashToolOptions(allow_prefixes=["echo", "ls", "git status"]),
        ) as harness:
            harness.tools.add(send_email)
            async with harness.agents.open(cwd=work) as agent:
                print("running the turn:")
                agent.followup("tidy up and send the report")
                await agent.when_idle()
                print("\nwhat the log shows:")
                for event in agent.session.events:
                    if isinstance(event, ev.ApprovalRequested):
                        print(f"  approval/requested  {event.name} {event.arguments}")
                    elif isinstance(event, ev.ApprovalDecided):
                        note = f" ({event.message})" if event.message else ""
                        print(f"  approval/decided    {event.name}: {event.outcome} by {event.source}{note}")
                    elif isinstance(event, ev.ToolResult):
                        print(f"  tool/result         {event.name}: {event.content.strip()}")
            assert (Path(work) / "greeting.txt").exists()  # the denied rm never ran


if __name__ == "__main__":
    trio.run(main)
