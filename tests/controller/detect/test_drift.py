"""Drift: a VBIOS, driver, BIOS or BMC firmware version, or a BIOS attribute, that differs from the
strict majority of the node's peer group (controller/detect/drift.py)."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from agent.sources.bmc import BmcSample
from agent.sources.sim import FaultSpec
from agent.sources.sim.faults.bmc import BIOS_DRIFT
from agent.sources.sim.profile import H100_SXM
from controller.cli import finding_view
from controller.config import DetectConfig
from controller.detect import drift as drift_module
from controller.detect.drift_values import KEPT
from controller.fleet.expiry import forget
from controller.fleet.finding import Finding
from controller.fleet.model import NodeState
from controller.fleet.state import apply_hello
from protos.gpufleet.v1 import findings_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet


def drift(sim: HostSimFleet, **config: int) -> list[Finding]:
    return sim.detect("drift", DetectConfig(**config))  # type: ignore[arg-type]


def keys(findings: list[Finding]) -> list[tuple[str, int | None, str, str]]:
    return sorted((f.node, f.gpu, f.cause, f.severity) for f in findings)


def fleet(nodes: int, faults: dict[str, list[FaultSpec]] | None = None) -> HostSimFleet:
    sim = HostSimFleet(nodes, faults)
    sim.step()  # one frame each, carrying a BMC poll
    return sim


def test_a_healthy_fleet_has_no_drift() -> None:
    sim = fleet(16)
    assert all(n.bmc is not None and n.bmc.bios_attributes for n in sim.fleet.nodes.values())
    assert drift(sim) == []


def test_an_older_vbios_on_one_gpu_is_firmware_drift_with_the_majority() -> None:
    sim = fleet(16, {"node-05": [FaultSpec("vbios_drift", 2)]})
    (finding,) = drift(sim)
    assert (finding.node, finding.gpu, finding.cause, finding.severity) == (
        "node-05",
        2,
        "firmware_drift",
        "warning",
    )
    ev = finding.evidence
    odd = sim.fleet.nodes["node-05"].hello.inventory.gpus[2].vbios_version
    assert odd != H100_SXM.vbios_version
    assert ev.metric == "vbios_version" and ev.baseline_source == "fleet_majority"
    assert ev.reasons == (f"VBIOS {odd}", f"majority {H100_SXM.vbios_version}")
    assert ev.peers == 127
    assert ev.detail == f"VBIOS {odd} on GPU 2; the majority, 127 of 128 GPUs, run {H100_SXM.vbios_version}"
    assert finding.summary.startswith("GPU 2 VBIOS")


def test_older_bmc_firmware_is_node_level_firmware_drift() -> None:
    sim = fleet(16, {"node-09": [FaultSpec("bmc_firmware_drift")]})
    (finding,) = drift(sim)
    assert keys([finding]) == [("node-09", None, "firmware_drift", "warning")]
    majority = sim.fleet.nodes["node-00"].bmc.bmc_firmware_version  # type: ignore[union-attr]
    assert finding.evidence.metric == "bmc_firmware_version"
    assert finding.evidence.reasons[1] == f"majority {majority}"
    assert finding.evidence.detail.endswith(f"the majority, 15 of 16 peers, run {majority}")
    # The CLI's evidence line is the detail alone: it says the reasons' words, nothing twice.
    ev = finding.evidence
    sent = findings_pb2.Evidence(
        detail=ev.detail, reasons=list(ev.reasons), peers=ev.peers, baseline_source=ev.baseline_source
    )
    assert finding_view.evidence_line(sent) == ev.detail


def test_drifted_bios_attributes_of_a_node_are_one_info_finding() -> None:
    faults = {"node-03": [FaultSpec("bios_drift", "TurboMode"), FaultSpec("bios_drift", "SubNumaClustering")]}
    sim = fleet(16, faults)
    (finding,) = drift(sim)
    assert keys([finding]) == [("node-03", None, "bios_drift", "info")]
    evidence = [finding.evidence, *finding.supporting]
    assert sorted(e.metric for e in evidence) == [
        "bios_attributes.SubNumaClustering",
        "bios_attributes.TurboMode",
    ]
    turbo = next(e for e in evidence if e.metric == "bios_attributes.TurboMode")
    assert turbo.reasons[0] == f"BIOS attribute TurboMode {BIOS_DRIFT['TurboMode']}"
    assert turbo.peers == 15 and turbo.baseline_source == "fleet_majority"
    assert "2 settings differ" in finding.summary


def test_driver_drift_is_info_and_merges_with_bmc_firmware_drift_on_the_node() -> None:
    sim = fleet(8, {"node-01": [FaultSpec("bmc_firmware_drift")]})
    sim.fleet.nodes["node-01"].hello.inventory.driver_version = "535.54.03"
    (finding,) = drift(sim)
    assert keys([finding]) == [("node-01", None, "firmware_drift", "warning")]  # the worse of the two
    assert finding.evidence.metric == "bmc_firmware_version"
    assert [e.metric for e in finding.supporting] == ["driver_version"]
    sim = fleet(8)
    sim.fleet.nodes["node-01"].hello.inventory.driver_version = "535.54.03"
    assert keys(drift(sim)) == [("node-01", None, "firmware_drift", "info")]


def test_a_group_split_in_two_camps_has_no_majority_and_no_finding() -> None:
    sim = fleet(8, {f"node-{i:02d}": [FaultSpec("bmc_firmware_drift")] for i in range(4)})
    assert drift(sim) == []


def test_fewer_nodes_than_min_peers_give_no_finding() -> None:
    sim = fleet(3, {"node-01": [FaultSpec("bmc_firmware_drift")]})
    assert drift(sim, min_peers=4) == []
    assert keys(drift(sim, min_peers=3)) == [("node-01", None, "firmware_drift", "warning")]


def test_a_failed_bios_section_counts_neither_way() -> None:
    def failed_bios(sample: BmcSample) -> BmcSample:
        sections = [dataclasses.replace(s, success=s.name != "bios") for s in sample.sections]
        return dataclasses.replace(sample, sections=sections, bios_attributes={"TurboMode": "Disabled"})

    sim = HostSimFleet(8)
    sim.poll_override["node-04"] = failed_bios  # what it reports of its BIOS is not a reading
    sim.step()
    assert drift(sim) == []


def test_each_peer_group_has_its_own_majority() -> None:
    sim = fleet(8)
    for name in ("node-00", "node-01", "node-02"):  # another model: their own group, too small
        for info in sim.fleet.nodes[name].hello.inventory.gpus:
            info.name, info.vbios_version = "NVIDIA H200", "96.00.AA.00.01"
    assert drift(sim) == []


def test_a_new_bmc_poll_or_hello_is_read_at_the_next_pass_and_a_forgotten_node_is_dropped() -> None:
    sim = fleet(8)
    assert drift(sim) == []  # every node's values read, and kept
    sim.poll_override["node-02"] = lambda sample: dataclasses.replace(sample, bios_version="0.9.1")
    sim.step(60.0)  # a frame with a new BMC poll: a new sample, read again
    assert keys(drift(sim)) == [("node-02", None, "firmware_drift", "warning")]
    hello = pb.Hello()
    hello.CopyFrom(sim.fleet.nodes["node-05"].hello)
    hello.inventory.driver_version = "535.54.03"
    apply_hello(sim.fleet, hello, 0, sim.now)  # the agent says hello again, on another driver
    assert keys(drift(sim)) == [
        ("node-02", None, "firmware_drift", "warning"),
        ("node-05", None, "firmware_drift", "info"),
    ]
    del sim.poll_override["node-02"]
    sim.step(60.0)
    assert keys(drift(sim)) == [("node-05", None, "firmware_drift", "info")]
    forget(sim.fleet, ["node-05"])
    assert drift(sim) == []
    kept = sim.fleet.derived[KEPT][1]
    assert isinstance(kept, dict) and sorted(kept) == sorted(sim.fleet.nodes)  # node-05's values went too


def test_a_group_is_compared_again_only_when_a_members_values_change(monkeypatch: pytest.MonkeyPatch) -> None:
    sim = fleet(8, {"node-03": [FaultSpec("bios_drift", "TurboMode")]})
    found = keys(drift(sim))
    assert found == [("node-03", None, "bios_drift", "info")]
    compared: list[int] = []
    real = drift_module._bmc_side

    def counted(members: list[NodeState], *args: Any) -> Any:
        compared.append(len(members))
        return real(members, *args)

    monkeypatch.setattr(drift_module, "_bmc_side", counted)
    sim.step(60.0)  # every node polled again, the same values: the group as it was
    assert keys(drift(sim)) == found and compared == []
    sim.poll_override["node-05"] = lambda sample: dataclasses.replace(sample, bios_version="0.9.1")
    sim.step(60.0)
    assert keys(drift(sim)) == [*found[:1], ("node-05", None, "firmware_drift", "warning")]
    assert compared == [8]
    assert keys(drift(sim, min_peers=9)) == [] and compared == [8, 8]  # another config: compared again
