"""A harness process that starts a background ``bash`` task and waits, for the lost-task tests.

Usage::

    python _task_owner_proc.py ROOT SESSION_ID PIDFILE

Opens a harness on the store ``ROOT`` (a JSONL root or a ``postgresql://`` URL) and runs one turn of the agent
``SESSION_ID`` (a scripted model): it starts two background tasks, ``bash-1``
(``sleep 1000``, which writes its shell's pid to ``PIDFILE`` first) and
``bash-2`` (``true``), waits for ``bash-2`` with ``task_output``, and answers.
Once that turn ended (its events are on disk) it prints ``ready`` and waits
forever: the test kills it with SIGKILL.
"""

from __future__ import annotations

import sys

import trio

from trio_harness import BashToolOptions, ScriptedModel, open_harness


def script(pidfile: str) -> list[dict[str, object]]:
    """The model's replies: start the two tasks, collect the short one, answer."""
    sleeper = {"command": f"echo $$ > {pidfile}; sleep 1000", "run_in_background": True}
    short = {"command": "true", "run_in_background": True}
    return [
        {"tool_calls": [{"name": "bash", "arguments": sleeper}, {"name": "bash", "arguments": short}]},
        {"tool_calls": [{"name": "task_output", "arguments": {"task_id": "bash-2", "wait": True}}]},
        {"text": "bash-1 is running"},
    ]


async def main(root: str, session_id: str, pidfile: str) -> None:
    model = ScriptedModel(script(pidfile))
    options = BashToolOptions(requires_approval=False)
    async with open_harness(model=model, store=root, builtin_tools=True, bash_tool_options=options) as harness:
        handle = await harness.agents.create(session_id=session_id)
        handle.agent.followup("start the server and check the build")
        await handle.agent.when_idle()
        print("ready", flush=True)
        await trio.sleep_forever()


if __name__ == "__main__":
    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3])
