"""Drift: firmware, driver and BIOS settings that differ from what most of a node's peers run.

Within a peer group, the value a strict majority holds is the fleet's; a node (or GPU) holding
another value has drifted:

- firmware_drift: the VBIOS of each GPU (Hello inventory), the driver (Hello inventory), the BIOS
  version and the BMC's own firmware (BMC sample).
- bios_drift: each BIOS attribute separately (BMC sample); a node's drifted attributes make one
  finding, the first as its evidence and the others as supporting evidence.

Groups: GPU-side values within the GPU peer group (fleet/peers.py node_group: model and GPU count),
the VBIOS also by board part number (boards of another SKU carry a VBIOS of their own); BMC-side
values within that group and the server model the BMC reports (two server vendors legitimately run
two BIOSes). No finding without a strict majority: a group split in two camps (halfway through a
roll-out, say) has no fleet value to drift from, so it raises nothing. Nor with fewer than
detect.min_peers nodes reporting the value. A value not reported (empty, or its BMC section failed
in the latest poll) counts neither way.

Severity: warning for the VBIOS, the BIOS version and the BMC firmware (a missed update, which
changes behaviour and is fixed only by a flash); info for the driver (rolling driver upgrades are
routine) and for BIOS attributes (a setting worth aligning, not a fault of the node).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from controller.detect.base import DetectContext, peer_groups, register
from controller.detect.drift_values import NodeValues, node_values
from controller.fleet.finding import SEVERITIES, Evidence, Finding
from controller.fleet.majority import majority
from controller.fleet.model import NodeState

NAME = "drift"
GROUPS = "drift_groups"  # Fleet.derived: (min_peers, group -> (its members' values, their drifts))


@dataclass(frozen=True, slots=True)
class _Drift:
    node: str
    gpu: int | None
    cause: str
    severity: str
    label: str  # what drifted, for the summary ("VBIOS", "BIOS attribute TurboMode")
    evidence: Evidence


def _node_of(key: str) -> tuple[str, int | None]:
    return key, None


def _gpu_of(key: str) -> tuple[str, int | None]:
    node, _, index = key.rpartition("/")
    return node, int(index)


def _compare(
    values: dict[str, str],
    nodes: int,
    min_peers: int,
    what: tuple[str, str, str, str],
    *,
    where: Callable[[str], tuple[str, int | None]] = _node_of,
    unit_of_peers: str = "peers",
) -> list[_Drift]:
    """Drifts among `values` (an id -> value; `where(id)` says which node and GPU it is), reported by
    `nodes` distinct nodes, against their strict majority. `what`: (metric, label, cause, severity)."""
    metric, label, cause, severity = what
    if nodes < min_peers:
        return []
    common, count, total = majority(values)
    if common is None:
        return []
    verb = "run" if metric.endswith("version") else "have"
    out = []
    # Only the few that differ are sorted (by id, for a stable order): sorting every value of a
    # BIOS attribute or a VBIOS across 12,500 nodes, each pass, was an eighth of the pass.
    for key, value in sorted((key, value) for key, value in values.items() if value != common):
        node, gpu = where(key)
        on_gpu = "" if gpu is None else f" on GPU {gpu}"
        evidence = Evidence(
            metric=metric,
            reasons=(f"{label} {value}", f"majority {common}"),
            peers=count,
            # says the reasons' words too ("majority"), so the CLI does not repeat them after it
            detail=(
                f"{label} {value}{on_gpu}; the majority, {count} of {total} {unit_of_peers}, {verb} {common}"
            ),
            baseline_source="fleet_majority",
        )
        out.append(_Drift(node, gpu, cause, severity, label, evidence))
    return out


def _gpu_side(members: list[NodeState], values: dict[str, NodeValues], min_peers: int) -> list[_Drift]:
    """VBIOS per GPU (by board part number) and the driver, from the nodes' Hello inventories."""
    out: list[_Drift] = []
    boards: dict[str, dict[str, str]] = {}
    reporting: dict[str, set[str]] = {}  # board part number -> the nodes with one
    for node in members:
        for board, key, version in values[node.name].vbios:
            boards.setdefault(board, {})[key] = version
            reporting.setdefault(board, set()).add(node.name)
    for board, vbios in boards.items():
        what = ("vbios_version", "VBIOS", "firmware_drift", "warning")
        out += _compare(vbios, len(reporting[board]), min_peers, what, where=_gpu_of, unit_of_peers="GPUs")
    driver = {n.name: driven for n in members if (driven := values[n.name].driver)}
    out += _compare(driver, len(driver), min_peers, ("driver_version", "driver", "firmware_drift", "info"))
    return out


