"""The durable event vocabulary of a session log.

Every record is an immutable attrs class with a ``type`` class variable (its
wire tag, e.g. ``"turn/start"``), a ``seq`` equal to its index in the log and a
wall-clock ``ts`` taken from the session's injectable clock.  Append events with
:meth:`Session.append`, which assigns ``seq`` and ``ts``.
"""

from __future__ import annotations

import base64
import math
from typing import Any, ClassVar, Literal, TypeAlias, get_args

import attrs

from .._records import OMIT_IF_DEFAULT, Failure, Image, ModelSettings, ReasoningBlock, ToolCall, Usage, UsageTotals

# ---------------------------------------------------------------- validators
#
# The records a caller builds (InboxMessage, SessionHeader) check their fields'
# types on construction: a value the codec cannot write back and read again
# (a number or bytes where text belongs) is refused with a TypeError naming the
# field and the value's type, before anything reaches a log.  The checks are
# exactly the codec's type checks, so every stored record still loads.


def _text(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str, got {type(value).__name__} {value!r:.80}"
        )


def _optional_text(instance: object, attribute: attrs.Attribute[str | None], value: object) -> None:
    if value is not None and not isinstance(value, str):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a str or None, "
            f"got {type(value).__name__} {value!r:.80}"
        )


def _count(instance: object, attribute: attrs.Attribute[int], value: object) -> None:
    if type(value) is not int:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be an int, got {type(value).__name__} {value!r:.80}"
        )
    if value < 0:
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must not be negative, got {value!r}")


def _timestamp(instance: object, attribute: attrs.Attribute[float], value: object) -> None:
    if type(value) is not float and type(value) is not int:
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a number, got {type(value).__name__} {value!r:.80}"
        )
    if not math.isfinite(value):
        raise ValueError(f"{type(instance).__name__}.{attribute.name} must be finite, got {value!r}")


def _optional_settings(instance: object, attribute: attrs.Attribute[ModelSettings | None], value: object) -> None:
    if value is not None and not isinstance(value, ModelSettings):
        raise TypeError(
            f"{type(instance).__name__}.{attribute.name} must be a ModelSettings or None, "
            f"got {type(value).__name__} {value!r:.80}"
        )


def _send_mode(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or value not in _SEND_MODES:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be one of {', '.join(_SEND_MODES)}, got {value!r:.80}"
        )


def _origin(instance: object, attribute: attrs.Attribute[str], value: object) -> None:
    if not isinstance(value, str) or value not in _ORIGINS:
        raise ValueError(
            f"{type(instance).__name__}.{attribute.name} must be one of {', '.join(_ORIGINS)}, got {value!r:.80}"
        )


TurnEndReason: TypeAlias = Literal[
    "completed", "max-tokens", "blocked", "budget", "aborted", "error", "interrupted", "paused"
]
CancelCause: TypeAlias = Literal["user", "parent", "hook", "disposed"]
InboxQueue: TypeAlias = Literal["next-turn", "next-step"]
SendMode: TypeAlias = Literal["followup", "steer", "inject"]
ApprovalOutcome: TypeAlias = Literal["allow_once", "allow_always", "deny", "deny_always", "cancelled"]
ApprovalSource: TypeAlias = Literal["approver", "remembered", "error", "cancelled", "interrupted"]
CompactionReason: TypeAlias = Literal["threshold", "overflow", "manual"]
MessageOrigin: TypeAlias = Literal["user", "task-notice"]
"""Where an inbox message comes from: ``user`` (whoever called ``send``: a
person, a front end, code) or ``task-notice`` (the completion notice of a
background task, delivered by the task tools).  The model reads both as user
text; front ends show a notice as the agent's information, not as user text."""
_SEND_MODES: tuple[str, ...] = get_args(SendMode)
_ORIGINS: tuple[str, ...] = get_args(MessageOrigin)


MAX_IMAGE_BYTES = 5 * 1024 * 1024
"""The largest image a message may carry (5 MiB of encoded image file, Anthropic's limit per image)."""

MAX_INLINE_IMAGE_BYTES = 64 * 1024
"""The largest image stored inline in its event's line (64 KiB); a larger one is stored by reference.

Below it, base64 in the line costs less than a file or row of its own (an
icon, a small diagram); above it, a screenshot would make a line of megabytes
that every load parses (docs/sessions.rst, "Images")."""

ImageMediaType: TypeAlias = Literal["image/png", "image/jpeg", "image/gif", "image/webp"]
"""The media types of message images (those of :class:`~trio_harness.model.Image`)."""


