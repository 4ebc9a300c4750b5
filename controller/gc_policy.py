"""Keeping Python's cyclic garbage collector off the fleet.

The fleet is hundreds of thousands of long-lived objects (per GPU state, history deques, probe
records). CPython's full (generation 2) collection walks every one of them, and it runs whenever a
quarter as many new objects have survived into the old generation: at 2,000 nodes that was a 0.5 s
stop of the event loop about every 10 s (acks waited behind it; p99 ack 0.45 s) and 8% of the
controller's CPU, growing with the fleet. Almost nothing in the fleet is cyclic garbage: objects die
by reference counting, which freezing does not change.

So every FREEZE_SECONDS the objects that have lived that long are frozen (`gc.freeze`: moved to the
permanent generation, which no automatic collection walks), and the automatic collections only walk
what is new. 2 s rather than 10 s: while a fleet connects, the new nodes' state outgrows a 10 s
freeze (full collections of 0.25 s at 2,000 nodes, 0.08 s at 2 s); a freeze costs one young
collection. Before
each freeze the young generations are collected, so short-lived cycles (exceptions and their
tracebacks) are still freed. Once an hour (less often while those find nothing: below) everything
is unfrozen and collected in full, so a cycle that was frozen is freed; that pause is logged with
its length.

That pause walks every object the process keeps, about 0.75 us each on a heap this size: 0.9 s of
the event loop at 4,000 nodes (1.18M objects), about 3 s at 12,500. And it finds almost nothing:
at 4,000 nodes no unreachable object in each of a run of 10 s intervals, 950 after a reconnect storm
of every node (bench/results/2026-12-03_storm_garbage_collection.txt). So while a full collection
frees less than FULL_IDLE_SHARE of what it keeps, the next waits twice as long, up to
FULL_MAX_SECONDS (a day); one that frees more brings the interval back to the hour. A process that
keeps making cycles that outlive the freeze is collected hourly; one that does not pauses daily.

While it runs on the controller's event loop (run_forever), the youngest generation is collected
once YOUNG_THRESHOLD more objects were made than freed, not CPython's 700: each frame's objects that
live only across its awaits (its parse, its plan, gRPC's and the loop's own) were otherwise walked
by a collection every 700, and the collector's share grew with the rate (at 6,000 nodes 0.04-0.06
cores; 0.023-0.033 with 20,000: bench/results/2026-12-02_event_loop_thread_and_floor_variants.txt).

While it runs it times every collection (`gc.callbacks`): the controller's /metrics shows the
seconds and collections per generation and the longest pause.

It never lists the heap (`gc.get_objects()`): that list holds a reference to every object, and an
object whose other references went meanwhile dies when the list does, on this (the event loop's)
thread. A SQLite cursor the store's thread had just let go of then reset the prepared statement that
thread was running again at that moment (Python shares them through its statement cache), and the
store's next row failed "bad parameter or other API misuse" (SQLITE_MISUSE): a few frames in a
12,500-node ramp went unacked. So gc_frozen_objects is counted when a freeze or a full collection
walks them anyway or happens once: the hourly full collection and the first freeze.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

log = logging.getLogger("gpufleet.controller.gc")

FREEZE_SECONDS = 2.0
FULL_SECONDS = 3600.0
FULL_MAX_SECONDS = 86400.0
FULL_IDLE_SHARE = 0.001  # a full collection that frees less than this share of what it keeps
YOUNG_THRESHOLD = 20_000  # objects made less freed between two collections of the youngest generation


@contextlib.contextmanager
def collector_paused() -> Iterator[None]:
    """No automatic collection inside, and what was made inside frozen after it, as CollectorPolicy
    would within FREEZE_SECONDS (it is long-lived: the fleet a controller loads at its start). At
    12,500 nodes with 64 probe rounds each, 15 full collections walked the growing fleet while it
    loaded: 8 s of a 30 s load (bench/controller_startup.py)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()  # a splice of the generations' lists: no walk
        if enabled:
            gc.enable()


