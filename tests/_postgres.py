"""A throwaway PostgreSQL cluster for the tests (and the example and the benchmark).

:func:`start_cluster` runs ``initdb --no-sync`` into a fresh temporary
directory and starts the server on a Unix socket in that directory (no TCP
port, so clusters of parallel runs never collide).  ``initdb`` and ``pg_ctl``
refuse to run as root, so as root they run as the ``postgres`` user
(``runuser -u postgres``), which owns the directory.

A machine without the server binaries is a test *failure*, not a skip: CI
installs PostgreSQL when it is missing (``.ci/run``), and PgBouncer too
(:func:`start_pgbouncer`, a real transaction-pooling proxy in front of a
cluster, on a free loopback port).

Each test gets its own schema (:func:`fresh_schema`), so tests share the
cluster without seeing each other's sessions.
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
import uuid
from collections.abc import AsyncIterator, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import pytest

if TYPE_CHECKING:
    import psycopg

    from trio_harness.session import PostgresStore, Session

SERVER_MISSING = (
    "PostgreSQL server binaries (initdb, pg_ctl) were not found under /usr/lib/postgresql/*/bin or on PATH; "
    "install them (Debian: apt-get install --no-install-recommends postgresql; .ci/run does this) -- "
    "the PostgreSQL store tests need a real server"
)


class ServerMissing(RuntimeError):
    """No PostgreSQL server binaries on this machine."""


def find_bindir() -> Path:
    """The directory holding ``initdb`` and ``pg_ctl`` (the newest installed version).

    Raises:
        ServerMissing: none is installed.
    """
    found = sorted(
        glob.glob("/usr/lib/postgresql/*/bin/initdb"),
        key=lambda p: int(Path(p).parent.parent.name) if Path(p).parent.parent.name.isdigit() else 0,
    )
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("pg_ctl") is not None:
        return Path(initdb).resolve().parent
    raise ServerMissing(SERVER_MISSING)


def _as_server_user(argv: Sequence[str]) -> list[str]:
    if os.geteuid() == 0:
        return ["runuser", "-u", "postgres", "--", *argv]
    return list(argv)


@attrs.define
class Cluster:
    """A running throwaway cluster; :meth:`stop` removes it."""

    bindir: Path
    directory: Path
    port: int = 5432
    user: str = "postgres"

    @property
    def socket_dir(self) -> Path:
        return self.directory / "sock"

    @property
    def data_dir(self) -> Path:
        return self.directory / "data"

    def dsn(self, dbname: str = "postgres", user: str | None = None) -> str:
        """A ``postgresql://`` URL reaching this cluster over its Unix socket."""
        query = urllib.parse.urlencode({"host": str(self.socket_dir), "port": str(self.port)})
        return f"postgresql://{user or self.user}@/{dbname}?{query}"

    def psql(self, sql: str, dbname: str = "postgres") -> str:
        """Run ``sql`` as the superuser; returns psql's output."""
        result = subprocess.run(
            [
                str(self.bindir / "psql"),
                "-X",
                "-q",
                "-A",
                "-t",
                "-v",
                "ON_ERROR_STOP=1",
                "-h",
                str(self.socket_dir),
                "-p",
                str(self.port),
                "-U",
                self.user,
                "-d",
                dbname,
                "-c",
                sql,
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0:
            raise RuntimeError(f"psql failed: {result.stderr.strip()}")
        return result.stdout

    def restart(self, mode: str = "fast") -> None:
        """Restart the server (``mode``: ``fast`` ends every connection, ``immediate`` crashes it)."""
        log_file = str(self.directory / "server.log")
        _run([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-l", log_file, "-m", mode, "-w", "restart"])

    def stop(self) -> None:
        """Stop the server at once and remove its directory."""
        try:
            subprocess.run(
                _as_server_user([str(self.bindir / "pg_ctl"), "-D", str(self.data_dir), "-m", "immediate", "stop"]),
                capture_output=True,
                check=False,
                timeout=60,
            )
        finally:
            shutil.rmtree(self.directory, ignore_errors=True)


def start_cluster(*, durable: bool = False, settings: Sequence[str] = (), max_connections: int = 200) -> Cluster:
    """Create and start a cluster in a new temporary directory.

    Args:
        durable: keep PostgreSQL's default durability (``fsync``); the tests
            turn it off for speed, the benchmark keeps it.
        settings: extra ``name=value`` server settings.
        max_connections: the server's ``max_connections`` (3 of them are
            reserved for superusers, ``superuser_reserved_connections``).

    Raises:
        ServerMissing: no server binaries.
        RuntimeError: ``initdb`` or ``pg_ctl`` failed (their output attached).
    """
    bindir = find_bindir()
    # Directly under the system temporary directory: the postgres user must be
    # able to reach it (pytest's per-user base directory is private).
    directory = Path(tempfile.mkdtemp(prefix="trio-harness-pg-", dir="/tmp" if os.path.isdir("/tmp") else None))
    if os.geteuid() == 0:
        entry = pwd.getpwnam("postgres")
        os.chown(directory, entry.pw_uid, entry.pw_gid)
    cluster = Cluster(bindir=bindir, directory=directory)
    try:
        _run(
            [
                str(bindir / "initdb"),
                "--no-sync",
                "-D",
                str(cluster.data_dir),
                "-A",
                "trust",
                "-U",
                cluster.user,
                "-E",
                "UTF8",
                "--locale=C",
            ]
        )
        _run(["mkdir", "-m", "0700", str(cluster.socket_dir)])
        options = [
            f"-k {cluster.socket_dir}",
            f"-p {cluster.port}",
            "-c listen_addresses=''",
            f"-c max_connections={max_connections}",
        ]
        if not durable:
            options += ["-c fsync=off", "-c full_page_writes=off"]
        options += [f"-c {setting}" for setting in settings]
        _run(
            [
                str(bindir / "pg_ctl"),
                "-D",
                str(cluster.data_dir),
                "-l",
                str(directory / "server.log"),
                "-o",
                " ".join(options),
                "-w",
                "-t",
                "60",
                "start",
            ]
        )
    except BaseException:
        cluster.stop()
        raise
    return cluster


def _run(argv: list[str]) -> None:
    result = subprocess.run(_as_server_user(argv), capture_output=True, text=True, check=False, timeout=120)
    if result.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({result.returncode}): {result.stderr.strip() or result.stdout}")


@contextlib.contextmanager
def running_cluster(
    *, durable: bool = False, settings: Sequence[str] = (), max_connections: int = 200
) -> Iterator[Cluster]:
    """``start_cluster`` as a context manager."""
    cluster = start_cluster(durable=durable, settings=settings, max_connections=max_connections)
    try:
        yield cluster
    finally:
        cluster.stop()


def fresh_schema() -> str:
    """A schema name no other test uses."""
    return f"t_{uuid.uuid4().hex[:16]}"


# ---------------------------------------------------------------- a TCP proxy for faults


@attrs.define(eq=False)
class _Link:
    """One proxied connection: the client's TCP socket and the server's Unix socket."""

    client: socket.socket
    server: socket.socket
    # Set while the server's replies are held back (see Proxy.hold_replies_after).
    hold: threading.Event | None = None
    # Set before a dropped statement is forwarded: no reply reaches the client after (its answer is lost).
    mute: bool = False
    closed: bool = False

    def shut(self) -> None:
        self.closed = True
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@attrs.define(eq=False)
class Proxy:
    """A TCP proxy on 127.0.0.1 in front of a cluster's Unix socket, for faults the network makes.

    Rules are armed once and fire on the first chunk a client sends that
    contains their pattern (e.g. ``b"COMMIT"``):

    * :meth:`drop_after`: forward the chunk, then close the connection on
      both sides: the server runs the statement, its answer is lost;
    * :meth:`hold_replies_after`: forward the chunk and hold back every
      reply of that connection until the returned event is set.
    """

    cluster: Cluster
    _listener: socket.socket = attrs.field(init=False)
    _links: list[_Link] = attrs.field(factory=list, init=False)
    _rules: list[tuple[bytes, str, threading.Event]] = attrs.field(factory=list, init=False)
    _releases: dict[threading.Event, threading.Event] = attrs.field(factory=dict, init=False)
    _guard: threading.Lock = attrs.field(factory=threading.Lock, init=False)
    _threads: list[threading.Thread] = attrs.field(factory=list, init=False)

    def __attrs_post_init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0))
        self._spawn(self._accept)

    @property
    def port(self) -> int:
        port: int = self._listener.getsockname()[1]
        return port

    def dsn(self, dbname: str = "postgres") -> str:
        return f"postgresql://{self.cluster.user}@127.0.0.1:{self.port}/{dbname}?sslmode=disable"

    def drop_after(self, pattern: bytes) -> threading.Event:
        """Arm: close the first connection that sends ``pattern``, right after forwarding it; the event is set then."""
        fired = threading.Event()
        with self._guard:
            self._rules.append((pattern, "drop", fired))
        return fired

    def hold_replies_after(self, pattern: bytes) -> tuple[threading.Event, threading.Event]:
        """Arm: hold the replies of the first connection that sends ``pattern``.

        Returns ``(fired, release)``: ``fired`` is set once the pattern went
        through; setting ``release`` lets the held replies go.
        """
        fired, release = threading.Event(), threading.Event()
        with self._guard:
            self._rules.append((pattern, "hold", fired))
            self._releases[fired] = release
        return fired, release

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accepting thread (close alone does not)
        with contextlib.suppress(OSError):
            self._listener.close()
        with self._guard:
            links = list(self._links)
            for release in self._releases.values():
                release.set()
        for link in links:
            link.shut()
        for thread in self._threads:
            thread.join(timeout=10)

    def _spawn(self, target: Any, *args: Any) -> None:
        thread = threading.Thread(target=target, args=args, daemon=True)
        self._threads.append(thread)
        thread.start()

    def _accept(self) -> None:
        target = str(self.cluster.socket_dir / f".s.PGSQL.{self.cluster.port}")
        while True:
            try:
                client, _ = self._listener.accept()
            except OSError:
                return
            server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                server.connect(target)
            except OSError:
                client.close()
                server.close()
                continue
            link = _Link(client, server)
            with self._guard:
                self._links.append(link)
            self._spawn(self._upstream, link)
            self._spawn(self._downstream, link)

    def _upstream(self, link: _Link) -> None:
        try:
            while chunk := link.client.recv(65536):
                with self._guard:
                    fired = next((rule for rule in self._rules if rule[0] in chunk), None)
                    if fired is not None:
                        self._rules.remove(fired)
                if fired is not None and fired[1] == "hold":
                    link.hold = self._releases[fired[2]]  # before the server can answer
                if fired is not None and fired[1] == "drop":
                    link.mute = True  # before the server can answer: a quick answer must not get through
                link.server.sendall(chunk)
                if fired is None:
                    continue
                fired[2].set()
                if fired[1] == "drop":
                    link.shut()
                    return
        except OSError:
            pass
        finally:
            link.shut()

    def _downstream(self, link: _Link) -> None:
        try:
            while chunk := link.server.recv(65536):
                while link.hold is not None and not link.hold.is_set() and not link.closed:
                    link.hold.wait(0.05)
                if link.closed or link.mute:
                    return
                link.client.sendall(chunk)
        except OSError:
            pass
        finally:
            link.shut()
            link.client.close()
            link.server.close()


@contextlib.contextmanager
def proxy_for(cluster: Cluster) -> Iterator[Proxy]:
    """A :class:`Proxy` in front of ``cluster`` for the block."""
    proxy = Proxy(cluster)
    try:
        yield proxy
    finally:
        proxy.close()


# ---------------------------------------------------------------- PgBouncer, a real pooling proxy

PGBOUNCER_MISSING = (
    "PgBouncer was not found (/usr/sbin/pgbouncer or on PATH); install it (Debian: apt-get install "
    "--no-install-recommends pgbouncer; .ci/run does this) -- the pooled store's tests run behind a real one"
)


def find_pgbouncer() -> Path:
    """The ``pgbouncer`` program.

    Raises:
        ServerMissing: it is not installed.
    """
    found = shutil.which("pgbouncer") or next(
        (p for p in ("/usr/sbin/pgbouncer", "/usr/bin/pgbouncer") if os.access(p, os.X_OK)), None
    )
    if found is None:
        raise ServerMissing(PGBOUNCER_MISSING)
    return Path(found)


def _free_port() -> int:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port: int = listener.getsockname()[1]
        return port


@attrs.define(eq=False)
class PgBouncer:
    """A running PgBouncer in front of a cluster's Unix socket, on 127.0.0.1; :meth:`stop` ends it.

    Every client logs in as the cluster's superuser (``auth_type = trust``);
    at most ``pool_size`` server connections are shared by all of them
    (``default_pool_size``), in ``pool_mode``.
    """

    cluster: Cluster
    process: subprocess.Popen[bytes]
    directory: Path
    port: int
    pool_mode: str
    pool_size: int

    def dsn(self, dbname: str = "postgres", **params: str) -> str:
        """A URL reaching the cluster through PgBouncer (extra ``params`` in its query)."""
        query = urllib.parse.urlencode({"sslmode": "disable", **params})
        return f"postgresql://{self.cluster.user}@127.0.0.1:{self.port}/{dbname}?{query}"

    def show(self, what: str) -> list[dict[str, str]]:
        """``SHOW what`` on PgBouncer's admin console (``POOLS``, ``CLIENTS``, ``SERVERS``), as rows of text."""
        import psycopg

        with psycopg.connect(self.dsn("pgbouncer"), autocommit=True) as conn:
            # The console speaks only the simple query protocol: libpq's PQexec.
            result = conn.pgconn.exec_(f"SHOW {what}".encode())
            if result.status != psycopg.pq.ExecStatus.TUPLES_OK:
                raise RuntimeError(f"SHOW {what} on PgBouncer failed: {result.error_message.decode().strip()}")
            names = [(result.fname(column) or b"").decode() for column in range(result.nfields)]
            return [
                {name: (result.get_value(row, column) or b"").decode() for column, name in enumerate(names)}
                for row in range(result.ntuples)
            ]

    def log(self) -> str:
        return (self.directory / "pgbouncer.log").read_text(errors="replace")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.directory, ignore_errors=True)


def start_pgbouncer(cluster: Cluster, *, pool_mode: str = "transaction", pool_size: int = 4) -> PgBouncer:
    """Start PgBouncer in front of ``cluster`` on a free loopback port (as the ``postgres`` user when root).

    Raises:
        ServerMissing: PgBouncer is not installed.
        RuntimeError: it did not start (its log attached).
    """
    program = find_pgbouncer()
    directory = Path(tempfile.mkdtemp(prefix="trio-harness-pgbouncer-", dir="/tmp" if os.path.isdir("/tmp") else None))
    (directory / "users.txt").write_text(f'"{cluster.user}" ""\n')
    for _ in range(5):  # a free port may be taken by someone else before PgBouncer binds it
        port = _free_port()
        config = directory / "pgbouncer.ini"
        config.write_text(
            "\n".join(
                [
                    "[databases]",
                    f"* = host={cluster.socket_dir} port={cluster.port}",
                    "[pgbouncer]",
                    "listen_addr = 127.0.0.1",
                    f"listen_port = {port}",
                    "unix_socket_dir =",
                    "auth_type = trust",
                    f"auth_file = {directory / 'users.txt'}",
                    f"admin_users = {cluster.user}",
                    f"pool_mode = {pool_mode}",
                    f"default_pool_size = {pool_size}",
                    "max_client_conn = 1000",
                    f"logfile = {directory / 'pgbouncer.log'}",
                    f"pidfile = {directory / 'pgbouncer.pid'}",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            entry = pwd.getpwnam("postgres")
            for path in (directory, *directory.iterdir()):
                os.chown(path, entry.pw_uid, entry.pw_gid)
        with open(directory / "stderr.log", "wb") as stderr_file:  # a pipe nobody reads would fill up
            process = subprocess.Popen(
                _as_server_user([str(program), str(config)]), stdout=subprocess.DEVNULL, stderr=stderr_file
            )
        bouncer = PgBouncer(cluster, process, directory, port, pool_mode, pool_size)
        deadline = time.monotonic() + 30
        while process.poll() is None and time.monotonic() < deadline:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return bouncer
            time.sleep(0.02)  # a bounded wait for the port to listen, not a synchronisation by sleep
        log = bouncer.log() if (directory / "pgbouncer.log").exists() else ""
        stderr = (directory / "stderr.log").read_text(errors="replace")
        if process.poll() is None:
            process.kill()
            process.wait()
        if "Address already in use" not in log + stderr:
            shutil.rmtree(directory, ignore_errors=True)
            raise RuntimeError(f"PgBouncer did not start ({process.returncode}): {stderr.strip()} {log.strip()}")
    shutil.rmtree(directory, ignore_errors=True)
    raise RuntimeError("PgBouncer did not start: no free port it could bind")


@contextlib.contextmanager
def pgbouncer_for(cluster: Cluster, *, pool_mode: str = "transaction", pool_size: int = 4) -> Iterator[PgBouncer]:
    """A :class:`PgBouncer` in front of ``cluster`` for the block; a missing PgBouncer fails the test."""
    try:
        bouncer = start_pgbouncer(cluster, pool_mode=pool_mode, pool_size=pool_size)
    except ServerMissing as exc:
        pytest.fail(str(exc), pytrace=False)
    try:
        yield bouncer
    finally:
        bouncer.stop()


# ---------------------------------------------------------------- pytest fixtures

_shared: list[Cluster] = []
_users = [0]


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """One throwaway cluster per test run, shared by every module that imports this fixture.

    A missing server fails the test (never a skip).
    """
    if not _shared:
        try:
            _shared.append(start_cluster())
        except ServerMissing as exc:
            pytest.fail(str(exc), pytrace=False)
    _users[0] += 1
    try:
        yield _shared[0]
    finally:
        _users[0] -= 1
        if _users[0] == 0:
            _shared.pop().stop()


def admin(cluster: Cluster) -> psycopg.Connection[Any]:
    """An autocommit connection to the cluster as its superuser, for setting up and inspecting faults."""
    import psycopg

    return psycopg.connect(cluster.dsn(), autocommit=True)


@pytest.fixture
def superuser(postgres_cluster: Cluster) -> Iterator[psycopg.Connection[Any]]:
    """An admin connection (:func:`admin`) for the test, closed after it."""
    conn = admin(postgres_cluster)
    try:
        yield conn
    finally:
        conn.close()


@pytest.fixture
def schema() -> str:
    """A fresh schema name in the shared cluster's database (nothing is created yet)."""
    return fresh_schema()


@pytest.fixture
async def store(postgres_cluster: Cluster, schema: str) -> AsyncIterator[PostgresStore]:
    """A checked PostgreSQL store on the shared cluster, in its own schema, open for the test."""
    from trio_harness.session import PostgresStore

    persistence = PostgresStore(postgres_cluster.dsn(), schema=schema)
    await persistence.check()
    async with persistence:
        yield persistence


# ---------------------------------------------------------------- the fault tests' cluster and sessions


@pytest.fixture(scope="module")
def own_cluster() -> Iterator[Cluster]:
    """A cluster of the test module's own, for the tests that restart or crash the server.

    Its WAL writer sleeps 10 s, so a commit made without sync stays in the
    server's memory (and is lost by a crash) until a synced commit flushes it.
    """
    with running_cluster(settings=["wal_writer_delay=10000ms", "autovacuum=off"]) as cluster:
        yield cluster


def one_turn(session: Session, number: int, text: str = "do it") -> None:
    """Append a completed turn of five events (a message spliced in, taken, answered).

    Shorter than tests/test_postgres_store.py's (no step events): the fault tests count these five.
    """
    from trio_harness.session import _events as ev

    message_id = f"m{number}-{text}"
    session.append(ev.InboxSpliced, queue="next-turn", start=0, inserted=(ev.InboxMessage(message_id, text),))
    session.append(ev.TurnStart, turn=number)
    session.append(ev.UserMessage, turn=number, step=1, message_id=message_id, text=text)
    session.append(ev.AssistantMessage, turn=number, step=1, text="done")
    session.append(ev.TurnEnd, turn=number, reason="completed")


async def stored_session(persistence: PostgresStore, session_id: str) -> None:
    """Create ``session_id`` in ``persistence`` with one turn (:func:`one_turn`), and detach it."""
    from trio_harness.session import SessionRegistry

    sessions = SessionRegistry(persistence)
    entry = sessions.enter(await sessions.prepare_new(session_id, cwd="/work"))
    one_turn(entry.session, 1)
    await sessions.detach(entry)


@pytest.fixture
def clock() -> Any:
    """The run's clock (pytest-trio takes it): a MockClock at the real rate (the statements need real time),
    plus the jumps a test makes past a bound instead of waiting for it."""
    import trio.testing

    return trio.testing.MockClock(rate=1.0)


async def until(predicate: Any, what: str) -> None:
    """Poll ``predicate`` (the server's or another thread's state, which no Trio task signals) until it holds,
    bounded by ``WAIT``."""
    import trio
    from _util import WAIT

    with trio.fail_after(WAIT):
        while not predicate():
            await trio.sleep(0.005)
    assert predicate(), what


def events_stored(conn: psycopg.Connection[Any], schema: str, session_id: str) -> int:
    """How many events of ``session_id`` are stored (a row holds one, or a group-committed flush's)."""
    row = conn.execute(
        f"SELECT coalesce(sum(n), 0) FROM {schema}.events WHERE session_id = %s", (session_id,)
    ).fetchone()
    return int(row[0]) if row else 0


# ---------------------------------------------------------------- worker processes


async def flush_noting(entry: Any, outcomes: list[BaseException | None]) -> None:
    """Flush ``entry``'s session; append None to ``outcomes``, or the store error the flush raised."""
    from trio_harness import SessionStoreError

    try:
        await entry.session.flush()
        outcomes.append(None)
    except SessionStoreError as exc:
        outcomes.append(exc)


def worker_argv(command: str, dsn: str, schema: str, session_id: str, *options: str) -> list[str]:
    """The command line of a worker process (see :func:`_worker`)."""
    return [sys.executable, str(Path(__file__).resolve()), command, dsn, schema, session_id, *options]


def _emit(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


async def _worker(command: str, dsn: str, schema: str, session_id: str, options: list[str]) -> None:
    """A worker process holding one session, driven over stdin / stdout (one JSON object a line).

    Every worker prints ``{"ready": pid}`` once its harness is open.

    Commands:
        race: wait for a line on stdin, then try to resume the session; print
            ``{"won": true}`` and hold it until stdin closes, or ``{"won":
            false, "error": ..., "locked": ...}``.
        hold: resume the session (``--create``: create it), print ``{"held":
            ...}``; then every stdin line ``{"followup": TEXT}`` runs a turn
            and prints ``{"turn_end": REASON, "failure": CODE}``; every
            ``user/message`` the agent claims (posted ones included) prints
            ``{"message": TEXT, "mode": ..., "message_id": ...}``.  Exits
            when stdin closes.

    Options: ``--lock-timeout=S``, ``--heartbeat=S``, ``--idle-session-timeout=S``, ``--pooled`` (a
    :class:`~trio_harness.session.PooledPostgresStore`), ``--direct-dsn=URL`` (its ``direct_dsn``).
    """
    import trio

    from trio_harness import SessionLockedError, SessionStoreError, open_harness
    from trio_harness.model import ScriptedModel
    from trio_harness.session import PooledPostgresStore, PostgresStore
    from trio_harness.session import _events as ev

    settings: dict[str, float] = {}
    direct = {option.removeprefix("--direct-dsn=") for option in options if option.startswith("--direct-dsn=")}
    for option in options:
        if option.startswith("--") and "=" in option and not option.startswith("--direct-dsn="):
            name, value = option[2:].split("=", 1)
            settings[name] = float(value)
    extra: dict[str, Any] = {"direct_dsn": direct.pop()} if direct else {}
    make = PooledPostgresStore if "--pooled" in options else PostgresStore
    persistence = make(
        dsn,
        **extra,
        schema=schema,
        lock_timeout=settings.get("lock-timeout", 0.0),
        heartbeat=settings.get("heartbeat", 0.4),
        idle_session_timeout=settings.get("idle-session-timeout", 2.0),
    )
    model = ScriptedModel([{"text": f"answer {n}"} for n in range(1000)])
    stdin = trio.lowlevel.FdStream(os.dup(0))
    pending = bytearray()

    async def read_line() -> bytes | None:
        while b"\n" not in pending:
            chunk = await stdin.receive_some()
            if not chunk:
                return None
            pending.extend(chunk)
        line, _, rest = bytes(pending).partition(b"\n")
        pending[:] = rest
        return line

    async with open_harness(model=model, store=persistence, builtin_tools=False) as harness:
        _emit(ready=os.getpid())
        if command == "race":
            await read_line()
            try:
                handle = await harness.agents.resume(session_id)
            except Exception as exc:
                cause = exc.__cause__ if exc.__cause__ is not None else exc
                _emit(won=False, error=type(cause).__name__, locked=isinstance(cause, SessionLockedError))
                return
            async with handle:
                _emit(won=True, pid=os.getpid())
                while await read_line() is not None:
                    pass
            return
        if "--create" in options:
            handle = await harness.agents.create(session_id=session_id)
        else:
            handle = await harness.agents.resume(session_id)
        try:
            async with handle as agent:

                def on_event(event: ev.Event) -> None:
                    if isinstance(event, ev.UserMessage):
                        _emit(message=event.text, mode=event.mode, message_id=event.message_id)
                    elif isinstance(event, ev.TurnEnd):
                        _emit(turn_end=event.reason, failure=event.failure.code if event.failure else None)

                agent.session.observe(on_event)
                await agent.session.flush()
                _emit(held=session_id, pid=os.getpid(), events=len(agent.session.events))
                while (line := await read_line()) is not None:
                    agent.followup(json.loads(line)["followup"])
                    try:
                        await agent.when_idle()
                    except SessionStoreError as exc:
                        _emit(store_error=str(exc))
        except SessionStoreError as exc:  # the final flush (dispose)
            _emit(store_error=str(exc))


if __name__ == "__main__":
    import trio

    trio.run(_worker, sys.argv[1], sys.argv[2], sys.argv[3], sys.argv[4], sys.argv[5:])
