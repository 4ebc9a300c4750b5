"""What a reader works out from the whole fleet, kept in Fleet.derived under a version of what it
was worked out from, and worked out again only when that version moved.

The probe results' readers (probe_index, probe_groups, probe_schedule's LAST_PROBED) keep theirs
under `probes_version`: a Hello that says otherwise of its node's GPUs or probes (apply_hello),
expiry, a replica taking nodes in, the store's load and the detection process's copy bump
Fleet.probe_version; apply_frame only adds results, and carries
them into what was current before it did (`carried`, then `keep` under the new version), so a
result arriving does not have the next reader walk every stored one.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Hashable
from operator import is_
from typing import Any, TypeVar, cast

from controller.fleet.model import Fleet

T = TypeVar("T")


def probes_version(fleet: Fleet) -> tuple[int, int]:
    """The version of the fleet's probe results: (probe_version, len(probes))."""
    return (fleet.probe_version, len(fleet.probes))


def kept(fleet: Fleet, name: str, version: Hashable, build: Callable[[], T]) -> T:
    """What `name` kept under `version`; else `build()`, kept under it from now."""
    cached = fleet.derived.get(name)
    if cached is not None and cached[0] == version:
        return cast(T, cached[1])
    value = build()
    fleet.derived[name] = (version, value)
    return value


def carried(fleet: Fleet, name: str, before: Hashable) -> Any:
    """What `name` kept, if it was kept under `before` (the version before a change the caller
    carries into it, then keeps under the new version); None: the next reader builds it."""
    cached = fleet.derived.get(name)
    return None if cached is None or cached[0] != before else cached[1]


def keep(fleet: Fleet, name: str, version: Hashable, value: object) -> None:
    fleet.derived[name] = (version, value)


def forget(fleet: Fleet, name: str) -> None:
    """Drop what `name` kept: the next reader builds it."""
    fleet.derived.pop(name, None)


def same_objects(a: Collection[object], b: Collection[object]) -> bool:
    """Whether `a` and `b` hold the very same objects in the same order: what a reader kept from
    messages is current while each message is the one it read (an accepted reading replaces a
    message, never changes one in place)."""
    return len(a) == len(b) and all(map(is_, a, b))
