"""One simulated GPU: fixed traits, a fault-driven condition, and a steady-state physical model.

Each cycle the model finds the SM clock the GPU can hold under its limits, in the order the
firmware applies them: locked/application clocks, external power brake, the enforced power limit,
then the thermal hold. Power follows clock (idle + load * dynamic * clock^k), temperature follows
power (inlet + thermal resistance * power), and probe figures follow clock, links and memory.
Activity follows the job: SM, tensor and engine activity are shares of time or cycles and hold
under a lower clock, DRAM traffic follows kernel progress (the clock) and what the HBM delivers,
and link traffic follows the link's trained rate. So a fault shows up only in the fields a real
GPU would move.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field

from agent.sources.sim.profile import COMPUTE_MODE_DEFAULT, PCIE_LANE_GBPS, GpuProfile, Workload
from protos.names import clock_event_reason_bit

IDLE = clock_event_reason_bit("gpu_idle")
APP_CLOCKS = clock_event_reason_bit("applications_clocks_setting")
SW_POWER_CAP = clock_event_reason_bit("sw_power_cap")
HW_SLOWDOWN = clock_event_reason_bit("hw_slowdown")
HW_THERMAL = clock_event_reason_bit("hw_thermal_slowdown")
HW_POWER_BRAKE = clock_event_reason_bit("hw_power_brake_slowdown")
# NVML's compute modes by name, as the ComputeMode enum numbers them (NVML's value + 1).
COMPUTE_MODES = {"default": COMPUTE_MODE_DEFAULT, "prohibited": 3, "exclusive_process": 4}


def bounded_gauss(rng: random.Random, sigma: float, limit: float) -> float:
    """Normal variation clipped at +-limit: silicon is binned, so no healthy part is an extreme outlier."""
    return max(-limit, min(limit, rng.gauss(0.0, sigma)))


@dataclass(frozen=True, slots=True)
class GpuTraits:
    """What differs between healthy GPUs of one model, fixed for the GPU's life."""

    perf: float  # throughput per clock
    power: float  # dynamic power draw
    thermal: float  # thermal resistance (cold plate, position in the chassis)
    temp_offset_c: float
    hbm: float
    pcie: float
    rows_remapped: int  # correctable row remaps from the past: common, harmless

    @classmethod
    def draw(cls, rng: random.Random) -> GpuTraits:
        return cls(
            perf=1.0 + bounded_gauss(rng, 0.008, 0.02),
            power=1.0 + bounded_gauss(rng, 0.015, 0.035),
            thermal=1.0 + bounded_gauss(rng, 0.02, 0.05),
            temp_offset_c=rng.uniform(0.0, 5.0),
            hbm=1.0 + bounded_gauss(rng, 0.006, 0.015),
            pcie=1.0 + bounded_gauss(rng, 0.006, 0.015),
            rows_remapped=rng.choice((0,) * 9 + (1, 2)),
        )


@dataclass(slots=True)
class GpuCondition:
    """What faults change. Defaults are a healthy GPU."""

    cooling: float = 1.0  # multiplies thermal resistance (blocked airflow, bad paste)
    power_limit_watts: float | None = None  # enforced limit below default (power_cap)
    locked_sm_clock_hz: float | None = None  # application / locked clocks (clocks_locked_low)
    power_brake_ratio: float | None = None  # clock fraction under an external power brake
    pcie_gen: int | None = None  # trained link generation below max
    pcie_width: int | None = None
    nvlinks_down: set[int] = field(default_factory=set)
    row_remap_pending: bool = False
    extra_uncorrectable: int = 0  # uncorrectable ECC errors that led to a pending remap
    hbm_factor: float = 1.0  # degraded HBM stack
    gemm_factor: float = 1.0  # the loaded driver's GEMM kernels against the fleet's (driver_branch_slow)
    nvlinks_erroring: set[int] = field(default_factory=set)  # up, but CRC and replay errors rising
    sram_uncorrectable: int = 0  # double-bit errors in on-chip SRAM (XID 48): counted, no row remap
    xids: list[int] = field(default_factory=list)  # XIDs the fault raised, seen by the first read
    lost: bool = False  # fallen off the bus (XID 79): answers nothing until a reset
    vbios_version: str | None = None  # differs from the fleet's
    # NVML settings (agent/sources/sim/control.py sets them). A lock caps the SM clock at
    # locked_sm_clock_hz; its lower bound as set, None for a lock at one clock (the fault's).
    locked_sm_clock_min_hz: float | None = None
    locked_memory_clocks_mhz: tuple[int, int] | None = None
    persistence_mode: bool = True
    compute_mode: str = "default"  # a key of COMPUTE_MODES
    ecc_enabled: bool = True
    ecc_pending: bool = True  # the ECC mode from the next reboot on

    def reboot(self) -> None:
        """What a reboot does to the settings: NVML's are lost (no nvidia-persistenced runs in the
        simulator, so persistence goes off too) and the pending ECC mode takes effect. The fault
        conditions of the hardware stay as they are."""
        self.power_limit_watts = None
        self.locked_sm_clock_hz = self.locked_sm_clock_min_hz = self.locked_memory_clocks_mhz = None
        self.persistence_mode, self.compute_mode = False, "default"
        self.ecc_enabled = self.ecc_pending


@dataclass(frozen=True, slots=True)
class OperatingPoint:
    sm_clock_hz: float
    power_watts: float
    temperature_celsius: float
    reasons: int


@dataclass(frozen=True, slots=True)
class Activity:
    """GPM activity ratios (0..1) of the job at one operating point."""

    sm: float
    tensor: float
    dram: float
    graphics: float


