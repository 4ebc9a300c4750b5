"""Temperatures and fans from Redfish JSON: the newer Sensors / ThermalSubsystem resources and the
legacy Thermal resource. The walker takes one kind per chassis, newest first, so nothing is counted
twice; these functions only translate what they are given."""

from __future__ import annotations

from typing import Any

from agent.sources.bmc import BmcFan, BmcTemperature
from agent.sources.redfish.values import health, number, obj, snake, state, text

# Name fragments that say where a sensor sits when PhysicalContext does not (Dell calls the inlet
# sensor "System Board Inlet Temp" with context SystemBoard, for example).
_NAME_HINTS = (
    ("inlet", "intake"),
    ("intake", "intake"),
    ("ambient", "intake"),
    ("exhaust", "exhaust"),
    ("outlet", "exhaust"),
)
_CONTEXTS = {"intake": "intake", "exhaust": "exhaust", "cpu": "cpu", "memory": "memory", "gpu": "gpu"}


def context_of(name: str, physical_context: str) -> str:
    """Where a temperature sensor sits: intake, exhaust, cpu, memory, gpu, else the snake-cased context."""
    lowered = name.lower()
    for fragment, context in _NAME_HINTS:
        if fragment in lowered:
            return context
    ctx = snake(physical_context)
    if ctx in _CONTEXTS:
        return _CONTEXTS[ctx]
    if ctx in ("", "system_board", "chassis") and ("dimm" in lowered or "memory" in lowered):
        return "memory"
    if ctx in ("", "system_board", "chassis") and "cpu" in lowered:
        return "cpu"
    if "gpu" in lowered:
        return "gpu"
    return ctx or "other"


def is_temperature_sensor(sensor: dict[str, Any]) -> bool:
    reading_type = text(sensor, "ReadingType")
    if reading_type:
        return reading_type == "Temperature"
    return text(sensor, "ReadingUnits") in ("Cel", "C", "Celsius")


def temperatures_from_sensors(sensors: list[dict[str, Any]], chassis: str) -> list[BmcTemperature]:
    """Temperature sensors of a chassis Sensors collection (other sensor types are skipped)."""
    out = []
    for sensor in sensors:
        if not is_temperature_sensor(sensor):
            continue
        name = text(sensor, "Name") or text(sensor, "Id")
        thresholds = obj(sensor, "Thresholds")
        out.append(
            BmcTemperature(
                name=name,
                context=context_of(name, text(sensor, "PhysicalContext")),
                reading_celsius=number(sensor, "Reading"),
                upper_caution_celsius=number(thresholds, "UpperCaution", "Reading"),
                upper_critical_celsius=number(thresholds, "UpperCritical", "Reading"),
                upper_fatal_celsius=number(thresholds, "UpperFatal", "Reading"),
                health=health(sensor),
                chassis=chassis,
                source=text(sensor, "@odata.id"),
                state=state(sensor),
            )
        )
    return out


def temperatures_from_thermal_metrics(metrics: dict[str, Any], chassis: str) -> list[BmcTemperature]:
    """ThermalMetrics.TemperatureReadingsCelsius: readings without thresholds (no Sensors collection)."""
    out = []
    readings = metrics.get("TemperatureReadingsCelsius")
    for item in readings if isinstance(readings, list) else []:
        if not isinstance(item, dict):
            continue
        name = text(item, "DeviceName") or text(item, "DataSourceUri").rsplit("/", 1)[-1]
        out.append(
            BmcTemperature(
                name=name,
                context=context_of(name, text(item, "PhysicalContext")),
                reading_celsius=number(item, "Reading"),
                chassis=chassis,
                source=text(item, "DataSourceUri") or text(metrics, "@odata.id"),
            )
        )
    return out


def temperatures_from_legacy(thermal: dict[str, Any], chassis: str) -> list[BmcTemperature]:
    """Thermal.Temperatures (deprecated resource, still the only one on many BMCs)."""
    out = []
    items = thermal.get("Temperatures")
    for index, item in enumerate(items if isinstance(items, list) else []):
        if not isinstance(item, dict):
            continue
        name = text(item, "Name") or f"temperature {text(item, 'MemberId') or index}"
        out.append(
            BmcTemperature(
                name=name,
                context=context_of(name, text(item, "PhysicalContext")),
                reading_celsius=number(item, "ReadingCelsius"),
                upper_caution_celsius=number(item, "UpperThresholdNonCritical"),
                upper_critical_celsius=number(item, "UpperThresholdCritical"),
                upper_fatal_celsius=number(item, "UpperThresholdFatal"),
                health=health(item),
                chassis=chassis,
                source=text(item, "@odata.id") or text(thermal, "@odata.id"),
                state=state(item),
            )
        )
    return out


def fans_from_subsystem(fans: list[dict[str, Any]], chassis: str) -> list[BmcFan]:
    """ThermalSubsystem/Fans members: SpeedPercent carries the percentage and, often, the RPM."""
    out = []
    for fan in fans:
        percent = number(fan, "SpeedPercent", "Reading")
        out.append(
            BmcFan(
                name=text(fan, "Name") or text(fan, "Id"),
                speed_rpm=number(fan, "SpeedPercent", "SpeedRPM"),
                speed_ratio=None if percent is None else percent / 100.0,
                health=health(fan),
                chassis=chassis,
                state=state(fan),
            )
        )
    return out


def fans_from_legacy(thermal: dict[str, Any], chassis: str) -> list[BmcFan]:
    """Thermal.Fans: Reading in ReadingUnits (RPM or Percent; RPM when the service omits the unit)."""
    out = []
    items = thermal.get("Fans")
    for index, fan in enumerate(items if isinstance(items, list) else []):
        if not isinstance(fan, dict):
            continue
        reading = number(fan, "Reading")
        percent = text(fan, "ReadingUnits") == "Percent"
        out.append(
            BmcFan(
                name=text(fan, "Name") or text(fan, "FanName") or f"fan {text(fan, 'MemberId') or index}",
                speed_rpm=None if percent else reading,
                speed_ratio=reading / 100.0 if percent and reading is not None else None,
                health=health(fan),
                chassis=chassis,
                state=state(fan),
            )
        )
    return out
