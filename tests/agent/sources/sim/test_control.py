"""The settings the tuning actuators change live on the simulated GPU and host: a fix changes the
simulated state, and the next read and probe see it (GPU through SimGpuControl, OS through the
real actuators on SimHostTree)."""

from __future__ import annotations

import copy
import errno
from collections.abc import Callable
from pathlib import Path

import pytest

from agent.sources.gpu import GpuReading
from agent.sources.sim import FaultSpec, HostCondition, SimHost, SimNode
from agent.sources.sim.control import SimGpuControl, SimHostTree
from agent.sources.sim.probes import ModelledProbes
from agent.tuning.apply import apply_settings
from agent.tuning.base import TuningError
from agent.tuning.os_settings import CPUFREQ_GLOB, NR_HUGEPAGES, os_actuators
from agent.tuning.targets import OsTargets
from protos.names import clock_event_reason_names

GPU = 3
NOW = 1_800_000_000.0
FIX = OsTargets(cpu_governor="performance", sysctls={"kernel.numa_balancing": 0}, thp_enabled="madvise")
HOST_FAULTS = ("cpu_governor_powersave", "numa_balancing_on")
NUMA = "proc/sys/kernel/numa_balancing"
Refused = Callable[[SimGpuControl], object]


def node(*faults: str, seed: int = 7) -> SimNode:
    specs = [FaultSpec(f, GPU if f not in HOST_FAULTS else None) for f in faults]
    return SimNode("node-a", faults=specs, seed=seed, clock=lambda: NOW)


def steady(sim: SimNode, gpu: int = GPU) -> GpuReading:
    return sim.reading(gpu, 0.95, NOW)


def reasons(reading: GpuReading) -> set[str]:
    return set(clock_event_reason_names(reading.clock_event_reasons or 0))


def gemm(sim: SimNode, gpu: int = GPU) -> dict[str, float]:
    return {o.variant: o.value for o in ModelledProbes(sim).run(["gemm"], gpus=[gpu])}


def near(fixed: dict[str, float], healthy: dict[str, float], tol: float = 0.02) -> bool:
    return fixed.keys() == healthy.keys() and all(abs(fixed[k] / healthy[k] - 1) <= tol for k in healthy)


# GPU


def test_restoring_the_default_power_limit_lifts_the_power_cap() -> None:
    sim, healthy = node("power_cap"), node()
    control = SimGpuControl(sim)
    limits = control.power_limits(GPU)
    assert limits.current_watts == limits.enforced_watts == sim.gpus[GPU].condition.power_limit_watts
    assert (limits.default_watts, limits.min_watts, limits.max_watts) == (700, 200, 700)
    assert limits.current_watts < 450 and "sw_power_cap" in reasons(steady(sim))
    assert steady(sim).power_management_limit_watts == limits.current_watts
    assert not near(gemm(sim), gemm(healthy), tol=0.05)

    control.set_power_limit(GPU, limits.default_watts)
    assert sim.gpus[GPU].condition.power_limit_watts is None
    reading = steady(sim)
    assert "sw_power_cap" not in reasons(reading)
    assert reading.power_management_limit_watts == reading.enforced_power_limit_watts == 700
    assert near(gemm(sim), gemm(healthy))


def test_resetting_locked_clocks_frees_the_sm_clock() -> None:
    sim, healthy = node("clocks_locked_low"), node()
    control = SimGpuControl(sim)
    locked = round((sim.gpus[GPU].condition.locked_sm_clock_hz or 0) / 1e6)
    assert control.locked_clocks(GPU, "gpu") == f"{locked}..{locked}"
    assert control.locked_clocks(GPU, "memory") == "reset"
    reading = steady(sim)
    assert (
        "applications_clocks_setting" in reasons(reading) and reading.applications_sm_clock_hz == locked * 1e6
    )
    assert not near(gemm(sim), gemm(healthy), tol=0.05)

    control.reset_clocks(GPU, "gpu")
    assert control.locked_clocks(GPU, "gpu") == "reset"
    reading = steady(sim)
    assert "applications_clocks_setting" not in reasons(reading)
    assert reading.applications_sm_clock_hz == reading.max_sm_clock_hz
    assert near(gemm(sim), gemm(healthy))


