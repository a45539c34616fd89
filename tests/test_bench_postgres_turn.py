"""The PostgreSQL turn benchmark (bench/bench_postgres_turn.py) never hides a peer it could not measure.

Without LangGraph (or when its process fails) the LangGraph rows say why, and
the goal rows are ``n/a`` with their target, so ``bench/run.py`` marks them
``?`` rather than ``ok``; with timings, the goal ratio is LangGraph's time per
step over ours.  No server is needed here: the rows are built from timings,
and the LangGraph process is stood in for by a script.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import json
import sys
from pathlib import Path
from typing import Any

import pytest

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _bench(name: str) -> Any:
    if str(BENCH) not in sys.path:
        sys.path.insert(0, str(BENCH))
    return importlib.import_module(name)


def _measured(turn: Any, *, error: str | None) -> Any:
    measured = turn.Measured(real=True)
    for name, timing in measured.timings.items():
        per_step = 5_000.0 if name.startswith("langgraph") else 1_000.0
        timing.wall, timing.cpu, timing.commits = [per_step] * 3, [per_step] * 3, [1.0] * 3
    measured.langgraph_version = "9.9 (AsyncPostgresSaver 9.9)"
    measured.langgraph_error = error
    return measured


def test_without_langgraph_its_rows_say_why_and_the_goals_are_not_judged_ok() -> None:
    turn, run = _bench("bench_postgres_turn"), _bench("run")
    rows = turn.rows_for(_measured(turn, error="langgraph is not installed in /x/python"))
    langgraph = [row for row in rows if "LangGraph" in row["figure"] and "/ ours" not in row["figure"]]
    goals = [row for row in rows if "/ ours" in row["figure"]]
    assert len(langgraph) == 2 and len(goals) == 2
    for row in langgraph:
        assert "not measured: langgraph is not installed in /x/python" in row["figure"]
        assert row["value"] == "n/a"
    assert [row["target"] for row in goals] == [">= 3 x", ">= 5 x"]
    assert all(row["value"] == "n/a" and run.judge(row) == "?" for row in goals)
    ours = [row for row in rows if row["figure"].startswith("PostgreSQL")]
    assert len(ours) == 3 and all(row["value"] == 1.0 and row["unit"] == "ms" for row in ours)


def test_with_langgraph_the_goal_is_its_time_per_step_over_ours() -> None:
    turn, run = _bench("bench_postgres_turn"), _bench("run")
    rows = turn.rows_for(_measured(turn, error=None))
    goals = [row for row in rows if "/ ours" in row["figure"]]
    assert [(row["value"], run.judge(row)) for row in goals] == [(5.0, "ok"), (5.0, "ok")]
    assert any("LangGraph 9.9" in row["figure"] and row["value"] == 5.0 for row in rows)


def test_without_a_server_every_row_is_skipped_with_the_reason() -> None:
    turn = _bench("bench_postgres_turn")
    rows = turn.rows_for(None, "no PostgreSQL server installed")
    assert rows and all(
        row["value"] == "skipped: no PostgreSQL server installed" or row["value"] == "n/a" for row in rows
    )


def test_the_peer_says_which_package_is_missing(monkeypatch: pytest.MonkeyPatch) -> None:
    peer = _bench("peer_langgraph")

    def missing(name: str) -> str:
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setattr(importlib.metadata, "version", missing)
    error = peer._versions()["error"]
    assert "langgraph is not installed in" in error and "nox -s bench" in error


async def test_a_peer_process_that_cannot_measure_is_a_peer_error(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    turn = _bench("bench_postgres_turn")
    fake = tmp_path / "python"
    answer = json.dumps({"error": "langgraph is not installed in the fake python"})
    fake.write_text(f"#!/bin/sh\necho '{answer}'\n")
    fake.chmod(0o755)
    monkeypatch.setenv("BENCH_LANGGRAPH_PYTHON", str(fake))
    with pytest.raises(turn.PeerError, match="langgraph is not installed in the fake python"):
        await turn.LangGraphPeer.start("postgresql://nowhere")

    fake.write_text("#!/bin/sh\necho 'Traceback: it broke' >&2\nexit 1\n")
    with pytest.raises(turn.PeerError, match="exited \\(Traceback: it broke\\)"):
        await turn.LangGraphPeer.start("postgresql://nowhere")

    monkeypatch.setenv("BENCH_LANGGRAPH_PYTHON", str(tmp_path / "missing"))
    with pytest.raises(turn.PeerError, match="cannot run"):
        await turn.LangGraphPeer.start("postgresql://nowhere")
