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
    mig_mode_enabled: bool | None = None
    default_power_limit_watts: float | None = None


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
    tx_bytes_total: int | None = None
    rx_bytes_total: int | None = None


@dataclass(slots=True)
class ComputeProcess:
    pid: int
    used_memory_bytes: int | None = None
    kind: str = "compute"


@dataclass(slots=True)
class XidEvent:
    code: int
    unix_time_seconds: float


@dataclass(slots=True)
class XidCount:
    code: int
    total: int


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
    applications_memory_clock_hz: float | None = None
    max_graphics_clock_hz: float | None = None
    power_management_limit_watts: float | None = None
    power_limit_min_watts: float | None = None
    power_limit_max_watts: float | None = None
    shutdown_temperature_celsius: float | None = None
    max_operating_temperature_celsius: float | None = None
    memory_max_operating_temperature_celsius: float | None = None
    fan_speed_ratio: float | None = None
    memory_free_bytes: int | None = None
    memory_reserved_bytes: int | None = None
    encoder_utilization_ratio: float | None = None
    decoder_utilization_ratio: float | None = None
    ecc_mode_enabled: bool | None = None
    ecc_corrected_aggregate_total: int | None = None
    ecc_uncorrected_aggregate_total: int | None = None
    retired_pages_sbe_total: int | None = None
    retired_pages_dbe_total: int | None = None
    retired_pages_pending: bool | None = None
    pcie_tx_bytes_per_second: float | None = None
    pcie_rx_bytes_per_second: float | None = None
    pcie_replay_errors_total: int | None = None
    nvlink_tx_bytes_total: int | None = None
    nvlink_rx_bytes_total: int | None = None
    persistence_mode_enabled: bool | None = None
    compute_mode: int | None = None  # ComputeMode value: NVML's mode + 1
    processes: list[ComputeProcess] = field(default_factory=list)
    gpm_sm_activity_ratio: float | None = None
    gpm_tensor_activity_ratio: float | None = None
    gpm_dram_activity_ratio: float | None = None
    gpm_graphics_activity_ratio: float | None = None
    xid_events: list[XidEvent] = field(default_factory=list)
    xid_counts: list[XidCount] = field(default_factory=list)
    fabric_state: int | None = None  # FabricState value: NVML's state + 1
    fabric_status: int | None = None
    fabric_cluster_uuid: str = ""
    fabric_clique_id: int | None = None


class GpuSource(Protocol):
    """What the agent needs from NVML or the simulator.

    Implementations raise SourceError, never a foreign exception. `read` returns one reading per GPU
    that could be read; a GPU that fails alone is left out and reported through `last_errors`,
    except that a lost GPU with XID events still gets a reading holding only its identity and XIDs
    (so that, say, XID 79 "fallen off the bus" reaches the controller).
    """

    def inventory(self) -> Inventory: ...

    def read(self) -> list[GpuReading]: ...

    def last_errors(self) -> list[str]:
        """Per-GPU errors of the most recent `read` (empty when every GPU was read)."""
        ...

    def close(self) -> None: ...
