"""The event loops the controller runs on (controller/event_loop.py), for tests run on each."""

from __future__ import annotations

from pathlib import Path

from controller.pipe_sizes import PIPE_BYTES, PIPE_MAX

LOOPS = ["asyncio", "uvloop"]
WMEM_MAX = Path("/proc/sys/net/core/wmem_max")  # the most a Unix socket's send buffer may be asked


def pipe_capacity(loop: str) -> int:
    """What the controller's pipes to its processes hold on `loop`: real pipes on asyncio's, Unix
    socket pairs on uvloop's (their send buffer)."""
    cap = PIPE_MAX if loop == "asyncio" else WMEM_MAX
    return min(PIPE_BYTES, int(cap.read_text()))
