"""Wider pipes to the controller's own processes (the detection process, ingest fronts).

A pipe holds 64 KiB by default, and an event loop moves at most that through it per turn: at a few
hundred frames a second, on a loop busy enough that a turn takes tens of milliseconds, that is
fewer bytes a second than the frames carry, and the rest waits in the loop's buffers (memory, and
a pass request queued behind them). A pipe of PIPE_BYTES moves sixteen times as much per turn.
"""

from __future__ import annotations

import asyncio
import contextlib
import fcntl
import logging
import os
import stat
from pathlib import Path

log = logging.getLogger("gpufleet.controller")
PIPE_BYTES = 1 << 20
PIPE_MAX = Path("/proc/sys/fs/pipe-max-size")  # what an unprivileged process may ask for


def widen(transport: asyncio.BaseTransport, size: int = PIPE_BYTES) -> int:
    """Ask for a pipe of `size` bytes (at most the system's pipe-max-size) under this pipe
    transport; a read transport then also reads that much at once. The capacity it has (0 where
    not a pipe)."""
    pipe = transport.get_extra_info("pipe")
    if pipe is None:
        return 0
    fd = pipe.fileno()
    if not stat.S_ISFIFO(os.fstat(fd).st_mode):
        return 0
    with contextlib.suppress(OSError, ValueError):
        size = min(size, int(PIPE_MAX.read_text()))
    try:
        got = fcntl.fcntl(fd, fcntl.F_SETPIPE_SZ, size)
    except OSError as exc:  # refused (a lower limit, another system): the default capacity stays
        log.debug("pipe size %d refused: %s", size, exc)
        got = fcntl.fcntl(fd, fcntl.F_GETPIPE_SZ)
    if isinstance(transport, asyncio.ReadTransport) and hasattr(transport, "max_size"):
        transport.max_size = max(transport.max_size, got)  # asyncio's read size per turn (256 KiB)
    return int(got)
