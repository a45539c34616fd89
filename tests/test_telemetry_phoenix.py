"""OTLP over HTTP to a real receiver no one here wrote: Arize Phoenix, and the trace read back.

``trio-harness run`` (a real subprocess, a scripted model calling bash)
exports with the standard ``OTEL_EXPORTER_OTLP_ENDPOINT``; Phoenix (``phoenix
serve``, from PyPI's ``arize-phoenix``) stores the spans, and its REST API
gives them back with their parents.  Phoenix is heavy (~850 MB) and not a
dependency of the project: ``nox -s tests`` (what CI runs) installs it in a
venv of its own (``_side_venv`` in noxfile.py; about 5 minutes from PyPI the
first time) and names its ``phoenix`` command in ``TRIO_HARNESS_PHOENIX``;
under plain pytest without the variable the test is skipped, saying how to
enable it, and with ``CI`` set it fails instead (tests/_receivers.py).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from _receivers import receiver

ROOT = Path(__file__).resolve().parent.parent


pytestmark = pytest.mark.slow


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@pytest.fixture
def phoenix(tmp_path: Path) -> Iterator[str]:
    command = receiver("TRIO_HARNESS_PHOENIX", "the phoenix command of an `arize-phoenix` installation")
    port, grpc = free_port(), free_port()
    env = {
        **os.environ,
        "PHOENIX_WORKING_DIR": str(tmp_path / "phoenix"),
        "PHOENIX_HOST": "127.0.0.1",
        "PHOENIX_PORT": str(port),
        "PHOENIX_GRPC_PORT": str(grpc),
    }
    log = (tmp_path / "phoenix.log").open("wb")
    process = subprocess.Popen([command, "serve"], env=env, stdout=log, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 240  # it migrates its database first
        while True:
            assert process.poll() is None, (tmp_path / "phoenix.log").read_text()[-2000:]
            try:
                if httpx.get(f"{url}/healthz", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "Phoenix did not start within 240 s"
            time.sleep(0.5)
        yield url
    finally:
        process.terminate()
        try:
            process.wait(30)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
        log.close()


def spans_of(url: str, want: int) -> list[dict[str, Any]]:
    deadline = time.monotonic() + 60
    while True:
        reply = httpx.get(f"{url}/v1/projects/default/spans", params={"limit": 100}, timeout=10)
        spans: list[dict[str, Any]] = reply.json()["data"] if reply.status_code == 200 else []
        if len(spans) >= want or time.monotonic() > deadline:
            return spans
        time.sleep(0.5)


def test_a_cli_run_exports_its_trace_to_phoenix(phoenix: str, tmp_path: Path) -> None:
    script = tmp_path / "script.json"
    responses = [{"tool_calls": [{"name": "bash", "arguments": {"command": "echo hi"}}]}, {"text": "done"}]
    script.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "OTEL_EXPORTER_OTLP_ENDPOINT": phoenix,
        "OTEL_METRICS_EXPORTER": "none",  # Phoenix takes traces only
        "OTEL_SERVICE_NAME": "telemetry-test",
    }
    command = [sys.executable, "-m", "trio_harness", "run", "--model", f"scripted:{script}"]
    run = subprocess.run(
        [*command, "--store", str(tmp_path / "s"), "--yes", "say hi"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        timeout=120,
        check=False,
    )
    assert run.returncode == 0, run.stderr.decode()
    spans = spans_of(phoenix, 4)
    by_name: dict[str, list[dict[str, Any]]] = {}
    for span in spans:
        by_name.setdefault(span["name"], []).append(span)
    (turn,) = by_name["invoke_agent agent"]
    chats = by_name["chat"]
    (tool,) = by_name["execute_tool bash"]
    assert turn["parent_id"] is None
    assert len(chats) == 2
    assert {chat["parent_id"] for chat in chats} == {turn["context"]["span_id"]}
    assert tool["parent_id"] == turn["context"]["span_id"]
    assert {span["context"]["trace_id"] for span in spans} == {turn["context"]["trace_id"]}
    assert turn["attributes"]["gen_ai.operation.name"] == "invoke_agent"
    assert turn["attributes"]["trio_harness.turn.end_reason"] == "completed"
    assert tool["attributes"]["gen_ai.tool.name"] == "bash"
    assert tool["attributes"]["trio_harness.bash.exit_code"] == 0
    assert chats[0]["attributes"]["gen_ai.provider.name"] == "scripted"
    assert "hi" not in json.dumps(tool["attributes"])  # neither the command's output nor its arguments
