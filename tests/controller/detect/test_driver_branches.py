"""driver_branch_slow (controller/detect/driver_branches.py): a driver branch whose GPUs probe slower
than GPUs built alike on another branch, which probe_outlier cannot see since each branch is judged
among its own. Simulated nodes through the real frames (tests/simfleet.py); a node's branch is what
its Hello says, its results scaled as a slower driver would make them."""

from __future__ import annotations

import random
from dataclasses import replace

from agent.sources.sim import SimNode
from agent.sources.sim.profile import H100_SXM
from controller.config import DetectConfig
from controller.detect import driver_branches, probe_outlier
from controller.detect.base import DetectContext
from controller.detect.runner import merge, run_detectors
from controller.detect.stats import baseline
from controller.fleet.finding import Evidence, Finding
from controller.fleet.model import ProbeKey, ProbeRecord
from controller.fleet.state import apply_hello
from protos.gpufleet.v1 import findings_pb2
from tests.simfleet import SimFleet

NEW = "560.28.03"
LOW_POWER = replace(H100_SXM, default_power_limit_watts=500.0, max_power_limit_watts=500.0)


def on_branch(sim: SimFleet, nodes: list[str], version: str = NEW) -> None:
    for name in nodes:
        hello = sim.hello(name)
        hello.inventory.driver_version = version
        for info in hello.inventory.gpus:
            info.driver_version = version
        apply_hello(sim.fleet, hello, 0, sim.now)


def slower(sim: SimFleet, nodes: list[str], factor: float, probe: str = "gemm") -> None:
    """The nodes' `probe` results `factor` times what they were (lower is worse: higher is better)."""
    for key, record in list(sim.fleet.probes.items()):
        if record.node in nodes and record.probe == probe:
            sim.fleet.probes[key] = replace(record, value=record.value * factor)
    sim.fleet.probe_version += 1


def fleet(new: list[str], factor: float, nodes: int = 12) -> SimFleet:
    sim = SimFleet(nodes)
    on_branch(sim, new)
    sim.step(3600.0, probes=True)
    slower(sim, new, factor)
    return sim


def found(sim: SimFleet) -> list[Finding]:
    return driver_branches.detect(DetectContext(sim.fleet, DetectConfig(), sim.now))


def test_a_slower_branch_is_found_on_each_of_its_nodes_with_the_evidence() -> None:
    sim = fleet(["node-03", "node-07", "node-10"], 0.9)
    findings = found(sim)
    assert [(f.node, f.gpu, f.cause, f.severity) for f in findings] == [
        (n, None, "driver_branch_slow", "warning") for n in ("node-03", "node-07", "node-10")
    ]
    ev = findings[0].evidence
    assert ev.metric.startswith("probe.gemm.") and ev.unit == "TFLOP/s" and ev.baseline_source == "peers"
    assert ev.deviation is not None and ev.value is not None and ev.baseline is not None
    assert ev.deviation < -0.05 and ev.value < ev.baseline
    assert ev.peers >= 9 * 8  # the best branch's results: 9 nodes of 8 GPUs
    assert "on driver 560 (median" in ev.detail and "over 24 GPU results on 3 nodes)" in ev.detail
    assert "below driver 550 (median" in ev.detail
    assert (
        "GPUs otherwise alike (NVIDIA H100 80GB HBM3, 692-2G520-0200-000, 18 NVLinks, 700 W, driver *)"
        in (ev.detail)
    )
    assert findings[0].summary.startswith("driver 560: gemm ") and findings[0].summary.endswith(
        "below driver 550"
    )
    # probe_outlier judges each branch among its own: not one of these GPUs is an outlier there.
    assert probe_outlier.detect(DetectContext(sim.fleet, DetectConfig(), sim.now)) == []


def test_a_branch_within_the_margin_is_not_slow_and_one_node_is_no_reference() -> None:
    assert found(fleet(["node-03", "node-07"], 0.98)) == []  # 2% slower: within the 5% margin
    faster = {f.node for f in found(fleet(["node-03", "node-07"], 1.1))}
    assert faster and not faster & {"node-03", "node-07"}  # faster: the others are the slow branch
    assert found(fleet(["node-03"], 1.2)) == []  # one node faster: no evidence against the rest
    assert found(fleet([], 1.0)) == []  # one branch


def test_a_lone_node_on_a_slower_branch_is_found() -> None:
    """Judged among its own GPUs alone, probe_outlier cannot see it."""
    sim = fleet(["node-03"], 0.88)
    findings = found(sim)
    assert [(f.node, f.cause) for f in findings] == [("node-03", "driver_branch_slow")]
    assert "over 8 GPU results on 1 node)" in findings[0].evidence.detail
    assert probe_outlier.detect(DetectContext(sim.fleet, DetectConfig(), sim.now)) == []


