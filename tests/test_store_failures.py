"""A store that refuses a session's events is never silent (docs/guarantees.rst, "No silent loss").

The failure reaches every caller: the turn ends in ``error`` naming the store
problem, ``when_idle()`` and ``dispose()`` raise, the harness exit raises, the
CLI exits non-zero and ACP answers the prompt with an error.  The events stay
in the in-memory session, so a later flush stores them once the store is back.

The store is broken for real: its root directory is replaced by a regular file
(by the test, or by a ``bash`` tool call in the middle of a turn).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import pytest
import trio
from _util import WAIT, turn_end_events

from trio_harness import JsonlStore, ScriptedModel, Session, SessionStoreError, open_harness
from trio_harness.session import _events as ev
from trio_harness.session._events import Event, SessionHeader
from trio_harness.session._persistence import LoadedSession, MemoryStore
from trio_harness.session._session import SessionWriter
from trio_harness.testing import assert_balanced


def break_store(root: Path) -> None:
    """Replace the store's root directory by a regular file."""
    if root.is_dir():
        shutil.rmtree(root)
    root.write_text("not a directory\n")


def mend_store(root: Path) -> None:
    root.unlink()
    root.mkdir()


def store_failure_of(session: Session) -> SessionStoreError | None:
    return session.store_failure


