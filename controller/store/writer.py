"""One thread owns the store's connection; calls queue up and are committed together.

Group commit: every job waiting when a transaction starts joins it, each in its own savepoint (one
failing job does not undo the others), and all are answered after the single COMMIT. So an ack
sent for a job's result means that result is on disk, at one fsync per batch rather than per frame.

Savepoints only where they are needed. A job alone in its batch runs without one (its failure rolls
back the transaction, which held nothing else). A batch of jobs that may run twice (`replayable`:
what they do is in the database only, as a frame's write) runs without them too; if one of its jobs
fails, the transaction is rolled back and the batch runs again, each job in its savepoint. On
PostgreSQL each SAVEPOINT and RELEASE is a round trip: 0.26-0.36 ms of the controller's CPU per
job of the 0.73-0.85 ms a frame's write took alone (psycopg; SQLite's are a few microseconds).
Such jobs queued one after another may also run as one (`together`: one call for all, as a group's
frames write their ack positions in one statement); if that call fails, the batch runs again, each
job on its own in its savepoint.

Commit pacing (`pace_seconds`, the controller's db_commit_interval_seconds): a transaction begins
at most that often, so the jobs queued meanwhile join it. Where a sync is quick (a fast disk, a
host's write cache) the batches were otherwise of one or two frames: at 2,000 nodes 160 commits a
second, each with its locks, WAL pages, sync and wake-up of the event loop. A job that comes after
a quiet spell starts its transaction at once; one that comes within pace_seconds of the last
waits the rest of it.

A write transaction that cannot start because another writer holds the store past the busy
timeout (SQLite's one writer: a replica beside this one on the same file) is tried again, up to
LOCK_WAIT_SECONDS in all, before its batch fails: failed, its jobs (up to MAX_BATCH agents' frames
and Hellos) ended their agents' streams, and the agents reconnecting added to the load
(bench/results/2026-11-30_h200host_controller_scale_sqlite_replicas.txt).

A connection the backend reports lost (PostgreSQL's server gone) fails its batch and is opened
again for the next one; a batch that cannot connect fails with StoreUnavailable, so nothing is acked.
"""

from __future__ import annotations

import asyncio
import logging
import math
import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from controller.errors import StoreUnavailable
from controller.store.backends import Backend, Connection

T = TypeVar("T")
Outcome = tuple[asyncio.Future[Any], Any, BaseException | None]  # a job's future, result, error

log = logging.getLogger("gpufleet.controller.store")
MAX_BATCH = 512
LOCK_WAIT_SECONDS = 30.0  # how long a batch waits, in all, for another writer to let go of the store
JOB_ERRORS_SAID = 64  # distinct (job, error) pairs logged as warnings; the rest at debug


@dataclass(frozen=True, slots=True)
class Together:
    """A job that may run as one with the jobs next to it in its batch that share `run`:
    run(connection, [their items, in order]) does what each job alone would, and returns their
    results in order (it raises, any error, when it cannot do it for every one of them)."""

    run: Callable[[Connection, list[Any]], list[Any]]
    item: Any


# fn, its future, the future's loop, whether fn may run twice (replayable), what runs it together
# with its neighbours (or None)
Job = tuple[
    Callable[[Connection], Any], asyncio.Future[Any], asyncio.AbstractEventLoop, bool, Together | None
]
JobOutcome = tuple[Job, Any, BaseException | None]


