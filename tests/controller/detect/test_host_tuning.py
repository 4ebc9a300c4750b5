"""Host OS settings against the peer group's majority (or the profile, in a small group): simulated
nodes with hosts and BMCs through the real wire (hostsim.py)."""

from __future__ import annotations

import pytest

from agent.sources.sim import FaultSpec
from controller.config import DetectConfig
from controller.fleet.finding import Finding
from controller.fleet.model import NodeState
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet

HOST_AND_BMC = ("host_tuning", "infiniband", "bmc_health")


def found(fleet: HostSimFleet, detector: str = "host_tuning") -> dict[tuple[str, str], Finding]:
    return {(f.node, f.cause): f for f in fleet.detect(detector)}


def new_host(node: NodeState) -> pb.HostSample:
    """A copy of the node's host sample, put in its place to be edited: as ingest does, a sample is
    replaced, never changed in place (what a pass read of the one it replaces is kept)."""
    assert node.host is not None
    host = pb.HostSample()
    host.CopyFrom(node.host)
    node.host = host
    return host


def test_a_healthy_fleet_raises_no_host_network_or_bmc_cause_over_an_hour() -> None:
    # Frames every 2 minutes, each with a BMC poll, and a detection pass every 6 (frames every 10 s
    # and polls every minute would say the same, at six times the cost).
    fleet = HostSimFleet(16, bmc_every=120.0)
    for _ in range(10):
        fleet.run(360, step=120.0)
        for detector in HOST_AND_BMC:
            assert fleet.detect(detector) == [], detector
    assert all(n.bmc is not None and n.host is not None for n in fleet.fleet.nodes.values())


@pytest.mark.parametrize("seed", [2, 3, 4])
def test_healthy_fleets_of_other_seeds_raise_nothing(seed: int) -> None:
    fleet = HostSimFleet(8, seed=seed)
    fleet.run(660, step=30.0)  # eleven minutes: past the IB counters' window
    for detector in HOST_AND_BMC:
        assert fleet.detect(detector) == [], detector


def test_powersave_governor_is_found_against_the_majority_and_clears_when_set_back() -> None:
    fleet = HostSimFleet(16, {"node-03": [FaultSpec("cpu_governor_powersave")]})
    fleet.run(60)
    findings = found(fleet)
    assert list(findings) == [("node-03", "cpu_governor_powersave")]
    f = findings[("node-03", "cpu_governor_powersave")]
    assert (f.gpu, f.severity, f.detectors) == (None, "warning", ["host_tuning"])
    assert f.evidence.metric == "cpu_governor" and f.evidence.reasons == ("powersave",)
    assert f.evidence.baseline_source == "fleet_majority" and f.evidence.peers == 16
    assert "15 of 16 in the peer group performance" in f.evidence.detail
    (freq,) = f.supporting
    assert (freq.metric, freq.unit, freq.baseline_source, freq.peers) == (
        "cpu_frequency_hz",
        "Hz",
        "peers",
        15,
    )
    assert freq.value is not None and freq.baseline is not None
    assert freq.value < 0.5 * freq.baseline and freq.deviation is not None and freq.deviation < -0.5
    fleet.add("node-03", [])  # the governor set back (the node rebuilt without the fault)
    fleet.run(20)
    assert found(fleet) == {}


def test_a_group_that_runs_powersave_on_purpose_raises_nothing() -> None:
    # intel_pstate's "powersave" is its dynamic default: a fleet running it everywhere is no fault.
    faults = {f"node-{i:02d}": [FaultSpec("cpu_governor_powersave")] for i in range(10)}
    fleet = HostSimFleet(16, faults)
    fleet.run(30)
    assert found(fleet) == {}


def test_numa_balancing_and_thp_drift_are_one_finding_with_each_setting_named() -> None:
    faults = {
        "node-01": [FaultSpec("numa_balancing_on")],
        "node-02": [FaultSpec("thp_disabled")],
        "node-05": [FaultSpec("numa_balancing_on"), FaultSpec("thp_disabled")],
    }
    fleet = HostSimFleet(16, faults)
    fleet.run(30)
    findings = found(fleet)
    assert set(findings) == {(n, "host_tuning_drift") for n in faults}
    numa, thp, both = (findings[(n, "host_tuning_drift")] for n in ("node-01", "node-02", "node-05"))
    assert numa.evidence.reasons == ("numa_balancing", "on") and numa.supporting == []
    assert thp.evidence.reasons == ("transparent_hugepage", "never") and thp.supporting == []
    assert [e.metric for e in (both.evidence, *both.supporting)] == ["numa_balancing", "transparent_hugepage"]
    for f in (numa, thp, both):
        assert (f.gpu, f.severity) == (None, "warning")
        assert all(e.baseline_source == "fleet_majority" for e in (f.evidence, *f.supporting))
    assert "in the peer group madvise" in thp.evidence.detail
    assert "in the peer group off" in numa.evidence.detail
    for name in faults:
        fleet.add(name, [])
    fleet.run(20)
    assert found(fleet) == {}


def test_a_harmless_odd_value_is_info_drift() -> None:
    fleet = HostSimFleet(8)
    for name, (_, host, _) in fleet.sims.items():
        host.condition.transparent_hugepage = "madvise" if name == "node-04" else "always"
    fleet.run(20)
    (f,) = fleet.detect("host_tuning")
    assert (f.node, f.cause, f.severity) == ("node-04", "host_tuning_drift", "info")
    assert f.evidence.reasons == ("transparent_hugepage", "madvise")


