"""The bash executor's settings as one record (``open_bash_executor(options)``, ``open_harness(bash_options=...)``)."""

from __future__ import annotations

import attrs

from ._env import EnvPolicy, to_env_policy
from ._sandbox import SandboxPolicy, to_policy


@attrs.frozen
class BashRuntimeOptions:
    """Settings of a bash executor (the runtime that runs commands; the
    model-facing ``bash`` tool's settings are :class:`~trio_harness.tools.BashToolOptions`).

    Passed whole to :func:`~trio_harness.bash.open_bash_executor` (and by
    :func:`~trio_harness.open_harness`, ``bash_options=``), which checks them
    when it opens (a bad value raises :exc:`~trio_harness.BashError` naming it).

    Attributes:
        tail_bytes: bytes of each output stream kept in memory per process.
        grace_period: seconds between SIGTERM and SIGKILL.
        default_timeout: foreground timeout (seconds) when a request names none.
        max_timeout: cap (seconds) on any foreground timeout.
        shell: the shell executable, run as ``[shell, "-c", command]``.
        spill_dir: directory for spill files; None for the system's temporary directory.
        sandbox: run every command in a bubblewrap sandbox with this policy
            (:class:`~trio_harness.bash.SandboxPolicy`; a dict of its fields or
            True for the defaults are converted); None (the default) for no
            sandbox.  See docs/sandbox.rst.
        env_policy: which variables of the harness's environment commands
            inherit (:class:`~trio_harness.bash.EnvPolicy`; a dict of its
            fields is converted); the default withholds API keys, tokens,
            secrets and passwords, with or without a sandbox.  The harness
            applies it to its MCP stdio servers too.  See docs/bash.rst,
            "Environment".
    """

    tail_bytes: int = 64 * 1024
    grace_period: float = 2.0
    default_timeout: float = 120.0
    max_timeout: float = 600.0
    shell: str = "/bin/bash"
    spill_dir: str | None = None
    sandbox: SandboxPolicy | None = attrs.field(default=None, converter=to_policy)
    env_policy: EnvPolicy = attrs.field(factory=EnvPolicy, converter=to_env_policy)
