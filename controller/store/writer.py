"""One thread owns the SQLite connection; calls queue up and are committed together.

Group commit: every job waiting when a transaction starts joins it, each in its own savepoint (one
failing job does not undo the others), and all are answered after the single COMMIT. So an ack
sent for a job's result means that result is on disk, at one fsync per batch rather than per frame.
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from controller.errors import StoreUnavailable

T = TypeVar("T")
Job = tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any], asyncio.AbstractEventLoop]

log = logging.getLogger("gpufleet.controller.store")
MAX_BATCH = 512


class StoreThread:
    def __init__(self, connect: Callable[[], sqlite3.Connection]) -> None:
        self._connect = connect
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpufleet-store", daemon=True)
        self._started = False

    def start(self) -> None:
        self._thread.start()
        self._started = True

    async def call(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run fn(connection) in the store thread inside a transaction; return once committed."""
        return await self.submit(fn)

    def submit(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Queue fn at once (jobs run in the order queued); the future settles once committed."""
        if not self._started:
            raise RuntimeError("store thread not started")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, future, loop))
        return future

    def stop(self) -> None:
        if self._started:
            self._jobs.put(None)
            self._thread.join()
            self._started = False

    def _run(self) -> None:
        conn = self._connect()
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                batch = [job]
                stopping = False
                while len(batch) < MAX_BATCH:
                    try:
                        more = self._jobs.get_nowait()
                    except queue.Empty:
                        break
                    if more is None:
                        stopping = True
                        break
                    batch.append(more)
                self._run_batch(conn, batch)
                if stopping:
                    return
        finally:
            conn.close()

    def _run_batch(self, conn: sqlite3.Connection, batch: list[Job]) -> None:
        outcomes: list[tuple[Job, Any, BaseException | None]] = []
        try:
            conn.execute("BEGIN IMMEDIATE")
            for job in batch:
                conn.execute("SAVEPOINT job")
                try:
                    result = job[0](conn)
                    conn.execute("RELEASE job")
                    outcomes.append((job, result, None))
                except Exception as exc:
                    if isinstance(exc, sqlite3.Error) and not conn.in_transaction:
                        raise  # SQLite abandoned the whole transaction (e.g. SQLITE_FULL)
                    conn.execute("ROLLBACK TO job")
                    conn.execute("RELEASE job")
                    outcomes.append((job, None, _translate(exc)))
            conn.execute("COMMIT")
        except sqlite3.Error as exc:
            # Disk full, I/O error, locked: nothing in this batch is stored, so nothing may be acked.
            log.error("store commit failed: %s", exc)
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            failure: BaseException = _translate(exc)
            outcomes = [(job, None, failure) for job in batch]
        for job, result, error in outcomes:
            _, future, loop = job
            loop.call_soon_threadsafe(_settle, future, result, error)


def _translate(exc: BaseException) -> BaseException:
    if isinstance(exc, sqlite3.OperationalError | sqlite3.DatabaseError):
        return StoreUnavailable(f"store unavailable: {exc}")
    return exc


def _settle(future: asyncio.Future[Any], result: Any, error: BaseException | None) -> None:
    if future.cancelled():
        return
    if error is not None:
        future.set_exception(error)
    else:
        future.set_result(result)
