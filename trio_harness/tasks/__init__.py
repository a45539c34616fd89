"""Background tasks: the task service (``harness.tasks``) and its model-facing rendering.

See ``trio_harness/tasks/_service.py`` for the runtime contract.  The control
tools (``task_output``, ``task_list``, ``task_kill``) and completion notices
live one layer up, in :mod:`trio_harness.tools`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .._deprecate import renamed as _renamed
from ._options import TaskRuntimeOptions as TaskRuntimeOptions
from ._render import TASKS_GUIDANCE as TASKS_GUIDANCE
from ._render import bound_text as bound_text
from ._render import cut_utf8 as cut_utf8
from ._render import cut_utf8_tail as cut_utf8_tail
from ._render import render_kill_result as render_kill_result
from ._render import render_notice as render_notice
from ._render import render_task_list as render_task_list
from ._render import render_task_output as render_task_output
from ._render import status_line as status_line
from ._render import truncation_marker as truncation_marker
from ._render import utf8_len as utf8_len
from ._service import TaskHooks as TaskHooks
from ._service import TaskListener as TaskListener
from ._service import TaskOutcome as TaskOutcome
from ._service import TaskOwner as TaskOwner
from ._service import TaskRead as TaskRead
from ._service import TaskService as TaskService
from ._service import TaskSnapshot as TaskSnapshot
from ._service import TaskSpec as TaskSpec
from ._service import TaskStatus as TaskStatus
from ._service import TerminalStatus as TerminalStatus
from ._service import open_task_service as open_task_service

__all__ = [
    "TASKS_GUIDANCE",
    "TaskHooks",
    "TaskListener",
    "TaskOutcome",
    "TaskOwner",
    "TaskRead",
    "TaskRuntimeOptions",
    "TaskService",
    "TaskSnapshot",
    "TaskSpec",
    "TaskStatus",
    "TerminalStatus",
    "bound_text",
    "cut_utf8",
    "cut_utf8_tail",
    "open_task_service",
    "render_kill_result",
    "render_notice",
    "render_task_list",
    "render_task_output",
    "status_line",
    "truncation_marker",
    "utf8_len",
]

if not TYPE_CHECKING:  # old names, kept for one release (docs/sessions.rst, "Renamed in this release")
    __getattr__ = _renamed(__name__, {"TaskOptions": ("trio_harness.tasks.TaskRuntimeOptions", TaskRuntimeOptions)})
del TYPE_CHECKING, _renamed  # end of old names
