"""The GPU source contract: inventory once, readings every cycle.

Field names match the wire contract (protos/gpufleet/v1/telemetry.proto: GpuInfo, GpuSample,
NvLinkSample) one for one, so the stream converts them without a mapping table. A reading left
as None was not read: unsupported by this GPU, or failed this cycle.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class GpuInfo:
    index: int
    uuid: str
    name: str
    serial: str = ""
    pci_bus_id: str = ""
    vbios_version: str = ""
    driver_version: str = ""
    board_part_number: str = ""
    unsupported_fields: list[str] = field(default_factory=list)
    memory_total_bytes: int | None = None
    nvlink_count: int | None = None


@dataclass(slots=True)
class Inventory:
    source: str
    gpus: list[GpuInfo]
    driver_version: str = ""
    cuda_driver_version: str = ""
    expected_gpu_count: int | None = None


@dataclass(slots=True)
class NvLinkReading:
    link: int
    active: bool
    version: int | None = None
    crc_errors_total: int | None = None
    replay_errors_total: int | None = None
    recovery_errors_total: int | None = None
    remote_pci_bus_id: str = ""


@dataclass(slots=True)
class GpuReading:
    index: int
    uuid: str
    gpu_utilization_ratio: float | None = None
    memory_utilization_ratio: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    sm_clock_hz: float | None = None
    memory_clock_hz: float | None = None
    graphics_clock_hz: float | None = None
    max_sm_clock_hz: float | None = None
    max_memory_clock_hz: float | None = None
    applications_sm_clock_hz: float | None = None
    power_watts: float | None = None
    enforced_power_limit_watts: float | None = None
    default_power_limit_watts: float | None = None
    energy_joules_total: float | None = None
    temperature_celsius: float | None = None
    memory_temperature_celsius: float | None = None
    slowdown_temperature_celsius: float | None = None
    clock_event_reasons: int | None = None
    pcie_link_gen: int | None = None
    pcie_link_gen_max: int | None = None
    pcie_link_width: int | None = None
    pcie_link_width_max: int | None = None
    ecc_corrected_volatile_total: int | None = None
    ecc_uncorrected_volatile_total: int | None = None
    row_remap_correctable_total: int | None = None
    row_remap_uncorrectable_total: int | None = None
    row_remap_pending: bool | None = None
    row_remap_failure: bool | None = None
    performance_state: int | None = None
    nvlinks: list[NvLinkReading] = field(default_factory=list)


class GpuSource(Protocol):
    """What the agent needs from NVML or the simulator.

    Implementations raise SourceError, never a foreign exception. `read` returns one reading per GPU
    that could be read; a GPU that fails alone is left out and reported through `last_errors`.
    """

    def inventory(self) -> Inventory: ...

    def read(self) -> list[GpuReading]: ...

    def last_errors(self) -> list[str]:
        """Per-GPU errors of the most recent `read` (empty when every GPU was read)."""
        ...

    def close(self) -> None: ...
