"""The event loops the controller runs on (controller/event_loop.py), for tests run on each."""

from __future__ import annotations

import os

from controller.pipe_sizes import PIPE_BYTES, PIPE_MAX

LOOPS = ["asyncio", "uvloop"]
# The pid of each fork an at-fork handler saw begin in this process: the controller starts its
# processes without one (controller/children.py). There is no unregistering it.
FORKS: list[int] = []
os.register_at_fork(before=lambda: FORKS.append(os.getpid()))


def pipe_capacity() -> int:
    """What the controller's pipes to its processes hold (controller/children.py starts them with
    pipes on either loop)."""
    return min(PIPE_BYTES, int(PIPE_MAX.read_text()))
