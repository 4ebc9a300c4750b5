"""The fleet majority of a value within a peer group: a strict majority, or none."""

from __future__ import annotations

import pytest

from controller.fleet.majority import majority


@pytest.mark.parametrize(
    ("values", "expected"),
    [
        ({}, (None, 0, 0)),
        ({"a": "x"}, ("x", 1, 1)),
        ({"a": "x", "b": "x", "c": "y"}, ("x", 2, 3)),
        ({"a": "x", "b": "y"}, (None, 1, 2)),  # an even split has no majority
        ({"a": "x", "b": "x", "c": "y", "d": "y"}, (None, 2, 4)),
        ({"a": "x", "b": "x", "c": "y", "d": "z", "e": "w"}, (None, 2, 5)),  # most common, not most
        ({"a": "x", "b": "x", "c": "x", "d": "y", "e": "z"}, ("x", 3, 5)),
    ],
)
def test_majority_is_held_by_more_than_half(
    values: dict[str, str], expected: tuple[str | None, int, int]
) -> None:
    assert majority(values) == expected
