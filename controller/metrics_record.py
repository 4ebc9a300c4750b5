"""Histograms the controller's core fills as it works, for controller/metrics.py to export.

Plain data with no Prometheus import, so the app, ingest and store stay free of exporter concerns
and every ControllerApp owns its own (tests run many in one process). Observations happen on the
event loop, as do scrapes, so no locking is needed.
"""

from __future__ import annotations

import bisect
import contextlib
import math
import time
from collections.abc import Iterable, Iterator

# Upper bounds in seconds; +Inf is implied.
STORE_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0)
# A live agent's frame arrives within a second; a spool replayed after an outage can be hours old.
LAG_BUCKETS = (0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0, 900.0, 3600.0, 21600.0)
PASS_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class SecondsHistogram:
    """Counts of observations per bucket, their sum and count: what a Prometheus histogram exports."""

    def __init__(self, buckets: Iterable[float]) -> None:
        self.bounds = tuple(sorted(buckets))
        if not self.bounds or any(not math.isfinite(b) for b in self.bounds):
            raise ValueError("histogram buckets must be finite and at least one")
        self.counts = [0] * (len(self.bounds) + 1)  # the last one is +Inf
        self.sum = 0.0
        self.count = 0

    def observe(self, seconds: float) -> None:
        if not math.isfinite(seconds):
            return  # one bad reading must not poison the sum forever
        self.counts[bisect.bisect_left(self.bounds, seconds)] += 1
        self.sum += seconds
        self.count += 1

    @contextlib.contextmanager
    def time(self) -> Iterator[None]:
        """Observe the wall time the block takes, whether or not it raises."""
        start = time.perf_counter()
        try:
            yield
        finally:
            self.observe(time.perf_counter() - start)

    def cumulative(self) -> list[tuple[float, int]]:
        """(upper bound, observations <= bound) for every bucket, ending with (+Inf, count)."""
        out: list[tuple[float, int]] = []
        running = 0
        for bound, n in zip((*self.bounds, math.inf), self.counts, strict=True):
            running += n
            out.append((bound, running))
        return out


class LabelledHistograms:
    """One SecondsHistogram per label value (e.g. per store operation), created on first use.

    Values named up front are exported from the start, at zero, so dashboards see every series.
    """

    def __init__(self, buckets: Iterable[float], known: Iterable[str] = ()) -> None:
        self.buckets = tuple(buckets)
        self.by_label: dict[str, SecondsHistogram] = {}
        for label in known:
            self.get(label)

    def get(self, label: str) -> SecondsHistogram:
        found = self.by_label.get(label)
        if found is None:
            found = self.by_label[label] = SecondsHistogram(self.buckets)
        return found

    def observe(self, label: str, seconds: float) -> None:
        self.get(label).observe(seconds)