@attrs.frozen
class ImagePart:
    """An image of a user message as the log holds it: inline in base64, or by reference.

    An image of at most :data:`MAX_INLINE_IMAGE_BYTES` is
    stored inline in the line of the message (``inbox/spliced`` and
    ``user/message``); a larger one (up to :data:`MAX_IMAGE_BYTES`) is stored
    once beside the log, named by its SHA-256, and the line holds only
    ``sha256`` and ``size`` (docs/sessions.rst, "Images").  A resumed
    session's parts are read back inline; a read-only load keeps references
    (:attr:`by_reference`).  Build one from an
    :class:`~trio_harness.model.Image` with :meth:`of`.

    Attributes:
        media_type: ``image/png``, ``image/jpeg``, ``image/gif`` or ``image/webp``.
        data: the image file's bytes, base64-encoded (standard alphabet,
            padded); empty in a part read by reference.
        sha256: the lowercase hex SHA-256 of the image file's bytes, for an
            image stored by reference (empty otherwise).
        size: the image file's length in bytes, for an image stored by reference.
    """

    media_type: ImageMediaType
    data: str = attrs.field(default="", repr=lambda data: f"<{len(data)} base64 characters>", metadata=OMIT_IF_DEFAULT)
    sha256: str = attrs.field(default="", metadata=OMIT_IF_DEFAULT)
    size: int = attrs.field(default=0, metadata=OMIT_IF_DEFAULT)

    @classmethod
    def of(cls, image: Image) -> ImagePart:
        """The log form of ``image``.

        Raises:
            TypeError: ``image`` is not an :class:`~trio_harness.model.Image`.
            ValueError: the image is larger than :data:`MAX_IMAGE_BYTES`.
        """
        if not isinstance(image, Image):
            raise TypeError(f"expected an Image, got {type(image).__name__}")
        if len(image.data) > MAX_IMAGE_BYTES:
            raise ValueError(
                f"the {image.media_type} image is {len(image.data)} bytes, more than the {MAX_IMAGE_BYTES} "
                "bytes a message image may have; scale it down"
            )
        return cls(image.media_type, base64.b64encode(image.data).decode("ascii"))  # type: ignore[arg-type]

    @property
    def by_reference(self) -> bool:
        """Whether this part holds only a reference (its bytes are beside the log, not read yet)."""
        return not self.data and bool(self.sha256)

    def image(self) -> Image:
        """The :class:`~trio_harness.model.Image` it stands for.

        Raises:
            ValueError: the part is :attr:`by_reference` (a read-only load's):
                its bytes were not read.
        """
        if self.by_reference:
            raise ValueError(
                f"the {self.media_type} image {self.sha256} is stored by reference and was not read back "
                "(a read-only load keeps references; resume the session to read them)"
            )
        return Image(base64.b64decode(self.data), self.media_type)


def _images(instance: object, attribute: attrs.Attribute[tuple[ImagePart, ...]], value: object) -> None:
    if type(value) is tuple and (not value or all(type(part) is ImagePart for part in value)):
        return  # an empty tuple (every message without images, one a run) skips the generator
    raise TypeError(f"{type(instance).__name__}.{attribute.name} must be a tuple of ImagePart, got {value!r:.80}")


@attrs.frozen
class Event:
    """Base of every session event: ``seq`` (index in the log) and ``ts`` (wall clock)."""

    type: ClassVar[str] = ""
    seq: int
    ts: float


