"""The simulator's side of the tuning actuators: the settings they change live on the simulated
GPU's and host's conditions, so a fix changes what the next read and probe see.

`SimGpuControl` is GpuControl (agent/tuning/gpu_control.py) over a SimNode's GPUs, refusing what
NVML refuses: a value outside the board's constraints (INVALID_ARGUMENT) or a GPU off the bus
(GPU_IS_LOST). `SimHostTree` is the host tree (agent/tuning/base.py) of a SimHost: the kernel files
the OS actuators read and write, answered from and written to the host's condition, refusing with
EINVAL what the kernel refuses, so the actuators run against the simulator unchanged.
"""

from __future__ import annotations

import errno
import math
import os
from fnmatch import fnmatchcase
from pathlib import Path

from agent.sources.sim.gpu import COMPUTE_MODES, SimGpu
from agent.sources.sim.host import SimHost
from agent.sources.sim.node import SimNode
from agent.sources.sim.profile import H100_SXM
from agent.tuning.base import Tree, TuningError, translate
from agent.tuning.gpu_control import NOT_LOCKED, ClockDomain, PowerLimits, clock_text
from agent.tuning.os_settings import NR_HUGEPAGES, THP_DIR, Sysctls
from agent.tuning.targets import SYSCTLS

# Base SM clock by board (NVIDIA's H100 SXM5 datasheet: base 1590 MHz, boost 1980 MHz).
BASE_CLOCKS_MHZ = {H100_SXM.name: 1590}


def _mhz(hz: float) -> int:
    return round(hz / 1e6)


class SimGpuControl:
    """GpuControl over `node`'s GPUs. The sim has no cap but the management limit, so it is also
    the enforced one; a clock lock caps the SM clock at its max (power and heat may still hold it
    lower). Settings last until `node.reboot()`, which loses them as a real reboot does."""

    def __init__(self, node: SimNode) -> None:
        self.node = node

    def gpus(self) -> list[int]:
        return [gpu.index for gpu in self.node.gpus]

    def _gpu(self, index: int) -> SimGpu:
        if not 0 <= index < len(self.node.gpus):
            raise TuningError(f"gpu {index}: no such GPU (the node has 0..{len(self.node.gpus) - 1})")
        gpu = self.node.gpus[index]
        if gpu.condition.lost:
            raise TuningError(f"gpu {index}: GPU is lost (fallen off the bus)")
        return gpu

    def persistence(self, gpu: int) -> bool:
        return self._gpu(gpu).condition.persistence_mode

    def set_persistence(self, gpu: int, on: bool) -> None:
        self._gpu(gpu).condition.persistence_mode = on

    def power_limits(self, gpu: int) -> PowerLimits:
        g = self._gpu(gpu)
        p = g.profile
        watts = g.power_limit_watts
        return PowerLimits(
            watts, watts, p.default_power_limit_watts, p.min_power_limit_watts, p.max_power_limit_watts
        )

    def set_power_limit(self, gpu: int, watts: float) -> None:
        g = self._gpu(gpu)
        p = g.profile
        if not p.min_power_limit_watts <= watts <= p.max_power_limit_watts:
            raise TuningError(
                f"gpu {gpu}: {watts:g} W refused: outside "
                f"{p.min_power_limit_watts:g}..{p.max_power_limit_watts:g} W"
            )
        g.condition.power_limit_watts = None if watts == p.default_power_limit_watts else float(watts)

    def locked_clocks(self, gpu: int, domain: ClockDomain) -> str:
        c = self._gpu(gpu).condition
        if domain == "memory":
            return (
                NOT_LOCKED if c.locked_memory_clocks_mhz is None else clock_text(*c.locked_memory_clocks_mhz)
            )
        if c.locked_sm_clock_hz is None:
            return NOT_LOCKED
        low = c.locked_sm_clock_min_hz or c.locked_sm_clock_hz
        return clock_text(_mhz(low), _mhz(c.locked_sm_clock_hz))

    def supported_clocks(self, gpu: int, domain: ClockDomain) -> list[int]:
        p = self._gpu(gpu).profile
        if domain == "memory":
            return [_mhz(p.memory_clock_hz)]  # HBM runs at one clock
        return list(range(_mhz(p.max_sm_clock_hz), _mhz(p.min_sm_clock_hz) - 1, -_mhz(p.clock_step_hz)))

    def base_clock(self, gpu: int) -> int | None:
        return BASE_CLOCKS_MHZ.get(self._gpu(gpu).profile.name)

    def lock_clocks(self, gpu: int, domain: ClockDomain, min_mhz: int, max_mhz: int) -> None:
        supported = self.supported_clocks(gpu, domain)
        low, high = min(supported), max(supported)
        if not low <= min_mhz <= max_mhz <= high:
            raise TuningError(
                f"gpu {gpu}: {domain} clocks {min_mhz}..{max_mhz} MHz refused: "
                f"{'min above max' if min_mhz > max_mhz else f'outside {low}..{high} MHz'}"
            )
        c = self._gpu(gpu).condition
        if domain == "memory":
            c.locked_memory_clocks_mhz = (min_mhz, max_mhz)
        else:
            c.locked_sm_clock_min_hz, c.locked_sm_clock_hz = min_mhz * 1e6, max_mhz * 1e6

    def reset_clocks(self, gpu: int, domain: ClockDomain) -> None:
        c = self._gpu(gpu).condition
        if domain == "memory":
            c.locked_memory_clocks_mhz = None
        else:
            c.locked_sm_clock_min_hz = c.locked_sm_clock_hz = None

    def compute_mode(self, gpu: int) -> str:
        return self._gpu(gpu).condition.compute_mode

    def set_compute_mode(self, gpu: int, mode: str) -> None:
        c = self._gpu(gpu).condition
        if mode not in COMPUTE_MODES:
            raise TuningError(
                f"gpu {gpu}: compute mode {mode!r} refused: not one of {', '.join(COMPUTE_MODES)}"
            )
        c.compute_mode = mode

    def ecc(self, gpu: int) -> tuple[bool, bool]:
        c = self._gpu(gpu).condition
        return c.ecc_enabled, c.ecc_pending

    def set_ecc(self, gpu: int, on: bool) -> None:
        self._gpu(gpu).condition.ecc_pending = on

    def close(self) -> None:
        """Nothing to release."""


