"""A long-running agent: settings, usage, budgets, an event stream and context compaction.

What it shows:

* :class:`~trio_harness.ModelSettings` given per harness, per agent and per
  turn (``followup(text, settings=...)``), merged field by field and recorded
  in every ``request/header``;
* ``async with agent.events() as stream``: a bounded stream of the session's
  events, read by a task of its own while the agent works;
* a small context window (the scripted model's ``context_window`` and
  ``summary``): once a request would pass 80 % of it, the agent asks the model
  for a summary of the older turns and logs ``context/compacted``; later
  requests carry the summary and only the recent turns;
* ``agent.usage`` (session totals) and the usage on each ``turn/end``;
* a resumed session with a :class:`~trio_harness.Budget`: its totals are
  rebuilt from the log, so the next turn ends at once with reason ``budget``.

Run it with ``python examples/long_running.py``; no network is needed.
"""

from __future__ import annotations

import attrs
import trio

from trio_harness import AgentOptions, Budget, ContextPolicy, ModelSettings, ScriptedModel, open_harness
from trio_harness import events as ev
from trio_harness.agents import ReactAgent, StreamGap

TURNS = 40
WINDOW = 2_000  # tokens; the scripted model counts about four characters a token


def answers() -> list[dict[str, str]]:
    return [{"text": f"Noted fact {n}: " + "details " * 20} for n in range(1, TURNS + 1)]


async def main() -> None:
    model = ScriptedModel(
        answers(),
        context_window=WINDOW,  # a larger request would fail with a context-length error
        summary="The user dictated numbered facts; each was acknowledged with its details.",
    )
    options = AgentOptions(
        model_settings=ModelSettings(temperature=0.2),
        context=ContextPolicy(threshold=0.8, keep=0.3),
    )
    async with open_harness(model=model, model_settings=ModelSettings(max_tokens=200), builtin_tools=False) as harness:
        handle = await harness.agents.create(options=options)
        agent = handle.agent
        counts: dict[str, int] = {}

        async def watch(task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
            async with agent.events(buffer=64) as stream:
                task_status.started()  # subscribed: every event from now on reaches the stream
                async for item in stream:
                    key = "gap" if isinstance(item, StreamGap) else item.type
                    counts[key] = counts.get(key, 0) + 1
                    if isinstance(item, ev.ContextCompacted):
                        print(f"  [turn {item.turn}: compacted a request of ~{item.tokens_before} tokens]")

        async with trio.open_nursery() as nursery:
            await nursery.start(watch)
            for n in range(1, TURNS + 1):
                settings = ModelSettings(temperature=0.9) if n == 1 else None
                agent.followup(f"Remember fact {n}: " + "context " * 20, settings=settings)
                await agent.when_idle()
            nursery.cancel_scope.cancel()

        events = agent.session.events
        headers = [e for e in events if isinstance(e, ev.RequestHeader)]
        print(f"first request settings: {headers[0].settings}")
        print(f"later request settings: {headers[1].settings}")
        largest = max(model.prompt_tokens(r) for r in model.requests)
        print(f"{len(model.requests)} model requests, the largest about {largest} tokens (window {WINDOW})")
        compactions = [e for e in events if isinstance(e, ev.ContextCompacted)]
        print(f"{len(compactions)} compactions; the next request starts with the summary")
        assert compactions and largest <= WINDOW
        assert isinstance(agent, ReactAgent)  # the default agent: it can show its next request
        assert compactions[-1].summary in agent.build_request().system
        ends = [e for e in events if isinstance(e, ev.TurnEnd)]
        print(f"usage of turn 1: {ends[0].usage}")
        print(f"session usage: {agent.usage}")
        print(f"events streamed: {sum(counts.values())} ({counts.get('gap', 0)} gaps)")

        # Resume the session with a budget of what it has used already: the next turn ends at once.
        used = agent.usage
        await handle.dispose()
        limited = attrs.evolve(options, session_budget=Budget(tokens=used.total_tokens))
        async with await harness.agents.resume(agent.id, options=limited) as resumed:
            assert resumed.usage == used  # rebuilt from the log
            resumed.followup("One more, please.")
            await resumed.when_idle()
            last = [e for e in resumed.session.events if isinstance(e, ev.TurnEnd)][-1]
            assert last.reason == "budget" and last.failure is not None
            print(f"after resuming: the turn ended {last.reason}: {last.failure.message}")


if __name__ == "__main__":
    trio.run(main)
