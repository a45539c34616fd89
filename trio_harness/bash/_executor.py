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

With a sandbox policy (``sandbox=SandboxPolicy(...)``) every command runs
under bubblewrap, which leads the group in the shell's place; everything above
holds inside the sandbox too (docs/sandbox.rst).

This module holds the executor and its handles.  The parts it is built from:
output buffering in :mod:`._output`, process groups (spawning, signalling,
supervision, the ``/proc`` scan) in :mod:`._process`, the model-facing text in
:mod:`._render`, the records in :mod:`._records`, and the sandbox's command
line in :mod:`._sandbox`.
"""

from __future__ import annotations

import builtins
import contextlib
import logging
import math
import os
import tempfile
import types
from collections.abc import AsyncIterator, Callable, Mapping

import attrs
import trio

from .._errors import BashError
from ._env import EnvPolicy
from ._options import BashRuntimeOptions
from ._output import OutputStream
from ._process import ProcessGroup, group_alive, open_group, reap_unsupervised
from ._records import BashRequest, BashResult, BashSpec, ExitFacts
from ._render import format_seconds, render_read
from ._sandbox import (
    INSTALL_HINT,
    Sandbox,
    SandboxPolicy,
    SandboxUnavailableError,
    open_sandbox,
)
from ._sandbox_hold import Hold, release_when_gone

log = logging.getLogger("trio_harness.bash")

# Safety bound, on top of the grace period, for awaiting processes at executor exit.
_TEARDOWN_SLACK = 10.0


class BashProcessNotFoundError(BashError, KeyError):
    """No process with this id is known to the executor (never started, or released)."""

    def __str__(self) -> str:
        # KeyError would quote the message; show it as written.
        return str(self.args[0]) if self.args else ""


# ------------------------------------------------------------------ public objects


@attrs.define(eq=False)
class BashProcess:
    """A background process started by :meth:`BashExecutor.start`.

    Created by the executor only.  The process leads its own process group, so
    ``pid`` is also its process group id.

    Attributes:
        id: the executor-local id, ``proc-N``.
        command: the command line.
        pid: the shell's pid (with a sandbox, the pid of ``bwrap``), which is
            also the process group id.
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
    _core: ProcessGroup = attrs.field(repr=False)
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
        return render_read(self._core.stdout.take(), self._core.stderr.take())

    def kill(self, reason: str | None = None) -> None:
        """Ask the process group to stop: SIGTERM now, SIGKILL after the grace period.

        Idempotent; the escalation runs in the executor's nursery.  Does nothing
        once the group is gone.

        Args:
            reason: recorded in ``ExitFacts.kill_reason`` when the shell was
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
        sandbox: the sandbox policy every command runs under, or ``None``.
        env_policy: which variables of this process's environment commands inherit.
    """

    tail_bytes: int
    grace_period: float
    default_timeout: float
    max_timeout: float
    shell: str
    spill_dir: str
    sandbox: SandboxPolicy | None
    _checked: Sandbox | None = attrs.field(repr=False)
    env_policy: EnvPolicy = attrs.field(kw_only=True)
    _nursery: trio.Nursery = attrs.field(repr=False)
    _procs: dict[str, BashProcess] = attrs.field(factory=dict, init=False, repr=False)
    _live: set[ProcessGroup] = attrs.field(factory=set, init=False, repr=False)
    _counter: int = attrs.field(default=0, init=False)
    _closed: bool = attrs.field(default=False, init=False)

    @property
    def checked_sandbox(self) -> Sandbox | None:
        """The sandbox as checked when the executor opened (resolved writable and hidden paths), or None."""
        return self._checked

    # ------------------------------------------------------------ validation

    def resolve(self, request: BashRequest) -> BashSpec:
        """Validate and normalise a request.

        Args:
            request: the command as asked for.

        Returns:
            The spec to pass to :meth:`run` or :meth:`start`.

        Raises:
            BashError: the command is empty or contains a NUL byte; the workdir
                (or, with a sandbox, the writable directory) does not exist or
                is not a directory; with a sandbox, the writable directory is
                ``/``; the timeout is not a positive number; an environment
                name or value is unusable.
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

        writable_dir = request.writable_dir if self._checked is not None else None  # only a sandbox uses it
        if writable_dir is not None:
            if not isinstance(writable_dir, str) or not writable_dir or "\0" in writable_dir:
                raise BashError(f"writable_dir must be a directory path, got {writable_dir!r}")
            writable_dir = os.path.abspath(writable_dir)
            if not os.path.isdir(writable_dir):
                raise BashError(f"writable_dir {writable_dir!r} is not an existing directory")
        if self._checked is not None and os.path.realpath(writable_dir or workdir) == "/":
            raise BashError(
                "the sandbox cannot make '/' writable (that is the whole file system): run the command "
                "from a project directory, or open the executor without a sandbox"
            )

        return BashSpec(
            command=command, workdir=workdir, timeout=timeout, owner=owner, env=env, writable_dir=writable_dir
        )

    def _recheck(self, spec: BashSpec) -> BashSpec:
        return self.resolve(
            BashRequest(
                command=spec.command,
                workdir=spec.workdir,
                timeout=spec.timeout,
                owner=spec.owner,
                env=spec.env,
                writable_dir=spec.writable_dir,
            )
        )

    # ------------------------------------------------------------ running

    async def _spawn(self, spec: BashSpec, stdout: OutputStream, stderr: OutputStream) -> ProcessGroup:
        if self._closed:
            raise BashError(f"the bash executor is closed; cannot run {spec.command!r}")
        env = self.env_policy.apply(os.environ)
        if spec.env is not None:
            env.update(spec.env)
        argv = [self.shell, "-c", spec.command]
        hold = Hold()  # the parts of git directories the sandbox makes for the command, until it ended
        try:
            if self._checked is not None:
                writable = spec.workdir if spec.writable_dir is None else spec.writable_dir
                argv = self._checked.argv(argv, workdir=spec.workdir, writable_dir=writable, hold=hold)
            process = await open_group(argv, spec.workdir, env)
        except OSError as exc:
            hold.release()
            if self._checked is not None:
                raise SandboxUnavailableError(
                    f"could not start the bash sandbox {self._checked.bwrap!r} for {spec.command!r}: {exc}; "
                    f"{INSTALL_HINT}"
                ) from exc
            raise BashError(
                f"could not start {self.shell!r} in workdir {spec.workdir!r} for {spec.command!r}: {exc}"
            ) from exc
        except BaseException:
            hold.release()
            raise
        assert process.stdout is not None
        assert process.stderr is not None
        if self._is_closed():
            # Teardown began while the shell was being spawned; the nursery may be
            # gone, so nobody would supervise it: kill and reap it here.
            await reap_unsupervised(process)
            await release_when_gone(hold, process.pid)
            raise BashError(f"the bash executor closed while starting {spec.command!r}")
        core = ProcessGroup(
            command=spec.command,
            process=process,
            out_pipe=process.stdout,
            err_pipe=process.stderr,
            stdout=stdout,
            stderr=stderr,
            grace_period=self.grace_period,
            nursery=self._nursery,
            on_settled=lambda core: self._settled(core, hold),
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
                the executor is closed; with a sandbox, when it refuses the
                command (a symbolic link git follows in its writable directory,
                docs/sandbox.rst "Git"), and after the command ended when such a
                link outside it was changed meanwhile.
        """
        spec = self._recheck(spec)
        core = await self._spawn(spec, OutputStream("stdout", self.tail_bytes), OutputStream("stderr", self.tail_bytes))
        timed_out = False
        try:
            with trio.move_on_after(spec.timeout):
                await core.done.wait()
            if not core.done.is_set():
                timed_out = True
                core.kill(f"timed out after {format_seconds(spec.timeout)}")
                await core.done.wait()
        except BaseException:
            with trio.CancelScope(shield=True):
                core.kill("cancelled")
                with trio.move_on_after(self.grace_period + _TEARDOWN_SLACK):
                    await core.done.wait()
            raise
        facts = core.exit
        assert facts is not None
        if self._checked is not None:
            self._checked.check_links(spec.command)  # a link git follows changed meanwhile: said at once
        stdout = core.stdout.snapshot()
        stderr = core.stderr.snapshot()
        return BashResult(
            stdout=stdout.text,
            stderr=stderr.text,
            exit_code=facts.exit_code,
            signal=facts.signal,
            timed_out=timed_out,
            stdout_dropped=stdout.dropped,
            stderr_dropped=stderr.dropped,
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
                the shell could not be started, or the executor is closed; with
                a sandbox, when it refuses the command (as :meth:`run`).
        """
        spec = self._recheck(spec)
        if self._closed:
            raise BashError(f"the bash executor is closed; cannot start {spec.command!r}")
        self._counter += 1
        proc_id = f"proc-{self._counter}"
        stdout = OutputStream("stdout", self.tail_bytes)
        stderr = OutputStream("stderr", self.tail_bytes)
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

    def _settled(self, core: ProcessGroup, hold: Hold) -> None:
        """A command ended: let go of what the sandbox made for it once its processes are all gone."""
        self._live.discard(core)
        if hold.empty:
            hold.release()
        elif group_alive(core.pid):  # SIGKILLed a moment ago: what runs in the sandbox is still going
            try:
                self._nursery.start_soon(release_when_gone, hold, core.pid)
            except RuntimeError:  # the nursery is gone: the parts stay (harmless)
                log.warning("the sandbox keeps the parts it made for %r: it still runs", core.command)
        else:
            hold.release()

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
        if self._checked is not None:
            self._checked.close()


def _check_settings(options: BashRuntimeOptions) -> str:
    """Validate the executor settings; return the absolute spill directory."""
    tail_bytes, grace_period = options.tail_bytes, options.grace_period
    default_timeout, max_timeout = options.default_timeout, options.max_timeout
    shell, spill_dir = options.shell, options.spill_dir
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
    options: BashRuntimeOptions | None = None,
    *,
    session_root: str | os.PathLike[str] | None = None,
) -> AsyncIterator[BashExecutor]:
    """Open a bash executor; on exit, kill and await every process it started.

    Exit is shielded from cancellation: every live process group gets SIGTERM,
    then SIGKILL after ``grace_period``; every process is awaited and every
    spill file removed.

    Args:
        options: the executor's settings (:class:`~trio_harness.bash.BashRuntimeOptions`);
            None for the defaults.
        session_root: the session store's root directory, hidden inside the
            sandbox unless the policy's ``hide_sessions`` is False
            (:func:`~trio_harness.open_harness` passes its JSONL store's root).

    Yields:
        The executor.

    Raises:
        SandboxUnavailableError: a sandbox was asked for and ``bwrap`` is
            missing or cannot create its namespaces (never a silent fall-back).
        BashError: a setting is invalid.
        TypeError: ``options`` is not a :class:`~trio_harness.bash.BashRuntimeOptions`.
    """
    if options is None:
        options = BashRuntimeOptions()
    elif not isinstance(options, BashRuntimeOptions):
        raise TypeError(f"options must be a BashRuntimeOptions, got {type(options).__name__}")
    directory = _check_settings(options)
    policy = options.sandbox
    root = None if session_root is None else os.fspath(session_root)
    checked = None if policy is None else await open_sandbox(policy, options.shell, session_root=root)

    body_error: BaseException | None = None
    unwrapped: BaseException | None = None
    try:
        async with trio.open_nursery() as nursery:
            executor = BashExecutor(
                tail_bytes=options.tail_bytes,
                grace_period=float(options.grace_period),
                default_timeout=float(options.default_timeout),
                max_timeout=float(options.max_timeout),
                shell=options.shell,
                spill_dir=directory,
                sandbox=policy,
                checked=checked,
                env_policy=options.env_policy,
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
