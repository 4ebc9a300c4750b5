"""The SQLite backend's own cases: a full disk, and a file written by an older controller. What both
backends do alike is in test_store.py."""

from __future__ import annotations

import asyncio
import contextlib
import sqlite3
import traceback
import weakref
from pathlib import Path

import pytest

from controller.errors import StoreUnavailable
from controller.store.sql import Conn
from controller.store.sqlite import SqliteBackend
from controller.store.store import Store
from tests.controller.harness import bmc_sample
from tests.controller.store.test_store import hello, run, write


def test_full_disk_is_a_clear_error_and_the_store_recovers(tmp_path: Path) -> None:
    async def go() -> None:
        store = Store(str(tmp_path / "fleet.db"))
        await store.open()
        await store.save_hello(hello(), 1.0)
        # Cap the file at its current size: SQLite answers SQLITE_FULL as on a full disk.
        pages = await store._thread.call(lambda c: c.execute("PRAGMA page_count").fetchone()[0])
        await store._thread.call(lambda c: c.execute(f"PRAGMA max_page_count={pages}"))
        big = write(1)
        big.gpus[0].sample.uuid = "x" * 200_000
        with pytest.raises(StoreUnavailable, match="full"):
            await store.save_frame(big)
        fleet, _ = await store.load()
        assert ("n1", "b1") not in fleet.acked  # nothing half-stored
        await store._thread.call(lambda c: c.execute("PRAGMA max_page_count=1073741823"))
        await store.save_frame(big)
        fleet, _ = await store.load()
        store.close()
        assert fleet.acked[("n1", "b1")] == 1

    run(go())


def test_a_file_written_before_bmc_state_existed_still_opens(tmp_path: Path) -> None:
    path = str(tmp_path / "fleet.db")

    async def older() -> None:
        store = Store(path)
        await store.open()
        await store.save_hello(hello(), 1.0)
        await store.save_frame(write(1))
        store.close()

    run(older())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        conn.execute("DROP TABLE bmc_state")  # as a controller from before the BMC section left it
        conn.commit()
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT count(*) FROM sqlite_master WHERE name = 'bmc_state'").fetchone()[0] == 0

    async def newer() -> None:
        store = Store(path)
        await store.open()
        fleet, _ = await store.load()
        assert fleet.acked[("n1", "b1")] == 1 and fleet.nodes["n1"].bmc is None
        with_bmc = write(2)
        with_bmc.bmc, with_bmc.bmc_time = bmc_sample(1001.0), 1001.0
        await store.save_frame(with_bmc)
        fleet, _ = await store.load()
        store.close()
        assert fleet.nodes["n1"].bmc == bmc_sample(1001.0)

    run(newer())
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA user_version").fetchone()[0] == 1


def test_a_failed_job_hands_the_loop_its_error_without_the_jobs_cursors(tmp_path: Path) -> None:
    """A job's error goes to the event loop's thread. Its traceback held the job's frames, and with
    them any cursor in a local, which then died on the loop's thread: that resets the statement the
    store's thread may be running again at that moment (SQLITE_MISUSE, controller/gc_policy.py)."""
    cursors: list[weakref.ref[sqlite3.Cursor]] = []

    def failing(conn: Conn) -> None:
        cursor = conn.execute("SELECT name FROM nodes")
        assert isinstance(cursor, sqlite3.Cursor)
        cursors.append(weakref.ref(cursor))
        raise ValueError("the job's own error")

    async def go() -> BaseException:
        store = Store(str(tmp_path / "fleet.db"))
        await store.open()
        try:
            with pytest.raises(ValueError, match="own error") as caught:
                await store._thread.call(failing)
            return caught.value
        finally:
            store.close()

    error = run(go())
    assert "failing" in "".join(traceback.format_tb(error.__traceback__))  # still says where
    assert cursors[0]() is None, "the job's cursor outlived its frame, held by the error's traceback"


def _held(db: Path) -> sqlite3.Connection:
    """Another process's writer (a replica beside this one on the file) holding the write lock."""
    other = sqlite3.connect(db, isolation_level=None, check_same_thread=False)
    other.execute("BEGIN IMMEDIATE")
    return other


def _quick(db: Path) -> Store:
    """A store that waits 50 ms, not 5 s, on another connection's lock before a statement fails."""
    store = Store(str(db))
    assert isinstance(store.backend, SqliteBackend)
    store.backend.busy_timeout_ms = 50
    return store


def test_a_batch_waits_out_another_writer_holding_the_file(tmp_path: Path) -> None:
    """Past the busy timeout, a batch was failed whole: up to 512 agents' frames and Hellos, their
    streams ended "store unavailable: database is locked", their agents reconnecting."""

    async def go() -> None:
        store = _quick(tmp_path / "fleet.db")
        await store.open()
        other = _held(tmp_path / "fleet.db")
        asyncio.get_running_loop().call_later(0.5, other.execute, "COMMIT")
        assert await store.save_hello(hello(), 1.0) == 0
        await store.save_frame(write(1))
        fleet, _ = await store.load()
        store.close()
        other.close()
        assert fleet.acked[("n1", "b1")] == 1
        assert (
            store.lock_waits >= 2
        )  # tried again, 50 ms at a time (gpufleet_controller_store_lock_waits_total)

    run(go())


def test_a_writer_holding_the_file_too_long_is_a_clear_error_and_nothing_is_half_stored(
    tmp_path: Path,
) -> None:
    async def go() -> None:
        store = _quick(tmp_path / "fleet.db")
        await store.open()
        store._thread.lock_wait_seconds = 0.3
        other = _held(tmp_path / "fleet.db")
        with pytest.raises(StoreUnavailable, match="store unavailable: database is locked"):
            await store.save_hello(hello(), 1.0)
        other.execute("COMMIT")
        other.close()
        fleet, _ = await store.load()
        assert "n1" not in fleet.nodes
        assert await store.save_hello(hello(), 1.0) == 0  # the store goes on once the file is free
        store.close()

    run(go())
