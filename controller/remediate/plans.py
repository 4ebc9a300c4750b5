"""A plan: a profile (or the part of it a cause needs) on one node, as ApplyProfile targets, exact
changes, risk and verification bars; and the expected effect a recommendation states for it."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from controller.config import DetectConfig
from controller.fleet.model import Fleet, NodeState
from controller.profiles import Profile
from controller.remediate.bars import moves_a_probe, verify_bars
from controller.remediate.changes import applicable, setting_changes, targets_of
from controller.store.recommendations import Change
from protos.gpufleet.v1 import telemetry_pb2 as pb

BARS_SHOWN = 3  # in the expected effect, then "and N more"


@dataclass(slots=True)
class Plan:
    """A profile (or the part of it a cause needs) on one node."""

    targets: dict[str, Any]  # ApplyProfile.targets_json: {"gpu": {...}, "os": {...}, "bmc": {...}}
    changes: list[Change]
    risk: str  # online | needs_reboot
    bars: list[pb.ProbeBar] = field(default_factory=list)
    detail: str = ""


def plan_profile(
    profile: Profile,
    node: NodeState,
    *,
    fleet: Fleet,
    settings: Iterable[str] = (),
    gpus: list[int],
    detect: DetectConfig,
) -> Plan:
    """`profile` (or the named settings of it) on `node`'s `gpus` (empty: every GPU)."""
    views = applicable(profile, settings)
    risk = "needs_reboot" if any(v.risk == "needs_reboot" for v in views) else "online"
    changes = [c for v in views for c in setting_changes(v, node, gpus)]
    bars = verify_bars(fleet, node, [v.path for v in views], gpus, detect)
    return Plan(targets_of(views), changes, risk, bars)


def expected_effect(reason: str, plan: Plan) -> str:
    """The cause map's reason, then what the re-probe must show (or how the change is verified)."""
    text = reason
    if plan.bars:
        shown = [
            f"{b.probe} {b.variant} on GPU {b.gpu} back to {'>=' if b.higher_is_better else '<='} "
            f"{b.normal:.4g} (peers' normal; now {b.before:.4g})"
            for b in plan.bars[:BARS_SHOWN]
        ]
        more = len(plan.bars) - BARS_SHOWN
        text += " Expected: " + "; ".join(shown) + (f"; and {more} more" if more > 0 else "") + "."
    elif any(moves_a_probe(c.setting) for c in plan.changes):
        text += " Verified by read-back only: no peer baseline to re-probe against yet."
    elif plan.changes:
        text += " Verified by read-back (no probe measures these settings)."
    if plan.risk == "needs_reboot":
        text += " Takes effect at the next reboot."
    return text
