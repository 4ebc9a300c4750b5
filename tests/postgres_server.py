"""A real PostgreSQL for tests: Debian's postgresql-15 (/usr/lib/postgresql/15/bin, or
$GPUFLEET_PG_BINDIR) on a free loopback port, with password (SCRAM) authentication and
durability turned off for speed; one server per session, stopped (fast shutdown, then harder) at
teardown. Each test takes its own empty database from it.

    def test_x(postgres_server: PostgresServer) -> None:
        url = postgres_server.new_database()  # postgresql://gpufleet:PASSWORD@127.0.0.1:PORT/NAME
        with psycopg.connect(url) as conn:
            conn.execute("CREATE TABLE t (x int)")

PostgreSQL refuses to run as root: as root, the cluster lives in a directory of its own under the
system's temporary directory, owned by the `postgres` system user, and initdb and postgres run as
that user (Popen(user=...): no runuser in between, which would not pass on SIGINT).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import secrets
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from tests.support import free_port, require

__all__ = ["PostgresServer", "postgres_server", "start_postgres"]

BINDIR_ENV = "GPUFLEET_PG_BINDIR"
DEFAULT_BINDIR = Path("/usr/lib/postgresql/15/bin")
HOST = "127.0.0.1"
USER = "gpufleet"
SYSTEM_USER = "postgres"  # who runs the server when the tests run as root
START_TIMEOUT_SECONDS = 30.0
STOP_TIMEOUT_SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class PostgresServer:
    host: str  # always 127.0.0.1: the only address it listens on (no Unix socket either)
    port: int
    user: str  # the superuser initdb made
    password: str
    data_dir: Path
    log: Path  # initdb's and the server's stdout and stderr

    def url(self, dbname: str) -> str:
        """postgresql://USER:PASSWORD@127.0.0.1:PORT/`dbname`."""
        return f"postgresql://{self.user}:{self.password}@{self.host}:{self.port}/{dbname}"

    def new_database(self) -> str:
        """Create an empty database with a name no other call gets; its URL. It sorts text as most
        servers do (ICU en-US: "a" < "B" < "b"), not byte by byte as the cluster's C locale would."""
        name = f"test_{secrets.token_hex(8)}"
        with psycopg.connect(self.url("postgres"), autocommit=True) as conn:
            conn.execute(
                sql.SQL(
                    "CREATE DATABASE {} TEMPLATE template0 LOCALE_PROVIDER icu ICU_LOCALE 'en-US' LOCALE 'C'"
                ).format(sql.Identifier(name))
            )
        return self.url(name)


def _bindir() -> Path:
    bindir = Path(os.environ.get(BINDIR_ENV) or DEFAULT_BINDIR)
    found = all(os.access(bindir / name, os.X_OK) for name in ("initdb", "postgres"))
    require(
        found,
        f"PostgreSQL 15 missing ({bindir}/initdb, {bindir}/postgres): apt-get install postgresql-15, "
        f"or `make test`, which installs it; {BINDIR_ENV} names another bin directory",
    )
    return bindir


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-4000:]


def _wait_ready(server: PostgresServer, process: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + START_TIMEOUT_SECONDS
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise RuntimeError(f"postgres exited with {process.returncode}:\n{_tail(server.log)}")
        try:
            with psycopg.connect(server.url("postgres"), connect_timeout=2):
                return
        except psycopg.OperationalError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"postgres not ready within {START_TIMEOUT_SECONDS:.0f} s:\n{_tail(server.log)}")


def _stop(process: subprocess.Popen[bytes]) -> None:
    # SIGINT: fast shutdown (clients disconnected, then a clean stop); SIGQUIT: immediate shutdown,
    # which still takes the backends down with it; SIGKILL only if even that hangs.
    for sig, timeout in ((signal.SIGINT, STOP_TIMEOUT_SECONDS), (signal.SIGQUIT, 5.0)):
        if process.poll() is not None:
            return
        process.send_signal(sig)
        try:
            process.wait(timeout)
            return
        except subprocess.TimeoutExpired:
            pass
    process.kill()
    process.wait()


