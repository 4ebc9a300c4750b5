"""NVLinks up but erroring: rising CRC/replay/recovery counters on active links, from node trends."""

from __future__ import annotations

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.base import DetectContext
from controller.detect.explain import explain_node
from controller.detect.nvlink_errors import detect
from controller.detect.runner import run_detectors
from controller.fleet.finding import Finding
from controller.fleet.model import Fleet, GpuState, NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.simfleet import SimFleet

T0 = 1_800_000_000.0


def found(fleet: Fleet, now: float, **config: object) -> list[Finding]:
    return detect(DetectContext(fleet, DetectConfig(**config), now))  # type: ignore[arg-type]


def erroring(sim: SimFleet, node: str, gpu: int) -> set[int]:
    links: set[int] = sim.sims[node].gpus[gpu].condition.nvlinks_erroring
    assert links
    return links


def test_the_simulated_fault_is_found_on_its_links() -> None:
    sim = SimFleet(3, {"node-01": [FaultSpec("nvlink_crc_errors", 2)]})
    for _ in range(12):
        sim.step(10)
    (f,) = found(sim.fleet, sim.now)
    links = sorted(erroring(sim, "node-01", 2))
    assert (f.node, f.gpu, f.cause, f.severity) == ("node-01", 2, "nvlink_errors", "warning")
    ev = f.evidence
    assert ev.reasons == tuple(r for n in links for r in (f"link{n}_crc", f"link{n}_replay"))
    assert ev.metric == "nvlink.crc_errors_total" and ev.unit == "errors/s"
    assert ev.value == pytest.approx(2.0)  # the simulator's marginal link: 2 CRC errors a second
    assert ev.baseline == pytest.approx(0.1) and ev.baseline_source == "expected"
    assert ev.detail.startswith(f"NVLink {links[0]}: 120 CRC errors/min, 30 replays/min over ")
    assert len(f.supporting) == (len(links) if len(links) > 1 else 0)
    assert found(sim.fleet, sim.now, nvlink_critical_rate_per_minute=100.0)[0].severity == "critical"


def test_a_rise_must_be_seen_in_several_readings_over_the_window() -> None:
    sim = SimFleet(2, {"node-00": [FaultSpec("nvlink_crc_errors", 0)]})
    for _ in range(3):
        sim.step(10)  # the first reading, then two that rose
    assert found(sim.fleet, sim.now) == []
    assert [f.gpu for f in found(sim.fleet, sim.now, nvlink_min_rises=2)] == [0]
    sim.step(10)
    assert [f.gpu for f in found(sim.fleet, sim.now)] == [0]  # found 30 s after the first reading
    assert found(sim.fleet, sim.now, throttle_window_seconds=60.0) == []  # 30 s of readings
    for _ in range(3):
        sim.step(10)
    assert [f.gpu for f in found(sim.fleet, sim.now, throttle_window_seconds=60.0)] == [0]


def test_the_finding_closes_when_the_counters_stop_rising() -> None:
    sim = SimFleet(2, {"node-00": [FaultSpec("nvlink_crc_errors", 4)]})
    for _ in range(12):
        sim.step(10)
    assert [f.gpu for f in found(sim.fleet, sim.now)] == [4]
    erroring(sim, "node-00", 4).clear()  # reseated: the link stays up and stops erroring
    for _ in range(30):
        sim.step(10)
    assert [f.gpu for f in found(sim.fleet, sim.now)] == [4]  # 5 min on: the window still holds the rise
    for _ in range(31):
        sim.step(10)
    assert found(sim.fleet, sim.now) == []


def test_inactive_links_are_nvlink_down_not_errors() -> None:
    sim = SimFleet(2, {"node-01": [FaultSpec("nvlink_down", 3)]})
    for _ in range(12):
        sim.step(10)
    assert found(sim.fleet, sim.now) == []  # their counters rise as they retrain, but they are down
    causes = {f.cause for f in run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now)).findings}
    assert causes == {"nvlink_down"}


