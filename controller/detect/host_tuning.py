"""Host OS settings that starve the GPUs: a powersave CPU governor, NUMA balancing, THP off.

Each node's setting is compared with the fleet majority of its peer group (fleet/majority.py), so a
site that runs every node one way on purpose raises nothing:

- cpu_governor_powersave: the node's governor (the one most of its CPUs run: fleet/governors.py)
  is powersave while the group's majority is not; the evidence counts its CPUs on powersave. A group
  whose majority runs powersave raises nothing: with intel_pstate, "powersave" is the dynamic
  default, not a frequency floor.
- host_tuning_drift: numa_balancing or transparent_hugepage differs from the group's majority, one
  finding per node with each drifted setting as its own evidence. Severity warning when the node's
  value hurts GPU jobs (NUMA balancing on, THP never), info otherwise (an odd node, harmless as set).

A node whose value is the one that profile sets (NUMA balancing off, THP always) is tuned, not
drifted, whatever its peers run: otherwise the profile's own apply would raise the finding it was
meant to clear, and the closed loop would recommend the same profile again forever.

With no majority to compare with (fewer than detect.min_peers nodes of the group report the setting,
or no value held by more than half of them), the node is held to what the shipped profile
os-accelerator-performance wants, and only its harmful values are findings: governor powersave
(the profile wants performance), NUMA balancing on (it wants 0), THP never (it wants huge pages;
madvise and always both give them). Those evidences say baseline_source "expected".
"""

from __future__ import annotations

import functools
import statistics
from dataclasses import dataclass
from typing import NamedTuple

from controller.detect.base import DetectContext, peer_groups, register
from controller.detect.per_node import per_node
from controller.fleet.finding import Evidence, Finding
from controller.fleet.governors import governor as host_governor
from controller.fleet.governors import governor_counts
from controller.fleet.majority import majority
from controller.fleet.model import NodeState
from controller.profiles.catalogue import SHIPPED_DIR, load_profile

NAME = "host_tuning"

POWERSAVE = "powersave"
PROFILE = "os-accelerator-performance"
# The profile's wishes, as the values a node must not have (see the module docstring).
HARMFUL = {"numa_balancing": "on", "transparent_hugepage": "never"}


def governor(node: NodeState) -> str | None:
    """The node's cpufreq governor (fleet/governors.py); None when not reported."""
    return None if node.host is None else host_governor(node.host)


def numa_balancing(node: NodeState) -> str | None:
    host = node.host
    if host is None or not host.HasField("numa_balancing"):
        return None
    return "on" if host.numa_balancing else "off"


def transparent_hugepage(node: NodeState) -> str | None:
    host = node.host
    if host is None or not host.HasField("transparent_hugepage") or not host.transparent_hugepage:
        return None
    return host.transparent_hugepage


def cpu_frequency(node: NodeState) -> float | None:
    host = node.host
    if host is None or not host.HasField("cpu_frequency_hz") or host.cpu_frequency_hz <= 0:
        return None
    return host.cpu_frequency_hz


@functools.cache
def tuned() -> dict[str, str]:
    """The values the shipped profile sets, as the readers above spell them."""
    settings = load_profile(SHIPPED_DIR / f"{PROFILE}.yaml").os
    values: dict[str, str] = {}
    if settings is None:
        return values
    numa = settings.sysctls.get("kernel.numa_balancing")
    if numa is not None:
        values["numa_balancing"] = "on" if numa.target else "off"
    thp = settings.transparent_hugepages
    if thp is not None and thp.enabled is not None:
        values["transparent_hugepage"] = thp.enabled.target
    return values


SETTINGS = ("numa_balancing", "transparent_hugepage")  # drift from the group's majority


class Read(NamedTuple):
    """What the detector reads of a node's host sample, read once per sample (detect/per_node.py):
    a pass reads the governor of each node three times over (its group's norm, the busy nodes'
    frequencies, its own finding)."""

    cpu_governor: str | None
    numa_balancing: str | None
    transparent_hugepage: str | None
    cpu_frequency: float | None


def read(node: NodeState) -> Read:
    return Read(governor(node), numa_balancing(node), transparent_hugepage(node), cpu_frequency(node))


def _host(node: NodeState) -> tuple[object, ...]:
    return (node.host,)


@dataclass(frozen=True, slots=True)
class Norm:
    """What a node's setting is compared with: the group's majority, else the profile."""

    value: str | None  # the majority value; None: no majority (the profile decides)
    count: int
    total: int

    @property
    def source(self) -> str:
        return "fleet_majority" if self.value is not None else "expected"

    def says(self) -> str:
        if self.value is None:
            return f"no peer-group majority, profile {PROFILE}"
        return f"{self.count} of {self.total} in the peer group {self.value}"


