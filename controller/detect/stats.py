"""Robust statistics for peer baselines."""

from __future__ import annotations

import statistics
from dataclasses import dataclass

# MAD times this estimates the standard deviation of normally distributed data.
MAD_TO_SIGMA = 1.4826


@dataclass(frozen=True, slots=True)
class Baseline:
    median: float
    mad: float
    count: int

    def deviation(self, value: float) -> float:
        """(value - median) / median."""
        return (value - self.median) / self.median if self.median else 0.0

    def robust_z(self, value: float) -> float:
        """Distance from the median in robust standard deviations (inf when peers agree exactly)."""
        spread = self.mad * MAD_TO_SIGMA
        if spread == 0.0:
            return 0.0 if value == self.median else (float("inf") if value > self.median else float("-inf"))
        return (value - self.median) / spread


def baseline(values: list[float]) -> Baseline:
    median = statistics.median(values)
    mad = statistics.median(abs(v - median) for v in values)
    return Baseline(median, mad, len(values))
