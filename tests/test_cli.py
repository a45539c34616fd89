"""The ``trio-harness`` command line, run as a real subprocess (``python -m trio_harness``)."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import WAIT

from trio_harness import ScriptedModel, _cli, _cli_sessions, open_harness
from trio_harness.agents import TurnOutcome
from trio_harness.events import InboxMessage
from trio_harness.model import Failure
from trio_harness.session import JsonlStore, SessionHeader
from trio_harness.session import _events as ev
from trio_harness.testing import assert_balanced


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    env.update(extra)
    return env


async def cli(
    *args: str, cwd: Path, env: dict[str, str] | None = None, stdin: bytes = b""
) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            env=env if env is not None else cli_env(),
            stdin=stdin,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )


def script(tmp_path: Path, responses: list[dict[str, Any]], name: str = "script.json") -> str:
    path = tmp_path / name
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


def session_line(stderr: bytes) -> str:
    for line in stderr.decode().splitlines():
        if line.startswith("[session] "):
            return line.split(" ", 1)[1]
    raise AssertionError(f"no [session] line in {stderr!r}")


@pytest.mark.parametrize(
    "command",
    [[], ["acp"], ["run"], ["sessions"], ["sessions", "list"], ["sessions", "show"]],
)
async def test_help_of_each_subcommand(tmp_path: Path, command: list[str]) -> None:
    result = await cli(*command, "--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.startswith(f"usage: trio-harness {' '.join(command)}".rstrip())
    if command and command != ["sessions"]:
        assert "--store DIR" in out
    if command in (["acp"], ["run"]):
        # Every spec form is listed where a model is used ...
        assert "--model SPEC" in out
        flat = " ".join(out.split())
        for form in ("deepseek:", "openai:MODEL ", "openai:MODEL@BASE_URL", "scripted:", "replay:"):
            assert form in flat
    elif command[:1] == ["sessions"]:
        # ... and --model is not offered where none is used.
        assert "--model" not in out


async def test_run_streams_the_answer_and_shows_tool_calls(tmp_path: Path) -> None:
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "task_list", "arguments": {}},
                    {
                        "name": "bash",
                        "arguments": {"command": "echo hi", "run_in_background": False},
                    },
                ]
            },
            {"text": "The answer is 42."},
        ],
    )
    store = tmp_path / "store"
    result = await cli("run", "what is the answer?", "--model", model, "--store", str(store), "--yes", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "The answer is 42.\n"
    err = result.stderr.decode().splitlines()
    session_id = session_line(result.stderr)
    assert "[tool] task_list {}" in err
    assert '[tool] bash {"command": "echo hi", "run_in_background": false}' in err
    assert "[tool result] hi" in err
    assert err.index("[tool] task_list {}") < err.index("[tool result] hi")
    loaded = await JsonlStore(store).load(session_id)
    assert_balanced(loaded.events)
    assert loaded.header.cwd == str(tmp_path)


async def test_run_exit_codes_for_errors_and_limits(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    failing = script(tmp_path, [{"error": {"message": "the provider is overloaded", "code": "http-529"}}])
    result = await cli("run", "hello", "--model", failing, "--store", store, cwd=tmp_path)
    assert result.returncode == 1
    assert "the provider is overloaded (http-529)" in result.stderr.decode()
    looping = script(tmp_path, [{"tool_calls": [{"name": "task_list", "arguments": {}}]}] * 3, "loop.json")
    result = await cli("run", "loop", "--model", looping, "--store", store, "--max-steps", "2", cwd=tmp_path)
    assert result.returncode == 3, result.stderr
    assert "[stopped]" in result.stderr.decode()


async def test_run_resumes_a_session_and_sessions_commands_read_the_store(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    first = script(
        tmp_path,
        [{"tool_calls": [{"name": "task_list", "arguments": {}}]}, {"text": "First answer."}],
        "first.json",
    )
    result = await cli("run", "first question", "--model", first, "--store", store, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    session_id = session_line(result.stderr)
    second = script(tmp_path, [{"text": "Second answer."}], "second.json")
    result = await cli(
        "run",
        "second question",
        "--session",
        session_id,
        "--model",
        second,
        "--store",
        store,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "Second answer.\n"
    assert session_line(result.stderr) == session_id

    # sessions never need a model: a bad $TRIO_HARNESS_MODEL is not even looked at
    listed = await cli("sessions", "list", "--store", store, cwd=tmp_path, env=cli_env(TRIO_HARNESS_MODEL="nonsense"))
    assert listed.returncode == 0, listed.stderr
    lines = listed.stdout.decode().splitlines()
    assert lines[0].split() == ["ID", "CREATED", "EVENTS", "LAST", "ACTIVITY", "FIRST", "PROMPT"]
    row = next(line for line in lines if line.startswith(session_id))
    assert row.endswith("first question")
    events = (await JsonlStore(Path(store)).load(session_id)).events
    assert f"  {len(events)}  " in row

    shown = await cli("sessions", "show", session_id, "--store", store, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    text = shown.stdout.decode()
    assert f"session {session_id}" in text
    expected = [
        "=== turn 1 ===",
        "user: first question",
        "  [tool] task_list {}",
        "  [tool result]",
        "assistant: First answer.",
        "--- turn 1 ended: completed ---",
        "=== turn 2 ===",
        "user: second question",
        "assistant: Second answer.",
        "--- turn 2 ended: completed ---",
    ]
    position = 0
    for piece in expected:
        found = text.find(piece, position)
        assert found >= 0, f"{piece!r} missing after position {position} in:\n{text}"
        position = found + len(piece)


async def test_sessions_show_truncates_long_tool_output(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {
                        "name": "bash",
                        "arguments": {"command": "seq 1 3000", "run_in_background": False},
                    }
                ]
            },
            {"text": "done"},
        ],
    )
    result = await cli("run", "count", "--model", model, "--store", store, "--yes", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    session_id = session_line(result.stderr)
    tool_lines = [line for line in result.stderr.decode().splitlines() if line.startswith("[tool result]")]
    assert len(tool_lines[0]) <= len("[tool result] ") + 200
    shown = await cli("sessions", "show", session_id, "--store", store, "--width", "100", cwd=tmp_path)
    lines = shown.stdout.decode().splitlines()
    start = next(index for index, line in enumerate(lines) if "[tool result]" in line)
    assert lines[start] == "  [tool result]"  # the output's lines, indented under it, cut to 100 characters
    body = list(itertools.takewhile(lambda line: line.startswith("    "), lines[start + 1 :]))
    assert body[:3] == ["    1", "    2", "    3"] and body[-1].endswith("…")
    assert len("\n".join(line[4:] for line in body)) <= 100


def test_sessions_show_keeps_the_lines_of_a_tool_result() -> None:
    header = SessionHeader(id="s", created_at=0.0)
    events = [
        ev.ToolResult(seq=0, ts=0.0, turn=1, step=1, call_id="c1", name="t", content="one line", is_error=False),
        ev.ToolResult(seq=1, ts=0.0, turn=1, step=1, call_id="c2", name="t", content="a\n  b\n\nc\n", is_error=True),
        ev.ToolResult(
            seq=2, ts=0.0, turn=1, step=1, call_id="c3", name="t", content="x" * 30 + "\n" + "y" * 30, is_error=False
        ),
    ]
    lines = _cli_sessions.transcript(header, events, width=40)
    assert lines[-9:] == [
        "  [tool result] one line",
        "  [tool error]",
        "    a",
        "      b",
        "",
        "    c",
        "  [tool result]",
        "    " + "x" * 30,
        "    " + "y" * 8 + "…",
    ]


async def test_sessions_show_labels_task_notices(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model = ScriptedModel([{"text": "hello"}, {"text": "noted"}])
    async with open_harness(model=model, store=store) as harness, harness.agents.open() as agent:
        await agent.run("hi there")
        notice = 'background task bash-1 [bash] completed (exit code 0) — make. Use task_output("bash-1") to read.'
        agent.followup(InboxMessage(id="n1", text=notice, origin="task-notice"))
        await agent.when_idle()
        session_id = agent.id
    shown = await cli("sessions", "show", session_id, "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    assert "user: hi there" in lines
    assert f"notice: {notice}" in lines
    assert not any(line.startswith("user: background task") for line in lines)


async def test_unknown_sessions_are_usage_errors(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    shown = await cli("sessions", "show", "nope", "--store", store, cwd=tmp_path)
    assert shown.returncode == 2
    assert "nope" in shown.stderr.decode()
    model = script(tmp_path, [{"text": "x"}])
    resumed = await cli("run", "hi", "--session", "nope", "--model", model, "--store", store, cwd=tmp_path)
    assert resumed.returncode == 2
    assert "nope" in resumed.stderr.decode()
    empty = await cli("sessions", "list", "--store", store, cwd=tmp_path)
    assert empty.returncode == 0
    assert "no sessions" in empty.stdout.decode()


@pytest.mark.parametrize(
    ("spec", "expected", "command"),
    [
        ("nonsense", "unknown model spec 'nonsense'", "run"),
        ("nonsense", "unknown model spec 'nonsense'", "acp"),
        ("deepseek:deepseek-chat", "DEEPSEEK_API_KEY", "run"),
        # acp without the key answers the handshake and asks for it (tests/test_acp_sdk.py).
        ("scripted:/no/such/script.json", "does not exist", "run"),
        ("scripted:/no/such/script.json", "does not exist", "acp"),
    ],
)
async def test_bad_model_exits_2_with_one_line(tmp_path: Path, spec: str, expected: str, command: str) -> None:
    args = ["run", "hello"] if command == "run" else ["acp"]
    result = await cli(*args, "--model", spec, "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1
    assert err.startswith("trio-harness: error: ")
    assert expected in err
    assert result.stdout == b""


async def test_default_model_comes_from_the_environment(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "from the env"}])
    env = cli_env(TRIO_HARNESS_MODEL=model)
    result = await cli("run", "hi", "--store", str(tmp_path / "store"), cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout.decode() == "from the env\n"


async def test_ctrl_c_cancels_the_turn_cleanly(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model = script(tmp_path, [{"hang": True}])
    process = await trio.lowlevel.open_process(
        [
            sys.executable,
            "-m",
            "trio_harness",
            "run",
            "wait",
            "--model",
            model,
            "--store",
            str(store),
        ],
        cwd=tmp_path,
        env=cli_env(),
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert process.stderr is not None
    stderr = b""
    try:
        with trio.fail_after(WAIT):
            while b"[session]" not in stderr:
                data = await process.stderr.receive_some()
                assert data, stderr
                stderr += data
            process.send_signal(signal.SIGINT)
            while data := await process.stderr.receive_some():
                stderr += data
            code = await process.wait()
    finally:
        if process.returncode is None:
            process.kill()
            await process.wait()
    assert code == 130, stderr
    assert b"[cancelling" in stderr
    session_id = session_line(stderr)
    events = (await JsonlStore(store).load(session_id)).events
    assert_balanced(events)
    end = events[-1]
    assert isinstance(end, ev.TurnEnd)
    assert (end.reason, end.cause) == ("aborted", "user")


@pytest.mark.parametrize(
    ("end", "interrupted", "code", "stderr"),
    [
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="completed"), False, 0, ""),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="max-tokens"), False, 3, "[stopped] the model hit its token limit"),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="blocked"), False, 3, "[stopped] the turn hit max_steps"),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="aborted", cause="user"), True, 130, ""),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="aborted", cause="hook"), False, 1, "the turn was cancelled"),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="interrupted"), False, 1, "the turn was cancelled"),
        (None, False, 1, "the turn was cancelled"),  # the message never ran
        (None, True, 130, ""),
        (
            ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="error", failure=Failure("http-529", "overloaded")),
            False,
            1,
            "overloaded (http-529)",
        ),
        (
            ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="error", failure=Failure("refusal", "I will not")),
            False,
            1,
            "I will not (refusal)",
        ),
        (ev.TurnEnd(seq=0, ts=0.0, turn=1, reason="error"), False, 1, "the turn failed without details (unknown)"),
    ],
)
def test_run_maps_how_the_turn_ended_to_an_exit_code(
    end: ev.TurnEnd | None, interrupted: bool, code: int, stderr: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command reads the turn's end itself (no ACP stop reasons involved)."""
    assert _cli._exit_code(TurnOutcome(end), interrupted=interrupted) == code
    assert stderr in capsys.readouterr().err
    assert _cli._exit_code(None, interrupted=interrupted) == (130 if interrupted else 1)


