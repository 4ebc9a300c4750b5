"""The PostgreSQL backend (`--db postgresql://USER:PASSWORD@HOST:PORT/DATABASE`), through psycopg 3.

The store's SQL is written once, with sqlite3's `?` placeholders (controller/store/sql.py); here it
is turned into psycopg's `%s` form (once per statement text). The schema is schema.sql with
PostgreSQL's names for its types: BYTEA for BLOB, DOUBLE PRECISION for REAL, BIGINT for INTEGER,
and text compared byte by byte (COLLATE "C"), as SQLite compares it, so that pages of findings come
in the same order from either. The schema's version is kept in `gpufleet_schema`; replicas that
start together take an advisory lock to create it one at a time.

A lost connection fails the batch it was in (nothing acked), and the next batch connects again.
No message carries the URL's password.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

import psycopg
from psycopg import pq

from controller.db_url import redact_url
from controller.errors import RowBusy
from controller.store.backends import SCHEMA_VERSION, Connection, schema_statements
from controller.store.lease import Lease
from controller.store.postgres_lease import PostgresLease

CONNECT_TIMEOUT_SECONDS = 10
STREAM_ROWS = 2000  # rows fetched at a time by PgConnection.stream
_SCHEMA_LOCK = 0x67707566  # pg_advisory_xact_lock key: "gpuf"
_TYPES = (
    (re.compile(r"\bBLOB\b"), "BYTEA"),
    (re.compile(r"\bREAL\b"), "DOUBLE PRECISION"),
    (re.compile(r"\bINTEGER\b"), "BIGINT"),
    (re.compile(r"\bTEXT\b"), 'TEXT COLLATE "C"'),
)


@lru_cache(maxsize=1024)
def to_psycopg(sql: str) -> bytes:
    """`?` placeholders as `%s` (a literal % doubled). The store's statements hold no ? or % in
    string literals."""
    return sql.replace("%", "%%").replace("?", "%s").encode()


def schema() -> list[str]:
    """schema.sql's statements in PostgreSQL's types (comments left out)."""
    statements = []
    for statement in schema_statements():
        lines = []
        for line in statement.splitlines():
            code = line.split("--", 1)[0]
            for pattern, name in _TYPES:
                code = pattern.sub(name, code)
            if code.strip():
                lines.append(code)
        if lines:
            statements.append("\n".join(lines))
    return statements


class PgConnection:
    """A psycopg connection with sqlite3's face: execute/executemany with `?`, in_transaction."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw

    def execute(self, sql: str, parameters: Any = (), /) -> psycopg.Cursor[Any]:
        return self.raw.execute(to_psycopg(sql), parameters or None)

    def executemany(self, sql: str, parameters: Any, /) -> psycopg.Cursor[Any]:
        cursor = self.raw.cursor()
        cursor.executemany(to_psycopg(sql), parameters)
        return cursor

    def stream(self, sql: str, parameters: Any = (), /) -> Iterator[Any]:
        """The rows as fetched, STREAM_ROWS at a time (libpq's chunked mode), in binary: the whole
        result is never held by libpq, and a BYTEA crosses as its bytes, not as hex twice its size."""
        cursor = self.raw.cursor()
        return cursor.stream(to_psycopg(sql), parameters or None, binary=True, size=STREAM_ROWS)

    @property
    def in_transaction(self) -> bool:
        return self.raw.info.transaction_status != pq.TransactionStatus.IDLE

    def close(self) -> None:
        self.raw.close()


class PostgresBackend:
    begin = "BEGIN"
    skip_locked = " FOR NO KEY UPDATE SKIP LOCKED"
    errors: tuple[type[BaseException], ...] = (psycopg.Error,)

    def __init__(self, url: str) -> None:
        self.url = url
        self.description = redact_url(url)

    def connect(self) -> Connection:
        try:
            raw = psycopg.connect(
                self.url,
                autocommit=True,  # transactions are the writer's BEGIN ... COMMIT
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name="gpufleet-controller",
            )
        except psycopg.Error as exc:
            # psycopg names host and port, never the password; say which store it was.
            raise psycopg.OperationalError(f"{self.description}: {exc}".strip()) from None
        return PgConnection(raw)

    def lease(self) -> Lease:
        return PostgresLease(self.url, self.description)

    def init(self, conn: Connection) -> None:
        conn.execute("SELECT pg_advisory_xact_lock(?)", (_SCHEMA_LOCK,))
        conn.execute("CREATE TABLE IF NOT EXISTS gpufleet_schema (version BIGINT NOT NULL)")
        row = conn.execute("SELECT max(version) FROM gpufleet_schema").fetchone()
        version = 0 if row is None or row[0] is None else int(row[0])
        if version > SCHEMA_VERSION:
            raise RuntimeError(
                f"store schema version {version} is newer than this controller ({SCHEMA_VERSION})"
            )
        for statement in schema():
            conn.execute(statement)
        if version < SCHEMA_VERSION:
            conn.execute("DELETE FROM gpufleet_schema")
            conn.execute("INSERT INTO gpufleet_schema (version) VALUES (?)", (SCHEMA_VERSION,))

    def broken(self, conn: Connection) -> bool:
        raw = conn.raw if isinstance(conn, PgConnection) else None
        return raw is None or raw.closed or raw.broken

    def locked_out(self, exc: BaseException) -> bool:
        return False  # BEGIN takes no lock; a row's lock wait ends in RowBusy (short_lock_waits)

    @contextlib.contextmanager
    def short_lock_waits(self, conn: Connection, seconds: float) -> Iterator[None]:
        # SET LOCAL lasts to the transaction's end (or the job's savepoint rolled back): put back.
        conn.execute(f"SET LOCAL lock_timeout = {max(1, round(seconds * 1000))}")
        try:
            yield
        except psycopg.errors.LockNotAvailable as exc:
            raise RowBusy(f"store: a row stayed locked by another transaction ({exc})") from None
        conn.execute("SET LOCAL lock_timeout = DEFAULT")

    def start(self) -> None:
        pass  # PostgreSQL checkpoints by itself

    def stop(self) -> None:
        pass
