"""A command whose reader goes away (`| head`, a closed pager) ends quietly, as Unix tools do; one
interrupted (Ctrl-C) ends in one line, not a traceback."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable

SIGPIPE_STATUS = 141  # 128 + SIGPIPE: what a shell reports for a tool stopped by a closed pipe
INTERRUPTED_STATUS = 130  # 128 + SIGINT


def run(main: Callable[[], int]) -> int:
    """main()'s status; SIGPIPE_STATUS with no traceback when stdout's reader has gone, and
    INTERRUPTED_STATUS with one line on Ctrl-C (a command with more to say catches it itself)."""
    try:
        status = main()
        sys.stdout.flush()  # a closed pipe shows here for output still buffered
    except KeyboardInterrupt:  # `with` and `finally` blocks ran on the way here
        print("gpufleet: interrupted", file=sys.stderr)
        return INTERRUPTED_STATUS
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own flush at exit does not fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return SIGPIPE_STATUS
    return status
