"""What ``trio-harness run`` and ``sessions`` write to a terminal (docs/cli.rst, "What reaches the terminal").

Every run is a real subprocess (``python -m trio_harness``); a terminal is a
real pseudo-terminal (:mod:`pty`), a pipe is a pipe.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from _util import APPROVAL_PROMPT, WAIT, cli_on_a_terminal
from hypothesis import given
from hypothesis import strategies as st

from trio_harness import BashRuntimeOptions
from trio_harness._cli_progress import KEPT_CONTROLS, inert
from trio_harness.bash import SandboxPolicy
from trio_harness.session import JsonlStore, SessionRegistry
from trio_harness.session import _events as ev

PROMPT = APPROVAL_PROMPT
# An attacker's command: erases the question line and draws a harmless-looking one.
FORGED = "touch pwned #\x1b[2K\x1b[1A\r[approve] bash: ls -la"
OSC52 = "\x1b]52;c;cHduZWQ=\x07"  # sets the clipboard
BIDI = "\u202e"


def cli_env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    env.update(NO_COLOR="1", COLUMNS="80", **extra)
    return env


def script(tmp_path: Path, responses: list[dict[str, Any]]) -> str:
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


def bash(command: str, **extra: Any) -> dict[str, Any]:
    return {"tool_calls": [{"name": "bash", "arguments": {"command": command, **extra}}]}


async def on_a_terminal(tmp_path: Path, args: list[str], answers: Sequence[str] = ()) -> tuple[int, str]:
    """Run ``trio-harness ARGS`` with stdout and stderr on a pty, answering each approval question."""
    code, shown, _ = await cli_on_a_terminal(args, cwd=tmp_path, env=cli_env(), answers=answers)
    return code, shown


async def piped(tmp_path: Path, *args: str) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [sys.executable, "-m", "trio_harness", *args],
            cwd=tmp_path,
            env=cli_env(),
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            start_new_session=True,
        )


def stored_id(store: Path) -> str:
    (only,) = [p.name for p in store.iterdir() if p.is_dir()]
    return only


# ---------------------------------------------------------------- inert (21.8)


# Every code point can occur (surrogates included); the dangerous ones often.
DANGEROUS = [chr(c) for c in (*range(0x00, 0x20), *range(0x7F, 0xA0), 0x61C, 0x200E, 0x200F)]
DANGEROUS += [chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0xD800, 0xDFFF)]
CHARACTERS = st.one_of(st.sampled_from(DANGEROUS), st.characters(), st.integers(0, 0x10FFFF).map(chr))


@given(st.text(alphabet=CHARACTERS))
def test_inert_output_never_holds_a_control_bidi_or_surrogate_character(text: str) -> None:
    shown = inert(text)
    for char in shown:
        code = ord(char)
        assert char in KEPT_CONTROLS or not (code < 0x20 or 0x7F <= code <= 0x9F), repr(shown)
        assert not (0x202A <= code <= 0x202E or 0x2066 <= code <= 0x2069 or char in "\u200e\u200f\u061c")
        assert not 0xD800 <= code <= 0xDFFF
    shown.encode("utf-8")  # writable to any UTF-8 terminal
    assert shown.count("\n") == text.count("\n") and shown.count("\t") == text.count("\t")
    if all(char in KEPT_CONTROLS or char.isprintable() for char in text):
        assert shown == text  # plain text is untouched


def test_inert_shows_what_it_escaped() -> None:
    assert inert("a\x1b[2Kb\x07\x7f\x9b\r\n\tc") == "a\\x1b[2Kb\\x07\\x7f\\x9b\\x0d\n\tc"
    assert inert(f"x{BIDI}y\u2066z\ud800") == "x\\u202ey\\u2066z\\ud800"


async def test_on_a_terminal_model_and_tool_text_is_inert_and_a_pipe_gets_it_exact(tmp_path: Path) -> None:
    answer = f"the answer{OSC52}\x1b]0;title\x07 {BIDI}txt.exe"
    tool = "printf 'out\\033]52;c;aGk=\\007\\n'; printf 'err\\033[1A\\n' >&2"
    model = script(tmp_path, [bash(tool), {"text": answer}])
    store = str(tmp_path / "store")
    code, shown = await on_a_terminal(tmp_path, ["run", "go", "--model", model, "--store", store, "--yes"])
    assert code == 0, shown
    assert "\x1b]" not in shown and "\x1b[1A" not in shown and BIDI not in shown and "\x07" not in shown
    assert "the answer\\x1b]52;c;cHduZWQ=\\x07\\x1b]0;title\\x07 \\u202etxt.exe" in shown
    assert "out\\x1b]52;c;aGk=\\x07" in shown and "err\\x1b[1A" in shown  # the tool result, escaped
    session = stored_id(tmp_path / "store")
    code, transcript = await on_a_terminal(tmp_path, ["sessions", "show", session[:8], "--store", store])
    assert code == 0 and "\x1b]" not in transcript and "\\x1b]52;c;cHduZWQ=" in transcript

    # Into a file or a pipe: exact.
    quiet = await piped(tmp_path, "run", "go", "--model", model, "--store", store, "--yes", "-q")
    assert quiet.returncode == 0 and quiet.stdout.decode() == answer + "\n"
    raw = await piped(tmp_path, "sessions", "show", session, "--store", store)
    assert OSC52 in raw.stdout.decode()


async def test_the_approval_question_cannot_be_redrawn_by_the_command(tmp_path: Path) -> None:
    model = script(tmp_path, [bash(FORGED), {"text": "done"}])
    code, shown = await on_a_terminal(
        tmp_path, ["run", "go", "--model", model, "--store", str(tmp_path / "store")], ["n"]
    )
    assert code == 0, shown
    assert "\x1b[2K\x1b[1A" not in shown
    assert "    touch pwned #\\x1b[2K\\x1b[1A\\x0d[approve] bash: ls -la\nallow? " in shown
    assert not (tmp_path / "pwned").exists()


# ---------------------------------------------------------------- the question (21.9)


async def test_the_approval_question_shows_the_whole_command_its_directory_and_background(tmp_path: Path) -> None:
    (tmp_path / "sub").mkdir()
    long = "echo " + "x" * 250 + "; touch pwned"
    model = script(
        tmp_path,
        [
            {
                "tool_calls": [
                    {"name": "bash", "arguments": {"command": long}},
                    {"name": "bash", "arguments": {"command": "ls\nrm -rf y", "workdir": str(tmp_path / "sub")}},
                    {"name": "bash", "arguments": {"command": "sleep 1", "run_in_background": True}},
                ]
            },
            {"text": "done"},
        ],
    )
    code, shown = await on_a_terminal(
        tmp_path, ["run", "go", "--model", model, "--store", str(tmp_path / "store")], ["n", "n", "n"]
    )
    assert code == 0, shown
    # Wrapped at the terminal's width (COLUMNS=80): 76 characters a line, continued with "  ↪ ".
    pieces = [long[i : i + 76] for i in range(0, len(long), 76)]
    wrapped = "\n".join(["    " + pieces[0], *("  ↪ " + piece for piece in pieces[1:])])
    assert f"[approve] bash in {tmp_path}:\n{wrapped}\nallow? " in shown
    assert f"[approve] bash in {tmp_path / 'sub'}:\n    ls\n    rm -rf y\nallow? " in shown
    assert f"[approve] bash in {tmp_path}, in the background:\n    sleep 1\nallow? " in shown


# ---------------------------------------------------------------- tool results (22.20)


async def test_tool_results_keep_their_lines_and_a_long_one_says_what_was_cut(tmp_path: Path) -> None:
    model = script(
        tmp_path,
        [bash("echo one; echo two; echo oops >&2; exit 3"), bash("seq 1 40"), bash("echo single"), {"text": "ok"}],
    )
    result = await piped(tmp_path, "run", "go", "--model", model, "--store", str(tmp_path / "store"), "--yes")
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert "[tool error]\n  one\n  two\n  [stderr]\n  oops\n  [exit code: 3]\n" in err
    head = "".join(f"  {n}\n" for n in range(1, 16))
    tail = "".join(f"  {n}\n" for n in range(36, 41))
    hidden = sum(len(str(n)) + 1 for n in range(16, 36))
    assert f"[tool result]\n{head}  … 20 more lines ({hidden} characters) not shown\n{tail}" in err
    assert "[tool result] single\n" in err


# ---------------------------------------------------------------- --session prefix (22.18)


async def test_run_session_accepts_a_unique_prefix(tmp_path: Path) -> None:
    store = tmp_path / "store"
    model = script(tmp_path, [{"text": "one"}, {"text": "two"}, {"text": "three"}])
    for _ in range(2):
        assert (await piped(tmp_path, "run", "hi", "--model", model, "--store", str(store))).returncode == 0
    ids = sorted(p.name for p in store.iterdir() if p.is_dir())
    for old, new in zip(ids, ["aa11", "aa22"], strict=True):
        (store / old).rename(store / new)
        log = store / new / "session.jsonl"
        log.write_text(log.read_text().replace(old, new))
    resumed = await piped(tmp_path, "run", "again", "--model", model, "--store", str(store), "--session", "aa1")
    assert resumed.returncode == 0, resumed.stderr
    assert "--session aa11 " in resumed.stderr.decode()
    ambiguous = await piped(tmp_path, "run", "x", "--model", model, "--store", str(store), "--session", "aa")
    assert ambiguous.returncode == 2
    assert "ambiguous" in ambiguous.stderr.decode() and "aa11, aa22" in ambiguous.stderr.decode()
    unknown = await piped(tmp_path, "run", "x", "--model", model, "--store", str(store), "--session", "bb")
    assert unknown.returncode == 2 and "bb" in unknown.stderr.decode()


async def _log_with_a_pending_followup(store: Path) -> None:
    """A session whose dead worker spliced a followup no turn claimed (a resume runs it first)."""
    registry = SessionRegistry(JsonlStore(store))
    session = await registry.prepare_new("pending1", cwd=str(store))
    entry = registry.enter(session)
    queued = ev.InboxMessage("queued-1", "the queued question", mode="followup")
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(queued,))
    await registry.detach(entry)


async def test_run_session_shows_the_queued_turns_it_runs_before_the_prompt(tmp_path: Path) -> None:
    store = tmp_path / "store"
    await _log_with_a_pending_followup(store)
    model = script(tmp_path, [{"text": "answer to the queued one"}, {"text": "answer to the prompt"}])
    done = await piped(tmp_path, "run", "the prompt", "--model", model, "--store", str(store), "--session", "pending1")
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, err
    assert "[pending] 1 queued message(s) run first" in err
    assert out.index("answer to the queued one") < out.index("answer to the prompt"), out


async def test_run_session_fails_when_a_queued_turn_it_ran_first_failed(tmp_path: Path) -> None:
    store = tmp_path / "store"
    await _log_with_a_pending_followup(store)
    failing = {"error": {"message": "the queued turn broke", "code": "scripted"}}
    model = script(tmp_path, [failing, {"text": "answer to the prompt"}])
    done = await piped(tmp_path, "run", "the prompt", "--model", model, "--store", str(store), "--session", "pending1")
    err = done.stderr.decode()
    assert "answer to the prompt" in done.stdout.decode()
    assert done.returncode == 1, err
    assert "the queued turn broke" in err and "[session] kept session pending1" in err


# ---------------------------------------------------------------- the continue line (22.19), --sandbox-hide


async def test_the_continue_line_repeats_the_flags_that_change_what_the_agent_may_do(tmp_path: Path) -> None:
    store = str(tmp_path / "store")
    model = script(tmp_path, [{"text": "ok"}])
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}), encoding="utf-8")
    result = await piped(
        tmp_path,
        *("run", "hi", "--model", model, "--store", store, "--tools", "bash,tasks"),
        *("--mcp-config", str(config), "--yes", "--max-steps", "7"),
    )
    assert result.returncode == 0, result.stderr
    last = result.stderr.decode().splitlines()[-1]
    assert "--tools bash,tasks" in last and f"--mcp-config {config}" in last
    assert "--yes" in last and "--max-steps 7" in last
    assert "--sandbox" not in last
    none = await piped(tmp_path, "run", "hi", "--model", model, "--store", store, "--tools", "none")
    assert "--tools none" in none.stderr.decode().splitlines()[-1]


@pytest.mark.parametrize("command", ["run", "acp"])
async def test_sandbox_hide_without_sandbox_is_a_usage_error(tmp_path: Path, command: str) -> None:
    model = script(tmp_path, [{"text": "ok"}])
    args = [command, *(["hi"] if command == "run" else []), "--model", model, "--store", str(tmp_path / "s")]
    result = await piped(tmp_path, *args, "--sandbox-hide", "~/.ssh")
    assert result.returncode == 2
    assert result.stderr.decode() == (
        "trio-harness: error: --sandbox-hide needs --sandbox: "
        "without the sandbox nothing is hidden from bash commands\n"
    )


def test_sandbox_hide_maps_onto_the_policy_and_is_repeated_in_the_continue_line(tmp_path: Path) -> None:
    from trio_harness import _cli

    args = _cli.build_parser().parse_args(
        ["run", "hi", "--sandbox", "--sandbox-hide", "~/.ssh", "--sandbox-hide", "rel/secret"]
    )
    hidden = (os.path.expanduser("~/.ssh"), os.path.abspath("rel/secret"))
    assert _cli._bash_options(args) == BashRuntimeOptions(sandbox=SandboxPolicy(hidden=hidden))
    assert _cli._policy_flags(args) == ["--sandbox", "--sandbox-hide", hidden[0], "--sandbox-hide", hidden[1]]
    acp = _cli.build_parser().parse_args(["acp", "--sandbox", "--sandbox-hide", "/x"])
    assert _cli._bash_options(acp) == BashRuntimeOptions(sandbox=SandboxPolicy(hidden=("/x",)))


async def test_sandbox_hide_hides_the_path_from_a_sandboxed_command(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    secret = tmp_path / "secret.env"
    secret.write_text("KEY=1\n")
    model = script(tmp_path, [bash(f"cat {secret}"), {"text": "ok"}])
    result = await piped(
        tmp_path,
        *("run", "go", "--model", model, "--store", str(tmp_path / "store"), "--yes"),
        *("--sandbox", "--sandbox-hide", str(secret)),
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert f'[tool] bash {{"command": "cat {secret}"}}' in err  # the command ran ...
    assert "KEY=1" not in err  # ... and could not read the hidden file
    assert re.search(rf"--sandbox --sandbox-hide {re.escape(str(secret))}", err.splitlines()[-1])


def test_under_the_sandbox_the_mcp_config_file_is_hidden_too(tmp_path: Path) -> None:
    from trio_harness import _cli

    args = _cli.build_parser().parse_args(
        ["run", "hi", "--sandbox", "--sandbox-hide", "/x", "--mcp-config", str(tmp_path / "mcp.json")]
    )
    hidden = ("/x", str(tmp_path / "mcp.json"))
    assert _cli._bash_options(args) == BashRuntimeOptions(sandbox=SandboxPolicy(hidden=hidden))
    flags = ["--sandbox", "--sandbox-hide", "/x", "--mcp-config", str(tmp_path / "mcp.json")]
    assert _cli._policy_flags(args) == flags  # hidden again by the continued run's own --mcp-config
    unsandboxed = _cli.build_parser().parse_args(["run", "hi", "--mcp-config", "mcp.json"])
    assert _cli._bash_options(unsandboxed) == BashRuntimeOptions()


async def test_a_sandboxed_command_and_the_file_tools_cannot_read_the_mcp_config(tmp_path: Path) -> None:
    import shutil

    if shutil.which("bwrap") is None:
        pytest.skip("bubblewrap (bwrap) is not installed")
    config = tmp_path / "mcp.json"
    config.write_text(json.dumps({"mcpServers": {}}), encoding="utf-8")  # a real one holds tokens
    read = {"name": "read_file", "arguments": {"path": str(config)}}
    model = script(tmp_path, [bash(f"cat {config}"), {"tool_calls": [read]}, {"text": "ok"}])
    result = await piped(
        tmp_path,
        *("run", "go", "--model", model, "--store", str(tmp_path / "store"), "--yes"),
        *("--sandbox", "--mcp-config", str(config), "--tools", "bash,files"),
    )
    assert result.returncode == 0, result.stderr
    err = result.stderr.decode()
    assert f'[tool] bash {{"command": "cat {config}"}}' in err  # the command ran ...
    assert "mcpServers" not in err  # ... and neither it nor read_file could read the file
    assert "is hidden by" in err


# ---------------------------------------------------------------- the scripted file's prefix (22.21)


async def test_a_bad_scripted_file_is_named_once(tmp_path: Path) -> None:
    path = tmp_path / "bad.json"
    path.write_text(json.dumps({"responses": [{"bogus": 1}]}), encoding="utf-8")
    result = await piped(tmp_path, "run", "hi", "--model", f"scripted:{path}", "--store", str(tmp_path / "s"))
    assert result.returncode == 2
    err = result.stderr.decode()
    assert err.count("scripted model file") == 1 and "responses[0]: unknown keys ['bogus']" in err


async def test_on_a_terminal_a_retry_shows_its_reason_first_and_counts_down(
    tmp_path: Path, nursery: trio.Nursery
) -> None:
    from _sse_server import DONE, Respond, Stream, sse_finish, sse_text, start_server

    server = await start_server(
        nursery,
        Respond(503, {"error": {"message": "model overloaded"}}, headers={"Retry-After": "3"}),
        Stream([sse_text("recovered"), sse_finish("stop"), DONE]),
    )
    model = f"openai:m@{server.base_url}"
    args = ["run", "hi", "--model", model, "--store", str(tmp_path / "s")]
    code, text, _ = await cli_on_a_terminal(args, cwd=tmp_path, env=cli_env(OPENAI_API_KEY="k"))
    assert code == 0, text
    # The reason (cut to fit: the provider's message is long) comes first, then the countdown.
    assert "… openai:m@http://127.0.0.1:" in text
    shown = re.findall(r"\(http-503\): retry 1 of 4 in ([0-9.]+s)", text)
    assert shown[:1] == ["3s"], text
    assert "2s" in shown and len(set(shown)) >= 3  # counted down while waiting
    assert "recovered" in text
