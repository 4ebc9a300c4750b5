"""The SQLite backend: one file in WAL mode (":memory:" for tests), the schema's version in
`PRAGMA user_version`, and WAL checkpoints in a thread of their own (controller/store/checkpoint.py)."""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

from controller.store.backends import SCHEMA_VERSION, Connection, schema_statements
from controller.store.checkpoint import Checkpointer
from controller.store.lease import FileLease, Lease

BUSY_TIMEOUT_MS = 5000  # how long a statement waits on another connection's lock before it fails
LOCKED_OUT = (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


class SqliteBackend:
    begin = "BEGIN IMMEDIATE"
    skip_locked = ""
    errors: tuple[type[BaseException], ...] = (sqlite3.Error,)

    def __init__(self, path: str, *, synchronous: str = "full") -> None:
        self.path = path
        self.busy_timeout_ms = BUSY_TIMEOUT_MS
        self.description = path
        self.synchronous = synchronous.upper()
        # WAL checkpoints in a thread of their own, not inside a commit (controller/store/checkpoint.py).
        self.checkpointer = Checkpointer(path) if path != ":memory:" else None

    def connect(self) -> Connection:
        if self.path != ":memory:":
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        if self.path != ":memory:":
            conn.execute("PRAGMA journal_mode=WAL")
            conn.execute("PRAGMA wal_autocheckpoint=0")  # the Checkpointer's work (checkpoint.py)
        conn.execute(f"PRAGMA synchronous={self.synchronous}")
        conn.execute(f"PRAGMA busy_timeout={self.busy_timeout_ms}")
        return conn

    def lease(self) -> Lease:
        return FileLease(self.path)

    def init(self, conn: Connection) -> None:
        version = conn.execute("PRAGMA user_version").fetchone()[0]
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"store schema version {version} is newer than this controller ({SCHEMA_VERSION})"
            )
        for statement in schema_statements():
            conn.execute(statement)
        conn.execute(f"PRAGMA user_version={SCHEMA_VERSION}")

    def broken(self, conn: Connection) -> bool:
        return False  # a file: nothing to reconnect to

    def locked_out(self, exc: BaseException) -> bool:
        code = getattr(exc, "sqlite_errorcode", None)
        return isinstance(exc, sqlite3.OperationalError) and code is not None and code & 0xFF in LOCKED_OUT

    @contextlib.contextmanager
    def short_lock_waits(self, conn: Connection, seconds: float) -> Iterator[None]:
        yield  # BEGIN IMMEDIATE took the whole file: no row inside waits on another writer

    def start(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.start()

    def stop(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.stop()
