"""Data for the simulated GPU model: an 8-GPU H100 SXM5 (HGX) node.

Peaks are NVIDIA's published H100 SXM5 datasheet figures (dense, no sparsity). "Sustained" values
are what a well-tuned probe measures on a healthy card, in line with published nccl-tests and GEMM
benchmark runs on HGX H100; they are what the simulator's healthy GPUs scatter around. Limits,
thresholds and the reserved memory are what `nvidia-smi -q` prints for an HGX H100 / H800 board
(692-2G520-*): power limit 200..700 W (default 700 W), shutdown 92 C, slowdown 89 C, max operating
87 C, HBM3 max operating 95 C, 516 MiB of 81559 MiB reserved, Fan Speed and Retired Pages N/A.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class GpuProfile:
    name: str
    board_part_number: str
    vbios_version: str
    memory_total_bytes: int
    max_sm_clock_hz: float
    min_sm_clock_hz: float
    clock_step_hz: float  # SM clocks move in steps of this size
    memory_clock_hz: float
    default_power_limit_watts: float
    min_power_limit_watts: float
    idle_power_watts: float
    dynamic_power_watts: float  # extra draw at full load and max clock
    power_clock_exponent: float  # dynamic power ~ clock^exponent (voltage rises with clock)
    thermal_resistance_c_per_watt: float
    slowdown_temperature_celsius: float
    thermal_hold_celsius: float  # the firmware slows clocks to hold the die at about this
    memory_temperature_offset_celsius: float
    pcie_gen_max: int
    pcie_width_max: int
    nvlink_count: int
    nvlink_version: int
    max_power_limit_watts: float
    shutdown_temperature_celsius: float
    max_operating_temperature_celsius: float
    memory_max_operating_temperature_celsius: float
    memory_reserved_bytes: int  # held by the driver and firmware, never free for allocations
    nvlink_bytes_per_second: float  # data rate of one link, each direction
    # GpuReading fields NVML answers NOT_SUPPORTED for on this board (GpuInfo.unsupported_fields).
    unsupported_fields: tuple[str, ...] = ()
    # Sustained probe figures of a healthy GPU at max clock (what peers cluster around).
    gemm_tflops: dict[str, float] = field(default_factory=dict)
    # Datasheet peaks (TFLOP/s, dense): H100 SXM5 datasheet, NVIDIA, 2023.
    gemm_peak_tflops: dict[str, float] = field(default_factory=dict)
    membw_gbps: float = 0.0  # device-to-device copy, read + write bytes
    membw_peak_gbps: float = 0.0  # datasheet: 3.35 TB/s HBM3
    pcie_gbps: float = 0.0  # pinned host<->device, one direction, gen/width max
    nccl_busbw_gbps: float = 0.0  # all-reduce bus bandwidth, 8 GPUs, 1 GiB messages


H100_SXM = GpuProfile(
    name="NVIDIA H100 80GB HBM3",
    board_part_number="692-2G520-0200-000",
    vbios_version="96.00.99.00.01",
    memory_total_bytes=81559 * 1024 * 1024,
    max_sm_clock_hz=1980e6,
    min_sm_clock_hz=345e6,
    clock_step_hz=15e6,
    memory_clock_hz=2619e6,
    default_power_limit_watts=700.0,
    min_power_limit_watts=200.0,
    idle_power_watts=90.0,
    dynamic_power_watts=560.0,
    power_clock_exponent=2.5,
    thermal_resistance_c_per_watt=0.07,
    slowdown_temperature_celsius=89.0,
    thermal_hold_celsius=88.0,
    memory_temperature_offset_celsius=3.0,
    pcie_gen_max=5,
    pcie_width_max=16,
    nvlink_count=18,
    nvlink_version=4,
    max_power_limit_watts=700.0,
    shutdown_temperature_celsius=92.0,
    max_operating_temperature_celsius=87.0,
    memory_max_operating_temperature_celsius=95.0,
    memory_reserved_bytes=516 * 1024 * 1024,
    nvlink_bytes_per_second=25e9,  # NVLink4: 18 links x 25 GB/s = 450 GB/s each way
    unsupported_fields=(
        "fan_speed_ratio",  # SXM modules have no fan; the chassis cools them
        # Hopper replaces page retirement with row remapping (row_remap_* fields)
        "retired_pages_sbe_total",
        "retired_pages_dbe_total",
        "retired_pages_pending",
    ),
    gemm_tflops={"bf16": 760.0, "fp16": 760.0, "tf32": 380.0, "fp8": 1350.0},
    gemm_peak_tflops={"bf16": 989.4, "fp16": 989.4, "tf32": 494.7, "fp8": 1978.9},
    membw_gbps=2950.0,
    membw_peak_gbps=3350.0,
    pcie_gbps=55.0,
    nccl_busbw_gbps=470.0,
)


@dataclass(frozen=True, slots=True)
class Workload:
    """A steady training job as a GPU's activity counters see it, per unit of load.

    Activity ratios are GPM's (0..1). Traffic duties are the share of time a link moves data at its
    full rate: collectives and host transfers are link-bound, so their rate follows the trained
    link, not the SM clock.
    """

    sm_activity: float = 0.93  # time some warp is resident on an SM
    tensor_activity: float = 0.45  # cycles the tensor pipes are busy (LLM training, bf16)
    dram_activity: float = 0.55  # HBM bandwidth in use at max clock, of peak
    graphics_activity: float = 0.98  # time the graphics/compute engine is busy
    pcie_duty: float = 0.1  # input data, checkpoints, GPUDirect RDMA to the NICs
    pcie_tx_share: float = 0.85  # device-to-host traffic relative to host-to-device
    nvlink_duty: float = 0.3  # tensor/data-parallel collectives over NVSwitch
    memory_bytes: tuple[int, int] = (70 * 1024**3, 76 * 1024**3)  # the job's allocation, per GPU


TRAINING_JOB = Workload()

DRIVER_VERSION = "550.90.07"
CUDA_DRIVER_VERSION = "12.4"

# PCIe bandwidth per lane and direction after 8b/10b or 128b/130b encoding, GB/s (PCI-SIG).
PCIE_LANE_GBPS = {1: 0.25, 2: 0.5, 3: 0.985, 4: 1.969, 5: 3.938}

# Bus ids of the eight SXM GPUs on an HGX H100 baseboard as a DGX H100 enumerates them.
HGX_BUS_IDS = ("18", "2A", "3A", "5D", "9A", "AB", "BA", "DB")
# Four NVSwitch chips; each GPU's 18 links are spread 5/4/4/5 over them.
NVSWITCH_BUS_IDS = ("05", "06", "07", "08")
NVSWITCH_LINKS = (5, 4, 4, 5)

# NVSwitch fabric registration as NVML reports it once Fabric Manager has trained the node. HGX H100
# is a single-node NVLink domain: state completed, status success, clique 0 and an all-zero cluster
# UUID (only multi-node NVLink systems such as GB200 NVL72 fill it). The NVML source reads an
# all-zero UUID as unset, "", so that no two nodes look like one NVLink domain; so does the sim.
FABRIC_STATE_COMPLETED = 4  # FabricState: NVML_GPU_FABRIC_STATE_COMPLETED (3) + 1
FABRIC_CLUSTER_UUID = ""
FABRIC_CLIQUE_ID = 0
COMPUTE_MODE_DEFAULT = 1  # ComputeMode: NVML_COMPUTEMODE_DEFAULT (0) + 1

# XID codes a simulated fault raises (NVIDIA's XID catalogue).
XID_ROW_REMAP_EVENT = 63  # a row remap was recorded; it takes effect at the next GPU reset
XID_CONTAINED_ECC = 94  # uncorrectable ECC error contained to the processes that touched it
XID_DBE = 48  # double-bit ECC error
XID_FALLEN_OFF_BUS = 79  # the GPU has fallen off the bus: gone until reset
