"""NVLinks up but erroring: CRC, replay or recovery counters rising on an active link.

A marginal link (a worn connector, a bad lane) stays up and carries traffic, but its flits fail
their CRC and are replayed, and it may retrain (a recovery); collectives over it slow down. An
inactive link is nvlink.py's nvlink_down, not this (its retraining counts errors too).

Rates come from NodeState.trends (the counter's rise over the newest 10 minutes of readings). A
link is erroring when one of its counters rises at detect.nvlink_error_rate_per_minute or faster
(critical at detect.nvlink_critical_rate_per_minute), having risen in at least
detect.nvlink_min_rises readings (3: a one-off jump, a link retrained once, is not a rising
counter) spread over at least detect.throttle_window_seconds. At the agent's 10 s interval a
marginal link is found within about 40 s. Healthy links count a few CRC errors while training and
then stay flat. The finding closes once the rate over the window falls under the threshold, which
takes up to the trends window (10 minutes) after the counters stop rising.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.per_gpu import each_gpu
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import GpuState, NodeState
from controller.fleet.trends import NVLINK_COUNTERS, Trends, nvlink_group, nvlink_key

NAME = "nvlink_errors"
# counter -> (short reason name, what one count is)
COUNTER_NAMES = {
    "crc_errors_total": ("crc", "CRC errors"),
    "replay_errors_total": ("replay", "replays"),
    "recovery_errors_total": ("recovery", "recoveries"),
}


@dataclass(frozen=True, slots=True)
class LinkErrors:
    link: int
    per_minute: dict[str, float]  # counter -> rate, for each counter that rose over the window
    span: float  # seconds of readings the rates are over
    erroring: tuple[str, ...]  # counters at or above the threshold

    @property
    def worst(self) -> tuple[str, float]:
        return max(self.per_minute.items(), key=lambda kv: kv[1])


def rises(trends: Trends, key: str) -> int:
    """Readings within the window in which the counter went up (Trends keeps one change point per
    reading that changed any counter of the key's group; points[0] holds the totals as the window
    starts)."""
    found = trends.found(key)
    if found is None:
        return 0
    group, position = found
    points = trends.groups[group].points
    return sum(1 for a, b in pairwise(p[1][position] for p in points) if b > a)


def link_errors(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[LinkErrors]:
    """The active links of `gpu` whose error counters rise at or above the warning rate."""
    if not node.trends.changed(nvlink_group(gpu.index)):
        return []  # no counter of any link rose within the window (most GPUs, most of the time)
    out = []
    for link in gpu.sample.nvlinks:
        if not link.active:
            continue
        rates: dict[str, float] = {}
        erroring = []
        span = 0.0
        for counter in NVLINK_COUNTERS:
            key = nvlink_key(gpu.index, link.link, counter)
            rate = node.trends.rate(key)
            if rate is None or rate <= 0:
                continue
            rates[counter] = rate * 60.0
            span = max(span, node.trends.span(key))
            sustained = (
                node.trends.span(key) >= config.throttle_window_seconds
                and rises(node.trends, key) >= config.nvlink_min_rises
            )
            if sustained and rate * 60.0 >= config.nvlink_error_rate_per_minute:
                erroring.append(counter)
        if erroring:
            out.append(LinkErrors(link.link, rates, span, tuple(erroring)))
    return out


def _over(span: float) -> str:
    return f"{span:.0f} s" if span < 120 else f"{span / 60:.0f} min"


def _detail(e: LinkErrors) -> str:
    rates = ", ".join(f"{rate:.3g} {COUNTER_NAMES[c][1]}/min" for c, rate in e.per_minute.items())
    return f"NVLink {e.link}: {rates} over {_over(e.span)}"


def _reasons(e: LinkErrors) -> tuple[str, ...]:
    return tuple(f"link{e.link}_{COUNTER_NAMES[c][0]}" for c in e.erroring)


def link_evidence(links: list[LinkErrors], config: DetectConfig) -> Evidence:
    """One Evidence for the erroring links of a GPU: the worst rate as value, every link in reasons."""
    worst = max(links, key=lambda e: e.worst[1])
    counter, per_minute = worst.worst
    return Evidence(
        metric=f"nvlink.{counter}",
        value=round(per_minute / 60.0, 4),
        baseline=round(config.nvlink_error_rate_per_minute / 60.0, 4),
        unit="errors/s",
        reasons=tuple(r for e in links for r in _reasons(e)),
        detail="; ".join(_detail(e) for e in links),
        baseline_source="expected",
    )


def gpu_finding(node: NodeState, gpu: GpuState, config: DetectConfig) -> Finding | None:
    links = link_errors(node, gpu, config)
    if not links:
        return None
    primary = link_evidence(links, config)
    supporting = [link_evidence([e], config) for e in links] if len(links) > 1 else []
    top = max(e.worst[1] for e in links)
    severity = "critical" if top >= config.nvlink_critical_rate_per_minute else "warning"
    ids = ", ".join(str(e.link) for e in links)
    plural = "s" if len(links) > 1 else ""
    summary = f"GPU {gpu.index} NVLink{plural} {ids} up but erroring: up to {top:.0f} errors/min"
    return Finding(node.name, gpu.index, "nvlink_errors", severity, summary, primary, supporting, [NAME])


def judge(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    finding = gpu_finding(node, gpu, config)
    return [] if finding is None else [finding]


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, judge)
