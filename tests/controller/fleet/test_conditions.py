from __future__ import annotations

from typing import Any

from controller.fleet.conditions import conditions, update_held
from protos.gpufleet.v1 import telemetry_pb2 as pb

BUSY: dict[str, Any] = {"gpu_utilization_ratio": 0.9}


def test_reason_bits_and_derived_states() -> None:
    s = pb.GpuSample(
        index=0,
        clock_event_reasons=0x40 | 0x8,
        pcie_link_gen=4,
        pcie_link_gen_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
        row_remap_pending=True,
        **BUSY,
    )
    s.nvlinks.add(link=0, active=True)
    s.nvlinks.add(link=1, active=False)
    assert conditions(s) == {
        "hw_thermal_slowdown",
        "hw_slowdown",
        "pcie_below_max",
        "nvlink_inactive",
        "row_remap_pending",
    }


def test_idle_gpu_with_trained_down_link_is_not_below_max() -> None:
    s = pb.GpuSample(
        index=0,
        clock_event_reasons=0x1,
        gpu_utilization_ratio=0.0,
        pcie_link_gen=1,
        pcie_link_gen_max=5,
        pcie_link_width=16,
        pcie_link_width_max=16,
    )
    assert conditions(s) == set()


def test_held_since_continues_and_resets() -> None:
    capped = pb.GpuSample(index=0, clock_event_reasons=0x4, **BUSY)
    clear = pb.GpuSample(index=0, clock_event_reasons=0, **BUSY)
    held = update_held({}, capped, 100.0)
    held = update_held(held, capped, 110.0)
    assert held == {"sw_power_cap": 100.0}
    assert update_held(held, clear, 120.0) == {}
    assert update_held(update_held(held, clear, 120.0), capped, 130.0) == {"sw_power_cap": 130.0}
