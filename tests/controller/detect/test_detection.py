"""Detection over a simulated fleet: each injected fault is found where it is, with the right cause,
and nothing else is flagged."""

from __future__ import annotations

import pytest

from agent.sources.sim import FAULTS, FaultSpec
from controller.config import DetectConfig, DetectorConfig
from controller.detect import DETECTED
from controller.detect.base import DetectContext
from controller.detect.explain import explain_gpu
from controller.detect.runner import run_detectors
from protos.gpufleet.v1 import telemetry_pb2 as pb
from protos.names import CAUSES
from tests.simfleet import SimFleet

WINDOW = 5.0
# The simulator's faults the detectors claim to find: their cause, from a field the fault shows in.
DETECTABLE = sorted(n for n, f in FAULTS.items() if set(f.shows_in) & DETECTED.get(f.cause, frozenset()))
# The GPU-level ones, each on one GPU (host, network and BMC faults: test_host_faults.py; firmware
# and BIOS drift: test_drift.py).
GPU_FAULTS = [n for n in DETECTABLE if FAULTS[n].level == "gpu"]


def detect(sim: SimFleet, **overrides: object) -> list[tuple[str, int | None, str, str]]:
    config = DetectConfig(throttle_window_seconds=WINDOW, **overrides)  # type: ignore[arg-type]
    report = run_detectors(DetectContext(sim.fleet, config, sim.now))
    assert not report.failed
    return sorted((f.node, f.gpu, f.cause, f.severity) for f in report.findings)


def run(nodes: int, faults: dict[str, list[FaultSpec]], seed: int = 1) -> SimFleet:
    sim = SimFleet(nodes, faults, seed=seed)
    sim.step(probes=True)
    for _ in range(int(WINDOW) + 2):
        sim.step()
    return sim


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_healthy_fleet_has_no_findings(seed: int) -> None:
    assert detect(run(24, {}, seed)) == []


@pytest.mark.parametrize("fault", GPU_FAULTS)
def test_each_fault_is_found_with_its_cause_and_nothing_else(fault: str) -> None:
    sim = run(12, {"node-05": [FaultSpec(fault, 2)]})
    found = detect(sim)
    assert {(n, g, c) for n, g, c, _ in found} == {("node-05", 2, FAULTS[fault].cause)}


def test_detected_causes_are_the_contracts_and_each_has_a_fault_to_show_it() -> None:
    assert set(DETECTED) <= set(CAUSES)
    assert {FAULTS[name].cause for name in DETECTABLE} == set(DETECTED)


def test_throttle_needs_the_window() -> None:
    sim = SimFleet(8, {"node-01": [FaultSpec("power_cap", 0)]})
    sim.step()
    sim.step()
    assert detect(sim) == []  # held 1 s of a 5 s window; no probe results yet
    for _ in range(6):
        sim.step()
    assert [(n, g, c) for n, g, c, _ in detect(sim)] == [("node-01", 0, "power_cap")]


def test_throttle_held_ends_at_the_last_reading_of_a_silent_node() -> None:
    sim = SimFleet(8, {"node-01": [FaultSpec("power_cap", 0), FaultSpec("pcie_downtrained", 1)]})
    sim.step()  # one throttled, downtrained sample; then the node goes silent
    sim.now += 600.0
    assert detect(sim) == []  # held 0 s at its last reading; the node is stale, not throttled
    sim = SimFleet(8, {"node-01": [FaultSpec("power_cap", 0)]})
    for _ in range(8):
        sim.step()
    config = DetectConfig(throttle_window_seconds=WINDOW)
    before = run_detectors(DetectContext(sim.fleet, config, sim.now)).findings
    sim.now += 600.0  # silent: an open finding stays as its last reading left it, not growing
    after = run_detectors(DetectContext(sim.fleet, config, sim.now)).findings
    assert [f.evidence.held_seconds for f in before] == [f.evidence.held_seconds for f in after] == [7.0]


