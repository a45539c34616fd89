"""MCP server configuration: the records, and the loader for the files users already have.

Two records describe a server: :class:`McpStdioServer` (a command run as a
child process, spoken to over its stdin / stdout) and :class:`McpHttpServer`
(a streamable HTTP endpoint, with headers).  Both check themselves when made,
so a record built in code fails as clearly as a bad file entry: a
:class:`~trio_harness.McpConfigError` naming the server and the field.

:func:`load_mcp_config` reads the two JSON shapes editors and agents use::

    {"mcpServers": {"NAME": {"command": "...", "args": ["..."], "env": {"K": "V"}}}}
    {"NAME": {"type": "http", "url": "https://...", "headers": {"Authorization": "Bearer ..."}}}

(docs/mcp.rst describes every key, the ``${VAR}`` expansion and the defaults).
"""

from __future__ import annotations

import json
import os
import re
import types
import urllib.parse
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Final, TypeAlias

import attrs

from .._errors import McpConfigError
from .._redact import redact_urls
from .._util import is_positive_number
from ..bash._env import EnvPolicy, to_env_policy

__all__ = [
    "DEFAULT_CALL_TIMEOUT",
    "DEFAULT_GRACE_PERIOD",
    "DEFAULT_MAX_RESTARTS",
    "DEFAULT_RESTART_WINDOW",
    "DEFAULT_STARTUP_TIMEOUT",
    "McpHttpServer",
    "McpServerConfig",
    "McpStdioServer",
    "load_mcp_config",
    "parse_mcp_config",
]

DEFAULT_STARTUP_TIMEOUT: Final = 30.0
"""Seconds a server gets to start and answer the handshake and the first tool listing."""

DEFAULT_CALL_TIMEOUT: Final = 120.0
"""Seconds a tool call waits for the server's answer before it ends as an error result."""

DEFAULT_GRACE_PERIOD: Final = 2.0
"""Seconds a stdio server gets to exit after its stdin closes, and again after SIGTERM."""

DEFAULT_MAX_RESTARTS: Final = 5
"""Attempts to start a server again after it stopped, within any ``restart_window``."""

DEFAULT_RESTART_WINDOW: Final = 300.0
"""Seconds over which ``max_restarts`` attempts are counted."""

# An HTTP header name: an RFC 9110 token.
_HEADER_NAME = re.compile(r"^[!#$%&'*+\-.^_`|~0-9A-Za-z]+$")
# ${NAME} or ${NAME:-default}
_VARIABLE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_HTTP_TYPES: Final = ("http", "streamable-http", "streamable_http", "streamableHttp")


def _fail(server: str | None, field: str | None, problem: str) -> McpConfigError:
    where = f"MCP server {server!r}" if server is not None else "MCP server"
    if field is not None:
        where += f": {field}"
    return McpConfigError(f"{where}: {problem}", server=server, field=field)


def _check_name(name: object) -> str:
    if not isinstance(name, str) or not name.strip() or any(ord(c) < 32 for c in name):
        raise _fail(None, "name", f"must be a non-empty string without control characters, got {name!r:.80}")
    return name


def _check_text(server: str, field: str, value: object, *, empty: bool = True) -> str:
    if not isinstance(value, str):
        raise _fail(server, field, f"must be a string, got {type(value).__name__} {value!r:.80}")
    if not empty and not value.strip():
        raise _fail(server, field, "must not be empty")
    if "\x00" in value:
        raise _fail(server, field, "must not contain a NUL character")
    return value


def _check_seconds(server: str, field: str, value: object) -> float:
    if not is_positive_number(value, finite=True):
        raise _fail(server, field, f"must be a positive number of seconds, got {value!r:.80}")
    return float(value)


def _check_count(server: str, field: str, value: object) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise _fail(server, field, f"must be a whole number, 0 or more, got {value!r:.80}")
    return value


def _check_flag(server: str, field: str, value: object) -> bool:
    if not isinstance(value, bool):
        raise _fail(server, field, f"must be true or false, got {value!r:.80}")
    return value


