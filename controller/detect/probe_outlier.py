"""Slow GPUs and nodes: each probe result against the robust baseline of its peer group.

Peers are results of the same probe, variant and unit on the same GPU model (node-level results:
the same model and GPU count). Which way is slow comes from the probe's ProbeInfo in the node's
Hello (higher-is-better: a low value is slow; otherwise a high one), so a probe kind this controller
has never heard of is compared like the others. A result more than `margin` worse than the group
median, and at least `min_robust_z` robust sigmas worse, is slow; explain.py names the cause from
telemetry.
"""

from __future__ import annotations

from collections import defaultdict

from controller.detect.base import DetectContext, register
from controller.detect.explain import explain_gpu, explain_node
from controller.detect.stats import Baseline, baseline
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import Fleet, ProbeRecord
from controller.fleet.peers import node_peer_key
from controller.fleet.probe_info import higher_is_better
from protos.gpufleet.v1 import telemetry_pb2 as pb

NAME = "probe_outlier"
CRITICAL_WORSE = 0.25  # a quarter worse than peers: the GPU is badly broken for any job


def peer_group(fleet: Fleet, record: ProbeRecord) -> tuple[str, ...] | None:
    node = fleet.nodes.get(record.node)
    if node is None:
        return None
    better = "higher" if higher_is_better(node.hello, record.probe) else "lower"
    what = (record.probe, record.variant, record.unit, better)
    if record.gpu is None:
        return (*node_peer_key(node), *what)
    return (node.gpu_name(record.gpu), "gpu", *what)


def worse_by(deviation: float, higher_better: bool) -> float:
    """How much worse than the median a result is, as a share (negative: better than the median)."""
    return -deviation if higher_better else deviation


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    groups: dict[tuple[str, ...], list[ProbeRecord]] = defaultdict(list)
    for record in ctx.fleet.probes.values():
        group = peer_group(ctx.fleet, record)
        if group is not None:
            groups[group].append(record)
    findings: list[Finding] = []
    for group, records in groups.items():
        if len(records) < ctx.config.min_peers:
            continue
        higher_better = group[-1] == "higher"
        sign = 1.0 if higher_better else -1.0
        base = baseline([r.value for r in records])
        for record in records:
            deviation = base.deviation(record.value)
            worse = worse_by(deviation, higher_better)
            if worse > ctx.config.margin and sign * base.robust_z(record.value) <= -ctx.config.min_robust_z:
                findings.extend(_explain(ctx, record, base, deviation, higher_better))
    return findings


def _explain(
    ctx: DetectContext, record: ProbeRecord, base: Baseline, deviation: float, higher_better: bool
) -> list[Finding]:
    where = "node" if record.gpu is None else f"GPU {record.gpu}"
    side = "below" if higher_better else "above"
    worse = worse_by(deviation, higher_better)
    evidence = Evidence(
        metric=f"probe.{record.probe}.{record.variant}",
        value=record.value,
        baseline=round(base.median, 3),
        deviation=round(deviation, 4),
        unit=record.unit,
        peers=base.count,
        detail=f"{record.probe} {record.variant} {record.value:.1f} {record.unit} is "
        f"{abs(deviation):.1%} {side} the median of {base.count} peers ({base.median:.1f})"
        + ("" if higher_better else ": lower is better"),
    )
    severity = "critical" if worse > CRITICAL_WORSE else "warning"
    summary = f"{where} {record.probe} {record.variant} {abs(deviation):.0%} {side} peers"
    if record.gpu is not None:
        node = ctx.fleet.nodes[record.node]
        during = _reading(record.result.during)
        latest = node.gpus[record.gpu].sample if record.gpu in node.gpus else None
        cause, support = explain_gpu(record.probe, during if during is not None else latest)
        return [Finding(record.node, record.gpu, cause, severity, summary, evidence, support, [NAME])]
    explained = explain_node(ctx.fleet.nodes[record.node])
    if not explained:
        return [Finding(record.node, None, "slow_unknown", severity, summary, evidence, [], [NAME])]
    return [
        Finding(record.node, gpu, cause, severity, f"{summary}: GPU {gpu} {cause}", evidence, support, [NAME])
        for gpu, cause, support in explained
    ]


def _reading(during: pb.GpuSample) -> pb.GpuSample | None:
    """`during`, or None when it carries no reading: unset, or set but empty or only naming its GPU
    (an empty message reads as zero clocks, which would look like memory at its maximum clock)."""
    return during if {f.name for f, _ in during.ListFields()} - {"index", "uuid"} else None
