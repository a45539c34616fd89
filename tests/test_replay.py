"""The replay model: a recorded conversation answers again, offline."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from _util import echo_tool

from trio_harness import ModelError, ScriptedModel
from trio_harness.model._replay import ReplayModel
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

ECHO = echo_tool()


async def record(tmp_path: Path) -> Path:
    model = ScriptedModel(
        [
            {"reasoning": "let me think", "tool_calls": [{"name": "echo", "arguments": {"x": "1"}}]},
            {"text": "first answer"},
            {"text": "second answer"},
        ]
    )
    async with open_test_harness(model, store=tmp_path) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="rec") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()
    return tmp_path / "rec" / "session.jsonl"


def stripped(events: Any) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for e in events:
        if isinstance(e, ev.AssistantChunk):
            out.append((e.type, e.kind, e.text))
        elif isinstance(e, ev.AssistantMessage):
            out.append((e.type, e.text, e.reasoning, repr(e.tool_calls), repr(e.usage), e.finish))
        elif isinstance(e, ev.ToolResult | ev.UserMessage | ev.TurnEnd):
            out.append((e.type,))
    return out


async def test_replaying_a_recorded_session_reproduces_it(tmp_path: Path) -> None:
    path = await record(tmp_path)
    from trio_harness.session._jsonl import parse_log

    recorded = parse_log(path.read_bytes(), str(path)).events
    replay = ReplayModel.from_file(path, strict=True)
    assert replay.remaining == 3
    async with open_test_harness(replay) as h:
        h.tools.add(ECHO)
        async with h.agents.open(session_id="again") as agent:
            for prompt in ("one", "two"):
                agent.followup(prompt)
                await agent.when_idle()
            assert stripped(agent.session.events) == stripped(recorded)
    assert replay.remaining == 0


async def test_strict_replay_reports_divergence_and_exhaustion(tmp_path: Path) -> None:
    path = await record(tmp_path)
    replay = ReplayModel.from_file(path, strict=True)
    async with open_test_harness(replay) as h, h.agents.open() as agent:
        agent.followup("something else")
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.failure is not None
        assert end.failure.code == "replay-diverged" and "'one'" in end.failure.message
    lenient = ReplayModel.from_events([])
    async with open_test_harness(lenient) as h, h.agents.open() as agent:
        agent.followup("x")
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.failure is not None and end.failure.code == "replay-exhausted"


def test_missing_or_bad_file_is_a_model_error(tmp_path: Path) -> None:
    with pytest.raises(ModelError, match="does not exist"):
        ReplayModel.from_file(tmp_path / "nope.jsonl")
    bad = tmp_path / "bad.jsonl"
    bad.write_text("not json\n")
    with pytest.raises(ModelError, match="not a readable session log"):
        ReplayModel.from_file(bad)


async def test_replay_spec_string(tmp_path: Path) -> None:
    from trio_harness.model import resolve_model

    path = await record(tmp_path)
    model = resolve_model(f"replay:{path}")
    assert isinstance(model, ReplayModel) and model.remaining == 3
    with pytest.raises(ModelError, match="names no session log"):
        resolve_model("replay:")
