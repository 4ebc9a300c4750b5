"""The PostgreSQL backend's own cases, on a real server (tests/postgres_server.py): a lost
connection, an unreachable server or a wrong password (clear errors, never the password), a newer
schema, and replicas creating the schema at once. What both backends do alike: test_store.py."""

from __future__ import annotations

import asyncio
import logging

import psycopg
import pytest

from controller.errors import StoreUnavailable
from controller.store.store import Store
from tests.controller.store.test_store import hello, run, write
from tests.postgres_server import PostgresServer
from tests.support import free_port


def _terminate_controllers(url: str) -> int:
    """End the controller's connections to this database from the server's side."""
    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute(
            "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity"
            " WHERE application_name = 'gpufleet-controller' AND datname = current_database()"
        ).fetchone()
    assert row is not None
    return int(row[0])


def test_a_lost_connection_fails_its_batch_and_the_next_connects_again(
    postgres_server: PostgresServer, caplog: pytest.LogCaptureFixture
) -> None:
    url = postgres_server.new_database()

    async def go() -> None:
        store = Store(url)
        await store.open()
        await store.save_hello(hello(), 1.0)
        assert _terminate_controllers(url) == 1
        with pytest.raises(StoreUnavailable, match="store unavailable"):
            await store.save_frame(write(1))  # not stored, so not acked: the agent sends it again
        await store.save_frame(write(1))
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 1

    with caplog.at_level(logging.WARNING, logger="gpufleet.controller.store"):
        run(go())
    assert postgres_server.password not in caplog.text


@pytest.mark.parametrize("case", ["unreachable", "wrong password"])
def test_a_store_it_cannot_reach_is_a_clear_error_that_never_shows_the_password(
    postgres_server: PostgresServer, case: str, caplog: pytest.LogCaptureFixture
) -> None:
    if case == "unreachable":
        url = f"postgresql://gf:s3cret-pw@127.0.0.1:{free_port()}/fleet"
        expected = "Connection refused"
    else:
        url = postgres_server.new_database().replace(postgres_server.password, "s3cret-pw")
        expected = "password authentication failed"

    async def go() -> None:
        store = Store(url)
        try:
            with pytest.raises(StoreUnavailable) as caught:
                await store.open()
        finally:
            store.close()
        message = str(caught.value)
        assert expected in message and ":***@127.0.0.1:" in message, message  # which store, no password
        assert "s3cret-pw" not in message
        assert store.description.endswith(url.rsplit("@", 1)[1]) and "s3cret-pw" not in store.description

    with caplog.at_level(logging.DEBUG):
        run(go())
    assert "s3cret-pw" not in caplog.text


def test_a_newer_schema_is_refused(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()

    async def go() -> None:
        store = Store(url)
        await store.open()
        store.close()
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("UPDATE gpufleet_schema SET version = 99")
        store = Store(url)
        try:
            with pytest.raises(RuntimeError, match=r"schema version 99 is newer than this controller \(1\)"):
                await store.open()
        finally:
            store.close()

    run(go())


def test_replicas_opening_at_once_create_the_schema_once(postgres_server: PostgresServer) -> None:
    url = postgres_server.new_database()

    async def go() -> None:
        stores = [Store(url) for _ in range(4)]
        await asyncio.gather(*(s.open() for s in stores))
        await stores[0].save_hello(hello(), 1.0)
        for s in stores:
            fleet, _ = await s.load()
            assert list(fleet.nodes) == ["n1"]
            s.close()

    run(go())
    with psycopg.connect(url) as conn:
        assert conn.execute("SELECT version FROM gpufleet_schema").fetchall() == [(1,)]
