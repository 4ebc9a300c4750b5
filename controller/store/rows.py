"""What the stores of node actions share: a table's rows newest first, optionally one node's."""

from __future__ import annotations

from typing import Any

from controller.store.sql import Conn


def newest_rows(conn: Conn, table: str, columns: str, when: str, *, node: str, limit: int) -> list[Any]:
    """Up to `limit` rows of `table` (its `columns`), newest `when` first (ties by id), optionally
    only `node`'s. `table`, `columns` and `when` are the caller's constants, never user input."""
    sql = f"SELECT {columns} FROM {table}"
    args: list[object] = []
    if node:
        sql += " WHERE node = ?"
        args.append(node)
    sql += f" ORDER BY {when} DESC, id LIMIT ?"
    args.append(limit)
    return list(conn.execute(sql, args))
