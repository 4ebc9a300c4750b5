"""A small step of bench/detection.py, so that it cannot rot: a gross fault on a 4-node fleet and a
healthy fleet, through the same driving, scoring and report as the full suite (not its targets)."""

from __future__ import annotations

import random
import sys
from pathlib import Path
from typing import Any

import pytest

from agent.sources.sim import SimNode
from agent.sources.sim.faults import FAULTS

# bench/ is a folder of scripts; its detection_scenarios package is imported from there.
sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))

from detection_scenarios.drive import Event, Run, Truth, run
from detection_scenarios.report import build, text
from detection_scenarios.scenarios import (
    Injection,
    Scenario,
    Timing,
    fault_fleets,
    full_suite,
    healthy_fleet,
    mixed_power_fleet,
)
from detection_scenarios.score import false_events, score
from detection_scenarios.severity import TARGETS, set_severity, slowdown
from detection_scenarios.static_rule import healthy_baseline

TINY = Timing(warmup=60.0, probe_interval=300.0, tail=60.0)


@pytest.fixture(scope="module")
def result() -> dict[str, Any]:
    fleets = fault_fleets([("thermal_throttle", "severe")], TINY, nodes=4, per_fleet=1, seed=5)
    healthy = healthy_fleet("healthy", ("h100",) * 4, 900.0, step=10.0, probe_interval=300.0, seed=6)
    runs = [run(s) for s in [*fleets, healthy]]
    meta = {
        "mode": "test",
        "seed": 5,
        "jobs": 1,
        "wall_seconds": 0.0,
        "cpu_seconds": 0.0,
        "detector_config": "",
    }
    return build(runs, healthy_baseline(7), meta)


def test_a_gross_fault_is_found_with_its_cause(result: dict[str, Any]) -> None:
    (fault,) = result["faults"]
    assert fault["fault"] == "thermal_throttle/severe"
    assert fault["slowdown"] == pytest.approx(0.30, abs=0.02)
    assert fault["detected"] and fault["cause_right"], fault
    assert fault["causes_found"][0] == "thermal_throttle"
    assert fault["frames_to_detect"] is not None and fault["frames_to_detect"] <= 12
    # The probe round after onset shows the static rule the slow GEMM too.
    assert fault["static_detected"] is True


def test_a_healthy_fleet_gives_no_finding(result: dict[str, Any]) -> None:
    healthy = next(s for s in result["scenarios"] if s["kind"] == "healthy")
    assert healthy["findings_opened"] == 0, healthy["false_findings"]
    assert healthy["frames"] == 4 * 90
    assert result["overall"]["controller"]["healthy_events"] == 0
    assert healthy["static"]["locations"] == 0


def test_the_report_has_every_metric_and_target(result: dict[str, Any]) -> None:
    for method in ("controller", "static"):
        overall = result["overall"][method]
        for key in (
            "precision",
            "recall_slow",
            "recall_all",
            "frames_to_detect_p50",
            "frames_to_detect_p90",
            "churn",
            "throttle_seconds_p50",
            "false_opens",
        ):
            assert key in overall
    assert result["overall"]["controller"]["precision"] == 1.0
    assert result["overall"]["controller"]["recall_slow"] == 1.0
    assert [t["name"] for t in result["targets"]] == [
        "precision",
        "recall_slow",
        "cause_accuracy",
        "healthy",
        "throttle",
    ]
    assert {t["verdict"] for t in result["targets"]} <= {"PASS", "short", "n/a"}
    shown = text(result)
    assert "Targets" in shown and "static rule" in shown and "thermal_throttle/severe" in shown


def _scored(events: list[Event]) -> dict[str, Any]:
    scenario = Scenario("s", "fault", ("h100",) * 2, 600.0, 10.0, 300.0)
    inj = Injection("hbm_degraded", "mild", "node-00", 3, onset=100.0, end=200.0)
    return score(Run(scenario, [Truth(inj, 0.055)]), events).as_dict()


def test_scoring_counts_wrong_places_times_and_causes() -> None:
    right = Event(150.0, "node-00", 3, "hbm_degraded")
    assert _scored([right])["precision"] == 1.0 and _scored([right])["cause_accuracy"] == 1.0
    assert _scored([right])["frames_to_detect_p50"] == 5
    # Another GPU of the node, before onset, or after the fault's end plus grace: false alarms.
    for wrong in (
        Event(150.0, "node-00", 2, "hbm_degraded"),
        Event(90.0, "node-00", 3, "hbm_degraded"),
        Event(330.0, "node-00", 3, "hbm_degraded"),
    ):
        scored = _scored([wrong])
        assert scored["precision"] == 0.0 and scored["recall_all"] == 0.0, wrong
    # A node-level finding on the fault's node counts; the wrong cause lowers cause accuracy only.
    scored = _scored([Event(150.0, "node-00", None, "slow_unknown")])
    assert scored["recall_slow"] == 1.0 and scored["cause_accuracy"] == 0.0
    assert _scored([right, Event(160.0, "node-00", 3, "hbm_degraded")])["churn"] == 2.0


@pytest.mark.parametrize("fault", ["thermal_throttle", "power_cap", "power_brake", "clocks_locked_low"])
def test_a_mild_severity_slows_the_gpu_about_five_percent(fault: str) -> None:
    gpu = SimNode("n", seed=3).gpus[0]
    rng = random.Random(1)
    FAULTS[fault].apply(gpu, None, rng)
    set_severity(fault, "mild", gpu, 24.0, rng)
    assert TARGETS["mild"] <= slowdown(gpu, 24.0) < TARGETS["mild"] + 0.015


def test_the_full_suite_injects_every_registered_fault() -> None:
    scenarios = full_suite(1).scenarios
    injected = {i.fault for s in scenarios for i in s.injections}
    assert injected >= set(FAULTS)
    assert any(s.kind == "healthy" and s.seconds >= 86400.0 for s in scenarios)
    assert any(len(set(s.models)) > 1 for s in scenarios)
    for s in scenarios:  # one fault per node
        nodes = [i.node for i in s.injections]
        assert len(nodes) == len(set(nodes)) and set(nodes) <= set(s.nodes)


def test_boards_of_one_model_at_two_power_classes_are_no_false_alarms() -> None:
    """Three 500 W and five 700 W H100 nodes of one name: before probe results were compared by
    class (controller/fleet/peers.py), every healthy GPU of the 500 W nodes was a slow outlier
    (`bench/detection.py --quick`: precision 0.226, 24 false locations). Faults on either class are
    found with their cause."""
    scenario = mixed_power_fleet(TINY, seed=5)
    assert {scenario.models[int(i.node[-2:])] for i in scenario.injections} == {"h100", "h100-500w"}
    ran = run(scenario)
    scored = score(ran, ran.opens)
    assert false_events(ran, ran.opens) == []
    assert [(f.label, f.detected, f.causes[:1]) for f in scored.faults] == [
        ("clocks_locked_low/mild", True, ["clocks_locked_low"]),
        ("power_brake/moderate", True, ["power_brake"]),
        ("power_cap/moderate", True, ["power_cap"]),
    ]