async def test_run_sandbox_confines_bash_to_the_working_directory(tmp_path: Path) -> None:
    calls = [
        {"name": "bash", "arguments": {"command": "echo made > made.txt"}},
        {"name": "bash", "arguments": {"command": "touch /etc/trio-harness-sandbox-test"}},
    ]
    model = script(tmp_path, [{"tool_calls": calls}, {"text": "done"}])
    result = await cli(
        "run", "go", "--sandbox", "--yes", "--model", model, "--store", str(tmp_path / "store"), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "made.txt").read_text() == "made\n"
    assert "Read-only file system" in result.stderr.decode()
    assert not os.path.exists("/etc/trio-harness-sandbox-test")


@pytest.mark.parametrize("command", ["run", "acp"])
async def test_sandbox_without_bwrap_exits_2_naming_the_cause(tmp_path: Path, command: str) -> None:
    model = script(tmp_path, [{"text": "never"}])
    args = [command, "--sandbox", "--model", model, "--store", str(tmp_path / "store")]
    result = await cli(*args, *(["hi"] if command == "run" else []), cwd=tmp_path, env=cli_env(PATH=str(tmp_path)))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.startswith("trio-harness: error: the bash sandbox needs bubblewrap")
    assert "apt-get install bubblewrap" in err and "Traceback" not in err
    assert len(err.splitlines()) == 1