def test_a_node_at_the_profiles_values_is_tuned_not_drifted() -> None:
    """os-accelerator-performance sets THP always and NUMA balancing off: a node it tuned differs
    from a madvise fleet, and must not raise the finding its retune was meant to clear."""
    fleet = HostSimFleet(8, {"node-04": [FaultSpec("numa_balancing_on")]})
    fleet.run(20)
    assert set(found(fleet)) == {("node-04", "host_tuning_drift")}
    condition = fleet.sims["node-04"][1].condition
    condition.numa_balancing, condition.transparent_hugepage = False, "always"  # as the profile sets them
    fleet.run(20)
    assert found(fleet) == {}


def test_a_small_group_falls_back_to_the_profile_and_flags_only_harmful_values() -> None:
    faults = {
        "node-00": [FaultSpec("cpu_governor_powersave"), FaultSpec("thp_disabled")],
        "node-01": [FaultSpec("numa_balancing_on")],
    }
    fleet = HostSimFleet(3, faults)  # below detect.min_peers (4): no majority to compare with
    fleet.sims["node-02"][1].condition.transparent_hugepage = "always"  # odd, but harmless
    fleet.run(20)
    findings = found(fleet)
    assert set(findings) == {
        ("node-00", "cpu_governor_powersave"),
        ("node-00", "host_tuning_drift"),
        ("node-01", "host_tuning_drift"),
    }
    for f in findings.values():
        assert f.evidence.baseline_source == "expected"
        assert "profile os-accelerator-performance" in f.evidence.detail
    assert findings[("node-00", "host_tuning_drift")].evidence.reasons == ("transparent_hugepage", "never")
    # With min_peers lowered to the group's size, the majority decides again.
    relaxed = {(f.node, f.cause) for f in fleet.detect("host_tuning", DetectConfig(min_peers=3))}
    assert relaxed == set(findings)


def test_the_governor_is_the_one_most_cpus_run_and_the_evidence_counts_them() -> None:
    fleet = HostSimFleet(6, {"node-02": [FaultSpec("cpu_governor_powersave")]})
    fleet.run(20)
    node = fleet.fleet.nodes["node-02"]
    assert node.host is not None and dict(node.host.cpu_governors) == {"powersave": 32}
    assert not node.host.cpus  # the frames carry the counts, not each CPU's reading
    (f,) = found(fleet).values()
    assert f.evidence.detail.startswith("CPU governor powersave on 32 of 32 CPUs; ")
    # The summary names the first CPU's governor: the counts decide, both ways.
    host = new_host(node)
    host.cpu_governor = "performance"
    host.cpu_governors.clear()
    host.cpu_governors.update({"performance": 2, "powersave": 30})
    (f,) = found(fleet).values()
    assert (f.node, f.cause) == ("node-02", "cpu_governor_powersave")
    assert f.evidence.detail.startswith("CPU governor powersave on 30 of 32 CPUs; ")
    other = new_host(fleet.fleet.nodes["node-03"])
    assert dict(other.cpu_governors) == {"performance": 32}
    other.cpu_governor = "powersave"
    assert list(found(fleet)) == [("node-02", "cpu_governor_powersave")]
    # A tie goes to the first by name; a name sent empty or with no CPUs counts for none.
    host = new_host(node)
    host.cpu_governors.clear()
    host.cpu_governors.update({"powersave": 16, "performance": 16, "": 40, "schedutil": 0})
    assert found(fleet) == {}
    for governors in ({"powersave": 0}, {"": 32}):  # one governor alone, but on no CPU or unnamed: none
        host = new_host(node)
        host.ClearField("cpu_governor")
        host.cpu_governors.clear()
        host.cpu_governors.update(governors)
        assert found(fleet) == {}, governors
    new_host(node).cpu_governor = "powersave"  # ... and the summary is read then
    assert list(found(fleet)) == [("node-02", "cpu_governor_powersave")]


def test_an_older_agents_summary_or_per_cpu_readings_give_the_governor() -> None:
    fleet = HostSimFleet(6, {"node-02": [FaultSpec("cpu_governor_powersave")]})
    fleet.run(20)
    for node in fleet.fleet.nodes.values():  # frames as an agent before HostSample.cpu_governors
        host = new_host(node)
        governors = dict(host.cpu_governors)
        host.ClearField("cpu_governors")
        names = [name for name, count in governors.items() for _ in range(count)]
        for cpu, name in enumerate(names):
            host.cpus.add(cpu=cpu, governor=name)
    (f,) = found(fleet).values()
    assert (f.node, f.cause) == ("node-02", "cpu_governor_powersave")
    assert f.evidence.detail.startswith("CPU governor powersave on 32 of 32 CPUs; ")
    for node in fleet.fleet.nodes.values():  # no summary: the CPUs' own readings still say it
        new_host(node).ClearField("cpu_governor")
    assert list(found(fleet)) == [("node-02", "cpu_governor_powersave")]
    for node in fleet.fleet.nodes.values():  # the summary alone
        host = new_host(node)
        host.ClearField("cpus")
        host.cpu_governor = "powersave" if node.name == "node-02" else "performance"
    (f,) = found(fleet).values()
    assert f.evidence.detail.startswith("CPU governor powersave; ")
