"""Test doubles shared across test files: a task owner and a task producer.

One copy of each, so the task service tests (``test_tasks_service.py``) and the
task tool tests (``test_task_tools.py``) exercise the same fake.
"""

from __future__ import annotations

import attrs
import trio

from trio_harness._scope import Scope
from trio_harness.events import InboxMessage
from trio_harness.tasks import TaskHooks, TaskOutcome

__all__ = ["FakeOwner", "FakeProducer", "make_owner"]


@attrs.define(eq=False)
class FakeOwner:
    """A stand-in for an Agent: a session id, a real scope, status and an inbox log."""

    id: str
    scope: Scope
    status: str = "idle"
    followups: list[str] = attrs.field(factory=list)
    injects: list[str] = attrs.field(factory=list)
    # The origin of every message delivered, in delivery order.
    origins: list[str] = attrs.field(factory=list)

    def _text(self, message: str | InboxMessage) -> str:
        if isinstance(message, InboxMessage):
            self.origins.append(message.origin)
            return message.text
        self.origins.append("user")
        return message

    def followup(self, message: str | InboxMessage) -> str:
        self.followups.append(self._text(message))
        return f"followup-{len(self.followups)}"

    def inject(self, message: str | InboxMessage) -> str:
        self.injects.append(self._text(message))
        return f"inject-{len(self.injects)}"

    @property
    def notices(self) -> list[str]:
        """Every notice delivered: followups, then injects."""
        return self.followups + self.injects


async def make_owner(root: Scope, session_id: str = "s1") -> FakeOwner:
    """A fake owner whose scope is a fresh child of ``root``."""
    return FakeOwner(id=session_id, scope=await root.open_child(f"agent:{session_id}"))


@attrs.define(eq=False)
class FakeProducer:
    """A task producer built on a trio.Event: finish() (or cancel) settles done.

    Attributes:
        stream: whether the task streams output (``read_output``) or has a final one.
        cancel_error: raised by ``cancel`` (a producer whose kill fails).
        settle_on_cancel: whether ``cancel`` settles the task (with ``cancel_outcome``).
        cancel_outcome: the outcome a settling ``cancel`` gives.
        runs: how many times the service ran the producer.
        released: whether the service's ``done`` wait returned.
    """

    stream: bool = True
    cancel_error: Exception | None = None
    settle_on_cancel: bool = True
    cancel_outcome: TaskOutcome = attrs.field(factory=lambda: TaskOutcome("killed", detail={"signal": "SIGTERM"}))
    chunks: list[str] = attrs.field(factory=list)
    cancels: list[str | None] = attrs.field(factory=list)
    runs: int = 0
    released: bool = False
    outcome: TaskOutcome | None = None
    finished: trio.Event = attrs.field(factory=trio.Event)

    def emit(self, text: str) -> None:
        self.chunks.append(text)

    def finish(self, outcome: TaskOutcome) -> None:
        if self.outcome is None:
            self.outcome = outcome
            self.finished.set()

    def cancel(self, reason: str | None) -> None:
        self.cancels.append(reason)
        if self.cancel_error is not None:
            raise self.cancel_error
        if self.settle_on_cancel:
            self.finish(self.cancel_outcome)

    async def done(self) -> TaskOutcome:
        await self.finished.wait()
        self.released = True
        assert self.outcome is not None
        return self.outcome

    def read_output(self) -> str:
        text = "".join(self.chunks)
        self.chunks.clear()
        return text

    def hooks(self) -> TaskHooks:
        return TaskHooks(
            cancel=self.cancel,
            done=self.done,
            read_output=self.read_output if self.stream else None,
        )

    async def run(self) -> TaskHooks:
        self.runs += 1
        await trio.lowlevel.checkpoint()
        return self.hooks()
