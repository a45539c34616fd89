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
from ._service import TaskService as TaskService
from ._service import open_task_service as open_task_service
from ._types import TaskHooks as TaskHooks
from ._types import TaskListener as TaskListener
from ._types import TaskOutcome as TaskOutcome
from ._types import TaskOwner as TaskOwner
from ._types import TaskRead as TaskRead
from ._types import TaskSnapshot as TaskSnapshot
from ._types import TaskSpec as TaskSpec
from ._types import TaskStatus as TaskStatus
from ._types import TerminalStatus as TerminalStatus

if not TYPE_CHECKING:  # old names, kept for one release (docs/sessions.rst, "Renamed in this release")
    __getattr__ = _renamed(__name__, {"TaskOptions": ("trio_harness.tasks.TaskRuntimeOptions", TaskRuntimeOptions)})
del TYPE_CHECKING, _renamed  # end of old names