class SimGpu:
    def __init__(self, index: int, profile: GpuProfile, traits: GpuTraits) -> None:
        self.index = index
        self.profile = profile
        self.traits = traits
        self.condition = GpuCondition()

    @property
    def power_limit_watts(self) -> float:
        """The management limit as set (nvidia-smi -pl); nothing else lowers it, so it is also enforced."""
        return float(self.condition.power_limit_watts or self.profile.default_power_limit_watts)

    def _power(self, clock_hz: float, load: float) -> float:
        p = self.profile
        ratio = clock_hz / p.max_sm_clock_hz
        return float(
            p.idle_power_watts
            + load * p.dynamic_power_watts * self.traits.power * ratio**p.power_clock_exponent
        )

    def _clock_for_power(self, watts: float, load: float) -> float:
        p = self.profile
        dynamic = max(watts - p.idle_power_watts, 1.0) / (
            max(load, 1e-3) * p.dynamic_power_watts * self.traits.power
        )
        return float(p.max_sm_clock_hz * dynamic ** (1.0 / p.power_clock_exponent))

    def _temperature(self, watts: float, inlet_c: float) -> float:
        resistance = self.profile.thermal_resistance_c_per_watt * self.traits.thermal * self.condition.cooling
        return inlet_c + self.traits.temp_offset_c + resistance * watts

    def operating_point(self, load: float, inlet_c: float, power_spike: float = 0.0) -> OperatingPoint:
        """Steady state at `load` (0..1) and inlet temperature; `power_spike` adds a transient fraction."""
        p, c = self.profile, self.condition
        if load <= 0.0:
            watts = p.idle_power_watts * self.traits.power
            return OperatingPoint(p.min_sm_clock_hz, watts, self._temperature(watts, inlet_c), IDLE)
        clock, reasons = p.max_sm_clock_hz, 0
        if c.locked_sm_clock_hz is not None and c.locked_sm_clock_hz < clock:
            clock, reasons = c.locked_sm_clock_hz, reasons | APP_CLOCKS
        if c.power_brake_ratio is not None:
            clock = min(clock, p.max_sm_clock_hz * c.power_brake_ratio)
            reasons |= HW_SLOWDOWN | HW_POWER_BRAKE
        effective_load = load * (1.0 + power_spike)
        if self._power(clock, effective_load) > self.power_limit_watts:
            clock, reasons = (
                self._clock_for_power(self.power_limit_watts, effective_load),
                reasons | SW_POWER_CAP,
            )
        if self._temperature(self._power(clock, effective_load), inlet_c) > p.thermal_hold_celsius:
            resistance = p.thermal_resistance_c_per_watt * self.traits.thermal * c.cooling
            allowed = (p.thermal_hold_celsius - inlet_c - self.traits.temp_offset_c) / resistance
            clock = min(clock, self._clock_for_power(allowed, effective_load))
            reasons |= HW_SLOWDOWN | HW_THERMAL
        clock = max(p.min_sm_clock_hz, math.floor(clock / p.clock_step_hz) * p.clock_step_hz)
        watts = self._power(clock, effective_load)
        return OperatingPoint(clock, watts, self._temperature(watts, inlet_c), reasons)

    # Probe models: what a short benchmark would measure at full load.

    def gemm_tflops(self, dtype: str, inlet_c: float) -> float:
        op = self.operating_point(1.0, inlet_c)
        return (
            self.profile.gemm_tflops[dtype]
            * self.traits.perf
            * self.condition.gemm_factor
            * op.sm_clock_hz
            / self.profile.max_sm_clock_hz
        )

    def membw_gbps(self) -> float:
        return self.profile.membw_gbps * self.traits.hbm * self.condition.hbm_factor

    def pcie_link(self) -> tuple[int, int]:
        c, p = self.condition, self.profile
        return (c.pcie_gen or p.pcie_gen_max, c.pcie_width or p.pcie_width_max)

    def pcie_gbps(self) -> float:
        p = self.profile
        gen, width = self.pcie_link()
        link_ratio = (PCIE_LANE_GBPS[gen] * width) / (PCIE_LANE_GBPS[p.pcie_gen_max] * p.pcie_width_max)
        return p.pcie_gbps * self.traits.pcie * link_ratio

    def active_links(self) -> int:
        return self.profile.nvlink_count - len(self.condition.nvlinks_down)

    # Activity and traffic of a job at `load`, as the GPU's own counters see it.

    def activity(self, load: float, op: OperatingPoint, job: Workload) -> Activity:
        clock_ratio = op.sm_clock_hz / self.profile.max_sm_clock_hz if load > 0 else 0.0
        return Activity(
            sm=load * job.sm_activity,
            tensor=load * job.tensor_activity,
            # Kernels move memory as fast as they progress; a degraded stack serves less of it.
            dram=load * job.dram_activity * clock_ratio * self.condition.hbm_factor,
            graphics=load * job.graphics_activity,
        )

    def pcie_bytes_per_second(self, load: float, job: Workload) -> tuple[float, float]:
        """(tx, rx) host-link throughput: the job's transfers run at the link's trained rate."""
        rx = load * job.pcie_duty * self.pcie_gbps() * 1e9
        return rx * job.pcie_tx_share, rx

    def nvlink_bytes_per_second(self, link: int, load: float, job: Workload) -> float:
        """Data rate of `link` each way; an inactive link carries nothing."""
        if link in self.condition.nvlinks_down:
            return 0.0
        return load * job.nvlink_duty * self.profile.nvlink_bytes_per_second
