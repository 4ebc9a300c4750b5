"""The fleet's node names in order, kept between calls.

ListNodes pages through the fleet by name, and each page found its names with a scan of every node
(heapq.nsmallest over the names after the page token): one listing at the default page size was 25
scans of 12,500 names, quadratic in the fleet. /metrics sorted every name at every scrape. The
sorted names now live in Fleet.derived under the fleet's membership (Fleet.members, bumped wherever
a node is added or removed, with the count of nodes as a second check), so the fleet is sorted once
per change of its members and a page is a bisect and a slice.
"""

from __future__ import annotations

import bisect

from controller.fleet.derived import kept
from controller.fleet.model import Fleet

ORDER = "node_order"  # Fleet.derived: ((members, len(nodes)), sorted names)


def node_names(fleet: Fleet) -> list[str]:
    """Every node's name, sorted. Shared between callers: read it, never change it."""
    return kept(fleet, ORDER, (fleet.members, len(fleet.nodes)), lambda: sorted(fleet.nodes))


def names_after(fleet: Fleet, after: str | None, count: int) -> list[str]:
    """Up to `count` names in order, from the first after `after` (None: from the first)."""
    names = node_names(fleet)
    start = 0 if after is None else bisect.bisect_right(names, after)
    return names[start : start + count]
