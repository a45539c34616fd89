"""The built-in tool plugins (background-task control, ``bash``, ``subagent``, the file tools, the ``todo_write``
plan) and MCP servers.

This layer sits above the services it drives (:mod:`trio_harness.agents`,
:mod:`trio_harness.tasks`, :mod:`trio_harness.bash`) and below the harness
that loads it (:func:`~trio_harness.open_harness` loads all four unless
``builtin_tools`` says otherwise).  Each plugin is given the few services it
uses when it is built, registers its tools into a tool set when it is loaded
into a scope, and removes them when that scope closes::

    await harness.load(TaskToolsPlugin(harness.tasks, harness.tools))
    await harness.load(BashToolPlugin(harness.bash, harness.tasks, harness.tools))
    await harness.load(SubagentToolPlugin(harness.tasks, harness.tools))
    await harness.load(FileToolsPlugin(harness.tools, harness.bash))

MCP servers are tool sources of the same kind: :func:`connect_mcp` starts one
in a child scope of the scope it is given and registers its tools into a tool
set until that scope closes (docs/mcp.rst).
"""

from ._bash import BashRunner as BashRunner
from ._bash import BashToolOptions as BashToolOptions
from ._bash import BashToolPlugin as BashToolPlugin
from ._files import FileChange as FileChange
from ._files import FileToolOptions as FileToolOptions
from ._files import FileToolsPlugin as FileToolsPlugin
from ._files import file_change as file_change
from ._mcp import McpConnection as McpConnection
from ._mcp import connect_mcp as connect_mcp
from ._mcp import connect_mcp_servers as connect_mcp_servers
from ._mcp_config import McpHttpServer as McpHttpServer
from ._mcp_config import McpServerConfig as McpServerConfig
from ._mcp_config import McpStdioServer as McpStdioServer
from ._mcp_config import load_mcp_config as load_mcp_config
from ._mcp_config import parse_mcp_config as parse_mcp_config
from ._plan import PlanEntry as PlanEntry
from ._plan import PlanToolPlugin as PlanToolPlugin
from ._plan import current_plan as current_plan
from ._plan import plan_of as plan_of
from ._subagent import SubagentOptions as SubagentOptions
from ._subagent import SubagentToolPlugin as SubagentToolPlugin
from ._tasks import NoticeTarget as NoticeTarget
from ._tasks import TaskToolOptions as TaskToolOptions
from ._tasks import TaskToolsPlugin as TaskToolsPlugin
from ._tasks import task_tools as task_tools
