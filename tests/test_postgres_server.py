"""tests/postgres_server.py: the session's PostgreSQL hands out empty databases of their own, asks
for the password, and listens on 127.0.0.1 only."""

from __future__ import annotations

import psycopg
import pytest

from tests.postgres_server import PostgresServer


def _tables(url: str) -> list[str]:
    with psycopg.connect(url) as conn:
        rows = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = 'public'"
        ).fetchall()
    return [str(row[0]) for row in rows]


def test_each_new_database_is_distinct_empty_and_usable(postgres_server: PostgresServer) -> None:
    first, second = postgres_server.new_database(), postgres_server.new_database()
    assert first != second
    assert first.startswith(f"postgresql://gpufleet:{postgres_server.password}@127.0.0.1:")
    for url in (first, second):
        assert _tables(url) == []
    with psycopg.connect(first) as conn:
        conn.execute("CREATE TABLE node (name text PRIMARY KEY, gpus int NOT NULL)")
        conn.execute("INSERT INTO node VALUES (%s, %s), (%s, %s)", ("n1", 8, "n2", 4))
        conn.commit()
    with psycopg.connect(first) as conn:
        rows = conn.execute("SELECT name, gpus FROM node ORDER BY name").fetchall()
        encoding = conn.execute("SHOW server_encoding").fetchone()
    assert rows == [("n1", 8), ("n2", 4)]
    assert encoding == ("UTF8",)
    assert _tables(first) == ["node"]
    assert _tables(second) == [], "a table made in one database must not show in another"


def test_a_wrong_password_is_refused(postgres_server: PostgresServer) -> None:
    url = postgres_server.url("postgres").replace(postgres_server.password, "not-the-password")
    with pytest.raises(psycopg.OperationalError, match="password authentication failed"):
        psycopg.connect(url, connect_timeout=5).close()


def test_it_listens_on_127_0_0_1_only(postgres_server: PostgresServer) -> None:
    assert postgres_server.host == "127.0.0.1"
    with psycopg.connect(postgres_server.url("postgres")) as conn:
        settings = conn.execute(
            "SELECT current_setting('listen_addresses'), current_setting('unix_socket_directories'),"
            " host(inet_server_addr()), inet_server_port()"
        ).fetchone()
    assert settings == ("127.0.0.1", "", "127.0.0.1", postgres_server.port)
    # 127.0.0.2 is loopback too on Linux, but not the address the server bound: refused.
    other = postgres_server.url("postgres").replace("@127.0.0.1:", "@127.0.0.2:")
    with pytest.raises(psycopg.OperationalError):
        psycopg.connect(other, connect_timeout=5).close()