# The host's kernel files. intel_pstate (active mode, as a DGX H100's kernel runs it) offers two
# governors; the THP choice files list what kernel 5.15 takes.
GOVERNORS = ("performance", "powersave")
CPUFREQ = "sys/devices/system/cpu/cpu{}/cpufreq"
THP_CHOICES = {
    "enabled": ("always", "madvise", "never"),
    "defrag": ("always", "defer", "defer+madvise", "madvise", "never"),
}
NUMA_BALANCING = "kernel.numa_balancing"


class SimHostTree(Tree):
    """The kernel files of `host` under a root of its own (/sim/<node>; nothing is on disk).

    cpufreq lists each simulated CPU; a write sets that CPU's governor (SimHost.set_governor).
    kernel.numa_balancing and THP `enabled` are the host's condition, stored as None (the profile's
    value) when written back to the profile's value; the other allowlisted sysctls hold the
    kernel's defaults until written; nr_hugepages allocates no more than free memory beside a full
    job holds. A write the kernel would refuse (a word the file does not list, a number outside
    the sysctl's range) raises EINVAL; a read-only file EACCES; a missing one ENOENT.
    """

    _CPU_FILES = ("scaling_governor", "scaling_available_governors")

    def __init__(self, host: SimHost) -> None:
        super().__init__(Path("/sim") / host.node.node)
        self.host = host
        p = host.profile
        memory_kb = p.memory_total_bytes // 1024
        # Each sysctl's default and the range the kernel takes (proc_dointvec_minmax's bounds).
        self.sysctls: dict[str, tuple[int, int, int]] = {
            NUMA_BALANCING: (int(p.numa_balancing), 0, 1),
            "kernel.sched_autogroup_enabled": (1, 0, 1),
            "vm.swappiness": (60, 0, 200),
            "vm.zone_reclaim_mode": (0, 0, 2**31 - 1),
            "vm.dirty_ratio": (20, 0, 100),
            "vm.dirty_background_ratio": (10, 0, 100),
            "vm.min_free_kbytes": (min(262144, max(128, math.isqrt(memory_kb * 16))), 0, 2**31 - 1),
        }
        free = p.memory_total_bytes - p.memory_base_bytes - p.memory_job_bytes
        self.hugepages_cap = free // p.hugepage_size_bytes
        cpus = [f"{CPUFREQ.format(cpu)}/{name}" for cpu in range(host.cpu_count) for name in self._CPU_FILES]
        self._sysctl_files = {Sysctls.path(name): name for name in SYSCTLS}
        thp = (f"{THP_DIR}/{key}" for key in THP_CHOICES)
        self._files = {*cpus, *self._sysctl_files, *thp, NR_HUGEPAGES}

    def exists(self, rel: str) -> bool:
        return rel in self._files

    def glob(self, pattern: str) -> list[str]:
        wanted = pattern.split("/")
        return sorted(
            rel
            for rel in self._files
            if len(parts := rel.split("/")) == len(wanted)
            and all(fnmatchcase(a, b) for a, b in zip(parts, wanted, strict=True))
        )

    def check_writable(self, rel: str) -> None:
        refused = self._unwritable(rel)
        if refused is not None:
            raise translate(refused, rel, "write")

    def _unwritable(self, rel: str) -> OSError | None:
        if rel not in self._files:
            return FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), rel)
        if rel.endswith("scaling_available_governors"):
            return PermissionError(errno.EACCES, os.strerror(errno.EACCES), rel)
        return None

    def _read(self, rel: str) -> str:
        if rel not in self._files:
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), rel)
        c, p = self.host.condition, self.host.profile
        if rel.endswith("scaling_governor"):
            text = self.host.governor(_cpu(rel))
        elif rel.endswith("scaling_available_governors"):
            text = " ".join(GOVERNORS)
        elif rel in self._sysctl_files:
            name = self._sysctl_files[rel]
            if name == NUMA_BALANCING:
                text = str(int(p.numa_balancing if c.numa_balancing is None else c.numa_balancing))
            else:
                text = str(c.sysctls.get(name, self.sysctls[name][0]))
        elif rel == NR_HUGEPAGES:
            text = str(c.hugepages)
        else:
            key = rel.rsplit("/", 1)[1]
            now = (c.transparent_hugepage or p.transparent_hugepage) if key == "enabled" else c.thp_defrag
            text = " ".join(f"[{w}]" if w == now else w for w in THP_CHOICES[key])
        return text + "\n"

    def _write(self, rel: str, value: str) -> None:
        refused = self._unwritable(rel)
        if refused is not None:
            raise refused
        word, c, p = value.strip(), self.host.condition, self.host.profile
        if rel.endswith("scaling_governor"):
            self.host.set_governor(_cpu(rel), _choice(word, GOVERNORS))
        elif rel in self._sysctl_files:
            name = self._sysctl_files[rel]
            default, low, high = self.sysctls[name]
            number = _number(word, low, high)
            if name == NUMA_BALANCING:
                c.numa_balancing = None if bool(number) == p.numa_balancing else bool(number)
            elif number == default:
                c.sysctls.pop(name, None)
            else:
                c.sysctls[name] = number
        elif rel == NR_HUGEPAGES:
            c.hugepages = min(_number(word, 0, 2**63 - 1), self.hugepages_cap)
        elif rel.endswith("/enabled"):
            mode = _choice(word, THP_CHOICES["enabled"])
            c.transparent_hugepage = None if mode == p.transparent_hugepage else mode
        else:
            c.thp_defrag = _choice(word, THP_CHOICES["defrag"])


def _cpu(rel: str) -> int:
    """sys/devices/system/cpu/cpu12/cpufreq/... -> 12"""
    return int(rel.split("/")[4].removeprefix("cpu"))


def _einval() -> OSError:
    return OSError(errno.EINVAL, os.strerror(errno.EINVAL))


def _choice(word: str, choices: tuple[str, ...]) -> str:
    if word not in choices:
        raise _einval()
    return word


def _number(word: str, low: int, high: int) -> int:
    if not word.lstrip("-").isdigit() or not low <= int(word) <= high:
        raise _einval()
    return int(word)
