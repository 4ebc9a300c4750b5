"""InfiniBand (and RoCE) ports down, slow or erroring: one ib_link_degraded finding per node, with
each bad port's evidence (device/port in its reasons and detail).

A port is bad when
- it is not up (state not "active" or physical_state not "link_up") while most of the peer group's
  nodes that have the same device/port run it active: a port down across the group is unused or
  uncabled, not a fault. A node alone in its group compares with its own ports instead: a port of
  a link layer whose other ports (two or more) are all active is a rail lost. Severity critical.
- it is active below the usual rate: the median rate of the peers' same active port, else (no
  peers) the fastest of the node's own active ports of the same link layer. Severity warning.
- its error counters rise (NodeState.trends over its window, once it spans at least a minute):
  symbol errors, receive errors or link error recoveries above detect.ib_errors_per_minute, or
  detect.ib_link_downs_per_window link-downs or more (a flapping link). Severity warning.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import NamedTuple

from controller.detect.base import DetectContext, peer_groups, register
from controller.fleet.finding import Evidence, Finding, worse
from controller.fleet.model import NodeState
from controller.fleet.trends import ib_group, ib_key
from protos.gpufleet.v1 import telemetry_pb2 as pb

NAME = "infiniband"

MIN_SPAN_SECONDS = 60.0  # a counter rate is judged on at least this much of its window
RATE_TOLERANCE = 0.99  # a rate this close to the usual one is the usual one
ERROR_COUNTERS = {  # counter -> how the detail names it
    "symbol_error_total": "symbol errors",
    "port_rcv_errors_total": "receive errors",
    "link_error_recovery_total": "link error recoveries",
}
LINK_DOWNED = "link_downed_total"

PortKey = tuple[str, int]  # device, port


def port_name(port: pb.InfinibandPortSample) -> str:
    return f"{port.device}/{port.port}"


def is_up(port: pb.InfinibandPortSample) -> bool:
    return port.state == "active" and port.physical_state in ("link_up", "")


@dataclass(slots=True)
class Bad:
    """One bad port's evidence, worst first."""

    severity: str
    evidence: list[Evidence]


def _ports(node: NodeState) -> dict[PortKey, pb.InfinibandPortSample]:
    return {} if node.host is None else {(p.device, p.port): p for p in node.host.infiniband}


@dataclass(slots=True)
class PortPeers:
    """One device/port across a peer group, gathered once per pass (asking each node's peers port
    by port cost the group's size squared)."""

    total: int = 0  # nodes of the group that have the port
    active: int = 0  # ...with it up
    rates: list[float] = field(default_factory=list)  # the rates of those up that report one, sorted

    def without(self, port: pb.InfinibandPortSample) -> tuple[int, int, PeerRates]:
        """(total, active, rates) of the node's peers: the group less this node's own port. The
        rates' median is read off the sorted list around the port's own place, with no copy (a
        copy per port cost the group's size squared)."""
        up = is_up(port)
        skip = None
        if up and port.HasField("rate_gbps"):
            skip = bisect.bisect_left(self.rates, port.rate_gbps)
        return self.total - 1, self.active - (1 if up else 0), _median_without(self.rates, skip)


class PeerRates(NamedTuple):
    median: float | None  # None: no peer reports a rate
    peers: int


