"""The file tools' file-system seam: a protocol, the local file system, and the path rules of the sandbox.

The tools (:mod:`._files`) read and write through a :class:`FileSystem`; they
never know which one.  :class:`LocalFileSystem` is the default; the ACP bridge
binds a client-backed one to a session whose editor offers ``fs/read_text_file``
and ``fs/write_text_file`` (:mod:`trio_harness.acp._fs`), so the agent reads
unsaved buffers and its edits land in the editor.
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import stat
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

import attrs
import trio

from ..bash._sandbox import DEFAULT_HIDDEN
from ..bash._sandbox_git import git_directories, linked_parts

BINARY_PROBE = 8192
"""How many leading bytes are searched for a NUL byte (a binary file)."""


class FileToolError(Exception):
    """A file tool call that cannot be done; the message is the model's error result (without ``error: ``)."""


@attrs.frozen
class FileContent:
    """What a read found: the text, and the modification time when the file system knows it.

    Attributes:
        text: the whole file, decoded as UTF-8 (line endings kept).
        mtime_ns: the modification time in nanoseconds, or None (an editor buffer has none).
    """

    text: str
    mtime_ns: int | None = None


@runtime_checkable
class FileSystem(Protocol):
    """Where the file tools read and write: the local disk, or an editor's buffers over ACP.

    Paths are absolute, already checked against the sandbox's rules.
    """

    async def read_text(self, path: str) -> FileContent | None:
        """The file's text, or None when there is no such file.

        Raises:
            FileToolError: the path is a directory, the file is binary or too
                large, or it cannot be read (the message says which).
        """
        ...

    async def write_text(self, path: str, text: str) -> int | None:
        """Replace the file's text (creating it and its parent directories); the new mtime (ns) when known.

        Raises:
            FileToolError: the file cannot be written (the message says why).
        """
        ...


def _too_large(path: str, size: int, limit: int) -> FileToolError:
    return FileToolError(
        f"{path} is {size} bytes, more than the {limit}-byte limit of the file tools; "
        "look at parts of it with bash (head, sed -n, grep)"
    )


def check_text(path: str, data: bytes) -> str:
    """``data`` decoded as UTF-8 text, or :exc:`FileToolError` for a binary file."""
    if b"\0" in data[:BINARY_PROBE]:
        raise FileToolError(f"{path} is a binary file ({len(data)} bytes); the file tools read and write text only")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileToolError(
            f"{path} is not UTF-8 text (byte {exc.start}: {data[exc.start : exc.start + 1]!r}); "
            "the file tools read and write UTF-8 text only"
        ) from None


def _os_error(action: str, path: str, exc: OSError) -> FileToolError:
    reason = exc.strerror or str(exc)
    if exc.errno == errno.EROFS:
        reason += " (the file system is read-only)"
    return FileToolError(f"cannot {action} {path}: {reason}")


def _check_opened(fd: int, path: str) -> None:
    """Refuse a descriptor that is not ``path``: a directory on the way was swapped for a symbolic link
    after the path was resolved and checked (``O_NOFOLLOW`` guards only the last component).

    Linux names what a descriptor opened in ``/proc/self/fd``; without it there is nothing to compare.
    """
    try:
        opened = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:
        return
    if opened != path:
        raise FileToolError(
            f"{path} changed while it was opened (a directory on its path was replaced by a symbolic link "
            "or moved); nothing was read or written"
        )


def _read_local(path: str, max_bytes: int) -> FileContent | None:
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        return None
    except IsADirectoryError:
        raise FileToolError(f"{path} is a directory, not a file; list it with bash (ls)") from None
    except OSError as exc:
        if exc.errno == errno.ELOOP:  # a symlink planted after the path was resolved
            raise FileToolError(f"{path} changed into a symbolic link while it was opened; try again") from None
        raise _os_error("read", path, exc) from None
    try:
        _check_opened(fd, path)
    except FileToolError:
        os.close(fd)
        raise
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        if stat.S_ISDIR(info.st_mode):
            raise FileToolError(f"{path} is a directory, not a file; list it with bash (ls)")
        raise FileToolError(f"{path} is not a regular file (a device, socket or pipe); the file tools skip it")
    with os.fdopen(fd, "rb") as file:
        if info.st_size > max_bytes:
            raise _too_large(path, info.st_size, max_bytes)
        data = file.read(max_bytes + 1)
    if len(data) > max_bytes:
        raise _too_large(path, len(data), max_bytes)
    return FileContent(check_text(path, data), info.st_mtime_ns)


