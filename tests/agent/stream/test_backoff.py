"""Reconnect delays: capped exponential growth, shortened by random jitter."""

from __future__ import annotations

import random

import pytest

from agent.stream.backoff import Backoff


class FixedRandom(random.Random):
    """random() always returns `value`, to pin the jitter at its extremes."""

    def __init__(self, value: float) -> None:
        super().__init__(0)
        self.value = value

    def random(self) -> float:
        return self.value


def test_without_jitter_the_delay_doubles_up_to_the_cap() -> None:
    backoff = Backoff(0.5, 30.0, jitter=0.0)
    assert [backoff.delay(a) for a in range(9)] == [0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0, 30.0]


def test_jitter_extremes_bound_each_attempt() -> None:
    longest = Backoff(1.0, 10.0, rng=FixedRandom(0.0))
    shortest = Backoff(1.0, 10.0, rng=FixedRandom(0.999999))
    for attempt, base in enumerate([1.0, 2.0, 4.0, 8.0, 10.0, 10.0]):
        assert longest.delay(attempt) == base
        assert shortest.delay(attempt) == pytest.approx(base * 0.5, rel=1e-5)


@pytest.mark.parametrize("seed", range(5))
def test_every_delay_is_within_its_attempts_bounds_and_never_above_the_cap(seed: int) -> None:
    backoff = Backoff(0.01, 0.05, rng=random.Random(seed))
    for attempt in range(12):
        base = min(0.05, 0.01 * 2.0**attempt)
        for _ in range(50):
            delay = backoff.delay(attempt)
            assert base * 0.5 <= delay <= base <= 0.05


def test_delays_grow_until_the_cap() -> None:
    backoff = Backoff(0.5, 30.0, rng=random.Random(1))
    for attempt in range(1, 6):  # up to 16 s, below the cap
        # With jitter 0.5 and multiplier 2, the shortest delay of an attempt is the longest of the
        # one before: the sequence never shrinks, and on average it doubles.
        assert (
            min(backoff.delay(attempt) for _ in range(200))
            >= max(backoff.delay(attempt - 1) for _ in range(200)) * 0.999
        )
        mean = sum(backoff.delay(attempt) for _ in range(400)) / 400
        previous = sum(backoff.delay(attempt - 1) for _ in range(400)) / 400
        assert mean == pytest.approx(2 * previous, rel=0.1)


def test_a_huge_attempt_number_stays_at_the_cap() -> None:
    backoff = Backoff(0.5, 30.0, jitter=0.0)
    assert backoff.delay(10_000) == 30.0
    assert backoff.delay(2**62) == 30.0


def test_agents_do_not_retry_in_lockstep() -> None:
    a = Backoff(rng=random.Random(1))
    b = Backoff(rng=random.Random(2))
    assert [a.delay(3) for _ in range(5)] != [b.delay(3) for _ in range(5)]
    fresh = [Backoff().delay(4) for _ in range(20)]  # default rng: seeded from the OS
    assert len(set(fresh)) > 1


def test_custom_multiplier() -> None:
    backoff = Backoff(1.0, 100.0, multiplier=3.0, jitter=0.0)
    assert [backoff.delay(a) for a in range(6)] == [1.0, 3.0, 9.0, 27.0, 81.0, 100.0]