@attrs.frozen
class InboxMessage:
    """A message waiting in an agent's inbox.

    Attributes:
        id: unique among the pending messages of one agent.
        text: the message text given to the model.
        mode: how it was sent (followup, steer or inject).
        settings: model settings for the turn this message opens (a
            followup's; see :class:`~trio_harness.model.ModelSettings`).
        origin: ``user`` (the default) or ``task-notice`` (a background
            task's completion notice); see :data:`MessageOrigin`.  Stored
            only when not ``user``, so older logs read unchanged.
        images: the images that follow the text (:class:`ImagePart`), stored
            only when there are some.

    Raises:
        TypeError: ``id`` or ``text`` is not a str, ``settings`` not a
            ModelSettings.
        ValueError: ``mode`` is not followup, steer or inject; ``origin`` is
            not user or task-notice.
    """

    id: str = attrs.field(validator=_text)
    text: str = attrs.field(validator=_text)
    mode: SendMode = attrs.field(default="followup", validator=_send_mode)
    settings: ModelSettings | None = attrs.field(default=None, validator=_optional_settings, metadata=OMIT_IF_DEFAULT)
    origin: MessageOrigin = attrs.field(default="user", validator=_origin, metadata=OMIT_IF_DEFAULT)
    images: tuple[ImagePart, ...] = attrs.field(default=(), validator=_images, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class TurnStart(Event):
    """A turn began."""

    type: ClassVar[str] = "turn/start"
    turn: int


@attrs.frozen
class StepStart(Event):
    """A step (one model request and its tool calls) began."""

    type: ClassVar[str] = "step/start"
    turn: int
    step: int


@attrs.frozen
class UserMessage(Event):
    """A pending inbox message was claimed into the conversation.

    Attributes:
        origin: the claimed message's origin: ``user`` or ``task-notice`` (a
            background task's completion notice, which the model reads as user
            text and front ends show as the agent's information).  Written
            only when not ``user``.
        images: the message's images (:class:`ImagePart`), after its text in
            the request; written only when there are some.
    """

    type: ClassVar[str] = "user/message"
    turn: int
    step: int
    message_id: str
    text: str
    mode: SendMode = "followup"
    origin: MessageOrigin = attrs.field(default="user", metadata=OMIT_IF_DEFAULT)
    images: tuple[ImagePart, ...] = attrs.field(default=(), metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class RequestHeader(Event):
    """What was asked of the model at this step (the body is derived from the log).

    Attributes:
        settings: the merged model settings of the request (turn, agent,
            harness and model spec), None when none is set.
    """

    type: ClassVar[str] = "request/header"
    turn: int
    step: int
    provider: str
    model: str
    tools: tuple[str, ...] = ()
    max_tokens: int | None = None
    settings: ModelSettings | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class RequestRetry(Event):
    """The provider retried the request after a retryable failure."""

    type: ClassVar[str] = "request/retry"
    turn: int
    step: int
    attempt: int
    delay: float
    failure: Failure


@attrs.frozen
class AssistantChunk(Event):
    """A streamed piece of the assistant's text or reasoning."""

    type: ClassVar[str] = "assistant/chunk"
    turn: int
    step: int
    kind: Literal["text", "reasoning"]
    text: str


@attrs.frozen
class AssistantMessage(Event):
    """The assistant's complete message for one step.

    Attributes:
        reasoning_blocks: the opaque blocks the provider reported during the
            step (:class:`~trio_harness.model.ReasoningBlock`: Anthropic
            thinking, OpenAI Responses reasoning items), in the order it
            reported them.  Later requests send them back with this message,
            except for a message whose finish is ``error`` or ``aborted``
            (logged, never sent back: such a step may lack what the block
            belongs to).  Written only when there are some, so older logs
            read unchanged.
        response_model: the model the server said answered
            (:class:`~trio_harness.model.ResponseInfo`), ``""`` when it named
            none; written only when known, as is
        response_id: the server's id of the response.
    """

    type: ClassVar[str] = "assistant/message"
    turn: int
    step: int
    text: str
    reasoning: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    usage: Usage | None = None
    finish: str = "stop"
    reasoning_blocks: tuple[ReasoningBlock, ...] = attrs.field(default=(), metadata=OMIT_IF_DEFAULT)
    response_model: str = attrs.field(default="", metadata=OMIT_IF_DEFAULT)
    response_id: str = attrs.field(default="", metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class ToolCallRequested(Event):
    """A tool call is being dispatched."""

    type: ClassVar[str] = "tool/call"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen
class ToolStarted(Event):
    """A tool call's handler is about to run: from here on the call may have had effects.

    Logged after the call's argument checks, its approval and the wait for
    the concurrency limit, and handed to the store (a checkpoint) before the
    handler starts.  A resumed log with ``tool/started`` and no
    ``tool/result`` gets a result saying the call was interrupted while
    running and may have had effects (docs/guarantees.rst, "Durable steps").

    Attributes:
        call_id: the model's id of the call (``ToolContext.call_id``).
        name: the tool name.
    """

    type: ClassVar[str] = "tool/started"
    turn: int
    step: int
    call_id: str
    name: str


@attrs.frozen
class ToolResult(Event):
    """The result of a tool call (logged in the model's order).

    Attributes:
        detail: the tool's structured facts about the call (its
            ``ToolOutput.detail``, e.g. a file tool's diff), not sent to the
            model; None when it gave none.
    """

    type: ClassVar[str] = "tool/result"
    turn: int
    step: int
    call_id: str
    name: str
    content: str
    is_error: bool = False
    detail: dict[str, Any] | None = attrs.field(default=None, hash=False, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class ApprovalRequested(Event):
    """A tool call that requires approval is waiting for the approver's decision.

    Logged after the call's ``tool/call`` and before it runs; its
    ``approval/decided`` follows (docs/approval.rst).

    Attributes:
        call_id: the model's id of the call.
        name: the tool name.
        arguments: the raw JSON arguments, exactly as the model sent them.
    """

    type: ClassVar[str] = "approval/requested"
    turn: int
    step: int
    call_id: str
    name: str
    arguments: str


@attrs.frozen
class ApprovalDecided(Event):
    """How a call that requires approval was decided.

    Attributes:
        call_id: the model's id of the call.
        name: the tool name.
        outcome: ``allow_once`` / ``allow_always`` (the call runs), ``deny`` /
            ``deny_always`` (it does not; the model reads an error result), or
            ``cancelled`` (the wait ended without a decision: the call did not
            run).  ``allow_always`` and ``deny_always`` are remembered for this
            session and tool, also across a resume.
        source: who decided: ``approver`` (it answered), ``remembered`` (an
            earlier ``*_always`` decision; nobody was asked), ``error`` (the
            approver failed, so the call is denied; ``message`` says how),
            ``cancelled`` (the turn was cancelled or the agent disposed while
            waiting; ``cause`` says which) or ``interrupted`` (written on
            resume: the process stopped while waiting).
        message: the approver's message for the model (a denial's reason), or
            the error of a failed approver.
        cause: the cancel cause of a ``cancelled`` wait, when the turn recorded one.
    """

    type: ClassVar[str] = "approval/decided"
    turn: int
    step: int
    call_id: str
    name: str
    outcome: ApprovalOutcome
    source: ApprovalSource
    message: str | None = None
    cause: CancelCause | None = None


@attrs.frozen
class ControlRefused(Event):
    """A control posted through ``harness.sessions.post`` that could not be applied (docs/approval.rst).

    Logged where the poster cannot be told at once (the control travelled
    through the store's mailbox, or a decision kept for a paused call turned
    out stale): a decision for a call answered meanwhile, one meant for an
    earlier call whose id the model reused, or one for an agent that cannot
    take decisions.  Nothing of the control was applied.

    Attributes:
        message_id: the posted control's id (what ``post`` returned).
        kind: ``decision`` or ``cancel``; ``unknown`` for a control that
            could not be read (malformed, or of a newer version), or for a
            mailbox row that is no message at all (``message_id`` is then
            ``mailbox row N``; the row was removed).
        reason: why it was not applied.
        call_id: the call a decision was posted for.
    """

    type: ClassVar[str] = "control/refused"
    message_id: str
    kind: Literal["cancel", "decision", "unknown"]
    reason: str
    call_id: str | None = None


@attrs.frozen
class StepEnd(Event):
    """A step ended."""

    type: ClassVar[str] = "step/end"
    turn: int
    step: int


@attrs.frozen
class TurnEnd(Event):
    """A turn ended.

    Attributes:
        reason: completed, max-tokens, blocked (``max_steps``), budget (a
            token or request budget, with ``failure`` naming it), aborted
            (with ``cause``), error (with ``failure``), interrupted (closed
            on recovery) or paused (cut off while a call waited for approval:
            ``cause`` ``disposed`` for a disposal, none when recovery closed
            the log of a process that stopped; the call keeps its
            ``approval/requested`` without a decision or a result, and the
            continuation turn asks again, docs/approval.rst).
        usage: the turn's model usage (None in logs written before it was
            recorded, and for turns closed on recovery).
    """

    type: ClassVar[str] = "turn/end"
    turn: int
    reason: TurnEndReason
    cause: CancelCause | None = None
    failure: Failure | None = None
    usage: UsageTotals | None = attrs.field(default=None, metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class InboxSpliced(Event):
    """One inbox mutation, written before the in-memory lists change.

    ``queue[start:start + len(removed)]`` is replaced by ``inserted``.
    ``outcome`` is ``"canceled"`` for remove / clear / replace deletions,
    ``"claimed"`` for a claim by ``turn``, and ``None`` for pure insertions.
    """

    type: ClassVar[str] = "agent/inbox/spliced"
    queue: InboxQueue
    start: int
    removed: tuple[str, ...] = ()
    inserted: tuple[InboxMessage, ...] = ()
    outcome: Literal["canceled", "claimed"] | None = None
    turn: int | None = None


@attrs.frozen
class ContextCompacted(Event):
    """The older part of the conversation was replaced by a summary.

    Model requests after this event are built from the system prompt, this
    ``summary`` and the events from seq ``boundary`` on (always a
    ``turn/start``: no turn and no tool call is ever cut).  Logged only once
    the summary is complete, so a cancelled compaction compacts nothing.

    Attributes:
        boundary: the seq of the first event kept as it is.
        summary: the summary of everything before ``boundary`` (including
            any earlier summary).
        reason: ``threshold`` (the request estimate passed the threshold),
            ``overflow`` (the provider refused a request as too long) or
            ``manual`` (``agent.compact()``).
        turn: the turn during which it ran, None between turns.
        tokens_before: the estimated tokens of the request before compacting.
        usage: the usage of the summary requests.
        partials: the intermediate summaries, when the compacted part took
            several summary requests (each request summarizes one more piece
            after the previous summary); ``summary`` is the last one.
    """

    type: ClassVar[str] = "context/compacted"
    boundary: int
    summary: str
    reason: CompactionReason
    turn: int | None = None
    tokens_before: int = 0
    usage: UsageTotals | None = None
    partials: tuple[str, ...] = attrs.field(default=(), metadata=OMIT_IF_DEFAULT)


@attrs.frozen
class CompactionFailed(Event):
    """A context compaction's summary request failed: nothing was compacted.

    Logged so that the failure, and the usage its requests spent, are part of
    the session: usage totals and budgets count ``usage``, a resumed agent does
    not retry the compaction between turns right after the turn it failed in
    or after, and editors see it (docs/long-sessions.rst, "Context-window
    management").

    Attributes:
        reason: why the compaction ran (as in ``context/compacted``).
        failure: what went wrong (code ``summary-failed`` with the provider's
            failure in the message, or ``summary-empty``).
        turn: the turn during which it ran, None between turns.
        usage: the usage of its summary requests, the failed one included.
    """

    type: ClassVar[str] = "context/compaction-failed"
    reason: CompactionReason
    failure: Failure
    turn: int | None = None
    usage: UsageTotals | None = None


@attrs.frozen
class ConfigChanged(Event):
    """A session setting was chosen for the requests from here on (an ACP config option, ``/`` command, ...).

    The ACP bridge logs ``session/set_config_option`` and ``session/set_mode``
    as this event, so a resumed or loaded session keeps the choice
    (docs/acp.rst, "Config options").  The last event of an ``option`` wins.

    Attributes:
        option: the setting's id (``mode``, ``model``).
        value: the chosen value's id.
    """

    type: ClassVar[str] = "session/config"
    option: str
    value: str


AnyEvent: TypeAlias = (
    TurnStart
    | StepStart
    | UserMessage
    | RequestHeader
    | RequestRetry
    | AssistantChunk
    | AssistantMessage
    | ToolCallRequested
    | ToolStarted
    | ToolResult
    | StepEnd
    | TurnEnd
    | InboxSpliced
    | ApprovalRequested
    | ApprovalDecided
    | ContextCompacted
    | CompactionFailed
    | ConfigChanged
    | ControlRefused
)

EVENT_TYPES: tuple[type[Event], ...] = (
    TurnStart,
    StepStart,
    UserMessage,
    RequestHeader,
    RequestRetry,
    AssistantChunk,
    AssistantMessage,
    ToolCallRequested,
    ToolStarted,
    ToolResult,
    StepEnd,
    TurnEnd,
    InboxSpliced,
    ApprovalRequested,
    ApprovalDecided,
    ContextCompacted,
    CompactionFailed,
    ConfigChanged,
    ControlRefused,
)
"""Every event class, in a stable order.

New types are only ever added (``approval/requested``, ``approval/decided``
and ``tool/started`` came after the first release): every log written before
them still reads, so the format version stays the same.  A log that uses them cannot be read by an
older library (it refuses the unknown type with a clear error).
"""


FORMAT_VERSION = 1
"""The session log format version this library writes and reads."""


@attrs.frozen
class SessionHeader:
    """The first line of a session log.

    Attributes:
        id: the session id (also the live agent's id).
        created_at: wall-clock creation time (seconds since the epoch).
        cwd: the working directory the session was created for.
        parent_session: the session this one was forked from (lineage only).
        seed_length: how many events were copied in by a fork; inbox replay
            and turn numbering start after them.
        version: the log format version.

    Raises:
        TypeError: a field has the wrong type (``cwd`` bytes or a number, ...).
        ValueError: ``created_at`` is not finite or ``seed_length`` is negative.
    """

    type: ClassVar[str] = "session"
    id: str = attrs.field(validator=_text)
    created_at: float = attrs.field(validator=_timestamp)
    cwd: str = attrs.field(default="", validator=_text)
    parent_session: str | None = attrs.field(default=None, validator=_optional_text)
    seed_length: int = attrs.field(default=0, validator=_count)
    version: int = attrs.field(default=FORMAT_VERSION, validator=_count)
