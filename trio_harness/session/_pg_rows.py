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


def each_event(rows: Iterable[tuple[int, int, str]], start: int = 0) -> Iterator[tuple[int, str]]:
    """``(seq, line)`` of every event the rows ``(seq, n, body)`` hold (in their order), from seq ``start`` on.

    A row's lines are placed back from its key, its last seq: a row whose
    body does not hold ``n`` lines leaves a gap before it (or overlaps the
    row before), which the load finds (a missing seq, or an event stored at
    a seq it does not name), never a session cut short without a word.
    """
    for last, n, body in rows:
        if n == 1:
            if last >= start:
                yield last, body
            continue
        lines = body.split("\n")
        for seq, line in enumerate(lines, start=last - len(lines) + 1):
            if seq >= start:
                yield seq, line


def lines_between(rows: Iterable[tuple[int, int, str]], start: int, end: int) -> list[str]:
    """The stored lines of seqs ``start`` to ``end - 1`` among ``rows`` (read with ``seq >= start``)."""
    return [line for seq, line in each_event(rows, start) if seq < end]


def select_from(s: str) -> str:
    """The rows of session ``%s`` holding seqs from ``%s`` on, in order (``s``: the quoted schema)."""
    return f"SELECT seq, n, body FROM {s}.events WHERE session_id = %s AND seq >= %s ORDER BY seq"


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
