"""MCP servers as tool sources: a stdio server's tools for every agent, and for one agent.

What it shows (the model is scripted, the MCP server is a real process):

* an ``mcpServers`` configuration, the JSON users already have for their
  editor, read with ``parse_mcp_config`` (``load_mcp_config`` reads a file;
  ``trio-harness run --mcp-config FILE`` does the same on the command line);
* ``open_harness(mcp_servers=...)`` starts the server in the harness's ``mcp``
  scope; its tools appear as ``mcp__notes__add_note`` and
  ``mcp__notes__list_notes`` with the server's JSON schemas;
* the model calls them like any tool; structured results arrive as text;
* an agent's own server, started from its ``setup`` with ``connect_mcp`` into
  the agent's scope and tool set: only that agent sees it, and disposing the
  agent stops the process;
* when the harness closes, the server process is gone.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path
from typing import Any

import trio

from trio_harness import Agent, McpStdioServer, ScriptedModel, connect_mcp, open_harness
from trio_harness import events as ev
from trio_harness.tools import McpConnection, parse_mcp_config

SERVER = Path(__file__).resolve().parent / "mcp_servers" / "notes_server.py"


def call(name: str, **arguments: Any) -> dict[str, Any]:
    return {"name": name, "arguments": arguments}


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


async def main() -> None:
    # The shape Claude Desktop, Cursor and other agents use, as it would be in a file.
    config = {"mcpServers": {"notes": {"command": sys.executable, "args": [str(SERVER)]}}}
    servers = parse_mcp_config(config)

    model = ScriptedModel(
        [
            {"tool_calls": [call("mcp__notes__add_note", title="groceries", text="milk, eggs")]},
            {"tool_calls": [call("mcp__notes__list_notes")]},
            {"text": "You have one note: groceries (milk, eggs)."},
            # the second agent's turn: its own server
            {"tool_calls": [call("mcp__scratch__add_note", title="idea", text="try Trio")]},
            {"text": "Noted in your scratch pad."},
        ]
    )
    async with open_harness(model=model, builtin_tools=False, mcp_servers=servers) as harness:
        (notes,) = harness.mcp_connections
        print(f"server {notes.name!r} runs as process {notes.pid}; its tools: {', '.join(notes.tool_names)}")
        async with harness.agents.open() as agent:
            agent.followup("Remember to buy milk and eggs, then tell me my notes.")
            await agent.when_idle()
            for event in agent.session.events:
                if isinstance(event, ev.ToolCallRequested):
                    print(f"  call   {event.name} {event.arguments}")
                elif isinstance(event, ev.ToolResult):
                    print(f"  result {event.content}")
                elif isinstance(event, ev.AssistantMessage) and event.text:
                    print(f"  answer {event.text}")

        # An agent's own server: started in its scope, registered in its tool set.
        own: list[McpConnection] = []

        async def setup(agent: Agent) -> None:
            server = McpStdioServer("scratch", sys.executable, [str(SERVER)])
            own.append(await connect_mcp(agent.scope, agent.tools, server))

        handle = await harness.agents.create(setup=setup)
        (scratch,) = own
        print("agent's own tools:", ", ".join(tool.name for tool in handle.agent.tools.tools()))
        handle.agent.followup("Note an idea: try Trio.")
        await handle.agent.when_idle()
        result = [e for e in handle.agent.session.events if isinstance(e, ev.ToolResult)][-1]
        print(f"  result {result.content}")
        assert scratch.pid is not None and process_alive(scratch.pid)
        await handle.dispose()
        print(f"after dispose: the agent's server process {'runs' if process_alive(scratch.pid) else 'is gone'}")
    assert notes.pid is not None
    print(f"after the harness closed: the server process {'runs' if process_alive(notes.pid) else 'is gone'}")


if __name__ == "__main__":
    trio.run(main)