class CollectorPolicy:
    """Call tick() often (each loop turn or pass is fine): it freezes every freeze_seconds and
    collects in full every full_seconds, or up to full_max_seconds while those find next to nothing
    (the module's docstring). One per process."""

    def __init__(
        self,
        *,
        freeze_seconds: float = FREEZE_SECONDS,
        full_seconds: float = FULL_SECONDS,
        full_max_seconds: float = FULL_MAX_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.freeze_seconds = freeze_seconds
        self.full_seconds = full_seconds
        self.full_max_seconds = max(full_seconds, full_max_seconds)
        self.full_every = full_seconds  # the interval to the next full collection
        self.clock = clock
        now = clock()
        self.last_freeze = now
        self.last_full = now
        self.freezes = 0
        # Objects frozen, as counted at the first freeze and at each full collection: only then,
        # since gc.get_freeze_count() walks every frozen object (0.2 s of the event loop at 12,500
        # nodes) and listing the new ones is unsafe (the module's docstring).
        self.frozen = 0
        self.full_collections = 0
        self.last_full_seconds = 0.0
        # Per generation while watching: collections, seconds in them, the longest one.
        self.collections = [0, 0, 0]
        self.seconds = [0.0, 0.0, 0.0]
        self.longest = 0.0
        self._began = 0.0

    def watch(self) -> None:
        """Time every collection from now on (until unwatch)."""
        if self._timed not in gc.callbacks:
            gc.callbacks.append(self._timed)

    def unwatch(self) -> None:
        if self._timed in gc.callbacks:
            gc.callbacks.remove(self._timed)

    def _timed(self, phase: str, info: dict[str, Any]) -> None:
        if phase == "start":
            self._began = time.perf_counter()
            return
        took = time.perf_counter() - self._began
        generation = int(info.get("generation", 2))
        self.collections[generation] += 1
        self.seconds[generation] += took
        self.longest = max(self.longest, took)

    def tick(self) -> None:
        now = self.clock()
        if now - self.last_full >= self.full_every:
            self.collect_in_full()
        elif now - self.last_freeze >= self.freeze_seconds:
            self.freeze()

    def freeze(self) -> None:
        """Collect the young generations, then freeze every object still tracked."""
        gc.collect(1)
        gc.freeze()
        if self.freezes == 0:
            self.frozen = gc.get_freeze_count()  # once: the heap at start (at most one walk of it)
        self.freezes += 1
        self.last_freeze = self.clock()

    def collect_in_full(self) -> None:
        """Unfreeze, collect everything (cycles frozen since the last time are freed), freeze again."""
        began = time.perf_counter()
        gc.unfreeze()
        unreachable = gc.collect()
        gc.freeze()
        self.frozen = gc.get_freeze_count()
        self.last_full_seconds = time.perf_counter() - began
        self.full_collections += 1
        self.last_full = self.last_freeze = self.clock()
        if unreachable < FULL_IDLE_SHARE * self.frozen:  # next to nothing: the next one later
            self.full_every = min(2 * self.full_every, self.full_max_seconds)
        else:
            self.full_every = self.full_seconds
        log.info(
            "full garbage collection: %.2f s, %d objects kept, %d unreachable freed; the next in %.0f s",
            self.last_full_seconds,
            self.frozen,
            unreachable,
            self.full_every,
        )

    async def run_forever(self, stop: asyncio.Event) -> None:
        """On the event loop: tick every freeze_seconds until stop is set; unfreeze at the end. The
        youngest generation's threshold is YOUNG_THRESHOLD meanwhile."""
        self.watch()
        thresholds = gc.get_threshold()
        gc.set_threshold(YOUNG_THRESHOLD, *thresholds[1:])
        try:
            while not stop.is_set():
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), timeout=self.freeze_seconds)
                if not stop.is_set():
                    self.tick()
        finally:
            self.unwatch()
            gc.set_threshold(*thresholds)
            gc.unfreeze()
            self.frozen = 0
