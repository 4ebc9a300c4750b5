"""What the BMC says about fans, PSUs and the inlet: simulated nodes with BMCs through the real wire
(hostsim.py), failed polls, stale samples and sensors without thresholds."""

from __future__ import annotations

import dataclasses

from agent.sources.bmc import SECTIONS, BmcSample, BmcSectionStatus
from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.fleet.finding import Finding
from tests.controller.detect.hostsim import HostSimFleet


def bmc(fleet: HostSimFleet, config: DetectConfig | None = None) -> dict[tuple[str, str], Finding]:
    findings = fleet.detect("bmc_health", config)
    assert all(f.gpu is None and f.detectors == ["bmc_health"] for f in findings)
    return {(f.node, f.cause): f for f in findings}


FAULTS = {
    "node-01": [FaultSpec.parse("fan_failure:3")],
    "node-02": [FaultSpec.parse("psu_failure:2")],
    "node-03": [FaultSpec("inlet_temperature_high")],
}


def test_each_bmc_fault_is_its_own_cause_with_evidence_and_clears_when_repaired() -> None:
    fleet = HostSimFleet(8, FAULTS)
    fleet.run(60)
    findings = bmc(fleet)
    assert set(findings) == {
        ("node-01", "fan_failure"),
        ("node-02", "psu_failure"),
        ("node-03", "inlet_temperature_high"),
    }
    fan = findings[("node-01", "fan_failure")]
    assert fan.severity == "critical" and fan.supporting == []
    assert (fan.evidence.metric, fan.evidence.value, fan.evidence.unit) == ("fans.speed_rpm", 0.0, "rpm")
    assert fan.evidence.reasons == ("Fan_3", "health_critical", "stopped")
    assert fan.evidence.baseline is not None and fan.evidence.baseline > 5000 and fan.evidence.peers == 9
    assert fan.evidence.detail.startswith("Fan_3 at 0 rpm (health critical), other fans' median ")
    psu = findings[("node-02", "psu_failure")]
    assert psu.severity == "critical"
    assert psu.evidence.reasons == ("PSU_2", "health_critical", "no_output")
    assert (psu.evidence.value, psu.evidence.unit, psu.evidence.peers) == (0.0, "W", 5)
    (redundancy,) = psu.supporting
    assert redundancy.metric == "power_supply_redundancy_health"
    assert redundancy.detail == "PSU redundancy (N+m) warning"
    inlet = findings[("node-03", "inlet_temperature_high")]
    assert inlet.severity == "warning" and inlet.supporting == []
    assert (inlet.evidence.metric, inlet.evidence.unit) == ("temperatures.intake_celsius", "C")
    assert inlet.evidence.value is not None and 35.0 <= inlet.evidence.value < 40.0
    assert (inlet.evidence.baseline, inlet.evidence.baseline_source) == (35.0, "expected")
    assert inlet.evidence.reasons == ("Inlet_Temp", "above_caution")
    for name in FAULTS:
        fleet.add(name, [])
    fleet.run(60)
    assert bmc(fleet) == {}


def failed(sample: BmcSample) -> BmcSample:
    """The poll that never reached the BMC."""
    error = "unreachable: connection refused"
    return BmcSample(
        time=sample.time,
        endpoint=sample.endpoint,
        error=error,
        sections=[BmcSectionStatus(n, False, 0.0, f"not read: {error}") for n in SECTIONS],
    )


def thermal_failed(sample: BmcSample) -> BmcSample:
    """A poll whose thermal section failed part way: what it read of fans and temperatures is not
    to be trusted as the whole (a fan missing from a half-read list is no evidence)."""
    sections = [dataclasses.replace(s, success=s.name != "thermal") for s in sample.sections]
    return dataclasses.replace(sample, success=False, sections=sections)


def test_a_failed_poll_raises_nothing_from_what_it_did_not_read() -> None:
    fleet = HostSimFleet(6, {"node-02": [FaultSpec.parse("psu_failure:1"), FaultSpec.parse("fan_failure:2")]})
    fleet.run(60)
    assert set(bmc(fleet)) == {("node-02", "psu_failure"), ("node-02", "fan_failure")}
    fleet.poll_override = {name: failed for name in fleet.sims}
    fleet.run(60)
    assert all(n.bmc is not None and n.bmc.error for n in fleet.fleet.nodes.values())
    assert bmc(fleet) == {}  # nothing read: nothing raised (and nothing invented from empty lists)
    fleet.poll_override = {name: thermal_failed for name in fleet.sims}
    fleet.run(60)
    # The power section was read: the PSU still shows; thermal failed: no fan finding from it.
    assert set(bmc(fleet)) == {("node-02", "psu_failure")}
    fleet.poll_override = {}
    fleet.run(60)
    assert set(bmc(fleet)) == {("node-02", "psu_failure"), ("node-02", "fan_failure")}


