"""The README's commands work verbatim on a fresh copy of the repository.

Every fenced block of ``README.md`` is accounted for:

* the two set-up commands (examples, tests) are the ones ``noxfile.py`` and
  ``.ci/run`` define (CI runs the test command itself; ``test_examples.py``
  runs what the examples session runs);
* every other ``sh`` block and every ``python`` block is run, in order, in a
  copy of the tracked files (what a fresh clone has), with ``bash -eu``;
* a block whose first line is ``# needs: VAR`` is run only when ``VAR`` is
  set (a real model's API key): the README says so beside it.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
FENCE = re.compile(r"^```(\w+)\n(.*?)^```$", re.M | re.S)
SET_UP = {
    "python3 -m pip install nox && python3 -m nox -s examples",
    "python3 -m pip install nox && python3 -m nox -s tests",
}


def blocks() -> list[tuple[str, str]]:
    return [(lang, body) for lang, body in FENCE.findall(README.read_text(encoding="utf-8"))]


def test_the_set_up_commands_are_the_ones_ci_and_nox_run() -> None:
    commands = {body.strip() for lang, body in blocks() if lang == "sh"}
    assert commands >= SET_UP
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "python3 -m pip install nox && python3 -m nox -s tests" in ci.splitlines()[-1]
    noxfile = (ROOT / "noxfile.py").read_text(encoding="utf-8")
    assert "def examples(" in noxfile
    assert "def tests(" in noxfile


def _fresh_copy(destination: Path) -> None:
    """Copy the files git tracks (a fresh clone's content) to ``destination``."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--cached"], cwd=ROOT, capture_output=True, check=True
    ).stdout.split(b"\0")
    for name in filter(None, listed):
        source = ROOT / os.fsdecode(name)
        if source.is_file():  # a file deleted in the work tree but not yet in git
            target = destination / os.fsdecode(name)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(source, target)


@pytest.mark.slow  # builds a virtual environment: about 20 s
def test_every_other_block_runs_verbatim_on_a_fresh_copy(tmp_path: Path) -> None:
    if shutil.which("git") is None or not (ROOT / ".git").exists():
        pytest.fail("this test needs a git checkout (it copies the tracked files)")
    clone = tmp_path / "clone"
    _fresh_copy(clone)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    ran: list[str] = []
    for lang, body in blocks():
        first = body.splitlines()[0] if body.strip() else ""
        if lang == "sh" and body.strip() in SET_UP:
            continue
        needs = re.match(r"# needs: (\w+)", first)
        if needs and needs.group(1) not in os.environ:
            continue
        if lang == "sh":
            command = ["bash", "-eu", "-c", body]
        elif lang == "python":
            (clone / "readme_block.py").write_text(body, encoding="utf-8")
            command = [str(clone / ".venv" / "bin" / "python"), "readme_block.py"]
        else:
            pytest.fail(f"README block of unknown language {lang!r}: run it here or mark it")
        result = subprocess.run(command, cwd=clone, env=env, capture_output=True, timeout=600, check=False)
        assert result.returncode == 0, (
            f"README block failed ({result.returncode}):\n{body}\n--- stdout\n"
            f"{result.stdout.decode(errors='replace')}\n--- stderr\n{result.stderr.decode(errors='replace')}"
        )
        ran.append(body)
    assert any("pip install -e ." in body for body in ran)  # the install block ran first
    assert any("trio-harness run --model scripted:hello.json" in body for body in ran)
    assert any("open_harness" in body for body in ran)
