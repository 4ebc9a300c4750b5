"""GPU faults: each changes one GPU's condition, with a magnitude drawn from the range seen on real
nodes; the GPU model (sim/gpu.py, node.py, counters.py) turns that into readings and probe figures."""

from __future__ import annotations

import random

from agent.sources.sim.faults.registry import Target, register
from agent.sources.sim.gpu import SimGpu
from agent.sources.sim.profile import XID_DBE, XID_FALLEN_OFF_BUS

GPU = Target("GPU")
# Older VBIOS builds of the same board, as a node that missed a fleet update carries.
OLDER_VBIOS = ("96.00.74.00.11", "96.00.89.00.01", "96.00.5E.00.02")
CLOCKS = ("sm_clock_hz", "clock_event_reasons", "probe.gemm")


@register(
    "thermal_throttle",
    "gpu",
    cause="thermal_throttle",
    description="poor cooling: hot GPU and HBM, HW thermal slowdown, SM clock and GEMM down",
    shows_in=("temperature_celsius", "memory_temperature_celsius", *CLOCKS),
    target=GPU,
)
def _thermal_throttle(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.cooling = rng.uniform(2.0, 2.6)


@register(
    "power_brake",
    "gpu",
    cause="power_brake",
    description="external power brake (BMC/PSU): HW power-brake slowdown, power well under the cap",
    shows_in=("power_watts", *CLOCKS),
    target=GPU,
)
def _power_brake(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.power_brake_ratio = rng.uniform(0.5, 0.7)


@register(
    "power_cap",
    "gpu",
    cause="power_cap",
    description="power limit set below default: SW power cap, SM clock and GEMM down",
    shows_in=("enforced_power_limit_watts", "power_management_limit_watts", *CLOCKS),
    target=GPU,
)
def _power_cap(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    p = gpu.profile
    watts = float(round(p.default_power_limit_watts * rng.uniform(0.55, 0.65)))
    gpu.condition.power_limit_watts = max(p.min_power_limit_watts, watts)  # NVML refuses lower


@register(
    "clocks_locked_low",
    "gpu",
    cause="clocks_locked_low",
    description="application/locked clocks below max: SM clock pinned low, no thermal or power cause",
    shows_in=("applications_sm_clock_hz", *CLOCKS),
    target=GPU,
)
def _clocks_locked_low(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.locked_sm_clock_hz = rng.randrange(1095, 1500, 15) * 1e6


@register(
    "pcie_downtrained",
    "gpu",
    cause="pcie_downtrained",
    description="PCIe link trained below max gen or width: host<->device bandwidth down",
    shows_in=("pcie_link_gen", "pcie_link_width", "pcie_tx_bytes_per_second", "probe.pcie"),
    target=GPU,
)
def _pcie_downtrained(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    p = gpu.profile
    gen, width = rng.choice(
        ((p.pcie_gen_max - 1, None), (p.pcie_gen_max - 2, None), (None, p.pcie_width_max // 2))
    )
    gpu.condition.pcie_gen, gpu.condition.pcie_width = gen, width


@register(
    "nvlink_down",
    "gpu",
    cause="nvlink_down",
    description="2-6 NVLinks inactive and retraining: NCCL all-reduce bus bandwidth down",
    shows_in=("nvlinks.active", "nvlinks.recovery_errors_total", "probe.nccl"),
    target=GPU,
)
def _nvlink_down(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.nvlinks_down = set(rng.sample(range(gpu.profile.nvlink_count), rng.randint(2, 6)))


@register(
    "nvlink_crc_errors",
    "gpu",
    cause="nvlink_errors",
    description="1-3 NVLinks up but marginal: CRC and replay errors keep rising",
    shows_in=("nvlinks.crc_errors_total", "nvlinks.replay_errors_total"),
    target=GPU,
)
def _nvlink_crc_errors(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.nvlinks_erroring = set(rng.sample(range(gpu.profile.nvlink_count), rng.randint(1, 3)))


@register(
    "ecc_row_remap_pending",
    "gpu",
    cause="ecc_row_remap_pending",
    description="uncorrectable HBM ECC error, row remap pending until reset (XID 94, 63); no speed change",
    shows_in=("row_remap_pending", "ecc_uncorrected_volatile_total", "xid_counts"),
    target=GPU,
)
def _ecc_row_remap_pending(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.row_remap_pending = True
    gpu.condition.extra_uncorrectable = rng.randint(1, 2)


@register(
    "hbm_degraded",
    "gpu",
    cause="hbm_degraded",
    description="a degraded HBM stack: memory bandwidth probe down, no clock change",
    shows_in=("gpm_dram_activity_ratio", "probe.membw"),
    target=GPU,
)
def _hbm_degraded(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.hbm_factor = rng.uniform(0.75, 0.88)


@register(
    "xid_79",
    "gpu",
    cause="xid_error",
    description="XID 79, fallen off the bus: the GPU answers nothing but its XIDs until reset",
    shows_in=("xid_events", "xid_counts", "errors"),
    target=GPU,
)
def _xid_79(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.lost = True
    gpu.condition.xids.append(XID_FALLEN_OFF_BUS)


@register(
    "xid_48",
    "gpu",
    cause="xid_error",
    description="XID 48, a double-bit ECC error in on-chip SRAM: uncorrected ECC counted, no row remap",
    shows_in=(
        "xid_events",
        "xid_counts",
        "ecc_uncorrected_volatile_total",
        "ecc_uncorrected_aggregate_total",
    ),
    target=GPU,
)
def _xid_48(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.sram_uncorrectable += 1
    gpu.condition.xids.append(XID_DBE)


@register(
    "vbios_drift",
    "gpu",
    cause="firmware_drift",
    description="the GPU's VBIOS differs from the fleet's (missed an update); NVML and the BMC both show it",
    shows_in=("inventory.vbios_version", "bmc.firmware"),
    target=GPU,
)
def _vbios_drift(gpu: SimGpu, _: str | None, rng: random.Random) -> None:
    gpu.condition.vbios_version = rng.choice(OLDER_VBIOS)
