"""The fleet majority of a value within a peer group: what most nodes have, for drift detectors.

A setting (a CPU governor, a THP mode, a firmware version) is drift on a node when it differs from
the value most of its peer group has. "Most" is a strict majority: a group split evenly, or with no
value held by more than half its nodes, has no majority to differ from.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

from controller.fleet.model import NodeState
from controller.fleet.peers import node_group


def majority(values: dict[str, str]) -> tuple[str | None, int, int]:
    """(value, count, total) for `values` (node -> value, empty strings left out by the caller):
    the value held by more than half of them, how many hold it, and how many there are. With no
    strict majority (an even split, a three-way spread, no values) the value is None and count is
    the most common value's count (0 with no values)."""
    total = len(values)
    if not total:
        return None, 0, 0
    (value, count), *_ = Counter(values.values()).most_common(1)
    return (value if 2 * count > total else None), count, total


def groups(nodes: Iterable[NodeState]) -> dict[str, list[NodeState]]:
    """Nodes by peer group (controller/fleet/peers.py node_group), in the order given."""
    out: dict[str, list[NodeState]] = {}
    for node in nodes:
        out.setdefault(node_group(node), []).append(node)
    return out
