"""Large message images stored by reference (session/_blobs.py): files beside a JSONL log, a PostgreSQL table."""

from __future__ import annotations

import base64
import hashlib
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from _acp_clients import open_server
from _postgres import admin, fresh_schema, postgres_cluster, proxy_for, schema, store
from test_images import PNG, png
from test_postgres_faults import own_cluster, stored_session

from trio_harness import Image, SessionCorruptError, SessionStoreError
from trio_harness.events import MAX_INLINE_IMAGE_BYTES, ImagePart, InboxMessage
from trio_harness.model import ModelRequest, UserMessage
from trio_harness.model._replay import ReplayModel
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import (
    JsonlStore,
    MemoryStore,
    PostgresStore,
    SessionHeader,
    SessionRegistry,
    encode_event,
    encode_header,
)
from trio_harness.session import _events as ev
from trio_harness.testing import open_test_harness

__all__ = ["own_cluster", "postgres_cluster", "schema", "store"]  # the fixtures, imported for pytest

BIG = Image(png(300, 300, seed=1), "image/png")  # a real PNG of ~270 KB of noise
BIG_SHA = hashlib.sha256(BIG.data).hexdigest()
BIG64 = base64.b64encode(BIG.data).decode()
assert len(BIG.data) > MAX_INLINE_IMAGE_BYTES >= len(PNG.data)


def images_of(request: ModelRequest) -> list[tuple[Image, ...]]:
    return [m.images for m in request.messages if isinstance(m, UserMessage)]


async def straight_request() -> ModelRequest:
    """The second request of a session that never restarted (in memory): what a resume must rebuild."""
    model = ScriptedModel([{"text": "seen"}, {"text": "again"}])
    async with open_test_harness(model) as h, h.agents.open(session_id="s") as agent:
        agent.followup(["look", BIG, "and", PNG])
        await agent.when_idle()
        agent.followup("more")
        await agent.when_idle()
    return model.requests[-1]


async def write_then_resume(where: Any) -> ModelRequest:
    async with (
        open_test_harness(ScriptedModel([{"text": "seen"}]), store=where) as h,
        h.agents.open(session_id="s") as agent,
    ):
        agent.followup(["look", BIG, "and", PNG])
        await agent.when_idle()
        agent.inject(["pending", BIG])  # a pending message's large image: an inbox/spliced line
    second = ScriptedModel([{"text": "again"}])
    async with open_test_harness(second, store=where) as h:
        handle = await h.agents.resume("s")
        (pending,) = handle.agent.inbox.next_step
        assert pending.images == (ImagePart.of(BIG),)  # read back inline, as it was sent
        handle.agent.inbox.clear()
        handle.agent.followup("more")
        await handle.agent.when_idle()
        await handle.dispose()
    return second.requests[0]


# ---------------------------------------------------------------- JSONL


async def test_a_large_image_is_a_blob_file_and_a_resume_rebuilds_the_same_request(tmp_path: Path) -> None:
    expected = await straight_request()
    assert await write_then_resume(tmp_path) == expected
    assert images_of(expected)[0] == (BIG, PNG)
    directory = tmp_path / "s"
    assert sorted(os.listdir(directory / "blobs")) == [BIG_SHA]  # once, though two messages hold it
    assert (directory / "blobs" / BIG_SHA).read_bytes() == BIG.data
    assert oct((directory / "blobs" / BIG_SHA).stat().st_mode & 0o777) == "0o600"
    log = (directory / "session.jsonl").read_text()
    assert BIG64 not in log and base64.b64encode(PNG.data).decode() in log  # the small one stays inline
    assert len(log) < 20_000
    lines = [json.loads(line) for line in log.splitlines()]
    (user,) = [line for line in lines if line.get("type") == "user/message" and line.get("images")]
    assert user["images"][0] == {"media_type": "image/png", "sha256": BIG_SHA, "size": len(BIG.data)}


async def test_a_read_only_load_keeps_references(tmp_path: Path) -> None:
    await write_then_resume(tmp_path)
    loaded = await JsonlStore(tmp_path).load("s")
    user = next(e for e in loaded.events if isinstance(e, ev.UserMessage) and e.images)
    big, small = user.images
    assert big.by_reference and big.data == "" and not small.by_reference
    with pytest.raises(ValueError, match=f"image {BIG_SHA} is stored by reference and was not read back"):
        big.image()
    assert await JsonlStore(tmp_path).read_blob("s", BIG_SHA) == BIG.data


