"""Findings over passes with hysteresis (controller/fleet/findings.py): open after N of the last M
passes, or at once for conditions held over a window; keep the id through brief gaps; close after K
clean passes."""

from __future__ import annotations

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.detect.offline import OfflineDetector
from controller.fleet.finding import Evidence, Finding, FindingKey
from controller.fleet.findings import FindingTracker, StoredFinding, reconcile
from tests.simfleet import SimFleet

T0 = 1_800_000_000.0
SLOW = Finding("n1", 0, "slow_unknown", "warning", "slow", Evidence("probe.gemm.bf16", 600.0, 700.0))
HELD = Finding("n1", 1, "power_cap", "warning", "capped", Evidence("clock_event_reasons", held_seconds=60.0))


class Passes:
    """A tracker and the active findings, as the controller keeps them, over passes 10 s apart."""

    def __init__(self, tracker: FindingTracker) -> None:
        self.tracker = tracker
        self.active: dict[FindingKey, StoredFinding] = {}
        self.now = T0
        self.opened: list[StoredFinding] = []
        self.resolved: list[StoredFinding] = []

    def run(self, *raised: Finding) -> None:
        self.now += 10.0
        upserts, resolved = self.tracker.reconcile(self.active, list(raised), self.now)
        for stored in upserts:
            if stored.finding.key not in self.active:
                self.opened.append(stored)
            self.active[stored.finding.key] = stored
        for stored in resolved:
            del self.active[stored.finding.key]
            self.resolved.append(stored)


@pytest.fixture
def passes() -> Passes:
    return Passes(FindingTracker.for_config(DetectConfig()))  # 2 of 3 to open, 3 clean to close


def test_a_one_pass_blip_opens_nothing(passes: Passes) -> None:
    passes.run(SLOW)
    for _ in range(5):
        passes.run()
    assert passes.opened == [] and passes.active == {}
    passes.run(SLOW)  # long after: a blip again, not the second of two
    assert passes.opened == []


def test_two_of_three_passes_open_it_dated_from_the_first(passes: Passes) -> None:
    passes.run(SLOW)
    passes.run()
    assert passes.active == {}  # pending: neither stored nor shown
    passes.run(SLOW)
    (opened,) = passes.opened
    assert opened.first_seen == T0 + 10 and opened.last_seen == T0 + 30 and opened.active


def test_a_brief_gap_keeps_the_id_and_k_clean_passes_close_it(passes: Passes) -> None:
    passes.run(SLOW)
    passes.run(SLOW)
    (opened,) = passes.opened
    passes.run()
    passes.run()  # two clean passes: still open
    passes.run(SLOW)
    assert len(passes.opened) == 1 and passes.active[SLOW.key].id == opened.id
    assert passes.active[SLOW.key].last_seen == T0 + 50
    passes.run()
    passes.run()
    assert passes.resolved == []
    passes.run()  # the third clean pass in a row
    (resolved,) = passes.resolved
    assert (resolved.id, resolved.active, resolved.last_seen) == (opened.id, False, T0 + 50)
    assert passes.active == {}
    passes.run(SLOW)
    passes.run(SLOW)
    assert len(passes.opened) == 2 and passes.opened[1].id != opened.id  # a new finding


def test_a_condition_held_over_a_window_opens_at_once(passes: Passes) -> None:
    passes.run(HELD)
    assert [s.finding.key for s in passes.opened] == [HELD.key]
    merged = Finding(SLOW.node, SLOW.gpu, SLOW.cause, "warning", "slow", SLOW.evidence, [HELD.evidence])
    passes.run(HELD, merged)  # probe evidence first, the held condition supporting it: at once too
    assert {s.finding.key for s in passes.opened} == {HELD.key, SLOW.key}


def test_findings_loaded_at_start_are_open_and_close_after_k_clean_passes(passes: Passes) -> None:
    passes.active[SLOW.key] = StoredFinding("abc", SLOW, T0 - 100, T0 - 10)
    passes.run()
    passes.run()
    passes.run(SLOW)
    assert passes.active[SLOW.key].id == "abc" and passes.opened == []
    for _ in range(3):
        passes.run()
    assert [s.id for s in passes.resolved] == ["abc"]


def test_reconcile_without_hysteresis_opens_and_resolves_in_one_pass() -> None:
    upserts, resolved = reconcile({}, [SLOW], T0)
    assert [s.finding.key for s in upserts] == [SLOW.key] and resolved == []
    upserts, resolved = reconcile({SLOW.key: upserts[0]}, [], T0 + 10)
    assert upserts == [] and [s.active for s in resolved] == [False]


@pytest.mark.parametrize(("open_after", "window", "close_after"), [(0, 1, 1), (3, 2, 1), (1, 1, 0)])
def test_bad_settings_are_refused(open_after: int, window: int, close_after: int) -> None:
    with pytest.raises(ValueError, match="open_after"):
        FindingTracker(open_after, window, close_after)
    with pytest.raises(ValueError, match="open_after_passes"):
        DetectConfig(open_after_passes=open_after, open_window_passes=window, close_after_passes=close_after)


def test_offline_detection_opens_throttle_at_once_and_a_probe_outlier_on_the_second_pass() -> None:
    sim = SimFleet(8, {"node-01": [FaultSpec("power_cap", 0)], "node-05": [FaultSpec("hbm_degraded", 2)]})
    detector = OfflineDetector(DetectConfig(throttle_window_seconds=5.0))
    detector.fleet = sim.fleet
    sim.step(probes=True)
    for _ in range(7):
        sim.step()
    first = detector.detect(sim.now)
    assert [(s.finding.node, s.finding.cause) for s in first.opened] == [("node-01", "power_cap")]
    sim.step()
    second = detector.detect(sim.now)
    assert [(s.finding.node, s.finding.cause) for s in second.opened] == [("node-05", "hbm_degraded")]
    assert second.opened[0].first_seen == first.time  # raised since the first pass
