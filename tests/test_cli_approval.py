"""``trio-harness run`` and approval: ``--yes``, no terminal, and the ``y / n / always`` prompt on a pty.

Every run is a real subprocess (``python -m trio_harness``); the terminal is a
real pseudo-terminal made with the :mod:`pty` module (docs/approval.rst).
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
import trio.testing
from _util import APPROVAL_PROMPT, WAIT, cli_on_a_terminal

from trio_harness.session import JsonlStore
from trio_harness.session import _events as ev

PROMPT = APPROVAL_PROMPT
ONE = "echo one >> out.txt"
TWO = "echo two >> out.txt"


def cli_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}


def two_commands(tmp_path: Path) -> str:
    responses: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": ONE}}]},
        {"tool_calls": [{"name": "bash", "arguments": {"command": TWO}}]},
        {"text": "done"},
    ]
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return f"scripted:{path}"


def written(tmp_path: Path) -> str | None:
    out = tmp_path / "out.txt"
    return out.read_text() if out.exists() else None


async def decisions(store: Path) -> list[tuple[str, str, str | None]]:
    persistence = JsonlStore(store)
    (header,) = await persistence.list()
    events = (await persistence.load(header.id)).events
    return [(e.outcome, e.source, e.message) for e in events if isinstance(e, ev.ApprovalDecided)]


async def run_without_terminal(tmp_path: Path, *extra: str) -> subprocess.CompletedProcess[bytes]:
    command = [sys.executable, "-m", "trio_harness", "run", "go", "--model", two_commands(tmp_path)]
    with trio.fail_after(WAIT):
        return await trio.run_process(
            [*command, "--store", str(tmp_path / "store"), "--tools", "bash", *extra],
            cwd=tmp_path,
            env=cli_env(),
            stdin=b"",
            capture_stdout=True,
            capture_stderr=True,
            check=False,
            start_new_session=True,  # no controlling terminal, even when the tests run in one
        )


async def test_yes_runs_every_command_without_asking(tmp_path: Path) -> None:
    result = await run_without_terminal(tmp_path, "--yes")
    assert result.returncode == 0, result.stderr
    assert written(tmp_path) == "one\ntwo\n"
    assert b"denied" not in result.stderr
    # Nobody was asked; the log still shows what ran (trio_harness.allow_all).
    assert [outcome[:2] for outcome in await decisions(tmp_path / "store")] == [("allow_once", "approver")] * 2


async def test_without_a_terminal_commands_are_denied_with_a_line_naming_yes(tmp_path: Path) -> None:
    result = await run_without_terminal(tmp_path)
    assert result.returncode == 0, result.stderr  # the turn completed; the model was told
    assert written(tmp_path) is None
    lines = result.stderr.decode().splitlines()
    denied = [line for line in lines if line.startswith("trio-harness: denied")]
    assert denied == [
        f"trio-harness: denied bash: {command}: it needs approval and there is no terminal to ask on; "
        "run with --yes to allow tool calls without asking"
        for command in (ONE, TWO)
    ]
    assert result.stdout.decode() == "done\n"
    outcomes = await decisions(tmp_path / "store")
    assert [(outcome, source) for outcome, source, _ in outcomes] == [("deny", "approver"), ("deny", "approver")]
    assert all("--yes" in (message or "") for _, _, message in outcomes)


async def run_on_a_terminal(tmp_path: Path, answers: list[str]) -> tuple[int, str, int]:
    """Run ``trio-harness run -`` on a pty, the prompt on stdin (a pipe): answers come from the terminal only."""
    args = ["run", "-", "--model", two_commands(tmp_path), "--store", str(tmp_path / "store")]
    return await cli_on_a_terminal(
        args, cwd=tmp_path, env=cli_env(), answers=answers, stdin=b"please write the two lines"
    )


@pytest.mark.parametrize(
    ("answers", "lines", "outcomes"),
    [
        (["y", "yes"], "one\ntwo\n", [("allow_once", "approver", None), ("allow_once", "approver", None)]),
        (
            ["n not now", "no"],
            None,
            [("deny", "approver", "not now"), ("deny", "approver", None)],
        ),
        (["always"], "one\ntwo\n", [("allow_always", "approver", None), ("allow_always", "remembered", None)]),
        (["maybe", "a"], "one\ntwo\n", [("allow_always", "approver", None), ("allow_always", "remembered", None)]),
    ],
    ids=["yes", "no", "always", "asks-again"],
)
async def test_on_a_terminal_each_command_is_asked_y_n_always(
    tmp_path: Path, answers: list[str], lines: str | None, outcomes: list[tuple[str, str, str | None]]
) -> None:
    code, output, asked = await run_on_a_terminal(tmp_path, answers)
    assert code == 0, output
    assert asked == len(answers)
    assert f"[approve] bash in {tmp_path}:\n    {ONE}\nallow? [y]es / [n]o / [a]lways: " in output
    if answers[0] == "maybe":
        assert "please answer y (yes), n (no, optionally followed by a reason) or a (always)" in output
    assert written(tmp_path) == lines
    assert await decisions(tmp_path / "store") == outcomes
    if lines is None:
        assert "message: not now" in output  # the model's error result, shown as [tool error]


# ---------------------------------------------------------------- a paused approval (issue 24.4)


async def test_run_session_asks_a_paused_question_again_on_the_terminal(tmp_path: Path) -> None:
    """A session paused while asking (its agent disposed): ``run --session`` asks again; allowed, it runs."""
    from trio_harness import ApprovalDecision, ApprovalRequest, open_harness
    from trio_harness.model._scripted import ScriptedModel

    questioned = trio.Event()

    async def never_answers(request: ApprovalRequest) -> ApprovalDecision:
        questioned.set()
        await trio.sleep_forever()

    store = tmp_path / "store"
    first = ScriptedModel([{"tool_calls": [{"name": "bash", "arguments": {"command": ONE}}]}])
    async with open_harness(model=first, store=store, approver=never_answers) as h:
        handle = await h.agents.create(cwd=str(tmp_path))
        handle.agent.followup("write one")
        await questioned.wait()  # after the checkpoints before the question
        await handle.dispose()
        session_id = handle.agent.id
    shown = await trio.run_process(
        [sys.executable, "-m", "trio_harness", "sessions", "show", session_id, "--store", str(store)],
        env=cli_env(),
        capture_stdout=True,
        check=True,
    )
    text = shown.stdout.decode()
    assert "--- turn 1 ended: paused (cause: disposed) ---" in text
    assert f'[waiting for approval] bash {{"command": "{ONE}"}}' in text

    path = tmp_path / "again.json"
    path.write_text(json.dumps({"responses": [{"text": "it ran."}, {"text": "and then."}]}), encoding="utf-8")
    args = ["run", "then?", "--session", session_id, "--model", f"scripted:{path}", "--store", str(store)]
    code, output, asked = await cli_on_a_terminal(args, cwd=tmp_path, env=cli_env(), answers=["y"])
    assert code == 0, output
    assert asked == 1
    assert "[paused] turn 1 waits for approval: asking again" in output
    assert f"    {ONE}\nallow? [y]es / [n]o / [a]lways: " in output
    assert "it ran." in output and "and then." in output
    assert written(tmp_path) == "one\n"
    assert await decisions(store) == [("allow_once", "approver", None)]


# ---------------------------------------------------------------- file tools (docs/tools.rst, "File tools")


async def test_an_edit_is_asked_on_the_terminal_with_its_unified_diff(tmp_path: Path) -> None:
    target = tmp_path / "a.py"
    target.write_text("x = 1\ny = 2\n")
    responses: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "read_file", "arguments": {"path": "a.py"}}]},
        {
            "tool_calls": [
                {"name": "edit_file", "arguments": {"path": "a.py", "old_text": "y = 2", "new_text": "y = 3"}}
            ]
        },
        {"text": "done"},
    ]
    script = tmp_path / "script.json"
    script.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    args = ["run", "edit", "--model", f"scripted:{script}", "--store", str(tmp_path / "store"), "--tools", "files"]
    code, output, asked = await cli_on_a_terminal(args, cwd=tmp_path, env=cli_env(), answers=["y"])
    assert code == 0, output
    assert asked == 1  # the read is not asked
    diff = f"    --- {target}\n    +++ {target}\n    @@ -1,2 +1,2 @@\n     x = 1\n    -y = 2\n    +y = 3\n"
    assert f"[approve] edit_file a.py:\n{diff}allow? [y]es" in output
    assert target.read_text() == "x = 1\ny = 3\n"
