"""``agent.follow()``: send one prompt and follow it to the end of the turn that runs it.

Every front end that sends a prompt wants the same three things: the prompt
queued, the events of the turn that runs it, and how that turn ended.
``agent.follow(prompt)`` does all three and returns a :class:`FollowedPrompt`:

* ``on_event`` is called with each event of the prompt's turn as it is
  appended (after the claim of the prompt, up to its ``turn/end``, excluded);
  ``on_done`` once with the :class:`~trio_harness.agents.TurnOutcome`;
* ``await followed.wait()`` returns that outcome;
* ``followed.cancel()`` stops this prompt alone: it leaves the inbox if no turn
  claimed it yet, else its turn is cancelled (cause ``user``; other queued
  prompts stay queued).

The callbacks run synchronously inside :meth:`~trio_harness.session.Session.append`,
as session observers do (docs/long-sessions.rst, "Following a prompt"): they must not block, and their
errors are logged and contained.  That is what lets the ACP bridge and the
command line keep each update in the order the log has it, with nothing
dropped; a consumer that would rather iterate at its own pace reads
``agent.events()`` (which drops, counted, when it falls behind).

:meth:`ReactAgent.run() <trio_harness.agents.ReactAgent.run>`, the ACP bridge
and ``trio-harness run`` are built on it.  The follower is released (its
observer removed) as soon as its outcome is known; when the agent is disposed
first, every follower still waiting gets an outcome with no end.
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio

from ..session import _events as ev
from ..session._session import Session
from ._turns import TurnOutcome, TurnWatcher


def _ignore(event: ev.Event) -> None:
    return None


def _ignore_outcome(outcome: TurnOutcome) -> None:
    return None


@attrs.define(eq=False, repr=False)
class FollowedPrompt:
    """A prompt sent with ``agent.follow()``, followed to the end of the turn that runs it.

    Built by the agent; see :meth:`ReactAgent.follow <trio_harness.agents.ReactAgent.follow>`.
    """

    _watcher: TurnWatcher = attrs.field(alias="watcher")
    _cancel: Callable[[FollowedPrompt], bool] = attrs.field(alias="cancel")
    _on_done: Callable[[TurnOutcome], None] | None = attrs.field(alias="on_done")
    _release: Callable[[FollowedPrompt], None] = attrs.field(alias="release")
    _outcome: TurnOutcome | None = attrs.field(default=None, init=False)
    _finished: trio.Event = attrs.field(factory=trio.Event, init=False)

    def __repr__(self) -> str:
        state = "done" if self.done else "queued" if self.turn is None else f"turn {self.turn}"
        return f"<FollowedPrompt {self.message_id!r} {state}>"

    @property
    def message_id(self) -> str:
        """The id of the prompt's inbox message."""
        return self._watcher.message_id

    @property
    def turn(self) -> int | None:
        """The number of the turn that claimed the prompt, once one did."""
        return self._watcher.turn

    @property
    def done(self) -> bool:
        """Whether the outcome is known."""
        return self._outcome is not None

    @property
    def outcome(self) -> TurnOutcome | None:
        """How the prompt ended (its turn's ``turn/end``, or no end when it never ran); None until then."""
        return self._outcome

    async def wait(self) -> TurnOutcome:
        """Wait for the outcome and return it.

        Cancelling the wait only stops waiting: the prompt stays queued or
        running (call :meth:`cancel` to stop it too).
        """
        await self._finished.wait()
        assert self._outcome is not None
        return self._outcome

    def cancel(self) -> bool:
        """Stop this prompt: drop it from the inbox, or cancel its turn (cause ``user``) while it runs.

        Other queued prompts stay queued.  Does nothing once the outcome is
        known or while the agent is being disposed (its disposal stops the
        prompt anyway).

        Returns:
            Whether the call had an effect.
        """
        if self.done:
            return False
        return self._cancel(self)

    def _finish(self, outcome: TurnOutcome) -> None:
        self._outcome = outcome
        self._release(self)
        self._finished.set()
        if self._on_done is not None:
            self._on_done(outcome)


@attrs.define(eq=False)
class Followers:
    """The prompts one agent follows; :meth:`abandon_all` reports them when the agent is disposed.

    The building block of ``Agent.follow`` for a loop of your own: ``session``
    is the agent's session, ``cancel(followed)`` stops one followed prompt
    (returns whether it had an effect).  ``follow`` calls :meth:`watch` with the
    message id, then sends the message; the agent calls :meth:`abandon_all`
    when it is disposed.
    """

    _session: Session = attrs.field(alias="session")
    _cancel: Callable[[FollowedPrompt], bool] = attrs.field(alias="cancel")
    # Each live follower and the remover of its session observer.
    _live: dict[FollowedPrompt, Callable[[], None]] = attrs.field(factory=dict, init=False)

    def watch(
        self,
        message_id: str,
        on_event: Callable[[ev.Event], None] | None,
        on_done: Callable[[TurnOutcome], None] | None,
    ) -> FollowedPrompt:
        """Start following ``message_id`` (before it is sent, so no event of its turn is missed)."""
        watcher = TurnWatcher(message_id, on_event if on_event is not None else _ignore, _ignore_outcome)
        followed = FollowedPrompt(watcher=watcher, cancel=self._cancel, on_done=on_done, release=self.release)
        watcher.on_done = followed._finish
        self._live[followed] = self._session.observe(watcher)
        return followed

    def release(self, followed: FollowedPrompt) -> None:
        """Stop observing for ``followed`` (its outcome is known, or its prompt was never sent)."""
        remove = self._live.pop(followed, None)
        if remove is not None:
            remove()

    def abandon_all(self) -> None:
        """Report an outcome with no end to every follower still waiting (the agent is disposed)."""
        for followed in list(self._live):
            followed._watcher.abandon()
