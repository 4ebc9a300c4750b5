"""A probe key's own history: the results before the latest, as a baseline and as a change test."""

from __future__ import annotations

import pytest

from controller.detect.own_history import earlier_values, own_baseline, recent_change
from controller.fleet.model import Fleet, ProbeRecord
from controller.fleet.series import Series


def fleet_with(values: list[float], latest: float | None = None) -> tuple[Fleet, ProbeRecord]:
    """A key with `values` one per hour; the latest result is the last of them (or `latest`, read
    after them, as a record whose value a test changed)."""
    fleet = Fleet()
    key = ("n1", 0, "membw", "d2d")
    fleet.history[key] = Series((3600.0 * i, v) for i, v in enumerate(values))
    time, value = fleet.history[key][-1]
    record = ProbeRecord("n1", 0, "membw", "d2d", value if latest is None else latest, "GB/s", time, b"")
    return fleet, record


def test_earlier_values_leave_out_the_latest_result() -> None:
    fleet, record = fleet_with([10.0, 11.0, 12.0])
    assert earlier_values(fleet, record) == [10.0, 11.0]
    assert earlier_values(Fleet(), record) == []


def test_own_baseline_needs_enough_earlier_results() -> None:
    fleet, record = fleet_with([100.0, 101.0, 99.0, 100.0, 50.0])
    assert own_baseline(fleet, record, 5) is None
    base = own_baseline(fleet, record, 4)
    assert base is not None and base.median == 100.0 and base.count == 4


def test_recent_change_averages_the_newest_two_against_the_rest() -> None:
    fleet, record = fleet_with([100.0, 100.2, 99.8, 100.1, 94.0, 95.0], latest=93.0)
    change = recent_change(fleet, record, 4)
    assert change is not None
    assert change.runs == 2 and change.recent == pytest.approx((94.0 + 93.0) / 2)  # the record's value
    assert change.before.count == 4 and change.before.median == pytest.approx(100.05)
    assert recent_change(fleet, record, 5) is None  # 4 results before the newest two
