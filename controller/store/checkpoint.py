"""WAL checkpoints off the writer's path.

By default SQLite checkpoints inside a committing transaction once the WAL passes 1,000 pages: the
store thread then copies megabytes into the database file and fsyncs it while every frame waiting
on the next commit (and its ack) waits too. Here the writer's connection has automatic checkpoints
off (`PRAGMA wal_autocheckpoint=0`) and this thread, with a connection of its own, runs PASSIVE
checkpoints every `interval` seconds: they copy what the WAL holds while the writer goes on
appending. A busy writer keeps adding while one runs, so the WAL seldom empties and starts over by
itself: once it passes `restart_pages`, a RESTART checkpoint (just after a PASSIVE one, so little
is left to copy) briefly holds the writer and starts the WAL over, so the file stays bounded.

A RESTART holds every writer while it waits for the readers of older snapshots (a replica's take-in
read, a standby's load) to finish: with the writers' own 5 s busy timeout it held them 5 s and their
batches failed with "database is locked" (up to 512 agents' streams each), every interval while a
long read ran. Replicas sharing the file each run a checkpointer, so at 6,000 nodes and more on a
16-core host the writers were held nearly all the time
(bench/results/2026-11-30_h200host_controller_scale_sqlite_replicas.txt). So it waits at most
RESTART_WAIT_MS: a RESTART that readers hold off gives up, is counted (`restarts_held_off`), and is
tried again next interval; the WAL meanwhile grows (no checkpoint can copy past an old reader).

Every 5 s, not every 1 s: each checkpoint syncs the database file, and on the 2-core bench machine
checkpoints every second saturated a 4,000-node controller that 5 s (or SQLite's own) did not
(bench/controller_scale.py, 2026-11-28).
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger("gpufleet.controller.store")
RESTART_WAIT_MS = 100  # the longest a RESTART holds the writers (its busy timeout), far under theirs
INTERVAL_SECONDS = 5.0  # between two checkpoints (see above)


class Checkpointer:
    def __init__(self, path: str, *, interval: float = INTERVAL_SECONDS, restart_pages: int = 8192) -> None:
        self.path = path
        self.interval = interval
        self.restart_pages = restart_pages  # 4 KiB pages: 32 MiB of WAL
        self.checkpoints = 0
        self.restarts = 0
        self.restarts_held_off = 0  # RESTARTs given up after RESTART_WAIT_MS: a reader held them off
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def connect(self) -> sqlite3.Connection:
        """The checkpointer's connection: it waits RESTART_WAIT_MS at most on others' locks."""
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        conn.execute(f"PRAGMA busy_timeout={RESTART_WAIT_MS}")
        return conn

    def _run(self) -> None:
        conn = self.connect()
        try:
            while not self._stop.wait(self.interval):
                self.run_once(conn)
        finally:
            conn.close()

    def run_once(self, conn: sqlite3.Connection) -> None:
        """One PASSIVE checkpoint (and a RESTART one if the WAL is over its bound); errors are
        logged, counted and tried again next interval (the WAL keeps every commit meanwhile)."""
        try:
            _, wal_pages, _ = conn.execute("PRAGMA wal_checkpoint(PASSIVE)").fetchone()
            self.checkpoints += 1
            if wal_pages > self.restart_pages:
                busy, _, _ = conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
                if busy:
                    self.restarts_held_off += 1
                    if self.restarts_held_off == 1 or self.restarts_held_off % 100 == 0:
                        log.warning(
                            "WAL restart held off by a long read (%d so far; tried again in %.0f s); "
                            "the WAL is %d pages",
                            self.restarts_held_off,
                            self.interval,
                            wal_pages,
                        )
                else:
                    self.restarts += 1
        except sqlite3.Error as exc:
            self.failures += 1
            if self.failures == 1 or self.failures % 100 == 0:
                log.warning(
                    "WAL checkpoint failed (%d so far; tried again in %.0f s): %s",
                    self.failures,
                    self.interval,
                    exc,
                )
