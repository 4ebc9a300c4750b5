"""HostSource reads /proc and /sys under its root: a fixture tree here, /host in a pod."""

from __future__ import annotations

import os
import platform
import socket
import time
from pathlib import Path

import psutil
import pytest

from agent.sources.errors import SourceError
from agent.sources.linux.source import HostSource

BOOT_ID = "0e6f8a3c-59c1-4d0b-9d7e-2b7a7cbd1f42"
CPUINFO = """\
processor\t: 0
vendor_id\t: GenuineIntel
cpu family\t: 6
model\t\t: 143
model name\t: Intel(R) Xeon(R) Platinum 8480+
stepping\t: 8
cpu MHz\t\t: 2000.000
flags\t\t: fpu vme de pse tsc msr pae mce cx8 apic sep mtrr avx512f amx_tile

processor\t: 1
vendor_id\t: GenuineIntel
model name\t: Intel(R) Xeon(R) Platinum 8480+
"""
# An Arm server's cpuinfo has no "model name" line at all.
CPUINFO_ARM = """\
processor\t: 0
BogoMIPS\t: 2000.00
Features\t: fp asimd evtstrm aes pmull sha1 sha2 crc32 atomics
CPU implementer\t: 0x41
CPU part\t: 0xd4f
"""
OS_RELEASE = """\
NAME="Ubuntu"
VERSION_ID="22.04"
PRETTY_NAME="Ubuntu 22.04.4 LTS"
ID=ubuntu
"""
GOVERNOR = "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"


