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

from dataclasses import dataclass
from typing import NamedTuple

from controller.detect.base import DetectContext, peer_groups, register
from controller.detect.infiniband_ports import (
    PeerRates,
    Port,
    PortKey,
    PortPeers,
    Ports,
    group_ports,
    node_ports,
    of_nodes,
)
from controller.fleet.finding import Evidence, Finding, worse
from controller.fleet.model import NodeState
from controller.fleet.trends import ib_key

NAME = "infiniband"

MIN_SPAN_SECONDS = 60.0  # a counter rate is judged on at least this much of its window
RATE_TOLERANCE = 0.99  # a rate this close to the usual one is the usual one
ERROR_COUNTERS = {  # counter -> how the detail names it
    "symbol_error_total": "symbol errors",
    "port_rcv_errors_total": "receive errors",
    "link_error_recovery_total": "link error recoveries",
}
LINK_DOWNED = "link_downed_total"


@dataclass(slots=True)
class Bad:
    """One bad port's evidence, worst first."""

    severity: str
    evidence: list[Evidence]


class Verdict(NamedTuple):
    """One port of a port set, judged by its state against its group's same port."""

    port: Port
    down: Evidence | None  # not up, and a fault (critical)
    slow: Evidence | None  # up below the usual rate (warning)


def _down(ports: Ports, port: Port, total: int, active: int) -> Evidence | None:
    """`total`, `active`: the peers that have this port, and those with it up."""
    name = port.name
    if total:
        if 2 * active <= total:
            return None  # down on most of the group too: unused or uncabled
        baseline, where = f"active on {active} of {total} peers", "peers"
    else:
        same = [p for p in ports if p.link_layer == port.link_layer and p is not port]
        if len(same) < 2 or not all(p.up for p in same):
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


def _slow(ports: Ports, port: Port, rates: PeerRates) -> Evidence | None:
    """`rates`: the peers' rates of this port where it is up."""
    if port.rate is None:
        return None
    if rates.median is not None:
        usual, where, whose = rates.median, "peers", "peers"
    else:
        own = [
            p.rate
            for p in ports
            if p is not port and p.link_layer == port.link_layer and p.up and p.rate is not None
        ]
        if not own:
            return None
        usual, where, whose = max(own), "expected", "the node's other ports"
    if usual <= 0 or port.rate >= RATE_TOLERANCE * usual:
        return None
    name = port.name
    return Evidence(
        metric="infiniband.rate_gbps",
        value=port.rate,
        baseline=usual,
        deviation=port.rate / usual - 1.0,
        unit="Gb/s",
        reasons=(name, "rate_below_usual"),
        peers=rates.peers,
        detail=f"{name} at {port.rate:g} Gb/s, {whose} {usual:g}",
        baseline_source=where,
    )


def judge_ports(ports: Ports, group: dict[PortKey, PortPeers]) -> list[Verdict]:
    """Each port of a port set by its state; `group`: its peer group's ports (group_ports)."""
    out = []
    for port in ports:
        total, active, rates = group[port.key].without(port)
        if not port.up:
            out.append(Verdict(port, _down(ports, port, total, active), None))
        else:
            out.append(Verdict(port, None, _slow(ports, port, rates)))
    return out


def _erroring(node: NodeState, port: Port, ctx: DetectContext) -> list[Evidence]:
    """Evidence of the port's error counters rising; the caller has found its group changed (no
    counter of a quiet group rose within the window: every increase is 0, under both thresholds,
    ib_errors_per_minute > 0 and ib_link_downs_per_window >= 1)."""
    trends = node.trends
    name, out = port.name, list[Evidence]()
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
    if port.up and downs >= ctx.config.ib_link_downs_per_window:
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


def bad_ports(node: NodeState, verdicts: list[Verdict], ctx: DetectContext) -> list[Bad]:
    """The node's bad ports, worst first; `verdicts`: its port set's (judge_ports)."""
    trends, out = node.trends, []
    for verdict in verdicts:
        if verdict.down is not None:
            out.append(Bad("critical", [verdict.down]))
            continue
        port = verdict.port
        if not port.up:
            continue
        evidence = [] if verdict.slow is None else [verdict.slow]
        if trends.changed(port.group):
            evidence += _erroring(node, port, ctx)
        if evidence:
            out.append(Bad("warning", evidence))
    out.sort(key=lambda b: b.severity != "critical")
    return out


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    ports_of = node_ports(ctx.fleet)
    for group in peer_groups(ctx).values():
        sets, counts = of_nodes(group, ports_of)
        ports = group_ports(counts)
        judged = {port_set: judge_ports(port_set, ports) for port_set in counts}
        for node, port_set in zip(group, sets, strict=True):
            bad = bad_ports(node, judged[port_set], ctx)
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
