"""The bash executor (``harness.bash``): foreground runs and background processes.

Every command runs as ``[shell, "-c", command]`` in a new session, so it leads its
own process group (pgid == pid) and the whole group can be signalled at once.
Nothing of a group outlives its command: when the leader exits while other
members remain (``sleep 100 &``), on a timeout, on cancellation, on
:meth:`BashProcess.kill`, on release and on executor exit, the group gets
SIGTERM and, ``grace_period`` seconds later, SIGKILL if anything of it is still
alive.  Processes that leave the group (``setsid``, job control) are beyond
reach; if one of them keeps an output pipe open, the pipe is abandoned shortly
after the group is gone.

Output is kept in memory only as a bounded tail per stream.  Background
processes also write each stream in full to a private spill file (mode 0600)
that is removed when the process is released or the executor exits; a read
whose cursor fell behind the tail names that file.

All control flow uses Trio time; the executor owns a nursery in which the
supervisor, reader and escalation tasks of every process live.
"""

from __future__ import annotations

import builtins
import contextlib
import fcntl
import math
import os
import secrets
import subprocess
import tempfile
import types
from collections.abc import AsyncIterator, Callable, Mapping
from signal import SIGKILL, SIGTERM, Signals

import attrs
import trio

from .._errors import BashError

__all__ = [
    "BashError",
    "BashExecutor",
    "BashProcess",
    "BashProcessNotFoundError",
    "BashRequest",
    "BashResult",
    "BashSpec",
    "ExitFacts",
    "open_bash_executor",
    "render_result",
]

# Size of one read from a pipe.
_CHUNK = 256 * 1024
# Capacity asked for the stdout pipe (Linux F_SETPIPE_SZ): fewer wakeups per byte.
# Kept moderate because pipe pages count against a per-user soft limit.
_PIPE_SIZE = 256 * 1024
# Longest pause between two checks of whether a process group is still alive.
_MAX_POLL = 0.1
# Upper bound on reaping a SIGKILLed leader during a hard (cancelled) teardown.
_REAP_BOUND = 5.0
# Shortest time granted to drain the pipes once the group is gone.
_MIN_DRAIN = 0.5
# Safety bound, on top of the grace period, for awaiting processes at executor exit.
_TEARDOWN_SLACK = 10.0


class BashProcessNotFoundError(BashError, KeyError):
    """No process with this id is known to the executor (never started, or released)."""

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0]) if self.args else ""