class StoreThread:
    def __init__(
        self, backend: Backend, *, pace_seconds: float = 0.0, lock_wait_seconds: float = LOCK_WAIT_SECONDS
    ) -> None:
        self.backend = backend
        self.pace_seconds = pace_seconds
        self.lock_wait_seconds = lock_wait_seconds
        self.lock_waits = 0  # transactions tried again: another writer held the store past its timeout
        self._stopping = threading.Event()
        self._last_begin = -math.inf
        self._conn: Connection | None = None
        self._jobs: queue.SimpleQueue[Job | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="gpufleet-store", daemon=True)
        self._started = False
        self._said: set[tuple[str, str]] = set()
        self.batches_run_again = 0  # replayable batches in which a job failed: run again in savepoints

    def start(self) -> None:
        self._thread.start()
        self._started = True

    async def call(
        self, fn: Callable[[Connection], T], *, replayable: bool = False, together: Together | None = None
    ) -> T:
        """Run fn(connection) in the store thread inside a transaction; return once committed."""
        return await self.submit(fn, replayable=replayable, together=together)

    def submit(
        self, fn: Callable[[Connection], T], *, replayable: bool = False, together: Together | None = None
    ) -> asyncio.Future[T]:
        """Queue fn at once (jobs run in the order queued); the future settles once committed.
        `replayable`: fn may run twice, its first run rolled back (all it does is in the database),
        so a batch of such jobs needs no savepoint per job (the module's docstring); `together`
        (replayable ones only): how it may run as one with its neighbours."""
        if not self._started:
            raise RuntimeError("store thread not started")
        if together is not None and not replayable:
            raise ValueError("only a replayable job may run together with others")
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._jobs.put((fn, future, loop, replayable, together))
        return future

    def stop(self) -> None:
        if self._started:
            self._stopping.set()  # a batch waiting on another writer's lock fails at its next try
            self._jobs.put(None)
            self._thread.join()
            self._started = False

    def _run(self) -> None:
        try:
            while True:
                job = self._jobs.get()
                if job is None:
                    return
                if self.pace_seconds > 0:
                    wait = self._last_begin + self.pace_seconds - time.monotonic()
                    if wait > 0:
                        time.sleep(wait)  # what is queued meanwhile joins this transaction
                    self._last_begin = time.monotonic()
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
                self._run_batch(batch)
                if stopping:
                    return
        finally:
            if self._conn is not None:
                self._close()

    def _connection(self) -> Connection:
        if self._conn is not None and self.backend.broken(self._conn):
            log.warning("store connection to %s lost; connecting again", self.backend.description)
            self._close()
        if self._conn is None:
            self._conn = self.backend.connect()
        return self._conn

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except self.backend.errors as exc:
                log.debug("closing the store connection: %s", exc)

    def _run_batch(self, batch: list[Job]) -> None:
        failures: tuple[type[BaseException], ...] = (*self.backend.errors, OSError)
        try:
            conn = self._connection()
            outcomes = None
            if len(batch) == 1 or all(job[3] for job in batch):
                outcomes = self._at_once(conn, batch)
            if outcomes is None:
                outcomes = self._one_by_one(conn, batch)
        except failures as exc:
            # Disk full, I/O error, locked, server gone: nothing in this batch is stored, so nothing
            # may be acked.
            log.error("store transaction failed: %s", exc)
            self._abandon()
            failure: BaseException = self._translate(exc)
            outcomes = [(job, None, failure) for job in batch]
        # One wake-up of each loop for the whole batch, not one per job: the self-pipe write and
        # read of a call_soon_threadsafe per frame were a few percent of the controller's CPU.
        by_loop: dict[asyncio.AbstractEventLoop, list[Outcome]] = {}
        for (_, future, loop, _, _), result, error in outcomes:
            by_loop.setdefault(loop, []).append((future, result, error))
        for loop, settled in by_loop.items():
            try:
                loop.call_soon_threadsafe(_settle_all, settled)
            except RuntimeError:  # that loop is closed: nobody is left to wait on these
                log.debug("store: %d results for a closed event loop dropped", len(settled))

    def _at_once(self, conn: Connection, batch: list[Job]) -> list[JobOutcome] | None:
        """The batch in one transaction, no savepoints: a job alone, or jobs that may run twice.
        None when one of several failed: all rolled back, to run again one by one."""
        self._begin(conn)
        results: list[Any] = []
        for run in _runs(batch):
            try:
                if len(run) == 1:
                    results.append(run[0][0](conn))
                else:
                    together = run[0][4]
                    assert together is not None
                    done = together.run(conn, [job[4].item for job in run if job[4] is not None])
                    if len(done) != len(run):
                        raise RuntimeError(f"{len(done)} results for {len(run)} jobs run together")
                    results += done
            except Exception as exc:
                if self._transaction_lost(conn, exc):
                    raise
                conn.execute("ROLLBACK")
                if len(batch) > 1:
                    self.batches_run_again += 1
                    traceback.clear_frames(exc.__traceback__)
                    return None
                return [(run[0], None, self._job_error(run[0], exc))]
        conn.execute("COMMIT")
        return [(job, result, None) for job, result in zip(batch, results, strict=True)]

    def _one_by_one(self, conn: Connection, batch: list[Job]) -> list[JobOutcome]:
        """The batch in one transaction, each job in its savepoint: one failing is undone alone."""
        outcomes: list[JobOutcome] = []
        self._begin(conn)
        for job in batch:
            conn.execute("SAVEPOINT job")
            try:
                result = job[0](conn)
                conn.execute("RELEASE job")
                outcomes.append((job, result, None))
            except Exception as exc:
                if self._transaction_lost(conn, exc):
                    raise
                conn.execute("ROLLBACK TO job")
                conn.execute("RELEASE job")
                outcomes.append((job, None, self._job_error(job, exc)))
        conn.execute("COMMIT")
        return outcomes

    def _begin(self, conn: Connection) -> None:
        """Open the batch's transaction; another writer holding the store past the busy timeout is
        waited out, up to lock_wait_seconds in all (the module's docstring)."""
        deadline = time.monotonic() + self.lock_wait_seconds
        while True:
            try:
                conn.execute(self.backend.begin)
                return
            except self.backend.errors as exc:
                gave_up = self._stopping.is_set() or time.monotonic() >= deadline
                if gave_up or not self.backend.locked_out(exc):
                    raise
                self.lock_waits += 1
                if self.lock_waits == 1 or self.lock_waits % 100 == 0:
                    log.warning(
                        "store: another writer holds %s; waiting for it (%d waits so far, %.0f s at most "
                        "a batch): %s",
                        self.backend.description,
                        self.lock_waits,
                        self.lock_wait_seconds,
                        exc,
                    )

    def _transaction_lost(self, conn: Connection, exc: Exception) -> bool:
        """Whether a job's error ended the whole transaction (SQLite's SQLITE_FULL, a lost
        connection): the batch fails as a whole."""
        return isinstance(exc, self.backend.errors) and (not conn.in_transaction or self.backend.broken(conn))

    def _job_error(self, job: Job, exc: Exception) -> BaseException:
        if isinstance(exc, self.backend.errors):
            self._job_failed(job[0], exc)
        return self._translate(exc)

    def _job_failed(self, fn: Callable[[Connection], Any], exc: BaseException) -> None:
        """Say which job the database refused: the caller sees only "store unavailable: ..." (an
        agent's stream ending UNAVAILABLE), not what was being written. Each distinct (job, error)
        once as a warning; repeats (a PostgreSQL lock wait timing out in a storm) at debug."""
        job = getattr(fn, "__qualname__", type(fn).__name__)
        key = (job, f"{type(exc).__name__}: {exc}")
        first = key not in self._said and len(self._said) < JOB_ERRORS_SAID
        if first:
            self._said.add(key)
        log.log(
            logging.WARNING if first else logging.DEBUG,
            "store job %s failed (its part of the batch rolled back, the rest committed): %s",
            *key,
        )

    def _abandon(self) -> None:
        """Roll back what the failed batch left open; a connection that cannot is dropped."""
        conn = self._conn
        if conn is None:
            return
        try:
            if not self.backend.broken(conn) and conn.in_transaction:
                conn.execute("ROLLBACK")
        except self.backend.errors as exc:
            log.warning("store rollback failed (%s); connecting again for the next batch", exc)
            self._close()

    def _translate(self, exc: BaseException) -> BaseException:
        """The error as the loop's thread gets it. Without the frames its traceback holds: a job's
        (a cursor in a local, say) would be freed on that thread, and a cursor must die on this
        one (controller/gc_policy.py says why)."""
        traceback.clear_frames(exc.__traceback__)
        if isinstance(exc, (*self.backend.errors, OSError)):
            return StoreUnavailable(f"store unavailable: {exc}")
        return exc


def _runs(batch: list[Job]) -> list[list[Job]]:
    """The batch cut into runs: next jobs that share a Together's run make one run, any other job
    is a run of its own."""
    runs: list[list[Job]] = []
    for job in batch:
        together = job[4]
        last = runs[-1][-1][4] if runs else None
        if together is not None and last is not None and last.run == together.run:
            runs[-1].append(job)
        else:
            runs.append([job])
    return runs


def _settle_all(settled: list[Outcome]) -> None:
    """Settle a batch's futures in the order their jobs ran."""
    for future, result, error in settled:
        if future.cancelled():
            continue
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)
