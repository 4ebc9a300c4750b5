"""The event loop's lateness (controller/loop_lag.py): a loop keeping up records next to nothing, a
stall of the loop is recorded at its length, and the controller's /metrics exports it."""

from __future__ import annotations

import asyncio
import time

from controller.loop_lag import LoopLag


def test_a_stalled_loop_is_recorded_at_the_stalls_length() -> None:
    async def body() -> LoopLag:
        lag = LoopLag(tick_seconds=0.02)
        stop = asyncio.Event()
        watching = asyncio.create_task(lag.run_forever(stop))
        await asyncio.sleep(0.2)  # keeping up
        assert lag.lag.count >= 3
        time.sleep(0.3)  # holds the loop, as a long scrape or pass would
        await asyncio.sleep(0.1)
        stop.set()
        await watching
        return lag

    lag = asyncio.run(body())
    counts = dict(lag.lag.cumulative())
    assert lag.lag.count - counts[0.25] >= 1 and counts[1.0] == lag.lag.count  # the stall's wake-up
    assert counts[0.1] >= lag.lag.count // 2  # the others about on time
    assert lag.lag.sum >= 0.25
