"""Background tasks that outlive their process: a subagent task resumes under its id with its owner.

A background task normally dies with the process that ran it
(tools/_lost_tasks.py reports it ``lost``).  A background ``subagent`` task is
different: its work lives in the store, not in the process.  Its identity is
in the owner's log (the ``subagent`` call with its prompt, and the result
``started background task subagent-N`` that gave the model the task id) and
its child session's id is derived from the owner's session id and that call
id (:func:`child_session_id`), so a new process can find it.

When the owner's session is resumed (in any process sharing the store) and its
log never reported the task, :func:`report_lost_tasks` asks the resumer of the
task's kind (:func:`add_resumer`; the ``subagent`` plugin registers one)
instead of declaring it lost.  The subagent resumer registers the task under
its old id at once (:meth:`TaskService.adopt`), then, in the task's watcher,
resumes the child session (or creates it, if the child had not stored
anything yet) with the owner as its runtime owner and tells it that its run
was interrupted (:data:`INTERRUPTED_NOTE`), unless it had already answered.
Its completion reaches the owner as for any task: the completion notice,
``task_output``, ``task_kill``.
"""

from __future__ import annotations

import hashlib
import json
import logging
import weakref
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Final, cast

import attrs
import trio

from .._errors import AgentDisposedError, HarnessError, SessionNotFoundError, TaskStartError
from ..agents._inbox import resume_wakes
from ..session import _events as ev
from ..tasks._types import TaskHooks, TaskOutcome, TaskSpec

if TYPE_CHECKING:
    from .._scope import Scope
    from ..agents._agent import Agent
    from ..agents._registry import AgentHandle
    from ..tasks._service import TaskService
    from ..tasks._types import TaskOwner, TaskSnapshot
    from ._lost_tasks import StartedTask
    from ._tasks import NoticeTarget

log = logging.getLogger("trio_harness.tasks")

INTERRUPTED_NOTE = (
    "Your run was interrupted: the process running it stopped. Continue the task you were given from where "
    "you left off; a tool call that was interrupted may have had effects, so check before repeating it."
)
"""The message a resumed child gets when its run had not finished (a new turn)."""

Resumer = Callable[["NoticeTarget", "StartedTask"], "TaskSnapshot | None"]
"""Carries on one unreported task of a resumed owner; returns its snapshot, or None to let it be lost."""

_RESUMERS: weakref.WeakKeyDictionary[TaskService, dict[str, Resumer]] = weakref.WeakKeyDictionary()


def add_resumer(tasks: TaskService, kind: str, resumer: Resumer, scope: Scope) -> None:
    """Let ``resumer`` carry on the unreported ``kind`` tasks of resumed sessions, while ``scope`` is open."""
    resumers = _RESUMERS.setdefault(tasks, {})
    resumers[kind] = resumer

    def remove() -> None:
        if resumers.get(kind) is resumer:
            del resumers[kind]

    scope.add_exit_callback(remove)


def resume_task(tasks: TaskService, owner: NoticeTarget, task: StartedTask) -> bool:
    """Whether a resumer of ``task``'s kind took it over (else it is lost)."""
    resumer = _RESUMERS.get(tasks, {}).get(task.kind)
    if resumer is None:
        return False
    try:
        return resumer(owner, task) is not None
    except Exception:
        log.warning("could not resume task %s of %s; it is reported lost", task.task_id, owner.id, exc_info=True)
        return False


def child_session_id(owner_id: str, turn: int, step: int, call_id: str) -> str:
    """The session id of the background child started by ``owner_id``'s call ``call_id`` (stable).

    The call's turn and step are part of it: a call id is unique in a log
    only as far as the model makes it so (a scripted model restarted in a
    new process numbers its calls from 1 again).
    """
    digest = hashlib.sha256(f"{owner_id}\0{turn}\0{step}\0{call_id}".encode()).hexdigest()[:32]
    return f"subagent-{digest}"


# ---------------------------------------------------------------- what a child's log says


def final_text(agent: Agent) -> tuple[str, ev.TurnEnd | None]:
    """The last assistant text of the last turn, and that turn's end."""
    end: ev.TurnEnd | None = None
    text = ""
    for event in reversed(agent.session.events):
        if end is None and isinstance(event, ev.TurnEnd):
            end = event
        elif isinstance(event, ev.AssistantMessage) and event.text:
            text = event.text
            break
        elif isinstance(event, ev.TurnStart):
            break
    return text, end


def describe_end(end: ev.TurnEnd | None) -> str:
    """The failure text of a child turn that did not complete."""
    if end is None:
        return "the subagent did not finish a turn"
    if end.reason == "error" and end.failure is not None:
        return f"the subagent failed: {end.failure.message} ({end.failure.code})"
    if end.reason == "aborted":
        return f"the subagent was cancelled (cause: {end.cause})"
    return f"the subagent stopped: {end.reason}"


def stop_child(child: Agent) -> None:
    """Cancel ``child`` with cause ``parent``; a child already being disposed stops anyway."""
    try:
        child.cancel("parent")
    except AgentDisposedError:
        pass  # its disposal aborts its turn (cause disposed) and done() still reports it


