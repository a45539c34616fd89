"""Output buffering: a bounded in-memory tail per stream, a read cursor, an optional spill file.

Pure bookkeeping over bytes, with no process and no Trio: the executor's pumps
:meth:`~OutputStream.feed` what a pipe delivers, and readers take text out.

* Only the last ``limit`` bytes of a stream stay in memory.  A read whose
  cursor fell behind that tail reports how many bytes it lost and where the
  full stream is (:attr:`Taken.where`).
* Text is decoded as UTF-8.  While the stream is open, a character split
  across feeds is held back until it is complete; at end of stream an
  incomplete one is replaced.  When the tail starts inside a character, its
  orphan continuation bytes (at most three) count as dropped.
* A background stream also writes every byte to a private spill file (mode
  0600).  A write error closes the spill file and is reported in
  :attr:`Taken.where` rather than raised: losing the spill copy must not stop
  the command.
"""

from __future__ import annotations

import contextlib
import os
import secrets

import attrs


def incomplete_suffix(data: bytes | bytearray, start: int) -> int:
    """Return how many trailing bytes of ``data[start:]`` form an incomplete UTF-8 character."""
    end = len(data)
    for i in range(end - 1, max(end - 4, start - 1), -1):
        byte = data[i]
        if byte & 0xC0 == 0x80:
            continue  # continuation byte: keep looking for the lead byte
        if byte >= 0xF0:
            need = 4
        elif byte >= 0xE0:
            need = 3
        elif byte >= 0xC0:
            need = 2
        else:
            need = 1
        return end - i if i + need > end else 0
    return 0


def leading_continuations(data: bytes | bytearray, start: int) -> int:
    """Return how many (at most 3) UTF-8 continuation bytes begin ``data[start:]``."""
    count = 0
    while count < 3 and start + count < len(data) and data[start + count] & 0xC0 == 0x80:
        count += 1
    return count


@attrs.frozen
class Taken:
    """Text taken from a stream.

    Attributes:
        text: the decoded text.
        dropped: bytes of the stream before ``text`` that were not retained
            (beyond the tail) and so are not in ``text``.
        where: where the full stream is, as a phrase for the model (``full
            stdout in PATH``, ``stdout is not kept``, ...).
    """

    text: str
    dropped: int
    where: str


@attrs.define(eq=False)
class OutputStream:
    """One output stream: a bounded tail in memory, a read cursor, an optional spill file.

    The buffer holds bytes ``[total - len(buf), total)`` of the stream; the
    cursor is the stream offset up to which :meth:`take` has consumed.
    """

    name: str
    limit: int
    buf: bytearray = attrs.field(factory=bytearray)
    total: int = 0
    cursor: int = 0
    eof: bool = False
    spill_path: str | None = None
    spill_fd: int = -1
    spill_error: str | None = None
    spill_removed: bool = False
    # Continuation bytes still to drop after a lossy take stopped inside a character.
    orphans: int = 0

    def feed(self, chunk: bytes | bytearray) -> None:
        """Append bytes: keep the last ``limit`` in memory, write them all to the spill file."""
        size = len(chunk)
        self.total += size
        buf = self.buf
        if size >= self.limit:
            buf[:] = memoryview(chunk)[size - self.limit :]
        else:
            buf += chunk
            excess = len(buf) - self.limit
            if excess > 0:
                del buf[:excess]
        if self.spill_fd >= 0:
            self._spill(chunk)

    def _spill(self, chunk: bytes | bytearray) -> None:
        view = memoryview(chunk)
        try:
            while view:
                view = view[os.write(self.spill_fd, view) :]
        except OSError as exc:
            self.spill_error = f"{type(exc).__name__}: {exc}"
            self.close_spill()

    def take(self) -> Taken:
        """Consume everything new since the last take (the text, and bytes dropped unread)."""
        base = self.total - len(self.buf)
        dropped = 0
        if self.cursor < base:
            dropped = base - self.cursor
            self.cursor = base
            self.orphans = 3
        if self.orphans:
            # The bytes lost may have cut a character: its continuation bytes
            # (at most 3) are dropped too, including those arriving later.
            skip = min(leading_continuations(self.buf, self.cursor - base), self.orphans)
            dropped += skip
            self.cursor += skip
            self.orphans = self.orphans - skip if self.cursor == self.total else 0
        start = self.cursor - base
        end = len(self.buf)
        if not self.eof:
            end -= incomplete_suffix(self.buf, start)
        if end <= start:
            return Taken("", dropped, self.where() if dropped else "")
        text = self.buf[start:end].decode("utf-8", "replace")
        self.cursor = base + end
        return Taken(text, dropped, self.where() if dropped else "")

    def snapshot(self) -> Taken:
        """The whole retained tail, without consuming (the text, and bytes not retained).

        Meant for a finished stream: an incomplete character at the end is
        replaced, not held back.
        """
        dropped = self.total - len(self.buf)
        skip = leading_continuations(self.buf, 0) if dropped else 0
        text = self.buf[skip:].decode("utf-8", "replace")
        return Taken(text, dropped + skip, self.where() if dropped else "")

    def where(self) -> str:
        """Where the full stream is, as a phrase naming the spill file or saying it is gone."""
        if self.spill_path is None:
            return f"{self.name} is not kept"
        if self.spill_removed:
            return f"the {self.name} spill file was removed"
        if self.spill_error is not None:
            return f"{self.name} spill file {self.spill_path} is incomplete ({self.spill_error})"
        return f"full {self.name} in {self.spill_path}"

    def open_spill(self, directory: str, stem: str) -> None:
        """Create the private spill file ``directory/stem-RANDOM.name`` (mode 0600).

        Raises:
            OSError: the file could not be created.
        """
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
        while True:
            path = os.path.join(directory, f"{stem}-{secrets.token_hex(6)}.{self.name}")
            try:
                fd = os.open(path, flags, 0o600)
            except FileExistsError:
                continue
            break
        try:
            os.fchmod(fd, 0o600)  # the umask may have narrowed it; never wider
        except OSError:
            os.close(fd)
            os.unlink(path)
            raise
        self.spill_path = path
        self.spill_fd = fd

    def close_spill(self) -> None:
        """Stop writing the spill file (idempotent); the file stays."""
        if self.spill_fd >= 0:
            fd, self.spill_fd = self.spill_fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def remove_spill(self) -> None:
        """Close and delete the spill file (idempotent)."""
        self.close_spill()
        if self.spill_path is not None and not self.spill_removed:
            self.spill_removed = True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spill_path)