@dataclass(frozen=True, slots=True)
class _RunAs:
    """The uid and gid for initdb and postgres; None for both: this process's own."""

    uid: int | None = None
    gid: int | None = None

    def chown(self, path: Path) -> None:
        if self.uid is not None and self.gid is not None:
            os.chown(path, self.uid, self.gid)


def _system_user() -> _RunAs:
    try:
        account = pwd.getpwnam(SYSTEM_USER)
    except KeyError:
        account = None
    require(
        account is not None, f"running as root, and no {SYSTEM_USER!r} user: apt-get install postgresql-15"
    )
    assert account is not None
    return _RunAs(account.pw_uid, account.pw_gid)


@contextlib.contextmanager
def _cluster_home(directory: Path) -> Iterator[tuple[Path, _RunAs]]:
    """Where the cluster goes, and whom to run it as. As root: a fresh directory under the system's
    temp dir, owned by `postgres` (pytest's own temp dirs are 0700 root: that user could not reach
    them), removed on exit."""
    if os.geteuid() != 0:
        yield directory, _RunAs()
        return
    run_as = _system_user()
    home = Path(tempfile.mkdtemp(prefix="gpufleet-postgres-"))
    try:
        run_as.chown(home)
        yield home, run_as
    finally:
        shutil.rmtree(home, ignore_errors=True)


@contextlib.contextmanager
def start_postgres(directory: Path) -> Iterator[PostgresServer]:
    """Run a fresh PostgreSQL cluster, its log at `directory`/postgres.log; accepting connections
    on entry, stopped on exit (and, as root, its data removed)."""
    bindir = _bindir()
    directory.mkdir(parents=True, exist_ok=True)
    log = directory / "postgres.log"
    password = secrets.token_hex(16)
    with _cluster_home(directory) as (home, run_as):
        # user/group/extra_groups None: unchanged; else setgroups([]), setgid, setuid in the child.
        extra_groups: list[int] | None = None if run_as.uid is None else []
        data_dir = home / "data"
        pwfile = home / "pwfile"
        pwfile.write_text(password + "\n")
        pwfile.chmod(0o600)
        run_as.chown(pwfile)
        initdb = [
            str(bindir / "initdb"),
            f"--pgdata={data_dir}",
            f"--username={USER}",
            f"--pwfile={pwfile}",
            "--auth=scram-sha-256",
            "--encoding=UTF8",
            "--no-locale",
            "--no-sync",
        ]
        with log.open("wb") as out:
            done = subprocess.run(
                initdb,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                check=False,
                user=run_as.uid,
                group=run_as.gid,
                extra_groups=extra_groups,
                cwd=home,
            )
        pwfile.unlink()
        if done.returncode != 0:
            raise RuntimeError(f"initdb exited with {done.returncode}:\n{_tail(log)}")
        port = free_port()
        command = [
            str(bindir / "postgres"),
            "-D",
            str(data_dir),
            "-h",
            HOST,
            "-p",
            str(port),
            "-k",
            "",  # no Unix-domain socket: TCP on 127.0.0.1 only
            "-c",
            "fsync=off",
            "-c",
            "synchronous_commit=off",
            "-c",
            "full_page_writes=off",
        ]
        with log.open("ab") as out:
            process = subprocess.Popen(
                command,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
                user=run_as.uid,
                group=run_as.gid,
                extra_groups=extra_groups,
                cwd=home,
            )
        try:
            server = PostgresServer(HOST, port, USER, password, data_dir, log)
            _wait_ready(server, process)
            yield server
        finally:
            _stop(process)


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    """One PostgreSQL for the session; `postgres_server.new_database()` gives a test its own
    empty database (a URL)."""
    with start_postgres(tmp_path_factory.mktemp("postgres")) as server:
        yield server
