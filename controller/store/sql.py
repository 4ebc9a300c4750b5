"""What the store's SQL is written against: a connection with sqlite3's `execute`/`executemany`
(`?` placeholders), which both backends give (SQLite's own; PostgreSQL through
controller/store/postgres.py), and the statements both dialects read the same way."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from functools import lru_cache
from typing import Any, Protocol


class Cursor(Protocol):
    @property
    def rowcount(self) -> int: ...

    def fetchone(self) -> Any: ...

    def fetchall(self) -> list[Any]: ...

    def __iter__(self) -> Iterator[Any]: ...


class Conn(Protocol):
    """A connection as the store's row functions use it: `?` placeholders, rows as tuples."""

    def execute(self, sql: str, parameters: Any = ..., /) -> Cursor: ...

    def executemany(self, sql: str, parameters: Any, /) -> Cursor: ...


def stream(conn: Conn, sql: str, parameters: Any = ()) -> Iterator[Any]:
    """The rows of a large SELECT as they are read, not all held at once beside what the caller
    makes of them: SQLite's cursor reads them as asked for, a PostgreSQL connection fetches them in
    chunks, BLOBs as bytes rather than hex (PgConnection.stream)."""
    streaming = getattr(conn, "stream", None)
    if streaming is not None:
        return iter(streaming(sql, parameters))
    return iter(conn.execute(sql, parameters))


@lru_cache(maxsize=64)
def upsert(table: str, columns: str, key: str) -> str:
    """INSERT of every column in `columns` (comma-separated) that replaces the row with the same `key`
    (its primary key columns): SQLite and PostgreSQL both read `ON CONFLICT ... DO UPDATE`."""
    names = [c.strip() for c in columns.split(",")]
    keys = {k.strip() for k in key.split(",")}
    updates = ", ".join(f"{c} = excluded.{c}" for c in names if c not in keys)
    marks = ", ".join("?" for _ in names)
    action = f"DO UPDATE SET {updates}" if updates else "DO NOTHING"
    return f"INSERT INTO {table} ({', '.join(names)}) VALUES ({marks}) ON CONFLICT ({key}) {action}"


def placeholders(values: Sequence[object]) -> str:
    return ", ".join("?" for _ in values)
