"""Host OS facts and readings: psutil plus files under a configurable host root (/host in a pod).

Issue-level coverage here is basic (CPU, load, memory, governor, uptime); InfiniBand, AER and the
rest arrive with the observability work.
"""

from __future__ import annotations

import os
import platform
import socket
from dataclasses import dataclass
from pathlib import Path

import psutil

from agent.sources.errors import SourceError


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
class HostReading:
    cpu_utilization_ratio: float | None = None
    load1: float | None = None
    memory_used_bytes: int | None = None
    memory_total_bytes: int | None = None
    cpu_governor: str | None = None
    cpu_frequency_hz: float | None = None
    uptime_seconds: float | None = None


NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers


def _read_text(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


class HostSource:
    """Reads the host through psutil and the /proc and /sys trees under `root` ("/" by default)."""

    def __init__(self, root: str | Path = "/") -> None:
        self.root = Path(root)
        # The first cpu_percent call only primes psutil's counters; later calls measure since the last.
        psutil.cpu_percent(interval=None)

    def facts(self) -> HostFacts:
        cpu_model = ""
        cpuinfo = _read_text(self.root / "proc/cpuinfo") or ""
        for line in cpuinfo.splitlines():
            if line.startswith("model name"):
                cpu_model = line.split(":", 1)[1].strip()
                break
        os_name = ""
        os_release = _read_text(self.root / "etc/os-release") or ""
        for line in os_release.splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip().strip("\"'")
        return HostFacts(
            hostname=socket.gethostname(),
            kernel=_read_text(self.root / "proc/sys/kernel/osrelease") or platform.release(),
            os=os_name,
            cpu_count=os.cpu_count() or 0,
            memory_total_bytes=int(psutil.virtual_memory().total),
            host_boot_id=_read_text(self.root / "proc/sys/kernel/random/boot_id") or "",
            cpu_model=cpu_model,
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
            if vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(GPU_PCI_CLASSES):
                count += 1
        return count

    def read(self) -> HostReading:
        try:
            mem = psutil.virtual_memory()
            freq = psutil.cpu_freq()
            reading = HostReading(
                cpu_utilization_ratio=psutil.cpu_percent(interval=None) / 100.0,
                load1=os.getloadavg()[0],
                memory_used_bytes=int(mem.total - mem.available),
                memory_total_bytes=int(mem.total),
                cpu_frequency_hz=freq.current * 1e6 if freq else None,
            )
        except (OSError, psutil.Error) as exc:
            raise SourceError("host", str(exc)) from exc
        reading.cpu_governor = _read_text(self.root / "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor")
        uptime = _read_text(self.root / "proc/uptime")
        if uptime:
            reading.uptime_seconds = float(uptime.split()[0])
        return reading
