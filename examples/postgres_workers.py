"""Two worker processes share one PostgreSQL database: one live writer per session, a remote inbox, a takeover.

What it shows:

* the database: ``$TRIO_HARNESS_POSTGRES_URL`` when set, else a throwaway
  cluster started here when the PostgreSQL server is installed (as the
  ``postgres`` user when run as root); without either, or without the driver
  (``pip install 'trio-harness[postgres]'``), it says why it is skipped and
  exits 0;
* worker A (this file run with ``--worker``) creates session ``ticket-42`` and
  answers a first prompt; the session stays live in A;
* worker B asks for the same session and is refused: it is live on another
  worker (A holds its advisory lock);
* this process, which holds no session, posts a message with
  ``harness.sessions.post``: A's listener wakes, splices it into the agent's
  inbox and the agent answers it;
* A is killed with SIGKILL: its connection dies and with it the lock, so B
  takes the session over at once, with the whole history, and answers the
  next posted message.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.parse
from pathlib import Path
from typing import Any

import trio

from trio_harness import ScriptedModel, SessionLockedError, open_harness
from trio_harness import events as ev

SESSION_ID = "ticket-42"


# ---------------------------------------------------------------- a worker (child process)


def emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def worker(name: str, dsn: str, schema: str, role: str) -> None:
    """``role`` is ``create`` (make the session) or ``takeover`` (wait for it to be free)."""
    from trio_harness.session import PostgresStore, SessionRegistry

    model = ScriptedModel([{"text": f"{name} answering #{n}"} for n in range(1, 20)])
    store = PostgresStore(dsn, schema=schema, lock_timeout=10.0)
    stdin = trio.lowlevel.FdStream(os.dup(0))
    async with open_harness(model=model, store=store, builtin_tools=False) as harness:
        if role == "create":
            handle = await harness.agents.create(session_id=SESSION_ID)
        else:
            async with PostgresStore(dsn, schema=schema) as probe:  # lock_timeout=0: refuse at once
                try:
                    await SessionRegistry(probe).prepare_resume(SESSION_ID)
                except SessionLockedError as exc:
                    emit(refused=str(exc).split(" (")[0])
            await stdin.receive_some()  # the parent says: A is gone
            started = time.perf_counter()
            handle = await harness.agents.resume(SESSION_ID)
            emit(took_over_ms=round((time.perf_counter() - started) * 1000, 1), events=len(handle.agent.session))
        async with handle as agent:
            answers: list[str] = []
            turn_ends, ended = trio.open_memory_channel[str](100)

            def report(event: ev.Event) -> None:
                if isinstance(event, ev.UserMessage):
                    emit(asked=event.text)
                elif isinstance(event, ev.AssistantMessage):
                    answers.append(event.text)
                elif isinstance(event, ev.TurnEnd):
                    turn_ends.send_nowait(answers[-1] if answers else "")

            async def relay_answers() -> None:
                async for answer in ended:
                    await agent.when_idle()  # the turn is stored: a kill from now on loses nothing
                    emit(answered=answer)

            agent.session.observe(report)
            async with trio.open_nursery() as nursery:
                nursery.start_soon(relay_answers)
                if role == "create":
                    agent.followup("Open ticket 42: the build is red.")
                while await stdin.receive_some():  # hold the session until the parent closes stdin
                    pass
                nursery.cancel_scope.cancel()


# ---------------------------------------------------------------- a throwaway database


def throwaway_cluster() -> tuple[str, Path] | str:
    """Start a cluster in a temporary directory: ``(url, directory)``, or why it cannot be done."""
    initdb = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
    bindir = initdb[-1].parent if initdb else None
    if bindir is None and shutil.which("initdb") and shutil.which("pg_ctl"):
        bindir = Path(shutil.which("initdb") or "").parent
    if bindir is None:
        return (
            "no PostgreSQL server is installed (apt-get install postgresql) and $TRIO_HARNESS_POSTGRES_URL is not set"
        )
    as_server: list[str] = []
    directory = Path(tempfile.mkdtemp(prefix="trio-harness-demo-pg-", dir="/tmp"))
    if os.geteuid() == 0:  # initdb and pg_ctl refuse to run as root
        import pwd

        entry = pwd.getpwnam("postgres")
        os.chown(directory, entry.pw_uid, entry.pw_gid)
        as_server = ["runuser", "-u", "postgres", "--"]
    sockets = directory / "sock"
    commands = [
        [str(bindir / "initdb"), "--no-sync", "-D", str(directory / "data"), "-A", "trust", "-U", "postgres"],
        ["mkdir", "-m", "0700", str(sockets)],
        [
            str(bindir / "pg_ctl"),
            "-D",
            str(directory / "data"),
            "-l",
            str(directory / "server.log"),
            "-o",
            f"-k {sockets} -c listen_addresses=''",
            "-w",
            "start",
        ],
    ]
    for command in commands:
        result = subprocess.run([*as_server, *command], capture_output=True, text=True, check=False)
        if result.returncode != 0:
            stop_cluster(directory)
            return f"could not start a throwaway PostgreSQL server: {result.stderr.strip()}"
    return f"postgresql://postgres@/postgres?host={urllib.parse.quote(str(sockets), safe='')}", directory


def stop_cluster(directory: Path) -> None:
    pg_ctl = sorted(Path("/usr/lib/postgresql").glob("*/bin/pg_ctl"))
    command = [str(pg_ctl[-1]) if pg_ctl else "pg_ctl", "-D", str(directory / "data"), "-m", "immediate", "stop"]
    if os.geteuid() == 0:
        command = ["runuser", "-u", "postgres", "--", *command]
    subprocess.run(command, capture_output=True, check=False)
    shutil.rmtree(directory, ignore_errors=True)


# ---------------------------------------------------------------- the parent


class Worker:
    def __init__(self, name: str, process: trio.Process) -> None:
        self.name, self.process, self.pending = name, process, b""

    async def until(self, key: str) -> dict[str, Any]:
        """Relay the worker's lines until one holds ``key``."""
        assert self.process.stdout is not None
        with trio.fail_after(30):
            while True:
                while b"\n" not in self.pending:
                    chunk = await self.process.stdout.receive_some()
                    if not chunk:
                        raise RuntimeError(f"worker {self.name} exited")
                    self.pending += chunk
                raw, _, self.pending = self.pending.partition(b"\n")
                line: dict[str, Any] = json.loads(raw)
                print(f"  [{self.name}] {', '.join(f'{k}: {v}' for k, v in line.items())}")
                if key in line:
                    return line


