"""Host, network and BMC faults show where a real node shows them, and nowhere else.

Each check compares the faulty node (its GPUs, host and BMC) with its twin: same name and seed, no
fault, read at the same moments. The fault's own fields must move; every other field of the host
reading and the BMC sample, and every GPU reading, must read exactly as in the twin.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.sources.bmc import BmcSample
from agent.sources.gpu import GpuReading
from agent.sources.host import HostReading
from agent.sources.sim import FAULTS, FaultSpec, SimHost, SimNode
from agent.sources.sim.bmc import SimBmc

START = 1_800_000_000.0
STEP = 300.0  # five minutes between reads, so error counters have time to climb

Reads = list[tuple[list[GpuReading], HostReading, BmcSample]]

# fault: (HostReading fields that must move, BmcSample fields that must move, fields that may also move)
MOVES: dict[str, tuple[set[str], set[str], set[str]]] = {
    "cpu_governor_powersave": ({"cpu_governor", "cpu_frequency_hz", "cpus"}, set(), set()),
    "numa_balancing_on": ({"numa_balancing"}, set(), set()),
    "thp_disabled": ({"transparent_hugepage"}, set(), set()),
    "ib_port_down": ({"infiniband"}, set(), set()),
    "ib_port_degraded": ({"infiniband"}, set(), set()),
    # Fewer fans draw less power, so the PSUs' shares move with it.
    "fan_failure": (
        set(),
        {"fans", "temperatures", "chassis_health", "system_health"},
        {"power_consumed_watts", "power_supplies"},
    ),
    # The rest carry the load at another efficiency: a little more or less heat for the exhaust.
    "psu_failure": (
        set(),
        {"power_supplies", "power_supply_redundancy_health", "chassis_health", "system_health"},
        {"temperatures"},
    ),
    # Hot intake air: every temperature follows it, the fans speed up for the warmer GPUs, and the
    # host and PSUs draw and lose a little more with them.
    "inlet_temperature_high": (
        set(),
        {"temperatures", "gpus", "chassis_health", "system_health"},
        {"fans", "power_consumed_watts", "power_supplies"},
    ),
    "bios_drift": (set(), {"bios_attributes"}, set()),
    # The driver shows in the inventory and the GEMM probe (test_driver_branch_slow below), no reading.
    "driver_branch_slow": (set(), set(), set()),
    "bmc_firmware_drift": (set(), {"bmc_firmware_version", "firmware"}, set()),
}
LEVEL_FAULTS = sorted(name for name, fault in FAULTS.items() if fault.level != "gpu")
GPU_FAULTS = sorted(name for name, fault in FAULTS.items() if fault.level == "gpu")


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def rig(faults: list[FaultSpec], seed: int = 7) -> tuple[SimNode, SimHost, SimBmc, Clock]:
    clock = Clock()
    node = SimNode("node-a", seed=seed, faults=faults, clock=clock)
    return node, SimHost(node, seed=seed), SimBmc(node, seed=seed), clock


def history(faults: list[FaultSpec], count: int = 4, seed: int = 7) -> Reads:
    node, host, bmc, clock = rig(faults, seed)
    out = []
    for _ in range(count):
        clock.now += STEP
        out.append((node.read(), host.read(), bmc.poll()))
    return out


def moved(a: Any, b: Any) -> set[str]:
    return {f.name for f in dataclasses.fields(a) if getattr(a, f.name) != getattr(b, f.name)}


def test_every_level_fault_has_its_fields() -> None:
    assert set(MOVES) == set(LEVEL_FAULTS)


@pytest.mark.parametrize("fault", LEVEL_FAULTS)
def test_fault_moves_its_fields_and_nothing_else(fault: str) -> None:
    faulty, twin = history([FaultSpec(fault)]), history([])
    host_must, bmc_must, may = MOVES[fault]
    for (f_gpus, f_host, f_bmc), (t_gpus, t_host, t_bmc) in zip(faulty, twin, strict=True):
        assert f_gpus == t_gpus, "a GPU reading moved"
        host_moved, bmc_moved = moved(f_host, t_host), moved(f_bmc, t_bmc)
        assert host_moved <= host_must | may, sorted(host_moved)
        assert bmc_moved <= bmc_must | may, sorted(bmc_moved)
    assert host_must <= host_moved and bmc_must <= bmc_moved


@pytest.mark.parametrize("fault", GPU_FAULTS)
def test_gpu_faults_leave_the_host_alone(fault: str) -> None:
    faulty, twin = history([FaultSpec(fault, 3)]), history([])
    assert [host for _, host, _ in faulty] == [host for _, host, _ in twin]


def only_port(faulty: Reads, twin: Reads) -> tuple[str, list[Any]]:
    """The one InfiniBand port that differs from the twin, and its readings over time."""
    (_, last, _), (_, healthy, _) = faulty[-1], twin[-1]
    differ = [p.device for p, h in zip(last.infiniband, healthy.infiniband, strict=True) if p != h]
    assert len(differ) == 1, differ
    index = [p.device for p in last.infiniband].index(differ[0])
    return differ[0], [host.infiniband[index] for _, host, _ in faulty]


def test_ib_port_down_polls_carries_nothing_and_counts_one_link_down() -> None:
    faulty, twin = history([FaultSpec.parse("ib_port_down:mlx5_1")]), history([])
    device, ports = only_port(faulty, twin)
    healthy = next(p for p in twin[0][1].infiniband if p.device == device)
    assert device == "mlx5_1"
    assert all((p.state, p.physical_state, p.rate_gbps) == ("down", "polling", 10.0) for p in ports)
    assert ports[0].link_downed_total == (healthy.link_downed_total or 0) + 1
    assert (
        len({(p.port_xmit_data_bytes_total, p.port_rcv_data_bytes_total, p.link_downed_total) for p in ports})
        == 1
    )


def test_ib_port_degraded_trains_at_half_rate_with_symbol_errors_rising() -> None:
    faulty, twin = history([FaultSpec.parse("ib_port_degraded")], count=8), history([], count=8)
    _, ports = only_port(faulty, twin)
    assert all((p.state, p.rate_gbps) == ("active", 200.0) for p in ports)
    assert (ports[-1].symbol_error_total or 0) > (ports[0].symbol_error_total or 0)


def test_host_settings_read_as_a_misconfigured_node() -> None:
    faults = [FaultSpec(name) for name in ("cpu_governor_powersave", "numa_balancing_on", "thp_disabled")]
    (_, host, _), (_, healthy, _) = history(faults, count=1)[0], history([], count=1)[0]
    assert (host.cpu_governor, host.numa_balancing, host.transparent_hugepage) == ("powersave", True, "never")
    assert (healthy.cpu_governor, healthy.numa_balancing, healthy.transparent_hugepage) == (
        "performance",
        False,
        "madvise",
    )
    assert (host.cpu_frequency_hz or 0) < 0.5 * (healthy.cpu_frequency_hz or 0)


def test_fan_failure_stops_one_fan_and_the_exhaust_warms() -> None:
    (_, _, bmc), (_, _, healthy) = (
        history([FaultSpec.parse("fan_failure:3")], count=1)[0],
        history([], count=1)[0],
    )
    fan = bmc.fans[2]
    assert (fan.name, fan.speed_rpm, fan.health) == ("Fan_3", 0.0, "critical")
    assert [f for f in bmc.fans if f.name != "Fan_3"] == [f for f in healthy.fans if f.name != "Fan_3"]
    exhaust = {t.name: t.reading_celsius or 0.0 for t in bmc.temperatures if t.context == "exhaust"}
    before = {t.name: t.reading_celsius or 0.0 for t in healthy.temperatures if t.context == "exhaust"}
    assert exhaust["Exhaust_Temp"] > before["Exhaust_Temp"]
    assert [t for t in bmc.temperatures if t.context != "exhaust"] == [
        t for t in healthy.temperatures if t.context != "exhaust"
    ]
    assert bmc.chassis_health == "critical"


def test_psu_failure_loses_redundancy() -> None:
    (_, _, bmc), _ = history([FaultSpec.parse("psu_failure:2")], count=1)[0], None
    psu = bmc.power_supplies[1]
    assert (psu.name, psu.health, psu.output_watts) == ("PSU_2", "critical", 0.0)
    assert bmc.power_supply_redundancy_health == "warning"


def test_bios_drift_changes_one_attribute() -> None:
    (_, _, bmc), (_, _, healthy) = (
        history([FaultSpec.parse("bios_drift:TurboMode")], count=1)[0],
        history([], count=1)[0],
    )
    assert bmc.bios_attributes == {**healthy.bios_attributes, "TurboMode": "Disabled"}
    assert bmc.bios_version == healthy.bios_version


def test_firmware_drift_shows_in_the_bmc_inventory() -> None:
    (_, _, bmc), (_, _, healthy) = (
        history([FaultSpec("bmc_firmware_drift")], count=1)[0],
        history([], count=1)[0],
    )
    assert bmc.bmc_firmware_version != healthy.bmc_firmware_version
    assert next(f.version for f in bmc.firmware if f.id == "BMC_0") == bmc.bmc_firmware_version
    (_, _, gpu_bmc), _ = history([FaultSpec("vbios_drift", 5)], count=1)[0], None
    vbios = {f.id: f.version for f in gpu_bmc.firmware if f.id.startswith("HGX_FW_GPU_SXM_")}
    assert len(set(vbios.values())) == 2 and vbios["HGX_FW_GPU_SXM_6"] != vbios["HGX_FW_GPU_SXM_1"]


def where(fault: str, seed: int) -> str:
    """The one port, fan, PSU or BIOS attribute an untargeted `fault` hit on the node of `seed`."""
    (_, host, bmc), (_, twin_host, twin_bmc) = (
        history([FaultSpec(fault)], 1, seed)[0],
        history([], 1, seed)[0],
    )
    hit = [p.device for p, q in zip(host.infiniband, twin_host.infiniband, strict=True) if p != q]
    hit += [f.name for f, g in zip(bmc.fans, twin_bmc.fans, strict=True) if f.health != g.health]
    hit += [
        p.name
        for p, q in zip(bmc.power_supplies, twin_bmc.power_supplies, strict=True)
        if p.health != q.health
    ]
    hit += [k for k, v in bmc.bios_attributes.items() if v != twin_bmc.bios_attributes[k]]
    assert len(hit) == 1, hit
    return hit[0]


@pytest.mark.parametrize(
    "fault", ["ib_port_down", "ib_port_degraded", "fan_failure", "psu_failure", "bios_drift"]
)
def test_an_untargeted_fault_lands_where_the_seed_says(fault: str) -> None:
    assert where(fault, 3) == where(fault, 3)
    assert len({where(fault, seed) for seed in range(8)}) > 1


def test_inlet_temperature_high_puts_the_intake_over_caution_and_warms_the_rest() -> None:
    for (_, _, bmc), (_, _, healthy) in zip(
        history([FaultSpec("inlet_temperature_high")]), history([]), strict=True
    ):
        hot = {t.context: t for t in bmc.temperatures if t.context in ("intake", "exhaust")}
        cool = {t.context: t for t in healthy.temperatures if t.context in ("intake", "exhaust")}
        intake = hot["intake"]
        assert (intake.upper_caution_celsius or 0) <= (intake.reading_celsius or 0)
        assert (intake.reading_celsius or 0) < (intake.upper_critical_celsius or 0)
        assert intake.health == "warning" and bmc.chassis_health == "warning"
        assert (cool["intake"].reading_celsius or 0) < (cool["intake"].upper_caution_celsius or 0)
        assert (hot["exhaust"].reading_celsius or 0) > (cool["exhaust"].reading_celsius or 0) + 5
        for board, twin in zip(bmc.gpus, healthy.gpus, strict=True):
            assert (board.temperature_celsius or 0) > (twin.temperature_celsius or 0) + 5


def test_driver_branch_slow_loads_a_newer_branch_with_slower_gemm() -> None:
    faulty, _, _, _ = rig([FaultSpec("driver_branch_slow")])
    twin, _, _, _ = rig([])
    inventory, healthy = faulty.inventory(), twin.inventory()
    assert inventory.driver_version == "560.35.03" != healthy.driver_version
    assert {g.driver_version for g in inventory.gpus} == {"560.35.03"}
    for slow, fine in zip(faulty.gpus, twin.gpus, strict=True):
        ratio = slow.gemm_tflops("bf16", 25.0) / fine.gemm_tflops("bf16", 25.0)
        assert 0.85 <= ratio <= 0.92
        assert slow.membw_gbps() == fine.membw_gbps()  # GEMM kernels only
    assert len({g.condition.gemm_factor for g in faulty.gpus}) == 1  # one driver for the node
