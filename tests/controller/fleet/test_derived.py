"""Fleet.derived's versioned entries (controller/fleet/derived.py): built once per version, carried
only from the version they were kept under, forgotten on request."""

from __future__ import annotations

from controller.fleet.derived import carried, forget, keep, kept, probes_version
from controller.fleet.model import Fleet


def test_kept_builds_once_per_version() -> None:
    fleet = Fleet()
    built: list[int] = []

    def build() -> list[int]:
        built.append(1)
        return [len(built)]

    first = kept(fleet, "thing", (1, 0), build)
    assert kept(fleet, "thing", (1, 0), build) is first  # the same version: the same object
    assert built == [1]
    assert kept(fleet, "thing", (2, 0), build) == [2]  # the version moved: built again
    assert kept(fleet, "other", (2, 0), build) == [3]  # each name its own entry


def test_carried_only_from_the_version_it_was_kept_under() -> None:
    fleet = Fleet()
    assert carried(fleet, "thing", (1, 0)) is None  # nothing kept
    keep(fleet, "thing", (1, 0), {"a": 1})
    assert carried(fleet, "thing", (0, 0)) is None
    value = carried(fleet, "thing", (1, 0))
    assert value == {"a": 1}
    value["b"] = 2
    keep(fleet, "thing", (2, 1), value)
    assert kept(fleet, "thing", (2, 1), dict) == {"a": 1, "b": 2}
    forget(fleet, "thing")
    forget(fleet, "thing")  # twice: nothing to drop, no error
    assert carried(fleet, "thing", (2, 1)) is None


def test_probes_version_moves_with_a_result_or_a_bump() -> None:
    fleet = Fleet()
    before = probes_version(fleet)
    fleet.probe_version += 1
    assert probes_version(fleet) != before
