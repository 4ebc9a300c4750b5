"""The chassis around a simulated GPU baseboard, as its BMC sees it: parts, limits and physics.

The layout is that of common 8-GPU HGX H100 servers: two Xeon sockets, six 3000 W Titanium PSUs in
3+3 redundancy, ten high-static-pressure fans, an HGX baseboard with four NVSwitches and an HMC.
Vendor, model and part strings are invented (no real product is claimed); versions are fleet-wide
constants, so a healthy fleet agrees on them and a later drift fault has a majority to differ from.
Power figures are typical draws of the parts named (Sapphire Rapids 8480+, DDR5 RDIMMs, ConnectX-7,
NVSwitch gen 3) and put the host, GPUs aside, at about 1.1 kW idle and 2 kW under a training job.

Physics, from the GPUs outwards: the fans follow the hottest GPU; the host draws its CPUs, memory,
NICs, NVSwitches, board and fans; the PSUs carry GPUs plus host, losing a few percent; and the
exhaust is the intake plus the rise that the heat (all the input power) gives the air the fans move.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from agent.sources.bmc import BmcFirmware, BmcLogEntry
from agent.sources.gpu import GpuInfo
from agent.sources.sim.profile import GpuProfile

# Air heats by 1.76 C per watt per cubic foot per minute (rho * cp of air at sea level, in CFM).
AIR_CELSIUS_CFM_PER_WATT = 1.76


@dataclass(frozen=True, slots=True)
class Thresholds:
    """Upper caution / critical / fatal thresholds of a temperature sensor, Celsius."""

    caution: float
    critical: float
    fatal: float

    def health(self, reading: float) -> str:
        """Redfish sensor health: warning from the caution threshold, critical from the critical one."""
        if reading >= self.critical:
            return "critical"
        return "warning" if reading >= self.caution else "ok"


@dataclass(frozen=True, slots=True)
class ChassisProfile:
    manufacturer: str
    model: str
    chassis: str  # the host chassis id its sensors, fans and PSUs hang off
    system: str  # the computer system id
    bios_version: str
    bmc_firmware_version: str
    cpld_version: str
    hmc_version: str
    nvswitch_version: str
    psu_model: str
    psu_firmware_version: str
    cpus: int
    dimm_sensors: tuple[str, ...]  # the DIMM slots that carry a temperature sensor
    dimms: int  # DIMMs drawing power (all slots populated)
    nics: int  # 8 ConnectX-7 for the compute fabric, 2 for storage / front end
    nvswitches: int
    # Power per part, idle and extra at full host load (load is the node's job load).
    cpu_watts: tuple[float, float]
    dimm_watts: tuple[float, float]
    nic_watts: tuple[float, float]
    nvswitch_watts: tuple[float, float]
    board_watts: float  # PCIe switches and retimers, NVMe drives, BMC, board regulators
    fans: int
    fan_max_rpm: float
    fan_max_watts: float  # one fan at full speed; fan power goes with the cube of speed
    fan_min_ratio: float  # the BMC never lets the fans run slower than this
    fan_curve_celsius: tuple[float, float]  # hottest GPU at which fans leave the floor / reach full
    airflow_max_cfm: float  # all fans at full speed, through the chassis
    psus: int
    psus_needed: int  # PSUs that can carry the rated load alone (N of N+N)
    psu_capacity_watts: float
    psu_efficiency: tuple[float, float]  # at no load, and at half load and above (80 PLUS Titanium)
    redundancy_mode: str  # Redfish Power.Redundancy Mode of the PSU group
    intake: Thresholds
    exhaust: Thresholds
    cpu: Thresholds
    dimm: Thresholds
    # Host temperature above intake, idle and extra at full load.
    cpu_rise_celsius: tuple[float, float]
    dimm_rise_celsius: tuple[float, float]
    gpu_caution_margin_celsius: float  # GPU caution this far below the GPU's max operating temperature
    bios_attributes: dict[str, str] = field(default_factory=dict)

    def fan_ratio(self, hottest_gpu_celsius: float) -> float:
        """Fan duty the BMC sets: from the floor up to full speed as the hottest GPU warms."""
        low, high = self.fan_curve_celsius
        rise = min(1.0, max(0.0, (hottest_gpu_celsius - low) / (high - low)))
        return self.fan_min_ratio + (1.0 - self.fan_min_ratio) * rise

    def host_watts(self, load: float, fan_ratio: float, working_fans: int) -> float:
        """Everything but the GPUs; host activity (data loading, NCCL proxies, NIC traffic) follows
        the job's load."""
        return (
            self.cpus * (self.cpu_watts[0] + load * self.cpu_watts[1])
            + self.dimms * (self.dimm_watts[0] + load * self.dimm_watts[1])
            + self.nics * (self.nic_watts[0] + load * self.nic_watts[1])
            + self.nvswitches * (self.nvswitch_watts[0] + load * self.nvswitch_watts[1])
            + self.board_watts
            + working_fans * self.fan_max_watts * fan_ratio**3
        )

    def efficiency(self, load_ratio: float) -> float:
        """PSU efficiency at `load_ratio` of capacity: lower at light load, flat from half load."""
        low, high = self.psu_efficiency
        return low + (high - low) * min(1.0, max(0.0, load_ratio) / 0.5)

    def exhaust_rise_celsius(self, heat_watts: float, fan_ratio: float, working_fans: int) -> float:
        """Air temperature rise through the chassis; a stopped fan moves no air, so the rise grows."""
        airflow = max(1.0, self.airflow_max_cfm * fan_ratio * working_fans / self.fans)
        return AIR_CELSIUS_CFM_PER_WATT * heat_watts / airflow

    def redundancy_health(self, working_psus: int) -> str:
        """Full redundancy is ok; fewer PSUs that still carry the load (N of N+N) warn."""
        if working_psus >= self.psus:
            return "ok"
        return "warning" if working_psus >= self.psus_needed else "critical"

    def gpu_thresholds(self, gpu: GpuProfile) -> Thresholds:
        """The baseboard's GPU sensor thresholds, from the GPU's own limits."""
        critical = gpu.max_operating_temperature_celsius
        return Thresholds(
            critical - self.gpu_caution_margin_celsius, critical, gpu.shutdown_temperature_celsius
        )

    def firmware(self, gpus: Sequence[GpuInfo], bmc_version: str | None = None) -> list[BmcFirmware]:
        """The UpdateService inventory: host firmware, the HGX baseboard's, and each GPU's VBIOS."""
        return [
            BmcFirmware("BMC_0", "BMC Firmware", bmc_version or self.bmc_firmware_version, True),
            BmcFirmware("BIOS_0", "BIOS Firmware", self.bios_version, True),
            BmcFirmware("CPLD_0", "Motherboard CPLD", self.cpld_version, False),
            BmcFirmware("HGX_FW_HMC_0", "HGX HMC Firmware", self.hmc_version, True),
            *(
                BmcFirmware(f"HGX_FW_NVSwitch_{i}", f"NVSwitch {i} Firmware", self.nvswitch_version, True)
                for i in range(self.nvswitches)
            ),
            *(
                BmcFirmware(
                    f"HGX_FW_GPU_SXM_{g.index + 1}", f"GPU SXM {g.index + 1} Firmware", g.vbios_version, True
                )
                for g in gpus
            ),
        ]

    def event_log(self, powered_on: float) -> list[BmcLogEntry]:
        """The event log of a healthy host: its power-on, an informational entry that never grows."""
        return [
            BmcLogEntry(
                id="1",
                severity="ok",
                message="Host system DC power is on",
                created=datetime.fromtimestamp(powered_on, UTC).isoformat(timespec="seconds"),
                message_id="OpenBMC.0.1.DCPowerOn",
                log=f"/redfish/v1/Systems/{self.system}/LogServices/EventLog",
            )
        ]


