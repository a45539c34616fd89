"""How events are rows (session/_pg_rows.py): one per event, or one per group-committed flush keyed by its last seq.

The pure functions against every split of a session into rows (hypothesis);
the readers (load, ``events_since``, fork) against a real cluster holding a
session in a mixed layout, at every seq; the group commit writing one row
per flush; a row that does not hold its ``n`` lines; and a version-3 schema
upgraded with its sessions.
"""

from __future__ import annotations

import logging
from typing import Any

import hypothesis
import hypothesis.strategies as st
import psycopg
import pytest
import trio
from _postgres import admin, events_stored, postgres_cluster, schema, store, superuser
from _util import WAIT
from test_postgres_store import one_turn, stored_session

from trio_harness import SessionCorruptError, SessionStoreError
from trio_harness.session import PooledPostgresStore, PostgresStore, SessionRegistry, _pg_schema
from trio_harness.session._codec import encode_event
from trio_harness.session._events import SessionHeader
from trio_harness.session._pg_rows import each_event, lines_between, select_page

__all__ = ["postgres_cluster", "schema", "store", "superuser"]  # the fixtures, imported for pytest


def as_rows(lines: list[str], sizes: list[int]) -> list[tuple[int, int, str]]:
    """``lines`` as rows ``(last seq, n, body)`` of the given sizes (the rest one per row)."""
    rows: list[tuple[int, int, str]] = []
    seq = 0
    for size in sizes:
        if seq >= len(lines):
            break
        chunk = lines[seq : seq + size]
        rows.append((seq + len(chunk) - 1, len(chunk), "\n".join(chunk)))
        seq += len(chunk)
    rows += [(n, 1, lines[n]) for n in range(seq, len(lines))]
    return rows


@hypothesis.given(
    lines=st.lists(st.text(st.characters(blacklist_characters="\n"), max_size=5), max_size=30),
    sizes=st.lists(st.integers(1, 9), max_size=30),
    start=st.integers(0, 32),
    end=st.integers(0, 32),
)
def test_each_event_reads_back_any_split_of_the_lines_into_rows(
    lines: list[str], sizes: list[int], start: int, end: int
) -> None:
    rows = as_rows(lines, sizes)
    assert list(each_event(rows)) == list(enumerate(lines))
    assert list(each_event(rows, start)) == list(enumerate(lines))[start:]
    # What a range read (``seq >= start``: every row whose last seq is at or after it) returns.
    assert lines_between([row for row in rows if row[0] >= start], start, end) == lines[start:end]


@pytest.mark.parametrize(
    ("rows", "error"),
    [
        ([(0, 1, "a"), (3, 3, "b\nc")], "the row of seqs 1 to 3 holds 2 events, not 3"),
        ([(0, 1, "a"), (2, 2, "b\nc\nd")], "the row of seqs 1 to 2 holds 3 events, not 2"),
        ([(1, 2, "a\nb"), (4, 1, "c")], "event seq 2 is missing \\(the next stored one is 4\\)"),
        ([(3, 4, "a\nb\nc\nd"), (5, 3, "e\nf\ng")], "the row of seqs 3 to 5 overlaps the one before it \\(to 3\\)"),
    ],
    ids=["short", "long", "gap", "overlap"],
)
def test_rows_that_do_not_tile_the_seqs_are_a_corrupt_session_naming_where(
    rows: list[tuple[int, int, str]], error: str
) -> None:
    with pytest.raises(SessionCorruptError, match="session 's': " + error):
        list(each_event(rows, where="session 's'"))


def mixed_layout(conn: psycopg.Connection[Any], schema: str, session_id: str, sizes: list[int]) -> None:
    """Store ``session_id``'s events again as rows of ``sizes`` (then one per row), as a pooled worker leaves them."""
    rows = conn.execute(
        f"DELETE FROM {schema}.events WHERE session_id = %s RETURNING seq, body", (session_id,)
    ).fetchall()
    lines = [body for _, body in sorted(rows)]
    conn.cursor().executemany(
        f"INSERT INTO {schema}.events (session_id, seq, n, body) VALUES (%s, %s, %s, %s)",
        [(session_id, *row) for row in as_rows(lines, sizes)],
    )


SIZES = [1, 4, 2, 1, 6, 3]


