"""Every host, network and BMC fault of the simulator that host_tuning, infiniband and bmc_health
claim to find: found on its node with its cause, by all detectors together, and nothing else
(tests/controller/detect/test_detection.py does the same for GPU faults)."""

from __future__ import annotations

import pytest

from agent.sources.sim import FAULTS, FaultSpec
from controller.config import DetectConfig
from controller.detect import DETECTED
from controller.detect.base import DetectContext
from controller.detect.runner import run_detectors
from tests.controller.detect.hostsim import HostSimFleet

CAUSES = {
    "cpu_governor_powersave",
    "host_tuning_drift",
    "ib_link_degraded",
    "fan_failure",
    "psu_failure",
    "inlet_temperature_high",
}
FAULT_NAMES = sorted(
    n
    for n, f in FAULTS.items()
    if f.level != "gpu" and f.cause in CAUSES and set(f.shows_in) & DETECTED.get(f.cause, frozenset())
)


def test_every_cause_here_has_its_faults() -> None:
    assert {FAULTS[n].cause for n in FAULT_NAMES} == CAUSES
    assert len(FAULT_NAMES) == 8


@pytest.mark.parametrize("fault", FAULT_NAMES)
def test_each_fault_is_found_with_its_cause_and_nothing_else(fault: str) -> None:
    fleet = HostSimFleet(12, {"node-05": [FaultSpec(fault)]}, gpu_readings=True)
    fleet.run(90)
    report = run_detectors(DetectContext(fleet.fleet, DetectConfig(), fleet.now))
    assert not report.failed
    assert {(f.node, f.gpu, f.cause) for f in report.findings} == {("node-05", None, FAULTS[fault].cause)}
