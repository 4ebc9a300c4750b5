"""A simulated host beside a SimNode: the HostReader contract, driven by the node's load.

The host is a DGX H100-class machine (host_profile): CPU cores busy with the job's data loaders,
memory holding its buffers, the InfiniBand compute fabric carrying its all-reduce traffic, storage
ports and NVMe drives its dataset reads. Instantaneous fields follow the node's load with a little
noise; cumulative ones (network, disk, InfiniBand and AER counters) start where days of uptime
leave them and grow by rate x the time the caller's clock says has passed. The load averages are
the kernel's exponential averages of the running cores. Everything is drawn from generators seeded
by node name and seed, and never from the node's own, so the same seed and clock give the same host
and the GPUs' readings do not depend on whether a host is simulated.

`condition` is where host faults act (HostCondition), the way SimBmc.condition is for BMC faults.
"""

from __future__ import annotations

import math
import random
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

from agent.sources.host import (
    CpuCoreReading,
    DiskReading,
    HostFacts,
    HostReading,
    InfinibandPortReading,
    NetInterfaceReading,
    PcieAerReading,
    summary_governor,
)
from agent.sources.sim.faults import FAULTS
from agent.sources.sim.gpu import bounded_gauss
from agent.sources.sim.host_profile import DGX_H100_HOST, HostProfile, NicProfile
from agent.sources.sim.node import SimNode

IB_WORD_BYTES = 4  # the data counters count 4-byte words; readings carry bytes
LOAD_AVERAGE_SECONDS = (60.0, 300.0, 900.0)  # the kernel's load1/load5/load15 time constants
# A degraded port (a bad cable or transceiver) trains at half rate and keeps erroring.
DEGRADED_RATE_RATIO = 0.5
DEGRADED_SYMBOL_ERRORS_PER_SECOND = 0.8
DEGRADED_RCV_ERRORS_PER_SECOND = 0.05
DEGRADED_RECOVERIES_PER_SECOND = 1 / 120
DEGRADED_LINK_DOWNS_PER_SECOND = 1 / 900
# A port without a link polls for a peer; the driver reports the lowest rate (4X SDR) meanwhile.
DOWN_RATE_GBPS = 10.0
_BOOT_NAMESPACE = uuid.UUID("9b0f2c55-4f7e-4d6b-8f0e-5a8c2f3d7e61")


@dataclass(slots=True)
class HostCondition:
    """What host faults change. Defaults are a healthy, tuned node."""

    governor: str = "performance"  # cpufreq governor of every core not in core_governors; powersave: ~1.2 GHz
    degraded_ib_ports: set[str] = field(default_factory=set)  # HCA names (mlx5_3): half rate, errors rising
    down_ib_ports: set[str] = field(default_factory=set)  # no link: state down, polling, no traffic
    numa_balancing: bool | None = None  # None: as the profile has it
    transparent_hugepage: str | None = None  # None: as the profile has it
    # Settings the OS actuators write (through sim/control.py's SimHostTree).
    core_governors: dict[int, str] = field(default_factory=dict)  # CPUs set apart from `governor`
    thp_defrag: str = "madvise"
    hugepages: int = 0  # vm.nr_hugepages: 2 MiB pages reserved (used memory, never the job's)
    sysctls: dict[str, int] = field(default_factory=dict)  # other sysctls, where set off their default


@dataclass(slots=True)
class _Port:
    nic: NicProfile
    share: float  # this port's share of the job's traffic relative to its peers
    rcv_bytes: float
    xmit_bytes: float
    symbol_errors: float
    rcv_errors: float
    recoveries: float
    link_downs: float
    xmit_discards: float
    down: bool = False  # seen down: its link-down was counted


