"""Power supplies, redundancy and consumption from Redfish JSON: PowerSubsystem / EnvironmentMetrics
(newer) and the legacy Power resource. As with thermal, the walker picks one kind per chassis."""

from __future__ import annotations

from typing import Any

from agent.sources.bmc import BmcPowerSupply
from agent.sources.redfish.values import health, number, state, text


def _psu(
    psu: dict[str, Any], chassis: str, name: str, input_watts: float | None, output_watts: float | None
) -> BmcPowerSupply:
    """The properties both schemas name alike, with the readings each keeps in its own place."""
    return BmcPowerSupply(
        name=name,
        health=health(psu),
        input_watts=input_watts,
        output_watts=output_watts,
        capacity_watts=number(psu, "PowerCapacityWatts"),
        firmware_version=text(psu, "FirmwareVersion"),
        model=text(psu, "Model"),
        serial=text(psu, "SerialNumber"),
        chassis=chassis,
        state=state(psu),
    )


def psu_from_subsystem(psu: dict[str, Any], metrics: dict[str, Any], chassis: str) -> BmcPowerSupply:
    """One PowerSubsystem/PowerSupplies member with its Metrics resource ({} when it has none)."""
    return _psu(
        psu,
        chassis,
        text(psu, "Name") or text(psu, "Id"),
        number(metrics, "InputPowerWatts", "Reading"),
        number(metrics, "OutputPowerWatts", "Reading"),
    )


def psus_from_legacy(power: dict[str, Any], chassis: str) -> list[BmcPowerSupply]:
    out = []
    items = power.get("PowerSupplies")
    for index, psu in enumerate(items if isinstance(items, list) else []):
        if not isinstance(psu, dict):
            continue
        output = number(psu, "LastPowerOutputWatts")
        out.append(
            _psu(
                psu,
                chassis,
                text(psu, "Name") or f"power supply {text(psu, 'MemberId') or index}",
                number(psu, "PowerInputWatts"),
                output if output is not None else number(psu, "PowerOutputWatts"),
            )
        )
    return out


def redundancy_from_subsystem(subsystem: dict[str, Any]) -> tuple[str, str]:
    """(mode, health) of the first PowerSupplyRedundancy group; ("", "") when none is reported."""
    groups = subsystem.get("PowerSupplyRedundancy")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        return text(groups[0], "RedundancyType"), health(groups[0])
    return "", ""


def redundancy_from_legacy(power: dict[str, Any]) -> tuple[str, str]:
    groups = power.get("Redundancy")
    if isinstance(groups, list) and groups and isinstance(groups[0], dict):
        return text(groups[0], "Mode"), health(groups[0])
    return "", ""


def consumed_from_environment(environment: dict[str, Any]) -> float | None:
    return number(environment, "PowerWatts", "Reading")


def consumed_from_legacy(power: dict[str, Any]) -> float | None:
    """PowerControl[0].PowerConsumedWatts: the first control is the chassis input by convention."""
    controls = power.get("PowerControl")
    if isinstance(controls, list) and controls and isinstance(controls[0], dict):
        return number(controls[0], "PowerConsumedWatts")
    return None


def consumed_from_sensors(sensors: list[dict[str, Any]]) -> float | None:
    """A chassis total-power sensor (ReadingType Power, ElectricalContext Total), when one exists."""
    for sensor in sensors:
        if text(sensor, "ReadingType") == "Power" and text(sensor, "ElectricalContext") == "Total":
            return number(sensor, "Reading")
    return None