def child_outcome(child: Agent, killed: bool) -> TaskOutcome:
    """The task outcome of a child whose work ended (its last turn)."""
    text, end = final_text(child)
    detail: dict[str, object] = {"session": child.id, "reason": end.reason if end else None}
    if killed or (end is not None and end.reason == "aborted"):
        return TaskOutcome("killed", output=text or None, detail=detail)
    if end is not None and end.reason == "completed":
        return TaskOutcome("completed", output=text or "(the subagent returned no text)", detail=detail)
    return TaskOutcome("failed", output=describe_end(end), detail=detail)


_CUT_OFF: Final = frozenset({"interrupted", "aborted"})
"""How a child's last turn ended when its process or its disposal cut it off: it continues."""


def _answered(child: Agent) -> bool:
    """Whether the child's last turn ended by itself and nothing waits for another one.

    Its outcome stands then (an answer, or a failure such as ``error`` or
    ``budget``, reported as such): only a turn cut off (``interrupted`` by its
    process's death, ``aborted`` by its disposal) is continued.
    """
    _, end = final_text(child)
    return end is not None and end.reason not in _CUT_OFF and not child.inbox.has_turn_work()


# ---------------------------------------------------------------- the subagent resumer

OpenChild = Callable[["Agent", str, bool], Awaitable["AgentHandle"]]
"""``open_child(parent, session_id, resume)``: resume (or create) the child session as ``parent``'s child."""


@attrs.define(eq=False)
class _ResumedChild:
    """The hooks of one resumed background subagent task."""

    owner: Agent
    child_id: str
    prompt: str
    open_child: OpenChild
    _killed: bool = attrs.field(default=False, init=False)
    _opening: trio.CancelScope = attrs.field(factory=trio.CancelScope, init=False)
    _child: Agent | None = attrs.field(default=None, init=False)

    def cancel(self, reason: str | None) -> None:
        self._killed = True
        self._opening.cancel()  # a child still being resumed is not resumed at all
        if self._child is not None:
            stop_child(self._child)

    async def _open(self) -> AgentHandle:
        try:
            handle = await self.open_child(self.owner, self.child_id, True)
        except SessionNotFoundError:
            # The child had stored nothing yet: start it from the prompt the owner's log holds.
            handle = await self.open_child(self.owner, self.child_id, False)
            handle.agent.followup(self.prompt)
            return handle
        child = handle.agent
        # A paused turn's continuation runs already, or a turn the resume started for pending messages
        # (still idle while the maintenance due first runs).
        if child.status != "running" and not _answered(child) and not resume_wakes(child.session, child.inbox):
            child.followup(INTERRUPTED_NOTE)
        return handle

    async def done(self) -> TaskOutcome:
        detail: dict[str, object] = {"session": self.child_id, "reason": None}
        handle: AgentHandle | None = None
        try:
            with self._opening:
                handle = await self._open()
        except HarnessError as exc:
            log.warning("the background subagent %s could not be resumed: %s", self.child_id, exc)
            return TaskOutcome("failed", output=f"the subagent could not be resumed: {exc}", detail=detail)
        if handle is None:
            return TaskOutcome("killed", detail=detail)
        try:
            self._child = handle.agent
            if self._killed:
                stop_child(handle.agent)
            await handle.agent.when_idle()
            return child_outcome(handle.agent, self._killed)
        except HarnessError as exc:
            return TaskOutcome("failed", output=f"the subagent failed: {exc}", detail=detail)
        finally:
            with trio.CancelScope(shield=True):
                await handle.dispose()


def _prompt(arguments: str | None) -> str | None:
    try:
        parsed = json.loads(arguments) if arguments else None
    except ValueError:
        return None
    prompt = parsed.get("prompt") if isinstance(parsed, dict) else None
    return prompt if isinstance(prompt, str) else None


def subagent_resumer(tasks: TaskService, open_child: OpenChild) -> Resumer:
    """The resumer of background ``subagent`` tasks (registered by the ``subagent`` plugin)."""

    async def never() -> TaskHooks:
        raise AssertionError("an adopted task is not started")  # pragma: no cover

    def resume(owner: NoticeTarget, task: StartedTask) -> TaskSnapshot | None:
        prompt = _prompt(task.arguments)
        if task.call_id is None or task.turn is None or task.step is None or prompt is None:
            return None
        agent = cast("Agent", owner)
        child_id = child_session_id(owner.id, task.turn, task.step, task.call_id)
        run = _ResumedChild(agent, child_id, prompt, open_child)
        spec = TaskSpec(kind=task.kind, label=task.label, owner=cast("TaskOwner", owner), run=never)
        try:
            return tasks.adopt(spec, task.task_id, TaskHooks(cancel=run.cancel, done=run.done))
        except (TaskStartError, ValueError) as exc:
            log.warning("could not resume task %s of %s (%s); it is reported lost", task.task_id, owner.id, exc)
            return None

    return resume