def test_a_lock_set_through_the_control_holds_the_clock_and_reads_back() -> None:
    sim, healthy = node(), node()
    control = SimGpuControl(sim)
    clocks = control.supported_clocks(0, "gpu")
    assert (clocks[0], clocks[-1], clocks[0] - clocks[1]) == (1980, 345, 15)
    assert control.supported_clocks(0, "memory") == [2619] and control.base_clock(0) == 1590
    control.lock_clocks(0, "gpu", 1200, 1590)
    control.lock_clocks(0, "memory", 2619, 2619)
    assert (control.locked_clocks(0, "gpu"), control.locked_clocks(0, "memory")) == (
        "1200..1590",
        "2619..2619",
    )
    reading = steady(sim, 0)
    assert reading.sm_clock_hz == reading.applications_sm_clock_hz == 1590e6
    assert "applications_clocks_setting" in reasons(reading)
    assert near(gemm(sim, 0), {k: v * 1590 / 1980 for k, v in gemm(healthy, 0).items()})


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda c: c.set_power_limit(0, 50), "gpu 0: 50 W refused: outside 200..700 W"),
        (lambda c: c.set_power_limit(0, 701), "gpu 0: 701 W refused: outside 200..700 W"),
        (lambda c: c.lock_clocks(0, "gpu", 300, 1200), "gpu 0: gpu clocks 300..1200 MHz refused: outside"),
        (lambda c: c.lock_clocks(0, "gpu", 1500, 1200), "refused: min above max"),
        (lambda c: c.lock_clocks(0, "memory", 1593, 2619), "outside 2619..2619 MHz"),
        (lambda c: c.set_compute_mode(0, "exclusive_thread"), "compute mode 'exclusive_thread' refused"),
        (lambda c: c.power_limits(8), "gpu 8: no such GPU"),
    ],
)
def test_what_nvml_refuses_is_refused_and_changes_nothing(call: Refused, message: str) -> None:
    sim = node()
    before = copy.deepcopy([g.condition for g in sim.gpus])
    with pytest.raises(TuningError, match=message):
        call(SimGpuControl(sim))
    assert [g.condition for g in sim.gpus] == before


def test_a_gpu_off_the_bus_refuses_every_setting() -> None:
    control = SimGpuControl(node("xid_79"))
    assert GPU in control.gpus()
    with pytest.raises(TuningError, match=f"gpu {GPU}: GPU is lost"):
        control.set_power_limit(GPU, 500)


def test_ecc_changes_are_pending_until_a_reboot() -> None:
    sim = node()
    control = SimGpuControl(sim)
    control.set_ecc(0, False)
    assert control.ecc(0) == (True, False) and steady(sim, 0).ecc_mode_enabled is True
    sim.reboot()
    assert control.ecc(0) == (False, False) and steady(sim, 0).ecc_mode_enabled is False


def test_settings_show_in_the_readings_and_a_reboot_loses_them() -> None:
    sim = node()
    control = SimGpuControl(sim)
    control.set_power_limit(0, 450)
    control.lock_clocks(0, "gpu", 1410, 1410)
    control.set_compute_mode(0, "exclusive_process")
    reading = steady(sim, 0)
    assert reading.power_management_limit_watts == reading.enforced_power_limit_watts == 450
    assert reading.compute_mode == 4 and reading.persistence_mode_enabled is True
    assert reading.applications_sm_clock_hz == 1410e6
    control.set_persistence(0, False)
    assert steady(sim, 0).persistence_mode_enabled is False
    control.set_persistence(0, True)

    sim.reboot()
    assert control.power_limits(0).current_watts == 700 and control.compute_mode(0) == "default"
    assert control.locked_clocks(0, "gpu") == control.locked_clocks(0, "memory") == "reset"
    assert control.persistence(0) is False and control.ecc(0) == (True, True)
    reading = steady(sim, 0)
    assert reading.persistence_mode_enabled is False and reading.compute_mode == 1


def test_settings_at_their_defaults_leave_the_readings_as_they_were() -> None:
    sim, healthy = node(), node()
    control = SimGpuControl(sim)
    control.set_power_limit(0, 700)
    control.set_compute_mode(0, "default")
    control.set_persistence(0, True)
    assert sim.read() == healthy.read()


# Host


def host(*faults: str) -> SimHost:
    return SimHost(node(*faults), seed=7)


def test_the_os_actuators_read_the_simulated_host() -> None:
    tree = SimHostTree(host(*HOST_FAULTS))
    assert len(tree.glob(CPUFREQ_GLOB)) == 32
    read = {k: v for a in os_actuators() for k, v in a.read(tree).items()}
    assert read["os.cpu_governor.cpu31"] == "powersave"
    assert read["os.sysctls.kernel.numa_balancing"] == "1" and read["os.sysctls.vm.swappiness"] == "60"
    assert read["os.transparent_hugepages.enabled"] == "madvise" and read["os.hugepages"] == "0"


