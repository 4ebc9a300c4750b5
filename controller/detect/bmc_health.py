"""What the BMC says about the chassis: a failed fan, a failed PSU or lost redundancy, a hot inlet.

- fan_failure: a fan (not absent or disabled) with health warning or critical, or at 0 rpm while
  the node's other fans spin. Critical when a fan is critical or stopped, else warning.
- psu_failure: a PSU (not an empty "absent" bay) with health warning or critical, or delivering
  nothing while the others carry the load; or PSU redundancy health warning or critical. Critical
  when a PSU or the redundancy is critical, else warning.
- inlet_temperature_high: an intake sensor at or above its upper caution threshold (critical at its
  critical threshold, else warning); a sensor without thresholds is compared with the peer group's
  median intake instead, high from detect.inlet_margin_celsius above it (warning, and only with
  readings from at least detect.min_peers nodes).

Which sample: the node's latest BMC sample (NodeState.bmc), and of it only the sections its poll
read (fans and temperatures come from "thermal", PSUs and redundancy from "power"): a failed poll or
section raises nothing from what it did not read. A sample whose poll started more than
detect.bmc_max_age_seconds before the node's newest frame (NodeState.last_seen: the agent's clock,
so a node gone silent keeps its findings as its last readings left them) is not used: its BMC has
stopped answering. NodeState keeps only the latest sample, so a failed poll hides the previous good
one until the next good poll: its findings close meanwhile (hysteresis may bridge one failed poll);
keeping the newest good sample per section in fleet state would let them stand.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

from controller.detect.base import DetectContext, peer_groups, register
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import bmc_pb2

NAME = "bmc_health"

GONE = ("absent", "disabled", "unavailable_offline", "standby_offline")  # Redfish states of no part
BAD_HEALTH = ("warning", "critical")
INTAKE = "intake"


def read_sections(sample: bmc_pb2.BmcSample) -> tuple[bool, bool]:
    """Whether the sample's poll read the "thermal" and the "power" section."""
    status = {s.name: s.success for s in sample.sections}
    if status:
        return status.get("thermal", False), status.get("power", False)
    whole = sample.success and not sample.error  # a sample without section list
    return whole, whole


def _rpm(fan: bmc_pb2.BmcFan) -> float | None:
    if fan.HasField("speed_rpm"):
        return fan.speed_rpm
    return None


def fan_finding(node: NodeState, sample: bmc_pb2.BmcSample) -> Finding | None:
    fans = [f for f in sample.fans if f.state not in GONE]
    spinning = [r for r in (_rpm(f) for f in fans) if r is not None and r > 0]
    evidence: list[tuple[bool, Evidence]] = []  # (critical, evidence)
    for fan in fans:
        rpm = _rpm(fan)
        stopped = rpm is not None and rpm <= 0 and len(spinning) > 0
        if fan.health not in BAD_HEALTH and not stopped:
            continue
        others = [r for r in (_rpm(f) for f in fans if f is not fan) if r is not None and r > 0]
        usual = statistics.median(others) if others else None
        speed = "no speed" if rpm is None else f"{rpm:.0f} rpm"
        detail = f"{fan.name} at {speed} (health {fan.health or 'unknown'})"
        if usual is not None:
            detail += f", other fans' median {usual:.0f} rpm"
        evidence.append(
            (
                fan.health == "critical" or stopped,
                Evidence(
                    metric="fans.speed_rpm",
                    value=rpm,
                    baseline=usual,
                    deviation=None if rpm is None or not usual else rpm / usual - 1.0,
                    unit="rpm",
                    reasons=(
                        fan.name,
                        f"health_{fan.health or 'unknown'}",
                        *(("stopped",) if stopped else ()),
                    ),
                    peers=len(others),
                    detail=detail,
                    baseline_source="peers" if usual is not None else "",
                ),
            )
        )
    return _finding(node, "fan_failure", evidence)


def psu_finding(node: NodeState, sample: bmc_pb2.BmcSample) -> Finding | None:
    psus = [p for p in sample.power_supplies if p.state not in GONE]
    evidence: list[tuple[bool, Evidence]] = []
    for psu in psus:
        others = [p.output_watts for p in psus if p is not psu and p.HasField("output_watts")]
        carrying = [w for w in others if w > 0]
        idle = psu.HasField("output_watts") and psu.output_watts <= 0 and len(carrying) > 0
        if psu.health not in BAD_HEALTH and not idle:
            continue
        usual = statistics.median(carrying) if carrying else None
        out = f"{psu.output_watts:.0f} W out" if psu.HasField("output_watts") else "no output reading"
        detail = f"{psu.name} health {psu.health or 'unknown'}, {out}"
        if usual is not None:
            detail += f"; the other {len(carrying)} carry {usual:.0f} W each (median)"
        evidence.append(
            (
                psu.health == "critical",
                Evidence(
                    metric="power_supplies.output_watts",
                    value=psu.output_watts if psu.HasField("output_watts") else None,
                    baseline=usual,
                    unit="W",
                    reasons=(
                        psu.name,
                        f"health_{psu.health or 'unknown'}",
                        *(("no_output",) if idle else ()),
                    ),
                    peers=len(carrying),
                    detail=detail,
                    baseline_source="peers" if usual is not None else "",
                ),
            )
        )
    redundancy = sample.power_supply_redundancy_health
    if redundancy in BAD_HEALTH:
        mode = sample.power_supply_redundancy_mode
        evidence.append(
            (
                redundancy == "critical",
                Evidence(
                    metric="power_supply_redundancy_health",
                    reasons=("redundancy", redundancy, *((mode,) if mode else ())),
                    detail=f"PSU redundancy{f' ({mode})' if mode else ''} {redundancy}",
                    baseline_source="expected",
                ),
            )
        )
    return _finding(node, "psu_failure", evidence)