async def test_an_old_log_with_a_large_image_inline_reads_the_same(tmp_path: Path) -> None:
    """Logs written before blobs hold every image inline; they resume unchanged."""
    expected = await straight_request()
    model = ScriptedModel([{"text": "seen"}])
    async with open_test_harness(model) as h, h.agents.open(session_id="s") as agent:
        agent.followup(["look", BIG, "and", PNG])
        await agent.when_idle()
        header, events = agent.session.header, list(agent.session.events)
    (tmp_path / "s").mkdir(mode=0o700)
    lines = [encode_header(header), *map(encode_event, events)]  # the codec alone writes images inline
    (tmp_path / "s" / "session.jsonl").write_text("\n".join(lines) + "\n")
    assert BIG64 in (tmp_path / "s" / "session.jsonl").read_text()
    second = ScriptedModel([{"text": "again"}])
    async with open_test_harness(second, store=tmp_path) as h:
        handle = await h.agents.resume("s")
        handle.agent.followup("more")
        await handle.agent.when_idle()
        await handle.dispose()
    assert second.requests[0] == expected
    assert not (tmp_path / "s" / "blobs").exists()


async def test_a_tampered_blob_is_a_load_error_naming_it(tmp_path: Path) -> None:
    await write_then_resume(tmp_path)
    blob = tmp_path / "s" / "blobs" / BIG_SHA
    data = bytearray(blob.read_bytes())
    data[1000] ^= 1
    blob.write_bytes(bytes(data))
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        with pytest.raises(SessionCorruptError, match=f"blobs/{BIG_SHA}: the image blob {BIG_SHA} holds .* changed"):
            await h.agents.resume("s")
    blob.unlink()
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        with pytest.raises(SessionCorruptError, match="the image blob referenced by session 's' is missing"):
            await h.agents.resume("s")


async def test_a_reference_that_is_no_hash_is_refused(tmp_path: Path) -> None:
    await write_then_resume(tmp_path)
    log = tmp_path / "s" / "session.jsonl"
    log.write_text(log.read_text().replace(BIG_SHA, "../../../etc/passwd"))
    async with open_test_harness(ScriptedModel([]), store=tmp_path) as h:
        with pytest.raises(
            SessionCorruptError, match=re.escape("references an image blob named '../../../etc/passwd'")
        ):
            await h.agents.resume("s")


async def test_a_symlink_planted_at_a_blob_is_never_followed(tmp_path: Path) -> None:
    store, outside = tmp_path / "store", tmp_path / "outside"
    outside.mkdir()
    await write_then_resume(store)
    # Reading: a link to a file with the right bytes outside the store is refused, not read.
    (outside / "copy").write_bytes(BIG.data)
    blob = store / "s" / "blobs" / BIG_SHA
    blob.unlink()
    blob.symlink_to(outside / "copy")
    async with open_test_harness(ScriptedModel([]), store=store) as h:
        with pytest.raises(SessionStoreError, match="refusing to follow a symbolic link"):
            await h.agents.resume("s")
    # Writing: a link planted where a new blob goes is replaced; its target is not written.
    other = Image(png(300, 300, seed=2), "image/png")
    other_sha = hashlib.sha256(other.data).hexdigest()
    (outside / "victim").write_bytes(b"keep me")
    blob.unlink()
    blob.write_bytes(BIG.data)
    (store / "s" / "blobs" / other_sha).symlink_to(outside / "victim")
    async with open_test_harness(ScriptedModel([{"text": "ok"}]), store=store) as h:
        handle = await h.agents.resume("s")
        handle.agent.inbox.clear()
        handle.agent.followup(["another", other])
        await handle.agent.when_idle()
        await handle.dispose()
    assert (outside / "victim").read_bytes() == b"keep me"
    assert not (store / "s" / "blobs" / other_sha).is_symlink()
    assert (store / "s" / "blobs" / other_sha).read_bytes() == other.data
    # A link planted as the blobs directory: nothing is written through it, the flush fails naming it.
    with pytest.raises(SessionStoreError, match="refusing to store image blobs through it"):
        await write_through_a_planted_blobs_link(store, outside)
    assert sorted(os.listdir(outside)) == ["copy", "victim"]


