"""What a silence or maintenance covers, and when a silence stops covering."""

from __future__ import annotations

import math

import pytest

from controller.fleet.silencing import (
    MAINTENANCE,
    MAX_SILENCE_SECONDS,
    Maintenance,
    Silence,
    Silencing,
    silence_error,
)
from tests.controller.harness import T0, stored_finding


def silence(sid: str, node: str, cause: str = "", starts: float = T0, hours: float = 2.0) -> Silence:
    return Silence(sid, node, cause, starts, starts + hours * 3600, "alice (operator) from test")


def test_a_silence_covers_its_node_and_cause_until_its_end() -> None:
    book = Silencing()
    book.add(silence("s1", "n1", "thermal_throttle"), T0)
    assert book.silenced_by("n1", "thermal_throttle", T0) == "s1"
    assert book.silenced_by("n1", "thermal_throttle", T0 + 2 * 3600 - 1) == "s1"
    assert book.silenced_by("n1", "thermal_throttle", T0 + 2 * 3600) == ""  # over at its end
    assert book.silenced_by("n1", "power_cap", T0) == ""  # another cause
    assert book.silenced_by("n2", "thermal_throttle", T0) == ""  # another node
    assert book.silenced_by("n1", "thermal_throttle", T0 - 1) == ""  # before it started


def test_a_silence_without_cause_covers_every_cause_and_the_newest_is_named() -> None:
    book = Silencing()
    book.add(silence("old", "n1", "power_cap", starts=T0 - 60), T0)
    book.add(silence("all", "n1"), T0)
    assert book.silenced_by("n1", "power_cap", T0) == "all"
    assert book.silenced_by("n1", "xid_error", T0) == "all"


def test_maintenance_silences_every_finding_of_its_node() -> None:
    book = Silencing(maintenance={"n1": Maintenance("n1", "bob", "swap PSU", T0)})
    assert book.silenced_by("n1", "psu_failure", T0 + 1e6) == MAINTENANCE
    assert book.silenced_by("n2", "psu_failure", T0) == ""


def test_unsilenced_keeps_resolved_findings_and_drops_covered_active_ones() -> None:
    hot = stored_finding("n1", 0, "thermal_throttle", "warning")
    capped = stored_finding("n1", 1, "power_cap", "warning")
    other = stored_finding("n2", 0, "thermal_throttle", "warning")
    resolved = stored_finding("n1", 2, "thermal_throttle", "warning", active=False)
    book = Silencing()
    book.add(silence("s1", "n1", "thermal_throttle"), T0)
    assert book.unsilenced([hot, capped, other, resolved], T0) == [capped, other, resolved]
    assert book.unsilenced([hot, capped, other, resolved], T0 + 3 * 3600) == [hot, capped, other, resolved]


def test_current_lists_active_silences_newest_first_and_add_forgets_the_ended() -> None:
    book = Silencing()
    book.add(silence("a", "n1", starts=T0 - 10), T0)
    book.add(silence("b", "n2", starts=T0), T0)
    book.add(silence("short", "n1", starts=T0 - 7200, hours=1), T0)  # already over
    assert [s.id for s in book.current("", T0)] == ["b", "a"]
    assert [s.id for s in book.current("n1", T0)] == ["a"]
    book.add(silence("c", "n3", starts=T0 + 1), T0 + 1)
    assert "short" not in book.silences and set(book.silences) == {"a", "b", "c"}


@pytest.mark.parametrize(
    ("cause", "seconds", "error"),
    [
        ("", 60.0, ""),
        ("thermal_throttle", MAX_SILENCE_SECONDS, ""),
        ("nvlink_errors", 1.0, ""),
        ("", 0.0, "must be > 0"),
        ("", -5.0, "must be > 0"),
        ("", math.nan, "must be > 0"),
        ("", MAX_SILENCE_SECONDS + 1, "at most 2592000 (30 days)"),
        ("overheating", 60.0, "unknown cause 'overheating'"),
    ],
)
def test_silence_error(cause: str, seconds: float, error: str) -> None:
    why = silence_error(cause, seconds)
    assert (why == "") if not error else (error in why)
