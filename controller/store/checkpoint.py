"""WAL checkpoints off the writer's path.

By default SQLite checkpoints inside a committing transaction once the WAL passes 1,000 pages: the
store thread then copies megabytes into the database file and fsyncs it while every frame waiting
on the next commit (and its ack) waits too. Here the writer's connection has automatic checkpoints
off (`PRAGMA wal_autocheckpoint=0`) and this thread, with a connection of its own, runs PASSIVE
checkpoints every `interval` seconds: they copy what the WAL holds while the writer goes on
appending. A busy writer keeps adding while one runs, so the WAL seldom empties and starts over by
itself: once it passes `restart_pages`, a RESTART checkpoint (just after a PASSIVE one, so little
is left to copy) briefly holds the writer and starts the WAL over, so the file stays bounded.

Every 5 s, not every 1 s: each checkpoint syncs the database file, and on the 2-core bench machine
checkpoints every second saturated a 4,000-node controller that 5 s (or SQLite's own) did not
(bench/controller_scale.py, 2026-11-28).
"""

from __future__ import annotations

import logging
import sqlite3
import threading

log = logging.getLogger("gpufleet.controller.store")


class Checkpointer:
    def __init__(self, path: str, *, interval: float = 5.0, restart_pages: int = 8192) -> None:
        self.path = path
        self.interval = interval
        self.restart_pages = restart_pages  # 4 KiB pages: 32 MiB of WAL
        self.checkpoints = 0
        self.restarts = 0
        self.failures = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="gpufleet-checkpoint", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join()

    def _run(self) -> None:
        conn = sqlite3.connect(self.path, isolation_level=None, check_same_thread=False)
        try:
            conn.execute("PRAGMA busy_timeout=5000")
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
                conn.execute("PRAGMA wal_checkpoint(RESTART)").fetchone()
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
