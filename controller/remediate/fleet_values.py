"""Plans whose target is what the node's peer group runs: BIOS drift (each attribute a strict
majority of the peers agree on and the node does not, pending until the next reboot) and firmware
(the majority's or a pinned version per component; recommended only, never applied)."""

from __future__ import annotations

from collections import Counter
from typing import Any

from controller.fleet.model import Fleet, NodeState
from controller.fleet.peers import node_group
from controller.profiles import Profile
from controller.remediate.changes import UNKNOWN
from controller.remediate.plans import Plan
from controller.store.recommendations import Change


def _peers(fleet: Fleet, node: NodeState) -> list[NodeState]:
    group = node_group(node)
    return [n for n in fleet.nodes.values() if n.name != node.name and node_group(n) == group]


def _majority(values: list[str]) -> str | None:
    """The value more than half of at least two peers have."""
    if len(values) < 2:
        return None
    value, count = Counter(values).most_common(1)[0]
    return value if 2 * count > len(values) else None


def fleet_bios_plan(fleet: Fleet, node: NodeState) -> Plan:
    """BIOS drift: every attribute the node's peer group agrees on (a strict majority) and the node
    does not, set to the group's value."""
    if node.bmc is None:
        return Plan({}, [], "needs_reboot", detail="no BIOS readings from this node's BMC to compare")
    peers = [p.bmc for p in _peers(fleet, node) if p.bmc is not None]
    bios: dict[str, Any] = {}
    changes = []
    for name, value in sorted(node.bmc.bios_attributes.items()):
        fleet_value = _majority([p.bios_attributes[name] for p in peers if name in p.bios_attributes])
        if fleet_value is not None and fleet_value != value:
            bios[name] = fleet_value
            changes.append(Change(f"bmc.bios.{name}", value, fleet_value, pending_reboot=True))
    if not changes:
        return Plan({}, [], "needs_reboot", detail="no BIOS attribute differs from its peers' majority now")
    return Plan({"bmc": {"bios": bios}}, changes, "needs_reboot")


def firmware_version(node: NodeState, component: str) -> str:
    if component == "GPU VBIOS":
        versions = sorted({g.vbios_version for g in node.hello.inventory.gpus if g.vbios_version})
        return ", ".join(versions)
    if node.bmc is None:
        return ""
    return {"BMC": node.bmc.bmc_firmware_version, "BIOS": node.bmc.bios_version}.get(component, "")


def firmware_plan(profile: Profile, fleet: Fleet, node: NodeState) -> Plan:
    """Firmware: the version per component the fleet majority runs (or the pinned one); never applied."""
    changes = []
    for view in profile.settings():
        if not view.recommend_only:
            continue
        component = view.path.removeprefix("bmc.firmware.")
        current = firmware_version(node, component) or UNKNOWN
        target = str(view.target)
        if target == "fleet":
            target = (
                _majority([v for p in _peers(fleet, node) if (v := firmware_version(p, component))]) or ""
            )
        if target and target != current:
            changes.append(Change(view.path, current, target, pending_reboot=True))
    return Plan({}, changes, "needs_reboot")