def encode_text(path: str, text: str) -> bytes:
    """``text`` as UTF-8, or :exc:`FileToolError` (a lone surrogate, which JSON escapes can carry)."""
    try:
        return text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise FileToolError(
            f"the content for {path} is not valid Unicode text (a lone surrogate at character {exc.start}); "
            "nothing was written"
        ) from None


def _write_local(path: str, text: str) -> int:
    data = encode_text(path, text)
    directory, name = os.path.split(path)
    try:
        os.makedirs(directory, exist_ok=True)
        # Everything below goes through the directory's descriptor, checked to be the directory
        # resolved and checked against the rules: a directory on the way swapped for a symbolic
        # link since cannot send the write elsewhere.
        dir_fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as exc:
        raise _os_error("write", path, exc) from None
    try:
        _check_opened(dir_fd, directory)
        return _write_in(dir_fd, path, name, data)
    finally:
        os.close(dir_fd)


def _write_in(dir_fd: int, path: str, name: str, data: bytes) -> int:
    try:
        try:
            mode: int | None = stat.S_IMODE(os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode)
        except FileNotFoundError:
            mode = None
        temp = f".{name}.{secrets.token_hex(6)}.tmp"
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        # A new file gets the mode a plain open gives it (0o666 less the umask, which the kernel
        # applies: reading the umask means setting it, for every thread of the process).
        fd = os.open(temp, flags, 0o600 if mode is not None else 0o666, dir_fd=dir_fd)
    except OSError as exc:
        raise _os_error("write", path, exc) from None
    try:
        with os.fdopen(fd, "wb") as file:
            file.write(data)
            file.flush()
            os.fsync(file.fileno())
            if mode is not None:
                os.fchmod(file.fileno(), mode)
        # atomic: a reader sees the old text or the new, never half
        os.replace(temp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
    except OSError as exc:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise _os_error("write", path, exc) from None
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temp, dir_fd=dir_fd)
        raise
    return os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mtime_ns


@attrs.frozen
class LocalFileSystem:
    """The local disk (reads and writes run on a worker thread; writes are atomic: temp file + rename, mode kept).

    Attributes:
        max_bytes: the largest file read (a larger one is refused).
    """

    max_bytes: int

    async def read_text(self, path: str) -> FileContent | None:
        """See :meth:`FileSystem.read_text`."""
        return await trio.to_thread.run_sync(_read_local, path, self.max_bytes)

    async def write_text(self, path: str, text: str) -> int | None:
        """See :meth:`FileSystem.write_text`."""
        return await trio.to_thread.run_sync(_write_local, path, text)


# ---------------------------------------------------------------- path rules


ALWAYS_HIDDEN = ("/proc", *DEFAULT_HIDDEN)
"""Paths the file tools never read or write, with or without a sandbox: ``/proc`` (the environments
of this process and of the shell that started it hold the model's API key, which commands never
inherit; a sandboxed command sees a ``/proc`` of its own) and the sandbox's default credential
paths (``~/.ssh``, ``~/.aws``...): reads never ask, so without a sandbox nothing else would stand
between the model and them (``cat`` in ``bash`` is asked about)."""


PRIVATE_UNDER_SANDBOX = ("/tmp", "/dev")
"""The directories a sandboxed command has its own (empty) ones of: the host's are not read under a sandbox
(but for the writable paths there, which are the real ones inside too)."""


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


GIT_PROTECTED_NAMES = ("config", "config.worktree", "commondir")
"""Files of a git directory that git reads its configuration (commands it runs) or its common directory from."""


