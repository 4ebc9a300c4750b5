"""A simulated BMC beside a SimNode: the BmcSource contract, read off the node's physical model.

The agent polls the BMC from its own thread while the sampler calls `node.read()`, so a poll never
touches the node's random generators or counters. It asks the GPU model for the steady state at the
node's nominal load and this moment's inlet temperature (`SimGpu.operating_point`, a pure function
of the GPU's traits and condition): the point the node's own reads scatter around, since those add
+-3 % load jitter, rare power spikes and NVML sensor noise of their own. The BMC's sensors then add
their own small offsets and noise, from a generator seeded by node name, seed and poll time, so
a poll is a pure function of the node's state and the clock. The chassis physics is in bmc_chassis.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from agent.sources.bmc import (
    SECTIONS,
    BmcFan,
    BmcGpu,
    BmcPowerSupply,
    BmcSample,
    BmcSectionStatus,
    BmcTemperature,
)
from agent.sources.gpu import GpuInfo
from agent.sources.redfish.values import worst
from agent.sources.sim.bios import SimBiosControl
from agent.sources.sim.bmc_chassis import HGX_H100_CHASSIS, ChassisProfile, Thresholds
from agent.sources.sim.faults import FAULTS
from agent.sources.sim.gpu import OperatingPoint, bounded_gauss
from agent.sources.sim.node import SimNode

# Modelled time one section's requests take on a real BMC, seconds; the GPU baseboard (one chassis
# and its sensors per GPU) and the sensor walk are the slow ones.
_SECTION_SECONDS = {"thermal": 0.08, "power": 0.05, "gpus": 0.15}
_DEFAULT_SECTION_SECONDS = 0.03


@dataclass(slots=True)
class BmcCondition:
    """What BMC faults change, by 0-based fan / PSU index. Defaults are a healthy chassis."""

    failed_fans: set[int] = field(default_factory=set)  # stopped: 0 rpm, health critical
    failed_psus: set[int] = field(default_factory=set)  # delivering nothing, health critical
    bios_attributes: dict[str, str] = field(default_factory=dict)  # attributes that differ from the fleet's
    firmware_version: str | None = None  # the BMC's own firmware, when it differs from the fleet's
    inlet_celsius: float | None = None  # failed room cooling: the intake air at least this warm


@dataclass(frozen=True, slots=True)
class _Moment:
    """The chassis's physical state at one poll, before any sensor reads it."""

    intake_celsius: float
    points: list[OperatingPoint]
    fan_ratio: float
    total_watts: float  # DC: GPUs plus host, what the PSUs deliver
    exhaust_celsius: float


