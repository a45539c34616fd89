"""The records of the bash executor: a request, its validated spec, and how a command ended.

Plain frozen values with no behaviour, shared by the executor, the process
supervision (:mod:`._process`) and the rendering (:mod:`._render`).
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs


@attrs.frozen
class BashRequest:
    """A command as asked for, before validation.

    Attributes:
        command: the shell command line, run as ``[shell, "-c", command]``.
        workdir: the working directory; relative paths are taken from the
            process's current directory; ``None`` means the current directory.
        timeout: seconds a foreground run may take; ``None`` means the
            executor's default.  Capped at the executor's ``max_timeout``.
        owner: an opaque owner token.  The empty string is a real owner; only
            ``None`` means unowned.
        env: variables set for the command on top of the inherited environment.
        writable_dir: with a sandbox, the directory the command may write
            (besides the policy's extra paths); ``None`` means its workdir.
            The ``bash`` tool passes the session's working directory, so the
            model's ``workdir`` does not choose what is writable.  Ignored
            without a sandbox.
    """

    command: str
    workdir: str | None = None
    timeout: float | None = None
    owner: str | None = None
    env: Mapping[str, str] | None = None
    writable_dir: str | None = None


@attrs.frozen
class BashSpec:
    """A validated, normalised command, produced by :meth:`BashExecutor.resolve`.

    Attributes:
        command: the shell command line (not empty, no NUL byte).
        workdir: an absolute path to an existing directory.
        timeout: seconds, positive and at most the executor's ``max_timeout``.
        owner: the opaque owner token, or ``None`` for unowned.
        env: variables set on top of the inherited environment, or ``None``.
        writable_dir: an absolute path to an existing directory a sandboxed
            command may write, or ``None`` for its workdir (always ``None``
            without a sandbox).
    """

    command: str
    workdir: str
    timeout: float
    owner: str | None
    env: Mapping[str, str] | None = None
    writable_dir: str | None = None


@attrs.frozen
class BashResult:
    """The outcome of a foreground :meth:`BashExecutor.run`.

    Attributes:
        stdout: the retained tail of standard output, decoded as UTF-8
            (undecodable bytes replaced).
        stderr: the retained tail of standard error, decoded likewise.
        exit_code: the shell's exit status, or ``None`` when it was killed by
            a signal.
        signal: the number of the signal that killed the shell, else ``None``.
        timed_out: whether the run hit its timeout (and was killed).
        stdout_dropped: bytes of standard output not retained (beyond the tail).
        stderr_dropped: bytes of standard error not retained.
        timeout: the timeout that applied, in seconds.
    """

    stdout: str
    stderr: str
    exit_code: int | None
    signal: int | None
    timed_out: bool
    stdout_dropped: int
    stderr_dropped: int
    timeout: float | None = None


@attrs.frozen
class ExitFacts:
    """How a process ended.

    Attributes:
        exit_code: the shell's exit status, or ``None`` when it was killed by
            a signal (or could not be reaped).
        signal: the number of the signal that killed the shell, else ``None``.
        killed: whether a kill was requested (kill, timeout, cancellation,
            release or executor exit) before the shell exited.
        kill_reason: the reason given with that kill request, if any.
    """

    exit_code: int | None
    signal: int | None
    killed: bool
    kill_reason: str | None