def test_applying_the_fix_makes_the_host_a_healthy_one(tmp_path: Path) -> None:
    sim = host(*HOST_FAULTS)
    result = apply_settings(os_actuators(), FIX, SimHostTree(sim), tmp_path / "journal")
    assert result.state == "applied" and len(result.changes) == 33, result
    assert sim.condition == HostCondition()
    reading = sim.read()
    assert reading.cpu_governor == "performance" and reading.numa_balancing is False
    assert {c.governor for c in reading.cpus} == {"performance"}
    assert reading == host().read()


def test_a_failed_check_rolls_the_host_back_exactly(tmp_path: Path) -> None:
    sim = host(*HOST_FAULTS)
    before = copy.deepcopy(sim.condition)
    result = apply_settings(
        os_actuators(), FIX, SimHostTree(sim), tmp_path / "journal", check=lambda _: ["gemm below peers"]
    )
    assert result.state == "rolled_back" and result.problems == ["gemm below peers"]
    assert sim.condition == before and sim.read() == host(*HOST_FAULTS).read()


class FailingTree(SimHostTree):
    """The kernel fails the write of `rel` with EIO."""

    def __init__(self, sim: SimHost, rel: str) -> None:
        super().__init__(sim)
        self.rel = rel

    def _write(self, rel: str, value: str) -> None:
        if rel == self.rel:
            raise OSError(errno.EIO, "I/O error")
        super()._write(rel, value)


def test_a_failed_write_rolls_the_host_back_exactly(tmp_path: Path) -> None:
    sim = host(*HOST_FAULTS)
    before = copy.deepcopy(sim.condition)
    result = apply_settings(os_actuators(), FIX, FailingTree(sim, NUMA), tmp_path / "journal")
    assert result.state == "rolled_back" and "Input/output error" in result.problems[0], result
    assert sim.condition == before and sim.read() == host(*HOST_FAULTS).read()


def test_hugepages_beyond_free_memory_are_a_shortfall_rolled_back(tmp_path: Path) -> None:
    sim = host()
    tree = SimHostTree(sim)
    result = apply_settings(os_actuators(), OsTargets(hugepages=10**7), tree, tmp_path / "j1")
    assert result.state == "rolled_back" and result.partial and sim.condition == HostCondition()
    assert apply_settings(os_actuators(), OsTargets(hugepages=1024), tree, tmp_path / "j2").ok
    reading = sim.read()
    assert reading.hugepages_total == reading.hugepages_free == 1024


def test_the_kernel_refuses_what_a_file_does_not_take() -> None:
    sim = host()
    tree = SimHostTree(sim)
    governor = "sys/devices/system/cpu/cpu0/cpufreq/scaling_governor"
    for rel, value in [
        (governor, "ondemand"),
        ("sys/kernel/mm/transparent_hugepage/enabled", "sometimes"),
        (NUMA, "2"),
        (NR_HUGEPAGES, "-1"),
        ("proc/sys/vm/swappiness", "ten"),
    ]:
        with pytest.raises(TuningError, match=r"the kernel refused .*Invalid argument"):
            tree.write(rel, value)
    with pytest.raises(TuningError, match="needs root"):
        tree.check_writable(governor.replace("scaling_governor", "scaling_available_governors"))
    with pytest.raises(TuningError, match="not supported on this kernel"):
        tree.read("proc/sys/vm/overcommit_memory")
    assert sim.condition == HostCondition()


def test_one_cpu_set_apart_shows_on_that_cpu_and_other_sysctls_are_held() -> None:
    sim = host()
    tree = SimHostTree(sim)
    tree.write("sys/devices/system/cpu/cpu5/cpufreq/scaling_governor", "powersave")
    tree.write("proc/sys/vm/swappiness", "10")
    assert sim.condition.core_governors == {5: "powersave"} and sim.condition.sysctls == {"vm.swappiness": 10}
    reading = sim.read()
    assert reading.cpu_governor == "performance" and reading.cpus[5].governor == "powersave"
    assert (reading.cpus[5].frequency_hz or 0) < 1.3e9 < (reading.cpus[4].frequency_hz or 0)
    tree.write("sys/devices/system/cpu/cpu5/cpufreq/scaling_governor", "performance")
    tree.write("proc/sys/vm/swappiness", "60")
    assert sim.condition == HostCondition()