async def write_through_a_planted_blobs_link(store: Path, outside: Path) -> None:
    async with (
        open_test_harness(ScriptedModel([{"text": "ok"}]), store=store) as h,
        h.agents.open(session_id="t") as agent,
    ):
        agent.followup("hello")
        await agent.when_idle()
        (store / "t" / "blobs").symlink_to(outside)
        agent.followup(["big", BIG])
        await agent.when_idle()
        end = agent.session.events[-1]
        assert isinstance(end, ev.TurnEnd) and end.reason == "error"  # its end could not be stored


KILLED_CHILD = r"""
import os, sys, hashlib
import trio
sys.path.insert(0, sys.argv[2])
from test_image_blobs import BIG, BIG_SHA
from trio_harness.model._replay import ReplayModel
from trio_harness.model._scripted import ScriptedModel
from trio_harness.session import _jsonl_files
from trio_harness.testing import open_test_harness

store = sys.argv[1]
real = _jsonl_files._write_all

def write_all(fd, data):
    if BIG_SHA.encode() in data:  # the line referencing the blob: the process dies before writing it
        path = os.path.join(store, "s", "blobs", BIG_SHA)
        with open(path, "rb") as f:
            ok = hashlib.sha256(f.read()).hexdigest() == BIG_SHA
        os._exit(9 if ok else 8)
    real(fd, data)

_jsonl_files._write_all = write_all

async def main():
    async with open_test_harness(ScriptedModel([{"text": "first"}, {"text": "never"}]), store=store) as h:
        async with h.agents.open(session_id="s") as agent:
            agent.followup("hello")
            await agent.when_idle()
            agent.followup(["look", BIG])
            await agent.when_idle()

trio.run(main)
"""


async def test_a_kill_between_the_blob_and_its_event_leaves_a_harmless_blob(tmp_path: Path) -> None:
    tests = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parent.parent), tests])}
    done = subprocess.run([sys.executable, "-c", KILLED_CHILD, str(tmp_path), tests], env=env, timeout=60)
    assert done.returncode == 9  # killed with the blob complete and durable, its line unwritten
    assert (tmp_path / "s" / "blobs" / BIG_SHA).exists()
    model = ScriptedModel([{"text": "resumed"}])
    async with open_test_harness(model, store=tmp_path) as h:
        handle = await h.agents.resume("s")  # the unreferenced blob is no error
        handle.agent.inbox.clear()
        handle.agent.followup(["look", BIG])  # the same image again: the blob is kept, the line written
        await handle.agent.when_idle()
        await handle.dispose()
    assert images_of(model.requests[0]) == [(), (BIG,)]
    assert os.listdir(tmp_path / "s" / "blobs") == [BIG_SHA]


async def test_a_fork_of_a_stored_session_gets_its_own_blobs(tmp_path: Path) -> None:
    await write_then_resume(tmp_path)
    async with open_test_harness(ScriptedModel([{"text": "forked"}]), store=tmp_path) as h:
        loaded = await JsonlStore(tmp_path).load("s")
        boundary = next(i + 1 for i, e in enumerate(loaded.events) if isinstance(e, ev.TurnEnd))
        await h.sessions.fork("s", boundary, "child")
    assert os.listdir(tmp_path / "child" / "blobs") == [BIG_SHA]
    model = ScriptedModel([{"text": "child"}])
    async with open_test_harness(model, store=tmp_path) as h:
        handle = await h.agents.resume("child")
        handle.agent.followup("more")
        await handle.agent.when_idle()
        await handle.dispose()
    assert images_of(model.requests[0])[0] == (BIG, PNG)


async def test_the_memory_store_keeps_images_inline() -> None:
    memory = MemoryStore()
    expected = await straight_request()
    assert await write_then_resume(memory) == expected
    loaded = await memory.load("s")
    user = next(e for e in loaded.events if isinstance(e, ev.UserMessage) and e.images)
    assert user.images[0] == ImagePart.of(BIG)


