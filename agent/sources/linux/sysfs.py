"""Walkers over the /sys files the host source reads: cpufreq, block devices, InfiniBand, PCIe AER.

Every walker takes the host root and a `problems` list. A file that is missing or unreadable leaves
its value unset without a word (most nodes have no InfiniBand, VMs no cpufreq); text the kernel
would not write leaves it unset too and appends a message naming the file.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from agent.sources.host import InfinibandPortReading, PcieAerReading

T = TypeVar("T")

NVIDIA_PCI_VENDOR = "0x10de"
GPU_PCI_CLASSES = ("0x0300", "0x0302")  # VGA-compatible and 3D controllers

IB_WORD_BYTES = 4  # port_rcv_data / port_xmit_data count 32-bit words (IBA PortCounters)
# Block devices that are not disks.
VIRTUAL_BLOCK_PREFIXES = ("loop", "ram", "zram")
# counters/<file> -> InfinibandPortReading field, for the plain (non-data) counters.
IB_ERROR_COUNTERS = {
    "link_downed": "link_downed_total",
    "symbol_error": "symbol_error_total",
    "port_rcv_errors": "port_rcv_errors_total",
    "link_error_recovery": "link_error_recovery_total",
    "port_xmit_discards": "port_xmit_discards_total",
}
AER_FILES = {
    "aer_dev_correctable": "TOTAL_ERR_COR",
    "aer_dev_nonfatal": "TOTAL_ERR_NONFATAL",
    "aer_dev_fatal": "TOTAL_ERR_FATAL",
}


def read_text(path: Path) -> str | None:
    """The file's text, or None when it is missing or cannot be read (a directory, EIO, EINVAL)."""
    try:
        return path.read_text()
    except (OSError, UnicodeDecodeError):
        return None


def parsed(path: Path, root: Path, parse: Callable[[str], T], problems: list[str]) -> T | None:
    """`parse` of the file's text; None when missing, or when it does not parse (with a message)."""
    text = read_text(path)
    if text is None:
        return None
    try:
        return parse(text)
    except ValueError as exc:
        problems.append(f"{path.relative_to(root)}: {exc}")
        return None


def list_dir(path: Path) -> list[Path]:
    """The entries of a directory, sorted by name; [] when it is missing or unreadable."""
    try:
        return sorted(path.iterdir(), key=lambda p: p.name)
    except OSError:
        return []


def natural_key(name: str) -> tuple[str, int]:
    """ "mlx5_10" after "mlx5_9": the trailing number compared as a number."""
    match = re.fullmatch(r"(.*?)(\d+)", name)
    return (match.group(1), int(match.group(2))) if match else (name, -1)


# -- cpufreq ---------------------------------------------------------------------------------


def parse_khz(text: str) -> float:
    """scaling_cur_freq, in kHz, as Hz."""
    value = text.strip()
    if not value.isdigit():
        raise ValueError(f"{value[:20]!r} is not a frequency in kHz")
    return int(value) * 1000.0


def parse_word(text: str) -> str:
    """A one-word attribute (scaling_governor): "" is not one."""
    value = text.strip()
    if not value or len(value.split()) != 1:
        raise ValueError(f"expected one word, got {value[:40]!r}")
    return value


def cpufreq(root: Path, cpu: int, problems: list[str]) -> tuple[float | None, str]:
    """(scaling_cur_freq in Hz, scaling_governor) of cpuN; (None, "") where cpufreq is absent."""
    base = root / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
    hz = parsed(base / "scaling_cur_freq", root, parse_khz, problems)
    governor = parsed(base / "scaling_governor", root, parse_word, problems)
    return hz, governor or ""


# -- block devices ---------------------------------------------------------------------------


def whole_disks(root: Path) -> set[str] | None:
    """Names of the whole disks (sys/block), as /proc/diskstats spells them; None without sys/block.

    sys/block lists whole devices only (partitions live under them). Names with a slash in
    diskstats (cciss/c0d0) appear there with "!" instead.
    """
    entries = list_dir(root / "sys/block")
    if not entries and not (root / "sys/block").is_dir():
        return None
    return {e.name.replace("!", "/") for e in entries if not e.name.startswith(VIRTUAL_BLOCK_PREFIXES)}


# -- InfiniBand ------------------------------------------------------------------------------


def _numbered(text: str) -> str:
    """The name of a "N: NAME" attribute."""
    number, sep, name = text.strip().partition(":")
    if not sep or not number.strip().isdigit() or not name.strip():
        raise ValueError(f"expected 'N: NAME', got {text.strip()[:40]!r}")
    return name.strip()


