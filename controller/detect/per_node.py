"""What a detector reads out of each node's messages, kept (in Fleet.derived) until a message it was
read from is replaced.

A node's Hello, host sample, BMC sample and GPU readings (GpuState) are replaced when new ones come,
never changed in place (fleet/state.py, fleet/adopt.py; see per_gpu.py). So a value read from them
stands while the node holds the very objects it was read from (`is`: comparing messages would cost
what reading them does), and a pass reads again only the nodes with a new one: about an eighth of a
12,500-node fleet between two passes under load, not every node.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

from controller.fleet.derived import carried, keep, same_objects
from controller.fleet.model import Fleet, NodeState

T = TypeVar("T")
Sources = Callable[[NodeState], tuple[object, ...]]


def per_node(
    fleet: Fleet,
    name: str,
    sources: Sources,
    read: Callable[[NodeState], T],
    *,
    context: object = None,
    keep_equal: bool = False,
) -> dict[str, T]:
    """Every node's read(node), read again only where sources(node) are not the objects it was read
    from, or `context` (what `read` depends on besides the node: a config value) is not the one it
    was read under. keep_equal: a value read again that equals the one kept stays the object kept,
    so a caller can tell by identity alone that nothing changed (drift.py's groups). Kept in
    Fleet.derived under `name`; nodes gone from the fleet drop out."""
    before: dict[str, tuple[tuple[object, ...], T]] = carried(fleet, name, context) or {}
    kept: dict[str, tuple[tuple[object, ...], T]] = {}
    out: dict[str, T] = {}
    for node_name, node in fleet.nodes.items():
        now = sources(node)
        entry = before.get(node_name)
        if entry is None or not same_objects(entry[0], now):
            value = read(node)
            if keep_equal and entry is not None and entry[1] == value:
                value = entry[1]
            entry = (now, value)
        kept[node_name] = entry
        out[node_name] = entry[1]
    keep(fleet, name, context, kept)
    return out
