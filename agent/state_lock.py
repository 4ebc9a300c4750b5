"""One running agent per state directory (the spool, the commands' memory, the tuning journal).

Two agents on one node with one --spool-dir (the DaemonSet's, and one started by hand to look at
something) each took the other's frames for an older boot's, resent them and deleted them once
acked, and shared one tuning journal: one agent's start finished or rolled back the other's apply.
The second agent is refused at start instead, naming the first one's pid. The lock is an flock on
`<dir>/.agent.lock`: the kernel drops it when its holder dies, however it dies.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path
from typing import IO

LOCK_FILE = ".agent.lock"


class StateInUse(Exception):
    """Another running agent holds the directory."""


class StateLock:
    """The locks this agent holds, released by close() (or when the process ends)."""

    def __init__(self) -> None:
        self._files: list[IO[str]] = []

    def take(self, directory: str, what: str) -> None:
        """Lock `directory` for this agent; StateInUse when another one holds it. A directory that
        cannot be made or written is left to its user to report (the spool keeps frames in memory)."""
        path = Path(directory) / LOCK_FILE
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            f = open(path, "a+")  # noqa: SIM115 - held open: the lock lives as long as the file
        except OSError:
            return
        try:
            fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            f.seek(0)
            holder = f.read().strip() or "?"
            f.close()
            raise StateInUse(
                f"{what} {directory} is in use by another agent on this machine (pid {holder}): "
                "two agents would resend and delete each other's frames and share one tuning journal"
            ) from None
        except OSError:  # a filesystem without locks: nothing to take
            f.close()
            return
        f.seek(0)
        f.truncate()
        f.write(f"{os.getpid()}\n")
        f.flush()
        self._files.append(f)

    def close(self) -> None:
        for f in self._files:
            with contextlib.suppress(OSError):
                f.close()
        self._files = []
