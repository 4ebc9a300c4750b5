"""Probe results by peer group: what detect/probe_outlier.py compares each result with.

Peers are results of the same probe, variant and unit on GPUs of the same class (controller/fleet/
peers.py gpu_class: model, board part number, NVLink count, default power limit, driver branch;
node-level results: the node's model, GPU count and its GPUs' classes), and the same direction of
"better" (the node's ProbeInfo): all of it from the result and its node's Hello.

Finding every result's group each pass was half of probe_outlier's judgement at 12,500 nodes
(712,500 results), and under load a result arrives between nearly every two passes. So the grouping
lives in Fleet.derived under the fleet's (probe_version, len(probes)), as probe_index.py's does:
apply_frame carries new results into it (`probed`), and anything else that changes the results or
what their groups read (a Hello saying otherwise of its node's GPUs or probes, expiry, a replica
taking nodes in, the store's load, a detection process's copy) bumps the version, so the next reader
groups every result again.

Within a group the results keep Fleet.probes' order (a replaced result keeps its key's place, a new
key comes last), as grouping them afresh would: the first slow result of a GPU is the evidence.
"""

from __future__ import annotations

from collections.abc import Iterable

from controller.fleet.derived import carried, forget, keep, kept, probes_version
from controller.fleet.model import Fleet, ProbeKey, ProbeRecord
from controller.fleet.peers import GpuClass, probe_classes
from controller.fleet.probe_info import probe_infos
from protos.gpufleet.v1 import telemetry_pb2 as pb

# (model, the rest of its GpuClass, "gpu", probe, variant, unit, "higher" | "lower"), or for a
# node-level result (*node_class, probe, variant, unit, "higher" | "lower")
Group = tuple[str, ...]
GROUPED = "probe_groups"  # Fleet.derived: ((probe_version, len(probes)), group -> {key: record})


class PeerGroups:
    """The peer group of results: each node's probe facts and GPU classes read once, not once per
    result."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self._nodes: dict[str, tuple[dict[str, pb.ProbeInfo], dict[int, GpuClass], tuple[str, ...]]] = {}

    def of(self, record: ProbeRecord) -> Group | None:
        """None: the result's node is not in the fleet."""
        facts = self._nodes.get(record.node)
        if facts is None:
            node = self.fleet.nodes.get(record.node)
            if node is None:
                return None
            facts = self._nodes[record.node] = (probe_infos(node.hello), *probe_classes(node))
        infos, gpus, node_key = facts
        info = infos.get(record.probe)
        better = "higher" if info is None or info.higher_is_better else "lower"
        what = (record.probe, record.variant, record.unit, better)
        if record.gpu is None:
            return (*node_key, *what)
        return (*gpus.get(record.gpu, ("", "")), "gpu", *what)


def described(group: Group) -> str:
    """The GPUs a group's results come from, in words: "NVIDIA H100 80GB HBM3, 692-2G520-0200-000,
    18 NVLinks, 700 W, driver 550" (per GPU), "8 x NVIDIA H100 80GB HBM3, ..." (per node)."""
    if group[2] == "gpu":
        model, rest = group[0], group[1]
    else:
        model, rest = f"{group[1]} x {group[0]}", group[2]
    return f"{model or 'unknown model'}, {rest}" if rest else model or "unknown model"


def peer_group(fleet: Fleet, record: ProbeRecord) -> Group | None:
    return PeerGroups(fleet).of(record)


def grouped(fleet: Fleet) -> dict[Group, dict[ProbeKey, ProbeRecord]]:
    """Every stored result of a node in the fleet, by peer group. Read, not changed, by callers."""

    def build() -> dict[Group, dict[ProbeKey, ProbeRecord]]:
        groups: dict[Group, dict[ProbeKey, ProbeRecord]] = {}
        peers_of = PeerGroups(fleet)
        for key, record in fleet.probes.items():
            group = peers_of.of(record)
            if group is not None:
                members = groups.get(group)
                if members is None:
                    members = groups[group] = {}
                members[key] = record
        return groups

    return kept(fleet, GROUPED, probes_version(fleet), build)


def probed(fleet: Fleet, before: tuple[int, int], records: Iterable[ProbeRecord]) -> None:
    """Carry results apply_frame has just stored into the grouping, if it was current `before` they
    were (the fleet's (probe_version, len(probes)) then); otherwise the next reader groups afresh.
    A key whose result moved to another group (its unit changed) leaves it to the next reader too:
    its place in the new group would not be its place in Fleet.probes."""
    groups: dict[Group, dict[ProbeKey, ProbeRecord]] | None = carried(fleet, GROUPED, before)
    if groups is None:
        return
    peers_of = PeerGroups(fleet)
    for record in records:
        key = record.key
        current = fleet.probes[key]  # the newest: `record`, or one stored before it
        group = peers_of.of(current)
        if group is None:
            continue
        members = groups.get(group)
        if members is None:
            members = groups[group] = {}
        elif key in members:
            members[key] = current  # in its place
            continue
        if _elsewhere(groups, key, group):
            forget(fleet, GROUPED)
            return
        members[key] = current  # a new key: last, as in Fleet.probes
    keep(fleet, GROUPED, probes_version(fleet), groups)


def _elsewhere(groups: dict[Group, dict[ProbeKey, ProbeRecord]], key: ProbeKey, group: Group) -> bool:
    """Whether `key` is in a group other than `group` (looked for only for a key new to `group`)."""
    return any(key in members for other, members in groups.items() if other != group)
