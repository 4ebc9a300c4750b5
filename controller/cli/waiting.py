"""A long operator call (probe-node, retune, approve, drain: up to minutes) says on stderr, when it
is a terminal, what it waits for and for how long; a Ctrl-C cancels the call. Piped or logged,
nothing is added: the answer is all there is."""

from __future__ import annotations

import sys
import time
from typing import Any

from rich.console import Console

from controller.cli.layout import plain

TICK_S = 0.2


def waited(call: Any, what: str, limit: float) -> Any:
    """`call`'s answer (a grpc.Future: `stub.Method.future(...)`), raising what it raises; while it
    runs, `what: 12s (at most 600s)` on a terminal's stderr (`limit` 0: no `at most`)."""
    if not sys.stderr.isatty():
        return call.result()
    started = time.monotonic()
    bound = f" (at most {limit:.0f}s)" if limit else ""
    try:
        with Console(stderr=True).status(plain(f"{what}...")) as status:
            while not call.done():
                status.update(plain(f"{what}: {time.monotonic() - started:.0f}s{bound}"))
                time.sleep(TICK_S)
    except KeyboardInterrupt:
        call.cancel()
        raise
    return call.result()
