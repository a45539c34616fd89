"""Agents: the interface, registry, inbox, driver, tools and turn following.

The built-in tool plugins (``subagent`` among them) live one layer up, in
:mod:`trio_harness.tools`.
"""

from ._agent import Agent as Agent
from ._agent import AgentStatus as AgentStatus
from ._approval import ApprovalDecision as ApprovalDecision
from ._approval import ApprovalRequest as ApprovalRequest
from ._approval import Approver as Approver
from ._approval import Verdict as Verdict
from ._approval import allow_all as allow_all
from ._budget import Budget as Budget
from ._compaction import ContextPolicy as ContextPolicy
from ._compaction import HistoryProcessor as HistoryProcessor
from ._driver import ReactAgent as ReactAgent
from ._factory import ReactLoopFactory as ReactLoopFactory
from ._follow import FollowedPrompt as FollowedPrompt
from ._follow import Followers as Followers
from ._function_tools import FunctionTool as FunctionTool
from ._function_tools import tool as tool
from ._inbox import Inbox as Inbox
from ._inbox import Prompt as Prompt
from ._options import AgentOptions as AgentOptions
from ._registry import AgentFactory as AgentFactory
from ._registry import AgentHandle as AgentHandle
from ._registry import AgentRegistry as AgentRegistry
from ._registry import LoopAgent as LoopAgent
from ._registry import Setup as Setup
from ._run import RunResult as RunResult
from ._stream import EventStream as EventStream
from ._stream import StreamGap as StreamGap
from ._stream import StreamItem as StreamItem
from ._tools import Tool as Tool
from ._tools import ToolContext as ToolContext
from ._tools import ToolOutput as ToolOutput
from ._tools import ToolSet as ToolSet
from ._turns import TurnOutcome as TurnOutcome
from ._turns import TurnWatcher as TurnWatcher
