"""The store's tests run on both backends: `store_db` is an SQLite file in tmp_path, then an empty
database on the session's real PostgreSQL server (tests/postgres_server.py).

    def test_x(store_db: str) -> None:
        store = Store(store_db)
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.postgres_server import PostgresServer

__all__ = ["store_db"]


@pytest.fixture(params=["sqlite", "postgresql"])
def store_db(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "fleet.db")
    server: PostgresServer = request.getfixturevalue("postgres_server")
    return server.new_database()
