"""The collector policy (controller/gc_policy.py): long-lived objects frozen out of the automatic
collections, short-lived cycles still freed, frozen cycles freed by the full collection."""

from __future__ import annotations

import asyncio
import gc
import logging
import sys
import weakref
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from controller.gc_policy import FULL_IDLE_SHARE, YOUNG_THRESHOLD, CollectorPolicy, collector_paused
from controller.store.sql import Conn
from controller.store.sqlite import SqliteBackend
from controller.store.writer import StoreThread


class Cycle:
    def __init__(self) -> None:
        self.me = self


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture(autouse=True)
def unfrozen() -> Iterator[None]:
    """A heap with nothing frozen and no garbage: an earlier test in this process may have left
    garbage frozen (a controller's start freezes its load uncollected: gc_policy.collector_paused),
    which a full collection here would free, and the counts below would be off by it."""
    gc.unfreeze()
    gc.collect()
    yield
    gc.unfreeze()
    gc.collect()


def cycle() -> weakref.ref[Cycle]:
    """A reference cycle nothing else holds: only the cyclic collector can free it."""
    return weakref.ref(Cycle())


def test_freezes_only_once_its_interval_has_passed() -> None:
    clock = Clock()
    policy = CollectorPolicy(freeze_seconds=10, full_seconds=3600, clock=clock)
    clock.now += 9
    policy.tick()
    assert gc.get_freeze_count() == 0
    assert policy.freezes == 0
    clock.now += 1
    policy.tick()
    assert policy.freezes == 1
    assert gc.get_freeze_count() > 0


KEPT, SLACK = 5000, 100


def test_counts_what_is_frozen_at_the_first_freeze_and_each_full_collection() -> None:
    """policy.frozen (gc_frozen_objects) is counted only where it costs at most one walk of the
    frozen objects: gc.get_freeze_count() at every freeze or scrape is a long stop of the loop at a
    fleet's size, and listing the new objects is unsafe (the next test)."""
    clock = Clock()
    # Every hour (its first full collection finds nothing: the next would wait longer)
    policy = CollectorPolicy(freeze_seconds=10, full_seconds=3600, full_max_seconds=3600, clock=clock)
    gc.disable()  # no automatic collection in between
    try:
        clock.now += 10
        policy.tick()
        assert policy.frozen == gc.get_freeze_count() > 1000  # the whole heap, the first time
        first = policy.frozen
        kept = [Cycle() for _ in range(KEPT)]
        clock.now += 10
        policy.tick()
        assert policy.freezes == 2
        assert policy.frozen == first  # not counted again until the full collection
        # Less what died meanwhile (pytest-xdist's threads run beside the test): a few objects
        assert gc.get_freeze_count() >= first + KEPT - SLACK
        clock.now += 3600
        policy.tick()
        assert policy.full_collections == 1
        assert policy.frozen == gc.get_freeze_count() >= first + KEPT - SLACK
        kept.clear()
        clock.now += 3600
        policy.tick()  # the next full collection frees the kept cycles and counts afresh
        assert policy.frozen == gc.get_freeze_count() < first + KEPT - SLACK
    finally:
        gc.enable()


def test_freezing_beside_the_store_thread_never_makes_sqlite_refuse_a_write(tmp_path: Path) -> None:
    """The freeze runs on the event loop while the store's thread writes. It once counted what it
    froze by listing the heap (gc.get_objects()): a cursor the store thread had just let go of then
    died on the loop's thread when the list did, reset the statement the store thread was running
    again, and the store's next row failed SQLITE_MISUSE ("bad parameter or other API misuse")."""
    backend = SqliteBackend(str(tmp_path / "store.db"), synchronous="off")
    writer = StoreThread(backend)
    policy = CollectorPolicy()
    done = [0]

    def table(conn: Conn) -> None:
        conn.execute("CREATE TABLE t (node INTEGER, gpu INTEGER, sample BLOB, PRIMARY KEY (node, gpu))")

    def save(node: int) -> Callable[[Conn], None]:
        def job(conn: Conn) -> None:
            try:
                conn.executemany(
                    "INSERT INTO t (node, gpu, sample) VALUES (?, ?, ?) "
                    "ON CONFLICT (node, gpu) DO UPDATE SET sample = excluded.sample",
                    [(node, gpu, b"s" * 64) for gpu in range(8)],
                )
            finally:
                done[0] += 1

        return job

    async def go() -> tuple[int, list[BaseException]]:
        await writer.call(table)
        jobs = 1_000
        pending = [writer.submit(save(n % 500)) for n in range(jobs)]
        freezes = 0
        while done[0] < jobs:
            gc.unfreeze()  # the whole heap new again: what a fleet makes between two freezes
            policy.freeze()
            freezes += 1
        failed = [r for r in await asyncio.gather(*pending, return_exceptions=True) if r is not None]
        return freezes, failed

    switching = sys.getswitchinterval()
    sys.setswitchinterval(1e-5)  # the two threads take turns often: the race in 1 s, not minutes
    writer.start()
    try:
        freezes, failed = asyncio.run(go())
    finally:
        writer.stop()
        sys.setswitchinterval(switching)
    assert freezes > 10, "the writes did not overlap the freezes"
    assert failed == [], f"{len(failed)} writes refused, the first: {failed[0]!r}"