def parse_ib_state(text: str) -> str:
    """ports/N/state "4: ACTIVE" -> "active" (NOP, DOWN, INIT, ARMED, ACTIVE, ACTIVE_DEFER)."""
    return _numbered(text).lower()


def parse_ib_phys_state(text: str) -> str:
    """ports/N/phys_state "5: LinkUp" -> "link_up"; "2: Polling" -> "polling"; "7: Phy Test" -> "phy_test"."""
    words = re.sub(r"(?<=[a-z])(?=[A-Z])", " ", _numbered(text))
    return "_".join(words.split()).lower()


def parse_ib_rate(text: str) -> float:
    """ports/N/rate "400 Gb/sec (4X NDR)" -> 400.0; "2.5 Gb/sec (1X SDR)" -> 2.5."""
    match = re.match(r"\s*(\d+(?:\.\d+)?)\s*Gb/sec", text)
    if match is None:
        raise ValueError(f"expected 'N Gb/sec (...)', got {text.strip()[:40]!r}")
    return float(match.group(1))


def parse_counter(text: str) -> int:
    value = text.strip()
    if not value.isdigit():
        raise ValueError(f"{value[:20]!r} is not a counter")
    return int(value)


def infiniband(root: Path, problems: list[str]) -> list[InfinibandPortReading]:
    """Every port of every RDMA device under sys/class/infiniband (InfiniBand and RoCE alike)."""
    out = []
    for device in sorted(list_dir(root / "sys/class/infiniband"), key=lambda p: natural_key(p.name)):
        for port_dir in list_dir(device / "ports"):
            if not port_dir.name.isdigit():
                continue
            out.append(_ib_port(root, device.name, port_dir, problems))
    return out


def _ib_port(root: Path, device: str, port_dir: Path, problems: list[str]) -> InfinibandPortReading:
    layer = parsed(port_dir / "link_layer", root, parse_word, problems)
    port = InfinibandPortReading(
        device=device,
        port=int(port_dir.name),
        link_layer=(layer or "").lower(),
        state=parsed(port_dir / "state", root, parse_ib_state, problems) or "",
        physical_state=parsed(port_dir / "phys_state", root, parse_ib_phys_state, problems) or "",
        rate_gbps=parsed(port_dir / "rate", root, parse_ib_rate, problems),
    )
    counters = port_dir / "counters"
    for name, field in IB_ERROR_COUNTERS.items():
        setattr(port, field, parsed(counters / name, root, parse_counter, problems))
    rcv = parsed(counters / "port_rcv_data", root, parse_counter, problems)
    xmit = parsed(counters / "port_xmit_data", root, parse_counter, problems)
    port.port_rcv_data_bytes_total = None if rcv is None else rcv * IB_WORD_BYTES
    port.port_xmit_data_bytes_total = None if xmit is None else xmit * IB_WORD_BYTES
    return port


# -- PCIe AER --------------------------------------------------------------------------------


def aer_total(key: str) -> Callable[[str], int]:
    """A parser for one aer_dev_* file: the value of its TOTAL_ERR_* line."""

    def parse(text: str) -> int:
        for line in text.splitlines():
            fields = line.split()
            if fields and fields[0] == key:
                if len(fields) != 2 or not fields[1].isdigit():
                    raise ValueError(f"{key}: {' '.join(fields[1:])[:20]!r} is not a count")
                return int(fields[1])
        raise ValueError(f"no {key} line")

    return parse


def pcie_aer(root: Path, problems: list[str]) -> list[PcieAerReading]:
    """AER counters of every PCI device that has them (AER-capable, with the kernel's AER driver)."""
    out = []
    for dev in list_dir(root / "sys/bus/pci/devices"):
        totals = {
            name: parsed(dev / name, root, aer_total(key), problems)
            for name, key in AER_FILES.items()
            if (dev / name).exists()
        }
        if not totals:
            continue
        vendor = (read_text(dev / "vendor") or "").strip()
        pci_class = (read_text(dev / "class") or "").strip()
        out.append(
            PcieAerReading(
                device=dev.name,
                correctable_total=totals.get("aer_dev_correctable"),
                nonfatal_total=totals.get("aer_dev_nonfatal"),
                fatal_total=totals.get("aer_dev_fatal"),
                nvidia_gpu=vendor == NVIDIA_PCI_VENDOR and pci_class.startswith(GPU_PCI_CLASSES),
            )
        )
    return out