def git_protected(real: str, root: str) -> bool:
    """Whether ``real`` (resolved, under ``root``) is a part of a git repository that makes git run commands.

    A ``.git`` entry itself at any depth (a directory, or a *file* naming a
    git directory: ``gitdir: ...``, which a linked worktree and a submodule's
    checkout have), and below a ``.git`` directory anything under a
    ``hooks`` directory and every ``config``, ``config.worktree`` and
    ``commondir``: those of the repository, of its submodules
    (``.git/modules/<name>/``, nested ones too) and of its linked worktrees
    (``.git/worktrees/<name>/``).  Names are compared case-insensitively.
    """
    # Case-insensitively: on a case-insensitive file system (vfat, ext4 casefold) .GIT/HOOKS is .git/hooks.
    relative = os.path.relpath(real, root).lower().split(os.sep)
    if ".git" not in relative:
        return False
    rest = relative[relative.index(".git") + 1 :]
    return not rest or "hooks" in rest or rest[-1] in GIT_PROTECTED_NAMES


def _in_gitdir(real: str, gitdir: str) -> bool:
    relative = os.path.relpath(real, gitdir).lower().split(os.sep)
    return relative == ["."] or "hooks" in relative or relative[-1] in GIT_PROTECTED_NAMES


def git_guarded(real: str, roots: Sequence[str]) -> bool:
    """Whether ``real`` (resolved) is a part of the git directories the repositories at ``roots`` use, found
    through symbolic links as git finds them (:func:`~trio_harness.bash._sandbox_git.git_directories`): the
    same parts as :func:`git_protected`, and the targets of hooks and configuration that are links."""
    folded = real.lower()  # as git_protected: a case-insensitive file system may name them otherwise
    for root in roots:
        for gitdir in git_directories(root):
            if _under(folded, gitdir.lower()) and _in_gitdir(real, gitdir):
                return True
            if any(_under(folded, target.lower()) for target in linked_parts(gitdir)):
                return True
    return False


