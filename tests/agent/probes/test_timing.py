"""The timing loop: warm-up, repeats sized to the deadline, chunks that stop a slowing device."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest

pytest.importorskip("torch")

from agent.probes import timing
from agent.probes.timing import MIN_REPEATS, measure


class FakeClock:
    """perf_counter for the timing loop: only the calls move it, so no load on the machine running
    the tests changes what the loop decides (a sleep-based call can take 2x its time there)."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def call_taking(self, seconds: Callable[[int], float], calls: list[int]) -> Callable[[int], None]:
        def call(i: int) -> None:
            calls.append(i)
            self.now += seconds(len(calls))

        return call


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    fake = FakeClock()
    monkeypatch.setattr(timing, "time", fake)
    return fake


def test_repeats_fill_the_time_to_the_deadline(clock: FakeClock) -> None:
    calls: list[int] = []
    start = clock.now
    result = measure(
        clock.call_taking(lambda _: 0.005, calls), device="cpu", deadline=start + 0.5, reserve_seconds=0.1
    )
    took = clock.now - start
    assert 0.39 <= took <= 0.4 + 1e-9  # stops by the deadline less the reserve
    assert result.warmup_calls >= 3
    assert len(result.seconds) >= 60  # about 0.32 s of 5 ms calls after warm-up
    assert calls == list(range(len(calls)))  # every call numbered, for rotating inputs
    assert result.median == pytest.approx(0.005)
    assert result.params()["repeats"] == str(len(result.seconds))


def test_a_device_that_slows_down_stops_near_the_deadline(clock: FakeClock) -> None:
    calls: list[int] = []
    start = clock.now
    # ten times slower after the warm-up
    measure(clock.call_taking(lambda n: 0.002 if n < 40 else 0.02, calls), device="cpu", deadline=start + 0.5)
    # the chunk under way when it slowed down ends at most a chunk (~0.1 s at the new pace) past
    # it, not 10x (~2 s)
    assert clock.now - start < 0.5 + 0.2
    assert clock.now - start > 0.5 - 0.05  # and it did not stop early either


def test_a_device_too_slow_for_the_deadline_still_gives_a_median() -> None:
    timing = measure(lambda i: time.sleep(0.01), device="cpu", deadline=time.perf_counter())
    assert len(timing.seconds) == MIN_REPEATS
    assert timing.cv >= 0
