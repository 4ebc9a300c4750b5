"""Time to detect a throttle from telemetry (issue target: within 30 s of its onset), in simulated
time: frames every 10 s (the agent's default), detection passes every 10 s (the controller's), at
the default detect.throttle_window_seconds; and a healthy fleet over a simulated day raises nothing.

The worst case is a fault starting just after a frame, with passes running just before each frame
arrives: 10 s to the first throttled reading, 10 s to the second (the window needs two), and 10 s
to the pass that sees it.
"""

from __future__ import annotations

import dataclasses
import random

import pytest

from agent.snapshot import Snapshot
from agent.sources.sim import FAULTS
from agent.stream import frames
from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.offline import OfflineDetector
from controller.detect.runner import run_detectors
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet

FRAME_SECONDS = 10.0
TARGET_SECONDS = 30.0
THROTTLES = ("thermal_throttle", "power_brake", "power_cap", "clocks_locked_low")
# The detectors that judge GPU telemetry over the throttle window (the others read probes, counters
# over time, the host or the BMC, which these frames do not carry).
WINDOWED = ["clock_lock", "nvlink", "pcie_link", "row_remap", "throttle"]


class LeanSimFleet(SimFleet):
    """SimFleet without NVLink readings in its frames (most of a frame's cost; no detector here
    reads them)."""

    def frame(self, name: str, *, probes: bool = False) -> pb.TelemetryFrame:
        readings = [dataclasses.replace(r, nvlinks=[]) for r in self.sims[name].read()]
        self.seq[name] += 1
        snapshot = Snapshot(node=name, time=self.now, gpus=readings)
        return frames.frame(snapshot, f"boot-{name}", self.seq[name])


def time_to_detect(fault: str, after_frame: float, pass_offset: float) -> tuple[float, str]:
    """Seconds from the onset of `fault` on node-01 GPU 3 (`after_frame` seconds after a frame) to
    the pass that opens a finding there (passes `pass_offset` seconds after each frame), and its cause."""
    sim = LeanSimFleet(4)
    start = sim.now
    detector = OfflineDetector(DetectConfig())
    for name in sim.sims:
        detector.hello(sim.hello(name), start)
    detector.next_pass = start + pass_offset or start + FRAME_SECONDS  # at a frame's time: before it
    onset = start + 2 * FRAME_SECONDS + after_frame
    for k in range(1, 12):
        sim.now = start + k * FRAME_SECONDS
        if sim.now - FRAME_SECONDS <= onset < sim.now:
            detector.run_until(onset)
            FAULTS[fault].apply(sim.sims["node-01"].gpus[3], None, random.Random(7))
        for name in sim.sims:
            detector.frame(sim.frame(name), sim.now)
        for done in detector.passes:
            assert not done.opened or done.time > onset, f"a finding before the fault: {done.opened}"
            for stored in done.opened:
                if stored.finding.key[:2] == ("node-01", 3):
                    return done.time - onset, stored.finding.cause
    raise AssertionError(f"{fault} not found within {sim.now - onset:.0f}s")


@pytest.mark.parametrize("fault", THROTTLES)
@pytest.mark.parametrize(
    ("after_frame", "pass_offset"), [(0.01, 0.0), (0.01, 9.99), (5.0, 5.0), (9.99, 0.01)]
)
def test_a_throttle_is_found_within_30_seconds(fault: str, after_frame: float, pass_offset: float) -> None:
    seconds, cause = time_to_detect(fault, after_frame, pass_offset)
    assert cause == FAULTS[fault].cause
    assert seconds <= TARGET_SECONDS
    if (after_frame, pass_offset) == (0.01, 0.0):  # the worst case: two readings and a pass's wait
        assert seconds == pytest.approx(TARGET_SECONDS, abs=0.02)


def test_one_throttled_reading_is_not_a_finding() -> None:
    config = DetectConfig()
    assert FRAME_SECONDS / 2 < config.throttle_window_seconds <= FRAME_SECONDS
    sim = LeanSimFleet(4)
    sim.step(FRAME_SECONDS)
    FAULTS["power_cap"].apply(sim.sims["node-01"].gpus[3], None, random.Random(7))
    sim.step(FRAME_SECONDS)
    assert run_detectors(DetectContext(sim.fleet, config, sim.now), WINDOWED).findings == []
    sim.step(FRAME_SECONDS)
    found = run_detectors(DetectContext(sim.fleet, config, sim.now), WINDOWED).findings
    assert [f.key for f in found] == [("node-01", 3, "power_cap")]


def test_a_healthy_fleet_over_a_day_raises_nothing() -> None:
    """16 nodes over a simulated day (the inlet's daily swing, load noise, power spikes): three
    frames 10 s apart every 30 minutes, each judged at the default window. The full day at 10 s
    steps is bench/detection.py's healthy scenario."""
    sim = LeanSimFleet(16, seed=3)
    config = DetectConfig()
    start = sim.now
    while sim.now < start + 86400.0:
        sim.now += 1800.0 - 3 * FRAME_SECONDS
        for _ in range(3):
            sim.step(FRAME_SECONDS)
            found = run_detectors(DetectContext(sim.fleet, config, sim.now), WINDOWED).findings
            assert found == [], f"at {sim.now - start:.0f}s: {[f.summary for f in found]}"
