"""Without bubblewrap the sandbox tests skip naming the package, unless ``CI`` is set: then they fail.

Runs one sandbox test in a child pytest whose ``PATH`` holds no ``bwrap``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).parent.parent


async def _pytest(path_dir: Path, ci: bool) -> tuple[int, str]:
    env = {key: value for key, value in os.environ.items() if key != "CI"}
    env["PATH"] = str(path_dir)  # no bwrap there
    if ci:
        env["CI"] = "1"
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q",
             "tests/test_bash_sandbox.py::test_tmp_is_private_to_each_command",
             "tests/test_bash_sandbox_escapes.py::test_tmp_has_a_size_cap"],
            cwd=ROOT, env=env, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_sandbox_tests_skip_naming_bubblewrap_unless_ci_is_set(tmp_path: Path) -> None:
    code, output = await _pytest(tmp_path, ci=False)
    assert code == 0, output
    assert "2 skipped" in output and "bubblewrap, which is not installed (apt-get install bubblewrap)" in output

    code, output = await _pytest(tmp_path, ci=True)
    assert code == 1, output
    assert "2 failed" in output and "not found on PATH" in output