def test_a_bmc_that_stopped_answering_is_not_used_after_the_age_limit() -> None:
    fleet = HostSimFleet(4, {"node-00": [FaultSpec.parse("fan_failure:1")]}, bmc_every=60.0)
    fleet.run(60)
    assert set(bmc(fleet)) == {("node-00", "fan_failure")}
    fleet.bmc_every = 1e9  # no more polls; frames go on
    fleet.run(300 - (fleet.now - fleet.fleet.nodes["node-00"].bmc_time))
    assert set(bmc(fleet)) == {("node-00", "fan_failure")}  # polled 300 s ago: within the limit
    fleet.run(20)
    assert bmc(fleet) == {}
    assert set(bmc(fleet, DetectConfig(bmc_max_age_seconds=900.0))) == {("node-00", "fan_failure")}


def without_thresholds(sample: BmcSample) -> BmcSample:
    temps = [
        dataclasses.replace(
            t, upper_caution_celsius=None, upper_critical_celsius=None, upper_fatal_celsius=None
        )
        for t in sample.temperatures
    ]
    return dataclasses.replace(sample, temperatures=temps)


def test_an_intake_without_thresholds_is_compared_with_the_peer_groups_median() -> None:
    fleet = HostSimFleet(6, {"node-04": [FaultSpec("inlet_temperature_high")]})
    fleet.poll_override = {name: without_thresholds for name in fleet.sims}
    fleet.run(60)
    findings = bmc(fleet)
    assert set(findings) == {("node-04", "inlet_temperature_high")}
    e = findings[("node-04", "inlet_temperature_high")].evidence
    assert (e.baseline_source, e.peers, e.reasons) == ("peers", 6, ("Inlet_Temp", "above_peers"))
    assert e.value is not None and e.baseline is not None and e.value - e.baseline >= 8.0
    assert "peers' median" in e.detail and "margin 8 C" in e.detail
    assert bmc(fleet, DetectConfig(inlet_margin_celsius=20.0)) == {}
    assert bmc(fleet, DetectConfig(min_peers=7)) == {}  # too few readings for a median


def test_an_absent_psu_bay_and_an_idle_fan_alone_are_no_failures() -> None:
    def empty_bay(sample: BmcSample) -> BmcSample:
        psus = list(sample.power_supplies)
        psus[-1] = dataclasses.replace(psus[-1], state="absent", health="", output_watts=0.0, input_watts=0.0)
        return dataclasses.replace(sample, power_supplies=psus)

    fleet = HostSimFleet(4)
    fleet.poll_override = {"node-01": empty_bay}
    fleet.run(60)
    assert bmc(fleet) == {}

    def enabled_but_dead(sample: BmcSample) -> BmcSample:  # enabled and healthy, yet delivering nothing
        psus = list(sample.power_supplies)
        psus[0] = dataclasses.replace(psus[0], output_watts=0.0)
        return dataclasses.replace(sample, power_supplies=psus)

    fleet.poll_override = {"node-01": enabled_but_dead}
    fleet.run(60)
    f = bmc(fleet)[("node-01", "psu_failure")]
    assert f.severity == "warning" and f.evidence.reasons == ("PSU_1", "health_ok", "no_output")


def test_a_bmc_sample_is_judged_once_and_a_new_poll_again() -> None:
    """A BMC is polled about once a minute, passes run every few seconds: a node's fans and PSUs
    are judged once per sample (fleet.derived), and judged again when a new poll arrives."""
    fleet = HostSimFleet(4, {"node-01": [FaultSpec.parse("fan_failure:3")]})
    fleet.run(60)
    first = bmc(fleet)
    assert set(first) == {("node-01", "fan_failure")}
    (reads,) = fleet.fleet.derived["bmc_health"]
    assert bmc(fleet) == first  # no new poll: the same judgement, not worked out again
    (again,) = fleet.fleet.derived["bmc_health"]
    assert again["node-01"] is reads["node-01"]  # type: ignore[index]
    fleet.add("node-01", [])  # repaired: its next polls show every fan spinning
    fleet.run(60)
    assert bmc(fleet) == {}
    (later,) = fleet.fleet.derived["bmc_health"]
    assert later["node-01"] is not reads["node-01"]  # type: ignore[index]
