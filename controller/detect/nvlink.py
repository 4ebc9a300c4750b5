"""Inactive NVLinks: collective bandwidth of the whole node drops with them."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.explain import nvlink_evidence
from controller.detect.per_gpu import each_gpu
from controller.fleet.finding import Finding
from controller.fleet.model import GpuState, NodeState

NAME = "nvlink"


def judge(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    if "nvlink_inactive" not in gpu.held:  # fleet/conditions.py: from the same reading
        return []
    evidence = nvlink_evidence(gpu.sample)
    if evidence is None:
        return []
    summary = f"GPU {gpu.index} {evidence.detail}"
    return [Finding(node.name, gpu.index, "nvlink_down", "critical", summary, evidence, [], [NAME])]


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, judge)
