"""probe_outlier's baselines (issue 16): own history and the datasheet where peers are too few, a
change against a GPU's own history within the peers' margin, and a margin that follows the group's
spread. Fleets come from the simulator through the real wire messages (tests/simfleet.py)."""

from __future__ import annotations

import random

from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from controller.detect.stats import baseline
from controller.fleet.finding import Finding
from controller.fleet.series import Series
from tests.simfleet import SimFleet

HOUR = 3600.0
OTHER_MODEL = "NVIDIA H200 141GB HBM3e"


def findings(sim: SimFleet, **overrides: object) -> list[Finding]:
    config = DetectConfig(throttle_window_seconds=5.0, **overrides)  # type: ignore[arg-type]
    report = run_detectors(DetectContext(sim.fleet, config, sim.now))
    assert not report.failed
    return report.findings


def membw(found: list[Finding]) -> list[tuple[str, int | None, str, str]]:
    return sorted(
        (f.node, f.gpu, f.cause, f.evidence.baseline_source)
        for f in found
        if f.evidence.metric.startswith("probe.membw")
    )


def rounds(sim: SimFleet, n: int) -> None:
    for _ in range(n):
        sim.step(HOUR, probes=True)


def small_group(sim: SimFleet, node: str = "node-08", gpus: tuple[int, ...] = (0, 1, 2)) -> None:
    """Three GPUs of a model no one else has: a peer group of 3, under min_peers (4)."""
    for info in sim.fleet.nodes[node].hello.inventory.gpus:
        if info.index in gpus:
            info.name = OTHER_MODEL


def test_small_group_slow_gpu_is_found_against_its_own_history() -> None:
    sim = SimFleet(9, seed=1)
    small_group(sim)
    rounds(sim, 6)
    assert membw(findings(sim)) == []
    sim.sims["node-08"].gpus[1].condition.hbm_factor = 0.9
    rounds(sim, 1)
    found = [f for f in findings(sim) if f.evidence.metric.startswith("probe.membw")]
    assert membw(found) == [("node-08", 1, "hbm_degraded", "own_history")]
    (finding,) = found
    evidence = finding.evidence
    assert evidence.peers == 6 and evidence.deviation is not None and -0.11 < evidence.deviation < -0.09
    assert "below its own median of" in evidence.detail and "GB/s over 6 runs" in evidence.detail
    assert "its own history" in finding.summary


def test_small_group_without_history_falls_back_to_the_datasheet() -> None:
    sim = SimFleet(9, seed=1)
    small_group(sim)
    sim.sims["node-08"].gpus[2].condition.hbm_factor = 0.88
    rounds(sim, 1)  # one result each: no own history yet
    found = [f for f in findings(sim) if f.evidence.metric.startswith("probe.membw")]
    assert membw(found) == [("node-08", 2, "hbm_degraded", "datasheet")]
    evidence = found[0].evidence
    assert evidence.peers == 9 * 8  # the fleet's results with a peak_ratio, every model
    assert evidence.baseline is not None and evidence.value is not None and evidence.baseline > evidence.value
    assert "of the datasheet peak over 72 results" in evidence.detail
    assert membw(findings(sim, min_peers=100)) == []  # too few results for a usual ratio either


def test_a_drop_within_the_peers_margin_is_found_against_its_own_history() -> None:
    sim = SimFleet(12, seed=1)
    rounds(sim, 8)
    values = {k: r.value for k, r in sim.fleet.probes.items() if k[2] == "membw"}
    median = baseline(list(values.values())).median
    best = max(values, key=lambda k: values[k])
    node, gpu = best[0], best[1]
    assert gpu is not None and values[best] / median - 1 > 0.015  # above its peers, as GPUs vary
    sim.sims[node].gpus[gpu].condition.hbm_factor = 0.94  # 6% down
    rounds(sim, 2)
    record = sim.fleet.probes[best]
    peers = baseline([r.value for k, r in sim.fleet.probes.items() if k[2:] == best[2:]])
    assert 0.02 < -peers.deviation(record.value) < 0.05  # within the peers' 5% margin
    found = findings(sim)
    assert membw(found) == [(node, gpu, "hbm_degraded", "own_history")]  # and no healthy GPU
    assert membw(findings(sim, change_floor=0.07)) == []  # the change test is what found it
    (finding,) = found
    assert "the mean of its newest 2 runs" in finding.evidence.detail
    assert "the median of 96 peers" in finding.evidence.detail


def test_a_drop_that_leaves_a_gpu_above_its_peers_is_no_finding() -> None:
    sim = SimFleet(12, seed=1)
    rounds(sim, 8)
    values = {k: r.value for k, r in sim.fleet.probes.items() if k[2] == "membw"}
    key = max(values, key=lambda k: values[k])
    *earlier, latest = list(sim.fleet.history[key])
    sim.fleet.history[key] = Series([(t, v * 1.08) for t, v in earlier] + [latest])  # 8% faster until now
    assert membw(findings(sim)) == []  # a clear drop, but still above its peers' median


def test_a_noisy_group_widens_the_margin() -> None:
    sim = SimFleet(6, seed=1)
    rounds(sim, 1)
    keys = sorted(k for k in sim.fleet.probes if k[2] == "membw")
    noise = random.Random(7)
    slow = keys[5]
    for spread, expected in ((0.04, []), (0.004, [(slow[0], slow[1], "peers")])):
        for key in keys:
            sim.fleet.probes[key].value = 2900.0 * (1.0 + noise.gauss(0.0, spread))
            sim.fleet.probes[key].result.ClearField("during")
        sim.fleet.probes[slow].value = 2900.0 * 0.93  # 7% below: under 3 sigmas of a 4% spread
        group = baseline([sim.fleet.probes[k].value for k in keys])
        assert (group.margin(0.05, 3.0) > 0.07) == (spread == 0.04)
        assert [(n, g, source) for n, g, _, source in membw(findings(sim))] == expected


def test_peers_are_the_baseline_of_a_big_enough_group() -> None:
    sim = SimFleet(6, seed=1)
    rounds(sim, 1)
    key = sorted(k for k in sim.fleet.probes if k[2] == "membw")[3]
    sim.fleet.probes[key].value *= 0.85
    found = [f for f in findings(sim) if f.evidence.metric.startswith("probe.membw")]
    assert [f.evidence.baseline_source for f in found] == ["peers"]
    assert "below the median of 48 peers" in found[0].evidence.detail


def test_healthy_fleet_over_many_probe_rounds_has_no_findings() -> None:
    sim = SimFleet(8, seed=2)
    small_group(sim, "node-07")
    for _ in range(14):  # own histories long enough for the change test from the 7th
        sim.step(HOUR, probes=True)
        assert findings(sim) == []