def small_node(sim: SimFleet, name: str, gpus: int) -> None:
    """`name` as a node of `gpus` GPUs (probe results from those only)."""
    sim.sims[name] = SimNode(name, seed=1, gpus=gpus, faults=[], clock=lambda: sim.now)
    apply_hello(sim.fleet, sim.hello(name), 0, sim.now)


def test_a_lone_node_of_fewer_gpus_than_min_peers_is_judged_by_its_best_result() -> None:
    """A 2-GPU node on an odd branch has no median worth the name (min_peers 4): every one of its
    results behind the reference branch makes the finding, and the evidence says it is the best."""
    sim = SimFleet(12)
    small_node(sim, "node-03", 2)
    on_branch(sim, ["node-03"])
    sim.step(3600.0, probes=True)
    slower(sim, ["node-03"], 0.88)
    findings = found(sim)
    assert [(f.node, f.cause) for f in findings] == [("node-03", "driver_branch_slow")]
    ev = findings[0].evidence
    assert "on driver 560 (best of its 2 GPU results " in ev.detail and " on 1 node) is " in ev.detail
    assert ev.value is not None and ev.baseline is not None and ev.value < 0.9 * ev.baseline
    best = max(
        r.value
        for r in sim.fleet.probes.values()
        if r.node == "node-03" and r.probe == "gemm" and ev.metric == f"probe.gemm.{r.variant}"
    )
    assert ev.value == round(best, 3)
    assert probe_outlier.detect(DetectContext(sim.fleet, DetectConfig(), sim.now)) == []


def test_a_small_nodes_gpus_slow_on_the_datasheet_fold_into_its_branch_finding() -> None:
    """Its class too small for peers, probe_outlier judges the 2-GPU node's results by the datasheet
    ratio and finds them slow with no cause; the branch explains them: one finding, their evidence
    kept as supporting, each naming its GPU."""
    sim = SimFleet(12)
    small_node(sim, "node-03", 2)
    sim.sims["node-03"].load_driver(NEW, gemm_factor=0.87)  # as the simulator's host fault does
    apply_hello(sim.fleet, sim.hello("node-03"), 0, sim.now)
    sim.step(3600.0, probes=True)
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    unknown = [f for f in probe_outlier.detect(ctx) if f.node == "node-03"]
    assert {(f.gpu, f.cause) for f in unknown} == {(0, "slow_unknown"), (1, "slow_unknown")}
    report = run_detectors(ctx)
    causes = {(f.gpu, f.cause) for f in report.findings if f.node == "node-03"}
    assert (None, "driver_branch_slow") in causes and all(c != "slow_unknown" for _, c in causes), causes
    [branch] = [f for f in report.findings if f.cause == "driver_branch_slow"]
    assert branch.detectors == ["driver_branch_slow", "probe_outlier"]
    folded = [e.detail for e in branch.supporting if e.detail.startswith("GPU ")]
    assert any(d.startswith("GPU 0: gemm ") for d in folded) and any(
        d.startswith("GPU 1: gemm ") for d in folded
    )
    assert all("datasheet peak" in d for d in folded)
    # Its own evidence: every GEMM variant the branch is behind on, the furthest first.
    own = [branch.evidence, *(e for e in branch.supporting if not e.detail.startswith("GPU "))]
    assert {e.metric for e in own} == {f"probe.gemm.{v}" for v in ("bf16", "fp16", "tf32", "fp8")}
    assert [e.deviation for e in own] == sorted(e.deviation or 0.0 for e in own)


def test_only_slow_results_of_probes_the_branch_is_behind_on_fold_into_it() -> None:
    """A GPU's slow membw beside a branch slow at GEMM is not the branch's: it stays a finding of its
    own, as does one whose evidence is partly GEMM and partly not (nothing hidden in supporting)."""

    def ev(metric: str) -> Evidence:
        return Evidence(metric=metric, detail=f"{metric} slow")

    def unknown(gpu: int, *metrics: str) -> Finding:
        first, *rest = (ev(m) for m in metrics)
        return Finding("n1", gpu, "slow_unknown", "warning", "slow", first, rest, ["probe_outlier"])

    branch = Finding(
        "n1",
        None,
        "driver_branch_slow",
        "warning",
        "driver 560",
        ev("probe.gemm.fp8"),
        [ev("probe.gemm.bf16")],
        ["driver_branch_slow"],
    )
    merged = merge(
        [
            branch,
            unknown(0, "probe.gemm.bf16", "probe.gemm.fp8"),
            unknown(1, "probe.membw.d2d"),
            unknown(2, "probe.gemm.bf16", "probe.pcie.h2d"),
            replace(unknown(3, "probe.gemm.bf16"), node="n2"),  # another node: its branch is not slow
        ]
    )
    assert {(f.node, f.gpu, f.cause) for f in merged} == {
        ("n1", 1, "slow_unknown"),
        ("n1", 2, "slow_unknown"),
        ("n1", None, "driver_branch_slow"),
        ("n2", 3, "slow_unknown"),
    }
    assert len(merged) == 4
    [folded] = [f for f in merged if f.cause == "driver_branch_slow"]
    assert [e.detail for e in folded.supporting] == [
        "probe.gemm.bf16 slow",
        "GPU 0: probe.gemm.bf16 slow",
        "GPU 0: probe.gemm.fp8 slow",
    ]


