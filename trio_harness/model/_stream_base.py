"""What the three sans-io stream parsers share (chat completions, Messages, Responses).

:class:`StreamParserBase` keeps the state the HTTP loop reads of every parser
(:attr:`~StreamParserBase.done`, :attr:`~StreamParserBase.failure`,
:attr:`~StreamParserBase.emitted`) and the inputs that are the same for each
(:meth:`~StreamParserBase.feed`, :meth:`~StreamParserBase.feed_all`,
:meth:`~StreamParserBase.fail`); a parser adds its own ``feed_into`` (the hot
path), ``feed_body``, ``feed_end``, ``usage`` and ``conclude``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Final

from ._protocol import Chunk, Failure, ResponseInfo
from ._sse import SSEEvent

RETRYABLE_ERROR_CODES: Final = frozenset(
    {"server_error", "internal_error", "rate_limit_exceeded", "overloaded", "timeout"}
)
"""The ``code`` (or ``type``) of an error object sent inside a stream that a retry may cure (while nothing
was emitted): OpenAI's ``server_error`` and ``rate_limit_exceeded``, and the like."""


class StreamFailure(Exception):
    """Internal: the stream is unusable; carries the failure to report."""

    def __init__(self, failure: Failure) -> None:
        super().__init__(failure.message)
        self.failure = failure


def count(value: object) -> int:
    """A token count from a usage object: a non-negative int, else 0."""
    return value if type(value) is int and value >= 0 else 0


class StreamParserBase:
    """The state and inputs every stream parser has (a plain slotted class: read for every event).

    Args:
        name: the provider's name, which starts every failure message.
    """

    __slots__ = ("_done", "_emitted", "_failure", "_info", "name")

    def __init__(self, name: str) -> None:
        self.name = name
        self._done = False
        self._emitted = False
        self._failure: Failure | None = None
        self._info: ResponseInfo | None = None

    @property
    def done(self) -> bool:
        """True once the stream's end or a failure was seen: later events are ignored."""
        return self._done

    @property
    def failure(self) -> Failure | None:
        """The failure the stream carried (malformed, an error event), if any."""
        return self._failure

    @property
    def emitted(self) -> bool:
        """True once any chunk of output was returned (a retry would repeat output)."""
        return self._emitted

    @property
    def response_info(self) -> ResponseInfo | None:
        """The model and response id the server named (the first it named), or None."""
        return self._info

    def _take_info(self, obj: dict[str, object]) -> ResponseInfo:
        """Keep the ``model`` and ``id`` strings of a response object (``""`` where absent) and return them."""
        model, rid = obj.get("model"), obj.get("id")
        info = ResponseInfo(model if type(model) is str else "", rid if type(rid) is str else "")
        self._info = info
        return info

    def feed_into(self, events: Iterable[SSEEvent], emit: Callable[[Chunk], None]) -> None:
        """Take events in order, passing each chunk to ``emit`` at once (each parser's own)."""
        raise NotImplementedError  # pragma: no cover

    def feed(self, event: SSEEvent) -> list[Chunk]:
        """Take one event; return its chunks (none once :attr:`done`)."""
        chunks: list[Chunk] = []
        self.feed_into((event,), chunks.append)
        return chunks

    def feed_all(self, events: Iterable[SSEEvent]) -> list[Chunk]:
        """Take events in order; return their chunks.

        Stops at the end of the stream or at the first failure (the chunks of
        the events before it are returned); events after that are ignored.
        """
        chunks: list[Chunk] = []
        self.feed_into(events, chunks.append)
        return chunks

    def fail(self, failure: Failure) -> Failure:
        """Record a failure found outside the events (an HTTP status, bytes that are not UTF-8).

        It becomes the outcome, as a failure the stream carried would: the
        parser is :attr:`done`.  Returns the failure kept (the first one).
        """
        if self._failure is None:
            self._failure = failure
        self._done = True
        return self._failure

    def _malformed(self, message: str) -> StreamFailure:
        return StreamFailure(Failure("malformed-stream", f"{self.name}: {message}"))
