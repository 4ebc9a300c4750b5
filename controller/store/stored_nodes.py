"""Some nodes' rows as stored, not parsed yet (controller/replicas.py): cheap to pass on to the
detection process, parsed into a Fleet where they are used (StoredNodes.fleet). The rows of the
node tables that load() reads: Hellos, ack positions, latest readings, probe results."""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Sequence
from dataclasses import dataclass, field
from sys import intern

from controller.fleet.model import Fleet, GpuState, NodeState, ProbeKey, ProbeRecord
from controller.store.sql import Conn, placeholders, stream
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb

NAMES_PER_QUERY = 500  # nodes named in one IN (...) list


@dataclass(slots=True)
class StoredNodes:
    nodes: list[tuple[str, bytes, float, float]] = field(
        default_factory=list
    )  # name, Hello, first, last seen
    boots: list[tuple[str, str, int, float]] = field(default_factory=list)  # node, boot, acked, updated
    gpus: list[tuple[str, int, float, bytes, str]] = field(
        default_factory=list
    )  # node, gpu, time, sample, held
    hosts: list[tuple[str, float, bytes]] = field(default_factory=list)
    bmcs: list[tuple[str, float, bytes]] = field(default_factory=list)
    # node, gpu (-1: node-level), probe, variant, time, value, unit, ProbeResult
    probes: list[tuple[str, int, str, str, float, float, str, bytes]] = field(default_factory=list)

    def without_hellos(self, names: Collection[str]) -> StoredNodes:
        """The same rows with these nodes' Hellos left empty (controller/fleet/adopt.py: the copy they
        go to holds that Hello already)."""
        nodes = [(n, b"" if n in names else hello, *rest) for n, hello, *rest in self.nodes]
        return StoredNodes(nodes, self.boots, self.gpus, self.hosts, self.bmcs, self.probes)  # type: ignore[arg-type]

    def by_node(self) -> dict[str, StoredNodes]:
        """The same rows, each node's on its own (their first member names the node)."""
        split: dict[str, StoredNodes] = {}
        for table in ("nodes", "boots", "gpus", "hosts", "bmcs", "probes"):
            for row in getattr(self, table):
                of_node = split.get(row[0])
                if of_node is None:
                    of_node = split[row[0]] = StoredNodes()
                getattr(of_node, table).append(row)
        return split

    def fleet(self) -> Fleet:
        """The rows parsed: a Fleet of those nodes (no probe history, no findings)."""
        fleet = Fleet()
        nodes = fleet.nodes
        for name, hello, first_seen, last_seen in self.nodes:
            nodes[name] = NodeState(name, pb.Hello.FromString(hello), first_seen, last_seen)
        for node, boot_id, acked, updated in self.boots:
            fleet.acked[(node, boot_id)] = acked
            if node in nodes:  # a frame's time moves boots.updated, not nodes.last_seen
                nodes[node].last_seen = max(nodes[node].last_seen, updated)
        for node, gpu, time, sample, held in self.gpus:
            if node in nodes:
                nodes[node].gpus[gpu] = GpuState(gpu, pb.GpuSample.FromString(sample), time, json.loads(held))
        for node, time, sample in self.hosts:
            if node in nodes:
                nodes[node].host, nodes[node].host_time = pb.HostSample.FromString(sample), time
        for node, time, sample in self.bmcs:
            if node in nodes:
                nodes[node].bmc, nodes[node].bmc_time = bmc_pb2.BmcSample.FromString(sample), time
        names = {name: name for name in nodes}  # each record's strings shared, not one copy a row
        for node, gpu, probe, variant, time, value, unit, result in self.probes:
            record = ProbeRecord(
                names.get(node, node),
                None if gpu < 0 else gpu,
                intern(probe),
                intern(variant),
                value,
                intern(unit),
                time,
                result,  # peak_ratio read when detection first asks (ProbeRecord.ratio)
            )
            fleet.probes[record.key] = record
        return fleet


# A probe result's time as the reader holds it (None: not held); read from the store's thread.
HeldProbeTime = Callable[[ProbeKey], float | None]


def fetch_nodes(conn: Conn, names: Sequence[str] | None, held: HeldProbeTime | None = None) -> StoredNodes:
    """The named nodes' rows (None: every node's). With `held`, only the probe results newer than
    the reader holds: a node's results rarely change between two looks (a probe round every half
    hour), and they were most of a node's bytes, read and parsed again on every look."""
    rows = StoredNodes()
    if names is None:
        _fetch_into(rows, conn, "", (), held)
    for start in range(0, 0 if names is None else len(names), NAMES_PER_QUERY):
        chunk = tuple(names[start : start + NAMES_PER_QUERY]) if names is not None else ()
        _fetch_into(rows, conn, f" WHERE {{}} IN ({placeholders(chunk)})", chunk, held)
    return rows


def _probe_key(node: object, gpu: int, probe: object, variant: object) -> ProbeKey:
    """A probe_results row's key, as ProbeRecord.key has it (gpu -1 in the row: node-level)."""
    return (str(node), None if gpu < 0 else int(gpu), str(probe), str(variant))


def _newer_probes(conn: Conn, where: str, args: tuple[str, ...], held: HeldProbeTime) -> set[ProbeKey]:
    """The keys of the probe results `where` selects that are newer than `held` says."""
    newer = set()
    for n, g, p, v, t in conn.execute(
        "SELECT node, gpu, probe, variant, time FROM probe_results" + where, args
    ).fetchall():
        key = _probe_key(n, g, p, v)
        known = held(key)
        if known is None or known < t:
            newer.add(key)
    return newer


def _fetch_into(
    rows: StoredNodes, conn: Conn, where: str, args: tuple[str, ...], held: HeldProbeTime | None = None
) -> None:
    """The rows `where` selects (formatted with each table's node column)."""
    on_node = where.format("node")
    rows.nodes += [
        (str(n), bytes(h), float(f), float(s))
        for n, h, f, s in stream(
            conn, "SELECT name, hello, first_seen, last_seen FROM nodes" + where.format("name"), args
        )
    ]
    rows.boots += [
        (str(n), str(b), int(a), float(u))
        for n, b, a, u in stream(conn, "SELECT node, boot_id, acked_seq, updated FROM boots" + on_node, args)
    ]
    rows.gpus += [
        (str(n), int(g), float(t), bytes(s), str(h))
        for n, g, t, s, h in stream(
            conn, "SELECT node, gpu, time, sample, held FROM gpu_state" + on_node, args
        )
    ]
    rows.hosts += [
        (str(n), float(t), bytes(s))
        for n, t, s in stream(conn, "SELECT node, time, sample FROM host_state" + on_node, args)
    ]
    rows.bmcs += [
        (str(n), float(t), bytes(s))
        for n, t, s in stream(conn, "SELECT node, time, sample FROM bmc_state" + on_node, args)
    ]
    probes_where, probes_args, wanted = on_node, args, None
    if held is not None:
        wanted = _newer_probes(conn, on_node, args, held)
        nodes = tuple(sorted({key[0] for key in wanted}))
        if not nodes:
            return
        probes_where, probes_args = f" WHERE node IN ({placeholders(nodes)})", nodes
    rows.probes += [
        (str(n), int(g), str(p), str(v), float(t), float(x), str(u), bytes(r))
        for n, g, p, v, t, x, u, r in stream(
            conn,
            "SELECT node, gpu, probe, variant, time, value, unit, result FROM probe_results" + probes_where,
            probes_args,
        )
        if wanted is None or _probe_key(n, g, p, v) in wanted
    ]