# ------------------------------------------------------------------ records


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
    """

    command: str
    workdir: str | None = None
    timeout: float | None = None
    owner: str | None = None
    env: Mapping[str, str] | None = None


@attrs.frozen
class BashSpec:
    """A validated, normalised command, produced by :meth:`BashExecutor.resolve`.

    Attributes:
        command: the shell command line (not empty, no NUL byte).
        workdir: an absolute path to an existing directory.
        timeout: seconds, positive and at most the executor's ``max_timeout``.
        owner: the opaque owner token, or ``None`` for unowned.
        env: variables set on top of the inherited environment, or ``None``.
    """

    command: str
    workdir: str
    timeout: float
    owner: str | None
    env: Mapping[str, str] | None = None


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


def _signal_name(number: int) -> str:
    try:
        return Signals(number).name
    except ValueError:
        return f"signal {number}"


def _format_seconds(seconds: float) -> str:
    return f"{seconds:g}s"


def render_result(result: BashResult) -> str:
    """Render a foreground result as text for the model.

    Standard output comes first, then standard error under a ``[stderr]``
    marker line when there is any, then marker lines such as
    ``[exit code: 1]``, ``[killed by signal SIGTERM]`` and
    ``[timed out after 5s]``.  ``(no output)`` stands in for empty output.
    A nonzero exit code is reported, not treated as an error.

    Args:
        result: the result of :meth:`BashExecutor.run`.

    Returns:
        The rendered text, without a trailing newline.
    """
    parts: list[str] = []

    def add(text: str) -> None:
        if text:
            parts.append(text if text.endswith("\n") else text + "\n")

    if result.stdout_dropped:
        add(f"[output truncated: {result.stdout_dropped} earlier bytes of stdout not shown]")
    add(result.stdout)
    if result.stderr or result.stderr_dropped:
        add("[stderr]")
        if result.stderr_dropped:
            add(f"[output truncated: {result.stderr_dropped} earlier bytes of stderr not shown]")
        add(result.stderr)
    if not parts:
        add("(no output)")
    if result.exit_code is not None and result.exit_code != 0:
        add(f"[exit code: {result.exit_code}]")
    if result.signal is not None:
        add(f"[killed by signal {_signal_name(result.signal)}]")
    if result.timed_out:
        if result.timeout is not None:
            add(f"[timed out after {_format_seconds(result.timeout)}]")
        else:
            add("[timed out]")
    return "".join(parts).removesuffix("\n")


# ------------------------------------------------------------------ streams


def _incomplete_suffix(data: bytearray, start: int) -> int:
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


def _leading_continuations(data: bytearray, start: int) -> int:
    """Return how many (at most 3) UTF-8 continuation bytes begin ``data[start:]``."""
    count = 0
    while count < 3 and start + count < len(data) and data[start + count] & 0xC0 == 0x80:
        count += 1
    return count


@attrs.define(eq=False)
class _Stream:
    """One output stream: a bounded tail in memory, a read cursor, an optional spill file.

    The buffer holds bytes ``[total - len(buf), total)`` of the stream.
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

    def feed(self, chunk: bytes | bytearray) -> None:
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

    def take(self) -> tuple[str, int]:
        """Consume everything new since the last take: (text, bytes dropped unread)."""
        base = self.total - len(self.buf)
        dropped = 0
        if self.cursor < base:
            dropped = base - self.cursor
            self.cursor = base
            skip = _leading_continuations(self.buf, 0)
            dropped += skip
            self.cursor += skip
        start = self.cursor - base
        end = len(self.buf)
        if not self.eof:
            end -= _incomplete_suffix(self.buf, start)
        if end <= start:
            return "", dropped
        text = self.buf[start:end].decode("utf-8", "replace")
        self.cursor = base + end
        return text, dropped

    def snapshot(self) -> tuple[str, int]:
        """The whole retained tail, without consuming: (text, bytes not retained)."""
        dropped = self.total - len(self.buf)
        skip = _leading_continuations(self.buf, 0) if dropped else 0
        return self.buf[skip:].decode("utf-8", "replace"), dropped + skip

    def open_spill(self, directory: str, stem: str) -> None:
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
        if self.spill_fd >= 0:
            fd, self.spill_fd = self.spill_fd, -1
            with contextlib.suppress(OSError):
                os.close(fd)

    def remove_spill(self) -> None:
        self.close_spill()
        if self.spill_path is not None and not self.spill_removed:
            self.spill_removed = True
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.spill_path)

    def truncation_line(self, dropped: int) -> str:
        if self.spill_path is None:
            where = f"{self.name} is not kept"
        elif self.spill_removed:
            where = f"the {self.name} spill file was removed"
        elif self.spill_error is not None:
            where = f"{self.name} spill file {self.spill_path} is incomplete ({self.spill_error})"
        else:
            where = f"full {self.name} in {self.spill_path}"
        return f"[output truncated: {dropped} bytes not shown; {where}]\n"


# ------------------------------------------------------------------ process groups


