"""fleet/series.py: a probe key's recent results in one array, as a deque of (time, value) was."""

from __future__ import annotations

import pickle
import struct

import pytest

from controller.fleet.series import HISTORY_POINTS, Series


def test_results_are_kept_oldest_first_and_bounded_to_the_newest() -> None:
    series = Series()
    for i in range(HISTORY_POINTS + 5):
        series.add(100.0 + i, float(i))
    assert len(series) == HISTORY_POINTS
    assert series[0] == (105.0, 5.0) and series[-1] == (100.0 + HISTORY_POINTS + 4, HISTORY_POINTS + 4.0)
    assert [t for t, _ in series] == [100.0 + i for i in range(5, HISTORY_POINTS + 5)]


def test_an_older_result_goes_in_its_place_and_the_same_one_twice_is_kept_once() -> None:
    series = Series([(10.0, 1.0), (30.0, 3.0)])
    series.add(20.0, 2.0)  # a replayed spool
    series.add(30.0, 3.0)
    assert list(series) == [(10.0, 1.0), (20.0, 2.0), (30.0, 3.0)]
    series.add(30.0, 4.0)  # the same time, another value: a result of its own
    assert list(series) == [(10.0, 1.0), (20.0, 2.0), (30.0, 3.0), (30.0, 4.0)]


def test_an_older_result_than_a_full_series_holds_is_left_out() -> None:
    series = Series((100.0 + i, float(i)) for i in range(HISTORY_POINTS))
    series.add(1.0, 99.0)
    assert len(series) == HISTORY_POINTS and series[0] == (100.0, 0.0)


def test_bytes_are_little_endian_doubles_and_come_back_the_same() -> None:
    series = Series([(1.5, 2.5), (3.0, 4.0)])
    data = series.to_bytes()
    assert data == struct.pack("<4d", 1.5, 2.5, 3.0, 4.0)
    assert Series.from_bytes(data) == series
    assert pickle.loads(pickle.dumps(series)) == series  # to the detection process
    assert Series.from_bytes(b"") == Series()


def test_bytes_that_are_not_whole_points_are_an_error_and_a_longer_series_keeps_its_newest() -> None:
    with pytest.raises(ValueError, match="not whole"):
        Series.from_bytes(b"\0" * 24)
    longer = struct.pack(
        f"<{2 * (HISTORY_POINTS + 2)}d", *[x for i in range(HISTORY_POINTS + 2) for x in (i, i)]
    )
    series = Series.from_bytes(longer)
    assert len(series) == HISTORY_POINTS and series[0] == (2.0, 2.0)


def test_indexing_reads_points_and_refuses_past_the_end() -> None:
    series = Series([(1.0, 2.0), (3.0, 4.0)])
    assert series[1] == series[-1] == (3.0, 4.0) and series[-2] == (1.0, 2.0)
    assert series[:1] == [(1.0, 2.0)]
    with pytest.raises(IndexError):
        series[2]
    with pytest.raises(IndexError):
        Series()[-1]