def write(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def host_root(tmp_path: Path) -> Path:
    """A node's /proc and /sys as the files the kernel writes (trailing newlines included)."""
    write(tmp_path, "proc/cpuinfo", CPUINFO)
    write(tmp_path, "etc/os-release", OS_RELEASE)
    write(tmp_path, "proc/sys/kernel/osrelease", "5.15.0-105-generic\n")
    write(tmp_path, "proc/sys/kernel/random/boot_id", BOOT_ID + "\n")
    write(tmp_path, GOVERNOR, "performance\n")
    write(tmp_path, "proc/uptime", "350735.47 5234388.90\n")
    return tmp_path


def test_facts_come_from_the_tree(host_root: Path) -> None:
    facts = HostSource(host_root).facts()
    assert facts.cpu_model == "Intel(R) Xeon(R) Platinum 8480+"
    assert facts.os == "Ubuntu 22.04.4 LTS"
    assert facts.kernel == "5.15.0-105-generic"
    assert facts.host_boot_id == BOOT_ID
    # These come from the process's own view (psutil and the OS), not the tree.
    assert facts.hostname == socket.gethostname()
    assert facts.cpu_count == os.cpu_count()
    assert facts.memory_total_bytes == psutil.virtual_memory().total > 0


def test_facts_prefer_the_tree_over_this_machine(host_root: Path) -> None:
    write(
        host_root,
        "proc/stat",
        "cpu  1 0 1 8 0 0 0 0 0 0\n" + "".join(f"cpu{i} 1 0 1 8\n" for i in range(224)),
    )
    write(host_root, "proc/meminfo", "MemTotal:       2113524916 kB\nMemFree:        2000000000 kB\n")
    facts = HostSource(host_root).facts()
    assert facts.cpu_count == 224
    assert facts.memory_total_bytes == 2113524916 * 1024


def test_readings_come_from_the_tree(host_root: Path) -> None:
    reading = HostSource(host_root).read()
    assert reading.cpu_governor == "performance"
    assert reading.uptime_seconds == 350735.47
    assert reading.kernel == "5.15.0-105-generic"
    # Nothing else is in this tree, and it is not this machine's /: psutil does not fill in.
    assert (reading.load1, reading.memory_total_bytes, reading.cpu_utilization_ratio) == (None, None, None)


def test_each_read_sees_the_files_as_they_are_now(host_root: Path) -> None:
    source = HostSource(host_root)
    assert source.read().cpu_governor == "performance"
    write(host_root, GOVERNOR, "powersave\n")  # what the cpu_governor_powersave fault looks like
    write(host_root, "proc/uptime", "350745.50 5234400.00\n")
    reading = source.read()
    assert reading.cpu_governor == "powersave"
    assert reading.uptime_seconds == 350745.5


def test_the_summary_governor_is_the_one_most_cores_run(host_root: Path) -> None:
    # No proc/stat in this tree: the cores are those sysfs lists. cpu0 alone on performance is a
    # powersave host (the summary was cpu0's); a tie goes to the first by name.
    for cpu, governor in enumerate(["performance", "powersave", "powersave", "", "schedutil"]):
        write(host_root, f"sys/devices/system/cpu/cpu{cpu}/cpufreq/scaling_governor", f"{governor}\n")
    source = HostSource(host_root)
    reading = source.read()
    assert [c.governor for c in reading.cpus] == ["performance", "powersave", "powersave", "", "schedutil"]
    assert reading.cpu_governor == "powersave"
    write(host_root, "sys/devices/system/cpu/cpu1/cpufreq/scaling_governor", "schedutil\n")
    assert source.read().cpu_governor == "schedutil"  # schedutil 2, performance 1, powersave 1
    write(host_root, "sys/devices/system/cpu/cpu2/cpufreq/scaling_governor", "performance\n")
    assert source.read().cpu_governor == "performance"  # 2 and 2: the first by name


def test_an_empty_root_gives_blank_facts_and_a_failed_read(tmp_path: Path) -> None:
    source = HostSource(tmp_path)
    facts = source.facts()
    assert (facts.cpu_model, facts.os, facts.host_boot_id) == ("", "", "")
    assert facts.kernel == platform.release()  # the running kernel when the tree does not say
    assert facts.memory_total_bytes == psutil.virtual_memory().total  # facts fall back to this machine
    with pytest.raises(SourceError, match=r"nothing readable in .*proc: is the host's / mounted at"):
        source.read()


def test_a_root_that_does_not_exist_fails_the_read_only(tmp_path: Path) -> None:
    source = HostSource(tmp_path / "not-mounted")
    assert source.facts().host_boot_id == ""
    with pytest.raises(SourceError, match="not-mounted"):
        source.read()


def test_an_empty_proc_fails_the_read(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()  # mounted, but nothing in it
    with pytest.raises(SourceError):
        HostSource(tmp_path).read()


def test_unreadable_entries_count_as_missing(host_root: Path) -> None:
    # A directory where a file should be (a wrong mount) raises IsADirectoryError on read.
    for relative in ("proc/cpuinfo", "proc/sys/kernel/random/boot_id", GOVERNOR):
        path = host_root / relative
        path.unlink()
        path.mkdir()
    source = HostSource(host_root)
    facts = source.facts()
    assert (facts.cpu_model, facts.host_boot_id) == ("", "")
    reading = source.read()
    assert reading.cpu_governor is None
    assert reading.uptime_seconds == 350735.47
    assert source.last_errors() == []  # unreadable is not garbage: nothing to report


def test_psutil_stands_in_for_missing_proc_files_on_this_machine(tmp_path: Path) -> None:
    (tmp_path / "proc").mkdir()
    source = HostSource(tmp_path, psutil_fallback=True)  # what root="/" gets
    time.sleep(0.05)
    reading = source.read()
    assert reading.memory_total_bytes == psutil.virtual_memory().total
    assert (
        reading.memory_used_bytes is not None and 0 < reading.memory_used_bytes < reading.memory_total_bytes
    )
    assert reading.load1 is not None and reading.load15 is not None and reading.load1 >= 0.0
    assert reading.uptime_seconds is not None and reading.uptime_seconds > 0
    assert len(reading.cpus) == len(psutil.cpu_times(percpu=True))
    assert reading.kernel == platform.release()


def test_the_root_slash_reads_this_machine() -> None:
    reading = HostSource("/").read()
    assert reading.memory_total_bytes is not None and reading.memory_total_bytes > 0
    assert reading.load1 is not None and reading.uptime_seconds is not None
    assert len(reading.cpus) == len(psutil.cpu_times(percpu=True))  # the online CPUs


def test_an_empty_uptime_file_gives_none(host_root: Path) -> None:
    write(host_root, "proc/uptime", "")
    assert HostSource(host_root).read().uptime_seconds is None


def test_cpuinfo_without_a_model_name(tmp_path: Path) -> None:
    write(tmp_path, "proc/cpuinfo", CPUINFO_ARM)
    write(tmp_path, "etc/os-release", 'NAME="Rocky Linux"\nID=rocky\n')  # and no PRETTY_NAME
    facts = HostSource(tmp_path).facts()
    assert facts.cpu_model == ""
    assert facts.os == ""


def test_the_first_model_name_wins(tmp_path: Path) -> None:
    write(
        tmp_path,
        "proc/cpuinfo",
        CPUINFO.replace("model name\t: Intel", "model name\t: AMD EPYC 9654 / Intel", 1),
    )
    assert HostSource(tmp_path).facts().cpu_model == "AMD EPYC 9654 / Intel(R) Xeon(R) Platinum 8480+"


def pci_device(root: Path, address: str, vendor: str, pci_class: str) -> None:
    write(root, f"sys/bus/pci/devices/{address}/vendor", vendor + "\n")
    write(root, f"sys/bus/pci/devices/{address}/class", pci_class + "\n")


def test_nvidia_gpus_are_counted_from_the_pci_bus(host_root: Path) -> None:
    # An HGX board: 8 H100s (3D controllers), 4 NVSwitches (bridges), a NIC and the BMC's VGA.
    for i in range(8):
        pci_device(host_root, f"0000:{0x18 + i:02x}:00.0", "0x10de", "0x030200")
    for i in range(4):
        pci_device(host_root, f"0000:{0x05 + i:02x}:00.0", "0x10de", "0x068000")
    pci_device(host_root, "0000:0c:00.0", "0x15b3", "0x020700")  # Mellanox ConnectX
    pci_device(host_root, "0000:03:00.0", "0x1a03", "0x030000")  # ASPEED BMC display
    assert HostSource(host_root).facts().nvidia_gpu_pci_count == 8


def test_no_pci_tree_means_unknown_not_zero(host_root: Path) -> None:
    assert HostSource(host_root).facts().nvidia_gpu_pci_count is None
    (host_root / "sys/bus/pci/devices").mkdir(parents=True)
    assert HostSource(host_root).facts().nvidia_gpu_pci_count == 0
