"""Verification bars: what the agent's re-probe must clear to keep an apply, from the node's peers'
results. A GPU's power limit and locked GPU clocks move gemm, its locked memory clocks membw; OS and
BIOS settings move no probe (read back only).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from controller.config import DetectConfig
from controller.detect.stats import baseline
from controller.fleet.model import Fleet, NodeState, ProbeRecord
from controller.fleet.probe_groups import peer_group
from controller.fleet.probe_info import higher_is_better
from controller.remediate.changes import gpu_indexes
from protos.gpufleet.v1 import telemetry_pb2 as pb

# The probes a GPU setting moves: the re-probe that verifies an apply of it.
PROBES_OF = {
    "gpu.power_limit": ("gemm",),
    "gpu.locked_gpu_clocks": ("gemm",),
    "gpu.locked_memory_clocks": ("membw",),
}


def verify_bars(
    fleet: Fleet, node: NodeState, settings: Iterable[str], gpus: list[int], detect: DetectConfig
) -> list[pb.ProbeBar]:
    """For each affected GPU and each probe its settings (`gpu.power_limit`, ...) move, in every
    variant it has a result of: the peers' edge of normal (the median worse by `detect.margin`) and
    its value now. A result with fewer than `detect.min_peers` peers gets no bar (no baseline)."""
    probes = {p for path in settings for p in PROBES_OF.get(path, ())}
    if not probes:
        return []
    groups: dict[tuple[str, ...], list[float]] = defaultdict(list)
    mine: list[tuple[ProbeRecord, tuple[str, ...]]] = []
    wanted = set(gpu_indexes(node, gpus))
    for record in fleet.probes.values():
        if record.probe not in probes or record.gpu is None:
            continue
        group = peer_group(fleet, record)
        if group is None:
            continue
        groups[group].append(record.value)
        if record.node == node.name and record.gpu in wanted:
            mine.append((record, group))
    bars = []
    for record, group in sorted(mine, key=lambda m: (m[0].gpu or 0, m[0].probe, m[0].variant)):
        if len(groups[group]) < detect.min_peers:
            continue
        higher = higher_is_better(node.hello, record.probe)
        median = baseline(groups[group]).median
        normal = median * (1 - detect.margin) if higher else median * (1 + detect.margin)
        bar = pb.ProbeBar(
            probe=record.probe,
            variant=record.variant,
            normal=round(normal, 6),
            before=record.value,
            higher_is_better=higher,
            better_by=detect.margin,
        )
        bar.gpu = record.gpu or 0
        bars.append(bar)
    return bars


def moves_a_probe(setting: str) -> bool:
    """`gpu[3].power_limit` is a setting a probe measures (PROBES_OF)."""
    level, _, name = setting.partition(".")
    return level.startswith("gpu[") and f"gpu.{name}" in PROBES_OF