# ---------------------------------------------------------------- the first hour (docs/cli.rst)


def run_on_a_terminal(args: list[str], cwd: Path, env: dict[str, str]) -> tuple[int, bytes, bytes]:
    """Run the command with stderr on a pseudo-terminal (stdout a pipe); returns (code, stdout, terminal)."""
    import pty

    master, slave = pty.openpty()
    try:
        process = subprocess.Popen(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=slave,
        )
        os.close(slave)
        slave = -1
        stdout, _ = process.communicate(timeout=WAIT)
        terminal = b""
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the terminal's other side is closed and drained
                break
            if not data:
                break
            terminal += data
        return process.returncode, stdout, terminal
    finally:
        os.close(master)
        if slave >= 0:
            os.close(slave)


def test_run_on_a_terminal_shows_progress_and_erases_it(tmp_path: Path) -> None:
    model = script(
        tmp_path,
        [
            {"reasoning": "pondering", "tool_calls": [{"name": "bash", "arguments": {"command": "true"}}]},
            {"text": "Done."},
        ],
    )
    args = ["run", "go", "--model", model, "--store", str(tmp_path / "store"), "--yes"]
    code, stdout, terminal = run_on_a_terminal(args, tmp_path, cli_env())
    assert code == 0, terminal
    assert stdout == b"Done.\n"  # the answer stays clean
    text = terminal.decode()
    erase = "\r\x1b[2K"
    for status in ("waiting for the model", "thinking", "running tool bash"):
        assert status in text, text
    # Every status line is erased before anything else is written: what stays
    # visible of each line (after its last erase) never shows a status.
    for line in text.replace("\r\n", "\n").split("\n"):
        assert "… " not in line.rsplit(erase, 1)[-1], repr(line)
    assert "\x1b[36m[tool] bash" in text  # colour on a terminal
    assert "pondering" not in text  # reasoning only on request

    shown_code, _, shown = run_on_a_terminal([*args, "--show-reasoning"], tmp_path, cli_env())
    assert shown_code == 0
    # Streamed in chunks, each dimmed.
    assert "\x1b[2mpon" in shown.decode()
    assert "pondering" in re.sub("\x1b\\[[0-9]*m", "", shown.decode())

    _, _, plain = run_on_a_terminal(args, tmp_path, cli_env(NO_COLOR="1"))
    assert "\x1b[36m" not in plain.decode() and "\x1b[2m" not in plain.decode()

    _, quiet_out, quiet = run_on_a_terminal([*args, "--quiet"], tmp_path, cli_env())
    assert quiet_out == b"Done.\n"
    assert quiet == b"", quiet


