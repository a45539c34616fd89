"""The durable inbox: next-turn and next-step lists projected from splice events.

Every mutation first appends an ``agent/inbox/spliced`` event to the session
and only then changes the in-memory lists, so a synchronous session observer
sees the pre-splice projection and resume can rebuild the lists exactly by
replaying the splices.  A message id is pending at most once across both lists.

A message posted through the store (``harness.sessions.post``) is *staged*
(:meth:`Inbox.stage`): its splice is logged at once, at the end of its queue,
but the lists only take it once a flush has stored that splice, so a worker
that lost the session before the commit never acts on it.  While staged it
sits after every live message of its queue in the log's projection, and every
other mutation computes its coordinates on the live lists, so the log and the
lists agree when it is applied (at the end of its queue).

A mutation requested while a splice is being logged (from a session observer,
which must see the pre-splice projection) is deferred until that splice is
applied, so the durable log and the live lists never disagree.  Inserts and
``clear`` can be deferred; a re-entrant ``remove``, ``replace`` or ``claim``
(whose result the caller needs at once) is refused.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Collection, Sequence
from typing import Literal, TypeAlias

import attrs

from .._errors import AgentDisposedError, InboxError
from .._records import Image
from ..session import _events as ev
from ..session._events import ImagePart, InboxMessage, InboxQueue, InboxSpliced, SendMode
from ..session._session import Session

Prompt: TypeAlias = str | InboxMessage | Sequence[str | Image]
"""What ``send``, ``followup``, ``run`` and the others take: text, a message
object, or a sequence of text pieces and :class:`~trio_harness.model.Image`
values (the texts joined by blank lines; the images follow the text, in order)."""

_counter = itertools.count(1)
_prefix = os.urandom(4).hex()


def new_message_id() -> str:
    """A fresh message id, unique in this process and very likely across processes."""
    return f"msg-{_prefix}-{next(_counter)}"


Notify = Callable[[str, InboxMessage, int | None], None]


def _no_notify(kind: str, message: InboxMessage, turn: int | None) -> None:
    return None


@attrs.define(eq=False)
class Inbox:
    """Pending work of one agent.

    Attributes:
        next_turn: messages that each start a new ordinary turn (followups).
        next_step: messages joining the next step of a running driver (steer, inject).
    """

    _session: Session = attrs.field(alias="session")
    # Called as notify("inserted" | "claimed" | "discarded", message, turn) after each change.
    _notify: Notify = attrs.field(default=_no_notify, alias="notify")
    _next_turn: list[InboxMessage] = attrs.field(factory=list, init=False)
    _next_step: list[InboxMessage] = attrs.field(factory=list, init=False)
    _ids: set[str] = attrs.field(factory=set, init=False)
    # True while a splice event is being appended (its observers run then).
    _splicing: bool = attrs.field(default=False, init=False)
    # Mutations requested while splicing: ("append" | "prepend" | "clear", queue, message).
    _deferred: list[tuple[str, InboxQueue | None, InboxMessage | None]] = attrs.field(factory=list, init=False)
    # Staged messages (logged, not yet stored), oldest first: (queue, message).
    _staged: list[tuple[InboxQueue, InboxMessage]] = attrs.field(factory=list, init=False)
    # Set by seal(): why the inbox is read-only now.
    _sealed: str | None = attrs.field(default=None, init=False)

    # ------------------------------------------------------------ replay

    @classmethod
    def replay(cls, session: Session, *, notify: Notify = _no_notify) -> Inbox:
        """Rebuild the inbox from the splices after the session's seed.

        Raises:
            InboxError: a persisted splice has invalid coordinates, removes ids
                that are not there, or inserts an id that is already pending.
        """
        inbox = cls(session=session)
        for event in session.events[session.header.seed_length :]:
            if isinstance(event, InboxSpliced):
                try:
                    inbox._check(event.queue, event.start, event.removed, event.inserted)
                except InboxError as exc:
                    raise InboxError(
                        f"session {session.id!r}: invalid inbox splice at seq {event.seq}: {exc}"
                    ) from None
                inbox._apply(event.queue, event.start, event.removed, event.inserted)
        inbox._notify = notify
        return inbox

    # ------------------------------------------------------------ views

    @property
    def next_turn(self) -> Sequence[InboxMessage]:
        """Pending next-turn messages (read-only view)."""
        return tuple(self._next_turn)

    @property
    def next_step(self) -> Sequence[InboxMessage]:
        """Pending next-step messages (read-only view)."""
        return tuple(self._next_step)

    def __len__(self) -> int:
        return len(self._next_turn) + len(self._next_step)

    def __contains__(self, message_id: object) -> bool:
        return message_id in self._ids

    def has_turn_work(self) -> bool:
        """Whether a next-turn message is pending."""
        return bool(self._next_turn)

    def has_step_work(self) -> bool:
        """Whether a next-step message is pending."""
        return bool(self._next_step)

    def find(self, message_id: str) -> tuple[InboxQueue, int] | None:
        """Where a pending message is, or None."""
        queues: tuple[tuple[InboxQueue, list[InboxMessage]], ...] = (
            ("next-turn", self._next_turn),
            ("next-step", self._next_step),
        )
        for queue, items in queues:
            for index, message in enumerate(items):
                if message.id == message_id:
                    return queue, index
        return None

    # ------------------------------------------------------------ core

    def _list(self, queue: InboxQueue) -> list[InboxMessage]:
        if queue == "next-turn":
            return self._next_turn
        if queue == "next-step":
            return self._next_step
        raise InboxError(f"unknown inbox queue {queue!r}")

    def seal(self, reason: str) -> None:
        """Make the inbox read-only: every later change raises :class:`AgentDisposedError`.

        The agent seals its inbox when it is disposed, before its session's
        final flush, so nothing is appended to a log that is already detached.
        """
        if self._sealed is None:
            self._sealed = reason

    @property
    def sealed(self) -> bool:
        """Whether the inbox is read-only (its agent was disposed)."""
        return self._sealed is not None

    def _check(self, queue: InboxQueue, start: int, removed: Sequence[str], inserted: Sequence[InboxMessage]) -> None:
        if self._sealed is not None:
            raise AgentDisposedError(self._sealed)
        items = self._list(queue)
        if not 0 <= start <= len(items) or start + len(removed) > len(items):
            raise InboxError(f"splice at {start} removing {len(removed)} is outside {queue} of length {len(items)}")
        remaining = self._ids
        if removed:
            end = start + len(removed)
            for message, message_id in zip(items[start:end], removed):
                if message.id != message_id:
                    actual = [m.id for m in items[start:end]]
                    raise InboxError(f"splice expected to remove {list(removed)} from {queue} but found {actual}")
            remaining = remaining.difference(removed)
        if not inserted:
            return
        seen: set[str] = {message.id for _, message in self._staged}
        for message in inserted:
            if message.id in remaining or message.id in seen:
                raise InboxError(f"message id {message.id!r} is already pending")
            seen.add(message.id)

    def _apply(
        self, queue: InboxQueue, start: int, removed: Sequence[str], inserted: Sequence[InboxMessage]
    ) -> list[InboxMessage]:
        items = self._list(queue)
        end = start + len(removed)
        gone = items[start:end]
        items[start:end] = inserted
        if removed:
            self._ids.difference_update(removed)
        for message in inserted:
            self._ids.add(message.id)
        return gone

    def _splice(
        self,
        queue: InboxQueue,
        start: int,
        removed: Sequence[str],
        inserted: Sequence[InboxMessage],
        outcome: Literal["canceled", "claimed"] | None,
        turn: int | None = None,
    ) -> list[InboxMessage]:
        self._check(queue, start, removed, inserted)
        # Durable fact first, then the projection.
        self._splicing = True
        try:
            self._session.append(
                InboxSpliced,
                queue=queue,
                start=start,
                removed=tuple(removed),
                inserted=tuple(inserted),
                outcome=outcome,
                turn=turn,
            )
        finally:
            self._splicing = False
        gone = self._apply(queue, start, removed, inserted)
        notify = self._notify
        if gone:
            kind = "claimed" if outcome == "claimed" else "discarded"
            for message in gone:
                notify(kind, message, turn)
        for message in inserted:
            notify("inserted", message, None)
        if self._deferred:
            self._run_deferred()
        return gone

    def _defer(self, op: str, queue: InboxQueue | None, message: InboxMessage | None) -> None:
        if self._sealed is not None:
            raise AgentDisposedError(self._sealed)
        if message is not None:
            assert queue is not None  # append and prepend name their queue
            self._list(queue)  # validates the queue name now
            if message.id in self._ids or any(m is not None and m.id == message.id for _, _, m in self._deferred):
                raise InboxError(f"message id {message.id!r} is already pending")
        self._deferred.append((op, queue, message))

    def _refuse_reentry(self, what: str) -> None:
        if self._splicing:
            raise InboxError(f"cannot {what} while the inbox is logging a splice (from a session observer)")

    def _run_deferred(self) -> None:
        while self._deferred and not self._splicing:
            op, queue, message = self._deferred.pop(0)
            if op == "clear":
                self.clear()
            elif op == "mark":
                self.mark_cancel()
            else:
                assert queue is not None and message is not None  # append and prepend carry both
                if op == "append":
                    self.append(queue, message)
                else:
                    self.prepend(queue, message)

    # ------------------------------------------------------------ operations

    def append(self, queue: InboxQueue, message: InboxMessage) -> None:
        """Add ``message`` at the end of ``queue``."""
        if self._splicing:
            self._defer("append", queue, message)
            return
        self._splice(queue, len(self._list(queue)), (), (message,), None)

    def prepend(self, queue: InboxQueue, message: InboxMessage) -> None:
        """Add ``message`` at the front of ``queue``."""
        if self._splicing:
            self._defer("prepend", queue, message)
            return
        self._splice(queue, 0, (), (message,), None)

    def replace(self, message_id: str, message: InboxMessage) -> None:
        """Replace a pending message in place (one splice: old out, new in).

        Raises:
            InboxError: ``message_id`` is not pending.
        """
        self._refuse_reentry("replace a message")
        where = self.find(message_id)
        if where is None:
            raise InboxError(f"message {message_id!r} is not pending")
        queue, index = where
        self._splice(queue, index, (message_id,), (message,), "canceled")

    def remove(self, message_id: str) -> InboxMessage:
        """Remove a pending message (a canceled deletion).

        Raises:
            InboxError: ``message_id`` is not pending.
        """
        self._refuse_reentry("remove a message")
        where = self.find(message_id)
        if where is None:
            raise InboxError(f"message {message_id!r} is not pending")
        queue, index = where
        return self._splice(queue, index, (message_id,), (), "canceled")[0]

    def clear(self) -> list[InboxMessage]:
        """Remove everything: next-step first, then next-turn, both marked canceled.

        Clearing an empty inbox writes nothing.  Requested while a splice is
        being logged, the clear runs once that splice is applied (and returns
        nothing here).
        """
        if self._splicing:
            self._defer("clear", None, None)
            return []
        gone: list[InboxMessage] = []
        queues: tuple[InboxQueue, ...] = ("next-step", "next-turn")
        for queue in queues:
            items = self._list(queue)
            if items:
                gone += self._splice(queue, 0, [m.id for m in items], (), "canceled")
        return gone

    def mark_cancel(self) -> None:
        """Log the cancel mark: an empty ``canceled`` splice (next-turn, at 0), nothing removed or inserted.

        An effective cancel (not a disposal) writes it after its clear, so the
        log shows where the wake was dropped: what was kept before it waits
        for a wake, a waking send after it runs (docs/inbox.rst, "The durable
        inbox").  The agent's ``cancel`` writes it; replaying it changes nothing.
        Requested while a splice is being logged, it is written once that
        splice is applied.
        """
        if self._splicing:
            self._defer("mark", None, None)
            return
        self._splice("next-turn", 0, (), (), "canceled")

    def stage(self, queue: InboxQueue, message: InboxMessage, on_applied: Callable[[InboxMessage], None]) -> None:
        """Log the splice adding ``message`` at the end of ``queue`` now; take it once it is stored.

        The lists gain ``message`` (and ``on_applied(message)`` runs) at the
        end of the first flush that stores the splice
        (:meth:`Session.on_stored`); until then the driver cannot see it.

        Raises:
            AgentDisposedError: the inbox is sealed.
            InboxError: the id is already pending or staged, or this is called
                from a session observer.
        """
        self._refuse_reentry("stage a message")
        items = self._list(queue)
        self._check(queue, len(items), (), (message,))
        start = len(items) + sum(1 for staged_queue, _ in self._staged if staged_queue == queue)
        self._splicing = True
        try:
            event = self._session.append(
                InboxSpliced, queue=queue, start=start, removed=(), inserted=(message,), outcome=None, turn=None
            )
        finally:
            self._splicing = False
        self._staged.append((queue, message))
        self._session.on_stored(event.seq, lambda: self._apply_staged(message, on_applied))
        if self._deferred:
            self._run_deferred()

    def _apply_staged(self, message: InboxMessage, on_applied: Callable[[InboxMessage], None]) -> None:
        # Stored callbacks run in seq order: this is the oldest staged message of its queue.
        index = next(i for i, (_, staged) in enumerate(self._staged) if staged is message)
        queue = self._staged.pop(index)[0]
        self._apply(queue, len(self._list(queue)), (), (message,))
        self._notify("inserted", message, None)
        on_applied(message)

    @property
    def staged(self) -> Sequence[InboxMessage]:
        """Messages whose splice is logged but not stored yet (invisible to the driver)."""
        return tuple(message for _, message in self._staged)

    def claim(self, turn: int, *, turn_boundary: bool) -> list[InboxMessage]:
        """Take every next-step message, then one next-turn message at a turn boundary.

        Claims are deletions not marked canceled.
        """
        self._refuse_reentry("claim messages")
        claimed: list[InboxMessage] = []
        if self._next_step:
            claimed += self._splice("next-step", 0, [m.id for m in self._next_step], (), "claimed", turn)
        if turn_boundary and self._next_turn:
            claimed += self._splice("next-turn", 0, (self._next_turn[0].id,), (), "claimed", turn)
        return claimed

    @staticmethod
    def message(text: Prompt, mode: SendMode) -> InboxMessage:
        """Build an inbox message from a prompt (a fresh id) or pass a message through.

        Raises:
            TypeError: not text, a message, or a sequence of text and images.
            ValueError: an image is larger than :data:`~trio_harness.events.MAX_IMAGE_BYTES`.
        """
        if type(text) is str:
            return InboxMessage(id=new_message_id(), text=text, mode=mode)
        if isinstance(text, InboxMessage):
            return text
        if isinstance(text, str):
            return InboxMessage(id=new_message_id(), text=str(text), mode=mode)
        content: object = text
        if isinstance(content, Sequence | Image) and not isinstance(content, bytes | bytearray):
            return _content_message(content, mode)
        raise TypeError(
            f"a message must be text, an InboxMessage or a sequence of text and images, got {type(text).__name__}"
        )


def _content_message(content: Sequence[object] | Image, mode: SendMode) -> InboxMessage:
    """The inbox message of a sequence of text pieces and images (a lone Image is one image)."""
    texts: list[str] = []
    images: list[ImagePart] = []
    for index, part in enumerate((content,) if isinstance(content, Image) else content):
        if isinstance(part, str):
            texts.append(part)
        elif isinstance(part, Image):
            images.append(ImagePart.of(part))
        else:
            raise TypeError(f"message part {index} must be text or an Image, got {type(part).__name__}")
    if not texts and not images:
        raise ValueError("a message needs some text or an image, got an empty sequence")
    return InboxMessage(id=new_message_id(), text="\n\n".join(texts), mode=mode, images=tuple(images))


def log_claimed(session: Session, turn: int, step: int, message: InboxMessage) -> None:
    """Log a claimed inbox message as the ``user/message`` that puts it in the conversation."""
    session.append(
        ev.UserMessage,
        turn=turn,
        step=step,
        message_id=message.id,
        text=message.text,
        mode=message.mode,
        origin=message.origin,
        images=message.images,
    )


def restored_wake(session: Session, staged: Collection[str] = ()) -> tuple[bool, bool]:
    """The driver's wake state at the end of ``session``'s log, for a resumed agent: ``(latched, held)``.

    It mirrors the wake latch of the agent that wrote the log
    (docs/inbox.rst, "The durable inbox"): a waking insertion (a followup,
    or a steer; not an inject) latches a wake, which the next step start
    takes (that step claims); an effective cancel drops it, and with it
    holds the next-turn work it kept (``keep_inbox=True``) until a later
    wake: a waking insertion or a turn start.  The cancel is where its mark
    is logged (:meth:`Inbox.mark_cancel`), so a waking send made after it,
    while the cancelled turn was closing, still runs.  In a log written
    before the mark existed the cancel is the turn's end (``aborted`` with
    a ``user``, ``parent`` or ``hook`` cause), where a steer moved to
    next-turn during that turn (sent after the cancel: only a cancelled
    turn routes a steer there) keeps the wake latched.  A disposal is not a
    decision about pending work: a turn aborted ``disposed`` (or closed on
    recovery) holds nothing.

    ``staged``: ids of messages whose splice is logged but not stored yet
    (:attr:`Inbox.staged`); their splices are skipped (the agent acts on
    them once they are stored).

    ``latched``: a wake is owed (the next-step messages run too, injects
    included, as they would have); ``held``: the next-turn messages wait
    for a wake.
    """
    latched = held = False
    marked = late_steer = False  # since the latest turn start: a cancel mark; a steer moved to next-turn
    for event in session.events[session.header.seed_length :]:
        kind = type(event)
        if kind is InboxSpliced:
            assert isinstance(event, InboxSpliced)
            if event.outcome == "canceled" and not event.removed and not event.inserted:  # a cancel's mark
                latched, held, marked = False, True, True
                continue
            inserted = event.inserted if not event.removed and event.outcome is None else ()  # pure insertions
            inserted = tuple(message for message in inserted if message.id not in staged)
            if inserted and (event.queue == "next-turn" or any(message.mode != "inject" for message in inserted)):
                latched, held = True, False
                if event.queue == "next-turn" and any(message.mode == "steer" for message in inserted):
                    late_steer = True
        elif kind is ev.StepStart:
            latched = False
        elif kind is ev.TurnStart:
            held = marked = late_steer = False
        elif kind is ev.TurnEnd:
            assert isinstance(event, ev.TurnEnd)
            cancelled = event.reason == "aborted" and event.cause not in (None, "disposed")
            if cancelled and not marked and not (late_steer and latched):  # (a log without cancel marks)
                latched, held = False, True
    return latched, held


def resume_wakes(session: Session, inbox: Inbox) -> bool:
    """Whether a resumed agent starts a turn for the messages restored in ``inbox`` (see :func:`restored_wake`)."""
    if not len(inbox):
        return False
    latched, held = restored_wake(session, {message.id for message in inbox.staged})
    return latched or (inbox.has_turn_work() and not held)
