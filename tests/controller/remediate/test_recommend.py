"""Recommendations from findings, pure: the cause map's fix restricted to the cause's settings,
exact changes from the node's readings, verification bars from its peers, drain/investigate when no
setting fixes the cause, the fleet's BIOS value, firmware recommended only, and the policy."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.sources.sim import FaultSpec
from controller.config import ConfigError, DetectConfig, TuningConfig, load
from controller.fleet.finding import Evidence, Finding
from controller.fleet.findings import StoredFinding
from controller.fleet.model import Fleet, GpuState, NodeState, ProbeRecord
from controller.profiles import load_catalogue, load_cause_map
from controller.remediate.changes import applicable, targets_of
from controller.remediate.plans import plan_profile
from controller.remediate.recommend import Knowledge, Proposal, propose
from controller.store.recommendations import Change
from protos.gpufleet.v1 import bmc_pb2
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.detect.hostsim import HostSimFleet
from tests.controller.harness import hello

CATALOGUE = load_catalogue()
CAUSES = load_cause_map()
DETECT = DetectConfig()  # margin 0.05, min_peers 4
LOCKED = pb.CLOCK_EVENT_REASON_APPLICATIONS_CLOCKS_SETTING


def know(**policy: str) -> Knowledge:
    return Knowledge(CAUSES, CATALOGUE, TuningConfig(policy=policy).mode, DETECT)


def sample(index: int, **fields: object) -> pb.GpuSample:
    base: dict[str, object] = {
        "power_management_limit_watts": 700.0,
        "enforced_power_limit_watts": 700.0,
        "default_power_limit_watts": 700.0,
        "persistence_mode_enabled": True,
    }
    return pb.GpuSample(index=index, **(base | fields))  # type: ignore[arg-type]


def fleet(nodes: int = 5, gpus: int = 4, gemm: float = 700.0) -> Fleet:
    """`nodes` nodes n0.. of `gpus` H100s at their defaults, each GPU with a gemm bf16 result."""
    out = Fleet()
    for n in range(nodes):
        name = f"n{n}"
        node = NodeState(name, hello(name, gpus=gpus, probes=["gemm", "membw"]), 0.0, 0.0)
        node.host = pb.HostSample(
            cpu_governor="performance", numa_balancing=False, transparent_hugepage="always"
        )
        for i in range(gpus):
            node.gpus[i] = GpuState(i, sample(i), 0.0)
            result = pb.ProbeResult(probe="gemm", variant="bf16", gpu=i, value=gemm + n, unit="TFLOP/s")
            out.probes[(name, i, "gemm", "bf16")] = ProbeRecord.of(name, i, result, 0.0)
        out.nodes[name] = node
    return out


def finding(node: str, gpu: int | None, cause: str, fid: str = "") -> StoredFinding:
    f = Finding(node, gpu, cause, "warning", f"{cause}", Evidence("x"))
    return StoredFinding(fid or f"{node}-{gpu}-{cause}", f, 1.0, 2.0)


def only(proposals: list[Proposal]) -> Proposal:
    assert len(proposals) == 1, proposals
    return proposals[0]


def test_power_cap_restores_the_default_limit_on_the_capped_gpus_with_gemm_bars() -> None:
    f = fleet()
    f.nodes["n0"].gpus[1].sample.power_management_limit_watts = 300.0
    f.probes[("n0", 1, "gemm", "bf16")].value = 420.0
    # GPU 3 is reported too, but its limit reads back at the default already: no change for it
    p = only(propose([finding("n0", 1, "power_cap"), finding("n0", 3, "power_cap")], f, know()))
    assert (p.node, p.cause, p.action, p.profile, p.policy, p.risk) == (
        "n0",
        "power_cap",
        "tune",
        "gpu-defaults",
        "recommend",
        "online",
    )
    assert p.gpus == [1, 3] and p.finding_ids == ["n0-1-power_cap", "n0-3-power_cap"]
    assert p.targets == {"gpu": {"power_limit": "default"}}  # only the setting the cause map names
    assert p.changes == [Change("gpu[1].power_limit", "300 W", "default (700 W)")]
    assert "enforced power limit is below the default" in p.expected_effect
    assert "gemm bf16 on GPU 1 back to >= " in p.expected_effect and "now 420" in p.expected_effect
    plan = plan_profile(
        CATALOGUE["gpu-defaults"].profile,
        f.nodes["n0"],
        fleet=f,
        settings=["gpu.power_limit"],
        gpus=[1, 3],
        detect=DETECT,
    )
    bars = {b.gpu: b for b in plan.bars}
    assert sorted(bars) == [1, 3]
    # peers of GPU 1: 20 gemm results, median 702 (n0's 420 is one of them): normal 5% below it
    assert bars[1].probe == "gemm" and bars[1].variant == "bf16" and bars[1].higher_is_better
    assert bars[1].normal == round(702.0 * 0.95, 6) and bars[1].before == 420.0 and bars[1].better_by == 0.05


def test_locked_clocks_reset_both_clocks_and_name_what_the_readings_show() -> None:
    f = fleet()
    f.nodes["n1"].gpus[0].sample.CopyFrom(
        sample(0, clock_event_reasons=LOCKED, applications_sm_clock_hz=1.2e9, sm_clock_hz=1.2e9)
    )
    p = only(propose([finding("n1", 0, "clocks_locked_low")], f, know()))
    assert p.targets == {"gpu": {"locked_gpu_clocks": "reset", "locked_memory_clocks": "reset"}}
    assert p.changes == [
        Change("gpu[0].locked_gpu_clocks", "locked (1200 MHz)", "reset"),
        Change("gpu[0].locked_memory_clocks", "unknown", "reset"),
    ]


def test_a_host_cause_sets_os_settings_checked_by_read_back_only() -> None:
    f = fleet()
    host = f.nodes["n2"].host
    assert host is not None
    host.cpu_governor, host.numa_balancing = "powersave", True
    p = only(propose([finding("n2", None, "cpu_governor_powersave")], f, know()))
    assert p.gpus == [] and p.targets == {"os": {"cpu_governor": "performance"}}
    assert p.changes == [Change("os.cpu_governor", "powersave", "performance")]
    assert "read-back (no probe measures these settings)" in p.expected_effect


def drift(f: Fleet, node: str, *metrics: str) -> StoredFinding:
    """A host_tuning_drift finding of `node` whose evidence names `metrics`, as the detector's does."""
    first, *rest = (Evidence(m, reasons=(m, "x")) for m in metrics)
    found = Finding(node, None, "host_tuning_drift", "warning", "drift", first, rest, ["host_tuning"])
    return StoredFinding(f"{node}-drift", found, 1.0, 2.0)


