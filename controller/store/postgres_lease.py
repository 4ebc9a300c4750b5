"""The PostgreSQL leader lease (controller/store/lease.py): a session advisory lock, on a connection
of the lease's own. A leader that dies closes it (the lock goes at once); one that hangs or is cut
off stops pinging, and the server ends its session after SILENCE_SECONDS (`idle_session_timeout`),
which frees the lock. The leader pings every POLL_SECONDS; a failed ping means the lead is lost, and
it stops. Its own module, as the PostgreSQL backend: psycopg is imported only by a controller that
uses PostgreSQL."""

from __future__ import annotations

import logging
from typing import Any

import psycopg

LEASE_KEY = 0x67706C64  # pg_try_advisory_lock key: "gpld"
SILENCE_SECONDS = 15
CONNECT_TIMEOUT_SECONDS = 5

log = logging.getLogger("gpufleet.controller.store")


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
