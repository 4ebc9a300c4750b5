"""BMC faults: a failed fan or PSU, a hot inlet, a BIOS attribute or BMC firmware that differs from
the fleet. Each changes the simulated BMC's condition (sim/bmc.py); the chassis physics
(bmc_chassis.py) turns a stopped fan, a lost PSU or hot intake air into airflow, temperatures and
power sharing."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from agent.sources.sim.bmc_chassis import HGX_H100_CHASSIS
from agent.sources.sim.faults.registry import Target, pick, register

if TYPE_CHECKING:
    from agent.sources.sim.bmc import SimBmc

# What a BIOS attribute reads when it was left at a vendor default or changed by hand.
BIOS_DRIFT: dict[str, str] = {
    "BootMode": "Legacy",
    "SecureBoot": "Enabled",
    "Hyperthreading": "Disabled",
    "TurboMode": "Disabled",
    "EnergyPerformanceBias": "Balanced Power",
    "PackageCState": "C6",
    "C1EState": "Enabled",
    "SubNumaClustering": "SNC4",
    "VTdSupport": "Disabled",
    "SriovSupport": "Disabled",
    "AboveFourGDecoding": "Disabled",
    "ResizableBar": "Disabled",
    "MmiohBase": "2T",
    "MmiohSize": "256G",
    "PcieAcsControl": "Enabled",
    "PcieMaxPayloadSize": "128B",
    "TpmSupport": "Disabled",
    "PowerRestorePolicy": "AlwaysOff",
}
OLDER_BMC_FIRMWARE = ("01.02.07", "01.03.05")
FAN = Target("FAN", tuple(str(i + 1) for i in range(HGX_H100_CHASSIS.fans)))
PSU = Target("PSU", tuple(str(i + 1) for i in range(HGX_H100_CHASSIS.psus)))
ATTRIBUTE = Target("ATTRIBUTE", tuple(a for a in HGX_H100_CHASSIS.bios_attributes if a in BIOS_DRIFT))


def _number(target: str | None, count: int, rng: random.Random, what: str) -> int:
    """0-based index of the 1-based number `target` (as the BMC names Fan_3, PSU_1), else a random one."""
    number = int(pick(target, tuple(str(i + 1) for i in range(count)), rng))
    if not 1 <= number <= count:
        raise ValueError(f"no {what} {number} in this chassis (it has {count})")
    return number - 1


@register(
    "fan_failure",
    "bmc",
    cause="fan_failure",
    description="a chassis fan stopped: health critical, 0 rpm, less airflow so the exhaust runs hotter",
    shows_in=("fans.speed_rpm", "fans.health", "temperatures.exhaust", "chassis_health"),
    target=FAN,
)
def _fan_failure(bmc: SimBmc, target: str | None, rng: random.Random) -> None:
    bmc.condition.failed_fans.add(_number(target, bmc.chassis.fans, rng, "fan"))


@register(
    "psu_failure",
    "bmc",
    cause="psu_failure",
    description="a PSU lost: health critical, no output, the others carry the load, redundancy lost",
    shows_in=("power_supplies.health", "power_supplies.output_watts", "power_supply_redundancy_health"),
    target=PSU,
)
def _psu_failure(bmc: SimBmc, target: str | None, rng: random.Random) -> None:
    bmc.condition.failed_psus.add(_number(target, bmc.chassis.psus, rng, "PSU"))


@register(
    "inlet_temperature_high",
    "bmc",
    cause="inlet_temperature_high",
    description="the air reaching the node is hot (failed room cooling): intake above its caution "
    "threshold, exhaust and the GPU baseboard's sensors warmer with it",
    shows_in=("temperatures.intake", "temperatures.exhaust", "temperatures.gpu", "chassis_health"),
)
def _inlet_temperature_high(bmc: SimBmc, _: str | None, rng: random.Random) -> None:
    # Above the intake's caution threshold (sensor offset and noise included), below its critical one.
    caution, critical = bmc.chassis.intake.caution, bmc.chassis.intake.critical
    bmc.condition.inlet_celsius = round(rng.uniform(caution + 1.5, min(critical - 1.0, caution + 3.5)), 1)


@register(
    "bios_drift",
    "bmc",
    cause="bios_drift",
    description="a BIOS attribute differs from the fleet's (e.g. TurboMode Disabled)",
    shows_in=("bios_attributes",),
    target=ATTRIBUTE,
)
def _bios_drift(bmc: SimBmc, target: str | None, rng: random.Random) -> None:
    known = tuple(a for a in bmc.chassis.bios_attributes if a in BIOS_DRIFT)
    name = pick(target, known, rng)
    if name not in known:
        raise ValueError(f"fault bios_drift: no BIOS attribute {name!r} to drift ({', '.join(known)})")
    bmc.condition.bios_attributes[name] = BIOS_DRIFT[name]


@register(
    "bmc_firmware_drift",
    "bmc",
    cause="firmware_drift",
    description="the BMC's firmware differs from the fleet's (an older build)",
    shows_in=("bmc_firmware_version", "firmware"),
)
def _bmc_firmware_drift(bmc: SimBmc, _: str | None, rng: random.Random) -> None:
    bmc.condition.firmware_version = rng.choice(OLDER_BMC_FIRMWARE)
