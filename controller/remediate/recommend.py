"""What to do about a node's findings: the cause map's fix, as exact changes on that node. Pure:
findings, the fleet's readings, the cause map, the catalogue and the policy in; proposals out.

For each node and cause the policy does not turn off:
- `tune`: the fix's profile, restricted to the settings the cause map names for the cause (all of
  the profile's when it names none), with the GPUs the findings are about (none: the whole node).
  A fix with `by_evidence` (host_tuning_drift) sets only the settings of the metrics the findings'
  evidence names (numa_balancing -> kernel.numa_balancing), never the rest of the profile: a node
  drifted in one setting gets that setting back, not the profile's swappiness or THP defrag too;
  findings that name none of them get no proposal from that fix.
- `set_fleet_value` (BIOS drift): each BIOS attribute that differs from the strict majority of the
  node's peer group is set to that majority's value (pending until the next reboot).
- `recommend_firmware`: the fleet majority's (or a pinned) version per component; never applied.
- `drain` / `investigate`: no setting fixes the cause; the recommendation says so, changes nothing.
  A drain's policy is the Kubernetes one (`kubernetes.policy`, Knowledge.drain_policy): an `auto`
  drain is started by the controller (controller/kube/policy.py), a `recommend` one by `approve`.

Each change is exact, with the setting's current value from the node's latest readings
(changes.py); the verification bars the agent's re-probe must clear come from the node's peers
(bars.py); the BIOS fleet value and firmware versions are the peer group's majority (fleet_values.py).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from controller.config import DetectConfig
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet
from controller.profiles import Entry
from controller.profiles.causes import CauseEntry
from controller.remediate.fleet_values import firmware_plan, fleet_bios_plan
from controller.remediate.plans import Plan, expected_effect, plan_profile
from controller.store.recommendations import Change

FLEET_BIOS_PROFILE = "bios-fleet-value"  # set_fleet_value: the name its apply carries (journal, reports)
NO_FIX = {
    "drain": "drain the node and repair the hardware",
    "investigate": "a person investigates before anything changes",
}


@dataclass(slots=True)
class Proposal:
    node: str
    cause: str
    action: str  # tune, set_fleet_value, recommend_firmware, drain, investigate
    profile: str  # "" for drain / investigate
    policy: str  # off | recommend | auto
    risk: str  # online | needs_reboot; "" where nothing is applied
    finding_ids: list[str]
    gpus: list[int]
    changes: list[Change]
    targets: dict[str, Any]
    expected_effect: str
    detail: str = ""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.node, self.cause, self.profile)


def group_findings(findings: Iterable[StoredFinding]) -> dict[tuple[str, str], list[StoredFinding]]:
    """Active findings by (node, cause), each group by GPU."""
    groups: dict[tuple[str, str], list[StoredFinding]] = defaultdict(list)
    for stored in findings:
        if stored.active:
            groups[(stored.finding.node, stored.finding.cause)].append(stored)
    for found in groups.values():
        found.sort(key=lambda s: (-1 if s.finding.gpu is None else s.finding.gpu, s.id))
    return dict(sorted(groups.items()))


def evidence_metrics(found: Iterable[StoredFinding]) -> set[str]:
    """The metrics the findings' evidence names (primary and supporting)."""
    return {e.metric for s in found for e in (s.finding.evidence, *s.finding.supporting)}


def profiles_for(entry: CauseEntry) -> list[str]:
    """The profiles a cause's recommendations carry: its fixes', the fleet BIOS value, or none ("")."""
    if entry.action == "set_fleet_value":
        return [FLEET_BIOS_PROFILE]
    if entry.action in NO_FIX:
        return [""]
    return [fix.profile for fix in entry.fixes]


@dataclass(frozen=True, slots=True)
class Knowledge:
    """What recommending knows besides the fleet: the cause map, the profiles and the policy."""

    causes: dict[str, CauseEntry]
    catalogue: dict[str, Entry]
    policy: Callable[[str], str]  # cause -> off | recommend | auto (tuning.policy)
    detect: DetectConfig  # margin and min_peers: the verification bars' normal
    drain_policy: Callable[[str], str] | None = None  # the same for drain causes (kubernetes.policy)

    def mode(self, cause: str) -> str:
        """off, recommend or auto for `cause`: the drain policy for a cause the map drains (when
        there is one), the tuning policy for every other."""
        entry = self.causes.get(cause)
        if entry is not None and entry.action == "drain" and self.drain_policy is not None:
            return self.drain_policy(cause)
        return self.policy(cause)


def propose(findings: Iterable[StoredFinding], fleet: Fleet, know: Knowledge) -> list[Proposal]:
    """Every proposal for the active findings, by node and cause."""
    out: list[Proposal] = []
    for (node, cause), found in group_findings(findings).items():
        out += propose_for(node, cause, found, fleet, know)
    return out


def propose_for(
    node_name: str, cause: str, found: list[StoredFinding], fleet: Fleet, know: Knowledge
) -> list[Proposal]:
    """The proposals for one node's findings of one cause (one per fix profile); none when the
    policy is off for the cause, the cause map has no entry or the node is unknown."""
    mode, entry, node = know.mode(cause), know.causes.get(cause), fleet.nodes.get(node_name)
    if mode == "off" or entry is None or node is None or not found:
        return []
    ids = [s.id for s in found]
    gpus = [] if any(s.finding.gpu is None for s in found) else sorted({s.finding.gpu or 0 for s in found})
    action = entry.action

    def proposal(profile: str, plan: Plan, effect: str) -> Proposal:
        risk = "" if action in NO_FIX else plan.risk
        return Proposal(
            node_name,
            cause,
            action,
            profile,
            mode,
            risk,
            ids,
            gpus,
            plan.changes,
            plan.targets,
            effect,
            plan.detail,
        )

    if entry.action in NO_FIX:
        effect = f"No setting fixes {cause}: {NO_FIX[entry.action]}. {entry.reason}"
        return [proposal("", Plan({}, [], ""), effect)]
    if entry.action == "set_fleet_value":
        plan = fleet_bios_plan(fleet, node)
        return [proposal(FLEET_BIOS_PROFILE, plan, expected_effect(entry.reason, plan))]
    out = []
    for fix in entry.fixes:
        catalogued = know.catalogue.get(fix.profile)
        if catalogued is None:  # the cause map's own test keeps this from happening
            continue
        if entry.action == "recommend_firmware":
            plan = firmware_plan(catalogued.profile, fleet, node)
            effect = f"{entry.reason} Recommended only: an operator schedules the update."
        else:
            settings = fix.for_evidence(evidence_metrics(found)) if fix.by_evidence else fix.settings
            if fix.by_evidence and not settings:
                continue  # the findings name nothing this fix sets: the whole profile is not the answer
            plan = plan_profile(
                catalogued.profile, node, fleet=fleet, settings=settings, gpus=gpus, detect=know.detect
            )
            effect = expected_effect(entry.reason, plan)
        out.append(proposal(fix.profile, plan, effect))
    return out