def _signal_group(pgid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


def _group_alive(pgid: int) -> bool:
    """Whether any process of the group is alive (zombies waiting to be reaped do not count)."""
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # The group exists, but orphaned members may be zombies that init has not
    # reaped yet; only a member that still runs counts.
    try:
        names = os.listdir("/proc")
    except OSError:
        return True
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        fields = stat[stat.rfind(b")") + 2 :].split()
        if len(fields) > 2 and int(fields[2]) == pgid and fields[0] not in (b"Z", b"X"):
            return True
    return False


@attrs.define(eq=False)
class _Proc:
    """The live machinery of one spawned command (foreground or background)."""

    command: str
    process: trio.Process
    out_pipe: trio.abc.ReceiveStream
    err_pipe: trio.abc.ReceiveStream
    stdout: _Stream
    stderr: _Stream
    grace_period: float
    nursery: trio.Nursery
    on_settled: Callable[[_Proc], None]
    done: trio.Event = attrs.field(factory=trio.Event)
    settled: trio.Event = attrs.field(factory=trio.Event)
    pipes_closed: trio.Event = attrs.field(factory=trio.Event)
    exit: ExitFacts | None = None
    leader_rc: int | None = None
    killed: bool = False
    kill_reason: str | None = None
    terminating: bool = False
    escalating: bool = False
    open_pipes: int = 2

    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self, reason: str | None) -> None:
        if self.leader_rc is None and not self.killed:
            self.killed = True
            self.kill_reason = reason
        self.terminate()

    def terminate(self) -> None:
        """SIGTERM the group now and SIGKILL it after the grace period (once)."""
        if self.terminating:
            return
        self.terminating = True
        if self.leader_rc is not None and not _group_alive(self.pid):
            return
        _signal_group(self.pid, SIGTERM)
        self.escalating = True
        try:
            self.nursery.start_soon(self._escalate)
        except RuntimeError:  # the executor's nursery is gone: no grace left to give
            self.escalating = False
            _signal_group(self.pid, SIGKILL)

    async def _escalate(self) -> None:
        try:
            with trio.move_on_after(self.grace_period):
                delay = 0.005
                while _group_alive(self.pid):
                    await trio.sleep(delay)
                    delay = min(delay * 2, _MAX_POLL)
                return
            _signal_group(self.pid, SIGKILL)
        except BaseException:
            _signal_group(self.pid, SIGKILL)
            raise
        finally:
            self.escalating = False
            self._check_settled()

    async def supervise(self) -> None:
        try:
            async with trio.open_nursery() as pumps:
                pumps.start_soon(self._pump, self.out_pipe, self.stdout)
                pumps.start_soon(self._pump, self.err_pipe, self.stderr)
                self.leader_rc = await self.process.wait()
                if _group_alive(self.pid):
                    self.terminate()
                await self._await_pipes()
                pumps.cancel_scope.cancel()
        finally:
            if self.leader_rc is None:  # cancelled before the leader was reaped
                _signal_group(self.pid, SIGKILL)
                with trio.CancelScope(shield=True), trio.move_on_after(_REAP_BOUND):
                    self.leader_rc = await self.process.wait()
            self._finish()

    async def _await_pipes(self) -> None:
        """Wait for EOF on both pipes; abandon them shortly after the group is gone."""
        delay = 0.01
        while not self.pipes_closed.is_set():
            with trio.move_on_after(delay):
                await self.pipes_closed.wait()
            delay = min(delay * 2, _MAX_POLL)
            if not self.pipes_closed.is_set() and not _group_alive(self.pid):
                # Whoever still holds a pipe is outside the group; give the pipes
                # a moment to drain, then stop listening.
                with trio.move_on_after(max(self.grace_period, _MIN_DRAIN)):
                    await self.pipes_closed.wait()
                return

    async def _pump(self, pipe: trio.abc.ReceiveStream, sink: _Stream) -> None:
        try:
            while True:
                chunk = await pipe.receive_some(_CHUNK)
                if not chunk:
                    break
                sink.feed(chunk)
        except (trio.BrokenResourceError, trio.ClosedResourceError):
            pass
        finally:
            sink.eof = True
            sink.close_spill()
            self.open_pipes -= 1
            if self.open_pipes == 0:
                self.pipes_closed.set()
            await trio.aclose_forcefully(pipe)

    def _finish(self) -> None:
        rc = self.leader_rc
        self.exit = ExitFacts(
            exit_code=rc if rc is not None and rc >= 0 else None,
            signal=-rc if rc is not None and rc < 0 else None,
            killed=self.killed,
            kill_reason=self.kill_reason,
        )
        self.stdout.eof = self.stderr.eof = True
        self.stdout.close_spill()
        self.stderr.close_spill()
        self.done.set()
        self._check_settled()

    def _check_settled(self) -> None:
        if self.done.is_set() and not self.escalating and not self.settled.is_set():
            self.settled.set()
            self.on_settled(self)


# ------------------------------------------------------------------ public objects


