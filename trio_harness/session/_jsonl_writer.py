"""The writer of a live JSONL session: it batches lines in memory and appends them at :meth:`flush`.

The first flush of a new session writes the header and the first batch to a
temporary file, syncs it and links it into place (``JsonlStore._store_new_log``),
so the log appears whole, and locked, or not at all; the writer then holds the
log's ``flock`` until it is closed and releases the id's create claim.  Later
flushes append, ``fsync``-ing when they sync (the driver flushes at every
checkpoint of a turn and syncs at its end: docs/sessions.rst, "Durability").
A flush that returned has written its events even if the process is killed
next; a synced one survives a power cut too.  A failed write or sync cuts the
file back to its last synced length and buffers every unsynced line again, so
no half batch is left behind; a writer resuming a log whose torn tail
:func:`._jsonl_parse.parse_log` dropped cuts it off before its first append.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import TYPE_CHECKING

import attrs
import trio

from .._errors import SessionStoreError
from . import _jsonl_files
from ._blobs import IMAGE_EVENTS, externalize, write_blobs_in
from ._codec import encoder_of
from ._events import Event, SessionHeader
from ._jsonl_files import _reason

if TYPE_CHECKING:
    from ._jsonl import JsonlStore


@attrs.define(eq=False)
class _JsonlWriter:
    store: JsonlStore
    header: SessionHeader
    path: Path
    # The encoded header line, written by the first flush of a new session.
    _header_line: bytes | None = attrs.field(alias="header_line")
    # The log, locked; None until the first flush of a new session.
    _fd: int | None = attrs.field(default=None, alias="fd")
    # Length of the file as far as this writer knows it is good.
    _length: int = attrs.field(default=0, alias="length")
    # Byte length to cut the file to before the first append (resume of a torn log).
    _truncate_to: int | None = attrs.field(default=None, alias="truncate_to")
    # The open .create.lock whose byte claims a new session's id, until its log is stored.
    _claim: int | None = attrs.field(default=None, alias="claim")
    _buffer: list[str] = attrs.field(factory=list, init=False)
    _lock: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    _closed: bool = attrs.field(default=False, init=False)
    # Why appending is no longer safe (the file's end is unknown), once it is not.
    _broken: str | None = attrs.field(default=None, init=False)
    # Lines written by flush(sync=False) and not yet fsynced, and the length
    # of the file before them: a failed sync cuts them off and buffers them again.
    _unsynced: list[str] = attrs.field(factory=list, init=False)
    _synced_length: int = attrs.field(default=0, init=False)
    # The image blobs the buffered lines reference (session/_blobs.py), written before them.
    _blobs: dict[str, bytes] = attrs.field(factory=dict, init=False)

    def write(self, event: Event) -> None:
        if type(event) in IMAGE_EVENTS:
            event = externalize(event, self._blobs)
        self._buffer.append(encoder_of(type(event))(event))  # encode_event(event), one call less

    async def flush(self, *, sync: bool = True) -> None:
        inline = self.store.fsync and self.store.inline_fsync
        lock = self._lock
        try:
            # Uncontended (the common case): no schedule point of its own; a
            # flush in a cancelled scope still raises Cancelled before writing.
            await trio.lowlevel.checkpoint_if_cancelled()
            lock.acquire_nowait()
        except trio.WouldBlock:
            await lock.acquire()
        try:
            if not self._buffer and not (sync and self._unsynced):
                return
            if self._closed or self._broken is not None:
                reason = "its writer is closed" if self._closed else self._broken
                count = len(self._buffer) + len(self._unsynced)
                raise SessionStoreError(
                    f"cannot write {count} events of session {self.header.id!r} to {self.path}: {reason}",
                    path=str(self.path),
                    session_id=self.header.id,
                )
            lines, blobs = self._buffer, self._blobs
            self._buffer, self._blobs = [], {}
            try:
                if self._fd is None:
                    await self._create(lines, inline, blobs)
                else:
                    try:
                        await write_blobs_in(self.path.parent, blobs, fsync=self.store.fsync)
                    except BaseException:
                        self._buffer[:0] = lines
                        raise
                    await self._append(self._fd, lines, inline, sync)
            except BaseException as exc:
                self._blobs = {**blobs, **self._blobs}  # written again with the lines
                if not isinstance(exc, OSError):
                    raise
                raise SessionStoreError(
                    f"cannot write session {self.header.id!r} to {self.path}: {_reason(exc)}",
                    path=str(self.path),
                    session_id=self.header.id,
                ) from exc
        finally:
            lock.release()
        if inline:
            await trio.lowlevel.checkpoint()

    async def _create(self, lines: list[str], inline: bool, blobs: dict[str, bytes]) -> None:
        """The first flush, always durable: the log appears whole, locked before it appears."""
        assert self._header_line is not None
        content = self._header_line + ("\n".join(lines) + "\n").encode("utf-8")
        try:
            if (self.store.fsync and not inline) or blobs:
                fd = await trio.to_thread.run_sync(self.store._store_new_log, self.header.id, content, blobs)
            else:
                fd = self.store._store_new_log(self.header.id, content)
        except BaseException:
            self._buffer[:0] = lines
            raise
        self._fd, self._header_line = fd, None
        self._length = self._synced_length = len(content)
        self.store._held.add(self.header.id)
        self._release_claim()  # the log is there and locked: it refuses other creates now

    def _release_claim(self) -> None:
        claim, self._claim = self._claim, None
        if claim is not None:
            os.close(claim)  # the lock goes with this open of the file
            self.store._claimed.discard(self.header.id)

    async def _append(self, fd: int, lines: list[str], inline: bool, sync: bool) -> None:
        """Write ``lines`` (and fsync with ``sync``); on failure everything unsynced is cut off and buffered again."""
        if self._truncate_to is not None:
            os.ftruncate(fd, self._truncate_to)
            self._length = self._synced_length = self._truncate_to
            self._truncate_to = None
        start = self._length
        try:
            if os.fstat(fd).st_nlink == 0:
                # Removed from the store meanwhile (its directory deleted): writing on would lose it silently.
                raise OSError(errno.ENOENT, "the log file was removed from the store")
            if lines:
                data = ("\n".join(lines) + "\n").encode("utf-8")
                _jsonl_files._write_all(fd, data)
                self._length = start + len(data)
            if sync and self.store.fsync:
                if inline:
                    os.fsync(fd)
                else:
                    await trio.to_thread.run_sync(os.fsync, fd)
        except BaseException:
            # Never leave half a batch, or an unsynced one, behind.
            self._rewind(fd, self._synced_length)
            self._length = self._synced_length
            self._buffer[:0] = [*self._unsynced, *lines]
            self._unsynced = []
            raise
        if sync:
            self._synced_length = self._length
            self._unsynced = []
        else:
            self._unsynced.extend(lines)

    def _rewind(self, fd: int, length: int) -> None:
        try:
            os.ftruncate(fd, length)
        except OSError as exc:
            self._broken = (
                f"the log could not be cut back to its last good length ({_reason(exc)}) after a failed write; "
                "resume the session to continue from what is stored"
            )

    async def aclose(self) -> None:
        self._closed = True
        self._buffer = []
        self._release_claim()
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
            self.store._held.discard(self.header.id)
