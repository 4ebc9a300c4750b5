"""throttle.judge's held time: a cause named by several reasons (thermal: hardware and software
slowdown) has held since the earliest of them, and a GPU holding none of the watched reasons (most
GPUs, judged first in one look) raises nothing."""

from __future__ import annotations

from controller.config import DetectConfig
from controller.detect import throttle
from controller.fleet.model import GpuState, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb

T = 1_800_000_000.0
THERMAL_BITS = pb.CLOCK_EVENT_REASON_HW_THERMAL_SLOWDOWN | pb.CLOCK_EVENT_REASON_SW_THERMAL_SLOWDOWN


def gpu(held: dict[str, float], reasons: int = THERMAL_BITS) -> GpuState:
    sample = pb.GpuSample(index=2, clock_event_reasons=reasons, temperature_celsius=91.0)
    return GpuState(2, sample, T, held)


def test_a_cause_of_two_reasons_has_held_since_the_earlier() -> None:
    config = DetectConfig(throttle_window_seconds=60.0)
    node = NodeState("n1", pb.Hello(), T, T)
    held = {"hw_thermal_slowdown": T - 40.0, "sw_thermal_slowdown": T - 400.0}
    [finding] = throttle.judge(node, gpu(held), config)
    assert finding.cause == "thermal_throttle"
    assert finding.evidence.held_seconds == 400.0
    # Each reason alone held less than the window: nothing yet.
    assert throttle.judge(node, gpu({"hw_thermal_slowdown": T - 40.0}), config) == []


def test_a_gpu_holding_no_watched_reason_raises_nothing() -> None:
    config = DetectConfig(throttle_window_seconds=0.0)
    node = NodeState("n1", pb.Hello(), T, T)
    assert (
        throttle.judge(node, gpu({"pcie_below_max": T - 900.0, "nvlink_inactive": T - 900.0}), config) == []
    )
    assert throttle.judge(node, gpu({"sw_thermal_slowdown": T - 900.0}), config) != []
