"""Precision and recall of findings against injected faults, on (node, gpu); gpu None = node-level."""

from __future__ import annotations

from collections.abc import Iterable

Key = tuple[str, int | None]


def score(found: Iterable[Key], injected: Iterable[Key]) -> tuple[float, float]:
    """(precision, recall) over distinct locations. With nothing found precision is 1.0 (no false
    alarm); with nothing injected recall is 1.0 (nothing to miss)."""
    found_set, injected_set = set(found), set(injected)
    hits = len(found_set & injected_set)
    precision = hits / len(found_set) if found_set else 1.0
    recall = hits / len(injected_set) if injected_set else 1.0
    return precision, recall