async def test_load_follow_and_fork_read_a_session_stored_in_rows_of_several_events_at_every_seq(
    store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    events = await stored_session(store, "parent", turns=3)
    mixed_layout(superuser, schema, "parent", SIZES)
    rows = superuser.execute(f"SELECT count(*) FROM {schema}.events").fetchone()
    assert rows is not None and rows[0] < len(events)
    assert (await store.load("parent")).events == events
    for start in range(len(events) + 1):
        assert await store.events_since("parent", start, limit=3) == list(events[start : start + 3])
        assert await store.events_since("parent", start) == list(events[start:])
        # A page reads the rows of its span and one more, however many events the rows hold.
        page = superuser.execute(select_page(schema), {"sid": "parent", "start": start, "limit": 3}).fetchall()
        assert sum(n for _, n, _ in page) <= 3 + 2 * max(SIZES), (start, page)
    for boundary in range(len(events) + 1):  # every cut, inside a row or between two (the store's own fork)
        child = SessionHeader(id=f"child-{boundary}", created_at=0.0, cwd="/work", parent_session="parent")
        assert await store.copy_prefix("parent", boundary, child)
        assert (await store.load(child.id)).events == events[:boundary], boundary
        assert events_stored(superuser, schema, child.id) == boundary
    header = await SessionRegistry(store).fork("parent", 16, "forked")  # at a turn's end, as users fork
    assert (await store.load("forked")).events == events[:16] and header.seed_length == 16


async def test_the_group_commit_stores_each_flush_as_one_row_keyed_by_its_last_seq(
    postgres_cluster: Any, store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    for name in ("a", "b"):
        await stored_session(store, name)
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        entries = [sessions.enter(await sessions.prepare_resume(name)) for name in ("a", "b")]
        expected: dict[str, list[tuple[int, int]]] = {"a": [], "b": []}
        for turn in (2, 3):
            for entry in entries:
                before = len(entry.session.events)
                one_turn(entry.session, turn)
                added = len(entry.session.events) - before
                expected[entry.session.header.id].append((before + added - 1, added))
            for entry in entries:
                await entry.session.flush()
        for entry in entries:
            await sessions.detach(entry)
    for entry in entries:
        sid, events = entry.session.header.id, tuple(entry.session.events)
        rows = superuser.execute(
            f"SELECT seq, n FROM {schema}.events WHERE session_id = %s AND n > 1 ORDER BY seq", (sid,)
        ).fetchall()
        assert rows == expected[sid]  # the first flush (the turn resumed: singles) then one row per flush
        assert events_stored(superuser, schema, sid) == len(events)
        assert (await store.load(sid)).events == events


async def test_a_row_that_does_not_hold_its_n_events_is_a_clear_load_error(
    store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    events = await stored_session(store, "s1")
    superuser.execute(f"DELETE FROM {schema}.events WHERE session_id = 's1' AND seq >= 2")
    torn = "\n".join(encode_event(event) for event in events[2:4])
    superuser.execute(
        f"INSERT INTO {schema}.events (session_id, seq, n, body) VALUES ('s1', 4, 3, %s)", (torn,)
    )  # seqs 2 to 4, holding only two lines
    with pytest.raises(SessionCorruptError, match="the row of seqs 2 to 4 holds 2 events, not 3"):
        await store.load("s1")
    with pytest.raises(SessionCorruptError, match="the row of seqs 2 to 4 holds 2 events, not 3"):
        await store.events_since("s1", 1)


async def test_a_version_3_schema_is_upgraded_by_check_with_its_sessions_and_pooled_flushes_go_on(
    postgres_cluster: Any, store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    events = await stored_session(store, "kept")
    superuser.execute(f"ALTER TABLE {schema}.events DROP COLUMN n")  # as an older trio-harness left it
    superuser.execute(f"DELETE FROM {schema}.schema_version WHERE version = 4")
    pooled = PooledPostgresStore(postgres_cluster.dsn(), schema=schema)
    with pytest.raises(SessionStoreError, match="are at version 3; run check"):
        async with pooled:
            pass
    await pooled.check()
    async with pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("kept"))
        assert tuple(entry.session.events) == events
        one_turn(entry.session, 9)
        await entry.session.flush()
        await sessions.detach(entry)
    assert (await store.load("kept")).events == tuple(entry.session.events)
    assert superuser.execute(f"SELECT count(*) FROM {schema}.events WHERE n > 1").fetchone() == (1,)


def as_if_unknown(writer: Any, lines: list[str]) -> None:
    """Put a pooled writer back as a flush of ``lines`` whose outcome was unknown leaves it (it may have committed)."""
    writer._stored -= len(lines)
    writer._buffer[:0] = lines
    writer._uncertain = True


@pytest.mark.parametrize("stored", ["its own batch", "another writer's events"])
async def test_after_an_unknown_outcome_the_writer_keeps_its_batch_row_found_and_stores_only_the_rest(
    postgres_cluster: Any, store: PostgresStore, superuser: psycopg.Connection[Any], schema: str, stored: str
) -> None:
    """The group commit stored the batch as one row but the writer could not know it: its next flush (its own
    transaction, ``_store_own``) finds the row, keeps it and inserts only the events after it, one per row;
    events at those seqs that are not its batch fail the flush, naming it, and nothing of it is stored."""
    await stored_session(store, "s1")
    async with PooledPostgresStore(postgres_cluster.dsn(), schema=schema) as pooled:
        sessions = SessionRegistry(pooled)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        writer: Any = entry.writer
        first = len(entry.session.events)
        one_turn(entry.session, 2)
        lines = list(writer._buffer)
        await entry.session.flush()  # one row, by the group commit
        if stored == "another writer's events":
            superuser.execute(
                f"UPDATE {schema}.events SET body = replace(body, 'do it', 'not it') WHERE session_id = 's1' AND n > 1"
            )
        as_if_unknown(writer, lines)
        one_turn(entry.session, 3)
        if stored == "its own batch":
            await entry.session.flush()
            assert (await store.load("s1")).events == tuple(entry.session.events)
            rows = superuser.execute(
                f"SELECT seq, n FROM {schema}.events WHERE session_id = 's1' AND seq >= %s ORDER BY seq", (first,)
            ).fetchall()
            after = len(entry.session.events)
            assert rows == [
                (first + len(lines) - 1, len(lines)),
                *((seq, 1) for seq in range(first + len(lines), after)),
            ]
        else:
            with pytest.raises(SessionStoreError, match="are not this writer's"):
                await entry.session.flush()
            assert events_stored(superuser, schema, "s1") == first + len(lines)  # nothing more
            with pytest.raises(SessionStoreError, match="closed with events that could not be stored"):
                await sessions.detach(entry)  # never a silent loss
            return
        await sessions.detach(entry)


def back_to_version_3(conn: psycopg.Connection[Any], schema: str) -> None:
    """The tables as a trio-harness of version 3 left them."""
    conn.execute(f"ALTER TABLE {schema}.events DROP COLUMN n")
    conn.execute(f"DELETE FROM {schema}.schema_version WHERE version = 4")


async def test_a_store_on_tables_check_did_not_upgrade_says_to_run_check(
    postgres_cluster: Any, store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    await stored_session(store, "kept")
    back_to_version_3(superuser, schema)
    with pytest.raises(
        SessionStoreError, match=r"(?s)tables are missing, or older than this trio-harness .*run check\(\)"
    ):
        await store.load("kept")


async def test_the_upgrade_to_version_4_by_a_role_not_owning_the_tables_says_who_may_run_it(
    postgres_cluster: Any, store: PostgresStore, superuser: psycopg.Connection[Any], schema: str
) -> None:
    await stored_session(store, "kept")
    back_to_version_3(superuser, schema)
    role = f"user_{schema}"
    postgres_cluster.psql(f"CREATE ROLE {role} LOGIN")
    try:
        postgres_cluster.psql(f"GRANT USAGE, CREATE ON SCHEMA {schema} TO {role}")
        postgres_cluster.psql(f"GRANT SELECT, INSERT, DELETE, UPDATE ON ALL TABLES IN SCHEMA {schema} TO {role}")
        with pytest.raises(SessionStoreError, match=r"(?s)only the owner of their tables may upgrade them .*OWNER TO"):
            await PostgresStore(postgres_cluster.dsn(user=role), schema=schema).check()
        await PostgresStore(postgres_cluster.dsn(), schema=schema).check()  # the owner's upgrade; then the role's
        await PostgresStore(postgres_cluster.dsn(user=role), schema=schema).check()
    finally:
        postgres_cluster.psql(f"DROP OWNED BY {role}; DROP ROLE {role}")


@pytest.mark.parametrize("blocker", ["ends", "stays"])
async def test_the_upgrade_waits_for_a_transaction_using_events_a_bounded_while_each_try(
    postgres_cluster: Any,
    store: PostgresStore,
    superuser: psycopg.Connection[Any],
    schema: str,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    blocker: str,
) -> None:
    """An open transaction that read ``events`` holds the lock ALTER TABLE needs: the upgrade waits for it at
    most ``_ALTER_WAIT`` a try (so the statements queued behind it do not stall longer), then lets them run
    and tries again; a transaction that never ends fails it saying so, and the tables stay at version 3."""
    monkeypatch.setattr(_pg_schema, "_ALTER_WAIT", 0.2)
    monkeypatch.setattr(_pg_schema, "_ALTER_TRIES", 3)
    await stored_session(store, "kept")
    back_to_version_3(superuser, schema)
    with admin(postgres_cluster) as reader:
        reader.execute("BEGIN")
        reader.execute(f"SELECT count(*) FROM {schema}.events").fetchone()
        if blocker == "ends":
            # The first try times out holding its place in the lock queue no longer than 0.2 s; the reader ends
            # in the pause after it (a statement of its own, on the server: no real-time sleep here).
            checker = PostgresStore(postgres_cluster.dsn(), schema=schema)

            async def end_after_a_failed_try() -> None:
                with trio.fail_after(WAIT):  # the worker thread's log line (polled: the upgrade runs on a thread)
                    while "their upgrade waits" not in caplog.text:
                        await trio.sleep(0.005)
                reader.execute("ROLLBACK")

            with caplog.at_level(logging.WARNING, "trio_harness.session.postgres"):
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(end_after_a_failed_try)
                    await checker.check()
            rows = superuser.execute(f"SELECT version FROM {schema}.schema_version ORDER BY version").fetchall()
            assert [v for (v,) in rows] == [1, 2, 3, 4]
            assert (await store.load("kept")).events
        else:
            with (
                trio.fail_after(WAIT),  # an upgrade waiting without bound fails here
                pytest.raises(SessionStoreError, match="in use by transactions that held them throughout 3 tries"),
            ):
                await PostgresStore(postgres_cluster.dsn(), schema=schema).check()
            reader.execute("ROLLBACK")
            rows = superuser.execute(f"SELECT max(version) FROM {schema}.schema_version").fetchall()
            assert rows == [(3,)]
