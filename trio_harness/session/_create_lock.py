"""The claims of the JSONL store's same-id arbitration: one byte-range lock per id being created.

A writer of a new session claims its id with an open-file-description (OFD)
lock on one byte of ``<root>/.create.lock``, at an offset hashed from the id
(:func:`claim_offset`).  An OFD lock (Linux ``F_OFD_SETLK``) belongs to one
open of the file, not to the process: two writers of one process conflict as
two processes do, closing the descriptor releases it, and the kernel releases
it when the holding process dies.  Nothing is ever written to the file; it
stays in the root (a dot name, never listed), since removing a lock file races
with whoever opens it next.

Two ids may share a byte: that can only make a create fail as busy (the
store's caller checks whether a log exists, never that the byte was free),
never let a create succeed wrongly.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import stat
import struct
from pathlib import Path

from .._errors import SessionStoreError

CLAIM_NAME = ".create.lock"
_FLAGS = os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC
# Offsets of the claim bytes: 62 bits, well inside off_t.
_SPACE = 1 << 62
# Linux's open-file-description lock command; None where it is missing (no claim:
# a same-id create is then refused at its first flush, when its log is linked).
_OFD_SETLK: int | None = getattr(fcntl, "F_OFD_SETLK", None)
# struct flock: l_type, l_whence, l_start, l_len, l_pid (0 for OFD locks), padded to its C size.
_FLOCK = struct.Struct("@hhqqi4x")


class ClaimHeld(Exception):
    """The byte of the id is locked by another open of the claim file."""


def claim_offset(session_id: str) -> int:
    """The byte of ``.create.lock`` whose lock claims ``session_id`` while it is created."""
    digest = hashlib.blake2b(session_id.encode("utf-8"), digest_size=8).digest()
    return int.from_bytes(digest, "big") % _SPACE


def take_claim(root: Path, session_id: str) -> int | None:
    """Lock the claim byte of ``session_id`` in ``root`` (which must exist) without waiting.

    Returns the descriptor holding the lock (close it to release), or None
    where OFD locks are not available.

    Raises:
        ClaimHeld: another open of the file holds the byte.
        SessionStoreError: the claim file is a symbolic link or not a regular
            file, or cannot be opened or locked.
    """
    if _OFD_SETLK is None:
        return None
    path = root / CLAIM_NAME
    try:
        fd = os.open(path, _FLAGS, 0o600)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise SessionStoreError(
                f"{path} is a symbolic link; refusing to follow it (the store's create lock must be a regular file)",
                path=str(path),
            ) from None
        raise SessionStoreError(
            f"cannot open the create lock of the session store, {path}: {exc.strerror or exc}", path=str(path)
        ) from exc
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise SessionStoreError(
                f"{path} is not a regular file; refusing to use it as the store's create lock", path=str(path)
            )
        request = _FLOCK.pack(fcntl.F_WRLCK, os.SEEK_SET, claim_offset(session_id), 1, 0)
        try:
            fcntl.fcntl(fd, _OFD_SETLK, request)
        except OSError as exc:
            if exc.errno in (errno.EAGAIN, errno.EACCES):
                raise ClaimHeld from None
            raise SessionStoreError(
                f"cannot lock {path} to create session {session_id!r}: {exc.strerror or exc}", path=str(path)
            ) from exc
    except BaseException:
        os.close(fd)
        raise
    return fd
