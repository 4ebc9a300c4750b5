"""PCIe link trained below its maximum generation or width while the GPU is busy, over the window."""

from __future__ import annotations

from controller.detect.base import DetectContext, register
from controller.detect.explain import pcie_cause
from controller.fleet.finding import Finding

NAME = "pcie_link"


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    for node in ctx.fleet.nodes.values():
        for index, gpu in sorted(node.gpus.items()):
            held = gpu.held_for("pcie_below_max")
            if held == 0.0 or held < ctx.config.throttle_window_seconds:
                continue
            cause, evidence = pcie_cause(gpu.sample)
            if cause != "pcie_downtrained":
                continue
            summary = f"GPU {index} {evidence[0].detail}"
            findings.append(Finding(node.name, index, cause, "warning", summary, evidence[0], [], [NAME]))
    return findings
