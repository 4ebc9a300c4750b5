"""What the agent reads of its host: the reading types and the HostReader Protocol that the real
source (agent/sources/linux) and the simulator (agent/sources/sim/host.py) implement."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol


@dataclass(slots=True)
class HostFacts:
    hostname: str
    kernel: str = ""
    os: str = ""
    cpu_count: int = 0
    memory_total_bytes: int = 0
    host_boot_id: str = ""
    cpu_model: str = ""
    nvidia_gpu_pci_count: int | None = None


@dataclass(slots=True)
class CpuCoreReading:
    cpu: int  # the kernel's CPU number (cpuN)
    utilization_ratio: float | None = None  # busy share of the time since the previous read
    frequency_hz: float | None = None  # scaling_cur_freq
    governor: str = ""  # scaling_governor, empty where cpufreq is absent


@dataclass(slots=True)
class NetInterfaceReading:
    name: str
    rx_bytes_total: int | None = None
    tx_bytes_total: int | None = None
    rx_packets_total: int | None = None
    tx_packets_total: int | None = None
    rx_errors_total: int | None = None
    tx_errors_total: int | None = None
    rx_dropped_total: int | None = None
    tx_dropped_total: int | None = None


@dataclass(slots=True)
class DiskReading:
    name: str  # whole devices only (sda, nvme0n1), not partitions
    read_bytes_total: int | None = None
    written_bytes_total: int | None = None
    reads_total: int | None = None
    writes_total: int | None = None
    io_time_seconds_total: float | None = None


@dataclass(slots=True)
class InfinibandPortReading:
    device: str  # HCA name, e.g. mlx5_0
    port: int
    link_layer: str = ""  # "infiniband" or "ethernet" (RoCE)
    state: str = ""  # lower case: "active", "down", "init", "armed"
    physical_state: str = ""  # lower case, underscores: "link_up", "polling", "disabled"
    rate_gbps: float | None = None  # current signalling rate, e.g. 400 for "400 Gb/sec (4X NDR)"
    link_downed_total: int | None = None
    symbol_error_total: int | None = None
    port_rcv_errors_total: int | None = None
    link_error_recovery_total: int | None = None
    port_xmit_discards_total: int | None = None
    port_rcv_data_bytes_total: int | None = None  # the counter is in 4-byte words; already multiplied
    port_xmit_data_bytes_total: int | None = None


@dataclass(slots=True)
class PcieAerReading:
    device: str  # PCI address, e.g. 0000:17:00.0
    correctable_total: int | None = None  # TOTAL_ERR_COR of aer_dev_correctable
    nonfatal_total: int | None = None  # TOTAL_ERR_NONFATAL of aer_dev_nonfatal
    fatal_total: int | None = None  # TOTAL_ERR_FATAL of aer_dev_fatal
    nvidia_gpu: bool = False  # the device is an NVIDIA GPU (or the bridge above one is not)


@dataclass(slots=True)
class HostReading:
    cpu_utilization_ratio: float | None = None
    load1: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    cpu_governor: str | None = None  # the one most cores run (summary_governor); per core in `cpus`
    cpu_frequency_hz: float | None = None  # mean over cores
    uptime_seconds: float | None = None
    load5: float | None = None
    load15: float | None = None
    memory_available_bytes: int | None = None
    swap_used_bytes: int | None = None
    swap_total_bytes: int | None = None
    hugepages_total: int | None = None
    hugepages_free: int | None = None
    hugepage_size_bytes: int | None = None
    transparent_hugepage: str | None = None  # the selected mode: "always", "madvise" or "never"
    numa_balancing: bool | None = None  # kernel.numa_balancing
    kernel: str | None = None
    cpus: list[CpuCoreReading] = field(default_factory=list)
    network: list[NetInterfaceReading] = field(default_factory=list)
    disks: list[DiskReading] = field(default_factory=list)
    infiniband: list[InfinibandPortReading] = field(default_factory=list)
    pcie_aer: list[PcieAerReading] = field(default_factory=list)


class HostReader(Protocol):
    """The host as collectors and the daemon see it: the real machine (HostSource) or SimHost."""

    def facts(self) -> HostFacts:
        """What stays put while the agent runs: names, versions, sizes."""
        ...

    def read(self) -> HostReading:
        """The readings now; SourceError only when nothing at all can be read."""
        ...

    def nvidia_gpu_pci_count(self) -> int | None:
        """NVIDIA GPUs on the PCI bus, whatever NVML says (None: the bus cannot be read)."""
        ...

    def last_errors(self) -> list[str]:
        """Problems of the latest read() that left fields unset (files the kernel would not write)."""
        ...


def summary_governor(cpus: list[CpuCoreReading]) -> str | None:
    """HostReading.cpu_governor: the governor most of the cores run (a tie: the first by name), as
    the controller reads a host's (controller/fleet/governors.py); None when no core reports one.
    Not the first core's: a host with cpu0 alone on performance is a powersave host."""
    counts: dict[str, int] = {}
    for cpu in cpus:
        if cpu.governor:
            counts[cpu.governor] = counts.get(cpu.governor, 0) + 1
    return min(counts, key=lambda name: (-counts[name], name)) if counts else None
