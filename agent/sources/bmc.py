"""The BMC contract: what one Redfish poll yields, as plain data.

Field names match protos/gpufleet/v1/bmc.proto one for one (the stream copies them without a
mapping table). Health strings are Redfish Status.Health in lower case ("ok", "warning",
"critical"; "" unknown). A None reading was not reported by the service.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Protocol

from agent.sources.gpu import GpuInfo

SECTIONS = ("systems", "chassis", "thermal", "power", "bios", "firmware", "managers", "logs", "gpus")


@dataclass(slots=True)
class BmcSectionStatus:
    name: str
    success: bool
    duration_seconds: float
    error: str = ""


@dataclass(slots=True)
class BmcTemperature:
    name: str
    context: str = ""
    reading_celsius: float | None = None
    upper_caution_celsius: float | None = None
    upper_critical_celsius: float | None = None
    upper_fatal_celsius: float | None = None
    health: str = ""
    chassis: str = ""
    source: str = ""
    state: str = ""


@dataclass(slots=True)
class BmcFan:
    name: str
    speed_rpm: float | None = None
    speed_ratio: float | None = None
    health: str = ""
    chassis: str = ""
    state: str = ""


@dataclass(slots=True)
class BmcPowerSupply:
    name: str
    health: str = ""
    input_watts: float | None = None
    output_watts: float | None = None
    capacity_watts: float | None = None
    firmware_version: str = ""
    model: str = ""
    serial: str = ""
    chassis: str = ""
    state: str = ""


@dataclass(slots=True)
class BmcFirmware:
    id: str
    name: str = ""
    version: str = ""
    updateable: bool = False


@dataclass(slots=True)
class BmcLogEntry:
    id: str
    severity: str = ""
    message: str = ""
    created: str = ""
    message_id: str = ""
    log: str = ""


@dataclass(slots=True)
class BmcGpu:
    index: int
    chassis: str = ""
    serial: str = ""
    uuid: str = ""
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    power_watts: float | None = None
    health: str = ""
    matched_by: str = ""


@dataclass(slots=True)
class BmcSample:
    time: float  # unix seconds when the poll started (a Timestamp on the wire)
    poll_duration_seconds: float = 0.0
    success: bool = False
    error: str = ""
    sections: list[BmcSectionStatus] = field(default_factory=list)
    endpoint: str = ""
    manufacturer: str = ""
    model: str = ""
    serial: str = ""
    system_health: str = ""
    chassis_health: str = ""
    temperatures: list[BmcTemperature] = field(default_factory=list)
    fans: list[BmcFan] = field(default_factory=list)
    power_supplies: list[BmcPowerSupply] = field(default_factory=list)
    power_supply_redundancy_mode: str = ""
    power_supply_redundancy_health: str = ""
    power_consumed_watts: float | None = None
    bios_version: str = ""
    bios_attributes: dict[str, str] = field(default_factory=dict)
    bios_pending: dict[str, str] = field(default_factory=dict)
    bios_apply_times: list[str] = field(default_factory=list)
    firmware: list[BmcFirmware] = field(default_factory=list)
    bmc_firmware_version: str = ""
    log_entries: list[BmcLogEntry] = field(default_factory=list)
    gpus: list[BmcGpu] = field(default_factory=list)
    auth: str = ""
    requests: int = 0

    def section(self, name: str) -> BmcSectionStatus | None:
        return next((s for s in self.sections if s.name == name), None)


class BmcSource(Protocol):
    """A node's BMC: one full poll at a time, never raising for what the BMC did wrong.

    `poll` returns a sample whatever happens: a BMC that cannot be reached gives success false and
    `error`; a section that fails gives its own status and leaves the rest of the sample intact.
    `gpus` is the node's GPU inventory, to map GPU baseboard sensors to GPU indices.
    """

    endpoint: str

    def poll(self, gpus: Sequence[GpuInfo] = ()) -> BmcSample: ...

    def close(self) -> None:
        """Log out and release connections; never raises."""
