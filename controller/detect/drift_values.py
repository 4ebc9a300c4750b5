"""What the drift detector compares, read once from each node's Hello and latest BMC sample and kept
(in Fleet.derived) until either is replaced: a Hello or a BMC sample is replaced when a new one
comes, never changed in place (as NodeState.gpu_model relies on too).

Reading every node's inventory, BMC sections and BIOS attributes out of their messages each pass
was most of drift's time at 12,500 nodes; now a pass reads only the nodes whose Hello or BMC sample
is new since the last, and merges the rest from plain values.
"""

from __future__ import annotations

from dataclasses import dataclass

from controller.detect.per_node import per_node
from controller.fleet.model import Fleet, NodeState

KEPT = "drift_values"  # Fleet.derived, by detect/per_node.py


@dataclass(frozen=True, slots=True)
class NodeValues:
    # (board part number, "node/index", VBIOS version) of each GPU in the inventory with a VBIOS
    vbios: tuple[tuple[str, str, str], ...]
    driver: str  # "" when not reported
    server: str | None  # the BMC's "manufacturer model"; None without a BMC sample
    bios: str  # "" when not reported or its BMC section (systems) failed
    firmware: str  # the BMC's own firmware; "" likewise (managers)
    attributes: dict[str, str]  # BIOS attributes with a value, where the bios section read


def node_values(fleet: Fleet) -> dict[str, NodeValues]:
    """Every node's values, read again only where its Hello or BMC sample is not the one they were
    read from. Values read again equal to those kept (a new poll of the same BIOS, the usual case)
    stay the object kept, so that drift.py can tell a group whose values are all as last pass by
    identity alone. Nodes gone from the fleet are dropped."""
    return per_node(fleet, KEPT, _sources, read, keep_equal=True)


def _sources(node: NodeState) -> tuple[object, ...]:
    return (node.hello, node.bmc)


def read(node: NodeState) -> NodeValues:
    inventory = node.hello.inventory
    vbios = tuple(
        (info.board_part_number, f"{node.name}/{info.index}", info.vbios_version)
        for info in inventory.gpus
        if info.vbios_version
    )
    bmc = node.bmc
    if bmc is None:
        return NodeValues(vbios, inventory.driver_version, None, "", "", {})
    failed = {s.name for s in bmc.sections if not s.success}
    attributes = {} if "bios" in failed else {k: v for k, v in bmc.bios_attributes.items() if v}
    return NodeValues(
        vbios,
        inventory.driver_version,
        f"{bmc.manufacturer} {bmc.model}",
        "" if "systems" in failed else bmc.bios_version,
        "" if "managers" in failed else bmc.bmc_firmware_version,
        attributes,
    )
