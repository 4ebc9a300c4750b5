"""Which controller leads: one at a time per store, the others wait as standbys.

A controller holds the lease before it loads the fleet, listens or acts; a standby tries again every
POLL_SECONDS and takes over once the leader is gone. Each lead is a term with a number one higher
than the last (the `leader` table, controller/store/leader.py), and every audited action and every
command is written only while the store still names this controller's term: a deposed leader that
has not noticed yet cannot act (Store.add_audit, Store.save_command).

- PostgreSQL: a session advisory lock, on a connection of the lease's own
  (controller/store/postgres_lease.py).
- SQLite: an exclusive lock on the file `<db>.lock` (flock): one controller per file on a host.
"""

from __future__ import annotations

import fcntl
import os
from typing import IO, Protocol

POLL_SECONDS = 2.0


class Lease(Protocol):
    """Blocking calls: the store runs them in a thread."""

    def try_acquire(self) -> bool:
        """Take the lease if no one holds it; whether this controller holds it now."""

    def alive(self) -> bool:
        """Whether the lease is still this controller's."""

    def release(self) -> None: ...


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