def test_probe_finding_carries_evidence_and_merges_with_telemetry() -> None:
    sim = run(8, {"node-03": [FaultSpec("thermal_throttle", 6)]})
    config = DetectConfig(throttle_window_seconds=WINDOW)
    (finding,) = run_detectors(DetectContext(sim.fleet, config, sim.now)).findings
    assert finding.evidence.metric.startswith("probe.gemm.")
    assert finding.evidence.deviation is not None and finding.evidence.deviation < -0.05
    assert finding.evidence.peers == 64
    assert finding.evidence.baseline is not None and finding.evidence.value is not None
    assert set(finding.detectors) == {"probe_outlier", "throttle"}
    metrics = {e.metric for e in finding.supporting}
    assert {"temperature_celsius", "sm_clock_hz", "clock_event_reasons"} <= metrics


def test_slow_gpu_without_evidence_is_slow_unknown() -> None:
    sim = run(8, {})
    record = sim.fleet.probes[("node-02", 4, "gemm", "bf16")]
    record.value *= 0.8
    found = detect(sim)
    assert ("node-02", 4, "slow_unknown", "warning") in found


def test_slow_node_without_evidence_is_node_level_unknown() -> None:
    sim = run(8, {})
    record = sim.fleet.probes[("node-06", None, "nccl", "all_reduce")]
    record.value *= 0.7
    assert detect(sim) == [("node-06", None, "slow_unknown", "critical")]


def test_too_few_peers_gives_no_baseline() -> None:
    sim = run(2, {"node-01": [FaultSpec("hbm_degraded", 0)]}, seed=4)
    # 16 GPUs are enough peers for GPU probes; 2 nodes are too few for the node-level NCCL baseline.
    found = detect(sim, min_peers=4)
    assert [(n, g, c) for n, g, c, _ in found] == [("node-01", 0, "hbm_degraded")]
    assert detect(sim, min_peers=32) == []


def test_disabled_detector_is_not_run() -> None:
    sim = run(8, {"node-01": [FaultSpec("ecc_row_remap_pending", 1)]})
    config = DetectConfig(
        throttle_window_seconds=WINDOW, detectors={"row_remap": DetectorConfig(enabled=False)}
    )
    names = config.enabled(["nvlink", "pcie_link", "probe_outlier", "row_remap", "throttle"])
    assert "row_remap" not in names
    assert run_detectors(DetectContext(sim.fleet, config, sim.now), names).findings == []


@pytest.mark.parametrize("during", [pb.GpuSample(), pb.GpuSample(index=2, uuid="GPU-2")])
def test_an_empty_during_counts_as_absent(during: pb.GpuSample) -> None:
    sim = run(12, {"node-05": [FaultSpec("hbm_degraded", 2)]})
    (record,) = [r for r in sim.fleet.probes.values() if r.key[:3] == ("node-05", 2, "membw")]
    result = record.result  # a copy: the record keeps its result serialized
    result.during.CopyFrom(during)  # no reading while the probe ran (set, but empty)
    record.data = result.SerializeToString()
    latest = sim.fleet.nodes["node-05"].gpus[2].sample
    latest.memory_clock_hz = latest.max_memory_clock_hz / 2  # the latest reading: memory clocks down
    assert [(n, g, c) for n, g, c, _ in detect(sim)] == [("node-05", 2, "slow_unknown")]


@pytest.mark.parametrize(
    "sample",
    [
        pb.GpuSample(index=0, max_memory_clock_hz=2_619_000_000),  # no memory clock read
        pb.GpuSample(index=0, memory_clock_hz=2_619_000_000),  # no maximum known
    ],
)
def test_a_slow_copy_without_both_memory_clocks_is_not_blamed_on_hbm(sample: pb.GpuSample) -> None:
    """Blaming HBM needs the memory clock seen at its maximum; a missing clock used to read as 0,
    i.e. "at max", and guessed hbm_degraded."""
    assert explain_gpu("membw", sample)[0] == "slow_unknown"
    at_max = pb.GpuSample(index=0, memory_clock_hz=2_619_000_000, max_memory_clock_hz=2_619_000_000)
    assert explain_gpu("membw", at_max)[0] == "hbm_degraded"
