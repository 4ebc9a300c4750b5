"""The real host source: /proc and /sys under a configurable host root (/host in a pod), and psutil.

`HostSource` reads /proc and /sys under `root`: CPU (total and per core), load, memory, swap,
hugepages, transparent hugepages, NUMA balancing, uptime, kernel, cpufreq, network interfaces,
disks, InfiniBand/RoCE ports and PCIe AER counters. The parsers are in proc.py (/proc) and
sysfs.py (/sys); the reading types and the `HostReader` protocol are in agent/sources/host.py.
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import psutil

from agent.sources.errors import SourceError
from agent.sources.host import (
    CpuCoreReading,
    DiskReading,
    HostFacts,
    HostReading,
    NetInterfaceReading,
    summary_governor,
)
from agent.sources.linux import sysfs as host_sys
from agent.sources.linux.proc import (
    CpuTimes,
    parse_bracketed,
    parse_cpuinfo_mhz,
    parse_cpuinfo_model,
    parse_diskstats,
    parse_loadavg,
    parse_meminfo,
    parse_net_dev,
    parse_numa_balancing,
    parse_stat,
    parse_uptime,
    utilization,
)

T = TypeVar("T")

MEMINFO_KEYS = (
    "MemTotal",
    "MemAvailable",
    "SwapTotal",
    "SwapFree",
    "HugePages_Total",
    "HugePages_Free",
    "Hugepagesize",
)


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except (OSError, UnicodeDecodeError):
        return None


class HostSource:
    """Reads the host through the /proc and /sys trees under `root` ("/" by default).

    Any one file missing or unreadable leaves its field unset; one the kernel would not write
    leaves it unset and is named in last_errors(). Only a root with nothing readable in proc/ (the
    host's / not mounted where the config says) fails the read. Where `root` is this machine's own
    /, psutil stands in for a missing proc file (non-Linux development machines have none).
    Utilisation is measured between reads; the constructor takes the first baseline.
    """

    def __init__(self, root: str | Path = "/", *, psutil_fallback: bool | None = None) -> None:
        """`psutil_fallback`: let psutil stand in for missing proc files (default: when root is /)."""
        self.root = Path(root)
        self._local = self.root.resolve() == Path("/") if psutil_fallback is None else psutil_fallback
        self._problems: list[str] = []
        self._cpu_before, _ = self._cpu_times([])

    # Facts

    def facts(self) -> HostFacts:
        os_name = ""
        for line in (_read_text(self.root / "etc/os-release") or "").splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip("\"'")
        stat, _ = self._proc("proc/stat", parse_stat, [])
        meminfo, _ = self._proc("proc/meminfo", lambda t: parse_meminfo(t, ("MemTotal",)), [])
        memory_total = (meminfo or {}).get("MemTotal")
        return HostFacts(
            hostname=socket.gethostname(),
            kernel=_read_text(self.root / "proc/sys/kernel/osrelease") or platform.release(),
            os=os_name,
            cpu_count=len(stat) - 1 if stat else os.cpu_count() or 0,
            memory_total_bytes=memory_total or int(psutil.virtual_memory().total),
            host_boot_id=_read_text(self.root / "proc/sys/kernel/random/boot_id") or "",
            cpu_model=parse_cpuinfo_model(_read_text(self.root / "proc/cpuinfo") or ""),
            nvidia_gpu_pci_count=self.nvidia_gpu_pci_count(),
        )

    def nvidia_gpu_pci_count(self) -> int | None:
        """NVIDIA display/3D controllers in sysfs (None without a readable PCI tree).

        Counted from the PCI bus, not NVML, so a GPU that fell off the bus before the driver loaded,
        or that NVML refuses to enumerate, still counts as expected. NVSwitches are bridges
        (class 0x0680) and do not count.
        """
        devices = self.root / "sys/bus/pci/devices"
        try:
            entries = list(devices.iterdir())
        except OSError:
            return None
        count = 0
        for dev in entries:
            vendor = _read_text(dev / "vendor")
            pci_class = _read_text(dev / "class") or ""
            if vendor == host_sys.NVIDIA_PCI_VENDOR and pci_class.startswith(host_sys.GPU_PCI_CLASSES):
                count += 1
        return count

    # Readings

    def last_errors(self) -> list[str]:
        return list(self._problems)

    def read(self) -> HostReading:

        problems: list[str] = []
        self._problems = problems
        reading = HostReading()
        found = [
            self._read_cpu(reading, problems),
            self._read_load(reading, problems),
            self._read_memory(reading, problems),
            self._read_uptime(reading, problems),
        ]
        if not any(found):
            raise SourceError(
                "host", f"nothing readable in {self.root / 'proc'}: is the host's / mounted at {self.root}?"
            )
        root = self.root
        reading.kernel = host_sys.parsed(
            root / "proc/sys/kernel/osrelease", root, host_sys.parse_word, problems
        )
        if reading.kernel is None and self._local:
            reading.kernel = platform.release()
        reading.numa_balancing = host_sys.parsed(
            root / "proc/sys/kernel/numa_balancing", root, parse_numa_balancing, problems
        )
        reading.transparent_hugepage = host_sys.parsed(
            root / "sys/kernel/mm/transparent_hugepage/enabled", root, parse_bracketed, problems
        )
        reading.network = self._read_network(problems)
        reading.disks = self._read_disks(problems)
        reading.infiniband = host_sys.infiniband(root, problems)
        reading.pcie_aer = host_sys.pcie_aer(root, problems)
        return reading

    def _proc(self, relative: str, parse: Callable[[str], T], problems: list[str]) -> tuple[T | None, bool]:
        """(parsed value or None, whether the file could be read at all)."""
        try:
            text = (self.root / relative).read_text()
        except (OSError, UnicodeDecodeError):
            return None, False
        try:
            return parse(text), True
        except ValueError as exc:
            problems.append(f"{relative}: {exc}")
            return None, True

    def _cpu_times(self, problems: list[str]) -> tuple[dict[str, CpuTimes], bool]:
        stat, found = self._proc("proc/stat", parse_stat, problems)
        if not found and self._local:
            stat = _psutil_cpu_times()
            found = stat is not None
        return stat or {}, found

    def _read_cpu(self, reading: HostReading, problems: list[str]) -> bool:

        before, (now, found) = self._cpu_before, self._cpu_times(problems)
        if now:  # a bad read keeps the last good baseline
            self._cpu_before = now
        if "cpu" in now and "cpu" in before:
            reading.cpu_utilization_ratio = utilization(before["cpu"], now["cpu"])
        numbers = sorted(int(name[3:]) for name in now if name != "cpu")
        if not numbers:  # no proc/stat: the cores sysfs knows
            numbers = sorted(
                int(p.name[3:])
                for p in host_sys.list_dir(self.root / "sys/devices/system/cpu")
                if p.name[3:].isdigit() and p.name.startswith("cpu")
            )
        mhz: dict[int, float] | None = None
        for cpu in numbers:
            hz, governor = host_sys.cpufreq(self.root, cpu, problems)
            if hz is None:  # no cpufreq (VMs): x86 cpuinfo's "cpu MHz" is the current frequency
                if mhz is None:
                    mhz, _ = self._proc("proc/cpuinfo", parse_cpuinfo_mhz, problems)
                    mhz = mhz or {}
                hz = mhz[cpu] * 1e6 if cpu in mhz else None
            key = f"cpu{cpu}"
            busy = utilization(before[key], now[key]) if key in before and key in now else None
            reading.cpus.append(CpuCoreReading(cpu, busy, hz, governor))
        reading.cpu_governor = summary_governor(reading.cpus)
        freqs = [c.frequency_hz for c in reading.cpus if c.frequency_hz is not None]
        reading.cpu_frequency_hz = round(sum(freqs) / len(freqs), 1) if freqs else None
        return found

    def _read_load(self, reading: HostReading, problems: list[str]) -> bool:
        load, found = self._proc("proc/loadavg", parse_loadavg, problems)
        if not found and self._local:
            with contextlib.suppress(OSError):
                load, found = os.getloadavg(), True
        if load is not None:
            reading.load1, reading.load5, reading.load15 = load
        return found

    def _read_memory(self, reading: HostReading, problems: list[str]) -> bool:
        mem, found = self._proc("proc/meminfo", lambda t: parse_meminfo(t, MEMINFO_KEYS), problems)
        if not found and self._local:
            mem = _psutil_meminfo()
            found = mem is not None
        if not mem:
            return found
        total, available = mem.get("MemTotal"), mem.get("MemAvailable")
        reading.memory_total_bytes, reading.memory_available_bytes = total, available
        if total is not None and available is not None:
            reading.memory_used_bytes = max(0, total - available)
        swap_total, swap_free = mem.get("SwapTotal"), mem.get("SwapFree")
        reading.swap_total_bytes = swap_total
        if swap_total is not None and swap_free is not None:
            reading.swap_used_bytes = max(0, swap_total - swap_free)
        reading.hugepages_total = mem.get("HugePages_Total")
        reading.hugepages_free = mem.get("HugePages_Free")
        reading.hugepage_size_bytes = mem.get("Hugepagesize")
        return found

    def _read_uptime(self, reading: HostReading, problems: list[str]) -> bool:
        reading.uptime_seconds, found = self._proc("proc/uptime", parse_uptime, problems)
        if not found and self._local:
            with contextlib.suppress(OSError, psutil.Error):
                reading.uptime_seconds, found = round(time.time() - psutil.boot_time(), 2), True
        return found

    def _read_network(self, problems: list[str]) -> list[NetInterfaceReading]:
        # proc/net is the reading process's own network namespace, even under a host root (a pod's
        # without hostNetwork); proc/1/net is the host init's, the host's own interfaces.
        relative = "proc/1/net/dev"
        parsed, found = self._proc(relative, parse_net_dev, problems)
        if not found:
            relative = "proc/net/dev"
            parsed, _ = self._proc(relative, parse_net_dev, problems)
        if parsed is None:
            return []
        interfaces, bad = parsed
        problems.extend(f"{relative}: {p}" for p in bad)
        return [
            NetInterfaceReading(
                name=i.name,
                rx_bytes_total=i.rx_bytes,
                tx_bytes_total=i.tx_bytes,
                rx_packets_total=i.rx_packets,
                tx_packets_total=i.tx_packets,
                rx_errors_total=i.rx_errors,
                tx_errors_total=i.tx_errors,
                rx_dropped_total=i.rx_dropped,
                tx_dropped_total=i.tx_dropped,
            )
            for i in sorted(interfaces, key=lambda i: i.name)
        ]

    def _read_disks(self, problems: list[str]) -> list[DiskReading]:

        whole = host_sys.whole_disks(self.root)
        if not whole:
            return []
        parsed, _ = self._proc("proc/diskstats", lambda t: parse_diskstats(t, whole), problems)
        if parsed is None:
            return []
        disks, bad = parsed
        problems.extend(f"proc/diskstats: {p}" for p in bad)
        return [
            DiskReading(
                name=d.name,
                read_bytes_total=d.read_bytes,
                written_bytes_total=d.written_bytes,
                reads_total=d.reads,
                writes_total=d.writes,
                io_time_seconds_total=d.io_time_seconds,
            )
            for d in sorted(disks, key=lambda d: host_sys.natural_key(d.name))
        ]


def _psutil_cpu_times() -> dict[str, CpuTimes] | None:
    """psutil's CPU times as /proc/stat's, in 1/100 s ticks (this machine only)."""
    try:
        total = psutil.cpu_times()
        per_cpu = psutil.cpu_times(percpu=True)
    except (OSError, psutil.Error):
        return None
    out = {"cpu": _ticks(total)}
    out.update({f"cpu{i}": _ticks(t) for i, t in enumerate(per_cpu)})
    return out


def _ticks(times: Any) -> CpuTimes:
    values = {k: v for k, v in times._asdict().items() if k not in ("guest", "guest_nice")}
    idle = values.get("idle", 0.0) + values.get("iowait", 0.0)
    total = sum(values.values())
    return CpuTimes(busy=round((total - idle) * 100), total=round(total * 100))


def _psutil_meminfo() -> dict[str, int] | None:
    """psutil's memory and swap figures under /proc/meminfo's names (this machine only)."""
    try:
        mem, swap = psutil.virtual_memory(), psutil.swap_memory()
    except (OSError, psutil.Error):
        return None
    return {
        "MemTotal": int(mem.total),
        "MemAvailable": int(mem.available),
        "SwapTotal": int(swap.total),
        "SwapFree": int(swap.free),
    }