def norm(values: dict[str, str], min_peers: int) -> Norm:
    value, count, total = majority(values)
    return Norm(value if total >= min_peers else None, count, total)


def _ghz(hz: float) -> str:
    return f"{hz / 1e9:.2f} GHz"


def group_norms(group: list[NodeState], reads: dict[str, Read], min_peers: int) -> dict[str, Norm]:
    """The group's norm of the governor and of each setting, worked out once per group (per node,
    it cost the group's size squared); `reads`: each node's Read."""
    return {name: norm(_values(group, reads, name), min_peers) for name in ("cpu_governor", *SETTINGS)}


def _values(group: list[NodeState], reads: dict[str, Read], name: str) -> dict[str, str]:
    """node -> its value of setting `name`, for the group's nodes that report it."""
    out: dict[str, str] = {}
    for node in group:
        value = getattr(reads[node.name], name)
        if value is not None:
            out[node.name] = value
    return out


def busy_frequencies(group: list[NodeState], reads: dict[str, Read]) -> list[float]:
    """The CPU frequencies of the group's nodes not on powersave (once per group)."""
    of_group = (reads[node.name] for node in group)
    return [r.cpu_frequency for r in of_group if r.cpu_governor != POWERSAVE and r.cpu_frequency is not None]


def powersave_finding(
    node: NodeState, own: Read, others: list[float], norms: dict[str, Norm]
) -> Finding | None:
    """`own`: the node's Read; `others`: busy_frequencies of the node's group; `norms`: group_norms."""
    if own.cpu_governor != POWERSAVE:
        return None
    n = norms["cpu_governor"]
    if n.value == POWERSAVE:
        return None  # the group runs powersave on purpose (intel_pstate's dynamic default)
    assert node.host is not None  # (it has a governor)
    counts = governor_counts(node.host)
    on = f" on {counts[POWERSAVE]} of {sum(counts.values())} CPUs" if POWERSAVE in counts else ""
    primary = Evidence(
        metric="cpu_governor",
        reasons=(POWERSAVE,),
        peers=n.total,
        detail=f"CPU governor {POWERSAVE}{on}; {n.says()}",
        baseline_source=n.source,
    )
    supporting = []
    freq = own.cpu_frequency
    if freq is not None and others:
        median = statistics.median(others)
        supporting.append(
            Evidence(
                metric="cpu_frequency_hz",
                value=freq,
                baseline=median,
                deviation=freq / median - 1.0,
                unit="Hz",
                peers=len(others),
                detail=f"CPUs at {_ghz(freq)}, peers' median {_ghz(median)}",
                baseline_source="peers",
            )
        )
    summary = primary.detail + (f"; {supporting[0].detail}" if supporting else "")
    return Finding(node.name, None, "cpu_governor_powersave", "warning", summary, primary, supporting, [NAME])


def drift_finding(node: NodeState, values: Read, norms: dict[str, Norm]) -> Finding | None:
    """`values`: the node's Read."""
    drifted: list[tuple[str, Evidence]] = []
    for setting in SETTINGS:
        own = getattr(values, setting)
        if own is None or own == tuned().get(setting):
            continue
        n = norms[setting]
        harmful = HARMFUL[setting] == own
        if n.value is None and not harmful:
            continue  # no majority, and the profile has nothing against this value
        if n.value is not None and own == n.value:
            continue
        severity = "warning" if harmful else "info"
        drifted.append(
            (
                severity,
                Evidence(
                    metric=setting,
                    reasons=(setting, own),
                    peers=n.total,
                    detail=f"{setting} {own}; {n.says()}",
                    baseline_source=n.source,
                ),
            )
        )
    if not drifted:
        return None
    drifted.sort(key=lambda d: d[0] != "warning")  # the harmful setting first
    severity = drifted[0][0]
    evidence = [e for _, e in drifted]
    summary = "host tuning drift: " + "; ".join(e.detail for e in evidence)
    return Finding(node.name, None, "host_tuning_drift", severity, summary, evidence[0], evidence[1:], [NAME])


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    reads = per_node(ctx.fleet, NAME, _host, read)
    for group in peer_groups(ctx).values():
        norms, others = group_norms(group, reads, ctx.config.min_peers), busy_frequencies(group, reads)
        for node in group:
            own = reads[node.name]
            for found in (powersave_finding(node, own, others, norms), drift_finding(node, own, norms)):
                if found is not None:
                    findings.append(found)
    return findings
