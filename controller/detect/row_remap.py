"""Row remap pending or failed: the GPU needs a reset (drain first) to finish remapping HBM rows."""

from __future__ import annotations

from controller.detect.base import DetectContext, register
from controller.fleet.finding import Evidence, Finding

NAME = "row_remap"


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings = []
    for node in ctx.fleet.nodes.values():
        for index, gpu in sorted(node.gpus.items()):
            s = gpu.sample
            if not (s.row_remap_pending or s.row_remap_failure):
                continue
            state = "failed" if s.row_remap_failure else "pending"
            evidence = Evidence(
                metric="row_remap_pending",
                value=1.0,
                reasons=(f"row_remap_{state}",),
                detail=f"row remap {state}; {s.row_remap_uncorrectable_total} rows remapped for "
                f"uncorrectable errors, {s.ecc_uncorrected_volatile_total} uncorrected ECC errors since boot",
            )
            supporting = [
                Evidence(
                    metric="ecc_uncorrected_volatile_total", value=float(s.ecc_uncorrected_volatile_total)
                )
            ]
            summary = f"GPU {index} row remap {state}: reset needed"
            findings.append(
                Finding(
                    node.name,
                    index,
                    "ecc_row_remap_pending",
                    "critical",
                    summary,
                    evidence,
                    supporting,
                    [NAME],
                )
            )
    return findings