async def test_run_without_a_terminal_writes_no_status_or_colour(tmp_path: Path) -> None:
    model = script(tmp_path, [{"reasoning": "pondering", "text": "Done."}])
    result = await cli("run", "go", "--model", model, "--store", str(tmp_path / "store"), cwd=tmp_path)
    assert result.returncode == 0
    assert b"\x1b" not in result.stderr and b"waiting for the model" not in result.stderr
    shown = await cli(
        "run", "go", "--model", model, "--store", str(tmp_path / "store"), "--show-reasoning", cwd=tmp_path
    )
    assert b"pondering" in shown.stderr and b"\x1b" not in shown.stderr
    assert shown.stdout == b"Done.\n"


async def test_status_line_names_a_retry_reason_first_and_counts_the_wait_down(autojump_clock: object) -> None:
    import io

    from trio_harness._cli_progress import Printer

    err = io.StringIO()
    printer = Printer(io.StringIO(), err, status=True, max_retries=4)
    printer.event(
        ev.RequestRetry(seq=0, ts=0.0, turn=1, step=1, attempt=2, delay=3.0, failure=Failure("http-529", "overloaded"))
    )
    assert err.getvalue() == "\r\x1b[2K… overloaded (http-529): retry 2 of 4 in 3s"
    await trio.sleep(1.2)
    printer.tick()
    assert err.getvalue().endswith("\r\x1b[2K… overloaded (http-529): retry 2 of 4 in 2s")
    await trio.sleep(1.0)
    printer.tick()
    assert err.getvalue().endswith("\r\x1b[2K… overloaded (http-529): retry 2 of 4 in 0.8s")
    printer.event(ev.AssistantChunk(seq=0, ts=0.0, turn=1, step=1, kind="text", text="hi"))
    size = len(err.getvalue())
    await trio.sleep(0.5)
    printer.tick()  # the countdown ended with the wait: nothing is redrawn
    assert len(err.getvalue()) == size
    assert err.getvalue().endswith("\r\x1b[2K")  # erased before the answer streams


