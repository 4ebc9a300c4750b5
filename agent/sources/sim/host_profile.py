"""Data for the simulated host: the CPU, memory, OS, NICs and drives of a DGX H100-class node.

A DGX H100 has two 56-core Xeon Platinum 8480C (224 logical CPUs), 2 TiB of DDR5, eight
ConnectX-7 ports for the InfiniBand compute fabric (NDR, 400 Gb/s each), two ConnectX-7 ports for
storage and the front end (Ethernet, RoCE), two M.2 NVMe drives for the OS (mirrored) and U.2
NVMe drives for the data cache, and runs an Ubuntu 22.04-based OS with an NVIDIA-tuned kernel.
The simulator lists fewer logical CPUs (see SimHost) so the /metrics page stays readable.

Rates are what a data-parallel training job moves per unit of load: the compute fabric carries
the gradients' all-reduce between nodes, storage the dataset reads and checkpoints.
"""

from __future__ import annotations

from dataclasses import dataclass

GIB = 1024**3
MB = 1_000_000
GB = 1_000_000_000


@dataclass(frozen=True, slots=True)
class NicProfile:
    """One RDMA port (an mlx5 HCA's port 1) and how much a training job moves over it."""

    device: str
    link_layer: str  # "infiniband" or "ethernet" (RoCE)
    rate_gbps: float
    bytes_per_second: float  # each direction at full load


@dataclass(frozen=True, slots=True)
class InterfaceProfile:
    """A kernel network interface (TCP/IP traffic; RDMA bypasses these counters)."""

    name: str
    rx_bytes_per_second: tuple[float, float]  # idle, extra at full load
    tx_bytes_per_second: tuple[float, float]
    packet_bytes: float  # mean packet size


@dataclass(frozen=True, slots=True)
class DiskProfile:
    name: str
    read_bytes_per_second: tuple[float, float]  # idle, extra at full load
    write_bytes_per_second: tuple[float, float]
    busy: tuple[float, float]  # share of time with I/O in flight: idle, extra at full load
    read_io_bytes: float  # mean request size
    write_io_bytes: float


@dataclass(frozen=True, slots=True)
class HostProfile:
    cpu_model: str
    kernel: str
    os: str
    memory_total_bytes: int  # MemTotal: installed memory less what firmware and the kernel keep
    memory_base_bytes: int  # the OS, the agent and daemons
    memory_job_bytes: int  # a training job's host memory at full load (loader workers, pinned buffers)
    hugepage_size_bytes: int
    transparent_hugepage: str
    numa_balancing: bool
    all_core_turbo_hz: float  # every core busy, performance governor
    powersave_hz: float  # the powersave governor's floor
    compute: tuple[NicProfile, ...]
    storage: tuple[NicProfile, ...]
    interfaces: tuple[InterfaceProfile, ...]
    disks: tuple[DiskProfile, ...]


DGX_H100_HOST = HostProfile(
    cpu_model="Intel(R) Xeon(R) Platinum 8480C",
    kernel="5.15.0-1042-nvidia",
    os="Ubuntu 22.04.4 LTS",
    memory_total_bytes=2_113_524_916 * 1024,  # of 2 TiB installed
    memory_base_bytes=24 * GIB,
    memory_job_bytes=380 * GIB,
    hugepage_size_bytes=2 * 1024**2,
    transparent_hugepage="madvise",
    numa_balancing=False,  # NVIDIA's tuning guide turns it off on GPU nodes
    all_core_turbo_hz=3.0e9,
    powersave_hz=1.2e9,
    # NDR carries 50 GB/s per direction; a job's all-reduce keeps it a bit under half busy.
    compute=tuple(NicProfile(f"mlx5_{i}", "infiniband", 400.0, 21 * GB) for i in range(8)),
    storage=tuple(NicProfile(f"mlx5_{i}", "ethernet", 200.0, 1.2 * GB) for i in (8, 9)),
    interfaces=(
        InterfaceProfile("eno1", (40e3, 160e3), (25e3, 90e3), 700.0),
        InterfaceProfile("enp41s0f0np0", (2 * MB, 450 * MB), (1 * MB, 35 * MB), 8200.0),
        InterfaceProfile("enp170s0f0np0", (2 * MB, 450 * MB), (1 * MB, 35 * MB), 8200.0),
    ),
    disks=(
        DiskProfile("nvme0n1", (20e3, 0.5 * MB), (150e3, 2 * MB), (0.002, 0.01), 64e3, 32e3),
        DiskProfile("nvme1n1", (20e3, 0.5 * MB), (150e3, 2 * MB), (0.002, 0.01), 64e3, 32e3),
        DiskProfile("nvme2n1", (0.0, 700 * MB), (0.0, 60 * MB), (0.0, 0.35), 256e3, 128e3),
        DiskProfile("nvme3n1", (0.0, 700 * MB), (0.0, 60 * MB), (0.0, 0.35), 256e3, 128e3),
    ),
)