async def test_acp_load_replays_a_large_image(tmp_path: Path) -> None:
    store = tmp_path / "store"
    blocks: list[dict[str, Any]] = [
        {"type": "text", "text": "a screenshot"},
        {"type": "image", "data": BIG64, "mimeType": "image/png"},
    ]
    async with open_server(tmp_path, [{"text": "seen"}], store=store) as client:
        await client.initialize()
        session_id = await client.new_session(tmp_path)
        result = await client.call("session/prompt", {"sessionId": session_id, "prompt": blocks})
        assert result == {"stopReason": "end_turn"}
    directory = next(p for p in store.iterdir() if p.is_dir())
    assert os.listdir(directory / "blobs") == [BIG_SHA]
    assert BIG64 not in (directory / "session.jsonl").read_text()
    async with open_server(tmp_path, [], store=store, name="replay") as client:
        await client.initialize()
        await client.call("session/load", {"sessionId": session_id, "cwd": str(tmp_path), "mcpServers": []})
        replayed = [u for u in client.updates(session_id) if u["sessionUpdate"] == "user_message_chunk"]
    assert [u["content"]["type"] for u in replayed] == ["text", "image"]
    assert replayed[1]["content"] == {"type": "image", "data": BIG64, "mimeType": "image/png"}


# ---------------------------------------------------------------- PostgreSQL


async def test_postgres_stores_a_large_image_as_a_row_and_resumes_the_same_request(
    store: PostgresStore, postgres_cluster: Any, schema: str
) -> None:
    expected = await straight_request()
    assert await write_then_resume(store) == expected
    rows = postgres_cluster.psql(f"SELECT sha256, length(data) FROM {schema}.blobs WHERE session_id = 's'")
    assert rows.split() == [f"{BIG_SHA}|{len(BIG.data)}"]
    bodies = postgres_cluster.psql(f"SELECT body FROM {schema}.events WHERE session_id = 's'")
    assert BIG64 not in bodies and BIG_SHA in bodies
    assert await store.read_blob("s", BIG_SHA) == BIG.data
    # Tampered: a clear load error.
    postgres_cluster.psql(f"UPDATE {schema}.blobs SET data = 'x'::bytea WHERE session_id = 's'")
    async with open_test_harness(ScriptedModel([]), store=store) as h:
        with pytest.raises(SessionCorruptError, match=f"the image blob {BIG_SHA} holds 1 bytes .* changed"):
            await h.agents.resume("s")
    # Deleted with the session.
    postgres_cluster.psql(f"DELETE FROM {schema}.sessions WHERE id = 's'")
    assert postgres_cluster.psql(f"SELECT count(*) FROM {schema}.blobs").split() == ["0"]


async def test_postgres_fork_copies_the_blobs(store: PostgresStore) -> None:
    await write_then_resume(store)
    async with open_test_harness(ScriptedModel([{"text": "child"}]), store=store) as h:
        loaded = await store.load("s")
        boundary = next(i + 1 for i, e in enumerate(loaded.events) if isinstance(e, ev.TurnEnd))
        await h.sessions.fork("s", boundary, "child")
        handle = await h.agents.resume("child")
        handle.agent.followup("more")
        await handle.agent.when_idle()
        await handle.dispose()
    assert await store.read_blob("child", BIG_SHA) == BIG.data


async def test_a_version_1_schema_is_upgraded_keeping_its_sessions(postgres_cluster: Any, schema: str) -> None:
    first = PostgresStore(postgres_cluster.dsn(), schema=schema)
    async with first:
        await first.check()
        await write_then_resume(first)
    # Back to version 1, as an older trio-harness left it (its sessions hold images inline).
    postgres_cluster.psql(
        f"DROP TABLE {schema}.blobs, {schema}.leases; ALTER TABLE {schema}.events DROP COLUMN n; "
        f"DELETE FROM {schema}.schema_version WHERE version >= 2"
    )
    postgres_cluster.psql(f"DELETE FROM {schema}.sessions")
    postgres_cluster.psql(f"DELETE FROM {schema}.events")
    async with (
        open_test_harness(ScriptedModel([{"text": "old"}]), store=MemoryStore()) as h,
        h.agents.open(session_id="old") as agent,
    ):
        agent.followup(["look", BIG])
        await agent.when_idle()
        header, events = agent.session.header, list(agent.session.events)
    with admin(postgres_cluster) as conn:  # the codec alone writes images inline, as version 1 did
        conn.execute(
            f"INSERT INTO {schema}.sessions (id, header, created_at) VALUES ('old', %s, 0)", (encode_header(header),)
        )
        for event in events:
            conn.execute(
                f"INSERT INTO {schema}.events (session_id, seq, body) VALUES ('old', %s, %s)",
                (event.seq, encode_event(event)),
            )
    second = PostgresStore(postgres_cluster.dsn(), schema=schema)
    async with second:
        await second.check()
        rows = postgres_cluster.psql(f"SELECT version FROM {schema}.schema_version ORDER BY version")
        assert rows.split() == ["1", "2", "3", "4"]
        model = ScriptedModel([{"text": "again"}])
        async with open_test_harness(model, store=second) as h:
            handle = await h.agents.resume("old")  # inline images read as before
            handle.agent.followup(["and", BIG])  # a new one goes to the new table
            await handle.agent.when_idle()
            await handle.dispose()
        assert images_of(model.requests[0]) == [(BIG,), (BIG,)]
        assert await second.read_blob("old", BIG_SHA) == BIG.data