def intakes(sample: bmc_pb2.BmcSample) -> list[bmc_pb2.BmcTemperature]:
    return [
        t
        for t in sample.temperatures
        if t.context == INTAKE and t.state not in GONE and t.HasField("reading_celsius")
    ]


def inlet_finding(
    node: NodeState, sample: bmc_pb2.BmcSample, group_median: float | None, peers: int, margin: float
) -> Finding | None:
    evidence: list[tuple[bool, Evidence]] = []
    for t in intakes(sample):
        reading = t.reading_celsius
        if t.HasField("upper_caution_celsius") or t.HasField("upper_critical_celsius"):
            caution = t.upper_caution_celsius if t.HasField("upper_caution_celsius") else None
            critical = t.upper_critical_celsius if t.HasField("upper_critical_celsius") else None
            limit = caution if caution is not None else critical
            assert limit is not None
            if reading < limit:
                continue
            over_critical = critical is not None and reading >= critical
            name = "critical" if over_critical else "caution"
            threshold = critical if over_critical and critical is not None else limit
            evidence.append(
                (
                    over_critical,
                    Evidence(
                        metric="temperatures.intake_celsius",
                        value=reading,
                        baseline=threshold,
                        deviation=reading / threshold - 1.0 if threshold else None,
                        unit="C",
                        reasons=(t.name, f"above_{name}"),
                        detail=f"{t.name} at {reading:.1f} C, {name} threshold {threshold:.0f} C",
                        baseline_source="expected",
                    ),
                )
            )
        elif group_median is not None and reading >= group_median + margin:
            evidence.append(
                (
                    False,
                    Evidence(
                        metric="temperatures.intake_celsius",
                        value=reading,
                        baseline=group_median,
                        deviation=reading / group_median - 1.0 if group_median else None,
                        unit="C",
                        reasons=(t.name, "above_peers"),
                        peers=peers,
                        detail=f"{t.name} at {reading:.1f} C, peers' median {group_median:.1f} C "
                        f"(+{reading - group_median:.1f} C, margin {margin:g} C)",
                        baseline_source="peers",
                    ),
                )
            )
    return _finding(node, "inlet_temperature_high", evidence)


def _finding(node: NodeState, cause: str, evidence: list[tuple[bool, Evidence]]) -> Finding | None:
    if not evidence:
        return None
    evidence.sort(key=lambda e: not e[0])  # critical first
    severity = "critical" if evidence[0][0] else "warning"
    items = [e for _, e in evidence]
    summary = "; ".join(e.detail for e in items)
    return Finding(node.name, None, cause, severity, summary, items[0], items[1:], [NAME])


@dataclass(frozen=True, slots=True)
class _Read:
    """What a node's BMC sample says on its own (which sections its poll read, its fans, PSUs and
    intakes), worked out once per sample: a BMC is polled every minute or so, a pass runs every few
    seconds. Only an intake without thresholds is judged against its group each pass, and only when
    it is hot enough to matter."""

    sample: bmc_pb2.BmcSample
    thermal: bool  # the poll read the section
    power: bool
    fans: Finding | None
    psus: Finding | None
    hottest: float | None  # the hottest intake's reading: the node's worst air, for its group's median
    unbounded: float | None  # the hottest intake without thresholds, the only one a median can flag
    inlet: Finding | None  # the intakes against their own thresholds alone


def _read(node: NodeState, sample: bmc_pb2.BmcSample, previous: dict[str, _Read]) -> _Read:
    known = previous.get(node.name)
    if known is not None and known.sample is sample:
        return known
    thermal, power = read_sections(sample)
    found = intakes(sample)
    bounded = [t.HasField("upper_caution_celsius") or t.HasField("upper_critical_celsius") for t in found]
    unbounded = [t.reading_celsius for t, b in zip(found, bounded, strict=True) if not b]
    return _Read(
        sample,
        thermal,
        power,
        fan_finding(node, sample),
        psu_finding(node, sample),
        max((t.reading_celsius for t in found), default=None),
        max(unbounded, default=None),
        inlet_finding(node, sample, None, 0, 0.0) if len(unbounded) < len(found) else None,
    )


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    max_age, margin = ctx.config.bmc_max_age_seconds, ctx.config.inlet_margin_celsius
    cached = ctx.fleet.derived.get(NAME)
    previous: dict[str, _Read] = cached[0] if cached and isinstance(cached[0], dict) else {}
    reads: dict[str, _Read] = {}  # this pass's, kept for the next (nodes gone drop out)
    findings: list[Finding | None] = []
    for group in peer_groups(ctx).values():
        # The nodes whose latest sample is recent enough and read a section this detector uses.
        fresh = []
        for node in group:
            sample = node.bmc
            if sample is None or node.last_seen - node.bmc_time > max_age:
                continue
            read = _read(node, sample, previous)
            if read.thermal or read.power:
                reads[node.name] = read
                fresh.append((node, read))
        # One intake per node for the group's median: the node's hottest, as its worst air.
        readings = [r.hottest for _, r in fresh if r.thermal and r.hottest is not None]
        median = statistics.median(readings) if len(readings) >= ctx.config.min_peers else None
        for node, read in fresh:
            if read.thermal:
                findings.append(read.fans)
                if median is not None and read.unbounded is not None and read.unbounded >= median + margin:
                    findings.append(inlet_finding(node, read.sample, median, len(readings), margin))
                else:
                    findings.append(read.inlet)
            if read.power:
                findings.append(read.psus)
    ctx.fleet.derived[NAME] = (reads,)
    return [f for f in findings if f is not None]
