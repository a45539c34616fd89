"""One run of an MCP server (a :class:`_Link`) and the two streams its client session is given.

The SDK's :class:`~mcp.client.session.ClientSession` reads from a
:class:`_WatchedStream` and writes into an :class:`_Outbox`, both wrapped
around the transport's streams (:mod:`._mcp_transport`):

* the outbox never blocks a send, so a call's timeout and a cancellation
  bound its writes too, and a cancel of a request still queued drops both;
* the watched stream sees the messages in wire order: ``list_changed`` is
  noticed before the answer that follows it, the tool declarations the SDK
  would refuse are taken out of a listing (:func:`._mcp_tools._sound_tools`),
  and the end of the stream marks the run as over.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ._mcp_tools import _sound_tools
from ._mcp_transport import _HttpFacts, _ProcessFacts

if TYPE_CHECKING:
    from typing import Self

    from mcp.client.session import ClientSession
    from mcp.shared.message import SessionMessage


@attrs.define(eq=False)
class _Link:
    """One run of a server: its transport and client session, and how it ended.

    A connection has one link at a time; a restart (a reconnect over HTTP)
    makes a new one.  ``failure`` is set once the run is over (the process
    exited, the transport failed, the session's read stream ended); until a
    restart it is why the server is not available.
    """

    number: int
    process: _ProcessFacts | None = None
    http: _HttpFacts | None = None
    session: ClientSession | None = None
    # Started: handshake and tool listing done (before that, the start error tells of a failure).
    ready: bool = False
    failure: str | None = None
    # The session's read stream ended: the connection is gone, not one request's stream.
    read_ended: bool = False
    stop: trio.Event = attrs.field(factory=trio.Event)
    held: trio.Event = attrs.field(factory=trio.Event)
    # Ids of the tools/list requests sent, whose answers are checked tool by tool.
    listings: set[str] = attrs.field(factory=set)
    # Tools of the answers seen so far that were left out: (label, reason).
    skipped: list[tuple[str, str]] = attrs.field(factory=list)
    outbox: _Outbox = attrs.field(init=False)

    def __attrs_post_init__(self) -> None:
        self.outbox = _Outbox(self.listings)


class _Outbox:
    """The client session's write stream: a send never blocks; a pump writes the messages in order.

    The SDK starts a request's clock only once its write has returned, and
    writes the cancel of a call it gave up on shielded, for up to 5 s.  To a
    frozen server every write blocks (a full pipe; over HTTP, the SDK posts
    notifications one at a time and waits for each answer), so neither the
    call's timeout nor a cancellation would bound it.  Here a send queues the
    message and returns; :meth:`pump` hands them to the transport one by one.
    A cancel of a request still in the queue removes the request and is
    dropped: the server never hears of either.  The queue holds only what
    calls in flight wrote, so it stays small while a server is frozen.
    """

    def __init__(self, listings: set[str]) -> None:
        self._queue: deque[SessionMessage] = deque()
        self._wakeup = trio.Event()
        self._closed = False
        self._broken = False
        self._listings = listings
        self.done = trio.Event()

    async def send(self, item: SessionMessage) -> None:
        import anyio
        from mcp.types import JSONRPCNotification, JSONRPCRequest

        if self._closed:
            raise anyio.ClosedResourceError
        if self._broken:
            raise anyio.BrokenResourceError
        message = item.message
        if not (
            isinstance(message, JSONRPCNotification)
            and message.method == "notifications/cancelled"
            and self._unqueue(message.params)
        ):
            if isinstance(message, JSONRPCRequest) and message.method == "tools/list":
                self._listings.add(str(message.id))
            self._queue.append(item)
            self._wakeup.set()
        await trio.lowlevel.cancel_shielded_checkpoint()

    def _unqueue(self, params: Mapping[str, Any] | None) -> bool:
        """Remove the queued request a cancel names; whether there was one."""
        from mcp.types import JSONRPCRequest

        request_id = params.get("requestId") if isinstance(params, Mapping) else None
        if request_id is None:
            return False
        for queued in self._queue:
            message = queued.message
            if isinstance(message, JSONRPCRequest) and str(message.id) == str(request_id):
                self._queue.remove(queued)
                return True
        return False

    async def pump(self, stream: Any) -> None:
        """Write the queued messages to the transport's ``stream`` until the session closes this outbox."""
        import anyio

        try:
            while True:
                while not self._queue:
                    if self._closed:
                        return
                    await self._wakeup.wait()
                    self._wakeup = trio.Event()
                # Taken out first: from here on the message is being written, and a cancel of it is sent.
                await stream.send(self._queue.popleft())
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, trio.BrokenResourceError):
            self._broken = True  # the transport stopped taking messages: the session hears it on its next send
            self._queue.clear()
        finally:
            self.done.set()

    def close(self) -> None:
        self._closed = True
        self._wakeup.set()

    async def aclose(self) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> None:
        self.close()


class _WatchedStream:
    """The session's read stream, watched in wire order.

    * ``tools/list_changed``: the SDK hands notifications to callbacks in
      tasks of their own, so a notification sent just before a call's answer
      may be handled after it.  Seen here, where the dispatcher reads messages
      one by one, it is noticed before the answer is.
    * an answer to ``tools/list``: the SDK refuses a whole listing for one
      malformed tool; the tools it would refuse are taken out here, one by
      one, and noted on the link.
    * the end of the stream: the session's connection is gone (the SDK then
      fails every call in flight with "connection closed"; one request's own
      failure uses the same code while the stream goes on).
    """

    def __init__(self, inner: Any, link: _Link, on_list_changed: Callable[[], None]) -> None:
        self._inner = inner
        self._link = link
        self._on_list_changed = on_list_changed

    @property
    def last_context(self) -> Any:
        return getattr(self._inner, "last_context", None)

    def _see(self, item: SessionMessage | Exception) -> SessionMessage | Exception:
        from mcp.shared.message import SessionMessage
        from mcp.types import JSONRPCNotification, JSONRPCResponse

        if not isinstance(item, SessionMessage):
            return item
        message = item.message
        if isinstance(message, JSONRPCNotification) and message.method == "notifications/tools/list_changed":
            self._on_list_changed()
        elif isinstance(message, JSONRPCResponse) and str(message.id) in self._link.listings:
            self._link.listings.discard(str(message.id))
            session = self._link.session
            version = session.protocol_version if session is not None else None
            message.result, skipped = _sound_tools(message.result, version)
            self._link.skipped.extend(skipped)
        return item

    async def receive(self) -> SessionMessage | Exception:
        import anyio

        try:
            return self._see(await self._inner.receive())
        except (anyio.EndOfStream, anyio.ClosedResourceError):
            self._link.read_ended = True
            raise

    async def aclose(self) -> None:
        self._link.read_ended = True
        await self._inner.aclose()

    def __aiter__(self) -> Self:
        return self

    async def __anext__(self) -> SessionMessage | Exception:
        import anyio

        try:
            return self._see(await self._inner.__anext__())
        except (StopAsyncIteration, anyio.EndOfStream, anyio.ClosedResourceError):
            self._link.read_ended = True
            raise

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc_val: BaseException | None, exc_tb: TracebackType | None
    ) -> None:
        await self.aclose()
