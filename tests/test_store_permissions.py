"""The JSONL store's root is private: created 0700 whatever the umask; a root others can write is refused."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import trio
from _util import WAIT

from trio_harness import ScriptedModel, SessionStoreError, open_harness


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def umask_000() -> Iterator[None]:
    previous = os.umask(0)
    try:
        yield
    finally:
        os.umask(previous)


async def run_one_turn(store: Path) -> None:
    async with open_harness(model=ScriptedModel([{"text": "hi"}]), store=store, builtin_tools=False) as h:
        async with h.agents.open() as agent:
            agent.followup("hello")
            with trio.fail_after(WAIT):
                await agent.when_idle()


async def test_the_root_and_the_parents_it_needs_are_created_0700_under_umask_000(
    tmp_path: Path, umask_000: None
) -> None:
    store = tmp_path / "made" / "by" / "harness" / "store"
    await run_one_turn(store)
    logs = list(store.glob("*/session.jsonl"))
    assert len(logs) == 1
    for directory in (store, store.parent, store.parent.parent, store.parent.parent.parent):
        assert mode(directory) == 0o700, directory
    assert mode(logs[0].parent) == 0o700 and mode(logs[0]) == 0o600


async def test_the_root_is_created_usable_under_a_narrow_umask(tmp_path: Path) -> None:
    previous = os.umask(0o277)  # would make a 0700 directory 0500: the harness could not write its own store
    try:
        await run_one_turn(tmp_path / "narrow")
    finally:
        os.umask(previous)
    assert mode(tmp_path / "narrow") == 0o700
    (log,) = (tmp_path / "narrow").glob("*/session.jsonl")
    assert mode(log.parent) == 0o700 and mode(log) == 0o600  # so a later resume can append


@pytest.mark.parametrize(("bits", "who"), [(0o777, "everyone"), (0o1777, "everyone"), (0o770, "its group")])
async def test_an_existing_root_others_can_write_is_refused(tmp_path: Path, bits: int, who: str) -> None:
    store = tmp_path / "shared"
    store.mkdir()
    os.chmod(store, bits)
    with pytest.raises(SessionStoreError) as info:
        async with open_harness(store=store):
            pass
    message = str(info.value)
    assert f"the session store {store} is writable by {who} (mode {stat.S_IMODE(bits):04o})" in message
    assert f"chmod go-w {store}" in message
    assert info.value.path == str(store)
    os.chmod(store, 0o755)  # readable by others is fine: only writing lets a session be forged
    async with open_harness(store=store):
        pass


@pytest.mark.skipif(os.geteuid() != 0, reason="changing a directory's owner needs root")
async def test_a_root_owned_by_another_user_is_refused(tmp_path: Path) -> None:
    store = tmp_path / "theirs"
    store.mkdir(mode=0o700)
    os.chown(store, 65534, 65534)  # nobody
    with pytest.raises(SessionStoreError, match=r"belongs to another user \(uid 65534\)"):
        async with open_harness(store=store):
            pass


async def test_the_cli_refuses_a_world_writable_store(tmp_path: Path) -> None:
    store = tmp_path / "shared"
    store.mkdir()
    os.chmod(store, 0o777)
    env = {k: v for k, v in os.environ.items() if not k.endswith("_API_KEY") and k != "TRIO_HARNESS_MODEL"}
    script = tmp_path / "script.json"
    script.write_text('{"responses": [{"text": "never"}]}', encoding="utf-8")
    for args in (
        ["run", "--model", f"scripted:{script}", "--store", str(store), "hi"],
        ["sessions", "list", "--store", str(store)],
    ):
        with trio.fail_after(WAIT):
            result = await trio.run_process(
                [sys.executable, "-m", "trio_harness", *args],
                cwd=tmp_path,
                env=env,
                stdin=subprocess.DEVNULL,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
        err = result.stderr.decode()
        assert result.returncode != 0, (args, err)
        assert f"the session store {store} is writable by everyone (mode 0777)" in err, (args, err)
    assert list(store.iterdir()) == []  # nothing was written into it
