"""A worker process for the same-id create race in ``test_same_id_create.py``.

Usage::

    python _create_race.py jsonl ROOT - SESSION_ID
    python _create_race.py postgres DSN SCHEMA SESSION_ID

Prints ``{"ready": pid}`` once its harness is open, then waits for a line on
stdin and calls ``agents.create(session_id=SESSION_ID, setup=...)``.  Its
setup prints ``{"in_setup": true}`` and waits for another stdin line; the
created agent then runs one turn.  The worker ends by printing ``{"created":
..., "error": ..., "setup_ran": ..., "requests": ...}``: whether create
returned, the class of what it raised, whether setup ran, and how many
requests its model got.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def main(kind: str, location: str, schema: str, session_id: str) -> None:
    import trio

    from trio_harness import open_harness
    from trio_harness.agents import Agent
    from trio_harness.model import ScriptedModel
    from trio_harness.session import JsonlStore, PostgresStore, SessionStore

    persistence: SessionStore = JsonlStore(location) if kind == "jsonl" else PostgresStore(location, schema=schema)
    model = ScriptedModel([{"text": f"answer {n}"} for n in range(10)])
    stdin = trio.lowlevel.FdStream(os.dup(0))
    pending = bytearray()

    async def read_line() -> None:
        while b"\n" not in pending:
            chunk = await stdin.receive_some()
            if not chunk:
                return
            pending.extend(chunk)
        del pending[: pending.index(b"\n") + 1]

    setup_ran = False

    async def setup(agent: Agent) -> None:
        nonlocal setup_ran
        setup_ran = True
        _emit(in_setup=True)
        await read_line()

    async with open_harness(model=model, store=persistence, builtin_tools=False) as harness:
        _emit(ready=os.getpid())
        await read_line()
        try:
            handle = await harness.agents.create(session_id=session_id, setup=setup)
        except Exception as exc:
            _emit(
                created=False,
                error=type(exc).__name__,
                message=str(exc),
                setup_ran=setup_ran,
                requests=len(model.requests),
            )
            return
        async with handle as agent:
            agent.followup("hello")
            await agent.when_idle()
        _emit(created=True, error=None, setup_ran=setup_ran, requests=len(model.requests))


if __name__ == "__main__":
    import trio

    trio.run(main, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4])