async def test_a_refused_turn_ends_in_error_and_a_later_flush_stores_it(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with open_harness(model=ScriptedModel([{"text": "hello"}]), store=root, builtin_tools=False) as harness:
        handle = await harness.agents.create(session_id="s1")
        agent = handle.agent
        break_store(root)
        agent.followup("hi")
        with pytest.raises(SessionStoreError, match="'s1'") as caught:
            await agent.when_idle()
        assert caught.value.session_id == "s1"
        (end,) = turn_end_events(agent.session.events)
        assert end.reason == "error"
        assert end.failure is not None
        assert end.failure.code == "store-error"
        assert "could not be stored" in end.failure.message
        assert store_failure_of(agent.session) is not None
        kept = list(agent.session.events)  # nothing was dropped from memory

        mend_store(root)
        await agent.when_idle()  # retries the flush, which now succeeds
        assert store_failure_of(agent.session) is None
        loaded = await JsonlStore(root).load("s1")
        assert list(loaded.events) == kept
        assert_balanced(loaded.events)
        await handle.dispose()


async def test_dispose_raises_on_every_call_and_the_harness_exit_does_not_repeat_it(tmp_path: Path) -> None:
    root = tmp_path / "store"
    async with open_harness(model=ScriptedModel([{"text": "hello"}]), store=root, builtin_tools=False) as harness:
        handle = await harness.agents.create(session_id="s1")
        break_store(root)
        handle.agent.followup("hi")
        with pytest.raises(SessionStoreError):
            await handle.agent.when_idle()
        with pytest.raises(SessionStoreError, match="closed with events that could not be stored"):
            await handle.dispose()
        assert handle.disposed  # teardown itself completed
        assert harness.agents.get("s1") is None
        assert harness.sessions.get("s1") is None
        with pytest.raises(SessionStoreError):
            await handle.dispose()
    # The exit did not raise: dispose() already reported it.


async def _run_unreported(root: Path) -> None:
    async with open_harness(model=ScriptedModel([{"text": "hello"}]), store=root, builtin_tools=False) as harness:
        handle = await harness.agents.create(session_id="s1")
        break_store(root)
        ended = trio.Event()
        handle.agent.session.observe(lambda event: ended.set() if isinstance(event, ev.TurnEnd) else None)
        handle.agent.followup("hi")
        await ended.wait()  # nobody calls when_idle() or dispose()


async def test_the_harness_exit_raises_what_nobody_reported(tmp_path: Path) -> None:
    with pytest.raises(SessionStoreError, match="'s1'"):
        await _run_unreported(tmp_path / "store")


async def _run_two_unstored(root: Path) -> None:
    model = ScriptedModel([{"text": "a"}, {"text": "b"}])
    async with open_harness(model=model, store=root, builtin_tools=False) as harness:
        first = await harness.agents.create(session_id="one")
        second = await harness.agents.create(session_id="two")
        break_store(root)
        for handle in (first, second):
            handle.agent.followup("hi")
            with pytest.raises(SessionStoreError):
                await handle.agent.when_idle()


async def test_two_unstored_sessions_are_named_in_one_error(tmp_path: Path) -> None:
    with pytest.raises(SessionStoreError, match="2 sessions") as caught:
        await _run_two_unstored(tmp_path / "store")
    assert "'one'" in str(caught.value)
    assert "'two'" in str(caught.value)


async def _fail_in_block(root: Path) -> None:
    async with open_harness(model=ScriptedModel([{"text": "hello"}]), store=root, builtin_tools=False) as harness:
        handle = await harness.agents.create(session_id="s1")
        break_store(root)
        handle.agent.followup("hi")
        with pytest.raises(SessionStoreError):
            await handle.agent.when_idle()
        raise KeyError("mine")


async def test_the_blocks_own_error_wins_and_names_the_unstored_session(tmp_path: Path) -> None:
    with pytest.raises(KeyError, match="mine") as caught:
        await _fail_in_block(tmp_path / "store")
    notes = getattr(caught.value, "__notes__", [])
    assert any("'s1'" in note and "could not be stored" in note for note in notes)


# A disk whose fsync fails cannot be made on demand; this writer stands for it:
# it takes writes (flush(sync=False)) and fails to make them durable.


@attrs.define(eq=False)
class _SyncFailingWriter:
    inner: SessionWriter
    failing: list[bool]

    def write(self, event: Event) -> None:
        self.inner.write(event)

    async def flush(self, *, sync: bool = True) -> None:
        if sync and self.failing[0]:
            raise OSError(5, "Input/output error")
        await self.inner.flush(sync=sync)

    async def aclose(self) -> None:
        await self.inner.aclose()


@attrs.define(eq=False)
class _SyncFailingStore:
    inner: MemoryStore = attrs.field(factory=MemoryStore)
    failing: list[bool] = attrs.field(factory=lambda: [True])

    async def exists(self, session_id: str) -> bool:
        return await self.inner.exists(session_id)

    async def list(self) -> list[SessionHeader]:
        return await self.inner.list()

    async def load(self, session_id: str) -> LoadedSession:
        return await self.inner.load(session_id)

    async def open_writer(self, header: SessionHeader) -> SessionWriter:
        return _SyncFailingWriter(await self.inner.open_writer(header), self.failing)

    async def resume(self, session_id: str) -> tuple[LoadedSession, SessionWriter]:
        loaded, writer = await self.inner.resume(session_id)
        return loaded, _SyncFailingWriter(writer, self.failing)

    async def save(self, header: SessionHeader, events: Sequence[Event]) -> None:
        await self.inner.save(header, events)

    async def check(self) -> None:
        return None


async def test_a_failed_durable_flush_after_the_turn_end_is_still_reported() -> None:
    store = _SyncFailingStore()
    async with open_harness(model=ScriptedModel([{"text": "hello"}]), store=store, builtin_tools=False) as harness:
        handle = await harness.agents.create(session_id="s1")
        handle.agent.followup("hi")
        with pytest.raises(SessionStoreError, match="Input/output error"):
            await handle.agent.when_idle()
        store.failing[0] = False
        await handle.agent.when_idle()
        await handle.dispose()


# ---------------------------------------------------------------- CLI and ACP


def _breaking_script(tmp_path: Path, store: Path) -> Path:
    """A model that has bash replace the store by a file, then answers."""
    command = f"rm -rf '{store}' && echo broken > '{store}'"
    responses: list[dict[str, Any]] = [
        {"tool_calls": [{"name": "bash", "arguments": {"command": command}}]},
        {"text": "done"},
    ]
    path = tmp_path / "script.json"
    path.write_text(json.dumps({"responses": responses}), encoding="utf-8")
    return path


async def test_cli_run_exits_non_zero_with_one_line_when_the_turn_cannot_be_stored(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = _breaking_script(tmp_path, store)
    with trio.fail_after(WAIT):
        result = await trio.run_process(
            [
                sys.executable,
                "-m",
                "trio_harness",
                "run",
                "go",
                "--yes",
                "--model",
                f"scripted:{script}",
                "--store",
                store,
            ],
            cwd=tmp_path,
            capture_stdout=True,
            capture_stderr=True,
            check=False,
        )
    err = result.stderr.decode()
    assert result.returncode == 1, err
    assert "Traceback" not in err
    errors = [line for line in err.splitlines() if line.startswith("trio-harness: error:")]
    assert len(errors) == 1, err
    # The log is created at the turn's first checkpoint and removed by the tool: the next checkpoint finds it gone.
    assert "could not be stored" in errors[0] or "the log file was removed from the store" in errors[0]
    assert "(store-error)" in errors[0]


async def test_acp_answers_a_prompt_whose_turn_cannot_be_stored_with_an_error(tmp_path: Path) -> None:
    store = tmp_path / "store"
    script = _breaking_script(tmp_path, store)
    command = [sys.executable, "-m", "trio_harness", "acp", "--model", f"scripted:{script}", "--store", str(store)]
    command.append("--yes")
    process = await trio.lowlevel.open_process(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, cwd=tmp_path)
    assert process.stdin is not None
    assert process.stdout is not None
    buffer = b""

    async def send(message: dict[str, Any]) -> None:
        assert process.stdin is not None
        await process.stdin.send_all(json.dumps(message).encode() + b"\n")

    async def response(request_id: int) -> dict[str, Any]:
        nonlocal buffer
        assert process.stdout is not None
        while True:
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                message: dict[str, Any] = json.loads(line)
                if message.get("id") == request_id and "method" not in message:
                    return message
            data = await process.stdout.receive_some()
            assert data, "the server closed its output"
            buffer += data

    try:
        with trio.fail_after(WAIT):
            await send({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {"protocolVersion": 1}})
            await response(1)
            params = {"cwd": str(tmp_path), "mcpServers": []}
            await send({"jsonrpc": "2.0", "id": 2, "method": "session/new", "params": params})
            session_id = (await response(2))["result"]["sessionId"]
            prompt = [{"type": "text", "text": "go"}]
            await send(
                {
                    "jsonrpc": "2.0",
                    "id": 3,
                    "method": "session/prompt",
                    "params": {"sessionId": session_id, "prompt": prompt},
                }
            )
            answer = await response(3)
            assert "result" not in answer, answer
            message = answer["error"]["message"]
            assert "could not be stored" in message or "the log file was removed from the store" in message
            assert answer["error"]["data"] == {"code": "store-error"}
            await process.stdin.aclose()
            # Disposing the session at disconnect fails to store it again: the exit says so.
            assert await process.wait() == 1
    finally:
        if process.returncode is None:
            process.kill()
            with trio.CancelScope(shield=True):
                await process.wait()
