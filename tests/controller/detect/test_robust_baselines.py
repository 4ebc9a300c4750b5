"""Issue 15, bad input 8 (baselines): a minority of wild peers (fake or broken nodes reporting
extreme but physically possible readings and probe results) must not move the healthy majority's
verdicts. 30 healthy simulated nodes and 10 wild ones: no finding on any of the 30."""

from __future__ import annotations

import pytest

from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from controller.detect.stats import baseline
from controller.fleet.state import apply_frame, plan_frame
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet

HEALTHY, WILD = 30, 10
WINDOW = 5.0


def wild(frame: pb.TelemetryFrame, factor: float) -> None:
    """Extreme readings within the plausible ranges, and probe results `factor` times the truth."""
    for gpu in frame.gpus:
        gpu.temperature_celsius = 149.0
        gpu.memory_temperature_celsius = 149.0
        gpu.power_watts = 4900.0
        gpu.sm_clock_hz = 9.9e9
        gpu.gpu_utilization_ratio = 1.0
    for result in frame.probes:
        result.value *= factor
        result.ClearField("peak_ratio")  # a forger need not say how far above the datasheet it is


def fleet_with_wild_nodes(factor: float, seed: int) -> SimFleet:
    sim = SimFleet(HEALTHY + WILD, seed=seed)
    wild_names = set(list(sim.sims)[HEALTHY:])
    for step in range(3):
        sim.now += 1.0
        for name in sim.sims:
            frame = sim.frame(name, probes=step == 0)
            if name in wild_names:
                wild(frame, factor)
            write, _ = plan_frame(sim.fleet.nodes[name], frame, sim.now)
            apply_frame(sim.fleet, write)
    return sim


@pytest.mark.parametrize("factor", [0.3, 3.0, 50.0])
def test_wild_minority_makes_no_finding_on_the_healthy_majority(factor: float) -> None:
    sim = fleet_with_wild_nodes(factor, seed=1)
    report = run_detectors(DetectContext(sim.fleet, DetectConfig(throttle_window_seconds=WINDOW), sim.now))
    assert not report.failed
    healthy = set(list(sim.sims)[:HEALTHY])
    assert [f for f in report.findings if f.node in healthy] == []
    if factor < 1:  # the wild nodes measure slow: they, and only they, are found
        assert {f.node for f in report.findings} == set(list(sim.sims)[HEALTHY:])


def test_baseline_ignores_a_wild_minority() -> None:
    healthy = [100.0 + (i % 7) - 3 for i in range(70)]
    for wild_values in ([1000.0] * 30, [1.0] * 30, [1000.0] * 15 + [1.0] * 15):
        clean, mixed = baseline(healthy), baseline(healthy + wild_values)
        assert mixed.median == clean.median and mixed.mad == clean.mad
        assert mixed.count == 100 and mixed.outliers == 30


def test_baseline_keeps_a_majority_even_when_split() -> None:
    # Two equal camps (a firmware rollout half done): nothing is clipped, the median sits between.
    split = baseline([100.0] * 20 + [50.0] * 20)
    assert split.outliers == 0 and split.median == 75.0


def test_baseline_of_agreeing_peers_is_unchanged() -> None:
    values = [10.0, 10.5, 9.5, 10.2, 9.8]
    base = baseline(values)
    assert (base.median, base.outliers, base.count) == (10.0, 0, 5)
