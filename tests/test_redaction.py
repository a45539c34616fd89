"""Credentials in URLs never reach messages, events, logs or the terminal (``redact_urls``).

The function itself is checked with Hypothesis; the places that show or store
a URL through the public surface: the model route in ``request/header`` and in
failures, the command line's "continue with" line and spec errors, MCP
configuration and start-up errors, the PostgreSQL DSN.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _postgres import Cluster, postgres_cluster
from _sse_server import DONE, Stream, closed_port, sse_finish, sse_text, start_server
from _util import WAIT
from hypothesis import given
from hypothesis import strategies as st

from trio_harness import McpConfigError, McpHttpServer, McpStartError, ModelError, load_mcp_config, open_harness
from trio_harness._redact import redact_urls
from trio_harness.model import resolve_model
from trio_harness.session import _events as ev
from trio_harness.session._postgres import redact_dsn

__all__ = ["postgres_cluster"]  # the fixture, imported for pytest

PASSWORD = "pa55w0rdXYZ"
QUERY_SECRET = "qs3cr3tXYZ"

# ------------------------------------------------------------------ the function

# Secrets carry a marker no other generated part can contain ("Q" is in no other alphabet).
_secret = st.text(alphabet="abcxyz0123-._~!$'()*+,:%", min_size=0, max_size=12).map(lambda s: f"Q{s}Q")
_host = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z]{2,5}){0,2}(:[0-9]{1,5})?", fullmatch=True)
_path = st.from_regex(r"(/[a-z0-9._~-]{0,8}){0,3}", fullmatch=True)
_key = st.from_regex(r"[a-z_]{1,8}", fullmatch=True)


@st.composite
def _url(draw: st.DrawFn) -> tuple[str, list[str], str, str]:
    scheme = draw(st.sampled_from(["http", "https", "postgresql", "git+ssh"]))
    secrets: list[str] = []
    userinfo = ""
    if draw(st.booleans()):
        user = draw(_secret)
        secrets.append(user)
        userinfo = user
        if draw(st.booleans()):
            password = draw(_secret) + draw(st.sampled_from(["", "@", "?", "#"]))  # raw '@?#' too
            secrets.append(password)
            userinfo += ":" + password
        userinfo += "@"
    host, path = draw(_host), draw(_path)
    url = f"{scheme}://{userinfo}{host}{path}"
    in_query = False
    for marker in draw(st.lists(st.sampled_from(["?", "&", "#"]), max_size=4)):
        if marker == "&" and not in_query:
            marker = "?"
        in_query = True
        value = draw(_secret)
        secrets.append(value)
        url += f"{marker}{draw(_key)}={value}" if draw(st.booleans()) else f"{marker}{value}"
    return url, secrets, host, path


@given(_url(), st.sampled_from(["{}", "at {} now", "'{}'", '"{}"', "url={}, next", "({})\n{} twice", "['{}', '{}']"]))
def test_redact_urls_never_leaks_userinfo_or_query_values(found: tuple[str, list[str], str, str], frame: str) -> None:
    url, secrets, host, path = found
    text = frame.format(url, url)
    redacted = redact_urls(text)
    assert "Q" not in redacted, (text, redacted)
    assert f"{host}{path}" in redacted  # what is not a credential stays readable
    if secrets:
        assert "***" in redacted
    assert redact_urls(redacted) == redacted  # redacting twice changes nothing more


@given(st.text().filter(lambda text: "://" not in text))
def test_redact_urls_leaves_text_without_urls_alone(text: str) -> None:
    assert redact_urls(text) == text


def test_redact_urls_examples() -> None:
    assert redact_urls("https://user:pass@host/v1?key=abc#t=1") == "https://***@host/v1?key=***#t=***"
    assert redact_urls("openai:m@http://u:p@127.0.0.1:8000/v1") == "openai:m@http://***@127.0.0.1:8000/v1"
    assert redact_urls("URL 'http://h/mcp?token=x' refused") == "URL 'http://h/mcp?token=***' refused"
    assert redact_urls("http://h/v1 and http://h/v2?flag") == "http://h/v1 and http://h/v2?***"
    # A PostgreSQL role is no credential, nor is where the server is.
    assert redact_dsn("postgresql://app:s3cret@db/x?sslmode=require&sslpassword=k") == (
        "postgresql://app:***@db/x?sslmode=require&sslpassword=***"
    )
    assert redact_dsn("postgresql://app@/x?host=/run/pg&port=5433") == "postgresql://app@/x?host=/run/pg&port=5433"
    assert (
        redact_urls("http://u:p@h/?Host=a#host=b", keep_user=True, keep_query=("host",))
        == "http://u:***@h/?Host=a#host=***"
    )
    assert redact_dsn("host=db password='s3 cret' user=app") == "host=db password=*** user=app"


# ------------------------------------------------------------------ the command line


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    env.update(extra)
    return env


async def cli(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            env=env if env is not None else cli_env(),
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


async def test_run_with_a_password_in_the_base_url_prints_and_logs_none(tmp_path: Path, nursery: trio.Nursery) -> None:
    server = await start_server(nursery, Stream([sse_text("hello there"), sse_finish("stop"), DONE]))
    spec = f"openai:m@http://user:{PASSWORD}@127.0.0.1:{server.port}/v1?temperature=0.5"
    store = tmp_path / "store"
    result = await cli("run", "--model", spec, "--store", str(store), "--tools", "none", "hi", cwd=tmp_path)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err
    assert "hello there" in out
    # The "continue with" line: the route's settings stay, so the command still runs.
    assert f"--model 'openai:m@http://***@127.0.0.1:{server.port}/v1?temperature=0.5'" in err
    log = next(store.glob("*/session.jsonl")).read_text(encoding="utf-8")
    headers = [json.loads(line) for line in log.splitlines() if '"request/header"' in line]
    assert headers and headers[0]["provider"] == f"openai:m@http://***@127.0.0.1:{server.port}/v1"
    for where in (out, err, log):
        assert PASSWORD not in where
    assert server.requests  # the credentials were still used: the request reached the server


async def test_a_bad_spec_with_credentials_is_reported_redacted(tmp_path: Path) -> None:
    spec = f"openai:m@http://user:{PASSWORD}@127.0.0.1:9/v1?key={QUERY_SECRET}"
    result = await cli("run", "--model", spec, "--store", str(tmp_path / "store"), "hi", cwd=tmp_path)
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "unknown parameter 'key'" in err and "http://***@127.0.0.1:9/v1?key=***" in err
    assert PASSWORD not in err and QUERY_SECRET not in err
    with pytest.raises(ModelError) as info:
        resolve_model(f"openai:m@ftp://user:{PASSWORD}@host/v1")
    assert PASSWORD not in str(info.value) and "ftp://***@host/v1" in str(info.value)


async def test_a_connection_failure_names_the_route_without_its_password(tmp_path: Path) -> None:
    provider = resolve_model(f"openai:m@http://user:{PASSWORD}@127.0.0.1:{closed_port()}/v1", env={})
    provider.max_retries = 0  # type: ignore[attr-defined]
    assert PASSWORD not in repr(provider)
    async with open_harness(model=provider, builtin_tools=False) as h, h.agents.open() as agent:
        agent.followup("hi")
        with trio.fail_after(WAIT):
            await agent.when_idle()
        events = agent.session.events
    end = [e for e in events if isinstance(e, ev.TurnEnd)][-1]
    assert end.reason == "error" and end.failure is not None
    assert "http://***@127.0.0.1" in end.failure.message
    assert PASSWORD not in repr(events)


# ------------------------------------------------------------------ MCP


def http_config(tmp_path: Path) -> Path:
    path = tmp_path / "mcp.json"
    url = f"http://127.0.0.1:{closed_port()}/mcp?token=${{TRACKER_TOKEN}}"
    path.write_text(json.dumps({"tracker": {"type": "http", "url": url, "startup_timeout": 10}}), encoding="utf-8")
    return path


http_iterators = pytest.mark.filterwarnings(
    r"ignore:Async generator 'httpx2\.:ResourceWarning", r"ignore:Async generator 'httpcore2\.:ResourceWarning"
)


@http_iterators
async def test_an_http_server_that_fails_to_start_is_named_redacted(tmp_path: Path) -> None:
    servers = load_mcp_config(http_config(tmp_path), environ={"TRACKER_TOKEN": QUERY_SECRET})
    assert isinstance(servers[0], McpHttpServer) and QUERY_SECRET in servers[0].url  # expanded: the token is sent
    assert QUERY_SECRET not in repr(servers[0])
    with pytest.raises(McpStartError) as info:
        async with open_harness(builtin_tools=False, mcp_servers=servers):
            pass
    message = str(info.value)
    assert message.startswith("MCP server 'tracker' (http://127.0.0.1:") and "/mcp?token=***)" in message
    assert QUERY_SECRET not in message


@http_iterators
async def test_the_cli_names_a_failing_http_server_redacted(tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "never"}]}), encoding="utf-8")
    args: list[Any] = ["run", "--model", f"scripted:{script}", "--store", str(tmp_path / "store")]
    result = await cli(
        *args,
        "--mcp-config",
        str(http_config(tmp_path)),
        "hi",
        cwd=tmp_path,
        env=cli_env(TRACKER_TOKEN=QUERY_SECRET),
    )
    err = result.stderr.decode()
    assert result.returncode == 2, err
    assert "MCP server 'tracker'" in err and "token=***" in err
    assert QUERY_SECRET not in err and QUERY_SECRET not in result.stdout.decode()


def test_a_bad_mcp_url_is_reported_redacted() -> None:
    with pytest.raises(McpConfigError) as info:
        McpHttpServer("x", f"ftp://user:{PASSWORD}@host/mcp?token={QUERY_SECRET}")
    assert "ftp://***@host/mcp?token=***" in str(info.value)
    assert PASSWORD not in str(info.value) and QUERY_SECRET not in str(info.value)
    server = McpHttpServer("x", "http://host/mcp", headers={"Authorization": f"Bearer {QUERY_SECRET}"})
    assert QUERY_SECRET not in repr(server) and "'Authorization': '***'" in repr(server)


# ------------------------------------------------------------------ the PostgreSQL store's URL


async def test_the_continue_line_of_a_postgresql_store_hides_its_password(
    tmp_path: Path, postgres_cluster: Cluster
) -> None:
    database = f"redact_{os.getpid()}"
    postgres_cluster.psql(f"CREATE DATABASE {database}")
    plain = postgres_cluster.dsn(database)  # the cluster trusts local connections: the password is not checked
    dsn = plain.replace("@/", f":{PASSWORD}@/", 1)
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": [{"text": "stored"}]}), encoding="utf-8")
    result = await cli("run", "--model", f"scripted:{script}", "--store", dsn, "hi", cwd=tmp_path)
    out, err = result.stdout.decode(), result.stderr.decode()
    assert result.returncode == 0, err
    assert "stored" in out
    shown = plain.replace("@/", ":***@/", 1)  # the role, host and port stay: they say where the sessions are
    assert f"--store '{shown}'" in err
    assert PASSWORD not in out + err
