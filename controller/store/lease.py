"""Which controller leads: one at a time per store, the others wait as standbys.

A controller holds the lease before it loads the fleet, listens or acts; a standby tries again every
POLL_SECONDS and takes over once the leader is gone. Each lead is a term with a number one higher
than the last (the `leader` table, controller/store/leader.py), and every audited action and every
command is written only while the store still names this controller's term: a deposed leader that
has not noticed yet cannot act (Store.add_audit, Store.save_command).

- PostgreSQL: a session advisory lock, on a connection of the lease's own. A leader that dies
  closes it (the lock goes at once); one that hangs or is cut off stops pinging, and the server ends
  its session after SILENCE_SECONDS (`idle_session_timeout`), which frees the lock. The leader pings
  every POLL_SECONDS; a failed ping means the lead is lost, and it stops.
- SQLite: an exclusive lock on the file `<db>.lock` (flock): one controller per file on a host.
"""

from __future__ import annotations

import fcntl
import logging
import os
from typing import IO, Any, Protocol

import psycopg

LEASE_KEY = 0x67706C64  # pg_try_advisory_lock key: "gpld"
POLL_SECONDS = 2.0
SILENCE_SECONDS = 15
CONNECT_TIMEOUT_SECONDS = 5

log = logging.getLogger("gpufleet.controller.store")


class Lease(Protocol):
    """Blocking calls: the store runs them in a thread."""

    def try_acquire(self) -> bool:
        """Take the lease if no one holds it; whether this controller holds it now."""

    def alive(self) -> bool:
        """Whether the lease is still this controller's."""

    def release(self) -> None: ...


class PostgresLease:
    def __init__(self, url: str, description: str) -> None:
        self.url = url
        self.description = description  # no password
        self._conn: psycopg.Connection[Any] | None = None
        self._held = False

    def _connect(self) -> psycopg.Connection[Any]:
        if self._conn is None or self._conn.closed or self._conn.broken:
            self._conn = psycopg.connect(
                self.url,
                autocommit=True,
                connect_timeout=CONNECT_TIMEOUT_SECONDS,
                application_name="gpufleet-controller-lease",
                keepalives=1,
                keepalives_idle=5,
                keepalives_interval=2,
                keepalives_count=3,
            )
            # A leader silent this long (hung, cut off) loses its session, and with it the lock.
            self._conn.execute(f"SET idle_session_timeout = {SILENCE_SECONDS * 1000}")
        return self._conn

    def try_acquire(self) -> bool:
        try:
            row = self._connect().execute("SELECT pg_try_advisory_lock(%s)", (LEASE_KEY,)).fetchone()
        except psycopg.Error as exc:
            log.warning("leader lease on %s: %s", self.description, exc)
            self._drop()
            return False
        self._held = bool(row and row[0])
        return self._held

    def alive(self) -> bool:
        if not self._held or self._conn is None:
            return False
        try:
            self._conn.execute("SELECT 1")
        except psycopg.Error as exc:
            log.error("leader lease on %s lost: %s", self.description, exc)
            self._drop()
            return False
        return True

    def release(self) -> None:
        self._drop()  # closing the session frees the lock

    def _drop(self) -> None:
        self._held = False
        conn, self._conn = self._conn, None
        if conn is not None:
            try:
                conn.close()
            except psycopg.Error as exc:
                log.debug("closing the lease connection: %s", exc)


class FileLease:
    """flock on `<db>.lock`; an in-memory store has nothing to share, so its lease is always held."""

    def __init__(self, path: str) -> None:
        self.path = None if path == ":memory:" else f"{path}.lock"
        self._file: IO[str] | None = None

    def try_acquire(self) -> bool:
        if self.path is None:
            return True
        if self._file is None:
            self._file = open(self.path, "a+")  # noqa: SIM115 - held open for as long as the lead
        try:
            fcntl.flock(self._file.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return False
        self._file.seek(0)
        self._file.truncate()
        self._file.write(f"{os.getpid()}\n")  # who holds it, for a person looking
        self._file.flush()
        return True

    def alive(self) -> bool:
        return True  # a lock this process holds goes only with the process

    def release(self) -> None:
        if self._file is not None:
            self._file.close()  # closing frees the lock
            self._file = None


class BothLeases:
    """An election lease held first (a Kubernetes Lease: who leads), then the store's own (one
    writer, whatever the election says). Held while both are."""

    def __init__(self, election: Lease, store: Lease) -> None:
        self.election = election
        self.store = store

    def try_acquire(self) -> bool:
        # Elected but the store still locked (the previous leader's session not yet gone): the
        # election is kept (renewed at each try) while the store's lock is tried again.
        return self.election.try_acquire() and self.store.try_acquire()

    def alive(self) -> bool:
        return self.election.alive() and self.store.alive()

    def release(self) -> None:
        self.store.release()  # the writer's lock first: whoever is elected next can then write
        self.election.release()
