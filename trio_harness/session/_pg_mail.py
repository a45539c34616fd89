"""The mail loop of a live PostgreSQL session, shared by both modes' writers.

A writer calls its ``on_mail`` (``SessionRegistry._deliver_mail``) whenever
messages may be waiting: at once, and on every wake (a notification, a
retake).  What fails is handled as the store's other background work (the
mailbox listener, the pooled heartbeat) handles it:

* a :exc:`~trio_harness.SessionStoreError` (the mailbox could not be read,
  or a mailbox delete could not be staged) leaves the messages in the
  mailbox; the delivery is tried again, backing off up to 2 s, with a
  warning, until it succeeds or the writer closes, without waiting for
  another post;
* any other exception (a bug: an agent whose ``send`` raised something else
  than a :exc:`~trio_harness.HarnessError`, which the registry treats as
  "not now") is not caught: it ends the store's service, raised out of
  ``async with store`` (and ``open_harness``), instead of being logged while
  the message blocks the mailbox forever.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable

import trio

from .._errors import SessionStoreError

log = logging.getLogger("trio_harness.session.postgres")

FIRST_RETRY = 0.05
"""Seconds before a failed delivery is tried again the first time (doubled each time, up to :data:`LAST_RETRY`)."""
LAST_RETRY = 2.0


async def mail_loop(
    session_id: str,
    wait: Callable[[], Awaitable[Callable[[], Awaitable[None]] | None]],
    wake: Callable[[], None],
) -> None:
    """Deliver on every wake until ``wait`` returns None (the writer closed or stopped receiving).

    ``wait`` waits for the next wake and returns the ``on_mail`` to call;
    ``wake`` makes the next ``wait`` return at once (a retry).
    """
    delay = FIRST_RETRY
    while (on_mail := await wait()) is not None:
        try:
            await on_mail()
        except SessionStoreError as exc:
            # The messages stay in the mailbox: tried again (backing off) until delivered or the writer closes.
            log.warning(
                "session %r: delivering posted messages failed (%s); trying again in %g s", session_id, exc, delay
            )
            await trio.sleep(delay)
            delay = min(delay * 2, LAST_RETRY)
            wake()
            continue
        delay = FIRST_RETRY
