"""The timing loop: warm-up, repeats sized to the deadline, chunks that stop a slowing device."""

from __future__ import annotations

import time

import pytest

pytest.importorskip("torch")

from agent.probes.timing import MIN_REPEATS, measure


def test_repeats_fill_the_time_to_the_deadline() -> None:
    calls: list[int] = []

    def call(i: int) -> None:
        calls.append(i)
        time.sleep(0.005)

    start = time.perf_counter()
    timing = measure(call, device="cpu", deadline=start + 0.5, reserve_seconds=0.1)
    took = time.perf_counter() - start
    assert 0.3 <= took <= 0.5 + 0.5  # stops by the deadline less the reserve; slack for a loaded machine
    assert timing.warmup_calls >= 3
    assert len(timing.seconds) >= 30  # about 0.32 s of 5 ms calls after warm-up
    assert calls == list(range(len(calls)))  # every call numbered, for rotating inputs
    assert timing.median == pytest.approx(0.005, rel=0.5)
    assert timing.params()["repeats"] == str(len(timing.seconds))


def test_a_device_that_slows_down_stops_near_the_deadline() -> None:
    calls: list[int] = []

    def call(i: int) -> None:
        calls.append(i)
        time.sleep(0.002 if len(calls) < 40 else 0.02)  # ten times slower after the warm-up

    start = time.perf_counter()
    measure(call, device="cpu", deadline=start + 0.5)
    assert time.perf_counter() - start < 0.5 + 0.75  # one chunk at most past it, not 10x (~2 s)


def test_a_device_too_slow_for_the_deadline_still_gives_a_median() -> None:
    timing = measure(lambda i: time.sleep(0.01), device="cpu", deadline=time.perf_counter())
    assert len(timing.seconds) == MIN_REPEATS
    assert timing.cv >= 0
