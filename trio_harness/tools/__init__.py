"""The built-in tool plugins: background-task control, ``bash`` and ``subagent``.

This layer sits above the services it drives (:mod:`trio_harness.agents`,
:mod:`trio_harness.tasks`, :mod:`trio_harness.bash`) and below the harness
that loads it (:func:`~trio_harness.open_harness` loads all three unless
``builtin_tools`` says otherwise).  Each plugin is given the few services it
uses when it is built, registers its tools into a tool set when it is loaded
into a scope, and removes them when that scope closes::

    await harness.load(TaskToolsPlugin(harness.tasks, harness.tools))
    await harness.load(BashToolPlugin(harness.bash, harness.tasks, harness.tools))
    await harness.load(SubagentToolPlugin(harness.tasks, harness.tools))
"""

from ._bash import SHELL_METACHARACTERS as SHELL_METACHARACTERS
from ._bash import BashToolOptions as BashToolOptions
from ._bash import BashToolPlugin as BashToolPlugin
from ._bash import command_allowed as command_allowed
from ._subagent import SubagentOptions as SubagentOptions
from ._subagent import SubagentToolPlugin as SubagentToolPlugin
from ._subagent import subagent_depth as subagent_depth
from ._tasks import NoticeTarget as NoticeTarget
from ._tasks import TaskToolOptions as TaskToolOptions
from ._tasks import TaskToolsPlugin as TaskToolsPlugin
from ._tasks import effective_limit as effective_limit
from ._tasks import task_tools as task_tools

__all__ = [
    "SHELL_METACHARACTERS",
    "BashToolOptions",
    "BashToolPlugin",
    "NoticeTarget",
    "SubagentOptions",
    "SubagentToolPlugin",
    "TaskToolOptions",
    "TaskToolsPlugin",
    "command_allowed",
    "effective_limit",
    "subagent_depth",
    "task_tools",
]
