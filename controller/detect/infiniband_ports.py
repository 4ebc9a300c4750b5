"""The InfiniBand ports the infiniband detector judges, as plain values, and a peer group's ports.

A port's state (not its counters) is what the verdicts of down and slow ports read. Nodes built
alike report the same ports in the same state, so a group of thousands of nodes holds a handful of
distinct port sets (`Ports`): the group's ports are counted once per distinct set, and each set is
judged once per pass (infiniband.py), not once per node.

Each node's ports are read once per host sample and kept (in Fleet.derived) until the sample is
replaced: a HostSample is replaced when a new one comes, never changed in place (as drift_values.py
relies on for the Hello and the BMC sample). Reading ten ports out of every node's message, and
comparing each port with its group's one by one, was most of the detector's time at 12,500 nodes.
Under load every node's host sample is new at every pass: a new one whose ports' digest
(HostSample.infiniband_digest, from the agent) is the one they were read under keeps them unread
(reading them was 25 us a node); an older agent's, sent without one, is read.
"""

from __future__ import annotations

import bisect
from collections import Counter
from dataclasses import dataclass, field
from functools import lru_cache
from operator import attrgetter
from typing import NamedTuple

from controller.detect.stats import median_less
from controller.fleet.derived import carried, keep
from controller.fleet.model import Fleet, NodeState
from controller.fleet.trends import ib_group
from protos.gpufleet.v1 import telemetry_pb2 as pb

KEPT = "infiniband_ports"  # Fleet.derived, by detect/per_node.py
PORTS_KEPT = 4096  # distinct port states kept built (_port)

PortKey = tuple[str, int]  # device, port


class Port(NamedTuple):
    """One port's state as its reading had it."""

    device: str
    port: int
    state: str
    physical_state: str
    link_layer: str
    rate: float | None  # Gb/s; None when not reported
    up: bool  # active, and its physical link up (or not reported)
    group: str  # its error counters' group in NodeState.trends

    @property
    def key(self) -> PortKey:
        return (self.device, self.port)

    @property
    def name(self) -> str:
        return f"{self.device}/{self.port}"


Ports = tuple[Port, ...]  # a node's ports in (device, port) order, one per device/port


_STATE = attrgetter("device", "port", "state", "physical_state", "link_layer")  # read in one C call


@lru_cache(maxsize=PORTS_KEPT)
def _port(read: tuple[str, int, str, str, str], rate: float | None) -> Port:
    """The one Port of these values (_STATE's read of a port, and its rate): a fleet's nodes report
    a handful of distinct port states, so each pass reads every node's ports but builds few, and
    equal port sets are found equal by identity (of_nodes counts them)."""
    device, port, state, physical_state, link_layer = read
    up = state == "active" and physical_state in ("link_up", "")
    return Port(device, port, state, physical_state, link_layer, rate, up, ib_group(device, port))


def read_ports(host: pb.HostSample | None) -> Ports:
    """The sample's ports in (device, port) order; of a device/port listed twice, the last."""
    if host is None:
        return ()
    by_key = {}
    for sample in host.infiniband:
        read = _STATE(sample)
        by_key[read[:2]] = (read, sample.rate_gbps if sample.HasField("rate_gbps") else None)
    return tuple(_port(*by_key[key]) for key in sorted(by_key))


# A node's ports as kept: the host sample and the ports' digest they were read from (0: none sent).
_Kept = tuple[pb.HostSample | None, int, Ports]


def node_ports(fleet: Fleet) -> dict[str, Ports]:
    """Every node's ports, read again only where its host sample is not the one they were read from
    and, if its agent sends one, their digest is not the one they were read under. Nodes gone from
    the fleet are dropped."""
    before: dict[str, _Kept] = carried(fleet, KEPT, None) or {}
    kept: dict[str, _Kept] = {}
    out: dict[str, Ports] = {}
    for name, node in fleet.nodes.items():
        host = node.host
        entry = before.get(name)
        if entry is None or entry[0] is not host:
            digest = 0 if host is None else host.infiniband_digest
            if entry is not None and digest and entry[1] == digest:
                entry = (host, digest, entry[2])
            else:
                entry = (host, digest, read_ports(host))
        kept[name] = entry
        out[name] = entry[2]
    keep(fleet, KEPT, None, kept)
    return out


class PeerRates(NamedTuple):
    median: float | None  # None: no peer reports a rate
    peers: int


@dataclass(slots=True)
class PortPeers:
    """One device/port across a peer group, gathered once per pass (asking each node's peers port
    by port cost the group's size squared)."""

    total: int = 0  # nodes of the group that have the port
    active: int = 0  # ...with it up
    rates: list[float] = field(default_factory=list)  # the rates of those up that report one, sorted

    def without(self, port: Port) -> tuple[int, int, PeerRates]:
        """(total, active, rates) of the node's peers: the group less this node's own port. The
        rates' median is read off the sorted list around the port's own place, with no copy (a
        copy per port cost the group's size squared)."""
        skip = None
        if port.up and port.rate is not None:
            skip = bisect.bisect_left(self.rates, port.rate)
        return self.total - 1, self.active - (1 if port.up else 0), PeerRates(*median_less(self.rates, skip))


def group_ports(sets: Counter[Ports]) -> dict[PortKey, PortPeers]:
    """The group's ports, from its nodes' distinct port sets and how many nodes hold each."""
    out: dict[PortKey, PortPeers] = {}
    for ports, nodes in sets.items():
        for port in ports:
            peers = out.get(port.key)
            if peers is None:
                peers = out[port.key] = PortPeers()
            peers.total += nodes
            if port.up:
                peers.active += nodes
                if port.rate is not None:
                    peers.rates.extend([port.rate] * nodes)
    for peers in out.values():
        peers.rates.sort()
    return out


def of_nodes(group: list[NodeState], ports: dict[str, Ports]) -> tuple[list[Ports], Counter[Ports]]:
    """Each node's ports in the group's order, and how many nodes hold each distinct set."""
    sets = [ports[node.name] for node in group]
    return sets, Counter(sets)