def test_one_slow_gpu_of_a_small_node_does_not_make_its_branch_slow() -> None:
    """Heat or a power cap on one GPU is that GPU's: the small branch's best result is in line."""
    sim = SimFleet(12)
    small_node(sim, "node-03", 2)
    on_branch(sim, ["node-03"])
    sim.step(3600.0, probes=True)
    for key, record in list(sim.fleet.probes.items()):
        if record.node == "node-03" and record.gpu == 0:
            sim.fleet.probes[key] = replace(record, value=record.value * 0.8)
    sim.fleet.probe_version += 1
    assert found(sim) == []
    small_node(sim, "node-05", 1)  # one GPU alone on another, slower branch: its one result decides
    on_branch(sim, ["node-05"], "565.57.01")
    sim.step(3600.0, probes=True)
    slower(sim, ["node-05"], 0.85)
    findings = found(sim)
    assert [f.node for f in findings] == ["node-05"]
    assert "(best of its one GPU result " in findings[0].evidence.detail


def test_the_older_branch_is_the_slow_one_when_the_new_one_is_faster() -> None:
    sim = fleet(["node-00", "node-01", "node-02", "node-03", "node-04", "node-05"], 1.12)
    findings = found(sim)
    assert {f.node for f in findings} == {f"node-{i:02d}" for i in range(6, 12)}
    assert all(
        f.summary.startswith("driver 550: ") and f.summary.endswith("below driver 560") for f in findings
    )


def test_only_gpus_built_alike_are_compared() -> None:
    """A 500 W board's GEMM on one branch is no evidence against that branch's 700 W boards."""
    sim = SimFleet(10)
    for name in ("node-08", "node-09"):
        sim.sims[name] = SimNode(name, seed=1, profile=LOW_POWER, faults=[], clock=lambda: sim.now)
        apply_hello(sim.fleet, sim.hello(name), 0, sim.now)
    on_branch(sim, ["node-08", "node-09"])  # only the 500 W boards run the new branch
    sim.step(3600.0, probes=True)
    assert found(sim) == []  # their GEMM is well below the 700 W boards', but they are not alike


def test_the_finding_is_a_known_cause_and_runs_with_the_others() -> None:
    assert findings_pb2.Cause.Value("CAUSE_DRIVER_BRANCH_SLOW") == 20
    sim = fleet(["node-03", "node-07"], 0.85)
    report = run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now))
    assert {(f.node, f.cause) for f in report.findings if f.cause == "driver_branch_slow"} == {
        ("node-03", "driver_branch_slow"),
        ("node-07", "driver_branch_slow"),
    }


def test_the_judgement_is_reused_until_the_results_change() -> None:
    sim = fleet(["node-03", "node-07"], 0.85)
    ctx = DetectContext(sim.fleet, DetectConfig(), sim.now)
    first = driver_branches.judged(ctx)
    assert driver_branches.judged(ctx) is first
    slower(sim, ["node-03", "node-07"], 1 / 0.85)  # back as fast as the rest
    assert driver_branches.judged(ctx) == []


def test_split_branch() -> None:
    assert driver_branches.split_branch("692-2G520-0200-000, 18 NVLinks, 700 W, driver 550") == (
        "692-2G520-0200-000, 18 NVLinks, 700 W",
        "550",
    )
    assert driver_branches.split_branch("driver 535") == ("", "535")
    assert driver_branches.split_branch("18 NVLinks, 700 W") == ("18 NVLinks, 700 W", "")
    assert driver_branches.split_branch("") == ("", "")


def test_a_large_branchs_median_is_read_from_a_sample_of_its_results() -> None:
    rng = random.Random(3)
    members: dict[ProbeKey, ProbeRecord] = {
        (f"node-{i // 8}", i % 8, "gemm", "bf16"): ProbeRecord(
            f"node-{i // 8}", i % 8, "gemm", "bf16", 700.0 * rng.uniform(0.95, 1.05), "TFLOP/s", 0.0, b""
        )
        for i in range(20_000)
    }
    sampled = driver_branches._baseline(members)
    full = baseline([r.value for r in members.values()])
    assert sampled.count == 20_000 and abs(sampled.deviation(full.median)) < 0.002
    assert driver_branches._nodes(members) == frozenset(f"node-{i}" for i in range(2_500))
