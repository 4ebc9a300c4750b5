"""What one scrape reads, and the rows each catalogue scope yields with their labels.

A scope is a path into the Snapshot (or the Inventory, HostFacts, the kept probe results); its
rows are (labels, object) pairs, the labels in the house vocabulary (`node`, `gpu`, `gpu_uuid`,
`model_name`, `link`, ...). A metric reads one field of each row.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from agent.probes.base import ProbeOutcome
from agent.snapshot import Snapshot
from agent.sources.gpu import GpuInfo, GpuReading, Inventory
from agent.sources.host import HostFacts

Labels = dict[str, str]
Row = tuple[Labels, Any]
ProbeKey = tuple[str, str, int | None]

GPU_LABELS = ("node", "gpu", "gpu_uuid", "model_name", "pci_bus_id")
DCGM_LABELS = ("gpu", "UUID", "pci_bus_id", "device", "modelName", "Hostname", "DCGM_FI_DRIVER_VERSION")

SCOPE_LABELS: dict[str, tuple[str, ...]] = {
    "": ("node",),
    "agent": ("node",),
    "collectors{}": ("node", "collector"),
    "inventory.gpus[]": GPU_LABELS,
    "gpus[]": GPU_LABELS,
    "gpus[].nvlinks[]": (*GPU_LABELS, "link"),
    "host_facts": ("node",),
    "host": ("node",),
    "host.cpus[]": ("node", "cpu"),
    "host.network[]": ("node", "interface"),
    "host.disks[]": ("node", "device"),
    "host.infiniband[]": ("node", "device", "port", "link_layer"),
    "host.pcie_aer[]": ("node", "device"),
    "bmc": ("node",),
    "bmc.sections[]": ("node", "section"),
    "bmc.temperatures[]": ("node", "sensor", "context", "chassis"),
    "bmc.fans[]": ("node", "fan", "chassis"),
    "bmc.power_supplies[]": ("node", "psu", "chassis"),
    "bmc.gpus[]": ("node", "gpu", "gpu_uuid"),
    "probes[]": ("node", "probe", "variant", "unit", "gpu"),
}


@dataclass(slots=True)
class ExportView:
    """One consistent picture for one scrape: the latest snapshot and what the exporter kept."""

    node: str
    inventory: Inventory
    host_facts: HostFacts | None
    snapshot: Snapshot | None
    probes: dict[ProbeKey, ProbeOutcome]
    xid_last: dict[str, int]  # GPU uuid -> code of the latest XID seen since the agent started
    _gpus: dict[str, GpuInfo] = field(default_factory=dict)
    _rows: dict[str, list[Row]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self._gpus = {g.uuid: g for g in self.inventory.gpus}

    def gpu_info(self, reading: GpuReading) -> GpuInfo | None:
        """The inventory entry of a reading: by uuid, else by index (a GPU read without its uuid)."""
        info = self._gpus.get(reading.uuid)
        if info is None:
            info = next((g for g in self.inventory.gpus if g.index == reading.index), None)
        return info

    def driver_version(self, info: GpuInfo | None) -> str:
        return (info.driver_version if info else "") or self.inventory.driver_version

    def rows(self, scope: str) -> list[Row]:
        """The rows of `scope`, built once per scrape; duplicate label sets keep their first row."""
        rows = self._rows.get(scope)
        if rows is None:
            seen: set[tuple[str, ...]] = set()
            rows = []
            for labels, obj in _SCOPES[scope](self):
                key = tuple(labels.values())
                if key not in seen:
                    seen.add(key)
                    rows.append((labels, obj))
            self._rows[scope] = rows
        return rows

    def gpu_labels(self, reading: GpuReading) -> Labels:
        info = self.gpu_info(reading)
        return {
            "node": self.node,
            "gpu": str(reading.index),
            "gpu_uuid": reading.uuid,
            "model_name": info.name if info else "",
            "pci_bus_id": info.pci_bus_id if info else "",
        }

    def dcgm_rows(self) -> list[Row]:
        """GPU rows labelled as dcgm-exporter labels them."""
        rows = self._rows.get("dcgm")
        if rows is None:
            rows = []
            for reading in self.snapshot.gpus if self.snapshot else []:
                info = self.gpu_info(reading)
                labels = {
                    "gpu": str(reading.index),
                    "UUID": reading.uuid,
                    "pci_bus_id": info.pci_bus_id if info else "",
                    "device": f"nvidia{reading.index}",
                    "modelName": info.name if info else "",
                    "Hostname": self.node,
                    "DCGM_FI_DRIVER_VERSION": self.driver_version(info),
                }
                rows.append((labels, reading))
            self._rows["dcgm"] = rows
        return rows


def _node(view: ExportView, obj: Any) -> Iterable[Row]:
    if obj is not None:
        yield {"node": view.node}, obj


def _gpus(view: ExportView) -> Iterable[Row]:
    for reading in view.snapshot.gpus if view.snapshot else []:
        yield view.gpu_labels(reading), reading


def _nvlinks(view: ExportView) -> Iterable[Row]:
    for labels, reading in view.rows("gpus[]"):
        for link in reading.nvlinks:
            yield {**labels, "link": str(link.link)}, link


def _inventory(view: ExportView) -> Iterable[Row]:
    for info in view.inventory.gpus:
        labels = {
            "node": view.node,
            "gpu": str(info.index),
            "gpu_uuid": info.uuid,
            "model_name": info.name,
            "pci_bus_id": info.pci_bus_id,
        }
        yield labels, info


def _listed(path: str, make: Callable[[Any], Labels]) -> Callable[[ExportView], Iterable[Row]]:
    """Rows of a list in the host reading or the BMC sample, labelled by `make`."""
    section, _, attr = path.partition(".")

    def rows(view: ExportView) -> Iterable[Row]:
        snapshot = view.snapshot
        parent = getattr(snapshot, section) if snapshot is not None else None
        for item in getattr(parent, attr) if parent is not None else []:
            yield {"node": view.node, **make(item)}, item

    return rows


def _probes(view: ExportView) -> Iterable[Row]:
    for (probe, variant, gpu), outcome in sorted(view.probes.items(), key=lambda kv: _probe_order(kv[0])):
        labels = {
            "node": view.node,
            "probe": probe,
            "variant": variant,
            "unit": outcome.unit,
            "gpu": "" if gpu is None else str(gpu),
        }
        yield labels, outcome


def _probe_order(key: ProbeKey) -> tuple[str, str, int]:
    return key[0], key[1], -1 if key[2] is None else key[2]


def _bmc_gpus(view: ExportView) -> Iterable[Row]:
    """The baseboard's GPUs under the node's GPU labels: the inventory's uuid where the board was
    matched to a GPU, so a BMC series joins its NVML series; else the board's own, NVML-style."""
    bmc = view.snapshot.bmc if view.snapshot else None
    by_index = {g.index: g.uuid for g in view.inventory.gpus}
    for board in bmc.gpus if bmc is not None else []:
        uuid = by_index.get(board.index, "") if board.matched_by not in ("", "none") else ""
        if not uuid and board.uuid:
            uuid = board.uuid if board.uuid.upper().startswith("GPU-") else f"GPU-{board.uuid}"
        yield {"node": view.node, "gpu": str(board.index), "gpu_uuid": uuid}, board