async def test_postgres_stores_a_blob_in_the_transaction_of_its_event(
    store: PostgresStore, postgres_cluster: Any, schema: str
) -> None:
    """An events insert that fails (a trigger refuses the referencing line) leaves no blob row behind."""
    with admin(postgres_cluster) as conn:
        conn.execute(
            f"CREATE FUNCTION {schema}.refuse() RETURNS trigger LANGUAGE plpgsql AS "
            "$$ BEGIN RAISE EXCEPTION 'refused by the test'; END $$"
        )
        conn.execute(
            f"CREATE TRIGGER refuse BEFORE INSERT ON {schema}.events FOR EACH ROW "
            f"WHEN (NEW.body LIKE '%{BIG_SHA}%') EXECUTE FUNCTION {schema}.refuse()"
        )
    with pytest.raises(SessionStoreError, match="refused by the test"):
        await store_a_large_image_in(store)
    assert postgres_cluster.psql(f"SELECT count(*) FROM {schema}.blobs").split() == ["0"]
    assert postgres_cluster.psql(f"SELECT count(*) FROM {schema}.events WHERE session_id = 'p'").split() != ["0"]


async def test_a_strict_replay_of_a_log_with_a_reference_compares_by_hash(tmp_path: Path) -> None:
    async with (
        open_test_harness(ScriptedModel([{"text": "seen"}]), store=tmp_path) as h,
        h.agents.open(session_id="rec") as agent,
    ):
        agent.followup(["look", BIG])
        await agent.when_idle()
    for image, reason in ((BIG, "completed"), (Image(png(300, 300, seed=3), "image/png"), "error")):
        replay = ReplayModel.from_file(tmp_path / "rec" / "session.jsonl", strict=True)
        async with open_test_harness(replay) as h, h.agents.open() as agent:
            agent.followup(["look", image])
            await agent.when_idle()
            end = agent.session.events[-1]
            assert isinstance(end, ev.TurnEnd) and end.reason == reason


async def test_a_blob_and_its_directory_entry_are_synced_before_the_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from trio_harness.session import _jsonl_files

    order: list[str] = []
    real_fsync, real_write = os.fsync, _jsonl_files._write_all

    def fsync(fd: int) -> None:
        order.append("fsync " + os.path.relpath(os.readlink(f"/proc/self/fd/{fd}"), tmp_path))
        real_fsync(fd)

    def write_all(fd: int, data: bytes) -> None:
        if BIG_SHA.encode() in data:
            order.append("line")
        real_write(fd, data)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(_jsonl_files, "_write_all", write_all)
    await store_a_large_image_in(tmp_path)
    temp = os.path.join("p", "blobs", f".{BIG_SHA}.")  # synced under its temporary name, then renamed
    (synced_blob,) = [i for i, step in enumerate(order) if step.startswith(f"fsync {temp}")]
    assert synced_blob < order.index(f"fsync {os.path.join('p', 'blobs')}") < order.index("line")


async def store_a_large_image_in(where: Any) -> None:
    async with (
        open_test_harness(ScriptedModel([{"text": "ok"}, {"text": "ok"}]), store=where) as h,
        h.agents.open(session_id="p") as agent,
    ):
        agent.followup("hello")
        await agent.when_idle()
        agent.followup(["big", BIG])
        await agent.when_idle()


