"""The demo's closed loop (`gpufleet demo --tuning auto|recommend`): which injected faults a
profile can fix (from the cause map), and how each one ended, read from the controller's
recommendations and findings like any client:

- `fixed`: a recommendation for its node and cause was verified (applied, re-probed, committed)
  and no finding of that cause is active there any more;
- `recommended_drain`: no setting fixes its cause, and the controller recommends a drain;
- `not_fixed`: anything else by the end (rolled back, failed, still proposed, never recommended).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from typing import Any

from controller.demo.catalogue import AgentFault
from controller.demo.plan import Injected
from controller.profiles.causes import load_cause_map
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_name

MODES = ("off", "recommend", "auto")
FIXED, DRAIN, NOT_FIXED = "fixed", "recommended_drain", "not_fixed"
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
    if any(r.action == "drain" for r in mine):
        return DRAIN
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
    """Every injected fault has its final outcome: fixed, or drain recommended. (A fixable fault
    that is not fixed yet may still be; the demo waits for it until its time is up.)"""
    want = {i.node: (FIXED if i.fault in fixable_faults else DRAIN) for i in injected}
    return all(outcome(i, recommendations, findings) == want[i.node] for i in injected)


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
