"""Without Phoenix the OTLP export test skips saying how to enable it, unless ``CI`` is set: then it fails.

Runs tests/test_telemetry_phoenix.py in a child pytest whose cache directory
(``XDG_CACHE_HOME``, where ``.ci/phoenix`` builds Phoenix) is empty.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

import trio

ROOT = Path(__file__).parent.parent


async def _pytest(cache: Path, ci: bool) -> tuple[int, str]:
    env = {key: value for key, value in os.environ.items() if key not in ("CI", "TRIO_HARNESS_PHOENIX")}
    env["XDG_CACHE_HOME"] = str(cache)
    if ci:
        env["CI"] = "true"
    with trio.fail_after(120):
        done = await trio.run_process(
            [sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rs", "-q", "--run-slow",
             "tests/test_telemetry_phoenix.py"],
            cwd=ROOT, env=env, capture_stdout=True, capture_stderr=True, check=False,
        )  # fmt: skip
    return done.returncode, done.stdout.decode() + done.stderr.decode()


async def test_the_phoenix_test_skips_naming_how_to_enable_it_unless_ci_is_set(tmp_path: Path) -> None:
    missing = f"Phoenix is not installed at {tmp_path}/trio-harness/phoenix/bin/phoenix: run .ci/phoenix"

    code, output = await _pytest(tmp_path, ci=False)
    assert code == 0, output
    assert "1 skipped" in output and missing in output

    code, output = await _pytest(tmp_path, ci=True)
    assert code == 1, output
    assert "1 error" in output and missing in output  # pytest.fail in the fixture
    assert not (tmp_path / "trio-harness").exists()  # the test does not build it: .ci/run does