def test_host_tuning_drift_sets_only_the_drifted_settings_never_the_rest_of_the_profile() -> None:
    f = fleet()
    host = f.nodes["n2"].host
    assert host is not None
    host.cpu_governor, host.numa_balancing, host.transparent_hugepage = "powersave", True, "never"
    p = only(propose([drift(f, "n2", "numa_balancing")], f, know()))
    assert p.profile == "os-accelerator-performance" and p.risk == "online"
    # not the governor (its own cause), swappiness or THP: the finding does not say they drifted
    assert p.targets == {"os": {"sysctls": {"kernel.numa_balancing": 0}}}
    assert p.changes == [Change("os.sysctls.kernel.numa_balancing", "1", "0")]
    p = only(propose([drift(f, "n2", "transparent_hugepage", "numa_balancing")], f, know()))
    assert p.targets == {
        "os": {"sysctls": {"kernel.numa_balancing": 0}, "transparent_hugepages": {"enabled": "always"}}
    }
    assert [c.setting for c in p.changes] == [
        "os.sysctls.kernel.numa_balancing",
        "os.transparent_hugepages.enabled",
    ]
    # evidence that names no setting of the fix: no proposal, rather than the whole profile
    assert propose([drift(f, "n2", "vm_swappiness")], f, know()) == []


def test_host_tuning_drift_found_by_the_detector_is_fixed_by_its_setting_alone() -> None:
    """The detector's evidence metrics are the cause map's by_evidence keys: a node with NUMA
    balancing on among peers with it off gets exactly that setting back."""
    sim = HostSimFleet(8, {"node-03": [FaultSpec("numa_balancing_on")]})
    sim.run(60)
    findings = [StoredFinding(f"f{i}", f, 1.0, 2.0) for i, f in enumerate(sim.detect("host_tuning"))]
    assert [(s.finding.node, s.finding.cause) for s in findings] == [("node-03", "host_tuning_drift")]
    p = only(propose(findings, sim.fleet, know()))
    assert p.changes == [Change("os.sysctls.kernel.numa_balancing", "1", "0")]
    assert p.targets == {"os": {"sysctls": {"kernel.numa_balancing": 0}}}


