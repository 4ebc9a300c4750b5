"""XIDs: the catalogue, and the xid detector on crafted state and on simulated XID faults."""

from __future__ import annotations

import dataclasses

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from controller.detect.xid import detect
from controller.detect.xid_catalogue import CATALOGUE, CLASSES, ROW_REMAP_CODES, describe
from controller.fleet.finding import Finding
from controller.fleet.model import Fleet, GpuState, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet

T0 = 1_800_000_000.0
HOUR = 3600.0


def test_every_catalogue_entry_is_complete() -> None:
    assert len(CATALOGUE) >= 30
    for code, entry in CATALOGUE.items():
        assert code > 0 and entry.name and not entry.name.startswith("XID")
        assert entry.klass in CLASSES and entry.severity in ("warning", "critical")
        assert not entry.drain or entry.reset  # draining is for a GPU that waits for its reset
        if entry.repeat is not None:  # a repeat count only where one event says nothing
            assert entry.klass in ("application", "driver") and entry.repeat >= 2 and not entry.signals_fault
    for code in (48, 79, 94, 95, 64, 74):
        assert CATALOGUE[code].reset and CATALOGUE[code].signals_fault
    for code in (48, 79, 95, 64, 74):
        assert CATALOGUE[code].severity == "critical" and CATALOGUE[code].drain
    for code in (13, 31, 43, 45):
        assert CATALOGUE[code].klass == "application" and not CATALOGUE[code].signals_fault
    assert all(CATALOGUE[c].klass == "memory" for c in ROW_REMAP_CODES)
    assert all(CATALOGUE[c].klass == "interconnect" for c in (74, *range(144, 151)))
    assert describe(79) == "XID 79 (GPU fallen off the bus)"
    assert describe(999) == "XID 999 (not in catalogue)"


def node_with(
    events: list[tuple[float, int]], *, counts: dict[int, int] | None = None, at: float = T0
) -> Fleet:
    """One node whose GPU 0 logged `events` (time, code), its latest reading at `at`."""
    node = NodeState("node-00", pb.Hello(node="node-00"), T0, at)
    for when, code in sorted(events):
        node.trends.observe_gpu(
            pb.GpuSample(index=0, xid_events=[pb.XidEvent(code=code, unix_time_seconds=when)]), when
        )
    totals = dict(counts or {})
    for _, code in events:
        totals[code] = totals.get(code, 0) + 1
    sample = pb.GpuSample(
        index=0, xid_counts=[pb.XidCount(code=c, total=n) for c, n in sorted(totals.items())]
    )
    node.trends.observe_gpu(sample, at)
    node.gpus[0] = GpuState(0, sample, at)
    return Fleet(nodes={"node-00": node})


def found(fleet: Fleet, **config: object) -> list[Finding]:
    return detect(DetectContext(fleet, DetectConfig(**config), T0))  # type: ignore[arg-type]


def test_an_application_xid_alone_raises_nothing() -> None:
    assert found(node_with([(T0 - 60, 13)])) == []
    assert found(node_with([(T0 - 60 * i, 31) for i in range(5)])) == []
    assert found(node_with([(T0 - 60 * i, 45) for i in range(50)])) == []  # cleanup after others: never


def test_an_application_xid_repeating_across_jobs_is_suspicious() -> None:
    repeat = CATALOGUE[13].repeat
    assert repeat is not None
    (f,) = found(node_with([(T0 - 60 * i, 13) for i in range(repeat)]))
    assert (f.cause, f.severity, f.evidence.reasons) == ("xid_error", "warning", ("xid13",))
    assert f.evidence.value == repeat and f.evidence.baseline == repeat
    assert f.evidence.baseline_source == "expected" and "suspect the GPU" in f.evidence.detail
    # The same count spread over more than the window is one program's bad day, not the GPU.
    assert found(node_with([(T0 - 300 * i, 13) for i in range(repeat)])) == []


def test_hardware_xid_evidence_names_code_meaning_count_and_times() -> None:
    fleet = node_with([(T0 - 120, 92), (T0 - 60, 92), (T0 - 30, 13)])
    (f,) = found(fleet)
    assert (f.node, f.gpu, f.cause, f.severity) == ("node-00", 0, "xid_error", "warning")
    ev = f.evidence
    assert (ev.metric, ev.value, ev.unit, ev.reasons) == ("xid", 2.0, "events", ("xid92",))
    assert ev.detail.startswith("XID 92 (high single-bit ECC error rate) x2 from ")
    assert f.supporting == []  # XID 13 once: nothing


def test_worst_code_leads_and_the_others_support() -> None:
    (f,) = found(node_with([(T0 - 100, 92), (T0 - 50, 74), (T0 - 10, 121)]))
    assert f.severity == "critical" and f.evidence.reasons == ("xid74",)
    assert f.evidence.detail.endswith(": drain and reset")
    assert sorted(e.reasons[0] for e in f.supporting) == ["xid121", "xid92"]
    assert "+2 more XID codes" in f.summary


