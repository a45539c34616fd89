"""Following one message through a session log to the end of the turn that ran it.

A front end that sends a prompt wants that prompt's turn: its events as they
are appended, and how it ended.  :class:`TurnWatcher` finds the turn that
claimed the message and reports a :class:`TurnOutcome` carrying that turn's
``turn/end`` event.  Front ends do not wire one themselves:
``agent.follow(prompt)`` sends the prompt and follows it with one
(:class:`~trio_harness.agents.FollowedPrompt`).  What an outcome means to the
front end is the front end's business: the ACP bridge maps it to a stop reason
(:func:`trio_harness.acp.stop_reason_for`), the command line to an exit code.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs

from ..session import _events as ev

__all__ = ["TurnOutcome", "TurnWatcher"]


@attrs.frozen
class TurnOutcome:
    """How a watched message ended.

    Attributes:
        end: the ``turn/end`` event of the turn that claimed the message (its
            ``reason``, ``cause`` and ``failure`` tell how the turn ended), or
            None when the message never ran: it was canceled from the inbox
            before any turn claimed it, or the watch was abandoned (its agent
            was disposed first).
    """

    end: ev.TurnEnd | None = None


@attrs.define(eq=False)
class TurnWatcher:
    """Follows one followup message through a session log (a session observer).

    Register it with ``session.observe(watcher)`` *before* sending the message.
    It waits for the claim of ``message_id`` (which tells the turn), passes
    every later event of that turn to ``on_event`` and reports the outcome to
    ``on_done`` exactly once: at the turn's ``turn/end``, or with no end when
    an ``agent/inbox/spliced`` deletion marked canceled removes the message
    before any turn claimed it.  :meth:`abandon` reports an outcome with no
    end for a message that will never run (its agent was disposed).

    Attributes:
        message_id: the id of the watched message.
        on_event: called with each event of the watched turn (except its end).
        on_done: called once with the outcome.
        turn: the turn that claimed the message, once known.
        done: whether the outcome was reported.
    """

    message_id: str
    on_event: Callable[[ev.Event], None]
    on_done: Callable[[TurnOutcome], None]
    turn: int | None = None
    done: bool = False

    def __call__(self, event: ev.Event) -> None:
        """Observe one appended event."""
        if self.done:
            return
        if self.turn is None:
            if isinstance(event, ev.InboxSpliced) and self.message_id in event.removed:
                if event.outcome == "claimed" and event.turn is not None:
                    self.turn = event.turn
                elif event.outcome == "canceled":
                    self._finish(TurnOutcome())
            elif isinstance(event, ev.UserMessage) and event.message_id == self.message_id:
                self.turn = event.turn
            return
        if isinstance(event, ev.TurnEnd):
            if event.turn == self.turn:
                self._finish(TurnOutcome(event))
            return
        if getattr(event, "turn", None) == self.turn:
            self.on_event(event)

    def abandon(self) -> None:
        """Report an outcome with no end unless the outcome is known already."""
        self._finish(TurnOutcome())

    def _finish(self, outcome: TurnOutcome) -> None:
        if self.done:
            return
        self.done = True
        self.on_done(outcome)
