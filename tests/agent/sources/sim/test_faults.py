"""Each simulated fault shows in the fields a real GPU would move, and nowhere else.

Every check compares the faulty GPU with its healthy twin: the same node, seed and GPU without
the fault.
"""

from __future__ import annotations

import pytest

from agent.sources.gpu import GpuReading
from agent.sources.sim import FAULTS, FaultSpec, SimNode
from protos.names import clock_event_reason_names

GPU = 3
NOW = 1_800_000_000.0


def pair(fault: str, seed: int = 7) -> tuple[SimNode, SimNode]:
    def make(faults: list[FaultSpec]) -> SimNode:
        return SimNode("node-a", faults=faults, seed=seed, clock=lambda: NOW)

    return make([FaultSpec(fault, GPU)]), make([])


def steady(node: SimNode) -> GpuReading:
    """The faulty GPU at the node's load, without transient noise draws."""
    return node.reading(GPU, 0.95, NOW)


def value(node: SimNode, probe: str, variant: str, gpu: int | None = GPU) -> float:
    return node.probe(probe, variant, gpu).value


def reasons(r: GpuReading) -> set[str]:
    return set(clock_event_reason_names(r.clock_event_reasons or 0))


def same(a: float, b: float, tol: float = 0.025) -> bool:
    return abs(a / b - 1.0) <= tol


def unchanged_except(
    faulty: SimNode,
    twin: SimNode,
    *,
    gemm: bool = True,
    membw: bool = True,
    pcie: bool = True,
    nccl: bool = True,
) -> None:
    if gemm:
        assert same(value(faulty, "gemm", "bf16"), value(twin, "gemm", "bf16"))
    if membw:
        assert same(value(faulty, "membw", "d2d"), value(twin, "membw", "d2d"))
    if pcie:
        assert same(value(faulty, "pcie", "h2d"), value(twin, "pcie", "h2d"))
    if nccl:
        assert same(value(faulty, "nccl", "all_reduce", None), value(twin, "nccl", "all_reduce", None))


def test_thermal_throttle() -> None:
    faulty, twin = pair("thermal_throttle")
    r = steady(faulty)
    assert {"hw_thermal_slowdown", "hw_slowdown"} <= reasons(r)
    assert r.temperature_celsius is not None and r.temperature_celsius >= 85
    assert r.sm_clock_hz is not None and r.sm_clock_hz < 0.9 * (steady(twin).sm_clock_hz or 0)
    assert value(faulty, "gemm", "bf16") < 0.9 * value(twin, "gemm", "bf16")
    unchanged_except(faulty, twin, gemm=False, nccl=False)
    assert all(link.active for link in r.nvlinks)


def test_power_brake() -> None:
    faulty, twin = pair("power_brake")
    r = steady(faulty)
    assert "hw_power_brake_slowdown" in reasons(r)
    assert r.power_watts is not None and r.enforced_power_limit_watts is not None
    assert r.power_watts < 0.7 * r.enforced_power_limit_watts  # well under the cap: the brake is external
    assert r.enforced_power_limit_watts == r.default_power_limit_watts
    assert value(faulty, "gemm", "bf16") < 0.8 * value(twin, "gemm", "bf16")
    unchanged_except(faulty, twin, gemm=False, nccl=False)


def test_power_cap() -> None:
    faulty, twin = pair("power_cap")
    r = steady(faulty)
    assert r.enforced_power_limit_watts is not None and r.default_power_limit_watts is not None
    assert r.enforced_power_limit_watts < 0.7 * r.default_power_limit_watts
    assert "sw_power_cap" in reasons(r)
    assert not reasons(r) & {"hw_thermal_slowdown", "hw_power_brake_slowdown"}
    assert value(faulty, "gemm", "bf16") < 0.9 * value(twin, "gemm", "bf16")
    unchanged_except(faulty, twin, gemm=False, nccl=False)


def test_clocks_locked_low() -> None:
    faulty, twin = pair("clocks_locked_low")
    r = steady(faulty)
    assert r.applications_sm_clock_hz is not None and r.max_sm_clock_hz is not None
    assert r.applications_sm_clock_hz < 0.8 * r.max_sm_clock_hz
    assert reasons(r) == {"applications_clocks_setting"}  # no thermal or power cause
    assert r.sm_clock_hz == r.applications_sm_clock_hz
    assert value(faulty, "gemm", "bf16") < 0.8 * value(twin, "gemm", "bf16")
    unchanged_except(faulty, twin, gemm=False, nccl=False)


def test_pcie_downtrained() -> None:
    faulty, twin = pair("pcie_downtrained")
    r = steady(faulty)
    assert r.pcie_link_gen is not None and r.pcie_link_width is not None
    assert (r.pcie_link_gen, r.pcie_link_width) != (r.pcie_link_gen_max, r.pcie_link_width_max)
    assert value(faulty, "pcie", "h2d") < 0.6 * value(twin, "pcie", "h2d")
    assert not reasons(r)
    unchanged_except(faulty, twin, pcie=False)


def test_nvlink_down() -> None:
    faulty, twin = pair("nvlink_down")
    r = steady(faulty)
    down = [link for link in r.nvlinks if not link.active]
    assert 2 <= len(down) <= 6
    assert all((link.recovery_errors_total or 0) > 0 for link in down)
    assert value(faulty, "nccl", "all_reduce", None) < 0.9 * value(twin, "nccl", "all_reduce", None)
    unchanged_except(faulty, twin, nccl=False)


def test_ecc_row_remap_pending_changes_no_speed() -> None:
    faulty, twin = pair("ecc_row_remap_pending")
    r = steady(faulty)
    assert r.row_remap_pending is True
    assert (r.row_remap_uncorrectable_total or 0) >= 1
    assert (r.ecc_uncorrected_volatile_total or 0) >= 1
    unchanged_except(faulty, twin)


def test_hbm_degraded_changes_no_clock() -> None:
    faulty, twin = pair("hbm_degraded")
    r, t = steady(faulty), steady(twin)
    assert value(faulty, "membw", "d2d") < 0.9 * value(twin, "membw", "d2d")
    assert r.memory_clock_hz == t.memory_clock_hz and r.sm_clock_hz == t.sm_clock_hz
    unchanged_except(faulty, twin, membw=False)


def test_nvlink_crc_errors_leave_every_speed_alone() -> None:
    faulty, twin = pair("nvlink_crc_errors")
    assert all(link.active for link in steady(faulty).nvlinks)
    unchanged_except(faulty, twin)


def test_xid_79_fails_the_gpus_probes() -> None:
    faulty, _ = pair("xid_79")
    assert all(
        faulty.probe(p, v, GPU).error for p, v in (("gemm", "bf16"), ("membw", "d2d"), ("pcie", "h2d"))
    )
    assert value(faulty, "gemm", "bf16", GPU + 1) > 0


def test_xid_48_changes_no_speed() -> None:
    faulty, twin = pair("xid_48")
    unchanged_except(faulty, twin)


def test_vbios_drift_changes_no_speed() -> None:
    faulty, twin = pair("vbios_drift")
    unchanged_except(faulty, twin)


def test_every_gpu_fault_has_a_test() -> None:
    tested = {
        name.removeprefix("test_").split("_changes")[0].split("_leave")[0].split("_fails")[0]
        for name in globals()
        if name.startswith("test_")
    }
    assert {name for name, fault in FAULTS.items() if fault.level == "gpu"} <= tested


def test_fault_gpu_out_of_range() -> None:
    with pytest.raises(ValueError, match="out of range"):
        SimNode("n", gpus=4, faults=[FaultSpec("power_cap", 4)])
