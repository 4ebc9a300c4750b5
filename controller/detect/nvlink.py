"""Inactive NVLinks: collective bandwidth of the whole node drops with them."""

from __future__ import annotations

from controller.detect.base import DetectContext, register
from controller.detect.explain import nvlink_evidence
from controller.fleet.finding import Finding

NAME = "nvlink"


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    for node in ctx.fleet.nodes.values():
        for index, gpu in sorted(node.gpus.items()):
            if "nvlink_inactive" not in gpu.held:  # fleet/conditions.py: from the same reading
                continue
            evidence = nvlink_evidence(gpu.sample)
            if evidence is None:
                continue
            summary = f"GPU {index} {evidence.detail}"
            findings.append(
                Finding(node.name, index, "nvlink_down", "critical", summary, evidence, [], [NAME])
            )
    return findings
