"""The BIOS actuator over the simulated BMC: the shipped bios-hpc profile planned against a drifted
node, validation against the registry, pending until reboot, rollback clearing the change, and the
journaled apply end to end (Redfish: test_bios_redfish.py)."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path

import pytest
import yaml

from agent.sources.sim import FaultSpec, SimNode
from agent.sources.sim.bmc import SimBmc
from agent.tuning.apply import PLANNED, REFUSED, apply_settings, recover
from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.bios import BiosActuator, BiosAttribute, BiosState, bios_reboot_state, check_value
from agent.tuning.journal import APPLIED, ROLLED_BACK
from agent.tuning.targets import BmcTargets, Targets

CATALOGUE = Path(__file__).resolve().parents[3] / "controller" / "profiles" / "catalogue"
NO_TREE = Tree("/nonexistent")  # the BIOS actuator never touches the host tree


def drifted(*attributes: str) -> SimBmc:
    faults = [FaultSpec.parse(f"bios_drift:{a}") for a in attributes]
    return SimBmc(SimNode("node-a", seed=3, faults=faults))


def bios_hpc() -> Targets:
    profile = yaml.safe_load((CATALOGUE / "bios-hpc.yaml").read_text())
    return Targets.from_dict({"bmc": profile["bmc"]})


def bmc_targets(**bios: str) -> Targets:
    return Targets(bmc=BmcTargets(bios=dict(bios)))


def test_the_shipped_profile_plans_the_drifted_attributes_only() -> None:
    bmc = drifted("TurboMode", "PcieAcsControl")
    changes = BiosActuator(bmc.bios).plan(NO_TREE, bios_hpc())
    assert changes == [
        Change("bmc.bios.PcieAcsControl", "Enabled", "Disabled", pending_reboot=True),
        Change("bmc.bios.TurboMode", "Disabled", "Enabled", pending_reboot=True),
    ]
    assert BiosActuator(drifted().bios).plan(NO_TREE, bios_hpc()) == []  # the fleet is at the profile


def test_nothing_asked_reads_nothing() -> None:
    class Untouchable:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the control was used: {name}")

    assert BiosActuator(Untouchable()).plan(NO_TREE, Targets()) == []  # type: ignore[arg-type]


def test_the_vendor_name_is_used_where_the_generic_one_is_missing() -> None:
    class Dell:
        def __init__(self) -> None:
            self.state = BiosState({"ProcTurboMode": "Disabled", "SysProfile": "PerfOptimized"})

        def read(self) -> BiosState:
            return self.state

        def registry(self) -> dict[str, BiosAttribute] | None:
            return None

        def vendor(self) -> str:
            return "dell"

        def set_pending(self, attributes: Mapping[str, str]) -> None:
            raise AssertionError("plan writes nothing")

    changes = BiosActuator(Dell()).plan(NO_TREE, bios_hpc())
    # PcieAcsControl has no Dell name: planned as is, and refused by validate (not on this BMC).
    assert changes == [
        Change("bmc.bios.PcieAcsControl", "", "Disabled", pending_reboot=True),
        Change("bmc.bios.ProcTurboMode", "Disabled", "Enabled", pending_reboot=True),
    ]
    with pytest.raises(TuningError, match="PcieAcsControl is not on this BMC"):
        BiosActuator(Dell()).validate(NO_TREE, changes[0])


@pytest.mark.parametrize(
    ("attribute", "value", "why"),
    [
        ("NoSuchKnob", "On", r"NoSuchKnob is not in this BMC's attribute registry: cannot set it to 'On'"),
        ("TpmSupport", "Disabled", r"TpmSupport is read-only on this BMC: cannot set it to 'Disabled'"),
        ("TurboMode", "Auto", r"TurboMode does not take 'Auto' \(allowed: Enabled, Disabled\)"),
    ],
)
def test_validate_refuses_against_the_registry(tmp_path: Path, attribute: str, value: str, why: str) -> None:
    bmc = drifted("TurboMode")
    targets = bmc_targets(**{attribute: value})
    result = apply_settings([BiosActuator(bmc.bios)], targets, NO_TREE, tmp_path / "journal")
    assert result.state == REFUSED and result.problems and bmc.bios.writes == []
    with pytest.raises(TuningError, match=why):
        BiosActuator(bmc.bios).validate(NO_TREE, result.changes[0])


def test_integer_and_boolean_values_are_checked_by_type() -> None:
    count = BiosAttribute("CoreCount", "Integer", lower=1, upper=64)
    check_value(count, "32")
    with pytest.raises(TuningError, match=r"CoreCount does not take '65' \(allowed: 1..64\)"):
        check_value(count, "65")
    with pytest.raises(TuningError, match=r"CoreCount does not take 'all' \(an integer\)"):
        check_value(count, "all")
    with pytest.raises(TuningError, match=r"\(allowed: true, false\)"):
        check_value(BiosAttribute("Flag", "Boolean"), "yes")


def test_apply_is_pending_until_the_reboot(tmp_path: Path) -> None:
    bmc = drifted("TurboMode", "EnergyPerformanceBias")
    actuator = BiosActuator(bmc.bios)
    result = apply_settings([actuator], bios_hpc(), NO_TREE, tmp_path / "journal")
    assert result.state == APPLIED and all(c.pending_reboot for c in result.changes)
    sample = bmc.poll()
    assert sample.bios_pending == {"EnergyPerformanceBias": "Performance", "TurboMode": "Enabled"}
    assert sample.bios_attributes["TurboMode"] == "Disabled"  # still drifted until the reboot
    state = bios_reboot_state(bmc.bios, result.changes)
    assert state.pending == ["bmc.bios.TurboMode", "bmc.bios.EnergyPerformanceBias"] and not state.done

    bmc.reboot()
    after = bmc.poll()
    assert after.bios_pending == {} and after.bios_attributes == drifted().poll().bios_attributes
    assert bmc.condition.bios_attributes == {}  # nothing differs from the fleet: the drift finding clears
    state = bios_reboot_state(bmc.bios, result.changes)
    assert state.verified == ["bmc.bios.TurboMode", "bmc.bios.EnergyPerformanceBias"] and state.done
    assert apply_settings([actuator], bios_hpc(), NO_TREE, tmp_path / "journal").state == "nothing_to_do"


def test_a_change_the_bios_drops_at_reboot_is_lost() -> None:
    bmc = drifted("TurboMode")
    change = Change("bmc.bios.TurboMode", "Disabled", "Enabled", pending_reboot=True)
    BiosActuator(bmc.bios).apply(NO_TREE, change)
    bmc.bios.settings.clear()  # the BIOS refused it at POST
    bmc.reboot()
    assert bios_reboot_state(bmc.bios, [change]).lost == ["bmc.bios.TurboMode"]


def test_dry_run_writes_nothing() -> None:
    bmc = drifted("TurboMode")
    result = apply_settings([BiosActuator(bmc.bios)], bios_hpc(), NO_TREE, "/nonexistent", dry_run=True)
    assert result.state == PLANNED and [c.setting for c in result.changes] == ["bmc.bios.TurboMode"]
    assert bmc.bios.writes == [] and bmc.poll().bios_pending == {}


def test_a_failed_check_rolls_back_by_clearing_the_pending_change(tmp_path: Path) -> None:
    bmc = drifted("TurboMode")
    result = apply_settings(
        [BiosActuator(bmc.bios)], bios_hpc(), NO_TREE, tmp_path / "journal", check=lambda _: ["worse"]
    )
    assert result.state == ROLLED_BACK and result.problems == ["worse"]
    assert bmc.bios.writes == [{"TurboMode": "Enabled"}, {"TurboMode": "Disabled"}]
    assert bmc.poll().bios_pending == {}
    bmc.reboot()
    assert bmc.poll().bios_attributes["TurboMode"] == "Disabled"  # the reboot changes nothing


def test_a_killed_apply_is_recovered_through_the_bios_actuator(tmp_path: Path) -> None:
    bmc = drifted("TurboMode")
    actuator = BiosActuator(bmc.bios)

    class Killed(BaseException):
        pass

    class DiesAfterWriting(BiosActuator):
        def verify(self, tree: Tree, change: Change) -> None:
            raise Killed

    with pytest.raises(Killed):
        apply_settings([DiesAfterWriting(bmc.bios)], bios_hpc(), NO_TREE, tmp_path / "journal")
    assert bmc.poll().bios_pending == {"TurboMode": "Enabled"}
    [recovered] = recover(tmp_path / "journal", NO_TREE, [actuator])
    assert recovered.state == ROLLED_BACK and bmc.poll().bios_pending == {}
