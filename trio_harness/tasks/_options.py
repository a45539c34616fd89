"""The task service's settings as one record (``open_task_service(options)``, ``open_harness(task_options=...)``)."""

from __future__ import annotations

import attrs

DEFAULT_PER_OWNER_CAP = 10
"""How many running or stopping tasks one owner may have by default."""

DEFAULT_FINISHED_CAP = 100
"""How many reported finished tasks the service keeps per owner by default."""


@attrs.frozen
class TaskRuntimeOptions:
    """Settings of a task service (the runtime that runs background tasks; the
    model-facing task tools' settings are :class:`~trio_harness.tools.TaskToolOptions`).

    Passed whole to :func:`~trio_harness.tasks.open_task_service` (and by
    :func:`~trio_harness.open_harness`, ``task_options=``), which checks them
    when it opens (a bad value raises :exc:`ValueError` naming it).

    Attributes:
        per_owner_cap: how many running or stopping tasks one exact owner (and
            the unowned pool) may have at once.
        finished_cap: how many finished, reported tasks one exact owner (and
            the unowned pool) keeps before the oldest are forgotten.
        teardown_timeout: the bound, in seconds of Trio time, on waiting for
            live tasks at exit; None uses the harness's ``teardown_timeout``
            (30 seconds for a service opened on its own).
    """

    per_owner_cap: int = DEFAULT_PER_OWNER_CAP
    finished_cap: int = DEFAULT_FINISHED_CAP
    teardown_timeout: float | None = None
