"""Precision and recall of findings against injected faults, on (node, gpu); gpu None = node-level."""

from __future__ import annotations

import pytest

from controller.demo.score import Key, score


def test_every_fault_found_and_nothing_else_is_perfect() -> None:
    injected: list[Key] = [("n1", 0), ("n2", 3), ("n3", None)]
    assert score(list(reversed(injected)), injected) == (1.0, 1.0)


def test_extra_findings_lower_precision_only() -> None:
    assert score([("n1", 0), ("n1", 1), ("n4", None), ("n5", 2)], [("n1", 0)]) == (0.25, 1.0)


def test_missed_faults_lower_recall_only() -> None:
    assert score([("n1", 0)], [("n1", 0), ("n2", 1), ("n3", 2), ("n4", 0)]) == (1.0, 0.25)


def test_gpu_and_node_level_locations_are_distinct() -> None:
    # A node-level finding does not stand for a GPU fault on that node, nor the other way round.
    assert score([("n1", None)], [("n1", 0)]) == (0.0, 0.0)
    assert score([("n1", 0)], [("n1", None)]) == (0.0, 0.0)
    assert score([("n1", 1)], [("n1", 0)]) == (0.0, 0.0)


def test_repeats_count_once() -> None:
    # Several findings (causes) at one location are one location.
    assert score([("n1", 0), ("n1", 0), ("n2", 0)], [("n1", 0), ("n1", 0)]) == (0.5, 1.0)


@pytest.mark.parametrize(
    ("found", "injected", "expected"),
    [
        ([], [], (1.0, 1.0)),
        ([], [("n1", 0)], (1.0, 0.0)),  # nothing found: no false alarm, everything missed
        ([("n1", 0)], [], (0.0, 1.0)),  # nothing injected: nothing to miss, every finding false
    ],
    ids=["both-empty", "nothing-found", "nothing-injected"],
)
def test_empty_cases(found: list[Key], injected: list[Key], expected: tuple[float, float]) -> None:
    assert score(found, injected) == expected


def test_accepts_any_iterable_once() -> None:
    assert score(iter([("n1", 0), ("n2", 0)]), (k for k in [("n2", 0)])) == (0.5, 1.0)
