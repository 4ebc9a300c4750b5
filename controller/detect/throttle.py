"""Throttling held over the window: thermal slowdown, external power brake, a lowered power cap.

A software power cap at the default limit is how a GPU at full load normally behaves, so it is a
finding only when the enforced limit is below the default.

Held time ends at the GPU's last reading, not at now. A node that goes silent after one throttled
sample raises nothing (it is stale, see fleet/health.py); an open finding of a node gone silent
stops growing and stays as the last readings left it, like the other findings of a stale node,
until a reading clears it or the node is forgotten (limits.forget_after_seconds).
"""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect.base import DetectContext, register
from controller.detect.explain import THERMAL, clock_cause
from controller.detect.per_gpu import each_gpu
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import GpuState, NodeState

NAME = "throttle"
CHECKS = (
    ("thermal_throttle", THERMAL),
    ("power_brake", ("hw_power_brake_slowdown",)),
    ("power_cap", ("sw_power_cap",)),
)


WATCHED = frozenset(name for _, names in CHECKS for name in names)


def _held(gpu: GpuState, names: tuple[str, ...]) -> float:
    """The longest any of `names` has held (GpuState.held_for): since the earliest of their starts."""
    since = [gpu.held[n] for n in names if n in gpu.held]
    return max(0.0, gpu.time - min(since)) if since else 0.0


def judge(node: NodeState, gpu: GpuState, config: DetectConfig) -> list[Finding]:
    if WATCHED.isdisjoint(gpu.held):
        return []  # no throttle reason held: the usual GPU
    window = config.throttle_window_seconds
    s = gpu.sample
    findings = []
    for cause, names in CHECKS:
        held = _held(gpu, names)
        if held < window or held == 0.0:
            continue
        explained, support = clock_cause(s)
        if explained != cause:
            continue  # e.g. sw_power_cap at the default limit: normal under load
        primary = Evidence(
            metric="clock_event_reasons",
            value=float(s.clock_event_reasons),
            reasons=tuple(n for n in names if n in gpu.held),
            held_seconds=round(held, 1),
            detail=f"{' + '.join(n for n in names if n in gpu.held)} held for {held:.0f}s",
        )
        summary = f"GPU {gpu.index} {cause.replace('_', ' ')} for {held:.0f}s"
        findings.append(Finding(node.name, gpu.index, cause, "warning", summary, primary, support, [NAME]))
    return findings


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    return each_gpu(ctx, NAME, judge)
