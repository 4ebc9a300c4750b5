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

import statistics
from dataclasses import dataclass

from controller.detect.base import DetectContext, register
from controller.fleet.finding import Evidence, Finding, worse
from controller.fleet.majority import groups
from controller.fleet.model import NodeState
from controller.fleet.trends import ib_key
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


def _down(
    node: NodeState, port: pb.InfinibandPortSample, peers: list[pb.InfinibandPortSample]
) -> Evidence | None:
    name = port_name(port)
    if peers:
        active = sum(1 for p in peers if is_up(p))
        if 2 * active <= len(peers):
            return None  # down on most of the group too: unused or uncabled
        baseline, where = f"active on {active} of {len(peers)} peers", "peers"
    else:
        same = [p for p in _ports(node).values() if p.link_layer == port.link_layer and p is not port]
        if len(same) < 2 or not all(is_up(p) for p in same):
            return None
        baseline, where = f"the node's other {len(same)} {port.link_layer} ports active", "expected"
    state = f"{port.state or 'unknown'} ({port.physical_state or 'unknown'})"
    return Evidence(
        metric="infiniband.state",
        reasons=(name, port.state, port.physical_state),
        peers=len(peers),
        detail=f"{name} {state}, {baseline}",
        baseline_source=where,
    )


def _slow(
    node: NodeState, port: pb.InfinibandPortSample, peers: list[pb.InfinibandPortSample]
) -> Evidence | None:
    if not port.HasField("rate_gbps"):
        return None
    rates = [p.rate_gbps for p in peers if is_up(p) and p.HasField("rate_gbps")]
    if rates:
        usual, where, whose = statistics.median(rates), "peers", "peers"
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
        peers=len(rates),
        detail=f"{name} at {port.rate_gbps:g} Gb/s, {whose} {usual:g}",
        baseline_source=where,
    )


def _erroring(node: NodeState, port: pb.InfinibandPortSample, ctx: DetectContext) -> list[Evidence]:
    trends, name, out = node.trends, port_name(port), []
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


def bad_ports(node: NodeState, group: list[NodeState], ctx: DetectContext) -> list[Bad]:
    """The node's bad ports, worst first."""
    out = []
    for key, port in sorted(_ports(node).items()):
        peers = [p for p in (_ports(n).get(key) for n in group if n is not node) if p is not None]
        if not is_up(port):
            down = _down(node, port, peers)
            if down is not None:
                out.append(Bad("critical", [down]))
            continue
        evidence = [e for e in (_slow(node, port, peers),) if e is not None]
        evidence += _erroring(node, port, ctx)
        if evidence:
            out.append(Bad("warning", evidence))
    out.sort(key=lambda b: b.severity != "critical")
    return out


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    for group in groups(ctx.fleet.nodes.values()).values():
        for node in group:
            bad = bad_ports(node, group, ctx)
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