def _collectors(view: ExportView) -> Iterable[Row]:
    statuses = view.snapshot.collectors if view.snapshot else {}
    for name in sorted(statuses):
        yield {"node": view.node, "collector": name}, statuses[name]


_SCOPES: dict[str, Callable[[ExportView], Iterable[Row]]] = {
    "": lambda v: _node(v, v.snapshot),
    "agent": lambda v: _node(v, v),
    "collectors{}": _collectors,
    "inventory.gpus[]": _inventory,
    "gpus[]": _gpus,
    "gpus[].nvlinks[]": _nvlinks,
    "host_facts": lambda v: _node(v, v.host_facts),
    "host": lambda v: _node(v, v.snapshot.host if v.snapshot else None),
    "host.cpus[]": _listed("host.cpus", lambda c: {"cpu": str(c.cpu)}),
    "host.network[]": _listed("host.network", lambda n: {"interface": n.name}),
    "host.disks[]": _listed("host.disks", lambda d: {"device": d.name}),
    "host.infiniband[]": _listed(
        "host.infiniband", lambda p: {"device": p.device, "port": str(p.port), "link_layer": p.link_layer}
    ),
    "host.pcie_aer[]": _listed("host.pcie_aer", lambda a: {"device": a.device}),
    "bmc": lambda v: _node(v, v.snapshot.bmc if v.snapshot else None),
    "bmc.sections[]": _listed("bmc.sections", lambda s: {"section": s.name}),
    "bmc.temperatures[]": _listed(
        "bmc.temperatures", lambda t: {"sensor": t.name, "context": t.context, "chassis": t.chassis}
    ),
    "bmc.fans[]": _listed("bmc.fans", lambda f: {"fan": f.name, "chassis": f.chassis}),
    "bmc.power_supplies[]": _listed("bmc.power_supplies", lambda p: {"psu": p.name, "chassis": p.chassis}),
    "bmc.gpus[]": _bmc_gpus,
    "probes[]": _probes,
}
