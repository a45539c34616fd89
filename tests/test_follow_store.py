"""``harness.sessions.follow`` over a JSONL log that is rewritten while it is followed (real files).

(And over PostgreSQL, where a server crash loses a suffix of events committed
without sync and another writer may store others at their seqs.)

A log is rewritten by its writer (a failed append is cut back to the last
synced length and written again; a resume cuts a damaged tail off before its
first append) or replaced by another file (a repair, a session deleted and
created again under its id).  A follower reading by offset must never yield
a partial line, an event twice, or an event that replaced one it yielded:
it reads the rewritten log again from its first line and goes on, or fails
naming the line that changed.
"""

from __future__ import annotations

import os
from pathlib import Path

import attrs
import pytest
from _postgres import Cluster, admin, postgres_cluster, schema, store

from trio_harness import SessionCorruptError
from trio_harness.session import JsonlStore, PostgresStore, SessionHeader, SessionRegistry
from trio_harness.session import _events as ev
from trio_harness.session._events import Event
from trio_harness.session._follow_store import SessionFollower

__all__ = ["postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

TS = 1_700_000_000.0


def fixed_clock() -> float:
    return TS


def turn(number: int, text: str) -> list[Event]:
    return [
        ev.TurnStart(seq=0, ts=TS, turn=number),
        ev.AssistantMessage(seq=0, ts=TS, turn=number, step=1, text=text),
        ev.TurnEnd(seq=0, ts=TS, turn=number, reason="completed"),
    ]


async def write_session(store: JsonlStore, *texts: str) -> Path:
    """A stored session ``s`` with one turn per text (its writer closed); returns the log."""
    writer = await store.open_writer(SessionHeader(id="s", created_at=TS, cwd="/work"))
    seq = 0
    for number, text in enumerate(texts, 1):
        for event in turn(number, text):
            writer.write(attrs.evolve(event, seq=seq))
            seq += 1
    await writer.flush()
    await writer.aclose()
    return store.path_of("s")


def lines_of(path: Path) -> list[bytes]:
    return path.read_bytes().split(b"\n")[:-1]


async def take(follower: SessionFollower, count: int) -> list[Event]:
    """The next ``count`` events; everything is written already, so a few reads find them (no clock)."""
    events: list[Event] = []
    for _ in range(20):
        while follower._ready and len(events) < count:
            events.append(await follower.__anext__())
        if len(events) == count:
            return events
        await follower._read()
    pytest.fail(f"the follower yielded {len(events)} events of {count}: {events!r}")


async def nothing_more(follower: SessionFollower) -> None:
    """Reading the log again finds nothing to yield."""
    for _ in range(3):
        assert not await follower._read()
        assert not follower._ready


def texts(events: list[Event]) -> list[str]:
    return [event.text for event in events if isinstance(event, ev.AssistantMessage)]


async def test_a_log_cut_back_and_written_again_yields_each_event_once(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "one", "two")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    assert texts(await take(follower, 6)) == ["one", "two"]
    whole = path.read_bytes()
    cut = len(b"\n".join(lines_of(path)[:3])) + 1  # the header and turn 1's first two events
    os.truncate(path, cut)  # a rewound append: yielded events are gone for now
    await nothing_more(follower)
    with path.open("ab") as log:  # written again, with one more turn
        log.write(whole[cut:])
    more = await write_more(store, "three")
    assert [event.seq for event in await take(follower, 3)] == [6, 7, 8]
    assert texts(more) == ["three"]
    await nothing_more(follower)


async def write_more(store: JsonlStore, text: str) -> list[Event]:
    """Resume ``s`` and append one turn through the store's writer."""
    registry = SessionRegistry(store, clock=fixed_clock)
    session = await registry.prepare_resume("s")
    entry = registry.enter(session)
    start = len(session)
    for event in turn(0, text):
        fields = {
            name: value for name, value in attrs.asdict(event, recurse=False).items() if name not in ("seq", "ts")
        }
        session.append(type(event), **fields)
    await session.flush()
    await registry.detach(entry)
    return list(session.events[start:])


async def test_a_log_rewritten_in_place_under_a_follower_fails_naming_the_line(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "aaaa", "bbbb")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    assert texts(await take(follower, 6)) == ["aaaa", "bbbb"]
    # Cut back into turn 1 and written again by a resume after a crash: other events of the same
    # length (other times), and more: the file is longer than what the follower read and its offset
    # falls on a line boundary again.
    lines = lines_of(path)
    later = [line.replace(b"%d" % TS, b"%d" % (TS + 9)) for line in lines[2:]]
    rewritten = [*lines[:2], later[0].replace(b"aaaa", b"zzzz"), *later[1:]]
    assert rewritten[-1] != lines[-1] and len(b"".join(rewritten)) == len(b"".join(lines))
    with path.open("r+b") as log:
        log.truncate(len(lines[0]) + 1)
        log.seek(0, os.SEEK_END)
        log.write(b"".join(line + b"\n" for line in rewritten[1:]))
    await write_more(store, "cccc")
    with pytest.raises(SessionCorruptError, match=r"session.jsonl:3: the log of session 's' was rewritten") as info:
        await take(follower, 1)
    assert info.value.line == 3


async def test_a_log_replaced_by_another_file_with_the_same_events_goes_on_from_the_next(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "one", "two")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", start=2, poll_interval=0.01)
    assert [event.seq for event in await take(follower, 4)] == [2, 3, 4, 5]
    temp = path.with_name("repaired.tmp")
    temp.write_bytes(path.read_bytes())
    inode = path.stat().st_ino
    os.replace(temp, path)  # a repair: another inode, the same lines
    assert path.stat().st_ino != inode
    await write_more(store, "three")
    assert [event.seq for event in await take(follower, 3)] == [6, 7, 8]
    await nothing_more(follower)


async def test_a_log_replaced_by_another_session_under_the_id_fails(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "one")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    await take(follower, 3)
    other = JsonlStore(tmp_path / "other", fsync=False)
    writer = await other.open_writer(SessionHeader(id="s", created_at=TS + 1, cwd="/elsewhere"))
    for seq, event in enumerate([*turn(1, "one"), *turn(2, "two")]):
        writer.write(attrs.evolve(event, seq=seq))
    await writer.flush()
    await writer.aclose()
    os.replace(other.path_of("s"), path)  # the session deleted and created again under its id
    with pytest.raises(SessionCorruptError, match=r"session.jsonl:1: .* rewritten .* its header changed"):
        await take(follower, 1)


async def test_a_damaged_tail_is_not_read_past_and_the_resume_that_cuts_it_is_followed(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "one")
    with path.open("ab") as log:  # a whole line that is no event, after the last turn end: dropped by a load
        log.write(b'{"seq": 3, "type": "turn/start", "tu\n')
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    assert [event.seq for event in await take(follower, 3)] == [0, 1, 2]
    await nothing_more(follower)
    await write_more(store, "two")  # the resume cuts the tail off, then appends
    assert texts(await take(follower, 3)) == ["two"]


async def test_a_bad_line_before_a_committed_turn_end_is_corrupt(
    tmp_path: Path,
) -> None:
    store = JsonlStore(tmp_path, fsync=False)
    path = await write_session(store, "one", "two")
    lines = lines_of(path)
    lines[3] = b"not an event"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    assert [event.seq for event in await take(follower, 2)] == [0, 1]
    with pytest.raises(SessionCorruptError, match=r"session.jsonl:4: .*damaged before its last committed turn"):
        await take(follower, 1)


async def pg_session(store: PostgresStore, *texts: str) -> None:
    writer = await store.open_writer(SessionHeader(id="s", created_at=TS, cwd="/work"))
    seq = 0
    for number, text in enumerate(texts, 1):
        for event in turn(number, text):
            writer.write(attrs.evolve(event, seq=seq))
            seq += 1
    await writer.flush()
    await writer.aclose()


async def test_postgres_events_lost_and_stored_again_are_yielded_once(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await pg_session(store, "one", "two")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    assert texts(await take(follower, 6)) == ["one", "two"]
    with admin(postgres_cluster) as conn:  # as a crash loses the last commit (made without sync)
        rows = conn.execute(f"DELETE FROM {schema}.events WHERE session_id = 's' AND seq >= 3 RETURNING seq, body")
        lost = sorted(rows.fetchall())
    await nothing_more(follower)
    with admin(postgres_cluster) as conn:  # its writer stores them again, and more
        for seq, body in lost:
            conn.execute(f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('s', %s, %s)", (seq, body))
    await write_more_pg(store, "three")
    assert texts(await take(follower, 3)) == ["three"]
    await nothing_more(follower)


async def test_postgres_events_stored_again_by_another_writer_fail_the_follower(
    postgres_cluster: Cluster, schema: str, store: PostgresStore
) -> None:
    await pg_session(store, "one", "two")
    follower = SessionRegistry(store, clock=fixed_clock).follow("s", poll_interval=0.01)
    await take(follower, 6)
    with admin(postgres_cluster) as conn:  # lost by a crash, and another writer stored other events there
        conn.execute(f"DELETE FROM {schema}.events WHERE session_id = 's' AND seq >= 3")
    await write_more_pg(store, "other")
    await write_more_pg(store, "more")
    with pytest.raises(SessionCorruptError, match=r"event 5 is not the one this follower yielded"):
        await take(follower, 1)


async def write_more_pg(store: PostgresStore, text: str) -> None:
    registry = SessionRegistry(store, clock=fixed_clock)
    session = await registry.prepare_resume("s")
    entry = registry.enter(session)
    for event in turn(0, text):
        fields = {
            name: value for name, value in attrs.asdict(event, recurse=False).items() if name not in ("seq", "ts")
        }
        session.append(type(event), **fields)
    await session.flush()
    await registry.detach(entry)
