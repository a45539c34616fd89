"""``trio-harness run --session``: the turns a resume runs for queued messages before the prompt (docs/cli.rst)."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from ._cli_common import _error
from .session import _events as ev
from .session._paused import paused_calls

if TYPE_CHECKING:
    from ._cli_progress import Printer
    from .agents._agent import Agent
    from .session._events import Event


class QueuedTurns:
    """Shows the turns a resume runs for queued messages before the prompt, and remembers how they ended.

    A resumed session's pending followups and steers run first (docs/inbox.rst,
    "The durable inbox"): the user sees them (their tool calls are asked about
    like the prompt's), and one that did not complete fails the run.
    """

    def __init__(self, agent: Agent, on_event: Callable[[Event], None], printer: Printer) -> None:
        self.prompt_id: str | None = None
        self.ends: list[ev.TurnEnd] = []
        self._on_event = on_event
        self._claimed = False
        inbox = agent.inbox
        count = len(inbox.next_turn) + len(inbox.next_step)
        events = agent.session.events
        last = next((e.turn for e in reversed(events) if isinstance(e, ev.TurnStart | ev.TurnEnd)), 0)
        self._first = last + 1 + (1 if paused_calls(events) else 0)  # a paused turn's continuation is shown apart
        self._unobserve: Callable[[], None] | None = None
        if count:
            printer.line(f"[pending] {count} queued message(s) run first")
            self._unobserve = agent.session.observe(self._observe)

    def _observe(self, event: Event) -> None:
        if self._claimed:
            return
        if isinstance(event, ev.InboxSpliced) and event.outcome == "claimed" and self.prompt_id in event.removed:
            self._claimed = True  # the prompt's own turn: its follower shows it
            return
        turn = getattr(event, "turn", None)
        if turn is None or turn < self._first:
            return
        if isinstance(event, ev.TurnEnd):
            self.ends.append(event)
        else:
            self._on_event(event)

    def stop(self) -> None:
        if self._unobserve is not None:
            self._unobserve()
            self._unobserve = None

    def failed(self) -> bool:
        """Whether a queued message's turn did not complete (reported on stderr)."""
        bad = [end for end in self.ends if end.reason != "completed"]
        for end in bad:
            why = f": {end.failure.message} ({end.failure.code})" if end.failure is not None else ""
            _error(f"turn {end.turn} of a queued message ended {end.reason}{why}")
        return bool(bad)