@attrs.define(eq=False)
class BashProcess:
    """A background process started by :meth:`BashExecutor.start`.

    Created by the executor only.  The process leads its own process group, so
    ``pid`` is also its process group id.

    Attributes:
        id: the executor-local id, ``proc-N``.
        command: the command line.
        pid: the shell's pid, which is also the process group id.
        owner: the opaque owner token given at start (``None`` for unowned).
        stdout_path: the spill file holding the full standard output.
        stderr_path: the spill file holding the full standard error.
    """

    id: str
    command: str
    pid: int
    owner: str | None
    stdout_path: str
    stderr_path: str
    _core: _Proc = attrs.field(repr=False)
    _forget: Callable[[str], None] = attrs.field(repr=False)

    @property
    def exit(self) -> ExitFacts | None:
        """How the process ended, once it has exited and its output is complete; else ``None``."""
        return self._core.exit

    @property
    def running(self) -> bool:
        """Whether the process has not finished yet (see :meth:`wait`)."""
        return self._core.exit is None

    @property
    def stdout_bytes(self) -> int:
        """Total bytes of standard output received so far."""
        return self._core.stdout.total

    @property
    def stderr_bytes(self) -> int:
        """Total bytes of standard error received so far."""
        return self._core.stderr.total

    def read_output(self) -> str:
        """Consume and return everything produced since the previous read.

        New standard output comes first, then new standard error under a
        ``[stderr]`` marker line (only when there is new standard error).  If
        bytes were dropped from the in-memory tail before being read, a line
        ``[output truncated: N bytes not shown; full stdout in PATH]`` naming the
        spill file precedes the retained tail.  Text is decoded as UTF-8 and a
        character split across reads is held back until it is complete.

        Returns:
            The new output; the empty string when there is none.
        """
        core = self._core
        out, out_dropped = core.stdout.take()
        err, err_dropped = core.stderr.take()
        parts: list[str] = []
        if out_dropped:
            parts.append(core.stdout.truncation_line(out_dropped))
        parts.append(out)
        if err or err_dropped:
            if out and not out.endswith("\n"):
                parts.append("\n")
            parts.append("[stderr]\n")
            if err_dropped:
                parts.append(core.stderr.truncation_line(err_dropped))
            parts.append(err)
        return "".join(parts)

    def kill(self, reason: str | None = None) -> None:
        """Ask the process group to stop: SIGTERM now, SIGKILL after the grace period.

        Idempotent; the escalation runs in the executor's nursery.  Does nothing
        once the group is gone.

        Args:
            reason: recorded in :attr:`ExitFacts.kill_reason` when the shell was
                still running.
        """
        self._core.kill(reason)

    async def wait(self) -> ExitFacts:
        """Wait until the process has exited and its output is complete.

        Output is complete when both pipes reached EOF, or were abandoned
        because only processes outside the group held them.

        Returns:
            How the process ended.
        """
        await self._core.done.wait()
        assert self._core.exit is not None
        return self._core.exit

    def release(self) -> None:
        """Forget the process and delete its spill files, killing it first if it runs.

        Output already in memory stays readable through this object.
        """
        if self._core.exit is None:
            self._core.kill("released")
        self._forget(self.id)
        self._core.stdout.remove_spill()
        self._core.stderr.remove_spill()

    async def aclose(self) -> None:
        """Release the process (see :meth:`release`), then wait until it has finished."""
        self.release()
        await self._core.done.wait()


