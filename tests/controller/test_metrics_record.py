"""The histograms the controller's core fills: Prometheus `le` semantics, bad readings ignored."""

from __future__ import annotations

import math
import time

import pytest

from controller.metrics_record import LabelledHistograms, SecondsHistogram


def test_a_value_on_a_bound_counts_in_that_bucket_and_buckets_are_cumulative() -> None:
    h = SecondsHistogram((1.0, 0.1, 10.0))  # given unsorted
    for seconds in (0.1, 0.5, 1.0, 10.0, 11.0):
        h.observe(seconds)
    assert h.bounds == (0.1, 1.0, 10.0)
    assert h.cumulative() == [(0.1, 1), (1.0, 3), (10.0, 4), (math.inf, 5)]
    assert h.count == 5 and h.sum == pytest.approx(22.6)


def test_non_finite_observations_are_dropped() -> None:
    h = SecondsHistogram((1.0,))
    for seconds in (math.nan, math.inf, -math.inf):
        h.observe(seconds)
    h.observe(0.5)
    assert (h.count, h.sum, h.cumulative()) == (1, 0.5, [(1.0, 1), (math.inf, 1)])


def test_time_observes_a_block_even_when_it_raises() -> None:
    h = SecondsHistogram((0.001, 10.0))
    with h.time():
        time.sleep(0.002)
    with pytest.raises(RuntimeError), h.time():
        raise RuntimeError("boom")
    assert h.count == 2 and h.sum >= 0.002
    assert h.cumulative()[0][1] <= 1  # the sleep took longer than the first bound


def test_buckets_must_be_finite() -> None:
    with pytest.raises(ValueError, match="finite"):
        SecondsHistogram((1.0, math.inf))
    with pytest.raises(ValueError, match="at least one"):
        SecondsHistogram(())


def test_labelled_histograms_start_known_labels_at_zero_and_add_others_on_use() -> None:
    family = LabelledHistograms((1.0,), known=("load", "save_frame"))
    assert sorted(family.by_label) == ["load", "save_frame"]
    assert all(h.count == 0 for h in family.by_label.values())
    family.observe("vacuum", 2.0)
    family.observe("load", 0.5)
    assert family.get("vacuum").cumulative() == [(1.0, 0), (math.inf, 1)]
    assert family.get("load").count == 1 and family.get("save_frame").count == 0
