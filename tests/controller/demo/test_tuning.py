"""The demo's tuning outcomes, from recommendations and findings as the Operator API gives them."""

from __future__ import annotations

from controller.demo.catalogue import AgentFault
from controller.demo.plan import Injected, node_names, plan_faults
from controller.demo.tuning import drains, fixable, outcome, settled, summary
from protos.gpufleet.v1 import findings_pb2, operator_pb2
from protos.names import cause_value

CAP = Injected("n1", 2, "power_cap", "power_cap")
HOT = Injected("n2", 0, "thermal_throttle", "thermal_throttle")
KINDS = [
    AgentFault("thermal_throttle", "gpu", "thermal_throttle", ()),
    AgentFault("power_cap", "gpu", "power_cap", ()),
    AgentFault("clocks_locked_low", "gpu", "clocks_locked_low", ()),
    AgentFault("nvlink_down", "gpu", "nvlink_down", ()),
]


def rec(node: str, cause: str, action: str, state: str) -> operator_pb2.Recommendation:
    return operator_pb2.Recommendation(node=node, cause=cause, action=action, state=state)


def finding(node: str, cause: str) -> findings_pb2.Finding:
    return findings_pb2.Finding(node=node, cause=cause_value(cause))  # type: ignore[arg-type]


def test_fixable_faults_are_those_a_profile_fixes_online() -> None:
    assert fixable(KINDS) == ["power_cap", "clocks_locked_low"]


def test_a_verified_fix_is_fixed_only_once_its_finding_is_gone() -> None:
    verified = [rec("n1", "power_cap", "tune", "verified")]
    assert outcome(CAP, verified, [finding("n1", "power_cap")]) == "not_fixed"
    assert outcome(CAP, verified, []) == "fixed"
    assert outcome(CAP, [rec("n1", "power_cap", "tune", "rolled_back")], []) == "not_fixed"
    assert outcome(CAP, [rec("n9", "power_cap", "tune", "verified")], []) == "not_fixed"  # another node's


def test_hardware_faults_end_with_a_drain_recommended() -> None:
    recs = [rec("n2", "thermal_throttle", "drain", "proposed"), rec("n1", "power_cap", "tune", "verified")]
    assert outcome(HOT, recs, []) == "recommended_drain"
    assert settled([CAP, HOT], recs, [], ["power_cap"])
    assert not settled([CAP, HOT], recs[:1], [], ["power_cap"])
    assert summary([CAP, HOT], recs, []) == {
        "recommended": 1,
        "applied": 1,
        "verified": 1,
        "rolled_back": 0,
        "needs_attention": 0,
        "drain_recommended": 1,
        "outcomes": {"fixed": 1, "recommended_drain": 1},
    }


def test_faults_no_profile_fixes_online_end_with_their_causes_action_recommended() -> None:
    drift = Injected("n3", None, "bios_drift", "bios_drift")
    inlet = Injected("n4", None, "inlet_temperature_high", "inlet_temperature_high")
    recs = [
        rec("n3", "bios_drift", "set_fleet_value", "proposed"),
        rec("n4", "inlet_temperature_high", "investigate", "proposed"),
    ]
    assert [outcome(i, recs, []) for i in (drift, inlet)] == [
        "recommended_set_fleet_value",
        "recommended_investigate",
    ]
    assert settled([drift, inlet], recs, [], [])
    assert not settled([drift, inlet], recs[:1], [], [])
    assert drains([CAP, HOT, drift, inlet]) == [HOT]  # only a drain's node is followed through Kubernetes


def test_the_plan_puts_the_fixable_kinds_first_and_keeps_old_seeds() -> None:
    nodes = node_names(6)
    for seed in range(20):
        chosen = {
            i.fault for i in plan_faults(nodes, 4, 3, seed, KINDS, first=["power_cap", "clocks_locked_low"])
        }
        assert {"power_cap", "clocks_locked_low"} <= chosen
    assert plan_faults(nodes, 4, 2, 7, KINDS) == plan_faults(nodes, 4, 2, 7, KINDS, first=[])
