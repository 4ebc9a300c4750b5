"""SM clocks held low on a busy GPU, seen in telemetry without waiting for a probe.

Both rules need the condition (fleet/conditions.py conditions: a busy GPU, SM clock more than 5%
below max) held for detect.throttle_window_seconds, like a throttle:

- Locked (cause clocks_locked_low): NVML shows the lock (the applications_clocks_setting reason or
  an application SM clock below max), the GPU runs at or above detect.clock_busy_utilization, and no
  thermal or power cause explains the clock (explain.clock_cause decides, in its order: those are
  detect/throttle.py's findings). Evidence: the clock against max (baseline_source expected), the
  setting, and the clock against its busy peers' median where there are enough of them.
- Unexplained (cause slow_unknown): NVML shows neither a lock nor any reason bit, the GPU and at
  least detect.min_peers peers run at or above detect.clock_peer_utilization, and its clock is
  detect.clock_peer_margin or more below their median. Without the lock's evidence no cause is
  named. Healthy GPUs under full load run at max clock, or a few percent under it with the power
  cap's reason bit set; idle and lightly loaded GPUs clock down legitimately, hence the utilisation
  floor on both the GPU and its peers, and a margin twice the 5% of the condition.

Peers: GPUs of the same model, max SM clock and default power limit (the SKU's power class: a
GPU at another limit runs at another clock by design) on any node, the GPU itself left out.
"""

from __future__ import annotations

from controller.detect.base import DetectContext, register
from controller.detect.clock_peers import PeerKey, busy_clocks, peer_key, peers_median, util
from controller.detect.explain import clock_cause
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import GpuState, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names

NAME = "clock_lock"


def _mhz(hz: float) -> float:
    return round(hz / 1e6)


def _peer_evidence(
    sample: pb.GpuSample, median: float | None, count: int, utilization: float, min_peers: int
) -> Evidence | None:
    """The GPU's clock against the median of its `count` busy peers' (None with fewer than min_peers)."""
    if median is None or count < min_peers:
        return None
    deviation = sample.sm_clock_hz / median - 1.0 if median else None
    return Evidence(
        metric="sm_clock_hz",
        value=sample.sm_clock_hz,
        baseline=median,
        deviation=deviation,
        unit="Hz",
        peers=count,
        detail=f"peers at >={utilization:.0%} utilisation run {_mhz(median)} MHz (median of "
        f"{count} GPUs); this GPU {_mhz(sample.sm_clock_hz)} MHz at {util(sample):.0%}",
        baseline_source="peers",
    )


def _locked(
    node: NodeState, gpu: GpuState, held: float, peers: Evidence | None, busy: float
) -> Finding | None:
    s = gpu.sample
    if util(s) < busy:
        return None
    cause, support = clock_cause(s)
    if cause != "clocks_locked_low":
        return None  # a thermal or power cause: throttle.py's finding
    reasons = clock_event_reason_names(s.clock_event_reasons)
    app = s.applications_sm_clock_hz
    shown = (
        ("applications_clocks_setting",)
        if "applications_clocks_setting" in reasons
        else (f"applications clock {_mhz(app)} MHz",)
    )
    primary = Evidence(
        metric="sm_clock_hz",
        value=s.sm_clock_hz,
        baseline=s.max_sm_clock_hz,
        deviation=s.sm_clock_hz / s.max_sm_clock_hz - 1.0,
        unit="Hz",
        reasons=shown,
        detail=f"SM clock {_mhz(s.sm_clock_hz)} MHz of {_mhz(s.max_sm_clock_hz)} MHz max at "
        f"{util(s):.0%} utilisation, held there by the clock setting for {held:.0f}s",
        held_seconds=round(held, 1),
        baseline_source="expected",
    )
    supporting = [e for e in support if e.metric != "sm_clock_hz"]  # the clock is the primary
    if peers is not None:
        supporting.append(peers)
    summary = (
        f"GPU {gpu.index} clocks locked at {_mhz(app or s.sm_clock_hz)} MHz "
        f"(max {_mhz(s.max_sm_clock_hz)} MHz) under load for {held:.0f}s"
    )
    return Finding(node.name, gpu.index, "clocks_locked_low", "warning", summary, primary, supporting, [NAME])


def _unexplained(
    node: NodeState, gpu: GpuState, held: float, peers: Evidence | None, ctx: DetectContext
) -> Finding | None:
    s, config = gpu.sample, ctx.config
    if peers is None or peers.baseline is None or util(s) < config.clock_peer_utilization:
        return None
    if s.sm_clock_hz > (1.0 - config.clock_peer_margin) * peers.baseline:
        return None
    primary = Evidence(
        metric=peers.metric,
        value=peers.value,
        baseline=peers.baseline,
        deviation=peers.deviation,
        unit=peers.unit,
        reasons=("no clock event reason", "no clock lock shown"),
        peers=peers.peers,
        detail=f"{peers.detail}; no reason bit or clock setting explains it, held {held:.0f}s",
        held_seconds=round(held, 1),
        baseline_source="peers",
    )
    against_max = Evidence(
        metric="sm_clock_hz",
        value=s.sm_clock_hz,
        baseline=s.max_sm_clock_hz,
        deviation=s.sm_clock_hz / s.max_sm_clock_hz - 1.0,
        unit="Hz",
        detail=f"SM clock {_mhz(s.sm_clock_hz)} MHz of {_mhz(s.max_sm_clock_hz)} MHz max",
        baseline_source="expected",
    )
    summary = (
        f"GPU {gpu.index} SM clock {_mhz(s.sm_clock_hz)} MHz under load, its busy peers "
        f"{_mhz(peers.baseline)} MHz, no reason shown, for {held:.0f}s"
    )
    return Finding(node.name, gpu.index, "slow_unknown", "warning", summary, primary, [against_max], [NAME])


@register(NAME)
def detect(ctx: DetectContext) -> list[Finding]:
    config, window = ctx.config, ctx.config.throttle_window_seconds
    utilization = config.clock_peer_utilization
    busy: dict[PeerKey, list[float]] | None = None  # read at the first GPU that holds a condition
    findings = []
    for node in ctx.fleet.nodes.values():
        for _, gpu in sorted(node.gpus.items()):
            state = next((c for c in ("clocks_locked", "clock_low_no_reason") if c in gpu.held), None)
            if state is None or gpu.held_for(state) < window:
                continue
            held = gpu.held_for(state)
            busy = busy_clocks(ctx.fleet, utilization) if busy is None else busy
            median, count = peers_median(busy, peer_key(node.gpu_names(), gpu), gpu, utilization)
            peers = _peer_evidence(gpu.sample, median, count, utilization, config.min_peers)
            if state == "clocks_locked":
                found = _locked(node, gpu, held, peers, config.clock_busy_utilization)
            else:
                found = _unexplained(node, gpu, held, peers, ctx)
            if found is not None:
                findings.append(found)
    return findings
