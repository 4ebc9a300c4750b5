"""Parsers for the /proc files the host source reads: pure functions over the files' text.

Each takes what the kernel wrote and returns plain values; text the kernel would not write raises
ValueError naming what is wrong, so the caller can leave that field unset and say why.
"""

from __future__ import annotations

from dataclasses import dataclass

KIB = 1024
SECTOR_BYTES = 512  # /proc/diskstats counts 512-byte sectors whatever the device's block size


@dataclass(frozen=True, slots=True)
class CpuTimes:
    """One `cpu` line of /proc/stat reduced to what utilisation needs, in USER_HZ ticks."""

    busy: int
    total: int


def _ints(fields: list[str], what: str) -> list[int]:
    try:
        return [int(f) for f in fields]
    except ValueError:
        raise ValueError(f"{what}: expected numbers, got {' '.join(fields)!r}") from None


def cpu_times(values: list[int]) -> CpuTimes:
    """Busy and total ticks from user nice system idle [iowait irq softirq steal guest guest_nice].

    guest and guest_nice are already counted in user and nice, so they are left out of the total;
    idle and iowait are the idle share.
    """
    if len(values) < 4:
        raise ValueError(f"a cpu line needs at least 4 counters, got {len(values)}")
    counted = values[:8]
    total = sum(counted)
    idle = counted[3] + (counted[4] if len(counted) > 4 else 0)
    return CpuTimes(busy=total - idle, total=total)


def parse_stat(text: str) -> dict[str, CpuTimes]:
    """The `cpu` (all cores) and `cpuN` lines of /proc/stat, keyed "cpu", "cpu0", "cpu1", ..."""
    out: dict[str, CpuTimes] = {}
    for line in text.splitlines():
        if not line.startswith("cpu"):
            continue
        name, *fields = line.split()
        if name != "cpu" and not name[3:].isdigit():
            raise ValueError(f"unexpected line {line[:40]!r}")
        out[name] = cpu_times(_ints(fields, name))
    if "cpu" not in out:
        raise ValueError("no 'cpu' line")
    return out


def utilization(before: CpuTimes, after: CpuTimes) -> float | None:
    """Busy share of the ticks between two reads; None when no tick passed (or the counters went back)."""
    total = after.total - before.total
    if total <= 0:
        return None
    busy = after.busy - before.busy
    return round(min(1.0, max(0.0, busy / total)), 4)


def parse_loadavg(text: str) -> tuple[float, float, float]:
    """(load1, load5, load15) from "0.15 0.18 0.11 1/86 28162"."""
    fields = text.split()
    if len(fields) < 3:
        raise ValueError(f"expected three load averages, got {text.strip()[:40]!r}")
    try:
        one, five, fifteen = (float(f) for f in fields[:3])
    except ValueError:
        raise ValueError(f"load averages are not numbers: {' '.join(fields[:3])!r}") from None
    return one, five, fifteen


def parse_meminfo(text: str, keys: tuple[str, ...]) -> dict[str, int]:
    """The `keys` present in /proc/meminfo: kB values in bytes, counts (HugePages_*) as they are.

    Only the keys asked for are checked, so a line a newer kernel adds never spoils the rest.
    """
    out: dict[str, int] = {}
    for line in text.splitlines():
        key, sep, rest = line.partition(":")
        key = key.strip()
        if not sep or key not in keys:
            continue
        fields = rest.split()
        if not fields or not fields[0].isdigit() or fields[1:] not in ([], ["kB"]):
            raise ValueError(f"{key}: {rest.strip()[:40]!r} is not a number (of kB)")
        out[key] = int(fields[0]) * (KIB if fields[1:] else 1)
    return out


def parse_uptime(text: str) -> float:
    """Seconds since boot: the first number of /proc/uptime."""
    fields = text.split()
    if not fields:
        raise ValueError("empty")
    try:
        return float(fields[0])
    except ValueError:
        raise ValueError(f"{fields[0]!r} is not a number of seconds") from None


