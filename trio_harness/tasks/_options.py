"""The task service's settings as one record (``open_harness(task_options=...)``)."""

from __future__ import annotations

import attrs

from ._service import DEFAULT_FINISHED_CAP, DEFAULT_PER_OWNER_CAP

__all__ = ["TaskRuntimeOptions"]


@attrs.frozen
class TaskRuntimeOptions:
    """Settings of the harness's task service: the keyword arguments of
    :func:`~trio_harness.tasks.open_task_service`, with the same defaults.

    The service checks them when the harness opens (a bad value raises
    :exc:`ValueError` naming it).

    Attributes:
        per_owner_cap: how many running or stopping tasks one exact owner (and
            the unowned pool) may have at once.
        finished_cap: how many finished, reported tasks one exact owner (and
            the unowned pool) keeps before the oldest are forgotten.
        teardown_timeout: the bound, in seconds of Trio time, on waiting for
            live tasks at exit; None uses the harness's ``teardown_timeout``.
    """

    per_owner_cap: int = DEFAULT_PER_OWNER_CAP
    finished_cap: int = DEFAULT_FINISHED_CAP
    teardown_timeout: float | None = None
