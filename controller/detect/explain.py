"""Why is this GPU slow? Map telemetry evidence to a cause from the fault vocabulary.

Rules follow the physics in ../shared/ARCHITECTURE.md's fault table: thermal and power reason bits,
a lowered power limit, locked clocks, a downtrained PCIe link, inactive NVLinks. Where the evidence
explains nothing, the cause is slow_unknown: we never guess.
"""

from __future__ import annotations

from collections.abc import Callable

from controller.config import DetectConfig
from controller.detect.nvlink_errors import link_errors, link_evidence
from controller.fleet.finding import Evidence
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_names

UsualLinks = Callable[[NodeState, int, int], int]  # (node, GPU index, its links) -> active links expected

THERMAL = ("hw_thermal_slowdown", "sw_thermal_slowdown")
Explanation = tuple[str, list[Evidence]]
UNKNOWN: Explanation = ("slow_unknown", [])


def _mhz(hz: float) -> float:
    return round(hz / 1e6)


def clock_cause(sample: pb.GpuSample) -> Explanation:
    """A cause that lowers the SM clock, from one reading; slow_unknown if the reading shows none."""
    reasons = clock_event_reason_names(sample.clock_event_reasons)
    clock = Evidence(
        metric="sm_clock_hz",
        value=sample.sm_clock_hz,
        baseline=sample.max_sm_clock_hz or None,
        deviation=(sample.sm_clock_hz / sample.max_sm_clock_hz - 1.0) if sample.max_sm_clock_hz else None,
        unit="Hz",
        reasons=tuple(reasons),
        detail=f"SM clock {_mhz(sample.sm_clock_hz)} MHz of {_mhz(sample.max_sm_clock_hz)} MHz max",
    )
    if any(r in reasons for r in THERMAL):
        temp = Evidence(
            metric="temperature_celsius",
            value=sample.temperature_celsius,
            baseline=sample.slowdown_temperature_celsius or None,
            unit="C",
            reasons=tuple(r for r in reasons if r in THERMAL),
            detail=f"GPU at {sample.temperature_celsius:.0f} C, slowdown at "
            f"{sample.slowdown_temperature_celsius:.0f} C",
        )
        return "thermal_throttle", [temp, clock]
    if "hw_power_brake_slowdown" in reasons:
        power = Evidence(
            metric="power_watts",
            value=sample.power_watts,
            baseline=sample.enforced_power_limit_watts or None,
            unit="W",
            reasons=("hw_power_brake_slowdown",),
            detail=f"external power brake: {sample.power_watts:.0f} W drawn, "
            f"{sample.enforced_power_limit_watts:.0f} W allowed",
        )
        return "power_brake", [power, clock]
    limit, default = sample.enforced_power_limit_watts, sample.default_power_limit_watts
    if limit and default and limit < 0.95 * default:
        power = Evidence(
            metric="enforced_power_limit_watts",
            value=limit,
            baseline=default,
            deviation=limit / default - 1.0,
            unit="W",
            reasons=tuple(r for r in reasons if r == "sw_power_cap"),
            detail=f"power limit {limit:.0f} W, default {default:.0f} W",
        )
        return "power_cap", [power, clock]
    app, max_clock = sample.applications_sm_clock_hz, sample.max_sm_clock_hz
    locked = "applications_clocks_setting" in reasons or (app and max_clock and app < 0.95 * max_clock)
    if locked and max_clock and sample.sm_clock_hz < 0.95 * max_clock:
        setting = Evidence(
            metric="applications_sm_clock_hz",
            value=app or sample.sm_clock_hz,
            baseline=max_clock,
            deviation=(app or sample.sm_clock_hz) / max_clock - 1.0,
            unit="Hz",
            reasons=tuple(r for r in reasons if r == "applications_clocks_setting"),
            detail=f"clocks locked at {_mhz(app or sample.sm_clock_hz)} MHz, max {_mhz(max_clock)} MHz",
        )
        return "clocks_locked_low", [setting, clock]
    return UNKNOWN


