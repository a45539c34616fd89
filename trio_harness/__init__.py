"""trio_harness: a rigorous Trio runtime for LLM agents.

Live agents around durable, replayable sessions; a per-agent inbox with
followup / steer / inject / cancel; teardown that provably leaves nothing
running; background tasks (bash, subagents); real model providers; and an
Agent Client Protocol bridge.  Start with :func:`open_harness`.
"""

from typing import TYPE_CHECKING

from . import events as events
from ._bus import EventBus as EventBus
from ._bus import Notice as Notice
from ._bus import NoticeSubject as NoticeSubject
from ._deprecate import renamed as _renamed
from ._errors import AgentDisposedError as AgentDisposedError
from ._errors import AgentError as AgentError
from ._errors import AgentExistsError as AgentExistsError
from ._errors import AgentNotFoundError as AgentNotFoundError
from ._errors import BashError as BashError
from ._errors import CompactionError as CompactionError
from ._errors import EventDecodeError as EventDecodeError
from ._errors import FactoryError as FactoryError
from ._errors import ForkBoundaryError as ForkBoundaryError
from ._errors import HarnessError as HarnessError
from ._errors import InboxError as InboxError
from ._errors import InvalidSessionIdError as InvalidSessionIdError
from ._errors import McpConfigError as McpConfigError
from ._errors import McpError as McpError
from ._errors import McpStartError as McpStartError
from ._errors import ModelError as ModelError
from ._errors import OutputValidationError as OutputValidationError
from ._errors import PluginError as PluginError
from ._errors import RunError as RunError
from ._errors import ScopeClosedError as ScopeClosedError
from ._errors import SessionCorruptError as SessionCorruptError
from ._errors import SessionError as SessionError
from ._errors import SessionExistsError as SessionExistsError
from ._errors import SessionLockedError as SessionLockedError
from ._errors import SessionNotFoundError as SessionNotFoundError
from ._errors import SessionStoreError as SessionStoreError
from ._errors import TaskError as TaskError
from ._errors import TaskNotFoundError as TaskNotFoundError
from ._errors import TaskStartError as TaskStartError
from ._errors import ToolError as ToolError
from ._errors import UnsupportedFormatError as UnsupportedFormatError
from ._errors import publish_exceptions as _publish_exceptions
from ._harness import Harness as Harness
from ._harness import open_harness as open_harness
from ._initiator import current_initiator as current_initiator
from ._initiator import with_initiator as with_initiator
from ._initiator import without_initiator as without_initiator
from ._scope import LoadedPlugin as LoadedPlugin
from ._scope import Plugin as Plugin
from ._scope import Scope as Scope
from ._scope import current_scope as current_scope
from ._scope import open_scope as open_scope
from ._version import __version__ as __version__
from .agents import Agent as Agent
from .agents import AgentHandle as AgentHandle
from .agents import AgentOptions as AgentOptions
from .agents import ApprovalDecision as ApprovalDecision
from .agents import ApprovalRequest as ApprovalRequest
from .agents import Approver as Approver
from .agents import Budget as Budget
from .agents import ContextPolicy as ContextPolicy
from .agents import FunctionTool as FunctionTool
from .agents import Inbox as Inbox
from .agents import RunResult as RunResult
from .agents import Tool as Tool
from .agents import ToolContext as ToolContext
from .agents import ToolOutput as ToolOutput
from .agents import allow_all as allow_all
from .agents import tool as tool
from .bash import BashRuntimeOptions as BashRuntimeOptions
from .model import Image as Image
from .model import ModelProvider as ModelProvider
from .model import ModelSettings as ModelSettings
from .model import ScriptedModel as ScriptedModel
from .model import UsageTotals as UsageTotals
from .model import open_model as open_model
from .session import JsonlStore as JsonlStore
from .session import MemoryStore as MemoryStore
from .session import Session as Session
from .session import SessionHeader as SessionHeader
from .tasks import TaskRuntimeOptions as TaskRuntimeOptions
from .tools import BashToolOptions as BashToolOptions
from .tools import McpHttpServer as McpHttpServer
from .tools import McpStdioServer as McpStdioServer
from .tools import SubagentOptions as SubagentOptions
from .tools import TaskToolOptions as TaskToolOptions
from .tools import connect_mcp as connect_mcp
from .tools import load_mcp_config as load_mcp_config

if not TYPE_CHECKING:  # old names, kept for one release (docs/sessions.rst, "Renamed in this release")
    __getattr__ = _renamed(
        __name__,
        {
            "BashOptions": ("trio_harness.BashRuntimeOptions", BashRuntimeOptions),
            "TaskOptions": ("trio_harness.TaskRuntimeOptions", TaskRuntimeOptions),
            "MemoryPersistence": ("trio_harness.MemoryStore", MemoryStore),
            "JsonlPersistence": ("trio_harness.JsonlStore", JsonlStore),
        },
    )
del TYPE_CHECKING, _renamed  # end of old names

_publish_exceptions(__name__, globals())  # trio_harness.X in tracebacks, not the private module
del _publish_exceptions
