"""Faults the simulator can inject, by their contract names (protos: Cause).

Each fault changes only a GPU's condition, with a magnitude drawn from the range seen on real
nodes; the physical model turns that into readings and probe figures.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass

from agent.sources.sim.gpu import SimGpu

Apply = Callable[[SimGpu, random.Random], None]


@dataclass(frozen=True, slots=True)
class FaultSpec:
    """A fault to inject: `gpu` None lets the simulator pick one (seeded)."""

    fault: str
    gpu: int | None = None

    @classmethod
    def parse(cls, text: str) -> FaultSpec:
        """Parse "NAME" or "NAME:GPU", as the --fault flag takes it."""
        name, _, gpu = text.partition(":")
        if name not in FAULTS:
            raise ValueError(f"unknown fault {name!r}; the simulator knows {', '.join(FAULTS)}")
        if gpu and not gpu.isdigit():
            raise ValueError(f"fault {text!r}: the GPU after ':' must be an index")
        return cls(name, int(gpu) if gpu else None)


def _thermal_throttle(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.cooling = rng.uniform(2.0, 2.6)


def _power_brake(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.power_brake_ratio = rng.uniform(0.5, 0.7)


def _power_cap(gpu: SimGpu, rng: random.Random) -> None:
    p = gpu.profile
    watts = float(round(p.default_power_limit_watts * rng.uniform(0.55, 0.65)))
    gpu.condition.power_limit_watts = max(p.min_power_limit_watts, watts)  # NVML refuses lower


def _clocks_locked_low(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.locked_sm_clock_hz = rng.randrange(1095, 1500, 15) * 1e6


def _pcie_downtrained(gpu: SimGpu, rng: random.Random) -> None:
    p = gpu.profile
    gen, width = rng.choice(
        ((p.pcie_gen_max - 1, None), (p.pcie_gen_max - 2, None), (None, p.pcie_width_max // 2))
    )
    gpu.condition.pcie_gen, gpu.condition.pcie_width = gen, width


def _nvlink_down(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.nvlinks_down = set(rng.sample(range(gpu.profile.nvlink_count), rng.randint(2, 6)))


def _ecc_row_remap_pending(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.row_remap_pending = True
    gpu.condition.extra_uncorrectable = rng.randint(1, 2)


def _hbm_degraded(gpu: SimGpu, rng: random.Random) -> None:
    gpu.condition.hbm_factor = rng.uniform(0.75, 0.88)


FAULTS: dict[str, Apply] = {
    "thermal_throttle": _thermal_throttle,
    "power_brake": _power_brake,
    "power_cap": _power_cap,
    "clocks_locked_low": _clocks_locked_low,
    "pcie_downtrained": _pcie_downtrained,
    "nvlink_down": _nvlink_down,
    "ecc_row_remap_pending": _ecc_row_remap_pending,
    "hbm_degraded": _hbm_degraded,
}