async def test_run_reads_the_prompt_from_stdin_when_none_is_given(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "piped"}])
    store = tmp_path / "store"
    result = await cli("run", "--model", model, "--store", str(store), cwd=tmp_path, stdin=b"hi from a pipe\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout == b"piped\n"
    events = (await JsonlStore(store).load(session_line(result.stderr))).events
    assert any(isinstance(e, ev.UserMessage) and e.text == "hi from a pipe\n" for e in events)


async def test_run_ends_with_the_line_that_resumes_the_session(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    model = script(tmp_path, [{"text": "ok"}])
    result = await cli("run", "hi", "--model", model, "--store", store, cwd=tmp_path)
    session_id = session_line(result.stderr)
    last = result.stderr.decode().splitlines()[-1]
    assert (
        last
        == f"[session] continue with: trio-harness run --session {session_id} --store {store} --model {model} PROMPT"
    )
    quiet = await cli("run", "hi", "--model", model, "--store", store, "--quiet", cwd=tmp_path)
    assert quiet.stderr == b"" and quiet.stdout == b"ok\n"


async def test_a_failed_model_call_keeps_the_session_and_says_how_to_retry(tmp_path: Path) -> None:
    store = tmp_path / "store"
    failing = script(tmp_path, [{"error": {"message": "overloaded", "code": "http-529"}}], "failing.json")
    result = await cli("run", "hi", "--model", failing, "--store", str(store), cwd=tmp_path)
    assert result.returncode == 1
    session_id = session_line(result.stderr)
    err = result.stderr.decode()
    assert "overloaded (http-529)" in err
    assert (
        f"[session] kept session {session_id}; retry or continue with: trio-harness run --session {session_id}" in err
    )
    # The kept session is retried with --session: the prompt is there, the new answer follows it.
    working = script(tmp_path, [{"text": "better"}], "working.json")
    retried = await cli(
        "run", "again", "--session", session_id, "--model", working, "--store", str(store), cwd=tmp_path
    )
    assert retried.returncode == 0 and retried.stdout == b"better\n"


@pytest.mark.parametrize("action", [["list"], ["show", "abc"]])
async def test_sessions_with_a_store_that_is_a_file_is_one_line_exit_2(tmp_path: Path, action: list[str]) -> None:
    store = tmp_path / "file"
    store.write_text("x")
    result = await cli("sessions", *action, "--store", str(store), cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and "is not a directory" in err, err


@pytest.mark.parametrize("kind", ["regular file", "unwritable"])
async def test_run_refuses_a_bad_store_before_the_model_is_called(tmp_path: Path, kind: str) -> None:
    if kind == "regular file":
        store = tmp_path / "file"
        store.write_text("x")
    else:
        store = Path("/proc/trio-harness-test-store")  # nothing can be made in /proc, not even by root
    # The model would fail the test if called: a script with no responses left.
    model = script(tmp_path, [])
    result = await cli("run", "hi", "--model", model, "--store", str(store), cwd=tmp_path)
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("\n") == 1 and err.startswith("trio-harness: error: the session store"), err
    assert ("not a directory" if kind == "regular file" else "not writable") in err
    assert result.stdout == b""


async def test_sessions_show_accepts_a_unique_prefix_and_lists_an_ambiguous_one(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model = script(tmp_path, [{"text": "one"}, {"text": "two"}])
    ids = []
    for _ in range(2):
        result = await cli("run", "hi", "--model", model, "--store", str(store), cwd=tmp_path)
        ids.append(session_line(result.stderr))
    # Make the prefixes deterministic: rename the two sessions.
    for old, new in zip(ids, ["aa11", "aa22"], strict=True):
        (store / old).rename(store / new)
        log = store / new / "session.jsonl"
        log.write_text(log.read_text().replace(old, new))
    shown = await cli("sessions", "show", "aa1", "--store", str(store), cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.decode().startswith("session aa11\n")
    ambiguous = await cli("sessions", "show", "aa", "--store", str(store), cwd=tmp_path)
    assert ambiguous.returncode == 2
    err = ambiguous.stderr.decode()
    assert err.count("\n") == 1 and "aa11" in err and "aa22" in err and "ambiguous" in err


async def test_run_shows_the_plan_whole_even_when_quiet(tmp_path: Path) -> None:
    todos = [
        {"content": "Read the code", "status": "completed", "priority": "high"},
        {"content": "Fix it", "status": "in_progress", "priority": "medium"},
    ]
    model = script(tmp_path, [{"tool_calls": [{"name": "todo_write", "arguments": {"todos": todos}}]}, {"text": "ok"}])
    store = str(tmp_path / "store")
    result = await cli("run", "plan it", "--model", model, "--store", store, "--quiet", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stderr.decode().splitlines() == ["[plan]", "  [x] Read the code (high)", "  [~] Fix it"]


async def test_only_acp_takes_several_models(tmp_path: Path) -> None:
    model = script(tmp_path, [{"text": "ok"}])
    result = await cli("run", "hi", "--model", model, "--model", model, cwd=tmp_path)
    assert result.returncode == 2
    assert b"run takes one --model (only acp offers several)" in result.stderr
