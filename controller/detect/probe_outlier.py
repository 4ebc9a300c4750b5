"""Slow GPUs and nodes: each probe result against a baseline that fits it.

Peers are results of the same probe, variant and unit on the same GPU model (node-level results:
the same model and GPU count). Which way is slow comes from the probe's ProbeInfo in the node's
Hello (higher-is-better: a low value is slow; otherwise a high one), so a probe kind this controller
has never heard of is compared like the others. explain.py names the cause from telemetry.

The baseline, and the evidence's baseline_source:
- peers: the group's robust median, where the group has `min_peers` results. Slow is more than
  `margin` worse, widened to `min_robust_z` robust sigmas of the group (a noisy group's threshold
  follows its spread). Beside it a change-point test (own_history.py): the newest results' mean
  clearly worse than the GPU's own earlier median (`change_floor`, `change_robust_z` of its own
  spread), and the result also `change_peer_margin` worse than the peers' median, is slow too.
- own_history: a smaller group: the GPU's own earlier results, with the same margin test.
- datasheet: when its own history says nothing (too short, or as slow all along), the result's
  peak_ratio against the fleet's usual ratio for the probe and variant (every model's results
  that carry one, `min_peers` at least), with the same margin test.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from controller.detect.base import DetectContext, register
from controller.detect.explain import explain_gpu, explain_node
from controller.detect.nvlink_peers import link_norms
from controller.detect.own_history import own_baseline, recent_change
from controller.detect.stats import Baseline, baseline
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import ProbeRecord
from controller.fleet.probe_groups import described, grouped
from protos.gpufleet.v1 import telemetry_pb2 as pb

NAME = "probe_outlier"
T = TypeVar("T")
CRITICAL_WORSE = 0.25  # a quarter worse than its baseline: the GPU is badly broken for any job
SUMMARY_BASIS = {"peers": "peers", "own_history": "its own history", "datasheet": "the datasheet ratio"}


def worse_by(deviation: float, higher_better: bool) -> float:
    """How much worse than the median a result is, as a share (negative: better than the median)."""
    return -deviation if higher_better else deviation


@dataclass(frozen=True, slots=True)
class Slow:
    """A result judged slow, and against what."""

    source: str  # Evidence.baseline_source: peers | own_history | datasheet
    value: float  # the value judged (the newest runs' mean for a change against own history)
    baseline: float  # what it was judged against, in the probe's unit
    count: int  # results the baseline was made of
    against: str  # the baseline in words, for the detail line
    runs: int = 1  # the GPU's newest results `value` stands for

    @property
    def deviation(self) -> float:
        return (self.value - self.baseline) / self.baseline if self.baseline else 0.0


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    findings: list[Finding] = []
    for record, slow, higher_better in judged(ctx):
        findings.extend(_explain(ctx, record, slow, higher_better))
    return findings


def judged(ctx: DetectContext) -> list[tuple[ProbeRecord, Slow, bool]]:
    """The results judged slow. The judgement reads only probe results, their history, the Hellos and
    the config, so it is reused until one of them changes (reused); the cause is named from the
    current telemetry every pass (_explain)."""
    return reused(ctx, NAME, _judge_all)


def reused(ctx: DetectContext, name: str, judge: Callable[[DetectContext], T]) -> T:
    """judge(ctx), kept in Fleet.derived under `name` until the probe results (Fleet.probe_version,
    their count), the nodes' count or the config change."""
    fleet = ctx.fleet
    key = (fleet.probe_version, len(fleet.probes), len(fleet.nodes))
    cached = fleet.derived.get(name)
    # The config by identity: the entry holds it, so another config cannot take its id.
    if cached is not None and cached[0] == key and cached[1] is ctx.config:
        return cached[2]  # type: ignore[return-value]
    found = judge(ctx)
    fleet.derived[name] = (key, ctx.config, found)
    return found


def _judge_all(ctx: DetectContext) -> list[tuple[ProbeRecord, Slow, bool]]:
    """Every result's judgement. At 12,500 nodes (712,000 results) this ran 4.4 s whenever a result
    had come in since the last pass (nearly every pass), so a group's thresholds are worked out once
    and only the results past them are judged one by one; the datasheet baseline is read only if a
    group is too small for its peers."""
    min_peers = ctx.config.min_peers
    usual: dict[tuple[str, str], Baseline] | None = None
    slow_ones: list[tuple[ProbeRecord, Slow, bool]] = []
    for group, members in grouped(ctx.fleet).items():
        records = list(members.values())
        higher_better = group[-1] == "higher"
        if len(records) >= min_peers:
            peers = baseline([r.value for r in records])
            for record in _past_thresholds(ctx, records, peers, higher_better):
                slow = _against_peers(ctx, record, peers, higher_better, described(group))
                if slow is not None:
                    slow_ones.append((record, slow, higher_better))
            continue
        if usual is None:
            usual = usual_peak_ratios(ctx.fleet.probes.values(), min_peers)
        for record in records:  # too few peers: its own history, and the datasheet as last resort
            slow = _against_own_history(ctx, record, higher_better) or _against_datasheet(
                ctx, record, usual.get((record.probe, record.variant)), higher_better
            )
            if slow is not None:
                slow_ones.append((record, slow, higher_better))
    return slow_ones


