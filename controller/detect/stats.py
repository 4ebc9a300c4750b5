"""Robust statistics for peer baselines.

A baseline is the median and the MAD (median absolute deviation) of the peers' values, after
leaving out members far from the rest: first the median and MAD of all, then those more than
CLIP_Z robust sigmas from the median are set aside and both are taken again, until nothing more is
set aside. A minority of wild members (broken or forged nodes reporting extreme values, up to
nearly half the group) then moves the baseline not at all, where the plain median would shift
towards them. Only ever a minority is set aside: a group split in two camps keeps everyone.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# MAD times this estimates the standard deviation of normally distributed data.
MAD_TO_SIGMA = 1.4826
# Members this many robust sigmas from the median are no peers to compare with (a normal sample
# loses 6 in 100000 members to it).
CLIP_Z = 4.0
MAX_ROUNDS = 10


@dataclass(frozen=True, slots=True)
class Baseline:
    median: float
    mad: float
    count: int  # every member of the group
    outliers: int = 0  # members left out of the median and MAD as too far from the rest

    def deviation(self, value: float) -> float:
        """(value - median) / median."""
        return (value - self.median) / self.median if self.median else 0.0

    def robust_z(self, value: float) -> float:
        """Distance from the median in robust standard deviations (inf when peers agree exactly)."""
        spread = self.mad * MAD_TO_SIGMA
        if spread == 0.0:
            return 0.0 if value == self.median else (float("inf") if value > self.median else float("-inf"))
        return (value - self.median) / spread

    def relative_spread(self) -> float:
        """Robust standard deviation as a share of the median (0 when the median is 0)."""
        return self.mad * MAD_TO_SIGMA / abs(self.median) if self.median else 0.0

    def margin(self, floor: float, robust_z: float) -> float:
        """The share worse than the median that is clearly out of line: `floor`, widened to
        `robust_z` robust sigmas where the members spread more than that."""
        return max(floor, robust_z * self.relative_spread())


def baseline(values: list[float]) -> Baseline:
    kept = list(values)
    median, mad = _median_mad(kept)
    for _ in range(MAX_ROUNDS):
        reach = CLIP_Z * MAD_TO_SIGMA * mad
        inside = [v for v in kept if abs(v - median) <= reach]
        if len(inside) == len(kept) or 2 * len(inside) <= len(values):
            break  # nothing more to set aside, or what is left would be no majority
        kept = inside
        median, mad = _median_mad(kept)
    return Baseline(median, mad, len(values), len(values) - len(kept))


def _median_mad(values: list[float]) -> tuple[float, float]:
    median = statistics.median(values)
    return median, statistics.median(abs(v - median) for v in values)


def median_less(values: list[float], skip: int | None) -> tuple[float | None, int]:
    """The median of sorted `values` less the one at index `skip` (None: all of them), and how many
    that leaves; None for the median of none. Read off the list around `skip`, with no copy: a copy
    per member of a group cost the group's size squared."""
    count = len(values) - (0 if skip is None else 1)
    if count <= 0:
        return None, 0

    def at(k: int) -> float:
        return values[k if skip is None or k < skip else k + 1]

    return (at((count - 1) // 2) + at(count // 2)) / 2, count
