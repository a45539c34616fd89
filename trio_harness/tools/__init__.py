"""The built-in tool plugins (background-task control, ``bash``, ``subagent``) and MCP servers.

This layer sits above the services it drives (:mod:`trio_harness.agents`,
:mod:`trio_harness.tasks`, :mod:`trio_harness.bash`) and below the harness
that loads it (:func:`~trio_harness.open_harness` loads all three unless
``builtin_tools`` says otherwise).  Each plugin is given the few services it
uses when it is built, registers its tools into a tool set when it is loaded
into a scope, and removes them when that scope closes::

    await harness.load(TaskToolsPlugin(harness.tasks, harness.tools))
    await harness.load(BashToolPlugin(harness.bash, harness.tasks, harness.tools))
    await harness.load(SubagentToolPlugin(harness.tasks, harness.tools))

MCP servers are tool sources of the same kind: :func:`connect_mcp` starts one
in a child scope of the scope it is given and registers its tools into a tool
set until that scope closes (docs/mcp.rst).
"""

from ._bash import SHELL_METACHARACTERS as SHELL_METACHARACTERS
from ._bash import BashToolOptions as BashToolOptions
from ._bash import BashToolPlugin as BashToolPlugin
from ._bash import command_allowed as command_allowed
from ._mcp import McpConnection as McpConnection
from ._mcp import connect_mcp as connect_mcp
from ._mcp import connect_mcp_servers as connect_mcp_servers
from ._mcp_config import McpHttpServer as McpHttpServer
from ._mcp_config import McpServerConfig as McpServerConfig
from ._mcp_config import McpStdioServer as McpStdioServer
from ._mcp_config import load_mcp_config as load_mcp_config
from ._mcp_config import parse_mcp_config as parse_mcp_config
from ._mcp_tools import mcp_tool_name as mcp_tool_name
from ._mcp_tools import render_mcp_result as render_mcp_result
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
    "McpConnection",
    "McpHttpServer",
    "McpServerConfig",
    "McpStdioServer",
    "NoticeTarget",
    "SubagentOptions",
    "SubagentToolPlugin",
    "TaskToolOptions",
    "TaskToolsPlugin",
    "command_allowed",
    "connect_mcp",
    "connect_mcp_servers",
    "effective_limit",
    "load_mcp_config",
    "mcp_tool_name",
    "parse_mcp_config",
    "render_mcp_result",
    "subagent_depth",
    "task_tools",
]
