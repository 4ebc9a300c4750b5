"""A temp tree shaped like the kernel's files the OS actuators touch, and ways to compare trees."""

from __future__ import annotations

from pathlib import Path

from agent.tuning.targets import OsTargets

THP = "sys/kernel/mm/transparent_hugepage"
CPU = "sys/devices/system/cpu"
SWAPPINESS = "proc/sys/vm/swappiness"
NR_HUGEPAGES = "proc/sys/vm/nr_hugepages"

# Six changes from make_host's defaults: two governors, two sysctls, THP enabled, hugepages.
TARGET = OsTargets(
    cpu_governor="performance",
    sysctls={"vm.swappiness": 10, "kernel.numa_balancing": 0, "vm.zone_reclaim_mode": 0},
    thp_enabled="always",
    thp_defrag="madvise",
    hugepages=16,
)


def make_host(root: Path, cpus: int = 2, hugepages: int = 0) -> Path:
    files = {
        SWAPPINESS: "60",
        "proc/sys/kernel/numa_balancing": "1",
        "proc/sys/vm/zone_reclaim_mode": "0",
        "proc/sys/vm/dirty_ratio": "20",
        NR_HUGEPAGES: str(hugepages),
        f"{THP}/enabled": "always [madvise] never",
        f"{THP}/defrag": "always defer defer+madvise [madvise] never",
    }
    for cpu in range(cpus):
        files[f"{CPU}/cpu{cpu}/cpufreq/scaling_governor"] = "powersave"
        files[f"{CPU}/cpu{cpu}/cpufreq/scaling_available_governors"] = "performance powersave"
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
    return root


def contents(root: Path) -> dict[str, bytes]:
    """Every file's bytes, by path relative to the root."""
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def stamps(root: Path) -> dict[str, tuple[int, int]]:
    """Every path's (mtime_ns, size): any write shows here even when it wrote the same bytes."""
    return {str(p.relative_to(root)): (p.stat().st_mtime_ns, p.stat().st_size) for p in root.rglob("*")}