class SimHost:
    """The host of a simulated node: every read a complete reading consistent with the node's load.

    `cpus` logical CPUs are listed (a real DGX H100 has 224; fewer keep the per-core series short).
    """

    def __init__(
        self,
        node: SimNode,
        *,
        seed: int = 0,
        cpus: int = 32,
        clock: Callable[[], float] | None = None,
        profile: HostProfile = DGX_H100_HOST,
    ) -> None:
        if cpus < 1:
            raise ValueError("a simulated host needs at least one CPU")
        self.node = node
        self.profile = profile
        self.clock = clock or node.clock
        self.condition = HostCondition()
        rng = random.Random(f"{seed}:{node.node}:host")
        self._noise = random.Random(f"{seed}:{node.node}:host:noise")
        # Fault-driven increments draw from their own stream, so a fault leaves the rest as it was.
        self._faults = random.Random(f"{seed}:{node.node}:host:faults")
        self.boot_id = str(uuid.uuid5(_BOOT_NAMESPACE, f"{seed}:{node.node}"))
        now = self.clock()
        uptime = rng.uniform(2 * 3600.0, 40 * 86400.0)
        self._booted = now - uptime
        busy = rng.uniform(0.4, 0.8)  # share of the uptime the node ran jobs
        # Data loaders and the job's own threads keep some cores busier than others.
        self._core_weights = [rng.uniform(0.25, 1.0) for _ in range(cpus)]
        self._memory_trait = 1.0 + bounded_gauss(rng, 0.02, 0.05)
        p = profile
        self._ports = [self._start_port(nic, rng, uptime * busy) for nic in (*p.compute, *p.storage)]
        # Cumulative counters of each interface and disk, as floats (readings round them down).
        self._interfaces = [
            {
                "rx_bytes": uptime * (i.rx_bytes_per_second[0] + busy * i.rx_bytes_per_second[1]),
                "tx_bytes": uptime * (i.tx_bytes_per_second[0] + busy * i.tx_bytes_per_second[1]),
                "rx_dropped": float(rng.randrange(0, 40)),
            }
            for i in p.interfaces
        ]
        self._disks = [
            {
                "read_bytes": uptime * (d.read_bytes_per_second[0] + busy * d.read_bytes_per_second[1]),
                "written_bytes": uptime * (d.write_bytes_per_second[0] + busy * d.write_bytes_per_second[1]),
                "io_time": uptime * (d.busy[0] + busy * d.busy[1]),
            }
            for d in p.disks
        ]
        steady = self._running_cores(self.node.load)
        self._loads = [steady, steady, steady]
        self._last = now
        # The node's host and network faults act here, drawing from a stream of their own.
        inject = random.Random(f"{seed}:{node.node}:host:inject")
        for spec in node.faults:
            if spec.level in ("host", "network"):
                FAULTS[spec.fault].apply(self, None if spec.target is None else str(spec.target), inject)

    @staticmethod
    def _start_port(nic: NicProfile, rng: random.Random, busy_seconds: float) -> _Port:
        share = 1.0 + bounded_gauss(rng, 0.02, 0.05)
        moved = busy_seconds * nic.bytes_per_second * share
        return _Port(
            nic=nic,
            share=share,
            rcv_bytes=moved * rng.uniform(0.98, 1.02),
            xmit_bytes=moved * rng.uniform(0.98, 1.02),
            # Link training at boot leaves a few symbol errors on some ports, and one link-down.
            symbol_errors=float(rng.choice((0, 0, 0, 1, 3))),
            rcv_errors=0.0,
            recoveries=0.0,
            link_downs=float(rng.choice((0, 1))),
            xmit_discards=float(rng.randrange(0, 12)),
        )

    # HostReader

    def facts(self) -> HostFacts:
        return HostFacts(
            hostname=self.node.node,
            kernel=self.profile.kernel,
            os=self.profile.os,
            cpu_count=len(self._core_weights),
            memory_total_bytes=self.profile.memory_total_bytes,
            host_boot_id=self.boot_id,
            cpu_model=self.profile.cpu_model,
            nvidia_gpu_pci_count=self.nvidia_gpu_pci_count(),
        )

    def nvidia_gpu_pci_count(self) -> int:
        return len(self.node.gpus)

    @property
    def cpu_count(self) -> int:
        return len(self._core_weights)

    def governor(self, cpu: int) -> str:
        """cpufreq's governor of `cpu`."""
        return self.condition.core_governors.get(cpu, self.condition.governor)

    def set_governor(self, cpu: int, name: str) -> None:
        """Set one CPU's governor. `condition.governor` stays the one most CPUs run (on a tie, the
        one it was), so a host with every CPU set alike has the condition of one booted that way."""
        governors = [self.governor(i) for i in range(self.cpu_count)]
        governors[cpu] = name
        counts = Counter(governors)
        common = self.condition.governor
        if counts[common] < max(counts.values()):
            common = counts.most_common(1)[0][0]
        self.condition.governor = common
        self.condition.core_governors = {i: g for i, g in enumerate(governors) if g != common}

    def last_errors(self) -> list[str]:
        return []

    def read(self) -> HostReading:
        now = self.clock()
        elapsed = max(0.0, now - self._last)
        self._last = now
        load, p = self.node.load, self.profile
        cores = self._cores(load)
        running = sum(c.utilization_ratio or 0.0 for c in cores)
        for i, tau in enumerate(LOAD_AVERAGE_SECONDS):
            decay = math.exp(-elapsed / tau)
            self._loads[i] = self._loads[i] * decay + running * (1.0 - decay)
        used = p.memory_base_bytes + load * p.memory_job_bytes * self._memory_trait
        used = int(used * (1.0 + self._noise.gauss(0.0, 0.002)))
        hugepages = self.condition.hugepages
        used += hugepages * p.hugepage_size_bytes
        freqs = [c.frequency_hz or 0.0 for c in cores]
        numa_balancing = self.condition.numa_balancing
        if numa_balancing is None:
            numa_balancing = p.numa_balancing
        return HostReading(
            cpu_utilization_ratio=round(running / len(cores), 4),
            load1=round(self._loads[0], 2),
            load5=round(self._loads[1], 2),
            load15=round(self._loads[2], 2),
            memory_used_bytes=used,
            memory_total_bytes=p.memory_total_bytes,
            memory_available_bytes=p.memory_total_bytes - used,
            swap_used_bytes=0,
            swap_total_bytes=0,  # GPU nodes run without swap
            hugepages_total=hugepages,
            hugepages_free=hugepages,  # nothing maps them: the job allocates ordinary pages
            hugepage_size_bytes=p.hugepage_size_bytes,
            transparent_hugepage=self.condition.transparent_hugepage or p.transparent_hugepage,
            numa_balancing=numa_balancing,
            kernel=p.kernel,
            cpu_governor=summary_governor(cores),  # as the Linux source reports it
            cpu_frequency_hz=round(sum(freqs) / len(freqs), 1),
            uptime_seconds=round(now - self._booted, 2),
            cpus=cores,
            network=self._network(load, elapsed),
            disks=self._disk_readings(load, elapsed),
            infiniband=[self._port(port, load, elapsed) for port in self._ports],
            pcie_aer=self._aer(),
        )

    # The model

    def _running_cores(self, load: float) -> float:
        return sum(self._core_busy(w, load) for w in self._core_weights)

    @staticmethod
    def _core_busy(weight: float, load: float) -> float:
        return 0.02 + 0.6 * load * weight

    def _frequency_hz(self, busy: float, governor: str) -> float:
        p = self.profile
        if governor == "performance":
            hz = p.all_core_turbo_hz * (0.96 + 0.04 * busy)
        elif governor == "powersave":
            hz = p.powersave_hz
        else:  # ondemand, schedutil, conservative: scale with the core's load
            hz = p.powersave_hz + (p.all_core_turbo_hz - p.powersave_hz) * busy
        return hz * (1.0 + self._noise.gauss(0.0, 0.004))

    def _cores(self, load: float) -> list[CpuCoreReading]:
        out = []
        for cpu, weight in enumerate(self._core_weights):
            busy = min(1.0, max(0.0, self._core_busy(weight, load) + self._noise.gauss(0.0, 0.02)))
            governor = self.governor(cpu)
            khz = round(self._frequency_hz(busy, governor) / 1000.0)  # cpufreq reports whole kHz
            out.append(CpuCoreReading(cpu, round(busy, 4), khz * 1000.0, governor))
        return out

    def _network(self, load: float, elapsed: float) -> list[NetInterfaceReading]:
        out = []
        for profile, c in zip(self.profile.interfaces, self._interfaces, strict=True):
            rx = (profile.rx_bytes_per_second[0] + load * profile.rx_bytes_per_second[1]) * elapsed
            tx = (profile.tx_bytes_per_second[0] + load * profile.tx_bytes_per_second[1]) * elapsed
            c["rx_bytes"] += rx * self._noise.uniform(0.95, 1.05)
            c["tx_bytes"] += tx * self._noise.uniform(0.95, 1.05)
            if self._noise.random() < 0.01 * load:  # a burst overflows a ring buffer now and then
                c["rx_dropped"] += 1
            out.append(
                NetInterfaceReading(
                    name=profile.name,
                    rx_bytes_total=int(c["rx_bytes"]),
                    tx_bytes_total=int(c["tx_bytes"]),
                    rx_packets_total=int(c["rx_bytes"] / profile.packet_bytes),
                    tx_packets_total=int(c["tx_bytes"] / profile.packet_bytes),
                    rx_errors_total=0,
                    tx_errors_total=0,
                    rx_dropped_total=int(c["rx_dropped"]),
                    tx_dropped_total=0,
                )
            )
        return out

    def _disk_readings(self, load: float, elapsed: float) -> list[DiskReading]:
        out = []
        for profile, c in zip(self.profile.disks, self._disks, strict=True):
            read = (profile.read_bytes_per_second[0] + load * profile.read_bytes_per_second[1]) * elapsed
            written = (profile.write_bytes_per_second[0] + load * profile.write_bytes_per_second[1]) * elapsed
            c["read_bytes"] += read * self._noise.uniform(0.9, 1.1)
            c["written_bytes"] += written * self._noise.uniform(0.9, 1.1)
            c["io_time"] += min(1.0, profile.busy[0] + load * profile.busy[1]) * elapsed
            # Whole 512-byte sectors, as /proc/diskstats counts them.
            read_bytes, written_bytes = (int(c[k]) // 512 * 512 for k in ("read_bytes", "written_bytes"))
            out.append(
                DiskReading(
                    name=profile.name,
                    read_bytes_total=read_bytes,
                    written_bytes_total=written_bytes,
                    reads_total=int(read_bytes / profile.read_io_bytes),
                    writes_total=int(written_bytes / profile.write_io_bytes),
                    io_time_seconds_total=round(c["io_time"], 3),  # diskstats counts milliseconds
                )
            )
        return out

    def _port(self, port: _Port, load: float, elapsed: float) -> InfinibandPortReading:
        nic = port.nic
        degraded = nic.device in self.condition.degraded_ib_ports
        down = nic.device in self.condition.down_ib_ports
        rate = nic.rate_gbps * (DEGRADED_RATE_RATIO if degraded else 1.0)
        # Traffic follows the job, and no port moves more than its link carries.
        wire = min(load * nic.bytes_per_second * port.share, 0.9 * rate * 1e9 / 8)
        if down:
            rate, wire = DOWN_RATE_GBPS, 0.0
            if not port.down:
                port.down, port.link_downs = True, port.link_downs + 1
        port.rcv_bytes += wire * elapsed * self._noise.uniform(0.97, 1.03)
        port.xmit_bytes += wire * elapsed * self._noise.uniform(0.97, 1.03)
        if self._noise.random() < 0.002 * load:  # congestion drops a packet now and then
            port.xmit_discards += 1
        if degraded:
            port.symbol_errors += self._events(DEGRADED_SYMBOL_ERRORS_PER_SECOND * elapsed)
            port.rcv_errors += self._events(DEGRADED_RCV_ERRORS_PER_SECOND * elapsed)
            port.recoveries += self._events(DEGRADED_RECOVERIES_PER_SECOND * elapsed)
            port.link_downs += self._events(DEGRADED_LINK_DOWNS_PER_SECOND * elapsed)
        return InfinibandPortReading(
            device=nic.device,
            port=1,
            link_layer=nic.link_layer,
            state="down" if down else "active",
            physical_state="polling" if down else "link_up",
            rate_gbps=rate,
            link_downed_total=int(port.link_downs),
            symbol_error_total=int(port.symbol_errors),
            port_rcv_errors_total=int(port.rcv_errors),
            link_error_recovery_total=int(port.recoveries),
            port_xmit_discards_total=int(port.xmit_discards),
            # The port counts 4-byte words: whole words, in bytes.
            port_rcv_data_bytes_total=int(port.rcv_bytes) // IB_WORD_BYTES * IB_WORD_BYTES,
            port_xmit_data_bytes_total=int(port.xmit_bytes) // IB_WORD_BYTES * IB_WORD_BYTES,
        )

    def _events(self, expected: float) -> int:
        """A whole number of events with mean `expected`: the integer part, plus one by chance."""
        whole = math.floor(expected)
        return whole + (1 if self._faults.random() < expected - whole else 0)

    def _aer(self) -> list[PcieAerReading]:
        """Each GPU's AER counters, at the address sysfs gives it (NVML pads the domain to 8 digits)."""
        return [
            PcieAerReading(
                device=_sysfs_address(info.pci_bus_id),
                correctable_total=0,
                nonfatal_total=0,
                fatal_total=0,
                nvidia_gpu=True,
            )
            for info in self.node.inventory().gpus
        ]


def _sysfs_address(nvml_bus_id: str) -> str:
    """ "00000000:18:00.0" (NVML) -> "0000:18:00.0" (sysfs, lower case)."""
    domain, _, rest = nvml_bus_id.partition(":")
    return f"{int(domain, 16):04x}:{rest.lower()}"