def pcie_cause(sample: pb.GpuSample) -> Explanation:
    gen, gen_max = sample.pcie_link_gen, sample.pcie_link_gen_max
    width, width_max = sample.pcie_link_width, sample.pcie_link_width_max
    if (gen_max and gen < gen_max) or (width_max and width < width_max):
        return "pcie_downtrained", [
            Evidence(
                metric="pcie_link",
                value=float(gen),
                baseline=float(gen_max),
                unit="gen",
                reasons=(f"gen{gen} x{width}", f"max gen{gen_max} x{width_max}"),
                detail=f"PCIe link at gen{gen} x{width}, capable of gen{gen_max} x{width_max}",
            )
        ]
    return UNKNOWN


def nvlink_evidence(sample: pb.GpuSample, usual: int | None = None) -> Evidence | None:
    """The GPU's inactive NVLinks as evidence; None when none is, or when at least `usual` links
    (what its peers have active, detect/nvlink_peers.py; None: every link) are active."""
    down = [link.link for link in sample.nvlinks if not link.active]
    if not down:
        return None
    total = len(sample.nvlinks)
    active = total - len(down)
    expected = total if usual is None else usual
    if active >= expected:
        return None
    peers = f"; its peers have {expected} of {total} active" if expected < total else ""
    return Evidence(
        metric="nvlink_active",
        value=float(active),
        baseline=float(expected),
        deviation=(active - expected) / expected,
        unit="links",
        reasons=tuple(f"link{n}_inactive" for n in down),
        detail=f"{len(down)} of {total} NVLinks inactive: {', '.join(map(str, down))}{peers}",
    )


def explain_gpu(probe: str, sample: pb.GpuSample | None) -> Explanation:
    """The cause of a slow `probe` result on a GPU whose reading (during the run, else latest) is `sample`."""
    if sample is None:
        return UNKNOWN
    if probe == "pcie":
        return pcie_cause(sample)
    if probe == "membw":
        # HBM bandwidth does not follow the SM clock: a slow copy with normal memory clocks is the
        # memory itself.
        # A reading without both clocks shows nothing: the cause stays unknown, never a guess.
        mem, mem_max = sample.memory_clock_hz, sample.max_memory_clock_hz
        if not mem or not mem_max or mem < 0.95 * mem_max:
            return UNKNOWN
        return "hbm_degraded", [
            Evidence(
                metric="memory_clock_hz",
                value=mem,
                baseline=mem_max,
                unit="Hz",
                detail="memory clock at its maximum: the bandwidth loss is in the memory itself",
            )
        ]
    return clock_cause(sample)


def explain_node(
    node: NodeState, config: DetectConfig | None = None, usual: UsualLinks | None = None
) -> list[tuple[int, str, list[Evidence]]]:
    """GPUs of `node` whose readings explain a slow node-level (collective) result: inactive NVLinks
    (fewer active than `usual(node, gpu, links)` says its peers have; None: any inactive), then
    active ones with rising error counters (rates from node.trends, thresholds from `config`, else
    the defaults), then clock causes."""
    out: list[tuple[int, str, list[Evidence]]] = []
    for index, gpu in sorted(node.gpus.items()):
        expected = None if usual is None else usual(node, index, len(gpu.sample.nvlinks))
        link = nvlink_evidence(gpu.sample, expected)
        if link is not None:
            out.append((index, "nvlink_down", [link]))
    if out:
        return out
    config = config if config is not None else DetectConfig()
    for index, gpu in sorted(node.gpus.items()):
        erroring = link_errors(node, gpu, config)
        if erroring:
            out.append((index, "nvlink_errors", [link_evidence(erroring, config)]))
    if out:
        return out
    for index, gpu in sorted(node.gpus.items()):
        cause, evidence = clock_cause(gpu.sample)
        if cause != "slow_unknown":
            out.append((index, cause, evidence))
    return out
