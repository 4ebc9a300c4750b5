"""Agents connecting, disconnecting and replacing their streams, in the controller's log: a line each
while they come a few at a time, a count once a whole fleet reconnects.

After a controller restart or a network partition every agent reconnects within seconds: at 12,500
nodes, 25,000 lines ("agent connected" and "agent disconnected") that bury everything else in the
log, and 4% of the event loop's time in such a storm (py-spy, bench/controller_scale.py
--reconnect-storm). So each kind of line is written one by one up to PER_WINDOW times a
WINDOW_SECONDS window; the others are counted, and when the window ends one line says how many
there were and names the last node ("agents connected: 1980 more in the last 10 s, not logged one
by one; the last: node n1 ..."). The counts are exact, whichever lines were written.

When a network partition heals, the agents reconnect on new connections while the controller still
holds their old ones (until its keepalive finds them dead): each new stream replaces its node's old
one, a warning each ("node n1: stream from A replaced by a newer one from B"), windowed the same way.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass

PER_WINDOW = 50
WINDOW_SECONDS = 10.0


@dataclass(slots=True)
class _Window:
    began: float
    level: int  # the lines' logging level, their count's too
    written: int = 0
    held: int = 0  # lines not written one by one in this window
    last: str = ""  # the last of them, as it would have read


class ConnectionLog:
    """`connected`, `disconnected` and `replaced` write or count a line; `flush` writes the count of
    every window that has ended (called by a timer on the running loop, if there is one, when a
    window first holds a line back)."""

    def __init__(
        self,
        log: logging.Logger,
        *,
        per_window: int = PER_WINDOW,
        window_seconds: float = WINDOW_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.log = log
        self.per_window = per_window
        self.window_seconds = window_seconds
        self.clock = clock
        self._windows: dict[str, _Window] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at = 0.0  # when it fires, on `clock`

    def connected(self, node: str, boot_id: str, peer: str, acked: int) -> None:
        self._line(
            "agents connected",
            "agent connected: node %s boot %s (%s), acked %d",
            (node, boot_id, peer, acked),
        )

    def disconnected(self, node: str) -> None:
        self._line("agents disconnected", "agent disconnected: node %s", (node,))

    def replaced(self, node: str, old_peer: str, peer: str) -> None:
        """A new stream of `node` (from `peer`) replaced one still open (from `old_peer`)."""
        self._line(
            "streams replaced",
            "node %s: stream from %s replaced by a newer one from %s",
            (node, old_peer, peer),
            logging.WARNING,
        )

    def _line(self, kind: str, template: str, args: tuple[object, ...], level: int = logging.INFO) -> None:
        now = self.clock()
        self.flush(now)
        window = self._windows.get(kind)
        if window is None:
            window = self._windows[kind] = _Window(now, level)
        if window.written < self.per_window:
            window.written += 1
            self.log.log(level, template, *args)
            return
        window.held += 1
        window.last = template % args
        if window.held == 1:
            self._arm()

    def flush(self, now: float | None = None) -> None:
        """Write the count of every window that has ended (every window's with now=inf: at shutdown)."""
        now = self.clock() if now is None else now
        for kind, window in list(self._windows.items()):
            if now - window.began < self.window_seconds:
                continue
            del self._windows[kind]
            if window.held:
                self.log.log(
                    window.level,
                    "%s: %d more in the last %.0f s, not logged one by one; the last: %s",
                    kind,
                    window.held,
                    self.window_seconds,
                    window.last,
                )

    def close(self) -> None:
        """Write every count still held (the controller is stopping)."""
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self.flush(float("inf"))

    def _arm(self) -> None:
        """A timer on the running loop for the first window that ends holding lines back."""
        ends = [w.began + self.window_seconds for w in self._windows.values() if w.held]
        if not ends or (self._timer is not None and self._timer_at <= min(ends)):
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop: the next line, flush() or close() writes the count
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = min(ends)
        self._timer = loop.call_later(max(0.0, self._timer_at - self.clock()), self._fire)

    def _fire(self) -> None:
        self._timer = None
        self.flush()
        self._arm()
