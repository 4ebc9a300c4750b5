"""Host faults: an OS setting left where a GPU node should not have it. Each changes the simulated
host's condition (sim/host.py), which its readings and CPU frequency model follow."""

from __future__ import annotations

import random
from typing import TYPE_CHECKING

from agent.sources.sim.faults.registry import register

if TYPE_CHECKING:
    from agent.sources.sim.host import SimHost


@register(
    "cpu_governor_powersave",
    "host",
    cause="cpu_governor_powersave",
    description="cpufreq governor left on powersave: every core near 1.2 GHz, host-bound work slower",
    shows_in=("cpu_governor", "cpu_governors", "cpus.governor", "cpu_frequency_hz", "cpus.frequency_hz"),
)
def _cpu_governor_powersave(host: SimHost, _: str | None, rng: random.Random) -> None:
    host.condition.governor = "powersave"


@register(
    "numa_balancing_on",
    "host",
    cause="host_tuning_drift",
    description="kernel.numa_balancing=1: the kernel migrates the job's pages between sockets",
    shows_in=("numa_balancing",),
)
def _numa_balancing_on(host: SimHost, _: str | None, rng: random.Random) -> None:
    host.condition.numa_balancing = True


@register(
    "thp_disabled",
    "host",
    cause="host_tuning_drift",
    description="transparent hugepages set to never where the profile wants them (madvise/always)",
    shows_in=("transparent_hugepage",),
)
def _thp_disabled(host: SimHost, _: str | None, rng: random.Random) -> None:
    if host.profile.transparent_hugepage == "never":
        raise ValueError("fault thp_disabled: this host's profile already has transparent hugepages off")
    host.condition.transparent_hugepage = "never"


# A newer branch than the fleet's driver (sim/profile.py DRIVER_VERSION), as a rolling upgrade
# brings to some nodes first.
NEWER_DRIVER = "560.35.03"


@register(
    "driver_branch_slow",
    "host",
    cause="driver_branch_slow",
    description="a newer driver branch loaded whose GEMM kernels run 8-15% slower on these GPUs",
    shows_in=("inventory.driver_version", "probe.gemm"),
)
def _driver_branch_slow(host: SimHost, _: str | None, rng: random.Random) -> None:
    host.node.load_driver(NEWER_DRIVER, gemm_factor=rng.uniform(0.85, 0.92))
