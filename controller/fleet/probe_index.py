"""One node's stored probe results without walking the fleet's.

`gpufleet node NAME` (GetNode) and the uncordon check (kube/recovery.py) want one node's results;
a walk of Fleet.probes for them cost 42.5 ms of the event loop per call at 12,500 nodes (712,500
results). The index (node -> its results' keys) lives in Fleet.derived under the fleet's
(probe_version, len(probes)), as probe_schedule's LAST_PROBED does: apply_frame carries new
results into it (`probed`), and anything else that changes the results (a Hello saying otherwise
of its node's GPUs or probes, expiry, a replica taking nodes in, the store's load, the detection
process's copy) bumps the version, so the next reader builds it again from the results themselves.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.fleet.derived import carried, keep, kept, probes_version
from controller.fleet.model import Fleet, ProbeKey, ProbeRecord

BY_NODE = "probes_by_node"  # Fleet.derived: ((probe_version, len(probes)), node -> {key: None})


def _index(fleet: Fleet) -> dict[str, dict[ProbeKey, None]]:
    def build() -> dict[str, dict[ProbeKey, None]]:
        index: dict[str, dict[ProbeKey, None]] = {}
        for key in fleet.probes:
            index.setdefault(key[0], {})[key] = None
        return index

    return kept(fleet, BY_NODE, probes_version(fleet), build)


def node_probes(fleet: Fleet, node: str) -> list[ProbeRecord]:
    """The node's stored results (the newest of each probe, variant and GPU), in no set order."""
    keys = _index(fleet).get(node, {})
    return [record for key in keys if (record := fleet.probes.get(key)) is not None]


def newest_probe(fleet: Fleet, node: str) -> float:
    """The time of the node's newest stored probe result (0: none)."""
    return max((r.time for r in node_probes(fleet, node)), default=0.0)


def probed(fleet: Fleet, before: tuple[int, int], records: Iterable[ProbeRecord]) -> None:
    """Carry results apply_frame has just stored into the index, if it was current `before` they
    were (the fleet's (probe_version, len(probes)) then); otherwise the next reader builds it."""
    index: dict[str, dict[ProbeKey, None]] | None = carried(fleet, BY_NODE, before)
    if index is None:
        return
    for record in records:
        index.setdefault(record.node, {})[record.key] = None
    keep(fleet, BY_NODE, probes_version(fleet), index)
