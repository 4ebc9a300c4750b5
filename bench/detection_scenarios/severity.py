"""How hard a fault hits: knobs that set a GPU fault's magnitude, and the slowdown it causes.

The registry's apply functions draw a magnitude from the range seen on real nodes; a knob then
overrides the field that carries it (a GpuCondition field), so the suite can ask for a mild
(~5.5%), moderate (~15%) or severe (~30%) slowdown, or for one discrete state (a PCIe link at gen 4).
The slowdown a fault causes is read off the GPU model: its probe figures against those of a twin
with the same traits and a healthy condition. Faults the model gives no speed effect (host, BMC,
drift, errors) slow nothing.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable

from agent.sources.sim.gpu import SimGpu

# Target slowdowns (the share a probe figure drops) of the continuous knobs.
TARGETS = {"mild": 0.055, "moderate": 0.15, "severe": 0.30}
DRAWN = "drawn"  # the registry's own draw: no knob for this fault
SLOW = 0.05  # a fault that slows a GPU by this much or more counts toward recall (>= 5%)

Setter = Callable[[SimGpu, float, random.Random], None]  # (gpu, inlet C, rng)


def healthy_twin(gpu: SimGpu) -> SimGpu:
    """The same GPU (profile and traits) with a healthy condition."""
    return SimGpu(gpu.index, gpu.profile, gpu.traits)


def gemm_slowdown(gpu: SimGpu, inlet_c: float) -> float:
    healthy = healthy_twin(gpu).gemm_tflops("bf16", inlet_c)
    return 1.0 - gpu.gemm_tflops("bf16", inlet_c) / healthy


def slowdown(gpu: SimGpu, inlet_c: float) -> float:
    """The largest drop of any modelled probe figure (GEMM, memory, PCIe, NVLink share for NCCL)."""
    if gpu.condition.lost:
        return 1.0
    twin = healthy_twin(gpu)
    drops = (
        gemm_slowdown(gpu, inlet_c),
        1.0 - gpu.membw_gbps() / twin.membw_gbps(),
        1.0 - gpu.pcie_gbps() / twin.pcie_gbps(),
        1.0 - gpu.active_links() / twin.active_links(),
    )
    return max(0.0, *drops)


def _solve(
    gpu: SimGpu, apply: Callable[[float], None], span: tuple[float, float], target: float, inlet: float
) -> None:
    """Bisect the knob value within lo..hi (slowdown rising from lo to hi) for the least value whose
    GEMM slowdown reaches `target`; leaves the GPU set at it."""
    lo, hi = span
    for _ in range(40):
        mid = (lo + hi) / 2.0
        apply(mid)
        if gemm_slowdown(gpu, inlet) >= target:
            hi = mid
        else:
            lo = mid
    apply(hi)


def _thermal(target: float) -> Setter:
    def set_(gpu: SimGpu, inlet: float, _: random.Random) -> None:
        def apply(cooling: float) -> None:
            gpu.condition.cooling = cooling

        _solve(gpu, apply, (1.0, 8.0), target, inlet)

    return set_


def _power_cap(target: float) -> Setter:
    def set_(gpu: SimGpu, inlet: float, _: random.Random) -> None:
        p = gpu.profile

        def apply(cut: float) -> None:  # watts below the default limit, never under NVML's minimum
            gpu.condition.power_limit_watts = float(
                max(p.min_power_limit_watts, math.floor(p.default_power_limit_watts - cut))
            )

        _solve(gpu, apply, (0.0, p.default_power_limit_watts - p.min_power_limit_watts), target, inlet)

    return set_


def _power_brake(target: float) -> Setter:
    def set_(gpu: SimGpu, inlet: float, _: random.Random) -> None:
        def apply(cut: float) -> None:
            gpu.condition.power_brake_ratio = 1.0 - cut

        _solve(gpu, apply, (0.0, 0.9), target, inlet)

    return set_


def _locked(target: float) -> Setter:
    def set_(gpu: SimGpu, inlet: float, _: random.Random) -> None:
        p = gpu.profile

        def apply(cut: float) -> None:
            clock = math.floor(p.max_sm_clock_hz * (1.0 - cut) / p.clock_step_hz) * p.clock_step_hz
            gpu.condition.locked_sm_clock_hz = max(p.min_sm_clock_hz, clock)

        _solve(gpu, apply, (0.0, 0.9), target, inlet)

    return set_


def _hbm(target: float) -> Setter:
    def set_(gpu: SimGpu, _: float, __: random.Random) -> None:
        gpu.condition.hbm_factor = 1.0 - target

    return set_


def _links_down(count: int) -> Setter:
    def set_(gpu: SimGpu, _: float, rng: random.Random) -> None:
        gpu.condition.nvlinks_down = set(rng.sample(range(gpu.profile.nvlink_count), count))

    return set_


def _links_erroring(count: int) -> Setter:
    def set_(gpu: SimGpu, _: float, rng: random.Random) -> None:
        gpu.condition.nvlinks_erroring = set(rng.sample(range(gpu.profile.nvlink_count), count))

    return set_


def _pcie(gen_down: int, halve_width: bool) -> Setter:
    def set_(gpu: SimGpu, _: float, __: random.Random) -> None:
        p = gpu.profile
        gpu.condition.pcie_gen = p.pcie_gen_max - gen_down if gen_down else None
        gpu.condition.pcie_width = p.pcie_width_max // 2 if halve_width else None

    return set_


def _levels(make: Callable[[float], Setter]) -> dict[str, Setter]:
    return {label: make(target) for label, target in TARGETS.items()}


# fault -> severity label -> setter, applied after the registry's own apply.
KNOBS: dict[str, dict[str, Setter]] = {
    "thermal_throttle": _levels(_thermal),
    "power_brake": _levels(_power_brake),
    "power_cap": _levels(_power_cap),
    "clocks_locked_low": _levels(_locked),
    "hbm_degraded": _levels(_hbm),
    # NCCL is link-bound: 1 of 18 links down is ~5.6% of bus bandwidth.
    "nvlink_down": {"mild": _links_down(1), "moderate": _links_down(3), "severe": _links_down(6)},
    "pcie_downtrained": {"gen-1": _pcie(1, False), "x8": _pcie(0, True), "gen-2": _pcie(2, False)},
    "nvlink_crc_errors": {"1-link": _links_erroring(1), "3-links": _links_erroring(3)},
}


def severities(fault: str) -> list[str]:
    """The severities the suite injects `fault` at: its knob's labels, else the registry's draw."""
    return list(KNOBS[fault]) if fault in KNOBS else [DRAWN]


def set_severity(fault: str, severity: str, gpu: SimGpu, inlet_c: float, rng: random.Random) -> None:
    if severity == DRAWN:
        return
    KNOBS[fault][severity](gpu, inlet_c, rng)
