"""How a session's events are rows of the ``events`` table: one row per event, or one per group-committed flush.

A row ``(session_id, seq, n, body)`` holds ``n`` consecutive events, seqs
``seq - n + 1`` to ``seq``: its key is its **last** event's seq, its body
their JSON lines joined by newlines (an encoded line never holds one).  The
per-session writer, :meth:`~trio_harness.session.PostgresStore.save` and a
pooled writer's own transaction (``_store_own``) store one event per row;
the pooled store's group commit (session/_pg_group.py) stores each flush of
the group as one row, so a flush of eight events costs the server one index
entry, not eight (the primary key's index was two thirds of its insert).

Why the last seq is the key: every read of a range is an index range on it
(``seq >= start``: the first row found holds ``start`` or begins after it),
the next seq to store is still ``max(seq) + 1``, and a statement storing a
batch again meets the batch's first commit at the same key.  The rule that
keeps the primary key a guard against a batch stored twice: a row of more
than one event is written only by the group commit, at its request's fixed
seqs; anything else that may write seqs such a row holds writes one row per
event (``_store_own``, after an outcome that is unknown), so whichever of
the two commits second meets the other at the batch's last seq.  A session
forked from inside a batch gets the batch's first events as a shorter row
(:func:`copy_prefix_statement`).

Readers get events through :func:`each_event`; the load checks that the
rows tile the seqs (each event's own seq is checked against its place).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

from .._errors import EventDecodeError, SessionCorruptError
from ._codec import decode_event
from ._events import Event


def each_event(
    rows: Iterable[tuple[int, int, str]], start: int = 0, *, where: str = "the events table"
) -> Iterator[tuple[int, str]]:
    """``(seq, line)`` of every event the rows ``(seq, n, body)`` hold (in their order), from seq ``start`` on.

    The rows must tile the seqs: each holds its ``n`` lines and begins where
    the one before it ended (the first may begin before ``start``).

    Raises:
        SessionCorruptError: a row does not hold its ``n`` lines, or a row
            leaves a gap after the one before it, or overlaps it (``where``
            names the session in the message).
    """
    expected: int | None = None
    for last, n, body in rows:
        first = last - n + 1
        lines = [body] if n == 1 else body.split("\n")
        if len(lines) != n:
            raise SessionCorruptError(
                f"{where}: the row of seqs {first} to {last} holds {len(lines)} events, not {n}",
                path=where,
                line=first + 2,
            )
        if expected is not None and first != expected:
            raise SessionCorruptError(
                f"{where}: event seq {expected} is missing (the next stored one is {first})"
                if first > expected
                else f"{where}: the row of seqs {first} to {last} overlaps the one before it (to {expected - 1})",
                path=where,
                line=expected + 2,
            )
        expected = last + 1
        for seq, line in enumerate(lines, start=first):
            if seq >= start:
                yield seq, line


def decode_stored(seq: int, line: str, where: str) -> Event:
    """The event stored at ``seq``; a line that is not one, or names another seq, is a corrupt session."""
    try:
        event = decode_event(line)
        if event.seq != seq:
            raise EventDecodeError(f"the event says seq {event.seq} but is stored as seq {seq}")
    except EventDecodeError as exc:
        raise SessionCorruptError(f"{where}: event seq {seq}: {exc}", path=where, line=seq + 2) from exc
    return event


def lines_between(rows: Iterable[tuple[int, int, str]], start: int, end: int) -> list[str]:
    """The stored lines of seqs ``start`` to ``end - 1`` among ``rows`` (read with ``seq >= start``)."""
    return [line for seq, line in each_event(rows, start) if seq < end]


def select_from(s: str) -> str:
    """The rows of session ``%s`` holding seqs from ``%s`` on, in order (``s``: the quoted schema)."""
    return f"SELECT seq, n, body FROM {s}.events WHERE session_id = %s AND seq >= %s ORDER BY seq"


def select_page(s: str) -> str:
    """The rows holding session ``%(sid)s``'s seqs ``%(start)s`` to ``%(start)s + %(limit)s - 1``, in order.

    An index range over the keys in that span, and the one row after it
    (which may hold its last seqs): about ``limit`` events read, however many
    a row holds.
    """
    rows = f"SELECT seq, n, body FROM {s}.events WHERE session_id = %(sid)s"
    return (
        f"({rows} AND seq >= %(start)s AND seq < %(start)s + %(limit)s) UNION ALL "
        f"({rows} AND seq >= %(start)s + %(limit)s ORDER BY seq LIMIT 1) ORDER BY seq"
    )


def copy_prefix_statement(s: str) -> str:
    """Copy the events of session ``%(source)s`` before seq ``%(boundary)s`` to ``%(child)s``; how many it copied.

    A row holding the boundary is cut: its first ``boundary - first`` lines
    become the child's last row.
    """
    cut = "array_to_string((string_to_array(body, E'\\n'))[1:%(boundary)s - (seq - n + 1)], E'\\n')"
    return (
        f"WITH c AS (INSERT INTO {s}.events (session_id, seq, n, body) "
        "SELECT %(child)s, least(seq, %(boundary)s - 1), least(n, %(boundary)s - (seq - n + 1)), "
        f"CASE WHEN seq < %(boundary)s THEN body ELSE {cut} END "
        f"FROM {s}.events WHERE session_id = %(source)s AND seq - n + 1 < %(boundary)s RETURNING n) "
        "SELECT coalesce(sum(n), 0) FROM c"
    )