class SimBmc:
    """The BMC of a simulated node (`endpoint` sim://<node>): every poll a complete, successful
    sample consistent with the node's GPUs at that moment. Deterministic for a node name and seed."""

    def __init__(
        self,
        node: SimNode,
        *,
        seed: int = 0,
        clock: Callable[[], float] | None = None,
        chassis: ChassisProfile = HGX_H100_CHASSIS,
    ) -> None:
        self.node = node
        self.chassis = chassis
        self.clock = clock or node.clock
        self.endpoint = f"sim://{node.node}"
        self.condition = BmcCondition()
        self.bios = SimBiosControl(self)  # the BIOS settings, pending ones until reboot()
        self._seed = seed
        c, rng = chassis, random.Random(f"{seed}:{node.node}:bmc")
        self.serial = f"SIM{rng.randrange(10**8):08d}"
        # Sensor calibration: each sensor reads a little off the truth, the same way every poll.
        self._intake_offset = bounded_gauss(rng, 0.3, 0.8)
        self._gpu_offsets = [bounded_gauss(rng, 0.4, 1.0) for _ in node.gpus]
        self._gpu_gains = [1.0 + bounded_gauss(rng, 0.006, 0.015) for _ in node.gpus]
        self._cpu_offsets = [rng.uniform(0.0, 4.0) for _ in range(c.cpus)]
        self._dimm_offsets = [rng.uniform(0.0, 3.0) for _ in c.dimm_sensors]
        self._fan_max_rpm = [c.fan_max_rpm * (1.0 + bounded_gauss(rng, 0.01, 0.025)) for _ in range(c.fans)]
        # PSUs never share current exactly evenly.
        self._psu_shares = [1.0 + bounded_gauss(rng, 0.015, 0.04) for _ in range(c.psus)]
        self._psu_efficiency = [bounded_gauss(rng, 0.002, 0.005) for _ in range(c.psus)]
        self._psu_serials = [f"PS{rng.randrange(10**9):09d}" for _ in range(c.psus)]
        self._powered_on = self.clock() - rng.uniform(2 * 3600.0, 40 * 86400.0)
        # The node's BMC faults act here, drawing from a stream of their own.
        inject = random.Random(f"{seed}:{node.node}:bmc:inject")
        for spec in node.faults:
            if spec.level == "bmc":
                FAULTS[spec.fault].apply(self, None if spec.target is None else str(spec.target), inject)

    def close(self) -> None:
        """Nothing to release."""

    def reboot(self) -> None:
        """The node restarts: pending BIOS settings take effect."""
        self.bios.reboot()

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample:
        """The BMC's view now; `gpus` (default: the node's own inventory) maps boards to indices."""
        now = self.clock()
        noise = random.Random(f"{self._seed}:{self.node.node}:bmc:{now!r}")
        c, moment = self.chassis, self._moment(now)
        inventory = self.node.inventory().gpus
        boards = self._boards(moment, inventory, gpus or inventory, noise)
        temperatures = self._temperatures(moment, noise) + self._gpu_temperatures(boards)
        fans, psus = self._fans(moment, noise), self._power_supplies(moment, noise)
        redundancy = c.redundancy_health(c.psus - len(self.condition.failed_psus))
        bmc_version = self.condition.firmware_version or c.bmc_firmware_version
        parts: list[BmcTemperature | BmcFan | BmcPowerSupply] = [*temperatures, *fans, *psus]
        health = worst([part.health for part in parts] + [redundancy])
        bios = self.bios.read()
        seconds = [
            _SECTION_SECONDS.get(n, _DEFAULT_SECTION_SECONDS) * noise.uniform(0.7, 1.6) for n in SECTIONS
        ]
        return BmcSample(
            time=now,
            # The sections run one after another, plus the login and the service root.
            poll_duration_seconds=round(sum(seconds) + noise.uniform(0.01, 0.03), 4),
            success=True,
            sections=[BmcSectionStatus(n, True, round(t, 4)) for n, t in zip(SECTIONS, seconds, strict=True)],
            endpoint=self.endpoint,
            manufacturer=c.manufacturer,
            model=c.model,
            serial=self.serial,
            system_health=health,
            chassis_health=health,
            temperatures=temperatures,
            fans=fans,
            power_supplies=psus,
            power_supply_redundancy_mode=c.redundancy_mode,
            power_supply_redundancy_health=redundancy,
            power_consumed_watts=float(round(moment.total_watts * (1.0 + noise.gauss(0.0, 0.003)))),
            bios_version=c.bios_version,
            bios_attributes=bios.current,
            bios_pending=bios.pending,
            bios_apply_times=["OnReset"],
            firmware=c.firmware(inventory, bmc_version),
            bmc_firmware_version=bmc_version,
            log_entries=c.event_log(self._powered_on),
            gpus=boards,
        )

    # The physics of this moment

    def _moment(self, now: float) -> _Moment:
        node, c = self.node, self.chassis
        intake = node.inlet_celsius(now)
        if self.condition.inlet_celsius is not None:
            intake = max(intake, self.condition.inlet_celsius)
        points = [gpu.operating_point(node.load, intake) for gpu in node.gpus]
        fan_ratio = c.fan_ratio(max(p.temperature_celsius for p in points))
        working_fans = c.fans - len(self.condition.failed_fans)
        total = sum(p.power_watts for p in points) + c.host_watts(node.load, fan_ratio, working_fans)
        working_psus = max(1, c.psus - len(self.condition.failed_psus))
        heat = total / c.efficiency(total / working_psus / c.psu_capacity_watts)
        exhaust = intake + c.exhaust_rise_celsius(heat, fan_ratio, working_fans)
        return _Moment(intake, points, fan_ratio, total, exhaust)

    # What the sensors read

    def _boards(
        self, m: _Moment, inventory: Sequence[GpuInfo], known: Sequence[GpuInfo], noise: random.Random
    ) -> list[BmcGpu]:
        c, by_serial = self.chassis, {info.serial: info.index for info in known}
        out = []
        for gpu, info, point in zip(self.node.gpus, inventory, m.points, strict=True):
            temp = point.temperature_celsius + self._gpu_offsets[gpu.index] + noise.gauss(0.0, 0.3)
            # HBM sits a few degrees above the die, more when the cold plate cools badly (as NVML sees it).
            memory = (
                temp + gpu.profile.memory_temperature_offset_celsius + 4.0 * (gpu.condition.cooling - 1.0)
            )
            index = by_serial.get(info.serial)
            out.append(
                BmcGpu(
                    index=gpu.index if index is None else index,
                    chassis=f"HGX_GPU_SXM_{gpu.index + 1}",
                    serial=info.serial,
                    # The HMC reports the bare UUID; NVML writes "GPU-" before it.
                    uuid=info.uuid.removeprefix("GPU-"),
                    temperature_celsius=round(temp, 1),
                    memory_temperature_celsius=round(memory + noise.gauss(0.0, 0.3), 1),
                    power_watts=round(
                        point.power_watts * self._gpu_gains[gpu.index] * (1 + noise.gauss(0, 0.005)), 1
                    ),
                    health=c.gpu_thresholds(gpu.profile).health(temp),
                    # A board whose serial the caller does not know falls back to slot order.
                    matched_by="index" if index is None else "serial",
                )
            )
        return out

    def _sensor(
        self, name: str, context: str, reading: float, limits: Thresholds, chassis: str = ""
    ) -> BmcTemperature:
        chassis = chassis or self.chassis.chassis
        return BmcTemperature(
            name=name,
            context=context,
            reading_celsius=round(reading, 1),
            upper_caution_celsius=limits.caution,
            upper_critical_celsius=limits.critical,
            upper_fatal_celsius=limits.fatal,
            health=limits.health(reading),
            chassis=chassis,
            source=f"/redfish/v1/Chassis/{chassis}/Sensors/{name}",
            state="enabled",
        )

    def _temperatures(self, m: _Moment, noise: random.Random) -> list[BmcTemperature]:
        c, load = self.chassis, self.node.load
        intake = m.intake_celsius + self._intake_offset + noise.gauss(0.0, 0.2)
        out = [
            self._sensor("Inlet_Temp", "intake", intake, c.intake),
            self._sensor("Exhaust_Temp", "exhaust", m.exhaust_celsius + noise.gauss(0.0, 0.3), c.exhaust),
        ]
        cpu_rise = c.cpu_rise_celsius[0] + load * c.cpu_rise_celsius[1]
        for i, offset in enumerate(self._cpu_offsets):
            out.append(
                self._sensor(f"CPU{i}_Temp", "cpu", intake + cpu_rise + offset + noise.gauss(0, 0.5), c.cpu)
            )
        dimm_rise = c.dimm_rise_celsius[0] + load * c.dimm_rise_celsius[1]
        for name, offset in zip(c.dimm_sensors, self._dimm_offsets, strict=True):
            out.append(
                self._sensor(name, "memory", intake + dimm_rise + offset + noise.gauss(0, 0.3), c.dimm)
            )
        return out

    def _gpu_temperatures(self, boards: Sequence[BmcGpu]) -> list[BmcTemperature]:
        """The baseboard's GPU sensors, the same readings its GPU chassis carry."""
        limits = self.chassis.gpu_thresholds(self.node.profile)
        return [
            self._sensor(f"{b.chassis}_TEMP_0", "gpu", b.temperature_celsius or 0.0, limits, b.chassis)
            for b in boards
        ]

    def _fans(self, m: _Moment, noise: random.Random) -> list[BmcFan]:
        out = []
        for i, max_rpm in enumerate(self._fan_max_rpm):
            failed = i in self.condition.failed_fans
            ratio = 0.0 if failed else m.fan_ratio
            out.append(
                BmcFan(
                    name=f"Fan_{i + 1}",
                    speed_rpm=float(round(ratio * max_rpm * (1.0 + noise.gauss(0.0, 0.004)))),
                    speed_ratio=round(ratio, 2),  # the PWM duty, reported in whole percent
                    health="critical" if failed else "ok",
                    chassis=self.chassis.chassis,
                    state="enabled",
                )
            )
        return out

    def _power_supplies(self, m: _Moment, noise: random.Random) -> list[BmcPowerSupply]:
        c, failed = self.chassis, self.condition.failed_psus
        weight = sum(share for i, share in enumerate(self._psu_shares) if i not in failed) or 1.0
        out = []
        for i, share in enumerate(self._psu_shares):
            jitter = 1.0 + noise.gauss(0.0, 0.003)  # drawn for a failed PSU too: the rest read alike
            output = 0.0 if i in failed else m.total_watts * share / weight * jitter
            efficiency = c.efficiency(output / c.psu_capacity_watts) + self._psu_efficiency[i]
            out.append(
                BmcPowerSupply(
                    name=f"PSU_{i + 1}",
                    health="critical" if i in failed else "ok",
                    input_watts=round(output / efficiency, 1),
                    output_watts=round(output, 1),
                    capacity_watts=c.psu_capacity_watts,
                    firmware_version=c.psu_firmware_version,
                    model=c.psu_model,
                    serial=self._psu_serials[i],
                    chassis=c.chassis,
                    state="enabled",
                )
            )
        return out
