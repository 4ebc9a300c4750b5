"""Robust baselines: the margin that follows a group's spread; the median of a group less one member."""

from __future__ import annotations

import random
import statistics

import pytest

from controller.detect.stats import MAD_TO_SIGMA, Baseline, baseline, median_less


def test_relative_spread_is_the_robust_sigma_over_the_median() -> None:
    b = Baseline(median=200.0, mad=2.0, count=10)
    assert b.relative_spread() == pytest.approx(2.0 * MAD_TO_SIGMA / 200.0)
    assert Baseline(median=0.0, mad=1.0, count=3).relative_spread() == 0.0


def test_margin_is_the_floor_in_a_tight_group_and_widens_in_a_noisy_one() -> None:
    tight = baseline([100.0, 100.5, 99.5, 100.2, 99.8, 100.1])
    noisy = baseline([100.0, 104.0, 96.0, 103.0, 97.0, 101.0, 99.0])
    assert tight.margin(0.05, 3.0) == 0.05
    assert noisy.margin(0.05, 3.0) == pytest.approx(3.0 * noisy.relative_spread())
    assert noisy.margin(0.05, 3.0) > 0.08
    assert baseline([7.0] * 5).margin(0.05, 3.0) == 0.05  # peers agree exactly: the floor


@pytest.mark.parametrize("size", [1, 2, 3, 4, 7, 8])
def test_the_median_less_one_port_is_the_median_of_the_others(size: int) -> None:
    rates = sorted(float(r) for r in random.Random(size).choices([100, 200, 400, 800], k=size))
    for skip in [None, *range(size)]:
        others = [r for i, r in enumerate(rates) if i != skip]
        expected = (statistics.median(others) if others else None, len(others))
        assert median_less(rates, skip) == expected
