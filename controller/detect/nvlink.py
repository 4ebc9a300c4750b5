"""Inactive NVLinks: collective bandwidth of the whole node drops with them. Fewer active than the
GPU's peers have, that is: links off by design (an H100 PCIe SKU's 6 of 18, a PCIe card without its
bridge) are no fault (detect/nvlink_peers.py)."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.explain import nvlink_evidence
from controller.detect.nvlink_peers import link_norms, links_of
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
    """Every GPU with an inactive link (each_gpu, judged again only on a new reading), then those
    with fewer active than their peers have: as judged when every one of them has."""
    found = each_gpu(ctx, NAME, judge)
    if not found:
        return found
    norms = link_norms(ctx)
    out = []
    for finding in found:
        assert finding.gpu is not None
        node = ctx.fleet.nodes[finding.node]
        gpu = node.gpus[finding.gpu]
        total, active = links_of(gpu)
        usual = norms.usual(node, finding.gpu, total)
        if usual == total:
            out.append(finding)  # every link expected up: the finding as judged
            continue
        if active >= usual:
            continue  # as its peers: links off by design
        evidence = nvlink_evidence(gpu.sample, usual)
        if evidence is not None:
            summary = f"GPU {finding.gpu} {evidence.detail}"
            out.append(
                Finding(node.name, finding.gpu, "nvlink_down", "critical", summary, evidence, [], [NAME])
            )
    return out