def parse_bracketed(text: str) -> str:
    """The selected choice of a sysfs choice file: "madvise" from "always [madvise] never"."""
    for word in text.split():
        if word.startswith("[") and word.endswith("]") and len(word) > 2:
            return word[1:-1]
    raise ValueError(f"no [selected] choice in {text.strip()[:60]!r}")


def parse_numa_balancing(text: str) -> bool:
    """kernel.numa_balancing: 0 off; 1 (normal) or 2 (memory tiering, 6.0+) or 3 (both) on."""
    value = text.strip()
    if not value.isdigit():
        raise ValueError(f"{value[:20]!r} is not a number")
    return int(value) != 0


@dataclass(frozen=True, slots=True)
class NetCounters:
    name: str
    rx_bytes: int
    rx_packets: int
    rx_errors: int
    rx_dropped: int
    tx_bytes: int
    tx_packets: int
    tx_errors: int
    tx_dropped: int


def parse_net_dev(text: str) -> tuple[list[NetCounters], list[str]]:
    """The interfaces of /proc/net/dev (loopback left out) and a message per line that did not parse.

    Columns after "name:" are rx bytes packets errs drop fifo frame compressed multicast, then tx
    bytes packets errs drop fifo colls carrier compressed. Large counters can run into the colon.
    """
    out: list[NetCounters] = []
    problems: list[str] = []
    for line in text.splitlines()[2:]:  # two header lines
        name, sep, rest = line.rpartition(":")
        name = name.strip()
        if not sep or not name:
            if line.strip():
                problems.append(f"unexpected line {line.strip()[:40]!r}")
            continue
        if name == "lo":
            continue
        fields = rest.split()
        try:
            if len(fields) < 16:
                raise ValueError(f"{name}: expected 16 counters, got {len(fields)}")
            v = _ints(fields[:16], name)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        out.append(NetCounters(name, v[0], v[1], v[2], v[3], v[8], v[9], v[10], v[11]))
    return out, problems


@dataclass(frozen=True, slots=True)
class DiskCounters:
    name: str
    reads: int
    read_bytes: int
    writes: int
    written_bytes: int
    io_time_seconds: float


def parse_diskstats(text: str, whole: set[str]) -> tuple[list[DiskCounters], list[str]]:
    """The devices of /proc/diskstats whose name is in `whole` (the whole disks), and problems.

    Columns after "major minor name": reads merged sectors_read ms_reading writes merged
    sectors_written ms_writing in_flight ms_doing_io ... (kernel Documentation/admin-guide/iostats).
    """
    out: list[DiskCounters] = []
    problems: list[str] = []
    for line in text.splitlines():
        fields = line.split()
        if not fields:
            continue
        if len(fields) < 3:
            problems.append(f"unexpected line {line.strip()[:40]!r}")
            continue
        name = fields[2]
        if name not in whole:
            continue
        try:
            if len(fields) < 14:
                raise ValueError(f"{name}: expected at least 11 counters, got {len(fields) - 3}")
            v = _ints(fields[3:14], name)
        except ValueError as exc:
            problems.append(str(exc))
            continue
        out.append(
            DiskCounters(
                name=name,
                reads=v[0],
                read_bytes=v[2] * SECTOR_BYTES,
                writes=v[4],
                written_bytes=v[6] * SECTOR_BYTES,
                io_time_seconds=v[9] / 1000.0,
            )
        )
    return out, problems


def parse_cpuinfo_mhz(text: str) -> dict[int, float]:
    """Each processor's "cpu MHz" (x86 only; the current frequency where cpufreq is absent, as in VMs)."""
    out: dict[int, float] = {}
    processor: int | None = None
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key == "processor" and value.isdigit():
            processor = int(value)
        elif key == "cpu MHz" and processor is not None:
            try:
                out[processor] = float(value)
            except ValueError:
                raise ValueError(f"processor {processor}: cpu MHz {value!r} is not a number") from None
    return out


def parse_cpuinfo_model(text: str) -> str:
    """The first "model name" (x86); "" where the file has none (Arm servers)."""
    for line in text.splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return ""
