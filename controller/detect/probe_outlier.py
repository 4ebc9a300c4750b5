"""Slow GPUs and nodes: each probe result against the robust baseline of its peer group.

Peers are results of the same probe and variant on the same GPU model (node-level results: the
same model and GPU count). A result more than `margin` below the group median, and at least
`min_robust_z` robust sigmas below it, is slow; explain.py names the cause from telemetry.
"""

from __future__ import annotations

from collections import defaultdict

from controller.detect.base import DetectContext, register
from controller.detect.explain import explain_gpu, explain_node
from controller.detect.stats import Baseline, baseline
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import Fleet, ProbeRecord

NAME = "probe_outlier"
CRITICAL_BELOW = -0.25  # a quarter below peers: the GPU is badly broken for any job


def peer_group(fleet: Fleet, record: ProbeRecord) -> tuple[str, ...] | None:
    node = fleet.nodes.get(record.node)
    if node is None:
        return None
    if record.gpu is None:
        return (node.gpu_model, str(len(node.hello.inventory.gpus)), record.probe, record.variant)
    return (node.gpu_name(record.gpu), "gpu", record.probe, record.variant)


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    groups: dict[tuple[str, ...], list[ProbeRecord]] = defaultdict(list)
    for record in ctx.fleet.probes.values():
        group = peer_group(ctx.fleet, record)
        if group is not None:
            groups[group].append(record)
    findings: list[Finding] = []
    for records in groups.values():
        if len(records) < ctx.config.min_peers:
            continue
        base = baseline([r.value for r in records])
        for record in records:
            deviation = base.deviation(record.value)
            if deviation < -ctx.config.margin and base.robust_z(record.value) <= -ctx.config.min_robust_z:
                findings.extend(_explain(ctx, record, base, deviation))
    return findings


def _explain(ctx: DetectContext, record: ProbeRecord, base: Baseline, deviation: float) -> list[Finding]:
    where = "node" if record.gpu is None else f"GPU {record.gpu}"
    evidence = Evidence(
        metric=f"probe.{record.probe}.{record.variant}",
        value=record.value,
        baseline=round(base.median, 3),
        deviation=round(deviation, 4),
        unit=record.unit,
        peers=base.count,
        detail=f"{record.probe} {record.variant} {record.value:.1f} {record.unit} is {-deviation:.1%} below "
        f"the median of {base.count} peers ({base.median:.1f})",
    )
    severity = "critical" if deviation < CRITICAL_BELOW else "warning"
    summary = f"{where} {record.probe} {record.variant} {-deviation:.0%} below peers"
    if record.gpu is not None:
        node = ctx.fleet.nodes[record.node]
        during = record.result.during if record.result.HasField("during") else None
        latest = node.gpus[record.gpu].sample if record.gpu in node.gpus else None
        cause, support = explain_gpu(record.probe, during or latest)
        return [Finding(record.node, record.gpu, cause, severity, summary, evidence, support, [NAME])]
    explained = explain_node(ctx.fleet.nodes[record.node])
    if not explained:
        return [Finding(record.node, None, "slow_unknown", severity, summary, evidence, [], [NAME])]
    return [
        Finding(record.node, gpu, cause, severity, f"{summary}: GPU {gpu} {cause}", evidence, support, [NAME])
        for gpu, cause, support in explained
    ]