def _bmc_side(members: list[NodeState], values: dict[str, NodeValues], min_peers: int) -> list[_Drift]:
    """BIOS version, BMC firmware and BIOS attributes, per server model, from the BMC samples."""
    out: list[_Drift] = []
    servers: dict[str, list[tuple[str, NodeValues]]] = {}
    for node in members:
        read = values[node.name]
        if read.server is not None:
            servers.setdefault(read.server, []).append((node.name, read))
    for nodes in servers.values():
        bios = {name: read.bios for name, read in nodes if read.bios}
        out += _compare(bios, len(bios), min_peers, ("bios_version", "BIOS", "firmware_drift", "warning"))
        bmc = {name: read.firmware for name, read in nodes if read.firmware}
        what = ("bmc_firmware_version", "BMC firmware", "firmware_drift", "warning")
        out += _compare(bmc, len(bmc), min_peers, what)
        attributes: dict[str, dict[str, str]] = {}
        for name, read in nodes:
            for attribute, value in read.attributes.items():
                attributes.setdefault(attribute, {})[name] = value
        for attribute, held in sorted(attributes.items()):
            what = (f"bios_attributes.{attribute}", f"BIOS attribute {attribute}", "bios_drift", "info")
            out += _compare(held, len(held), min_peers, what)
    return out


def _finding(drifts: list[_Drift]) -> Finding:
    """One finding from the drifts of one (node, gpu, cause): the most severe first."""
    drifts = sorted(drifts, key=lambda d: (-SEVERITIES.index(d.severity), d.evidence.metric))
    first = drifts[0]
    where = "" if first.gpu is None else f"GPU {first.gpu} "
    if len(drifts) == 1:
        summary = f"{where}{first.evidence.detail}"
    else:
        summary = f"{where}{len(drifts)} settings differ from the peer group's majority: " + ", ".join(
            d.label for d in drifts
        )
    return Finding(
        first.node,
        first.gpu,
        first.cause,
        first.severity,
        summary,
        first.evidence,
        [d.evidence for d in drifts[1:]],
        [NAME],
    )


def _same(kept: tuple[NodeValues, ...], values: tuple[NodeValues, ...]) -> bool:
    return len(kept) == len(values) and all(a is b for a, b in zip(kept, values, strict=True))


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    """A group's drifts are compared again only when a member's values changed, or the group's
    members did: the values are kept as one object per node while they stay equal (drift_values.py),
    so a group whose members hold the objects its drifts were found from, in the same order, is as
    it was (comparing 12,500 nodes' BIOS attributes and VBIOSes each pass was most of drift's time)."""
    values = node_values(ctx.fleet)
    min_peers = ctx.config.min_peers
    cached = ctx.fleet.derived.get(GROUPS)
    before: dict[str, tuple[tuple[NodeValues, ...], list[_Drift]]] = (
        cached[1] if cached is not None and cached[0] == min_peers else {}  # type: ignore[assignment]
    )
    kept: dict[str, tuple[tuple[NodeValues, ...], list[_Drift]]] = {}
    keyed: dict[tuple[str, int | None, str], list[_Drift]] = {}
    for name, members in peer_groups(ctx).items():
        held = tuple(values[node.name] for node in members)
        entry = before.get(name)
        if entry is None or not _same(entry[0], held):
            entry = (held, _gpu_side(members, values, min_peers) + _bmc_side(members, values, min_peers))
        kept[name] = entry
        for drift in entry[1]:
            keyed.setdefault((drift.node, drift.gpu, drift.cause), []).append(drift)
    ctx.fleet.derived[GROUPS] = (min_peers, kept)
    return [_finding(drifts) for _, drifts in sorted(keyed.items(), key=lambda kv: str(kv[0]))]
