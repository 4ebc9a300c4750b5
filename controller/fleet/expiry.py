"""Forgetting long-gone nodes (limits.forget_after_seconds): which ones, and their removal from the
fleet in memory. The store's rows go with controller/store/forget.py; the audit log stays."""

from __future__ import annotations

from collections.abc import Collection

from controller.fleet.health import silent_for
from controller.fleet.model import Fleet


def gone_nodes(fleet: Fleet, now: float, forget_after_seconds: float) -> list[str]:
    """Nodes with no open stream and silent longer than `forget_after_seconds`, by name; none when
    it is 0 (never forget)."""
    if forget_after_seconds <= 0:
        return []
    return sorted(
        node.name
        for node in fleet.nodes.values()
        if not node.connected and silent_for(node, now) > forget_after_seconds
    )


def forget(fleet: Fleet, names: Collection[str]) -> None:
    """Drop the nodes, their boots' ack positions, their probe results and their history from `fleet`."""
    gone = set(names)
    fleet.probe_version += 1
    fleet.forgets += 1
    fleet.members += 1
    for name in gone:
        fleet.nodes.pop(name, None)
    for key in [k for k in fleet.acked if k[0] in gone]:
        del fleet.acked[key]
    for probe in [k for k in fleet.probes if k[0] in gone]:
        del fleet.probes[probe]
    for probe in [k for k in fleet.history if k[0] in gone]:
        del fleet.history[probe]