def test_the_governor_is_at_its_target_only_when_every_cpu_runs_it() -> None:
    f = fleet()
    host = f.nodes["n2"].host
    assert host is not None
    # The summary (the first CPU's) says performance; the counts say most CPUs run powersave.
    host.cpu_governors.update({"performance": 2, "powersave": 30})
    p = only(propose([finding("n2", None, "cpu_governor_powersave")], f, know()))
    assert p.changes == [Change("os.cpu_governor", "powersave on 30, performance on 2", "performance")]
    host.cpu_governors.clear()
    host.cpu_governors["powersave"] = 32
    p = only(propose([finding("n2", None, "cpu_governor_powersave")], f, know()))
    assert p.changes == [Change("os.cpu_governor", "powersave", "performance")]
    host.cpu_governors["powersave"] = 0  # none on powersave: the summary alone no longer decides
    host.cpu_governors["performance"] = 32
    host.cpu_governor = "powersave"
    p = only(propose([finding("n2", None, "cpu_governor_powersave")], f, know()))
    assert p.changes == []


def test_a_cause_no_setting_fixes_recommends_drain_or_investigation_and_says_so() -> None:
    f = fleet()
    found = [
        finding("n3", 2, "nvlink_down"),
        finding("n3", None, "slow_unknown"),
        finding("n4", 1, "xid_error"),
    ]
    by_cause = {p.cause: p for p in propose(found, f, know())}
    drain = by_cause["nvlink_down"]
    assert (drain.action, drain.profile, drain.risk, drain.changes, drain.targets) == (
        "drain",
        "",
        "",
        [],
        {},
    )
    assert drain.gpus == [2]
    assert drain.expected_effect.startswith(
        "No setting fixes nvlink_down: drain the node and repair the hardware."
    )
    assert by_cause["slow_unknown"].action == "investigate"
    assert "a person investigates" in by_cause["slow_unknown"].expected_effect
    assert by_cause["xid_error"].action == "drain"


def test_the_policy_off_recommends_nothing_and_auto_is_carried() -> None:
    f = fleet()
    found = [finding("n0", 1, "power_cap"), finding("n3", 2, "nvlink_down")]
    assert [p.cause for p in propose(found, f, know(power_cap="off"))] == ["nvlink_down"]
    assert {p.cause: p.policy for p in propose(found, f, know(power_cap="auto"))} == {
        "power_cap": "auto",
        "nvlink_down": "recommend",
    }
    assert (
        propose(found, f, Knowledge(CAUSES, CATALOGUE, TuningConfig(default_policy="off").mode, DETECT)) == []
    )
    assert propose([finding("ghost", 0, "power_cap")], f, know()) == []  # a node the fleet does not know


def test_gpu_settings_without_enough_peers_get_no_bar_and_say_so() -> None:
    f = fleet(nodes=1, gpus=2)  # 2 results per group, fewer than min_peers
    f.nodes["n0"].gpus[0].sample.power_management_limit_watts = 250.0
    p = only(propose([finding("n0", 0, "power_cap")], f, know()))
    assert "Verified by read-back only: no peer baseline" in p.expected_effect


def test_a_lower_is_better_probe_gets_its_bar_above_the_median() -> None:
    f = fleet()
    for node in f.nodes.values():
        node.hello.probe_infos.add(name="gemm", higher_is_better=False)
    plan = plan_profile(
        CATALOGUE["gpu-defaults"].profile,
        f.nodes["n0"],
        fleet=f,
        settings=["gpu.power_limit"],
        gpus=[0],
        detect=DETECT,
    )
    [bar] = plan.bars
    assert not bar.higher_is_better and bar.normal == round(702.0 * 1.05, 6)


