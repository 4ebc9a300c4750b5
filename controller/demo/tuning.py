"""The demo's closed loop (`gpufleet demo --tuning auto|recommend`): which injected faults a
profile can fix (from the cause map), and how each one ended, read from the controller's
recommendations and findings like any client:

- `fixed`: a recommendation for its node and cause was verified (applied, re-probed, committed)
  and no finding of that cause is active there any more;
- `recommended_drain`: no setting fixes its cause, and the controller recommends a drain;
- `recommended_<action>` for the cause map's other answers to a fault no online profile fixes:
  `recommended_set_fleet_value` (a BIOS attribute, pending a reboot: never automatic),
  `recommended_recommend_firmware` (firmware drift: an operator schedules it), and
  `recommended_investigate` (no setting and no hardware explains it: a person looks);
- `not_fixed`: anything else by the end (rolled back, failed, still proposed, never recommended).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from controller.demo.catalogue import AgentFault
from controller.demo.plan import Injected
from controller.profiles.causes import CauseEntry, load_cause_map
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name

MODES = ("off", "recommend", "auto")
FIXED, RECOMMENDED, NOT_FIXED = "fixed", "recommended_", "not_fixed"
DRAIN = RECOMMENDED + "drain"
FIXABLE_ACTIONS = ("tune",)  # applied online; set_fleet_value (BIOS) waits for a reboot
APPLIED_STATES = ("applying", "verified", "rolled_back", "failed", "needs_attention")


def fixable(kinds: Iterable[AgentFault]) -> list[str]:
    """The fault kinds whose cause an online profile fixes, in the agent's order."""
    causes = load_cause_map()
    return [k.name for k in kinds if k.cause in causes and causes[k.cause].action in FIXABLE_ACTIONS]


def outcome(
    injected: Injected,
    recommendations: Sequence[operator_pb2.Recommendation],
    findings: Sequence[findings_pb2.Finding],
) -> str:
    mine = [r for r in recommendations if r.node == injected.node and r.cause == injected.cause]
    others = sorted({r.action for r in mine if r.action not in FIXABLE_ACTIONS})
    if others:  # drain, or what else the cause map says when no online profile fixes it
        return RECOMMENDED + others[0]
    active = any(f.node == injected.node and cause_name(f.cause) == injected.cause for f in findings)
    if any(r.state == "verified" for r in mine) and not active:
        return FIXED
    return NOT_FIXED


def settled(
    injected: Sequence[Injected],
    recommendations: Sequence[operator_pb2.Recommendation],
    findings: Sequence[findings_pb2.Finding],
    fixable_faults: Sequence[str],
) -> bool:
    """Every injected fault has its final outcome: fixed, or its cause's action recommended (a
    drain, mostly). (A fixable fault that is not fixed yet may still be; the demo waits for it until
    its time is up.)"""
    causes = load_cause_map()
    return all(outcome(i, recommendations, findings) == expected(i, fixable_faults, causes) for i in injected)


def expected(injected: Injected, fixable_faults: Sequence[str], causes: dict[str, CauseEntry]) -> str:
    """The outcome a fault should end with: fixed if a profile fixes it online, else its cause's
    action recommended."""
    if injected.fault in fixable_faults:
        return FIXED
    return RECOMMENDED + causes[injected.cause].action


def drains(injected: Sequence[Injected]) -> list[Injected]:
    """The faults whose cause the controller answers with a drain (the hardware ones)."""
    causes = load_cause_map()
    return [i for i in injected if i.cause in causes and causes[i.cause].action == "drain"]


def summary(
    injected: Sequence[Injected],
    recommendations: Sequence[operator_pb2.Recommendation],
    findings: Sequence[findings_pb2.Finding],
) -> dict[str, Any]:
    """The `tuning` block of `gpufleet demo --json`."""
    states = Counter(r.state for r in recommendations if r.action not in ("drain", "investigate"))
    return {
        "recommended": sum(states.values()),
        "applied": sum(states[s] for s in APPLIED_STATES),
        "verified": states["verified"],
        "rolled_back": states["rolled_back"],
        "needs_attention": states["needs_attention"],
        "drain_recommended": sum(1 for r in recommendations if r.action == "drain"),
        "outcomes": dict(Counter(outcome(i, recommendations, findings) for i in injected)),
    }
