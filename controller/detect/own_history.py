"""A GPU's (or node's) own probe history as a baseline: its earlier results of the same probe key.

Two uses in probe_outlier.py: the baseline of last resort but one where the peer group is too small
(`own_baseline`), and a change-point test beside the peers' (`recent_change`): the mean of the
newest RECENT results against the robust median of the earlier ones, so a drop that is plain
against a GPU's own steady record is seen while the GPU is still within the peers' margin.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from controller.detect.stats import Baseline, baseline
from controller.fleet.model import Fleet, ProbeRecord

RECENT = 2  # newest results averaged for the change-point test: one odd run is no change


def earlier_values(fleet: Fleet, record: ProbeRecord) -> list[float]:
    """The key's results older than `record` (the latest), oldest first."""
    return [value for time, value in fleet.history.get(record.key, ()) if time < record.time]


def own_baseline(fleet: Fleet, record: ProbeRecord, min_points: int) -> Baseline | None:
    """The robust baseline of the results before `record`; None with fewer than `min_points`."""
    values = earlier_values(fleet, record)
    return baseline(values) if len(values) >= min_points else None


@dataclass(frozen=True, slots=True)
class Change:
    recent: float  # mean of the newest RECENT results (the latest included)
    runs: int  # how many results `recent` averages
    before: Baseline  # the results before those


def recent_change(fleet: Fleet, record: ProbeRecord, min_points: int) -> Change | None:
    """The newest RECENT results against the ones before them; None without `min_points` of those."""
    values = earlier_values(fleet, record)
    split = len(values) - (RECENT - 1)
    newest, older = [*values[split:], record.value], values[:split]
    if len(older) < min_points:
        return None
    return Change(statistics.fmean(newest), len(newest), baseline(older))
