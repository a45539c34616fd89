"""The durable event vocabulary of a session log, for applications.

``from trio_harness import events as ev`` and match on ``ev.TurnEnd``,
``ev.AssistantChunk`` and friends.  Every record is immutable, carries ``seq``
(its index in the log) and ``ts`` (wall clock), and has a ``type`` class
variable that is its wire tag (e.g. ``"turn/start"``).
"""

from .session._events import EVENT_TYPES as EVENT_TYPES
from .session._events import MAX_IMAGE_BYTES as MAX_IMAGE_BYTES
from .session._events import MAX_INLINE_IMAGE_BYTES as MAX_INLINE_IMAGE_BYTES
from .session._events import ApprovalDecided as ApprovalDecided
from .session._events import ApprovalRequested as ApprovalRequested
from .session._events import AssistantChunk as AssistantChunk
from .session._events import AssistantMessage as AssistantMessage
from .session._events import CompactionFailed as CompactionFailed
from .session._events import ConfigChanged as ConfigChanged
from .session._events import ContextCompacted as ContextCompacted
from .session._events import ControlRefused as ControlRefused
from .session._events import Event as Event
from .session._events import ImageMediaType as ImageMediaType
from .session._events import ImagePart as ImagePart
from .session._events import InboxMessage as InboxMessage
from .session._events import InboxSpliced as InboxSpliced
from .session._events import MessageOrigin as MessageOrigin
from .session._events import RequestHeader as RequestHeader
from .session._events import RequestRetry as RequestRetry
from .session._events import StepEnd as StepEnd
from .session._events import StepStart as StepStart
from .session._events import ToolCallRequested as ToolCallRequested
from .session._events import ToolResult as ToolResult
from .session._events import ToolStarted as ToolStarted
from .session._events import TurnEnd as TurnEnd
from .session._events import TurnStart as TurnStart
from .session._events import UserMessage as UserMessage
