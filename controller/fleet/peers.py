"""Peer groups: which nodes and GPUs are compared with each other.

- A node's group (`node_group`: GPU model and count, e.g. "NVIDIA H100 80GB HBM3 x8") is what the
  breaker limits actions within and what drift and BIOS/firmware majorities are taken over.
- Probe results are compared more finely (`gpu_class`, `node_class`): the model name alone lumps
  together GPUs that are built to perform differently. One model name comes as SKU variants (the
  board part number) with some NVLinks off by design, power-limited boards (a 500 W and a 700 W
  HGX H100 share a name) and, over a driver upgrade, two driver branches. A 500 W board's GEMM is
  not slow beside 700 W ones, nor a 12-link board's all-reduce beside 18-link ones: such results are
  judged among their own kind (too few of them: against their own history and the datasheet).
"""

from __future__ import annotations

import sys
from collections import Counter

from controller.fleet.model import Fleet, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb

# (model, what else makes its results comparable): ("NVIDIA H100 80GB HBM3", "692-2G520-0200-000,
# 18 NVLinks, 700 W, driver 550"), a part left out where the agent did not report it. One string for
# the rest, so that a result's group is as short a tuple to hash as the model's alone was (grouping
# 712,500 results at 12,500 nodes).
GpuClass = tuple[str, str]


def node_group(node: NodeState) -> str:
    """The node's group as one name, e.g. "NVIDIA H100 80GB HBM3 x8"."""
    return f"{node.gpu_model or 'unknown'} x{len(node.hello.inventory.gpus)}"


def group_sizes(fleet: Fleet) -> dict[str, int]:
    """Nodes per group (node_group) in the fleet now."""
    return dict(Counter(node_group(n) for n in fleet.nodes.values()))


def driver_branch(version: str) -> str:
    """The branch of a driver version, "550" of "550.54.15": releases of one branch perform alike,
    another branch may not."""
    return version.strip().partition(".")[0]


def gpu_class(info: pb.GpuInfo, driver: str) -> GpuClass:
    """What a GPU's probe results are compared by; `driver`: the node's driver version, for a GPU
    whose own is not reported."""
    parts = [info.board_part_number] if info.board_part_number else []
    if info.HasField("nvlink_count"):
        parts.append(f"{info.nvlink_count} NVLinks")
    if info.HasField("default_power_limit_watts"):
        parts.append(f"{round(info.default_power_limit_watts)} W")
    branch = driver_branch(info.driver_version or driver)
    if branch:
        parts.append(f"driver {branch}")
    return (info.name, sys.intern(", ".join(parts)))


def gpu_classes(hello: pb.Hello) -> dict[int, GpuClass]:
    """Each GPU's class by index (the first of an index, as NodeState.gpu_name reads it). A node's
    GPUs built alike share one class object."""
    driver = hello.inventory.driver_version
    same: dict[GpuClass, GpuClass] = {}
    out = {}
    for info in reversed(hello.inventory.gpus):
        found = gpu_class(info, driver)
        out[info.index] = same.setdefault(found, found)
    return out


def node_class(node: NodeState) -> tuple[str, ...]:
    """What a node's node-level results (an all-reduce over every GPU) are compared by: its group's
    model and GPU count, then each distinct class of its GPUs (one, unless the node mixes boards)."""
    return probe_classes(node)[1]


def probe_classes(node: NodeState) -> tuple[dict[int, GpuClass], tuple[str, ...]]:
    """(gpu_classes, node_class) of the node, read once per Hello: a Hello is replaced, never changed
    in place, when the agent says hello again."""
    kept = node.classes_of
    if kept is not None and kept[0] is node.hello:
        return kept[1]  # type: ignore[no-any-return]
    gpus = gpu_classes(node.hello)
    kinds = sorted({rest for _, rest in gpus.values()})
    found = (gpus, (node.gpu_model, str(len(node.hello.inventory.gpus)), sys.intern("; ".join(kinds))))
    node.classes_of = (node.hello, found)
    return found