def _frozen_strings(server: str, field: str, value: object, *, header_names: bool = False) -> Mapping[str, str]:
    if not isinstance(value, Mapping):
        raise _fail(server, field, f"must be an object of strings, got {type(value).__name__}")
    checked: dict[str, str] = {}
    for key, item in value.items():
        if not isinstance(key, str) or not key:
            raise _fail(server, field, f"has an empty or non-string key {key!r:.80}")
        name = f"{field}.{key}"
        if header_names:
            if not _HEADER_NAME.match(key):
                raise _fail(server, name, "is not a valid HTTP header name")
            text = _check_text(server, name, item)
            if "\r" in text or "\n" in text:
                raise _fail(server, name, "must not contain a line break")
        else:
            if "=" in key or "\x00" in key:
                raise _fail(server, name, "an environment variable name cannot contain '=' or NUL")
            text = _check_text(server, name, item)
        checked[key] = text
    return types.MappingProxyType(checked)


def _names_only(values: Mapping[str, str]) -> str:
    """A repr of ``values`` that shows the names only (header and environment values may be secrets)."""
    return "{" + ", ".join(f"{key!r}: '***'" for key in values) + "}"


def _args_tuple(value: Sequence[str]) -> Sequence[str]:
    # A lone string stays one, for __attrs_post_init__ to refuse (tuple("ab") would be ("a", "b")).
    return value if isinstance(value, str) else tuple(value)


@attrs.frozen
class McpStdioServer:
    """An MCP server run as a child process and spoken to over its stdin / stdout.

    The process starts in a new session and process group, with the
    environment the MCP SDK gives servers (``HOME``, ``LOGNAME``, ``PATH``,
    ``SHELL``, ``TERM``, ``USER``) as ``env_policy`` filters it, plus ``env``.  When its connection closes,
    its stdin is closed, then (after ``grace_period``) its group gets SIGTERM,
    then SIGKILL: nothing it started survives (docs/mcp.rst, "Lifetime").

    Attributes:
        name: the server's name; its tools are offered as ``mcp__<name>__<tool>``.
        command: the program to run (looked up on ``PATH``).
        args: its arguments.
        env: environment variables set for it (over the inherited few).
        cwd: its working directory (None: this process's).
        startup_timeout: seconds to start, answer ``initialize`` and list its tools.
        call_timeout: seconds a tool call waits for an answer; then the call
            is cancelled over MCP and the model gets an error result.
        grace_period: seconds to exit after stdin closes, and after SIGTERM.
        requires_approval: mark its tools as requiring approval before a call.
        max_restarts: how many times, within ``restart_window`` seconds, the
            next call starts the server again after it stopped (0: never).
        restart_window: the seconds over which restarts are counted.
        env_policy: which inherited variables it gets
            (:class:`~trio_harness.bash.EnvPolicy`); None for the harness's
            (``BashRuntimeOptions.env_policy``, which also hides the model's API key
            variable), or the default policy outside a harness.

    Raises:
        McpConfigError: a field is invalid (the message names the server and field).
    """

    name: str
    command: str
    args: Sequence[str] = attrs.field(default=(), converter=_args_tuple)
    env: Mapping[str, str] = attrs.field(factory=dict, repr=lambda env: _names_only(env))
    cwd: str | None = None
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    grace_period: float = DEFAULT_GRACE_PERIOD
    requires_approval: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_window: float = DEFAULT_RESTART_WINDOW
    env_policy: EnvPolicy | None = attrs.field(default=None, kw_only=True)

    def __attrs_post_init__(self) -> None:
        name = _check_name(self.name)
        _check_text(name, "command", self.command, empty=False)
        if isinstance(self.args, str):
            raise _fail(name, "args", "must be a sequence of strings, not one string")
        for index, arg in enumerate(self.args):
            _check_text(name, f"args[{index}]", arg)
        object.__setattr__(self, "env", _frozen_strings(name, "env", self.env))
        if self.cwd is not None:
            _check_text(name, "cwd", self.cwd, empty=False)
        for field in ("startup_timeout", "call_timeout", "grace_period", "restart_window"):
            _check_seconds(name, field, getattr(self, field))
        _check_flag(name, "requires_approval", self.requires_approval)
        _check_count(name, "max_restarts", self.max_restarts)
        if self.env_policy is not None:
            try:
                object.__setattr__(self, "env_policy", to_env_policy(self.env_policy))
            except (TypeError, ValueError) as exc:
                raise _fail(name, "env_policy", str(exc)) from None

    @property
    def transport(self) -> str:
        """``"stdio"``."""
        return "stdio"