HGX_H100_CHASSIS = ChassisProfile(
    manufacturer="Simulated Systems",
    model="SIM-8H100-G5",
    chassis="BMC_0",
    system="System_0",
    bios_version="2.3.1",
    bmc_firmware_version="01.04.12",
    cpld_version="0.3.2",
    hmc_version="HGX-22.10-1-rc80",
    nvswitch_version="96.10.6D.00.01",
    psu_model="SIM-PSU-3000T",
    psu_firmware_version="1.7.2",
    cpus=2,
    dimm_sensors=tuple(f"DIMM_{slot}0_Temp" for slot in "ABCDEFGH"),
    dimms=32,
    nics=10,
    nvswitches=4,
    cpu_watts=(150.0, 120.0),
    dimm_watts=(4.0, 3.0),
    nic_watts=(20.0, 7.0),
    nvswitch_watts=(40.0, 45.0),
    board_watts=300.0,
    fans=10,
    fan_max_rpm=16_000.0,
    fan_max_watts=45.0,
    fan_min_ratio=0.35,
    fan_curve_celsius=(35.0, 95.0),
    airflow_max_cfm=1000.0,
    psus=6,
    psus_needed=3,
    psu_capacity_watts=3000.0,
    psu_efficiency=(0.92, 0.955),
    redundancy_mode="N+m",
    intake=Thresholds(35.0, 40.0, 45.0),  # ASHRAE A2 allows 35 C at the inlet
    exhaust=Thresholds(60.0, 70.0, 75.0),
    cpu=Thresholds(88.0, 93.0, 98.0),
    dimm=Thresholds(80.0, 85.0, 90.0),
    cpu_rise_celsius=(20.0, 25.0),
    dimm_rise_celsius=(8.0, 10.0),
    gpu_caution_margin_celsius=2.0,
    # What a GPU server's BIOS is tuned to: large BARs for 80 GB GPUs, IOMMU and SR-IOV for
    # GPUDirect RDMA, ACS off so peer traffic is not routed through the root complex, and the
    # CPUs held at full performance so the host never starves the GPUs.
    bios_attributes={
        "BootMode": "UEFI",
        "SecureBoot": "Disabled",
        "Hyperthreading": "Enabled",
        "TurboMode": "Enabled",
        "EnergyPerformanceBias": "Performance",
        "PackageCState": "C0/C1",
        "C1EState": "Disabled",
        "SubNumaClustering": "Disabled",
        "VTdSupport": "Enabled",
        "SriovSupport": "Enabled",
        "AboveFourGDecoding": "Enabled",
        "ResizableBar": "Enabled",
        "MmiohBase": "32T",
        "MmiohSize": "1024G",
        "PcieAcsControl": "Disabled",
        "PcieMaxPayloadSize": "Auto",
        "TpmSupport": "Enabled",
        "PowerRestorePolicy": "LastState",
    },
)