def crafted(crc: list[float], step: float = 10.0) -> tuple[Fleet, float]:
    """One GPU with one active link whose CRC total reads `crc`, one reading every `step` seconds."""
    node = NodeState("node-00", pb.Hello(node="node-00"), T0, T0)
    at = T0
    for total in crc:
        link = pb.NvLinkSample(link=3, active=True, crc_errors_total=int(total), replay_errors_total=0)
        sample = pb.GpuSample(index=0, nvlinks=[link])
        node.trends.observe_gpu(sample, at)
        node.gpus[0] = GpuState(0, sample, at)
        at += step
    return Fleet(nodes={"node-00": node}), at - step


def test_a_one_off_jump_is_not_a_rising_counter() -> None:
    fleet, now = crafted([5, 5, 5, 2005, 2005, 2005, 2005, 2005, 2005, 2005])
    assert found(fleet, now) == []  # 2000 errors in one reading: far above the rate, but once
    fleet, now = crafted([5, 5, 5, 1005, 2005, 2005, 2005, 2005, 2005, 2005])
    assert found(fleet, now) == []  # twice
    fleet, now = crafted([5, 5, 5, 1005, 2005, 2005, 2005, 2005, 2005, 3005])
    (f,) = found(fleet, now)  # rising in three readings: erroring
    assert f.evidence.reasons == ("link3_crc",) and f.severity == "critical"


def test_a_slow_trickle_stays_under_the_threshold() -> None:
    fleet, now = crafted([float(n) for n in range(0, 60, 1)])  # 1 CRC error per 10 s: 6/min
    assert [f.severity for f in found(fleet, now)] == ["warning"]
    fleet, now = crafted([float(n // 2) for n in range(0, 60, 1)])  # 3/min
    assert found(fleet, now) == []


def test_a_slow_collective_is_explained_by_erroring_links() -> None:
    sim = SimFleet(8, {"node-03": [FaultSpec("nvlink_crc_errors", 6)]})
    sim.step(10, probes=True)
    for _ in range(10):
        sim.step(10)
    node = sim.fleet.nodes["node-03"]
    ((gpu, cause, (ev,)),) = explain_node(node)
    assert (gpu, cause, ev.metric) == (6, "nvlink_errors", "nvlink.crc_errors_total")
    assert explain_node(node, DetectConfig(nvlink_error_rate_per_minute=500.0)) == []
    sim.fleet.probes[("node-03", None, "nccl", "all_reduce")].value *= 0.7  # the collective is slow
    findings = run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now)).findings
    assert [(f.node, f.gpu, f.cause) for f in findings] == [("node-03", 6, "nvlink_errors")]
    (f,) = findings
    assert f.evidence.metric.startswith("probe.nccl.") and set(f.detectors) == {
        "probe_outlier",
        "nvlink_errors",
    }


def test_a_healthy_fleet_over_a_simulated_hour_raises_nothing() -> None:
    sim = SimFleet(2, seed=7)
    names = ["nvlink", "nvlink_errors", "xid"]
    crc_seen = 0.0
    for step in range(361):  # an hour and ten seconds, a reading every 10 s
        sim.step(10)
        if step % 60 == 0:
            report = run_detectors(DetectContext(sim.fleet, DetectConfig(), sim.now), names)
            assert not report.failed and report.findings == []
    for node in sim.fleet.nodes.values():
        for gpu in node.gpus.values():
            crc_seen += sum(link.crc_errors_total for link in gpu.sample.nvlinks)
    assert crc_seen > 0  # healthy links carry CRC counts from training: flat, never a finding


@pytest.mark.parametrize(
    "bad",
    [
        {"nvlink_error_rate_per_minute": 0.0},
        {"nvlink_error_rate_per_minute": 10.0, "nvlink_critical_rate_per_minute": 5.0},
        {"xid_window_seconds": 0.0},
        {"xid_unknown_repeat": 0},
        {"nvlink_min_rises": 0},
    ],
)
def test_config_refuses_nonsense(bad: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="detect\\."):
        DetectConfig(**bad)  # type: ignore[arg-type]
