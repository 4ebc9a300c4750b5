"""Clocks held low on a busy GPU, from telemetry alone (controller/detect/clock_lock.py), and the
conditions it reads (controller/fleet/conditions.py conditions)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.base import DetectContext, discover
from controller.fleet.conditions import conditions
from controller.fleet.finding import Finding
from controller.fleet.state import apply_frame, plan_frame
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import clock_event_reason_bit
from tests.simfleet import SimFleet

MAX = 1980e6
APP_CLOCKS = clock_event_reason_bit("applications_clocks_setting")
THERMAL = clock_event_reason_bit("hw_thermal_slowdown")


def clock_lock(sim: SimFleet, **config: float) -> list[Finding]:
    ctx = DetectContext(sim.fleet, DetectConfig(**config), sim.now)  # type: ignore[arg-type]
    return discover()["clock_lock"](ctx)


def keys(findings: list[Finding]) -> list[tuple[str, int | None, str]]:
    return sorted((f.node, f.gpu, f.cause) for f in findings)


def step(sim: SimFleet, change: Callable[[str, pb.GpuSample], None], seconds: float = 10.0) -> None:
    """SimFleet.step with each GPU reading changed on the wire before the controller ingests it."""
    sim.now += seconds
    for name in sim.sims:
        frame = sim.frame(name)
        for sample in frame.gpus:
            change(name, sample)
        write, _ = plan_frame(sim.fleet.nodes[name], frame, sim.now)
        apply_frame(sim.fleet, write)


def sample(**fields: float) -> pb.GpuSample:
    base = {
        "gpu_utilization_ratio": 0.95,
        "sm_clock_hz": MAX,
        "max_sm_clock_hz": MAX,
        "clock_event_reasons": 0,
    }
    return pb.GpuSample(index=0, **{**base, **fields})  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({}, set()),
        (
            {"sm_clock_hz": 1400e6, "clock_event_reasons": APP_CLOCKS},
            {"applications_clocks_setting", "clocks_locked"},
        ),
        ({"sm_clock_hz": 1400e6, "applications_sm_clock_hz": 1400e6}, {"clocks_locked"}),
        ({"sm_clock_hz": 1400e6}, {"clock_low_no_reason"}),
        ({"sm_clock_hz": 1900e6}, set()),  # within 5% of max
        ({"sm_clock_hz": 1400e6, "clock_event_reasons": THERMAL}, {"hw_thermal_slowdown"}),
        ({"sm_clock_hz": 1400e6, "gpu_utilization_ratio": 0.0}, set()),  # idle clocks down
    ],
)
def test_clock_conditions(fields: dict[str, float], expected: set[str]) -> None:
    assert conditions(sample(**fields)) == expected


def test_unreported_reasons_or_clock_are_no_condition() -> None:
    s = sample(sm_clock_hz=1400e6)
    s.ClearField("clock_event_reasons")
    assert conditions(s) == set()
    s = sample()
    s.ClearField("sm_clock_hz")
    assert conditions(s) == set()


def test_clocks_locked_low_is_found_from_telemetry_within_the_window() -> None:
    sim = SimFleet(8, {"node-03": [FaultSpec("clocks_locked_low", 5)]})
    sim.step(10.0)
    assert clock_lock(sim) == []  # one reading: held 0 s
    sim.step(10.0)
    (finding,) = clock_lock(sim)
    assert keys([finding]) == [("node-03", 5, "clocks_locked_low")]
    s = sim.fleet.nodes["node-03"].gpus[5].sample
    ev = finding.evidence
    assert ev.metric == "sm_clock_hz" and ev.value == s.sm_clock_hz < 0.8 * MAX and ev.baseline == MAX
    assert ev.held_seconds == 10.0 and ev.baseline_source == "expected"
    assert ev.reasons == ("applications_clocks_setting",)
    peers = next(e for e in finding.supporting if e.baseline_source == "peers")
    assert peers.baseline == MAX and peers.peers == 63  # every other GPU runs at max
    assert peers.detail.startswith("peers at >=90% utilisation run 1980 MHz (median of 63 GPUs)")
    assert any(e.metric == "applications_sm_clock_hz" for e in finding.supporting)


def test_a_lock_on_a_lightly_loaded_gpu_is_not_a_finding() -> None:
    sim = SimFleet(4, {"node-01": [FaultSpec("clocks_locked_low", 0)]})
    sim.step(10.0)
    sim.step(10.0)
    assert len(clock_lock(sim)) == 1
    sim.fleet.nodes["node-01"].gpus[0].sample.gpu_utilization_ratio = 0.3
    assert clock_lock(sim) == []


def test_a_thermal_cause_is_the_throttle_detectors_not_a_lock() -> None:
    sim = SimFleet(4, {"node-01": [FaultSpec("clocks_locked_low", 0)]})
    sim.step(10.0)
    sim.step(10.0)
    sim.fleet.nodes["node-01"].gpus[0].sample.clock_event_reasons |= THERMAL
    assert clock_lock(sim) == []


def hide_lock(node: str, gpu: int) -> Callable[[str, pb.GpuSample], None]:
    """A locked GPU whose NVML shows neither the lock nor any reason (as some boards do)."""

    def change(name: str, s: pb.GpuSample) -> None:
        if (name, s.index) == (node, gpu):
            s.clock_event_reasons = 0
            s.applications_sm_clock_hz = s.max_sm_clock_hz

    return change


def test_a_slow_clock_without_a_reason_is_slow_unknown_against_busy_peers() -> None:
    sim = SimFleet(4, {"node-02": [FaultSpec("clocks_locked_low", 6)]})
    step(sim, hide_lock("node-02", 6))
    assert clock_lock(sim) == []
    step(sim, hide_lock("node-02", 6))
    (finding,) = clock_lock(sim)
    assert keys([finding]) == [("node-02", 6, "slow_unknown")]
    ev = finding.evidence
    assert ev.baseline_source == "peers" and ev.baseline == MAX and ev.peers == 31
    assert ev.held_seconds == 10.0 and ev.deviation is not None and ev.deviation < -0.1
    assert finding.supporting[0].baseline_source == "expected"
    assert clock_lock(sim, min_peers=32) == []  # too few busy peers to say


def test_a_clock_a_little_below_its_peers_without_a_reason_is_not_flagged() -> None:
    sim = SimFleet(4)

    def slower(name: str, s: pb.GpuSample) -> None:
        if (name, s.index) == ("node-01", 1):
            s.sm_clock_hz = 0.92 * s.max_sm_clock_hz  # below the 5% condition, within the 10% margin

    step(sim, slower)
    step(sim, slower)
    assert "clock_low_no_reason" in sim.fleet.nodes["node-01"].gpus[1].held
    assert clock_lock(sim) == []
    assert keys(clock_lock(sim, clock_peer_margin=0.05)) == [("node-01", 1, "slow_unknown")]


@pytest.mark.parametrize("seed", [1, 2])
def test_a_healthy_fleet_has_no_clock_findings(seed: int) -> None:
    sim = SimFleet(8, seed=seed)
    for _ in range(6):
        sim.step(10.0)
    assert clock_lock(sim, throttle_window_seconds=0.0) == []