def _median_without(rates: list[float], skip: int | None) -> PeerRates:
    """The median of sorted `rates` less the one at index `skip` (None: all of them)."""
    count = len(rates) - (0 if skip is None else 1)
    if count <= 0:
        return PeerRates(None, 0)

    def at(k: int) -> float:
        return rates[k if skip is None or k < skip else k + 1]

    return PeerRates((at((count - 1) // 2) + at(count // 2)) / 2, count)


def group_ports(group: list[NodeState]) -> dict[PortKey, PortPeers]:
    out: dict[PortKey, PortPeers] = {}
    for node in group:
        for key, port in _ports(node).items():
            peers = out.setdefault(key, PortPeers())
            peers.total += 1
            if is_up(port):
                peers.active += 1
                if port.HasField("rate_gbps"):
                    peers.rates.append(port.rate_gbps)
    for peers in out.values():
        peers.rates.sort()
    return out


def _down(node: NodeState, port: pb.InfinibandPortSample, total: int, active: int) -> Evidence | None:
    """`total`, `active`: the peers that have this port, and those with it up."""
    name = port_name(port)
    if total:
        if 2 * active <= total:
            return None  # down on most of the group too: unused or uncabled
        baseline, where = f"active on {active} of {total} peers", "peers"
    else:
        same = [p for p in _ports(node).values() if p.link_layer == port.link_layer and p is not port]
        if len(same) < 2 or not all(is_up(p) for p in same):
            return None
        baseline, where = f"the node's other {len(same)} {port.link_layer} ports active", "expected"
    state = f"{port.state or 'unknown'} ({port.physical_state or 'unknown'})"
    return Evidence(
        metric="infiniband.state",
        reasons=(name, port.state, port.physical_state),
        peers=total,
        detail=f"{name} {state}, {baseline}",
        baseline_source=where,
    )


def _slow(node: NodeState, port: pb.InfinibandPortSample, rates: PeerRates) -> Evidence | None:
    """`rates`: the peers' rates of this port where it is up."""
    if not port.HasField("rate_gbps"):
        return None
    if rates.median is not None:
        usual, where, whose = rates.median, "peers", "peers"
    else:
        own = [
            p.rate_gbps
            for p in _ports(node).values()
            if p is not port and p.link_layer == port.link_layer and is_up(p) and p.HasField("rate_gbps")
        ]
        if not own:
            return None
        usual, where, whose = max(own), "expected", "the node's other ports"
    if usual <= 0 or port.rate_gbps >= RATE_TOLERANCE * usual:
        return None
    name = port_name(port)
    return Evidence(
        metric="infiniband.rate_gbps",
        value=port.rate_gbps,
        baseline=usual,
        deviation=port.rate_gbps / usual - 1.0,
        unit="Gb/s",
        reasons=(name, "rate_below_usual"),
        peers=rates.peers,
        detail=f"{name} at {port.rate_gbps:g} Gb/s, {whose} {usual:g}",
        baseline_source=where,
    )


def _erroring(node: NodeState, port: pb.InfinibandPortSample, ctx: DetectContext) -> list[Evidence]:
    trends = node.trends
    if not trends.changed(ib_group(port.device, port.port)):
        # No counter of the port rose within the window (the usual case): every increase is 0, under
        # both thresholds (ib_errors_per_minute > 0, ib_link_downs_per_window >= 1).
        return []
    name, out = port_name(port), []
    for counter, words in ERROR_COUNTERS.items():
        key = ib_key(port.device, port.port, counter)
        span = trends.span(key)
        if span < MIN_SPAN_SECONDS:
            continue
        per_minute = trends.increase(key) / span * 60.0
        if per_minute <= ctx.config.ib_errors_per_minute:
            continue
        out.append(
            Evidence(
                metric=f"infiniband.{counter}",
                value=round(per_minute, 2),
                baseline=ctx.config.ib_errors_per_minute,
                unit="/min",
                reasons=(name, counter),
                held_seconds=round(span, 1),
                detail=f"{name}: {per_minute:.3g} {words}/min over {span:.0f} s",
                baseline_source="expected",
            )
        )
    key = ib_key(port.device, port.port, LINK_DOWNED)
    downs = trends.increase(key)
    if is_up(port) and downs >= ctx.config.ib_link_downs_per_window:
        out.append(
            Evidence(
                metric=f"infiniband.{LINK_DOWNED}",
                value=downs,
                baseline=float(ctx.config.ib_link_downs_per_window),
                unit="link downs",
                reasons=(name, LINK_DOWNED),
                held_seconds=round(trends.span(key), 1),
                detail=f"{name}: link went down {downs:.0f} times in {trends.span(key):.0f} s",
                baseline_source="expected",
            )
        )
    return out


def bad_ports(node: NodeState, group: dict[PortKey, PortPeers], ctx: DetectContext) -> list[Bad]:
    """The node's bad ports, worst first; `group`: its peer group's ports (group_ports)."""
    out = []
    for key, port in sorted(_ports(node).items()):
        total, active, rates = group[key].without(port)
        if not is_up(port):
            down = _down(node, port, total, active)
            if down is not None:
                out.append(Bad("critical", [down]))
            continue
        evidence = [e for e in (_slow(node, port, rates),) if e is not None]
        evidence += _erroring(node, port, ctx)
        if evidence:
            out.append(Bad("warning", evidence))
    out.sort(key=lambda b: b.severity != "critical")
    return out


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    for group in peer_groups(ctx).values():
        ports = group_ports(group)
        for node in group:
            bad = bad_ports(node, ports, ctx)
            if not bad:
                continue
            severity = "warning"
            for b in bad:
                severity = worse(severity, b.severity)
            evidence = [e for b in bad for e in b.evidence]
            # One line per port: "mlx5_0/1 at 200 Gb/s, peers 400; mlx5_0/1: 48 symbol errors/min ..."
            summary = "; ".join(e.detail for e in evidence)
            findings.append(
                Finding(
                    node.name, None, "ib_link_degraded", severity, summary, evidence[0], evidence[1:], [NAME]
                )
            )
    return findings
