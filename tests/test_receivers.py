"""A test of a real receiver (tests/_receivers.py) skips, saying how to enable it, only outside CI.

With ``CI`` set a missing receiver fails the test (an error in its fixture),
and a variable naming no executable fails it everywhere.  Runs the LiteLLM test in a child pytest.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).parent.parent
TEST = "tests/test_anthropic_litellm.py"


async def _pytest(**set_env: str) -> tuple[int, str]:
    env = {key: value for key, value in os.environ.items() if key not in {"CI", "TRIO_HARNESS_LITELLM"}}
    env.update(set_env)
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rsf", "-q", "--run-slow", TEST],
            cwd=ROOT, env=env, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_a_missing_receiver_skips_saying_how_unless_ci_is_set(tmp_path: Path) -> None:
    code, output = await _pytest()
    assert code == 0, output
    assert "1 skipped" in output and "TRIO_HARNESS_LITELLM is not set" in output, output
    assert "`python3 -m nox -s tests` installs it and sets it" in output, output

    code, output = await _pytest(CI="true")
    assert code == 1, output
    assert "1 error" in output and "with CI set this test fails instead of skipping" in output, output

    code, output = await _pytest(TRIO_HARNESS_LITELLM=str(tmp_path / "litellm"))
    assert code == 1, output
    assert "1 error" in output and "no executable file there" in output, output
