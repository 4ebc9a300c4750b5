"""The collector policy (controller/gc_policy.py): long-lived objects frozen out of the automatic
collections, short-lived cycles still freed, frozen cycles freed by the full collection."""

from __future__ import annotations

import asyncio
import gc
import weakref
from collections.abc import Iterator

import pytest

from controller.gc_policy import CollectorPolicy


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
    gc.unfreeze()
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


def test_counts_what_it_freezes_without_walking_the_frozen_objects() -> None:
    """policy.frozen (gc_frozen_objects) is counted as objects freeze: gc.get_freeze_count() walks
    every frozen object, which at a fleet's size is a long stop of the loop at every scrape."""
    clock = Clock()
    policy = CollectorPolicy(freeze_seconds=10, full_seconds=3600, clock=clock)
    gc.disable()  # no automatic collection in between: the counts are exact
    try:
        clock.now += 10
        policy.tick()
        assert policy.frozen == gc.get_freeze_count() > 1000  # the whole heap, the first time
        first = policy.frozen
        kept = [Cycle() for _ in range(500)]
        clock.now += 10
        policy.tick()
        assert policy.frozen == gc.get_freeze_count() >= first + 500  # only what is new since
        kept.clear()
        clock.now += 3600
        policy.tick()  # the full collection frees the 500 cycles, then counts afresh
        assert policy.full_collections == 1
        assert policy.frozen == gc.get_freeze_count() < first + 500
    finally:
        gc.enable()


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
        stop.set()
        await task

    asyncio.run(go())
    assert gc.get_freeze_count() == 0
