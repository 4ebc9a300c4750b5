"""Where the store keeps its rows: an SQLite file (controller/store/sqlite.py) or a PostgreSQL
database (controller/store/postgres.py). Both take the same SQL (controller/store/sql.py); a backend
says how to connect, how a transaction starts, which exceptions are the database's, and how to set
up the schema (controller/store/schema.sql, SCHEMA_VERSION)."""

from __future__ import annotations

from contextlib import AbstractContextManager
from importlib import resources
from typing import Protocol

from controller.db_url import is_postgres_url
from controller.store.lease import Lease
from controller.store.sql import Conn

SCHEMA_VERSION = 1


class Connection(Conn, Protocol):
    @property
    def in_transaction(self) -> bool: ...

    def close(self) -> None: ...


class Backend(Protocol):
    description: str  # for logs: the file, or the URL without its password
    begin: str  # the statement that opens a write transaction
    # What a SELECT ends with to pass over the rows another open transaction holds ("" where nothing
    # inside a transaction waits: SQLite's one writer)
    skip_locked: str
    errors: tuple[type[BaseException], ...]  # the database's own exceptions

    def connect(self) -> Connection: ...

    def lease(self) -> Lease:
        """The leader lease of this store (controller/store/lease.py)."""

    def init(self, conn: Connection) -> None:
        """Create what is missing of the schema; refuse a newer schema than SCHEMA_VERSION."""

    def broken(self, conn: Connection) -> bool:
        """Whether this connection is lost and a new one is needed."""

    def locked_out(self, exc: BaseException) -> bool:
        """Whether opening a write transaction failed only because another writer held the store
        past the busy timeout (SQLite's one writer: a replica beside this one), so that it may be
        tried again. PostgreSQL's BEGIN waits on nothing."""

    def short_lock_waits(self, conn: Connection, seconds: float) -> AbstractContextManager[None]:
        """Inside it, a statement waits at most `seconds` for a row another transaction locked, then
        raises RowBusy (the rest of the transaction waits as before). PostgreSQL's row locks only:
        SQLite has one writer at a time, and nothing inside a transaction waits."""

    def start(self) -> None:
        """Background upkeep once the schema is there (SQLite's WAL checkpoints)."""

    def stop(self) -> None: ...


def open_backend(db: str, *, synchronous: str = "full") -> Backend:
    """The backend `db` names (controller/config.py check_db: a postgresql:// URL, or an SQLite file)."""
    if is_postgres_url(db):
        from controller.store.postgres import PostgresBackend

        return PostgresBackend(db)
    from controller.store.sqlite import SqliteBackend

    return SqliteBackend(db, synchronous=synchronous)


def schema_statements() -> list[str]:
    """schema.sql's statements, as SQLite takes them."""
    schema = resources.files("controller.store").joinpath("schema.sql").read_text()
    return [s for s in schema.split(";") if s.strip()]