async def start(name: str, dsn: str, schema: str, role: str) -> Worker:
    argv = [sys.executable, __file__, "--worker", name, dsn, schema, role]
    process = await trio.lowlevel.open_process(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    return Worker(name, process)


async def demo(dsn: str) -> None:
    from trio_harness.session import PostgresStore

    schema = f"demo_{os.getpid()}"
    store = PostgresStore(dsn, schema=schema)
    await store.check()  # creates the tables (every worker may run it: it is idempotent)
    a = await start("A", dsn, schema, "create")
    workers = [a]
    try:
        print("worker A creates the session and answers a first prompt:")
        await a.until("answered")
        b = await start("B", dsn, schema, "takeover")
        workers.append(b)
        print("worker B asks for the same session:")
        await b.until("refused")
        async with open_harness(store=store, builtin_tools=False) as harness:
            print("this process posts a message; the worker holding the session answers it:")
            await harness.sessions.post(SESSION_ID, "Any news on ticket 42?")
            await a.until("answered")
            print("worker A is killed with SIGKILL; B takes the session over:")
            a.process.send_signal(signal.SIGKILL)
            await a.process.wait()
            assert b.process.stdin is not None
            await b.process.stdin.send_all(b"go\n")
            await b.until("took_over_ms")
            await harness.sessions.post(SESSION_ID, "Who is on it now?")
            await b.until("answered")
        await b.process.stdin.aclose()
        with trio.fail_after(30):
            await b.process.wait()
        async with store:
            loaded = await store.load(SESSION_ID)
        asked = [e.text for e in loaded.events if isinstance(e, ev.UserMessage)]
        print(f"stored: {len(loaded.events)} events; prompts in order: {asked}")
        assert asked == ["Open ticket 42: the build is red.", "Any news on ticket 42?", "Who is on it now?"]
    finally:
        for worker in workers:
            if worker.process.poll() is None:
                worker.process.kill()
                await worker.process.wait()


def main() -> None:
    try:
        import psycopg  # noqa: F401
    except ImportError:
        print("skipped: the PostgreSQL driver is not installed (pip install 'trio-harness[postgres]')")
        return
    dsn = os.environ.get("TRIO_HARNESS_POSTGRES_URL")
    directory: Path | None = None
    if dsn is None:
        started = throwaway_cluster()
        if isinstance(started, str):
            print(f"skipped: {started}")
            return
        dsn, directory = started
    try:
        trio.run(demo, dsn)
    finally:
        if directory is not None:
            stop_cluster(directory)


if __name__ == "__main__":
    if sys.argv[1:2] == ["--worker"]:
        trio.run(worker, sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5])
    else:
        main()
