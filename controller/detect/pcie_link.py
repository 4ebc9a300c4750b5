"""PCIe link trained below its maximum generation or width while the GPU is busy, over the window."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.explain import pcie_cause
from controller.detect.per_gpu import each_gpu
from controller.fleet.finding import Finding
from controller.fleet.model import GpuState, NodeState

NAME = "pcie_link"


def judge(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    held = gpu.held_for("pcie_below_max")
    if held == 0.0 or held < config.throttle_window_seconds:
        return []
    cause, evidence = pcie_cause(gpu.sample)
    if cause != "pcie_downtrained":
        return []
    summary = f"GPU {gpu.index} {evidence[0].detail}"
    return [Finding(node.name, gpu.index, cause, "warning", summary, evidence[0], [], [NAME])]


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, judge)