@attrs.frozen
class McpHttpServer:
    """An MCP server reached over streamable HTTP.

    Attributes:
        name: the server's name; its tools are offered as ``mcp__<name>__<tool>``.
        url: the MCP endpoint (``http://`` or ``https://``).
        headers: HTTP headers sent with every request (``Authorization`` ...).
        startup_timeout: seconds to connect, answer ``initialize`` and list its tools.
        call_timeout: seconds a tool call waits for an answer; then the call
            is cancelled over MCP and the model gets an error result.
        requires_approval: mark its tools as requiring approval before a call.
        max_restarts: how many times, within ``restart_window`` seconds, the
            next call connects again after the connection was lost (0: never).
        restart_window: the seconds over which reconnections are counted.

    Raises:
        McpConfigError: a field is invalid (the message names the server and field).
    """

    name: str
    url: str = attrs.field(repr=lambda url: repr(redact_urls(url)))
    headers: Mapping[str, str] = attrs.field(factory=dict, repr=lambda headers: _names_only(headers))
    startup_timeout: float = DEFAULT_STARTUP_TIMEOUT
    call_timeout: float = DEFAULT_CALL_TIMEOUT
    requires_approval: bool = False
    max_restarts: int = DEFAULT_MAX_RESTARTS
    restart_window: float = DEFAULT_RESTART_WINDOW

    def __attrs_post_init__(self) -> None:
        name = _check_name(self.name)
        url = _check_text(name, "url", self.url, empty=False)
        parsed = urllib.parse.urlsplit(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise _fail(name, "url", f"must be an http:// or https:// URL, got {redact_urls(url)!r:.200}")
        object.__setattr__(self, "headers", _frozen_strings(name, "headers", self.headers, header_names=True))
        for field in ("startup_timeout", "call_timeout", "restart_window"):
            _check_seconds(name, field, getattr(self, field))
        _check_flag(name, "requires_approval", self.requires_approval)
        _check_count(name, "max_restarts", self.max_restarts)

    @property
    def transport(self) -> str:
        """``"http"``."""
        return "http"


McpServerConfig: TypeAlias = McpStdioServer | McpHttpServer
"""The configuration of one MCP server: :class:`McpStdioServer` or :class:`McpHttpServer`."""


def with_env_policy(servers: Sequence[McpServerConfig], policy: EnvPolicy) -> tuple[McpServerConfig, ...]:
    """``servers`` with ``policy`` set on every stdio server that names none (the harness's, for its servers)."""
    return tuple(
        attrs.evolve(server, env_policy=policy)
        if isinstance(server, McpStdioServer) and server.env_policy is None
        else server
        for server in servers
    )


# ---------------------------------------------------------------- the file formats


def _no_duplicates(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    result: dict[str, Any] = {}
    for key, value in pairs:
        if key in result:
            raise McpConfigError(f"the key {key!r} appears twice in one object")
        result[key] = value
    return result


def load_mcp_config(
    path: str | os.PathLike[str], *, environ: Mapping[str, str] | None = None
) -> tuple[McpServerConfig, ...]:
    """Read an MCP configuration file (the ``mcpServers`` shape or a bare map of servers).

    Args:
        path: the JSON file.
        environ: the variables ``${VAR}`` references expand from (default:
            this process's environment).

    Returns:
        The enabled servers, in file order (an entry with ``"disabled": true``
        is skipped).

    Raises:
        McpConfigError: the file cannot be read, is not JSON, or an entry is
            invalid; the message starts with the file and names the server and
            field.
    """
    source = os.fspath(path)
    try:
        text = Path(source).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise McpConfigError(f"cannot read the MCP config {source}: {exc}", source=source) from exc
    try:
        data = json.loads(text, object_pairs_hook=_no_duplicates)
    except McpConfigError as exc:
        raise McpConfigError(f"{source}: {exc}", source=source) from None
    except ValueError as exc:
        raise McpConfigError(f"{source}: not valid JSON: {exc}", source=source) from None
    return parse_mcp_config(data, source=source, environ=environ)


def parse_mcp_config(
    data: object, *, source: str = "MCP config", environ: Mapping[str, str] | None = None
) -> tuple[McpServerConfig, ...]:
    """Read MCP server entries from parsed JSON (see :func:`load_mcp_config`).

    Args:
        data: ``{"mcpServers": {NAME: entry}}`` (other top-level keys are
            ignored, as editors keep other settings beside it) or ``{NAME: entry}``.
        source: where the data came from, for messages.
        environ: the variables ``${VAR}`` references expand from.

    Raises:
        McpConfigError: naming the source, the server and the field.
    """
    env = os.environ if environ is None else environ
    if not isinstance(data, Mapping):
        raise McpConfigError(
            f'{source}: must be a JSON object ({{"mcpServers": {{...}}}} or {{"NAME": {{...}}}}), '
            f"got {type(data).__name__}",
            source=source,
        )
    servers: object = data.get("mcpServers", data)
    if not isinstance(servers, Mapping):
        raise McpConfigError(
            f"{source}: mcpServers must be an object of servers, got {type(servers).__name__}",
            source=source,
            field="mcpServers",
        )
    configs: list[McpServerConfig] = []
    for name, entry in servers.items():
        try:
            config = _entry(name, entry, env)
        except McpConfigError as exc:
            raise McpConfigError(f"{source}: {exc}", server=exc.server, field=exc.field, source=source) from None
        if config is not None:
            configs.append(config)
    return tuple(configs)


def _expand(server: str, field: str, value: object, environ: Mapping[str, str]) -> str:
    text = _check_text(server, field, value)

    def substitute(match: re.Match[str]) -> str:
        variable, default = match.group(1), match.group(2)
        found = environ.get(variable)
        if found is not None:
            return found
        if default is not None:
            return default
        raise _fail(
            server,
            field,
            f"the environment variable {variable} is not set (write ${{{variable}:-default}} to give a default)",
        )

    return _VARIABLE.sub(substitute, text)


def _expanded_map(server: str, field: str, value: object, environ: Mapping[str, str]) -> dict[str, str]:
    if not isinstance(value, Mapping):
        raise _fail(server, field, f"must be an object of strings, got {type(value).__name__}")
    return {str(key): _expand(server, f"{field}.{key}", item, environ) for key, item in value.items()}


def _entry(name: object, entry: object, environ: Mapping[str, str]) -> McpServerConfig | None:
    server = _check_name(name)
    if not isinstance(entry, Mapping):
        raise _fail(server, None, f"must be an object, got {type(entry).__name__} {entry!r:.80}")
    if "disabled" in entry and _check_flag(server, "disabled", entry["disabled"]):
        return None
    kind = entry.get("type")
    if kind is None:
        if "command" in entry and "url" in entry:
            raise _fail(server, None, 'has both "command" and "url"; give "type": "stdio" or "http"')
        if "command" in entry:
            kind = "stdio"
        elif "url" in entry:
            kind = "http"
        else:
            raise _fail(server, None, 'needs "command" (a stdio server) or "url" (a streamable HTTP server)')
    if kind == "sse":
        raise _fail(server, "type", 'the SSE transport is not supported; use "type": "http" (streamable HTTP)')
    common: dict[str, Any] = {}
    for field in ("startup_timeout", "call_timeout", "restart_window"):
        if field in entry:
            common[field] = _check_seconds(server, field, entry[field])
    if "max_restarts" in entry:
        common["max_restarts"] = _check_count(server, "max_restarts", entry["max_restarts"])
    if "requires_approval" in entry:
        common["requires_approval"] = _check_flag(server, "requires_approval", entry["requires_approval"])
    if kind == "stdio":
        if "url" in entry:
            raise _fail(server, "url", "a stdio server has no url (give a command)")
        if "command" not in entry:
            raise _fail(server, "command", "is required for a stdio server")
        args = entry.get("args", [])
        if not isinstance(args, list):
            raise _fail(server, "args", f"must be an array of strings, got {type(args).__name__}")
        cwd = entry.get("cwd")
        if "grace_period" in entry:
            common["grace_period"] = _check_seconds(server, "grace_period", entry["grace_period"])
        return McpStdioServer(
            name=server,
            command=_expand(server, "command", entry["command"], environ),
            args=tuple(_expand(server, f"args[{i}]", arg, environ) for i, arg in enumerate(args)),
            env=_expanded_map(server, "env", entry.get("env", {}), environ),
            cwd=None if cwd is None else _expand(server, "cwd", cwd, environ),
            **common,
        )
    if kind in _HTTP_TYPES:
        if "command" in entry:
            raise _fail(server, "command", "an HTTP server has no command (give a url)")
        if "url" not in entry:
            raise _fail(server, "url", "is required for an HTTP server")
        return McpHttpServer(
            name=server,
            url=_expand(server, "url", entry["url"], environ),
            headers=_expanded_map(server, "headers", entry.get("headers", {}), environ),
            **common,
        )
    raise _fail(server, "type", f'must be "stdio" or "http", got {kind!r:.80}')
