"""The simulated host: a DGX H100-class node driven by the SimNode's load and the caller's clock."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from agent.compose.sources import build_sources
from agent.config import load
from agent.sources.host import HostReading
from agent.sources.sim import SimHost, SimNode

START = 1_800_000_000.0
TIB = 1024**4


class Clock:
    def __init__(self) -> None:
        self.now = START

    def __call__(self) -> float:
        return self.now


def host(
    *, seed: int = 0, load: float = 0.95, gpus: int = 8, node: str = "n1"
) -> tuple[SimHost, Clock, Callable[[float], HostReading]]:
    """A simulated host, its clock, and `after(seconds)`: advance the clock, then read."""
    clock = Clock()
    sim = SimNode(node, gpus=gpus, seed=seed, load=load, clock=clock)
    h = SimHost(sim, seed=seed)

    def after(seconds: float) -> HostReading:
        clock.now += seconds
        return h.read()

    return h, clock, after


def counters(reading: HostReading) -> dict[str, float]:
    """Every cumulative value of a reading, by a name that says where it is."""
    out: dict[str, float] = {"uptime": reading.uptime_seconds or 0.0}
    items: list[tuple[str, object]] = [
        *((f"net {i.name}", i) for i in reading.network),
        *((f"disk {d.name}", d) for d in reading.disks),
        *((f"ib {p.device}", p) for p in reading.infiniband),
        *((f"aer {a.device}", a) for a in reading.pcie_aer),
    ]
    for where, item in items:
        for f in dataclasses.fields(item):  # type: ignore[arg-type]
            value = getattr(item, f.name)
            if f.name.endswith("_total") and value is not None:
                out[f"{where} {f.name}"] = value
    return out


def test_the_same_seed_and_clock_give_the_same_host() -> None:
    a, _, after_a = host(seed=3)
    b, _, after_b = host(seed=3)
    assert a.facts() == b.facts()
    for _ in range(5):
        assert after_a(10.0) == after_b(10.0)
    _, _, other = host(seed=4)
    assert other(10.0) != host(seed=3)[2](10.0)


def test_facts_describe_the_simulated_machine() -> None:
    h, _, _ = host(gpus=4, node="dgx-07")
    facts = h.facts()
    assert facts.hostname == "dgx-07"
    assert facts.cpu_model == "Intel(R) Xeon(R) Platinum 8480C"
    assert facts.cpu_count == 32 == len(h.read().cpus)
    assert 1.9 * TIB < facts.memory_total_bytes <= 2 * TIB
    assert facts.nvidia_gpu_pci_count == h.nvidia_gpu_pci_count() == 4
    assert facts.host_boot_id and facts.host_boot_id == host(gpus=4, node="dgx-07")[0].facts().host_boot_id
    assert h.last_errors() == []


def test_a_healthy_host_under_load() -> None:
    _, _, after = host(load=0.95)
    reading = after(10.0)
    assert reading.cpu_governor == "performance"
    assert all(c.governor == "performance" for c in reading.cpus)
    assert all(2.85e9 < (c.frequency_hz or 0) < 3.1e9 for c in reading.cpus)
    assert reading.cpu_frequency_hz is not None and 2.9e9 < reading.cpu_frequency_hz < 3.05e9
    assert reading.cpu_utilization_ratio is not None and 0.2 < reading.cpu_utilization_ratio < 0.7
    # The load averages count running cores: about utilisation x cores.
    assert reading.load1 is not None
    assert abs(reading.load1 - reading.cpu_utilization_ratio * len(reading.cpus)) < 2.0
    assert reading.memory_total_bytes is not None and reading.memory_used_bytes is not None
    assert reading.memory_used_bytes + (reading.memory_available_bytes or 0) == reading.memory_total_bytes
    assert (reading.swap_total_bytes, reading.hugepages_total, reading.hugepages_free) == (0, 0, 0)
    assert reading.hugepage_size_bytes == 2 * 1024**2
    assert (reading.transparent_hugepage, reading.numa_balancing) == ("madvise", False)
    assert reading.kernel and reading.uptime_seconds and reading.uptime_seconds > 2 * 3600
    assert [d.name for d in reading.disks] == ["nvme0n1", "nvme1n1", "nvme2n1", "nvme3n1"]
    assert len(reading.network) >= 2


def test_an_idle_host_is_quiet() -> None:
    _, _, busy = host(load=0.95)
    _, _, idle = host(load=0.0)
    first_busy, first_idle = busy(0.0), idle(0.0)
    later_busy, later_idle = busy(60.0), idle(60.0)
    assert (later_idle.cpu_utilization_ratio or 0) < 0.1 < (later_busy.cpu_utilization_ratio or 0)
    assert (later_idle.memory_used_bytes or 0) < (later_busy.memory_used_bytes or 0)
    # No job: the compute fabric carries nothing.
    assert [p.port_xmit_data_bytes_total for p in later_idle.infiniband] == [
        p.port_xmit_data_bytes_total for p in first_idle.infiniband
    ]
    grew = [
        (b.port_xmit_data_bytes_total or 0) - (a.port_xmit_data_bytes_total or 0)
        for a, b in zip(first_busy.infiniband, later_busy.infiniband, strict=True)
    ]
    assert all(g > 0 for g in grew)


def test_infiniband_ports_as_on_a_dgx_h100() -> None:
    _, _, after = host()
    ports = after(10.0).infiniband
    assert [(p.device, p.port, p.link_layer) for p in ports] == [
        *((f"mlx5_{i}", 1, "infiniband") for i in range(8)),
        ("mlx5_8", 1, "ethernet"),
        ("mlx5_9", 1, "ethernet"),
    ]
    assert all((p.state, p.physical_state) == ("active", "link_up") for p in ports)
    assert [p.rate_gbps for p in ports] == [400.0] * 8 + [200.0] * 2
    # The compute fabric's all-reduce moves far more than storage; a port never beats its link.
    before = {p.device: p.port_rcv_data_bytes_total or 0 for p in ports}
    rates = {
        p.device: ((p.port_rcv_data_bytes_total or 0) - before[p.device]) / 60.0
        for p in after(60.0).infiniband
    }
    assert all(10e9 < rates[f"mlx5_{i}"] < 400e9 / 8 for i in range(8))
    assert all(0.5e9 < rates[f"mlx5_{i}"] < 200e9 / 8 for i in (8, 9))
    assert all(p.port_rcv_data_bytes_total and p.port_rcv_data_bytes_total % 4 == 0 for p in ports)


def test_counters_only_grow() -> None:
    _, _, after = host()
    previous = counters(after(0.0))
    for step in (1.0, 10.0, 0.0, 30.0, 300.0):
        now = counters(after(step))
        assert now.keys() == previous.keys()
        assert all(now[k] >= previous[k] for k in now), [k for k in now if now[k] < previous[k]]
        previous = now


def test_aer_counters_for_each_gpu_at_its_sysfs_address() -> None:
    h, _, after = host(gpus=8)
    aer = after(10.0).pcie_aer
    bus_ids = [g.pci_bus_id for g in h.node.inventory().gpus]
    assert bus_ids[0] == "00000000:18:00.0"
    assert [a.device for a in aer] == [f"0000:{b[9:].lower()}" for b in bus_ids]
    assert aer[1].device == "0000:2a:00.0"
    assert all(a.nvidia_gpu for a in aer)
    assert all((a.correctable_total, a.nonfatal_total, a.fatal_total) == (0, 0, 0) for a in aer)


def test_the_powersave_governor_holds_the_cores_near_1_2_ghz() -> None:
    h, _, after = host(load=0.95)
    h.condition.governor = "powersave"
    reading = after(10.0)
    assert reading.cpu_governor == "powersave"
    assert all(c.governor == "powersave" for c in reading.cpus)
    assert all(1.1e9 < (c.frequency_hz or 0) < 1.3e9 for c in reading.cpus)
    assert reading.cpu_frequency_hz is not None and abs(reading.cpu_frequency_hz - 1.2e9) < 0.05e9
    h.condition.governor = "performance"  # retuned: back up at the next read
    assert (after(10.0).cpu_frequency_hz or 0) > 2.9e9


def test_a_degraded_port_trains_at_half_rate_and_keeps_erroring() -> None:
    _, _, healthy_after = host(seed=5)
    degraded, _, degraded_after = host(seed=5)
    degraded.condition.degraded_ib_ports = {"mlx5_3"}
    first = degraded_after(0.0)
    healthy_after(0.0)
    for _ in range(12):  # an hour, one read every 5 minutes
        good, bad = healthy_after(300.0), degraded_after(300.0)
    port = bad.infiniband[3]
    start = first.infiniband[3]
    assert port.device == "mlx5_3" and port.rate_gbps == 200.0
    assert (port.state, port.physical_state) == ("active", "link_up")  # up, but down-trained
    assert (port.symbol_error_total or 0) - (start.symbol_error_total or 0) > 1000
    assert (port.link_downed_total or 0) > (start.link_downed_total or 0)
    assert (port.link_error_recovery_total or 0) > (start.link_error_recovery_total or 0)
    assert (port.port_rcv_errors_total or 0) > (start.port_rcv_errors_total or 0)
    # Everything else is exactly what the healthy twin reads.
    assert bad.infiniband[:3] + bad.infiniband[4:] == good.infiniband[:3] + good.infiniband[4:]
    assert good.infiniband[3].rate_gbps == 400.0
    assert good.infiniband[3].symbol_error_total == start.symbol_error_total
    assert dataclasses.replace(bad, infiniband=[]) == dataclasses.replace(good, infiniband=[])


def test_host_readings_leave_the_gpu_readings_alone() -> None:
    clock = Clock()
    alone = SimNode("n1", seed=2, clock=clock)
    beside = SimNode("n1", seed=2, clock=clock)
    h = SimHost(beside, seed=2)
    for _ in range(3):
        clock.now += 10.0
        h.read()
        assert alone.read() == beside.read()


def test_the_sim_agent_gets_the_simulated_host() -> None:
    config = load(None, {"node": "n9", "source": "sim", "sim": {"gpus": 2, "seed": 4}})
    gpu, h, _ = build_sources(config)
    assert isinstance(h, SimHost) and h.node is gpu
    assert h.facts().hostname == "n9" and h.nvidia_gpu_pci_count() == 2