def test_bios_drift_sets_the_peer_majority_value_pending_a_reboot() -> None:
    f = fleet()
    for name, node in f.nodes.items():
        acs = "Enabled" if name == "n0" else "Disabled"
        node.bmc = bmc_pb2.BmcSample(
            bios_attributes={"PcieAcsControl": acs, "Only": "x" if name == "n0" else "y"}
        )
    f.nodes["n4"].bmc = bmc_pb2.BmcSample(bios_attributes={"PcieAcsControl": "Disabled", "Only": "z"})
    p = only(propose([finding("n0", None, "bios_drift")], f, know()))
    assert (p.action, p.profile, p.risk) == ("set_fleet_value", "bios-fleet-value", "needs_reboot")
    # Only: peers say y, y, y, z: a strict majority of y
    assert p.targets == {"bmc": {"bios": {"Only": "y", "PcieAcsControl": "Disabled"}}}
    assert p.changes == [
        Change("bmc.bios.Only", "x", "y", pending_reboot=True),
        Change("bmc.bios.PcieAcsControl", "Enabled", "Disabled", pending_reboot=True),
    ]
    assert p.expected_effect.endswith("Takes effect at the next reboot.")
    f.nodes["n0"].bmc = None
    p = only(propose([finding("n0", None, "bios_drift")], f, know()))
    assert p.targets == {} and p.detail == "no BIOS readings from this node's BMC to compare"


def test_firmware_is_recommended_with_the_fleet_majority_and_never_applied() -> None:
    f = fleet()
    for name, node in f.nodes.items():
        node.bmc = bmc_pb2.BmcSample(
            bmc_firmware_version="1.0" if name == "n0" else "2.0", bios_version="3.1"
        )
    p = only(propose([finding("n0", None, "firmware_drift")], f, know()))
    assert (p.action, p.profile, p.targets) == ("recommend_firmware", "firmware-fleet-baseline", {})
    assert p.changes == [Change("bmc.firmware.BMC", "1.0", "2.0", pending_reboot=True)]
    assert "Recommended only" in p.expected_effect


def test_bios_targets_keep_vendor_names_and_a_node_using_them_is_read_under_them() -> None:
    profile = CATALOGUE["bios-hpc"].profile
    targets = targets_of(applicable(profile))
    assert targets["bmc"]["bios"]["PcieAcsControl"] == "Disabled"
    assert targets["bmc"]["bios"]["TurboMode"]["vendors"]["dell"] == {
        "name": "ProcTurboMode",
        "target": "Enabled",
    }
    f = fleet()
    f.nodes["n0"].bmc = bmc_pb2.BmcSample(
        bios_attributes={"ProcTurboMode": "Disabled", "PcieAcsControl": "Disabled"}
    )
    plan = plan_profile(profile, f.nodes["n0"], fleet=f, gpus=[], detect=DETECT)
    assert plan.risk == "needs_reboot" and plan.bars == []
    assert [(c.setting, c.current, c.target) for c in plan.changes] == [
        ("bmc.bios.ProcTurboMode", "Disabled", "Enabled"),
        ("bmc.bios.EnergyPerformanceBias", "unknown", "Performance"),
    ]
    assert applicable(CATALOGUE["firmware-fleet-baseline"].profile) == []  # recommend only


def test_the_policy_is_validated_with_clear_errors(tmp_path: Path) -> None:
    assert TuningConfig(policy={"power_cap": "auto"}).mode("power_cap") == "auto"
    assert TuningConfig(default_policy="off").mode("power_cap") == "off"
    assert TuningConfig().mode("bios_drift") == "recommend"
    cases = [
        (
            {"policy": {"powercap": "auto"}},
            "tuning.policy: 'powercap' is not a finding cause (thermal_throttle, ",
        ),
        (
            {"policy": {"power_cap": "always"}},
            "tuning.policy.power_cap: 'always' is not one of off, recommend, auto",
        ),
        ({"default_policy": "yes"}, "tuning.default_policy: 'yes' is not one of off, recommend, auto"),
        ({"profiles_dir": str(tmp_path / "none")}, "tuning.profiles_dir: "),
    ]
    for tuning, text in cases:
        with pytest.raises(ConfigError, match=re.escape(text)):
            load(None, {"tuning": tuning})
    (tmp_path / "bad.yaml").write_text(
        "name: bad\ndescription: x\ngpu: {ecc: {target: maybe, reason: r, source: s}}\n"
    )
    with pytest.raises(ConfigError, match=r"bad.yaml: gpu.ecc: 'maybe' is not one of on, off"):
        load(None, {"tuning": {"profiles_dir": str(tmp_path)}})
