"""``trio-harness sessions show`` shows a call whose handler started and that has no result (issue 24).

A log cut by a killed process (or read while its tool runs) holds
``tool/started`` without ``tool/result``: the transcript says the call is
still running or was interrupted with its process, and may have had effects.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable
from pathlib import Path

import trio
from _util import WAIT

from trio_harness import _cli_sessions
from trio_harness.session import JsonlStore, SessionHeader, SessionRegistry
from trio_harness.session import _events as ev

STARTED = "[started, no result]"


def cut_turn(add: Callable[..., object]) -> None:
    """A turn cut while its second call ran: c1 started and finished, c2 started, c3 never started (``add``: append)."""
    add(ev.TurnStart, turn=1)
    add(ev.UserMessage, turn=1, step=1, message_id="m1", text="go")
    for call_id, command in (("c1", "ls"), ("c2", "make deploy"), ("c3", "rm -r build")):
        add(ev.ToolCallRequested, turn=1, step=1, call_id=call_id, name="bash", arguments=f'{{"command": "{command}"}}')
    add(ev.ToolStarted, turn=1, step=1, call_id="c1", name="bash")
    add(ev.ToolResult, turn=1, step=1, call_id="c1", name="bash", content="a b")
    add(ev.ToolStarted, turn=1, step=1, call_id="c2", name="bash")


def test_a_started_call_without_a_result_is_shown_as_running_or_interrupted() -> None:
    events: list[ev.Event] = []

    def append(cls: type[ev.Event], **fields: object) -> None:
        events.append(cls(seq=len(events), ts=0.0, **fields))

    cut_turn(append)
    lines = _cli_sessions.transcript(SessionHeader(id="s", created_at=0.0), events)
    started = [line for line in lines if line.startswith(STARTED)]
    assert started == [
        f'{STARTED} bash {{"command": "make deploy"}} (call c2): still running, or interrupted with its process '
        "(it may have had effects)"
    ]


async def test_sessions_show_of_a_log_cut_while_a_tool_ran_names_the_started_call(tmp_path: Path) -> None:
    store = tmp_path / "store"
    sessions = SessionRegistry(JsonlStore(store))
    entry = sessions.enter(await sessions.prepare_new("cut"))
    cut_turn(entry.session.append)
    await sessions.detach(entry)  # stored as a killed writer leaves it: no turn end
    env = {k: v for k, v in os.environ.items() if k != "TRIO_HARNESS_MODEL"}
    with trio.fail_after(WAIT):
        shown = await trio.run_process(
            [sys.executable, "-m", "trio_harness", "sessions", "show", "cut", "--store", str(store)],
            cwd=tmp_path,
            env=env,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.decode().splitlines()
    assert [line for line in lines if line.startswith(STARTED)] == [
        f'{STARTED} bash {{"command": "make deploy"}} (call c2): still running, or interrupted with its process '
        "(it may have had effects)"
    ]
