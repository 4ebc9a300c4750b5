"""How late the controller's event loop runs what it is due to run: the time acks, Hellos and every
other callback wait behind whatever holds the loop (a /metrics scrape, a probe scheduling pass, a
garbage collection, a burst of frames).

A task asks to wake every TICK_SECONDS and records how much later than asked it woke
(`gpufleet_controller_event_loop_lag_seconds`, a histogram): on a loop keeping up, well under a
millisecond; a stall shows as one late wake-up its length. Four wake-ups a second cost nothing
measurable.
"""

from __future__ import annotations

import asyncio

from controller.metrics_record import SecondsHistogram

TICK_SECONDS = 0.25
LOOP_LAG_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class LoopLag:
    def __init__(self, tick_seconds: float = TICK_SECONDS) -> None:
        self.tick_seconds = tick_seconds
        self.lag = SecondsHistogram(LOOP_LAG_BUCKETS)

    async def run_forever(self, stop: asyncio.Event) -> None:
        """Wake every tick and record the lateness, until stop is set (seen within a tick)."""
        loop = asyncio.get_running_loop()
        while not stop.is_set():
            due = loop.time() + self.tick_seconds
            await asyncio.sleep(self.tick_seconds)
            self.lag.observe(max(0.0, loop.time() - due))
