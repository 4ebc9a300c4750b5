"""Row remap pending or failed: the GPU needs a reset (drain first) to finish remapping HBM rows."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.per_gpu import each_gpu
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import GpuState, NodeState

NAME = "row_remap"


def judge(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    s = gpu.sample
    if not (s.row_remap_pending or s.row_remap_failure):
        return []
    state = "failed" if s.row_remap_failure else "pending"
    evidence = Evidence(
        metric="row_remap_pending",
        value=1.0,
        reasons=(f"row_remap_{state}",),
        detail=f"row remap {state}; {s.row_remap_uncorrectable_total} rows remapped for "
        f"uncorrectable errors, {s.ecc_uncorrected_volatile_total} uncorrected ECC errors since boot",
    )
    supporting = [
        Evidence(metric="ecc_uncorrected_volatile_total", value=float(s.ecc_uncorrected_volatile_total))
    ]
    summary = f"GPU {gpu.index} row remap {state}: reset needed"
    return [
        Finding(
            node.name, gpu.index, "ecc_row_remap_pending", "critical", summary, evidence, supporting, [NAME]
        )
    ]


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, judge)
