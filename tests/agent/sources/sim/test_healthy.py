"""Healthy simulated GPUs vary like real ones, but never enough to look faulty."""

from __future__ import annotations

import statistics
from collections import defaultdict

from agent.sources.sim import SimNode
from agent.sources.sim.probes import ModelledProbes
from protos.names import clock_event_reason_names


def test_seeded_fleet_is_reproducible() -> None:
    a = SimNode("n1", seed=3, clock=lambda: 1e9)
    b = SimNode("n1", seed=3, clock=lambda: 1e9)
    assert a.read() == b.read()
    assert a.inventory() == b.inventory()
    assert SimNode("n2", seed=3).inventory().gpus[0].uuid != a.inventory().gpus[0].uuid


def test_inventory_looks_like_an_hgx_h100() -> None:
    inv = SimNode("n1").inventory()
    assert inv.source == "sim" and len(inv.gpus) == 8 and inv.expected_gpu_count == 8
    assert {g.name for g in inv.gpus} == {"NVIDIA H100 80GB HBM3"}
    assert len({g.uuid for g in inv.gpus}) == 8 and all(g.uuid.startswith("GPU-") for g in inv.gpus)
    assert len({g.pci_bus_id for g in inv.gpus}) == 8
    assert all(g.nvlink_count == 18 for g in inv.gpus)


def test_gpus_differ_but_stay_within_a_few_percent_of_peers() -> None:
    groups: dict[tuple[str, str], list[float]] = defaultdict(list)
    for seed in range(4):
        for i in range(32):
            for outcome in ModelledProbes(SimNode(f"node-{i}", seed=seed)).run([]):
                groups[(outcome.probe, outcome.variant)].append(outcome.value)
    for key, values in groups.items():
        median = statistics.median(values)
        spread = statistics.pstdev(values) / median
        assert 0.002 < spread < 0.02, f"{key}: healthy spread {spread:.2%} is not realistic"
        assert min(values) / median > 0.96, (
            f"{key}: a healthy result is {1 - min(values) / median:.1%} below median"
        )


def test_healthy_readings_over_time() -> None:
    t = [1_800_000_000.0]
    node = SimNode("n1", seed=11, clock=lambda: t[0])
    temps, held_cap = [], 0
    longest_cap = 0
    for _ in range(600):
        t[0] += 10.0
        readings = node.read()
        capped = any("sw_power_cap" in clock_event_reason_names(r.clock_event_reasons or 0) for r in readings)
        held_cap = held_cap + 1 if capped else 0
        longest_cap = max(longest_cap, held_cap)
        for r in readings:
            temps.append(r.temperature_celsius or 0)
            names = set(clock_event_reason_names(r.clock_event_reasons or 0))
            assert not names & {
                "hw_thermal_slowdown",
                "hw_power_brake_slowdown",
                "applications_clocks_setting",
            }
            assert r.pcie_link_gen == r.pcie_link_gen_max and r.pcie_link_width == r.pcie_link_width_max
            assert all(link.active for link in r.nvlinks)
            assert r.row_remap_pending is False
    # Brief power-cap blips under load are normal; they never last.
    assert 0 < longest_cap <= 2
    assert max(temps) < 85 and min(temps) > 40
    assert max(temps) - min(temps) >= 3, "no diurnal or GPU-to-GPU temperature variation"
    energy = node.read()[0].energy_joules_total
    assert energy is not None and energy > 600 * 10 * 400  # ~10 minutes at > 400 W


def test_idle_node_trains_pcie_down_and_reports_idle() -> None:
    node = SimNode("n1", load=0.0)
    r = node.read()[0]
    assert clock_event_reason_names(r.clock_event_reasons or 0) == ["gpu_idle"]
    assert r.pcie_link_gen == 1 and r.gpu_utilization_ratio == 0.0


def test_probe_results_carry_context() -> None:
    node = SimNode("n1")
    gemm = node.probe("gemm", "bf16", 0)
    assert gemm.unit == "TFLOP/s" and gemm.simulated and gemm.during is not None
    assert gemm.peak_ratio is not None and 0.6 < gemm.peak_ratio < 0.85
    nccl = node.probe("nccl", "all_reduce", None)
    assert nccl.gpu is None and nccl.params["ranks"] == "8"
    # nccl-tests: busbw = algbw * 2(n-1)/n
    assert abs(float(nccl.params["algbw_gbps"]) * 2 * 7 / 8 - nccl.value) < 0.05