@attrs.frozen
class PathRules:
    """Which resolved paths the file tools may read and write (the bash sandbox's rules, or none).

    Attributes:
        writable: extra writable roots besides the session's directory (resolved); None: no sandbox, all writable.
        hidden: paths nothing may read or write (absolute; resolved at each check).
        protect_git: git's hooks and configuration in each writable root are read-only (:func:`git_protected`).
        protected: paths never written, sandbox or not, whatever the approval: the session store's
            directory (absolute; resolved at each check).
        unread: paths never read: the session store's directory, unless a sandbox shows it
            (``hide_sessions=False``).
        spill_files: files read though they lie in the host's ``/tmp``: the spill files of the bash
            executor's background commands of the agent reading (resolved), which their truncation notices name.
    """

    writable: tuple[str, ...] | None = None
    hidden: tuple[str, ...] = ()
    protect_git: bool = False
    protected: tuple[str, ...] = ()
    unread: tuple[str, ...] = ()
    spill_files: frozenset[str] = frozenset()

    def _unread(self, shown: str, real: str, cwd: str | None) -> str | None:
        """Why ``real`` is not read though no hidden path covers it, or None: inside the session store,
        or (with a sandbox) under the host's ``/tmp`` or ``/dev``, which a sandboxed command never sees."""
        resolved = f" (it resolves to {real})" if real != shown else ""
        for path in self.unread:
            if _under(real, path) or _under(real, os.path.realpath(path)):
                if self.writable is not None:
                    return (
                        f"{shown}{resolved} is hidden by the sandbox: it is inside the session store ({path}), "
                        "other sessions' transcripts (the sandbox hides the session store from commands too)"
                    )
                return (
                    f"{shown}{resolved} is inside the session store ({path}): other sessions' transcripts and "
                    "the harness's own records, which the file tools never read (a sandbox hides them from "
                    "commands too)"
                )
        if self.writable is None or real in self.spill_files:
            return None
        roots = [os.path.realpath(root) for root in (*((cwd,) if cwd is not None else ()), *self.writable)]
        for private in PRIVATE_UNDER_SANDBOX:
            if _under(real, private) and not any(_under(real, root) for root in roots):
                return (
                    f"{shown}{resolved} is hidden by the sandbox (its /tmp and /dev are private: a sandboxed "
                    f"command sees empty ones of its own, not the host's {private}; only the working directory "
                    "and the sandbox's writable paths there are the real ones, and the spill files of the "
                    "agent's own background commands can be read)"
                )
        return None

    def _hidden(self, real: str) -> tuple[str, str] | None:
        """The hidden path ``real`` is under and what hides it, or None."""
        for path in self.hidden:
            if _under(real, path) or _under(real, os.path.realpath(path)):
                return path, "the sandbox"
        for path in ALWAYS_HIDDEN:
            full = os.path.expanduser(path)
            if _under(real, full) or _under(real, os.path.realpath(full)):
                return full, "the file tools"
        return None

    def check_read(self, shown: str, real: str, cwd: str | None = None) -> None:
        """Refuse a read of a hidden path, of the session store, and (with a sandbox) of the host's ``/tmp``
        and ``/dev`` outside the session's directory (``cwd``) and the writable paths: what a sandboxed
        command cannot see either."""
        if (why := self._unread(shown, real, cwd)) is not None:
            raise FileToolError(f"{why}; it cannot be read")
        if (hidden := self._hidden(real)) is not None:
            raise FileToolError(f"{shown} is hidden by {hidden[1]} ({hidden[0]}); it cannot be read")

    def check_write(self, shown: str, real: str, cwd: str) -> None:
        """Refuse a write of the session store, of a hidden path, or outside the writable roots (the session's
        directory and the policy's), or of git's hooks and configuration there."""
        for path in self.protected:
            # ``real`` has every symlink resolved: compare with the store's resolved place as well.
            if _under(real, path) or _under(real, os.path.realpath(path)):
                resolved = f" (it resolves to {real})" if real != shown else ""
                raise FileToolError(
                    f"{shown}{resolved} is inside the session store ({path}): the harness's own session logs "
                    "cannot be written by the file tools, whatever the approval"
                )
        if (hidden := self._hidden(real)) is not None:
            raise FileToolError(f"{shown} is hidden by {hidden[1]} ({hidden[0]}); it cannot be written")
        if self.writable is None:
            return
        home = os.path.realpath(cwd)
        if home == "/" and _under(real, "/"):
            # As the bash sandbox refuses to run there: '/' writable is the whole file system.
            raise FileToolError(
                f"{shown} cannot be written: the session's working directory is '/', and the sandbox "
                "cannot make '/' writable (that is the whole file system); work from a project directory"
            )
        roots: Sequence[str] = (home, *self.writable)
        guarded = self.protect_git and (
            git_guarded(real, roots) or any(_under(shown, root) and git_protected(shown, root) for root in roots)
        )
        for root in roots:
            if _under(real, root):
                if guarded or (self.protect_git and git_protected(real, root)):
                    resolved = f" (it resolves to {real})" if real != shown else ""
                    raise FileToolError(
                        f"{shown}{resolved} is read-only in the sandbox (git's hooks and configuration are "
                        "protected: .git/hooks, .git/config, .git/config.worktree, those of submodules in "
                        ".git/modules and of worktrees, and .git files, also where a symbolic link .git, "
                        "hooks or config leads; git would run what they name outside the sandbox)"
                    )
                return
        where = ", ".join(roots)
        resolved = f" (it resolves to {real})" if real != shown else ""
        raise FileToolError(
            f"{shown}{resolved} is outside the sandbox's writable paths ({where}); write inside the working directory"
        )


def resolve_path(cwd: str, path: str) -> tuple[str, str]:
    """``path`` made absolute against ``cwd`` (``~`` expanded), and the same with every symlink resolved.

    Raises:
        FileToolError: the path is empty or contains a NUL character.
    """
    if not path.strip():
        raise FileToolError("path is empty; give a file path (relative to the working directory, or absolute)")
    if "\0" in path:
        raise FileToolError("path contains a NUL character")
    full = os.path.normpath(os.path.join(cwd, os.path.expanduser(path)))
    return full, os.path.realpath(full)
