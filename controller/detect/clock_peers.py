"""Busy GPUs' SM clocks by peer key, the baseline of clock_lock.py's peer evidence.

Each node's busy GPUs are read once per reading and kept (in Fleet.derived) until the node's Hello
(which names its GPUs) or one of its GPUs' readings is replaced: an accepted frame puts a new
GpuState in node.gpus, never changes one in place, and a Hello is replaced likewise. Reading every
GPU's clock and utilisation out of its message each pass was most of the detector's time at 12,500
nodes. A GPU's peers' median is read off its key's sorted clocks less its own (stats.median_less),
not from a copy of the others per GPU, which cost the group's size squared with many GPUs locked.
"""

from __future__ import annotations

import bisect

from controller.detect.per_node import per_node
from controller.detect.stats import median_less
from controller.fleet.model import Fleet, GpuState, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb

KEPT = "clock_peers"  # Fleet.derived, by detect/per_node.py (under the utilisation floor)

PeerKey = tuple[str, float, float]  # GPU model, max SM clock, default power limit


def util(sample: pb.GpuSample) -> float:
    return sample.gpu_utilization_ratio if sample.HasField("gpu_utilization_ratio") else 0.0


def peer_key(names: dict[int, str], gpu: GpuState) -> PeerKey:
    """`names`: the node's GPU names by index (NodeState.gpu_names), read once per node, not once per GPU."""
    s = gpu.sample
    return (names.get(gpu.index, ""), s.max_sm_clock_hz, s.default_power_limit_watts)


def busy_clock(gpu: GpuState, utilization: float) -> float | None:
    """The GPU's SM clock when it counts among the busy GPUs (at or above `utilization`), else None."""
    s = gpu.sample
    if s.HasField("sm_clock_hz") and s.max_sm_clock_hz and util(s) >= utilization:
        return s.sm_clock_hz
    return None


NodeBusy = tuple[tuple[PeerKey, float], ...]  # (peer key, SM clock) of each busy GPU of a node


def _read(node: NodeState, utilization: float) -> NodeBusy:
    names: dict[int, str] | None = None
    busy = []
    for gpu in node.gpus.values():
        clock = busy_clock(gpu, utilization)
        if clock is not None:
            names = node.gpu_names() if names is None else names
            busy.append((peer_key(names, gpu), clock))
    return tuple(busy)


def _sources(node: NodeState) -> tuple[object, ...]:
    """The Hello (which names the GPUs) and the GPUs' readings."""
    return (node.hello, *node.gpus.values())


def busy_clocks(fleet: Fleet, utilization: float) -> dict[PeerKey, list[float]]:
    """The SM clocks of every GPU at or above `utilization`, by peer key, each list sorted."""
    out: dict[PeerKey, list[float]] = {}
    read = per_node(fleet, KEPT, _sources, lambda node: _read(node, utilization), context=utilization)
    for busy in read.values():
        for key, clock in busy:
            clocks = out.get(key)
            if clocks is None:
                out[key] = [clock]
            else:
                clocks.append(clock)
    for clocks in out.values():
        clocks.sort()
    return out


def peers_median(
    busy: dict[PeerKey, list[float]], key: PeerKey, gpu: GpuState, utilization: float
) -> tuple[float | None, int]:
    """The median SM clock of the GPU's busy peers (its key's GPUs less itself), and their count."""
    clocks = busy.get(key, [])
    own = busy_clock(gpu, utilization)
    return median_less(clocks, None if own is None else bisect.bisect_left(clocks, own))
