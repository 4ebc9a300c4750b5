"""sql.stream: a large SELECT's rows as read, on both backends: every row once, in order, with the
types the store's rows take (BYTEA as bytes in PostgreSQL's binary rows), over several chunks."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from controller.store import postgres
from controller.store.sql import Conn, stream
from controller.store.store import Store

ROWS = [(f"n{i:02d}", i - 3, "gemm", "bf16", bytes([i, 0, 255]) * (i + 1)) for i in range(10)]


def test_stream_gives_every_row_once_in_order_over_chunks(
    store_db: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(postgres, "STREAM_ROWS", 3)  # 10 rows: four chunks

    def job(conn: Conn) -> list[tuple[Any, ...]]:
        conn.executemany(
            "INSERT INTO probe_series (node, gpu, probe, variant, points) VALUES (?, ?, ?, ?, ?)", ROWS
        )
        rows = list(
            stream(
                conn,
                "SELECT node, gpu, probe, variant, points FROM probe_series WHERE gpu >= ? ORDER BY node",
                (-1,),
            )
        )
        after = conn.execute("SELECT count(*) FROM probe_series").fetchone()[
            0
        ]  # the connection is free again
        return [*rows, (after,)]

    async def body() -> list[tuple[Any, ...]]:
        store = Store(store_db)
        await store.open()
        try:
            return await store._call("test", job)
        finally:
            store.close()

    *rows, (count,) = asyncio.run(body())
    assert [tuple(r) for r in rows] == ROWS[2:]
    assert count == len(ROWS)
    for row in rows:
        assert [type(v) for v in row] == [str, int, str, str, bytes]