def test_a_finding_without_reset_closes_when_the_window_has_passed() -> None:
    assert [f.cause for f in found(node_with([(T0 - 60, 121)]))] == ["xid_error"]
    half = node_with([(T0 - 60, 121)], at=T0 + HOUR / 2)  # readings half an hour on, no new XID
    assert [f.cause for f in found(half)] == ["xid_error"]
    assert found(half, xid_window_seconds=HOUR / 4) == []
    assert found(node_with([(T0 - 60, 121)], at=T0 + HOUR)) == []  # an hour on: closed


def test_a_reset_needing_xid_stays_while_the_agent_counts_it() -> None:
    # The event itself is long gone from the window (or the controller restarted): the count stays.
    (f,) = found(node_with([], counts={48: 1}, at=T0 + 5 * HOUR))
    assert (f.cause, f.severity, f.evidence.value) == ("xid_error", "critical", 1.0)
    assert f.evidence.detail == "XID 48 (double-bit ECC error) x1 since the agent started: drain and reset"
    assert found(node_with([], counts={13: 40, 121: 2})) == []  # counted, not reset-needing: window only


def test_unknown_codes_need_to_repeat() -> None:
    assert found(node_with([(T0 - 10 * i, 250) for i in range(2)])) == []
    (f,) = found(node_with([(T0 - 10 * i, 250) for i in range(3)]))
    assert (f.severity, f.evidence.reasons) == ("warning", ("xid250",))
    assert "XID 250 (not in catalogue) x3" in f.evidence.detail
    assert found(node_with([(T0 - 10 * i, 250) for i in range(3)]), xid_unknown_repeat=4) == []


def test_row_remap_xids_join_the_row_remap_finding() -> None:
    fleet = node_with([(T0 - 10, 94), (T0 - 10, 63)])
    assert [(f.cause, f.severity) for f in found(fleet)] == [("xid_error", "warning")]  # no remap pending
    gpu = fleet.nodes["node-00"].gpus[0]
    remapping = pb.GpuSample()
    remapping.CopyFrom(gpu.sample)
    remapping.row_remap_pending = True
    fleet.nodes["node-00"].gpus[0] = dataclasses.replace(gpu, sample=remapping)  # a reading replaces it
    assert [f.cause for f in found(fleet)] == ["ecc_row_remap_pending", "ecc_row_remap_pending"]
    fleet = node_with([(T0 - 10, 94), (T0 - 5, 95)])
    fleet.nodes["node-00"].gpus[0].sample.row_remap_pending = True
    causes = sorted((f.cause, f.evidence.reasons) for f in found(fleet))
    assert causes == [("ecc_row_remap_pending", ("xid94",)), ("xid_error", ("xid95",))]


def test_simulated_row_remap_fault_gives_one_finding_with_its_xids_as_support() -> None:
    sim = SimFleet(2, {"node-01": [FaultSpec("ecc_row_remap_pending", 3)]})
    for _ in range(3):
        sim.step(10)
    (f,) = run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now)).findings
    assert (f.node, f.gpu, f.cause, f.severity) == ("node-01", 3, "ecc_row_remap_pending", "critical")
    assert f.evidence.metric == "row_remap_pending"  # row_remap's evidence leads
    assert {"xid63", "xid94"} <= {r for e in f.supporting for r in e.reasons}
    assert f.detectors == ["row_remap", "xid"]


@pytest.mark.parametrize(
    ("fault", "code", "meaning"), [("xid_79", 79, "fallen off the bus"), ("xid_48", 48, "double-bit")]
)
def test_simulated_xid_faults_are_found_and_stay(fault: str, code: int, meaning: str) -> None:
    sim = SimFleet(2, {"node-01": [FaultSpec(fault, 5)]})
    for _ in range(3):
        sim.step(10)
    config = DetectConfig()
    findings = [
        f for f in run_detectors(DetectContext(sim.fleet, config, sim.now)).findings if f.cause == "xid_error"
    ]
    assert [(f.node, f.gpu, f.severity) for f in findings] == [("node-01", 5, "critical")]
    (f,) = findings
    assert (
        f.evidence.reasons == (f"xid{code}",)
        and meaning in f.evidence.detail
        and " x1 at " in f.evidence.detail
    )
    for _ in range(9):  # 90 minutes on: the event left the window, the GPU is not reset
        sim.step(600)
    assert sim.fleet.nodes["node-01"].trends.recent_xids(0.0) == []
    (f,) = detect(DetectContext(sim.fleet, config, sim.now))
    assert (f.node, f.gpu) == ("node-01", 5)
    assert f.evidence.detail.endswith("x1 since the agent started: drain and reset")


def test_a_gpu_fallen_off_the_bus_reports_only_xids_and_is_still_found() -> None:
    sim = SimFleet(1, {"node-00": [FaultSpec("xid_79", 1)]})
    sim.step(10)
    sample = sim.fleet.nodes["node-00"].gpus[1].sample
    assert {f.name for f, _ in sample.ListFields()} <= {"index", "uuid", "xid_events", "xid_counts"}
    (f,) = detect(DetectContext(sim.fleet, DetectConfig(), sim.now))
    assert (f.gpu, f.cause, f.severity, f.evidence.reasons) == (1, "xid_error", "critical", ("xid79",))
