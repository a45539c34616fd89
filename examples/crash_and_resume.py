"""Crash and resume: a writer process is killed with SIGKILL mid-turn, then resumed.

What it shows:

* a child process (this same file, run with ``--writer DIR``) opens a harness
  on the JSONL store in ``DIR``, completes turn 1, starts turn 2 whose tool
  call never returns, queues one more prompt, flushes the log and reports
  ``ready``; the parent then kills it with SIGKILL: no cleanup code runs;
* the log on disk: a header line, then one JSON event per line;
* resuming the session in the parent: the turn that died is closed on load
  (the unanswered tool call, whose ``tool/started`` is on disk, gets an error
  result saying it was interrupted while running and may have had effects,
  then ``step/end``, then
  ``turn/end`` with reason ``interrupted``), turn numbers continue, and the
  inbox is rebuilt from its ``agent/inbox/spliced`` events: the queued prompt
  is pending again, and the resumed agent starts its turn at once, as the
  killed writer would have (docs/inbox.rst, "The durable inbox").
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import trio

from trio_harness import ScriptedModel, Tool, ToolContext, open_harness
from trio_harness import events as ev
from trio_harness.session import JsonlStore

SESSION_ID = "crash-demo"


# ---------------------------------------------------------------- the writer (child process)


async def writer(store: str) -> None:
    async def deploy(ctx: ToolContext, args: dict[str, Any]) -> str:
        # Turn 2 is now inside a tool call.  Queue one more prompt, make
        # everything durable, tell the parent, and hang until killed.
        ctx.agent.followup("After the deploy, tag the release.")
        await ctx.agent.session.flush()
        print("ready", flush=True)
        await trio.sleep_forever()

    model = ScriptedModel(
        [
            {"text": "Tests pass."},
            {"tool_calls": [{"name": "deploy", "arguments": {"target": "prod"}}]},
        ]
    )
    async with open_harness(model=model, store=store, builtin_tools=False) as harness:
        harness.tools.add(Tool("deploy", "Deploy the app.", {"type": "object"}, deploy))
        async with harness.agents.open(session_id=SESSION_ID) as agent:
            agent.followup("Run the tests.")
            await agent.when_idle()  # turn 1 completed (and flushed at its end)
            agent.followup("Deploy to production.")
            await trio.sleep_forever()


# ---------------------------------------------------------------- the parent


async def run_writer_and_kill(store: str) -> None:
    command = [sys.executable, __file__, "--writer", store]
    process = await trio.lowlevel.open_process(command, stdout=subprocess.PIPE)
    assert process.stdout is not None
    received = b""
    with trio.fail_after(30):
        while b"ready\n" not in received:
            chunk = await process.stdout.receive_some()
            if not chunk:
                raise RuntimeError(f"the writer exited early with code {await process.wait()}")
            received += chunk
    print(f"writer pid {process.pid} is mid-turn; sending SIGKILL")
    process.send_signal(signal.SIGKILL)
    code = await process.wait()
    await process.stdout.aclose()
    print(f"writer died with exit code {code}")


def show_file(path: Path) -> None:
    lines = path.read_text(encoding="utf-8").splitlines()
    print(f"{path.name}: {len(lines)} lines; the header and the last events:")
    print(f"  {lines[0][:100]}")
    for line in lines[-4:]:
        record = json.loads(line)
        print(f"  seq {record['seq']:2} {record['type']}")


async def main() -> None:
    with tempfile.TemporaryDirectory(prefix="trio-harness-crash-") as store:
        await run_writer_and_kill(store)
        show_file(JsonlStore(Path(store)).path_of(SESSION_ID))

        model = ScriptedModel([{"text": "Tagged v1.0."}, {"text": "Deploy it again? Say so."}])
        async with (
            open_harness(model=model, store=store, builtin_tools=False) as harness,
            harness.agents.open(session_id=SESSION_ID, resume=True) as agent,
        ):
            print("resumed; recovery appended:")
            recovered = [e for e in agent.session.events if e.seq >= len(agent.session) - 3]
            for event in recovered:
                print(f"  seq {event.seq:2} {event.type}")
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and (end.turn, end.reason) == (2, "interrupted")
            result = agent.session.events[-3]
            assert isinstance(result, ev.ToolResult) and result.is_error
            print(f"  the tool result says: {result.content}")

            pending = [m.text for m in agent.inbox.next_turn]
            print(f"inbox after resume: {pending} (status {agent.status})")
            assert pending == ["After the deploy, tag the release."] and agent.status == "running"
            await agent.when_idle()  # the queued prompt's turn (3), started by the resume
            assert not agent.inbox.next_turn

            agent.followup("Anything else?")
            await agent.when_idle()
            for event in agent.session.events:
                if isinstance(event, ev.TurnEnd):
                    print(f"  turn {event.turn}: {event.reason}")
            turns = [e.turn for e in agent.session.events if isinstance(e, ev.TurnStart)]
            assert turns == [1, 2, 3, 4]
            prompts = [e.text for e in agent.session.events if isinstance(e, ev.UserMessage)]
            assert prompts[-2:] == ["After the deploy, tag the release.", "Anything else?"]


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--writer":
        trio.run(writer, sys.argv[2])
    else:
        trio.run(main)
