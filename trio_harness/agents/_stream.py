"""``agent.events()``: a bounded, non-blocking stream of an agent's session events.

The policy when the consumer is slow is to **drop, counted, never block**
(docs/long-sessions.rst, "Event streams").  Session observers are called
synchronously inside :meth:`~trio_harness.session.Session.append`, from the
driver's hot path and from the shielded blocks that close a turn; blocking
there would let a slow display stall the agent, its cancellation and its
teardown.  So each stream holds at most ``buffer`` events; while it is full,
new events are not queued but counted, and the consumer receives one
:class:`StreamGap` in their place, in order, naming how many events it missed
and their ``seq`` range.  Nothing is lost for good: the session log holds
every event, so ``agent.session.events[gap.first_seq:gap.last_seq + 1]`` are
exactly the missed ones.

A stream ends when its ``async with`` block exits or when the agent is
disposed; events already buffered (and a pending gap) are still delivered
before the ``async for`` loop ends.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from typing import ClassVar, TypeAlias

import attrs
import trio

from .._util import is_positive_int
from ..session._events import Event
from ..session._session import Session

__all__ = ["DEFAULT_STREAM_BUFFER", "EventStream", "StreamGap", "StreamItem", "StreamRegistry"]

DEFAULT_STREAM_BUFFER = 256
"""How many events an :meth:`agent.events() <trio_harness.agents.ReactAgent.events>` stream buffers by default."""


@attrs.frozen
class StreamGap:
    """Events a stream dropped because its consumer fell behind (the session log has them all).

    Attributes:
        dropped: how many consecutive events were dropped.
        first_seq: the ``seq`` of the first dropped event.
        last_seq: the ``seq`` of the last dropped event.
    """

    type: ClassVar[str] = "stream/gap"
    dropped: int
    first_seq: int
    last_seq: int


StreamItem: TypeAlias = Event | StreamGap
"""What an event stream yields: a session event, or a gap marker."""


@attrs.define(eq=False)
class _Feed:
    """The producer side: a session observer that never blocks."""

    send: trio.MemorySendChannel[StreamItem]
    pending: StreamGap | None = None
    dropped: int = 0
    closed: bool = False

    def __call__(self, event: Event) -> None:
        if self.closed:
            return
        if self.pending is not None:
            try:
                self.send.send_nowait(self.pending)
            except trio.WouldBlock:
                self._drop(event)
                return
            self.pending = None
        try:
            self.send.send_nowait(event)
        except trio.WouldBlock:
            self._drop(event)

    def _drop(self, event: Event) -> None:
        self.dropped += 1
        gap = self.pending
        if gap is None:
            self.pending = StreamGap(dropped=1, first_seq=event.seq, last_seq=event.seq)
        else:
            self.pending = StreamGap(dropped=gap.dropped + 1, first_seq=gap.first_seq, last_seq=event.seq)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.send.close()


@attrs.define(eq=False)
class EventStream:
    """An async iterator over an agent's session events (see the module docstring).

    Get one with ``async with agent.events() as stream:`` and read it with
    ``async for item in stream:``; each item is a session event
    (:mod:`trio_harness.events`) or a :class:`StreamGap`.
    """

    _receive: trio.MemoryReceiveChannel[StreamItem] = attrs.field(alias="receive")
    _feed: _Feed = attrs.field(alias="feed")

    @property
    def buffer(self) -> int:
        """The most items the stream holds for its consumer."""
        return int(self._receive.statistics().max_buffer_size)

    @property
    def dropped(self) -> int:
        """How many events this stream dropped so far (each reported in a :class:`StreamGap`)."""
        return self._feed.dropped

    @property
    def closed(self) -> bool:
        """Whether no more events will arrive (the block exited or the agent was disposed)."""
        return self._feed.closed

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StreamItem:
        try:
            return self._receive.receive_nowait()
        except trio.WouldBlock:
            pass
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return self._take_pending()
        if self._feed.pending is not None:
            # Nothing is buffered: the gap comes next in order.
            return self._take_pending()
        try:
            return await self._receive.receive()
        except (trio.EndOfChannel, trio.ClosedResourceError):
            return self._take_pending()

    def _take_pending(self) -> StreamGap:
        gap = self._feed.pending
        if gap is None:
            raise StopAsyncIteration
        self._feed.pending = None
        return gap


@attrs.define(eq=False)
class StreamRegistry:
    """The open streams of one agent; :meth:`close_all` ends them when the agent is disposed."""

    _feeds: set[_Feed] = attrs.field(factory=set, init=False)

    def close_all(self) -> None:
        """End every open stream (buffered events are still delivered)."""
        feeds, self._feeds = self._feeds, set()
        for feed in feeds:
            feed.close()

    @asynccontextmanager
    async def open(self, session: Session, buffer: int, check_live: Callable[[], None]) -> AsyncIterator[EventStream]:
        """Open a stream of ``session``'s events from now on, bounded by ``buffer``."""
        if not is_positive_int(buffer):
            raise ValueError(f"buffer must be a positive int, got {buffer!r}")
        check_live()
        send, receive = trio.open_memory_channel[StreamItem](buffer)
        feed = _Feed(send)
        remove = session.observe(feed)
        self._feeds.add(feed)
        try:
            yield EventStream(receive=receive, feed=feed)
        finally:
            remove()
            self._feeds.discard(feed)
            feed.close()
            receive.close()