async def test_a_failed_create_leaves_no_blobs_and_a_first_flush_stores_them(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_link = os.link

    def link(*args: Any, **kwargs: Any) -> None:
        raise OSError(5, "Input/output error (test)")

    monkeypatch.setattr(os, "link", link)
    with pytest.raises(SessionStoreError, match="Input/output error"):
        await first_message_with_a_large_image(tmp_path)
    assert not (tmp_path / "n").exists()  # no directory left holding a blob
    monkeypatch.setattr(os, "link", real_link)
    await first_message_with_a_large_image(tmp_path)
    assert os.listdir(tmp_path / "n" / "blobs") == [BIG_SHA]
    loaded = await JsonlStore(tmp_path).load("n")
    assert any(
        isinstance(e, ev.InboxSpliced) and e.inserted and e.inserted[0].images[0].by_reference for e in loaded.events
    )


async def first_message_with_a_large_image(where: Path) -> None:
    async with open_test_harness(ScriptedModel([{"text": "ok"}]), store=where) as h:
        agent = await h.agents.create(session_id="n")
        agent.agent.followup(["big", BIG])  # in the first flush, with the header
        await agent.agent.when_idle()
        await agent.dispose()


async def test_a_damaged_file_at_a_new_blobs_path_is_replaced(tmp_path: Path) -> None:
    (tmp_path / "p" / "blobs").mkdir(parents=True, mode=0o700)
    (tmp_path / "p" / "blobs" / BIG_SHA).write_bytes(bytes(len(BIG.data)))  # right size, wrong bytes
    await store_a_large_image_in(tmp_path)
    assert (tmp_path / "p" / "blobs" / BIG_SHA).read_bytes() == BIG.data


async def test_sessions_show_names_the_size_of_an_image_stored_by_reference(tmp_path: Path) -> None:
    from trio_harness._cli_sessions import transcript

    await write_then_resume(tmp_path)
    loaded = await JsonlStore(tmp_path).load("s")
    lines = transcript(loaded.header, loaded.events)
    assert f"  [image] image/png, {len(BIG.data)} bytes" in lines
    assert f"  [image] image/png, {len(PNG.data)} bytes" in lines


def spliced_with(image: Image) -> dict[str, Any]:
    return {"queue": "next-turn", "start": 0, "inserted": (InboxMessage("big", "look", images=(ImagePart.of(image),)),)}


async def test_postgres_a_blob_flushed_without_sync_survives_a_server_crash(own_cluster: Any) -> None:
    """The commit carrying a blob is synchronous: a crash right after it loses neither the blob nor its line."""
    persistence = PostgresStore(own_cluster.dsn(), schema=fresh_schema())
    await persistence.check()
    async with persistence:
        await stored_session(persistence, "s1")
        sessions = SessionRegistry(persistence)
        entry = sessions.enter(await sessions.prepare_resume("s1"))
        entry.session.append(ev.InboxSpliced, **spliced_with(BIG))
        await entry.session.flush(sync=False)
        await trio.to_thread.run_sync(own_cluster.restart, "immediate")  # unsynced commits are lost
        stored = (await persistence.load("s1")).events
        assert len(stored) == len(entry.session)
        last = stored[-1]
        assert isinstance(last, ev.InboxSpliced) and last.inserted[0].images[0].by_reference
        assert await persistence.read_blob("s1", BIG_SHA) == BIG.data
        await sessions.detach(entry)


async def test_postgres_a_connection_lost_while_storing_a_blob_stores_it_on_the_next(
    postgres_cluster: Any, schema: str, store: PostgresStore
) -> None:
    await stored_session(store, "s1")
    with proxy_for(postgres_cluster) as proxy:
        proxied = PostgresStore(proxy.dsn(), schema=schema)
        async with proxied:
            sessions = SessionRegistry(proxied)
            entry = sessions.enter(await sessions.prepare_resume("s1"))
            entry.session.append(ev.InboxSpliced, **spliced_with(BIG))
            dropped = proxy.drop_after(b".blobs (session_id, sha256, data)")
            await entry.session.flush()
            assert dropped.is_set()
            await sessions.detach(entry)
    stored = (await store.load("s1")).events
    assert len(stored) == len(entry.session)
    assert await store.read_blob("s1", BIG_SHA) == BIG.data


async def test_saving_events_that_hold_references_is_refused(tmp_path: Path) -> None:
    """A read-only load's references name blobs of its own session: storing them elsewhere would dangle."""
    await write_then_resume(tmp_path)
    store = JsonlStore(tmp_path)
    loaded = await store.load("s")
    header = SessionHeader(id="copy", created_at=0.0, cwd="/work")
    with pytest.raises(ValueError, match="cannot store events that hold images by reference"):
        await store.save(header, loaded.events)
    assert not (tmp_path / "copy").exists()
