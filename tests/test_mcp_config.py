"""MCP server configuration: the records, the file formats users have, and clear errors."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from trio_harness import McpConfigError, McpHttpServer, McpStdioServer, load_mcp_config
from trio_harness.tools import parse_mcp_config


def write(tmp_path: Path, data: object) -> Path:
    path = tmp_path / "mcp.json"
    path.write_text(json.dumps(data), encoding="utf-8")
    return path


def test_the_mcp_servers_shape_claude_desktop_and_cursor_write(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "globalShortcut": "Ctrl+Space",  # other settings beside mcpServers are ignored
            "mcpServers": {
                "files": {"command": "npx", "args": ["-y", "@mcp/files", "/tmp"], "env": {"DEBUG": "1"}},
                "web": {"url": "https://example.com/mcp", "headers": {"Authorization": "Bearer t"}},
                "off": {"command": "never", "disabled": True},
            },
        },
    )
    assert load_mcp_config(path) == (
        McpStdioServer(name="files", command="npx", args=("-y", "@mcp/files", "/tmp"), env={"DEBUG": "1"}),
        McpHttpServer(name="web", url="https://example.com/mcp", headers={"Authorization": "Bearer t"}),
    )


def test_the_bare_shape_with_types_and_harness_settings(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        {
            "api": {
                "type": "http",
                "url": "http://127.0.0.1:8000/mcp",
                "headers": {"X-Key": "k"},
                "call_timeout": 5,
                "max_restarts": 0,
            },
            "local": {
                "type": "stdio",
                "command": "python",
                "args": ["server.py"],
                "cwd": "/srv",
                "startup_timeout": 1.5,
                "grace_period": 0.5,
                "requires_approval": True,
                "max_restarts": 2,
                "restart_window": 30,
            },
            "alias": {"type": "streamable-http", "url": "https://x.test/mcp"},
        },
    )
    api, local, alias = load_mcp_config(path)
    assert api == McpHttpServer(
        name="api", url="http://127.0.0.1:8000/mcp", headers={"X-Key": "k"}, call_timeout=5.0, max_restarts=0
    )
    assert local == McpStdioServer(
        name="local",
        command="python",
        args=("server.py",),
        cwd="/srv",
        startup_timeout=1.5,
        grace_period=0.5,
        requires_approval=True,
        max_restarts=2,
        restart_window=30.0,
    )
    assert isinstance(alias, McpHttpServer) and alias.transport == "http"
    assert local.transport == "stdio"


def test_environment_references_are_expanded() -> None:
    data = {
        "gh": {
            "url": "https://api.test/${PATH_PART}/mcp",
            "headers": {"Authorization": "Bearer ${TOKEN}", "X-Team": "${TEAM:-core}"},
        },
        "run": {"command": "${TOOL_HOME}/bin/srv", "args": ["--user=${USER_NAME:-}"], "env": {"K": "${TOKEN}"}},
    }
    environ = {"TOKEN": "s3cret", "PATH_PART": "v1", "TOOL_HOME": "/opt/t"}
    gh, run = parse_mcp_config(data, environ=environ)
    assert isinstance(gh, McpHttpServer) and isinstance(run, McpStdioServer)
    assert gh.url == "https://api.test/v1/mcp"
    assert dict(gh.headers) == {"Authorization": "Bearer s3cret", "X-Team": "core"}
    assert run.command == "/opt/t/bin/srv" and run.args == ("--user=",) and dict(run.env) == {"K": "s3cret"}


def test_an_unset_variable_names_server_field_and_variable(tmp_path: Path) -> None:
    path = write(tmp_path, {"mcpServers": {"gh": {"url": "https://x.test", "headers": {"Authorization": "${NOPE}"}}}})
    with pytest.raises(McpConfigError) as info:
        load_mcp_config(path, environ={})
    error = info.value
    assert str(error) == (
        f"{path}: MCP server 'gh': headers.Authorization: the environment variable NOPE is not set "
        "(write ${NOPE:-default} to give a default)"
    )
    assert (error.server, error.field, error.source) == ("gh", "headers.Authorization", str(path))


@pytest.mark.parametrize(
    ("data", "server", "field", "message"),
    [
        ([], None, None, "must be a JSON object"),
        ({"mcpServers": []}, None, "mcpServers", "mcpServers must be an object of servers, got list"),
        ({"a": "npx"}, "a", None, "MCP server 'a': must be an object, got str 'npx'"),
        ({"a": {}}, "a", None, 'MCP server \'a\': needs "command" (a stdio server) or "url"'),
        ({"a": {"command": "x", "url": "http://h"}}, "a", None, 'has both "command" and "url"'),
        ({"a": {"type": "sse", "url": "http://h"}}, "a", "type", "the SSE transport is not supported"),
        ({"a": {"type": "ws", "url": "http://h"}}, "a", "type", 'MCP server \'a\': type: must be "stdio" or "http"'),
        ({"a": {"type": "stdio"}}, "a", "command", "MCP server 'a': command: is required for a stdio server"),
        ({"a": {"type": "http"}}, "a", "url", "MCP server 'a': url: is required for an HTTP server"),
        ({"a": {"type": "stdio", "command": "x", "url": "u"}}, "a", "url", "a stdio server has no url"),
        ({"a": {"type": "http", "url": "http://h", "command": "x"}}, "a", "command", "an HTTP server has no command"),
        ({"a": {"command": ""}}, "a", "command", "MCP server 'a': command: must not be empty"),
        ({"a": {"command": 5}}, "a", "command", "MCP server 'a': command: must be a string, got int 5"),
        ({"a": {"command": "x", "args": "-v"}}, "a", "args", "args: must be an array of strings, got str"),
        ({"a": {"command": "x", "args": ["-v", 2]}}, "a", "args[1]", "MCP server 'a': args[1]: must be a string"),
        ({"a": {"command": "x", "env": ["A=1"]}}, "a", "env", "env: must be an object of strings, got list"),
        ({"a": {"command": "x", "env": {"A": 1}}}, "a", "env.A", "MCP server 'a': env.A: must be a string, got int 1"),
        ({"a": {"command": "x", "env": {"A=B": "1"}}}, "a", "env.A=B", "cannot contain '='"),
        ({"a": {"command": "x", "cwd": ""}}, "a", "cwd", "MCP server 'a': cwd: must not be empty"),
        ({"a": {"url": "ftp://h"}}, "a", "url", "MCP server 'a': url: must be an http:// or https:// URL"),
        ({"a": {"url": "http://"}}, "a", "url", "must be an http:// or https:// URL"),
        ({"a": {"url": "http://h", "headers": {"Bad Name": "v"}}}, "a", "headers.Bad Name", "not a valid HTTP header"),
        ({"a": {"url": "http://h", "headers": {"X": "a\r\nb"}}}, "a", "headers.X", "must not contain a line break"),
        ({"a": {"url": "http://h", "call_timeout": 0}}, "a", "call_timeout", "must be a positive number of seconds"),
        ({"a": {"url": "http://h", "startup_timeout": True}}, "a", "startup_timeout", "positive number of seconds"),
        ({"a": {"command": "x", "grace_period": -1}}, "a", "grace_period", "positive number of seconds, got -1"),
        ({"a": {"command": "x", "requires_approval": "yes"}}, "a", "requires_approval", "must be true or false"),
        ({"a": {"command": "x", "max_restarts": -1}}, "a", "max_restarts", "must be a whole number, 0 or more"),
        ({"a": {"url": "http://h", "max_restarts": 1.5}}, "a", "max_restarts", "a whole number, 0 or more, got 1.5"),
        ({"a": {"url": "http://h", "restart_window": 0}}, "a", "restart_window", "positive number of seconds"),
        ({"a": {"command": "x", "disabled": 1}}, "a", "disabled", "MCP server 'a': disabled: must be true or false"),
        ({"": {"command": "x"}}, None, "name", "MCP server: name: must be a non-empty string"),
    ],
)
def test_errors_name_the_server_and_the_field(data: Any, server: str | None, field: str | None, message: str) -> None:
    with pytest.raises(McpConfigError) as info:
        parse_mcp_config(data, source="servers.json")
    error = info.value
    assert str(error).startswith("servers.json: ")
    assert message in str(error)
    assert (error.server, error.field, error.source) == (server, field, "servers.json")


def test_file_problems_name_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope.json"
    with pytest.raises(McpConfigError, match=f"cannot read the MCP config {missing}: "):
        load_mcp_config(missing)
    broken = tmp_path / "broken.json"
    broken.write_text('{"mcpServers": {', encoding="utf-8")
    with pytest.raises(McpConfigError, match=f"^{broken}: not valid JSON: "):
        load_mcp_config(broken)
    twice = tmp_path / "twice.json"
    twice.write_text('{"a": {"command": "x"}, "a": {"command": "y"}}', encoding="utf-8")
    with pytest.raises(McpConfigError, match=f"^{twice}: the key 'a' appears twice in one object$"):
        load_mcp_config(twice)


def test_records_check_themselves_when_built_in_code() -> None:
    with pytest.raises(McpConfigError, match=r"^MCP server 'x': args: must be a sequence of strings, not one string$"):
        McpStdioServer("x", "cmd", args="-v")
    with pytest.raises(McpConfigError, match=r"^MCP server 'x': call_timeout: must be a positive number of seconds"):
        McpHttpServer("x", "http://h", call_timeout=math.nan)
    with pytest.raises(McpConfigError, match=r"^MCP server 'x': env\.A: must not contain a NUL character$"):
        McpStdioServer("x", "cmd", env={"A": "\x00"})
    server = McpStdioServer("x", "cmd", env={"A": "1"})
    with pytest.raises(TypeError):
        server.env["B"] = "2"  # type: ignore[index]  # the record is frozen, its mappings too


# ------------------------------------------------------------------ properties

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=6), children, max_size=3),
    max_leaves=12,
)
KEYS = [
    "type",
    "command",
    "args",
    "env",
    "cwd",
    "url",
    "headers",
    "disabled",
    "call_timeout",
    "grace_period",
    "max_restarts",
    "restart_window",
]
entries = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=5), json_values, max_size=5)
configs = st.one_of(
    json_values,
    st.dictionaries(st.text(max_size=6), entries | json_values, max_size=3),
    st.fixed_dictionaries({"mcpServers": st.dictionaries(st.text(max_size=6), entries | json_values, max_size=3)}),
)


@given(configs)
def test_any_json_is_servers_or_a_config_error(data: Any) -> None:
    outcome: tuple[McpStdioServer | McpHttpServer, ...] | McpConfigError
    try:
        outcome = parse_mcp_config(data, environ={})
    except McpConfigError as exc:  # never another exception type
        outcome = exc
    if isinstance(outcome, McpConfigError):
        assert str(outcome).startswith("MCP config: ")
    else:
        assert all(isinstance(server, McpStdioServer | McpHttpServer) for server in outcome)


names = st.text(st.characters(codec="utf-8", exclude_categories=["Cc", "Cs"]), min_size=1, max_size=10).filter(
    lambda name: name.strip() != "" and name != "mcpServers"
)
strings = st.text(st.characters(codec="utf-8", exclude_characters="\x00$"), max_size=10)
stdio_entries = st.fixed_dictionaries(
    {"command": strings.filter(str.strip)},
    optional={
        "args": st.lists(strings, max_size=3),
        "env": st.dictionaries(st.from_regex(r"[A-Z_]{1,6}", fullmatch=True), strings, max_size=3),
    },
)
http_entries = st.fixed_dictionaries(
    {"type": st.just("http"), "url": st.from_regex(r"https?://[a-z]{1,8}(:[0-9]{2,4})?/[a-z]{0,5}", fullmatch=True)},
    optional={
        "headers": st.dictionaries(
            st.from_regex(r"[A-Za-z-]{1,8}", fullmatch=True),
            st.text(st.characters(codec="utf-8", exclude_characters="\x00$\r\n"), max_size=10),
            max_size=3,
        )
    },
)


@given(st.dictionaries(names, stdio_entries | http_entries, max_size=4), st.booleans())
def test_valid_entries_load_as_written_in_either_shape(servers: dict[str, Any], wrapped: bool) -> None:
    loaded = parse_mcp_config({"mcpServers": servers} if wrapped else servers, environ={})
    assert [server.name for server in loaded] == list(servers)
    for server in loaded:
        entry = servers[server.name]
        if isinstance(server, McpStdioServer):
            assert server.command == entry["command"]
            assert list(server.args) == entry.get("args", [])
            assert dict(server.env) == entry.get("env", {})
        else:
            assert server.url == entry["url"]
            assert dict(server.headers) == entry.get("headers", {})