def _past_thresholds(
    ctx: DetectContext, records: list[ProbeRecord], peers: Baseline, higher_better: bool
) -> list[ProbeRecord]:
    """The results _against_peers could judge slow: more than the group's margin worse than its
    median, or more than change_peer_margin (then its own history decides). The rest, nearly every
    result, need no judgement of their own: `worse` is the same expression _against_peers computes."""
    config = ctx.config
    least = min(peers.margin(config.margin, config.min_robust_z), config.change_peer_margin)
    median = peers.median
    if not median:
        return records if least < 0.0 else []  # deviation() is 0 for every value
    if higher_better:
        return [r for r in records if -((r.value - median) / median) > least]
    return [r for r in records if (r.value - median) / median > least]


def usual_peak_ratios(records: Iterable[ProbeRecord], min_results: int) -> dict[tuple[str, str], Baseline]:
    """Per (probe, variant), the robust baseline of the results' peak_ratio over every model (the
    share of its datasheet peak a GPU reaches; higher is better either way), from `min_results` on."""
    ratios: dict[tuple[str, str], list[float]] = defaultdict(list)
    for r in records:
        if r.peak_ratio > 0:
            ratios[(r.probe, r.variant)].append(r.peak_ratio)
    return {key: baseline(values) for key, values in ratios.items() if len(values) >= min_results}


def _against_peers(
    ctx: DetectContext, record: ProbeRecord, peers: Baseline, higher_better: bool, kind: str
) -> Slow | None:
    """`kind`: the peers' class in words (probe_groups.described)."""
    config = ctx.config
    worse = worse_by(peers.deviation(record.value), higher_better)
    peer_words = f"the median of {peers.count} peers ({peers.median:.1f}; {kind})"
    if worse > peers.margin(config.margin, config.min_robust_z):
        return Slow("peers", record.value, peers.median, peers.count, peer_words)
    if worse <= config.change_peer_margin:
        return None
    change = recent_change(ctx.fleet, record, config.own_history_min_points)
    if change is None:
        return None
    before = change.before
    if worse_by(before.deviation(change.recent), higher_better) <= before.margin(
        config.change_floor, config.change_robust_z
    ):
        return None
    side = "below" if higher_better else "above"
    return Slow(
        "own_history",
        change.recent,
        before.median,
        before.count,
        f"its own median of {before.median:.1f} {record.unit} over {before.count} runs "
        f"(the latest is {worse:.1%} {side} {peer_words})",
        change.runs,
    )


def _against_own_history(ctx: DetectContext, record: ProbeRecord, higher_better: bool) -> Slow | None:
    own = own_baseline(ctx.fleet, record, ctx.config.own_history_min_points)
    if own is None:
        return None
    worse = worse_by(own.deviation(record.value), higher_better)
    if worse <= own.margin(ctx.config.margin, ctx.config.min_robust_z):
        return None
    words = f"its own median of {own.median:.1f} {record.unit} over {own.count} runs"
    return Slow("own_history", record.value, own.median, own.count, words)


def _against_datasheet(
    ctx: DetectContext, record: ProbeRecord, usual: Baseline | None, higher_better: bool
) -> Slow | None:
    ratio = record.peak_ratio
    if usual is None or ratio <= 0 or usual.median <= 0:
        return None
    if worse_by(usual.deviation(ratio), True) <= usual.margin(ctx.config.margin, ctx.config.min_robust_z):
        return None
    # peak_ratio is value / peak (higher is better) or peak / value (lower is better).
    peak = record.value / ratio if higher_better else record.value * ratio
    expected = peak * usual.median if higher_better else peak / usual.median
    words = (
        f"{expected:.1f} {record.unit}, the fleet's usual {usual.median:.1%} of the datasheet peak "
        f"over {usual.count} results (it reached {ratio:.1%})"
    )
    return Slow("datasheet", record.value, expected, usual.count, words)


def _explain(ctx: DetectContext, record: ProbeRecord, slow: Slow, higher_better: bool) -> list[Finding]:
    where = "node" if record.gpu is None else f"GPU {record.gpu}"
    side = "below" if higher_better else "above"
    deviation = slow.deviation
    worse = worse_by(deviation, higher_better)
    shown = f"{slow.value:.1f} {record.unit}" + (
        f", the mean of its newest {slow.runs} runs," if slow.runs > 1 else ""
    )
    evidence = Evidence(
        metric=f"probe.{record.probe}.{record.variant}",
        value=round(slow.value, 3),
        baseline=round(slow.baseline, 3),
        deviation=round(deviation, 4),
        unit=record.unit,
        peers=slow.count,
        detail=f"{record.probe} {record.variant} {shown} is {abs(deviation):.1%} {side} "
        f"{slow.against}" + ("" if higher_better else ": lower is better"),
        baseline_source=slow.source,
    )
    severity = "critical" if worse > CRITICAL_WORSE else "warning"
    summary = (
        f"{where} {record.probe} {record.variant} {abs(deviation):.0%} {side} {SUMMARY_BASIS[slow.source]}"
    )
    if record.gpu is not None:
        node = ctx.fleet.nodes[record.node]
        during = _reading(record.result.during)
        latest = node.gpus[record.gpu].sample if record.gpu in node.gpus else None
        cause, support = explain_gpu(record.probe, during if during is not None else latest)
        return [Finding(record.node, record.gpu, cause, severity, summary, evidence, support, [NAME])]
    explained = explain_node(ctx.fleet.nodes[record.node], usual=link_norms(ctx).usual)
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
