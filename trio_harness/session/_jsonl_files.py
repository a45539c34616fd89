"""The file-system primitives of the JSONL store: names, safe opening, reads a caller may abandon, writes.

* :func:`escape_session_id` maps a session id to its directory name one-to-one
  (never a path separator, never a leading ``.``);
* the ``open`` flags refuse to follow a symbolic link (``O_NOFOLLOW``) and
  never wait on a FIFO (``O_NONBLOCK``);
* :func:`_read_all` reads a file on a worker thread that a cancelled caller
  abandons, without closing the descriptor under the read or leaking it;
* :func:`_write_all` writes a whole buffer (the store and its writer call it
  through this module, so tests can fail it);
* :func:`_make_private_dirs` and :func:`_check_private` keep the store's
  root private to its user.

The store (:mod:`._jsonl`), its writer (:mod:`._jsonl_writer`) and the
follower (:mod:`._follow_store`) build on it.
"""

from __future__ import annotations

import os
import stat
import string
import threading
import urllib.parse
from pathlib import Path

import attrs
import trio

from .._errors import InvalidSessionIdError, SessionStoreError
from ._session import validate_session_id

LOG_NAME = "session.jsonl"
DEFAULT_MAX_LOG_BYTES = 1 << 30
"""The default bound on the size of a session log that is read back (1 GiB)."""

_SAFE = frozenset(string.ascii_letters + string.digits + "_-")
_TURN_END_MARK = b'"type":"turn/end"'
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: opening a FIFO must not wait for a writer (it is refused by type next).
_READ_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_APPEND_FLAGS = os.O_RDWR | os.O_APPEND | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
_TEMP_FLAGS = os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_APPEND | os.O_NOFOLLOW | os.O_CLOEXEC
_READ_CHUNK = 1 << 26
# Longest header line list() reads (an id of 200 characters and a long cwd fit easily).
_MAX_HEADER_BYTES = 1 << 20


def escape_session_id(session_id: str) -> str:
    """Map a session id to a directory name, one-to-one.

    Letters, digits, ``_`` and ``-`` stand for themselves; every other
    character becomes ``%XX`` per UTF-8 byte, so the result never contains a
    path separator, never starts with ``.`` and decodes back uniquely.
    """
    validate_session_id(session_id)
    out = []
    for char in session_id:
        if char in _SAFE:
            out.append(char)
        else:
            out.extend(f"%{byte:02X}" for byte in char.encode("utf-8"))
    name = "".join(out)
    if len(name.encode()) > 255:
        raise InvalidSessionIdError(f"session id {session_id!r} is too long to store as a directory name")
    return name


def unescape_session_id(name: str) -> str:
    """Invert :func:`escape_session_id`."""
    return urllib.parse.unquote(name, errors="strict")


def _write_all(fd: int, data: bytes) -> None:
    written = os.write(fd, data)
    if written == len(data):  # the common case: one write took it all
        return
    view = memoryview(data)[written:]
    while view:
        written = os.write(fd, view)
        view = view[written:]


def _pread_all(fd: int, size: int) -> bytes:
    """The first ``size`` bytes of the file (fewer if it shrank meanwhile)."""
    chunks = []
    offset = 0
    while offset < size:
        chunk = os.pread(fd, min(size - offset, _READ_CHUNK), offset)
        if not chunk:
            break
        chunks.append(chunk)
        offset += len(chunk)
    return b"".join(chunks)


def _kind(mode: int) -> str:
    if stat.S_ISLNK(mode):
        return "a symbolic link"
    if stat.S_ISDIR(mode):
        return "a directory"
    if stat.S_ISREG(mode):
        return "a regular file"
    if stat.S_ISFIFO(mode):
        return "a FIFO"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return "a device"
    if stat.S_ISSOCK(mode):
        return "a socket"
    return "a special file"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


@attrs.define(eq=False)
class _Reader:
    """Reads a file on a worker thread that a cancelled caller may abandon.

    The file descriptor belongs to the caller until the thread starts reading,
    and to the thread if the caller gave up meanwhile (the thread closes it
    when its read returns): it is never closed under a running read (its number
    could be reused by another open) and never leaked.
    """

    fd: int
    size: int
    _mutex: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _started: bool = attrs.field(default=False, init=False)
    _finished: bool = attrs.field(default=False, init=False)
    _abandoned: bool = attrs.field(default=False, init=False)

    def run(self) -> bytes:
        with self._mutex:
            if self._abandoned:
                return b""
            self._started = True
        try:
            return _pread_all(self.fd, self.size)
        finally:
            if self._finish():
                os.close(self.fd)

    def _finish(self) -> bool:
        """Mark the read done; True when the caller abandoned it (the fd is ours to close)."""
        with self._mutex:
            self._finished = True
            return self._abandoned

    def abandon(self) -> bool:
        """Give up on the read; True when the caller must close the fd itself."""
        with self._mutex:
            self._abandoned = True
            return not self._started or self._finished


async def _read_all(fd: int, size: int) -> bytes:
    """Read ``size`` bytes of ``fd``; on failure or cancellation ``fd`` is closed (now or by the reader)."""
    reader = _Reader(fd, size)
    try:
        return await trio.to_thread.run_sync(reader.run, abandon_on_cancel=True)
    except BaseException:
        if reader.abandon():
            os.close(fd)
        raise


def _absolute_path(path: str | os.PathLike[str]) -> Path:
    return Path(path).expanduser().resolve()


def _check_private(root: Path, info: os.stat_result) -> None:
    """Refuse a store root that another local user could write to (or owns)."""
    mode = stat.S_IMODE(info.st_mode)
    if mode & 0o022:
        who = "everyone" if mode & 0o002 else "its group"
        raise SessionStoreError(
            f"the session store {root} is writable by {who} (mode {mode:04o}): another user could replace "
            f"a session's log with a forged one; make it private with 'chmod go-w {root}' "
            "(or pass a directory of your own)",
            path=str(root),
        )
    if info.st_uid not in (os.geteuid(), 0):
        raise SessionStoreError(
            f"the session store {root} belongs to another user (uid {info.st_uid}), who could replace a "
            "session's log with a forged one; pass a directory of your own",
            path=str(root),
        )


def _make_private_dirs(root: Path) -> None:
    """Create ``root`` and its missing parents, each with mode 0700 whatever the umask."""
    missing: list[Path] = []
    path = root
    while not path.is_dir():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        try:
            os.mkdir(directory, 0o700)
        except FileExistsError:
            if not directory.is_dir():
                raise
            continue  # made by someone else meanwhile: check() judges it, not this
        os.chmod(directory, 0o700)  # a umask such as 0o277 would have narrowed it
