"""One remediation line per cause, from the cause map; and the operator API puts it on every finding."""

from __future__ import annotations

import pytest

from controller.fleet.remediation import remediation, remediation_line
from controller.operator.wire import finding_to_proto
from controller.profiles.causes import CauseEntry, Fix, load_cause_map
from protos.gpufleet.v1 import findings_pb2
from protos.names import cause_name
from tests.controller.harness import stored_finding

EVERY_CAUSE = [cause_name(v.number) for v in findings_pb2.Cause.DESCRIPTOR.values if v.number != 0]
ACTION_PREFIX = {
    "tune": "retune: ",
    "recommend_firmware": "update firmware to the fleet's (",
    "set_fleet_value": "set the fleet majority's value",
    "drain": "drain and repair: ",
    "investigate": "investigate: ",
}


@pytest.mark.parametrize("cause", EVERY_CAUSE)
def test_every_cause_of_the_contract_has_one_line_naming_its_action(cause: str) -> None:
    entry = load_cause_map()[cause]
    line = remediation(cause)
    assert line.startswith(ACTION_PREFIX[entry.action])
    assert "\n" not in line and not line.endswith(".")
    for fix in entry.fixes:  # the profile (and its settings) an operator applies
        assert fix.profile in line
        assert all(setting in line for setting in fix.settings)


def test_the_new_causes_are_covered() -> None:
    assert "nvlink_errors" in EVERY_CAUSE and "inlet_temperature_high" in EVERY_CAUSE
    assert remediation("nvlink_errors").startswith("drain and repair: NVLinks that stay up")
    assert remediation("inlet_temperature_high").startswith("investigate: the air reaching the node")
    assert "driver_branch_slow" in EVERY_CAUSE
    assert remediation("driver_branch_slow").startswith("investigate: GPUs on this driver branch")


def test_lines_by_action() -> None:
    assert remediation("power_cap") == "retune: gpu-defaults (gpu.power_limit)"
    assert (
        remediation("firmware_drift")
        == "update firmware to the fleet's (firmware-fleet-baseline; never automatic)"
    )
    assert remediation("host_tuning_drift") == (
        "retune: os-accelerator-performance (those drifted of: os.sysctls.kernel.numa_balancing, "
        "os.transparent_hugepages.enabled)"
    )
    assert remediation("bios_drift") == "set the fleet majority's value (pending until the next reboot)"
    two = CauseEntry(
        action="tune", reason="x", fixes=[Fix(profile="a", settings=["s1", "s2"]), Fix(profile="b")]
    )
    assert remediation_line("c", two) == "retune: a (s1, s2), b"
    drifted = CauseEntry(
        action="tune", reason="x", fixes=[Fix(profile="p", by_evidence={"m": ["s1"], "n": ["s2"]})]
    )
    assert remediation_line("c", drifted) == "retune: p (those drifted of: s1, s2)"


def test_the_reason_reads_as_the_tail_of_the_line() -> None:
    drain = CauseEntry(action="drain", reason="A failed fan is a repair.  Drain it.")
    assert remediation_line("fan_failure", drain) == "drain and repair: a failed fan is a repair. Drain it"
    acronym = CauseEntry(action="investigate", reason="XID errors need a look.")
    assert remediation_line("xid_error", acronym) == "investigate: XID errors need a look"


def test_a_cause_the_map_does_not_know_is_investigated() -> None:
    assert remediation("no_such_cause") == "investigate: no remediation is known for no_such_cause"
    assert remediation_line("", None) == "investigate: no remediation is known for this finding"


def test_finding_to_proto_carries_the_remediation() -> None:
    msg = finding_to_proto(stored_finding("n1", 0, "power_cap", "warning"))
    assert msg.remediation == "retune: gpu-defaults (gpu.power_limit)"
    assert finding_to_proto(stored_finding("n1", None, "nvlink_down", "critical")).remediation.startswith(
        "drain and repair: "
    )
