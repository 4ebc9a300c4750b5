"""Taking in nodes that another replica ingests (replica_ingest, controller/replicas.py), as it
stored them: the leader's fleet (and its detection copy) and a replica that takes a node over are
changed by this, where a frame would be by state.apply_frame.

Only what is newer than the fleet holds replaces it: a GPU's, the host's and the BMC's readings by
their times, probe results by theirs (each also goes into its key's history). The error counters'
trends observe each newer reading, so rates come at the pace the owner writes its readings
(`replica_sync_seconds`), not at every frame; XID events between two such writes are not seen
here (a held condition the owner computed is).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

from controller.fleet.model import Fleet, NodeState, ProbeKey
from controller.fleet.series import Series
from controller.fleet.state import remember
from protos.gpufleet.v1 import telemetry_pb2 as pb

UNCHANGED = pb.Hello()  # a stored node's Hello when the copy it is sent to has the same one


def adopt(fleet: Fleet, stored: Fleet, heard: Mapping[str, float], *, counters: bool = True) -> list[str]:
    """Merge `stored` (nodes loaded from the store) into `fleet`; the names of the nodes merged.
    heard: node -> when its owner last wrote it (its clock), for NodeState.last_heard.
    counters=False leaves the error counters' trends alone, as for apply_frame. A node whose Hello
    is UNCHANGED keeps the one it has (one not held yet is left out)."""
    names = []
    for name, row in stored.nodes.items():
        node = fleet.nodes.get(name)
        if node is None:
            if not row.hello.node:  # (UNCHANGED: a node this copy should hold already)
                continue
            node = fleet.nodes[name] = NodeState(name, row.hello, row.first_seen, row.last_seen)
            fleet.probe_version += 1
            fleet.members += 1
        elif row.hello.node and node.hello != row.hello:
            node.hello = row.hello
            fleet.probe_version += 1  # its inventory and probe facts may differ
            present = {g.index for g in row.hello.inventory.gpus}
            for index in [i for i in node.gpus if i not in present]:
                del node.gpus[index]
        node.last_seen = max(node.last_seen, row.last_seen)
        node.last_heard = max(node.last_heard, heard.get(name, 0.0))
        for index, gpu in sorted(row.gpus.items()):
            held = node.gpus.get(index)
            if held is None or held.time < gpu.time:
                node.gpus[index] = gpu
                node.trends.observe_gpu(gpu.sample, gpu.time, counters=counters)
        if row.host is not None and node.host_time < row.host_time:
            node.host, node.host_time = row.host, row.host_time
            if counters:
                node.trends.observe_host(row.host, row.host_time)
        if row.bmc is not None and node.bmc_time < row.bmc_time:
            node.bmc, node.bmc_time = row.bmc, row.bmc_time
        names.append(name)
    for key, record in stored.probes.items():
        current = fleet.probes.get(key)
        if record.node in fleet.nodes and (current is None or current.time < record.time):
            fleet.probes[key] = record
            remember(fleet, key, record.time, record.value)
            fleet.probe_version += 1
    for boot, acked in stored.acked.items():
        if boot[0] in fleet.nodes:
            fleet.acked[boot] = max(fleet.acked.get(boot, 0), acked)
    return names


def adopt_history(fleet: Fleet, history: Mapping[ProbeKey, Series]) -> int:
    """Probe keys' history as stored (nodes another replica ingests: their results since the last
    look may be more than the newest one `adopt` took in) in place of what `fleet` holds, keeping
    the points it holds that are newer than the stored ones (a result ingested here meanwhile).
    Keys of nodes `fleet` does not hold are left out; how many keys were taken."""
    taken = 0
    for read, stored in history.items():
        node = fleet.nodes.get(read[0])
        if node is None:
            continue
        # The node's name as this fleet holds it, not one more copy of the string a key
        key = read if read[0] is node.name else (node.name, read[1], read[2], read[3])
        series = Series(stored)  # a copy: the caller's may be another fleet's
        held = fleet.history.get(key)
        if held:
            newest = series[-1][0] if len(series) else float("-inf")
            for time, value in held:
                if time > newest:
                    series.add(time, value)
        fleet.history[key] = series
        taken += 1
    if taken:
        fleet.probe_version += 1  # what detectors derived from the history is stale
    return taken


def carry(fleet: Fleet, source: Fleet, names: Iterable[str]) -> list[str]:
    """Nodes of `source`, the fleet a replica's own ingest kept as a standby while their agents
    streamed to it, put in `fleet`, the one it leads with (their streams stay open): each NodeState as
    it is (its memory is the newest: readings, counter trends, XIDs), the newer probe results and ack
    positions merged, and each key's results newer than `fleet`'s history holds added to it. The
    names carried (those `source` holds), sorted."""
    carried = sorted(n for n in set(names) if n in source.nodes)
    if not carried:
        return carried
    for name in carried:
        fleet.nodes[name] = source.nodes[name]
    fleet.members += 1  # (node_order: its objects changed, some may be new)
    fleet.probe_version += 1  # their Hellos may be newer than the store's
    kept = set(carried)
    for key, record in source.probes.items():
        if record.node not in kept:
            continue
        current = fleet.probes.get(key)
        if current is None or current.time < record.time:
            fleet.probes[key] = record
        held = fleet.history.get(key)
        newest = held[-1][0] if held else float("-inf")
        points = [(t, v) for t, v in source.history.get(key, ()) if t > newest]  # the results since
        if not points and record.time > newest:
            points = [(record.time, record.value)]
        for time, value in points:
            remember(fleet, key, time, value)
    for boot, acked in source.acked.items():
        if boot[0] in kept:
            fleet.acked[boot] = max(fleet.acked.get(boot, 0), acked)
    return carried
