"""The controller compares a probe kind it has never heard of (the test-only `latency`, lower is
better) with its peers, the way its ProbeInfo says, through the real wire messages."""

from __future__ import annotations

from agent.snapshot import Snapshot
from agent.stream import frames
from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from controller.fleet.finding import Finding
from controller.fleet.state import apply_frame, apply_hello, plan_frame
from tests.probe_kind import NAME, UNIT, VARIANT, LatencyProbes, latency_registered
from tests.simfleet import SimFleet


def latency_fleet(factors: dict[tuple[str, int], float], *, higher_is_better: bool | None = None) -> SimFleet:
    """Six simulated nodes that offer `latency`; GPU (node, index) in `factors` takes that many times
    as long. `higher_is_better` overrides what the Hello declares (None: as the kernel declares)."""
    sim = SimFleet(6)
    with latency_registered():
        for name, node in sim.sims.items():
            hello = frames.hello(
                name,
                f"boot-{name}",
                "test",
                node.inventory(),
                host=None,
                probes=["gemm", NAME],
                started_at=sim.now,
            )
            if higher_is_better is not None:
                hello.probe_infos[-1].higher_is_better = higher_is_better
            apply_hello(sim.fleet, hello, 0, sim.now)
        sim.now += 1.0
        for name, node in sim.sims.items():
            results = []
            for gpu in range(len(node.gpus)):
                factor = factors.get((name, gpu), 1.0)
                results += LatencyProbes(node, slow=[gpu], factor=factor).run([NAME], gpus=[gpu])
            snapshot = Snapshot(node=name, time=sim.now, gpus=node.read(), probes=results)
            sim.seq[name] += 1
            frame = frames.frame(snapshot, f"boot-{name}", sim.seq[name])
            write, _ = plan_frame(sim.fleet.nodes[name], frame, sim.now)
            apply_frame(sim.fleet, write)
    return sim


def findings(sim: SimFleet) -> list[Finding]:
    report = run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now))
    assert not report.failed
    return report.findings


def test_the_results_are_stored_with_their_unit() -> None:
    sim = latency_fleet({})
    records = [r for r in sim.fleet.probes.values() if r.probe == NAME]
    assert len(records) == 6 * 8 and {(r.variant, r.unit) for r in records} == {(VARIANT, UNIT)}
    assert [i.name for i in sim.fleet.nodes["node-00"].hello.probe_infos] == ["gemm", NAME]
    assert findings(sim) == []  # healthy scatter: nothing to report


def test_a_slow_gpu_on_a_new_probe_kind_is_found_by_peer_comparison() -> None:
    sim = latency_fleet({("node-02", 5): 1.15, ("node-04", 1): 1.6})
    found = sorted(findings(sim), key=lambda f: f.node)
    assert [(f.node, f.gpu, f.cause, f.severity) for f in found] == [
        ("node-02", 5, "slow_unknown", "warning"),
        ("node-04", 1, "slow_unknown", "critical"),  # 60% worse than its peers
    ]
    evidence = found[0].evidence
    assert evidence.metric == f"probe.{NAME}.{VARIANT}" and evidence.unit == UNIT
    assert evidence.deviation is not None and evidence.deviation > 0.1  # higher latency: worse
    assert evidence.peers == 48 and "lower is better" in evidence.detail
    assert found[0].summary.startswith(f"GPU 5 {NAME} {VARIANT} 1") and found[0].summary.endswith(
        "% above peers"
    )


def test_a_fast_gpu_is_not_slow_when_lower_is_better() -> None:
    assert findings(latency_fleet({("node-01", 3): 0.7})) == []


def test_which_way_is_better_comes_from_the_probe_info_in_the_hello() -> None:
    sim = latency_fleet({("node-01", 3): 0.7, ("node-02", 5): 1.6}, higher_is_better=True)
    assert [(f.node, f.gpu) for f in findings(sim)] == [("node-01", 3)]  # declared higher-is-better