@attrs.define(eq=False)
class BashExecutor:
    """Runs shell commands; create it with :func:`open_bash_executor`.

    Attributes:
        tail_bytes: bytes of each output stream kept in memory.
        grace_period: seconds between SIGTERM and SIGKILL.
        default_timeout: the foreground timeout when a request names none.
        max_timeout: the cap on any foreground timeout.
        shell: the shell executable.
        spill_dir: the directory holding background spill files.
    """

    tail_bytes: int
    grace_period: float
    default_timeout: float
    max_timeout: float
    shell: str
    spill_dir: str
    _nursery: trio.Nursery = attrs.field(repr=False)
    _procs: dict[str, BashProcess] = attrs.field(factory=dict, init=False, repr=False)
    _live: set[_Proc] = attrs.field(factory=set, init=False, repr=False)
    _counter: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    # ------------------------------------------------------------ validation

    def resolve(self, request: BashRequest) -> BashSpec:
        """Validate and normalise a request.

        Args:
            request: the command as asked for.

        Returns:
            The spec to pass to :meth:`run` or :meth:`start`.

        Raises:
            BashError: the command is empty or contains a NUL byte; the workdir
                does not exist or is not a directory; the timeout is not a
                positive number; an environment name or value is unusable.
        """
        command = request.command
        if not isinstance(command, str) or not command.strip():
            raise BashError(f"command must be a non-empty shell command, got {command!r}")
        if "\0" in command:
            raise BashError(f"command must not contain a NUL byte, got {command!r}")

        workdir = os.getcwd() if request.workdir is None else request.workdir
        if not isinstance(workdir, str) or not workdir or "\0" in workdir:
            raise BashError(f"workdir must be a directory path, got {request.workdir!r}")
        workdir = os.path.abspath(workdir)
        if not os.path.exists(workdir):
            raise BashError(f"workdir {workdir!r} does not exist")
        if not os.path.isdir(workdir):
            raise BashError(f"workdir {workdir!r} is not a directory")

        timeout = self.default_timeout if request.timeout is None else request.timeout
        if isinstance(timeout, bool) or not isinstance(timeout, int | float) or math.isnan(timeout) or timeout <= 0:
            raise BashError(f"timeout must be a positive number of seconds, got {request.timeout!r}")
        timeout = float(min(timeout, self.max_timeout))

        owner = request.owner
        if owner is not None and not isinstance(owner, str):
            raise BashError(f"owner must be a string or None, got {owner!r}")

        env: Mapping[str, str] | None = None
        if request.env is not None:
            for key, value in request.env.items():
                if not isinstance(key, str) or not key or "=" in key or "\0" in key:
                    raise BashError(f"env name {key!r} is not a valid variable name")
                if not isinstance(value, str) or "\0" in value:
                    raise BashError(f"env value for {key!r} must be a string without NUL, got {value!r}")
            env = types.MappingProxyType(dict(request.env))

        return BashSpec(command=command, workdir=workdir, timeout=timeout, owner=owner, env=env)

    def _recheck(self, spec: BashSpec) -> BashSpec:
        return self.resolve(
            BashRequest(
                command=spec.command,
                workdir=spec.workdir,
                timeout=spec.timeout,
                owner=spec.owner,
                env=spec.env,
            )
        )

    # ------------------------------------------------------------ running

    async def _spawn(self, spec: BashSpec, stdout: _Stream, stderr: _Stream) -> _Proc:
        if self._closed:
            raise BashError(f"the bash executor is closed; cannot run {spec.command!r}")
        env = None if spec.env is None else {**os.environ, **spec.env}
        try:
            process = await trio.lowlevel.open_process(
                [self.shell, "-c", spec.command],
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                cwd=spec.workdir,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            raise BashError(
                f"could not start {self.shell!r} in workdir {spec.workdir!r} for {spec.command!r}: {exc}"
            ) from exc
        assert process.stdout is not None
        assert process.stderr is not None
        if self._is_closed():
            # Teardown began while the shell was being spawned; the nursery may be
            # gone, so nobody would supervise it: kill and reap it here.
            _signal_group(process.pid, SIGKILL)
            with trio.CancelScope(shield=True):
                with trio.move_on_after(_REAP_BOUND):
                    await process.wait()
                await trio.aclose_forcefully(process.stdout)
                await trio.aclose_forcefully(process.stderr)
            raise BashError(f"the bash executor closed while starting {spec.command!r}")
        if isinstance(process.stdout, trio.lowlevel.FdStream):
            with contextlib.suppress(OSError):
                fcntl.fcntl(process.stdout.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_SIZE)
        core = _Proc(
            command=spec.command,
            process=process,
            out_pipe=process.stdout,
            err_pipe=process.stderr,
            stdout=stdout,
            stderr=stderr,
            grace_period=self.grace_period,
            nursery=self._nursery,
            on_settled=self._live.discard,
        )
        self._live.add(core)
        self._nursery.start_soon(core.supervise)
        return core

    async def run(self, spec: BashSpec) -> BashResult:
        """Run a command in the foreground, with the spec's timeout.

        On timeout the process group is killed (SIGTERM, SIGKILL after the
        grace period) and the result is marked ``timed_out``.  If the calling
        task is cancelled, the group is killed the same way (shielded) and
        :class:`trio.Cancelled` is re-raised.

        Args:
            spec: a spec from :meth:`resolve`.

        Returns:
            The output tails and how the command ended.  A nonzero exit code is
            not an error.

        Raises:
            BashError: the spec is invalid, the shell could not be started, or
                the executor is closed.
        """
        spec = self._recheck(spec)
        core = await self._spawn(spec, _Stream("stdout", self.tail_bytes), _Stream("stderr", self.tail_bytes))
        timed_out = False
        try:
            with trio.move_on_after(spec.timeout):
                await core.done.wait()
            if not core.done.is_set():
                timed_out = True
                core.kill(f"timed out after {_format_seconds(spec.timeout)}")
                await core.done.wait()
        except BaseException:
            with trio.CancelScope(shield=True):
                core.kill("cancelled")
                with trio.move_on_after(self.grace_period + _TEARDOWN_SLACK):
                    await core.done.wait()
            raise
        facts = core.exit
        assert facts is not None
        stdout, stdout_dropped = core.stdout.snapshot()
        stderr, stderr_dropped = core.stderr.snapshot()
        return BashResult(
            stdout=stdout,
            stderr=stderr,
            exit_code=facts.exit_code,
            signal=facts.signal,
            timed_out=timed_out,
            stdout_dropped=stdout_dropped,
            stderr_dropped=stderr_dropped,
            timeout=spec.timeout,
        )

    async def start(self, spec: BashSpec) -> BashProcess:
        """Start a command in the background; returns once it is spawned.

        The spec's timeout does not apply to background processes.

        Args:
            spec: a spec from :meth:`resolve`.

        Returns:
            The process, registered under a new id ``proc-N``.

        Raises:
            BashError: the spec is invalid, a spill file could not be created,
                the shell could not be started, or the executor is closed.
        """
        spec = self._recheck(spec)
        if self._closed:
            raise BashError(f"the bash executor is closed; cannot start {spec.command!r}")
        self._counter += 1
        proc_id = f"proc-{self._counter}"
        stdout = _Stream("stdout", self.tail_bytes)
        stderr = _Stream("stderr", self.tail_bytes)
        stem = f"trio-harness-bash-{proc_id}"
        try:
            for stream in (stdout, stderr):
                stream.open_spill(self.spill_dir, stem)
        except OSError as exc:
            stdout.remove_spill()
            stderr.remove_spill()
            raise BashError(f"could not create a spill file in {self.spill_dir!r}: {exc}") from exc
        try:
            core = await self._spawn(spec, stdout, stderr)
        except BaseException:
            stdout.remove_spill()
            stderr.remove_spill()
            raise
        assert stdout.spill_path is not None
        assert stderr.spill_path is not None
        process = BashProcess(
            id=proc_id,
            command=spec.command,
            pid=core.pid,
            owner=spec.owner,
            stdout_path=stdout.spill_path,
            stderr_path=stderr.spill_path,
            core=core,
            forget=self._forget,
        )
        self._procs[proc_id] = process
        return process

    # ------------------------------------------------------------ registry

    def _is_closed(self) -> bool:
        return self._closed

    def _forget(self, proc_id: str) -> None:
        self._procs.pop(proc_id, None)

    def get(self, id: str) -> BashProcess:
        """Return the background process with this id.

        Args:
            id: a ``proc-N`` id.

        Raises:
            BashProcessNotFoundError: no such process (never started, or released).
        """
        try:
            return self._procs[id]
        except KeyError:
            raise BashProcessNotFoundError(f"no bash process with id {id!r}") from None

    def owner_of(self, id: str) -> str | None:
        """Return the owner token of a process that is live or finished but not released.

        This is the one read path for ownership.

        Args:
            id: a ``proc-N`` id.

        Returns:
            The owner token given at start; ``None`` when it was started unowned.

        Raises:
            BashProcessNotFoundError: no such process (never started, or released).
        """
        return self.get(id).owner

    def list(self) -> builtins.list[BashProcess]:
        """Return the background processes not released yet, oldest first."""
        return builtins.list(self._procs.values())

    # ------------------------------------------------------------ teardown

    async def _shutdown(self) -> None:
        self._closed = True
        for core in builtins.list(self._live):
            core.kill("executor closing")
        with trio.move_on_after(self.grace_period + _TEARDOWN_SLACK):
            for core in builtins.list(self._live):
                await core.settled.wait()
        for process in self._procs.values():
            process._core.stdout.remove_spill()
            process._core.stderr.remove_spill()
        self._procs.clear()
        if self._live:
            # Something did not finish within the bound: cancel its tasks, whose
            # cleanup SIGKILLs the group and reaps the leader.
            self._nursery.cancel_scope.cancel()


def _check_settings(
    tail_bytes: int,
    grace_period: float,
    default_timeout: float,
    max_timeout: float,
    shell: str,
    spill_dir: str | None,
) -> str:
    """Validate the executor settings; return the absolute spill directory."""
    if isinstance(tail_bytes, bool) or not isinstance(tail_bytes, int) or tail_bytes < 1:
        raise BashError(f"tail_bytes must be a positive integer, got {tail_bytes!r}")
    if not (0 <= grace_period < math.inf):
        raise BashError(f"grace_period must be a finite number >= 0, got {grace_period!r}")
    if not (0 < default_timeout < math.inf):
        raise BashError(f"default_timeout must be a positive number, got {default_timeout!r}")
    if not (0 < max_timeout < math.inf):
        raise BashError(f"max_timeout must be a positive number, got {max_timeout!r}")
    if not shell:
        raise BashError(f"shell must name an executable, got {shell!r}")
    directory = tempfile.gettempdir() if spill_dir is None else os.path.abspath(spill_dir)
    if not os.path.isdir(directory):
        raise BashError(f"spill_dir {directory!r} is not an existing directory")
    return directory


@contextlib.asynccontextmanager
async def open_bash_executor(
    *,
    tail_bytes: int = 64 * 1024,
    grace_period: float = 2.0,
    default_timeout: float = 120.0,
    max_timeout: float = 600.0,
    shell: str = "/bin/bash",
    spill_dir: str | None = None,
) -> AsyncIterator[BashExecutor]:
    """Open a bash executor; on exit, kill and await every process it started.

    Exit is shielded from cancellation: every live process group gets SIGTERM,
    then SIGKILL after ``grace_period``; every process is awaited and every
    spill file removed.

    Args:
        tail_bytes: bytes of each output stream kept in memory per process.
        grace_period: seconds between SIGTERM and SIGKILL.
        default_timeout: foreground timeout (seconds) when a request names none.
        max_timeout: cap (seconds) on any foreground timeout.
        shell: the shell executable, run as ``[shell, "-c", command]``.
        spill_dir: directory for spill files; default :func:`tempfile.gettempdir`.

    Yields:
        The executor.

    Raises:
        BashError: a setting is invalid.
    """
    directory = _check_settings(tail_bytes, grace_period, default_timeout, max_timeout, shell, spill_dir)

    body_error: BaseException | None = None
    unwrapped: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            executor = BashExecutor(
                tail_bytes=tail_bytes,
                grace_period=float(grace_period),
                default_timeout=float(default_timeout),
                max_timeout=float(max_timeout),
                shell=shell,
                spill_dir=directory,
                nursery=nursery,
            )
            try:
                yield executor
            except BaseException as exc:
                body_error = exc
                raise
            finally:
                with trio.CancelScope(shield=True):
                    await executor._shutdown()
    except BaseExceptionGroup as group:
        # The nursery wraps what the body raised; hand it back unwrapped when it
        # is the only error, so callers see their own exception.
        if body_error is None or len(group.exceptions) != 1 or group.exceptions[0] is not body_error:
            raise
        unwrapped = body_error
    if unwrapped is not None:
        raise unwrapped
