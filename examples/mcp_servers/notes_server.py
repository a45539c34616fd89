"""A tiny MCP server for examples/mcp_tools.py: notes kept in memory, served over stdio.

Written with the official MCP SDK's server side (``MCPServer``); any MCP server
works the same way, whatever language it is written in.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

app = MCPServer("notes")
notes: dict[str, str] = {}


@app.tool()
def add_note(title: str, text: str) -> str:
    """Store a note under a title (replacing one with the same title)."""
    notes[title] = text
    return f"saved {title!r} ({len(notes)} notes)"


@app.tool()
def list_notes() -> dict[str, str]:
    """Every note, by title."""
    return dict(notes)


if __name__ == "__main__":
    app.run()