def test_a_frozen_object_is_out_of_every_collection_until_the_full_one() -> None:
    clock = Clock()
    policy = CollectorPolicy(freeze_seconds=10, full_seconds=3600, clock=clock)
    held = Cycle()  # long-lived when the freeze comes ...
    dead = weakref.ref(held)
    clock.now += 10
    policy.tick()
    del held  # ... and garbage afterwards: reference counting cannot free a cycle
    gc.collect()
    assert dead() is not None, "a frozen object was walked by a collection"
    clock.now += 3600
    policy.tick()
    assert policy.full_collections == 1
    assert dead() is None, "the full collection did not free a cycle frozen since the last one"
    assert gc.get_freeze_count() > 0, "the full collection must freeze again"


def test_full_collections_that_find_nothing_come_less_often_and_garbage_brings_the_hour_back(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Each full collection stops the event loop for a walk of the whole heap (seconds at a large
    fleet's size); while they free next to nothing the next waits twice as long, up to the maximum."""
    caplog.set_level(logging.INFO, "gpufleet.controller.gc")
    clock = Clock()
    policy = CollectorPolicy(freeze_seconds=10, full_seconds=3600, full_max_seconds=4 * 3600, clock=clock)
    collections = []
    for step in (3600, 3600, 3600, 4 * 3600, 4 * 3600):
        clock.now += step
        policy.tick()
        collections.append((policy.full_collections, policy.full_every))
    # Due after 1 h, then 2 h (not at 1 h), then 4 h, and 4 h again: the maximum.
    assert collections == [(1, 7200), (1, 7200), (2, 14400), (3, 14400), (4, 14400)]
    assert caplog.messages[-1].endswith("unreachable freed; the next in 14400 s")
    # Cycles that died frozen, more than FULL_IDLE_SHARE of the heap: the next collection frees them
    # and the one after comes an hour later.
    kept = [Cycle() for _ in range(int(policy.frozen * FULL_IDLE_SHARE) + 1000)]
    clock.now += 10
    policy.tick()  # a freeze: they are out of the automatic collections
    dead = weakref.ref(kept[0])
    kept.clear()
    clock.now += 4 * 3600
    policy.tick()
    assert dead() is None and policy.full_collections == 5 and policy.full_every == 3600
    assert caplog.messages[-1].endswith("the next in 3600 s")


def test_cycles_that_died_before_the_freeze_are_freed_by_it() -> None:
    gc.disable()  # no automatic collection may free it first: the freeze's own must
    try:
        dead = cycle()
        assert dead() is not None
        CollectorPolicy().freeze()
        assert dead() is None
    finally:
        gc.enable()


def test_objects_freed_by_reference_counting_go_at_once_even_frozen() -> None:
    class Plain:
        pass

    held = Plain()
    dead = weakref.ref(held)
    CollectorPolicy().freeze()
    del held
    assert dead() is None


def test_runs_on_the_loop_and_unfreezes_when_stopped() -> None:
    async def go() -> None:
        stop = asyncio.Event()
        policy = CollectorPolicy(freeze_seconds=0.01)
        task = asyncio.create_task(policy.run_forever(stop))
        while policy.freezes < 2:
            await asyncio.sleep(0.01)
        assert gc.get_freeze_count() > 0
        assert gc.get_threshold() == (YOUNG_THRESHOLD, *before[1:])
        stop.set()
        await task

    before = gc.get_threshold()
    assert before[0] != YOUNG_THRESHOLD
    asyncio.run(go())
    assert gc.get_freeze_count() == 0
    assert gc.get_threshold() == before  # as it was


def test_nothing_is_collected_while_paused_and_what_was_made_is_frozen_after() -> None:
    """collector_paused (around a controller's fleet load): no automatic collection inside, even
    past the threshold; what was made inside is frozen out of them after; the collector's state as
    it was."""
    assert gc.isenabled()
    before = gc.get_stats()[0]["collections"]
    with collector_paused():
        assert not gc.isenabled()
        made = [Cycle() for _ in range(10 * gc.get_threshold()[0])]  # would start collections
        assert gc.get_stats()[0]["collections"] == before
    assert gc.isenabled() and gc.get_freeze_count() >= len(made)
    gc.disable()
    try:
        with collector_paused():
            pass
        assert not gc.isenabled(), "a collector off before must stay off"
    finally:
        gc.enable()
