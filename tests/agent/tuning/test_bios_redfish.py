"""The BIOS actuator over Redfish: against FakeBmcServer serving the HGX node with an attribute
registry added (DMTF AttributeRegistry schema), and against sushy-static serving DMTF's mockup."""

from __future__ import annotations

import json
import logging
import shutil
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from agent.sources.redfish import settings as settings_module
from agent.sources.redfish.bios_control import RedfishBiosControl, vendor_key
from agent.sources.redfish.session import BmcEndpoint, Credentials, RedfishSession
from agent.tuning.apply import NOTHING_TO_DO, PLANNED, REFUSED, apply_settings
from agent.tuning.base import Change, Tree, TuningError
from agent.tuning.bios import BiosActuator, bios_reboot_state
from agent.tuning.journal import APPLIED, ROLLED_BACK
from agent.tuning.targets import BmcTargets, Targets
from tests.redfish_servers import HGX_NODE, FakeBmcServer, RunningServer
from tests.support import free_port

NO_TREE = Tree("/nonexistent")
SYSTEM = "/redfish/v1/Systems/System_0"
SETTINGS = f"{SYSTEM}/Bios/Settings"
REGISTRY = "BiosAttributeRegistry.v2_1_0"
APPLY_TIME = {"ApplyTime": "OnReset"}
SRIOV_OFF = Targets(bmc=BmcTargets(bios={"SriovGlobalEnable": "Disabled", "NumaNodesPerSocket": "NPS4"}))


def _enum(name: str, *values: str, read_only: bool = False) -> dict[str, Any]:
    return {
        "AttributeName": name,
        "Type": "Enumeration",
        "ReadOnly": read_only,
        "Value": [{"ValueName": v, "ValueDisplayName": v} for v in values],
    }


ENTRIES = [
    _enum("BootMode", "UEFI", "Legacy", read_only=True),
    _enum("SmtControl", "Enabled", "Disabled"),
    _enum("IommuSupport", "Enabled", "Disabled"),
    _enum("AboveFourGDecoding", "Enabled", "Disabled"),
    _enum("SriovGlobalEnable", "Enabled", "Disabled"),
    _enum("PcieAcsControl", "Enabled", "Disabled"),
    _enum("NumaNodesPerSocket", "NPS0", "NPS1", "NPS2", "NPS4"),
    _enum("ProcessorPowerProfile", "MaxPerformance", "Balanced", "PowerSaving"),
    _enum("ProcTurboMode", "Enabled", "Disabled"),
]


def _edit(file: Path, change: dict[str, Any]) -> None:
    doc = json.loads(file.read_text())
    doc.update(change)
    file.write_text(json.dumps(doc, indent=4))


def _write(tree: Path, path: str, doc: dict[str, Any]) -> None:
    file = tree / path / "index.json"
    file.parent.mkdir(parents=True, exist_ok=True)
    file.write_text(json.dumps({"@odata.id": f"/redfish/v1/{path}", **doc}, indent=4))


def bios_tree(
    tmp_path: Path, *, registry: bool = True, apply_times: bool = True, vendor: str | None = None
) -> Path:
    """The HGX node with a Registries collection holding the BIOS attribute registry (the file
    and the registry named differently, as services do, plus a message registry never read)."""
    tree = tmp_path / "bios-tree"
    shutil.copytree(HGX_NODE, tree)
    bios = tree / "Systems/System_0/Bios/index.json"
    if not apply_times:
        doc = json.loads(bios.read_text())
        del doc["@Redfish.Settings"]["SupportedApplyTimes"]
        bios.write_text(json.dumps(doc))
    if vendor:
        _edit(tree / "index.json", {"Vendor": vendor})
        for file in (bios, tree / "Systems/System_0/Bios/Settings/index.json"):
            doc = json.loads(file.read_text())
            doc["Attributes"]["ProcTurboMode"] = "Disabled"
            file.write_text(json.dumps(doc))
    if not registry:
        return tree
    _edit(tree / "index.json", {"Registries": {"@odata.id": "/redfish/v1/Registries"}})
    members = [
        {"@odata.id": "/redfish/v1/Registries/Base.1.8.0"},
        {"@odata.id": "/redfish/v1/Registries/Bios"},
    ]
    _write(tree, "Registries", {"@odata.type": "#MessageRegistryFileCollection", "Members": members})
    location = {"Language": "en", "Uri": "/redfish/v1/Registries/Bios/BiosRegistry"}
    _write(tree, "Registries/Bios", {"Id": "Bios", "Registry": REGISTRY, "Location": [location]})
    _write(
        tree,
        "Registries/Bios/BiosRegistry",
        {
            "@odata.type": "#AttributeRegistry.v1_3_0.AttributeRegistry",
            "Id": REGISTRY,
            "RegistryEntries": {"Attributes": ENTRIES},
        },
    )
    return tree


def control(url: str) -> RedfishBiosControl:
    return RedfishBiosControl(BmcEndpoint(url, Credentials("admin", "secret")))


def patches(bmc: FakeBmcServer) -> list[Any]:
    return [r.json() for r in bmc.requests if r.method == "PATCH"]


@pytest.fixture
def bmc(fake_bmc: Any, tmp_path: Path) -> FakeBmcServer:
    server: FakeBmcServer = fake_bmc(bios_tree(tmp_path))
    return server


def test_reads_state_registry_and_vendor(bmc: FakeBmcServer) -> None:
    bios = control(bmc.url)
    state = bios.read()
    assert state.pending == {"PcieAcsControl": "Disabled", "ProcessorPowerProfile": "PowerSaving"}
    assert state.next_boot["PcieAcsControl"] == "Disabled" and state.current["PcieAcsControl"] == "Enabled"
    registry = bios.registry()
    assert registry is not None and registry["BootMode"].read_only
    assert registry["NumaNodesPerSocket"].allowable == ("NPS0", "NPS1", "NPS2", "NPS4")
    assert bios.vendor() == ""  # "Kestrel Systems": no vendor a profile names
    assert "/redfish/v1/Registries/Base.1.8.0" not in bmc.paths("GET")  # a message registry: not read
    assert [vendor_key(v) for v in ("Dell Inc.", "HPE", "Hewlett Packard Enterprise", "Acme")] == [
        "dell",
        "hpe",
        "hpe",
        "",
    ]


@pytest.mark.parametrize(
    ("bios", "why"),
    [
        ({"BootMode": "Legacy"}, r"BootMode is read-only on this BMC: cannot set it to 'Legacy'"),
        ({"NumaNodesPerSocket": "NPS3"}, r"does not take 'NPS3' \(allowed: NPS0, NPS1, NPS2, NPS4\)"),
        ({"Turbo": "Enabled"}, r"Turbo is not in this BMC's attribute registry"),
    ],
)
def test_refused_before_any_patch(bmc: FakeBmcServer, tmp_path: Path, bios: dict[str, str], why: str) -> None:
    targets = Targets(bmc=BmcTargets(bios=dict(bios)))
    result = apply_settings([BiosActuator(control(bmc.url))], targets, NO_TREE, tmp_path / "journal")
    assert result.state == REFUSED and len(result.problems) == 1
    with pytest.raises(TuningError, match=why):
        BiosActuator(control(bmc.url)).validate(NO_TREE, result.changes[0])
    assert bmc.paths("PATCH") == []


def test_dry_run_makes_no_patch(bmc: FakeBmcServer, tmp_path: Path) -> None:
    actuator = BiosActuator(control(bmc.url))
    result = apply_settings([actuator], SRIOV_OFF, NO_TREE, tmp_path / "journal", dry_run=True)
    assert result.state == PLANNED and len(result.changes) == 2
    assert bmc.paths("PATCH") == [] and not (tmp_path / "journal").exists()


def test_apply_patches_pending_with_the_apply_time_and_verifies_after_the_reboot(
    bmc: FakeBmcServer, tmp_path: Path
) -> None:
    bios = control(bmc.url)
    result = apply_settings([BiosActuator(bios)], SRIOV_OFF, NO_TREE, tmp_path / "journal")
    assert result.state == APPLIED, result.problems
    assert patches(bmc) == [
        {"Attributes": {"SriovGlobalEnable": "Disabled"}, "@Redfish.SettingsApplyTime": APPLY_TIME},
        {"Attributes": {"NumaNodesPerSocket": "NPS4"}, "@Redfish.SettingsApplyTime": APPLY_TIME},
    ]
    assert all(r.headers.get("if-match") for r in bmc.requests if r.method == "PATCH")
    state = bios.read()
    assert (
        state.pending["SriovGlobalEnable"] == "Disabled" and state.current["SriovGlobalEnable"] == "Enabled"
    )
    assert bios_reboot_state(bios, result.changes).pending == [c.setting for c in result.changes]

    # The host reboots: the BMC makes the settings current (by hand here; the fake does not reboot).
    settings = json.loads((bmc.tree / "Systems/System_0/Bios/Settings/index.json").read_text())
    _edit(bmc.tree / "Systems/System_0/Bios/index.json", {"Attributes": settings["Attributes"]})
    after = bios_reboot_state(bios, result.changes)
    assert after.verified == [c.setting for c in result.changes] and after.done
    again = apply_settings([BiosActuator(bios)], SRIOV_OFF, NO_TREE, tmp_path / "journal")
    assert again.state == NOTHING_TO_DO


def test_no_apply_time_where_the_service_lists_none(fake_bmc: Any, tmp_path: Path) -> None:
    server: FakeBmcServer = fake_bmc(bios_tree(tmp_path, apply_times=False))
    change = Change("bmc.bios.SriovGlobalEnable", "Enabled", "Disabled", pending_reboot=True)
    BiosActuator(control(server.url)).apply(NO_TREE, change)
    assert patches(server) == [{"Attributes": {"SriovGlobalEnable": "Disabled"}}]


def test_a_vendor_refusing_the_apply_time_is_asked_again_without_it(
    bmc: FakeBmcServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    bmc.reject_apply_time = True
    with caplog.at_level(logging.WARNING, "gpufleet.agent.tuning"):
        result = apply_settings([BiosActuator(control(bmc.url))], SRIOV_OFF, NO_TREE, tmp_path / "journal")
    assert result.state == APPLIED, result.problems
    first, second = patches(bmc)[:2]
    assert first["@Redfish.SettingsApplyTime"] == APPLY_TIME and second == {
        "Attributes": {"SriovGlobalEnable": "Disabled"}
    }
    assert "refused @Redfish.SettingsApplyTime" in caplog.text and "PropertyUnknown" not in caplog.text
    assert control(bmc.url).read().pending["NumaNodesPerSocket"] == "NPS4"


def test_rollback_clears_the_pending_change(bmc: FakeBmcServer, tmp_path: Path) -> None:
    bios = control(bmc.url)
    result = apply_settings(
        [BiosActuator(bios)], SRIOV_OFF, NO_TREE, tmp_path / "journal", check=lambda _: ["slower"]
    )
    assert result.state == ROLLED_BACK and result.left == []
    assert [p["Attributes"] for p in patches(bmc)][2:] == [
        {"NumaNodesPerSocket": "NPS1"},
        {"SriovGlobalEnable": "Enabled"},
    ]
    assert bios.read().pending == {"PcieAcsControl": "Disabled", "ProcessorPowerProfile": "PowerSaving"}


def test_the_vendor_name_is_written_on_a_dell(fake_bmc: Any, tmp_path: Path) -> None:
    server: FakeBmcServer = fake_bmc(bios_tree(tmp_path, vendor="Dell Inc."))
    targets = Targets(
        bmc=BmcTargets(
            bios={"TurboMode": "Enabled"}, vendors={"TurboMode": {"dell": ("ProcTurboMode", "Enabled")}}
        )
    )
    result = apply_settings([BiosActuator(control(server.url))], targets, NO_TREE, tmp_path / "journal")
    assert result.state == APPLIED and [c.setting for c in result.changes] == ["bmc.bios.ProcTurboMode"]
    assert patches(server)[0]["Attributes"] == {"ProcTurboMode": "Enabled"}


def test_a_change_made_meanwhile_is_a_clear_refusal(
    bmc: FakeBmcServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = settings_module.read_bios_settings

    def then_someone_writes(session: RedfishSession) -> settings_module.BiosSettings:
        read = real(session)
        monkeypatch.setattr(settings_module, "read_bios_settings", real)  # once
        other = urllib.request.Request(
            f"{bmc.url}{SETTINGS}",
            data=json.dumps({"Attributes": {"SmtControl": "Disabled"}}).encode(),
            method="PATCH",
            headers={"Content-Type": "application/json"},
        )
        urllib.request.urlopen(other, timeout=5).close()
        return read

    monkeypatch.setattr(settings_module, "read_bios_settings", then_someone_writes)
    change = Change("bmc.bios.SriovGlobalEnable", "Enabled", "Disabled", pending_reboot=True)
    with pytest.raises(TuningError, match=r"^BMC http://127.0.0.1:\d+: the BIOS settings changed since"):
        BiosActuator(control(bmc.url)).apply(NO_TREE, change)
    assert "SriovGlobalEnable" not in control(bmc.url).read().pending


def test_unreachable_and_refused_credentials_are_one_line(bmc: FakeBmcServer) -> None:
    with pytest.raises(TuningError, match=r"^BMC http://127.0.0.1:\d+ unreachable: .*cannot connect"):
        control(f"http://127.0.0.1:{free_port()}").read()
    bmc.require_auth = ("admin", "other")
    with pytest.raises(TuningError, match=r"^BMC http://127.0.0.1:\d+: login refused: .*HTTP 401") as exc:
        control(bmc.url).read()
    assert "\n" not in str(exc.value)


def test_sushy_static_takes_the_patch_and_the_read_back_shows_it_kept_nothing(
    dmtf_mockup: RunningServer, tmp_path: Path
) -> None:
    """DMTF's mockup publishes no BIOS attribute registry (existence is all that is checked), no
    apply times (no annotation) and no ETag (no If-Match). sushy-static answers the PATCH 204 and
    keeps nothing, so the read-back catches it and the apply rolls back: nothing to undo."""
    bios = control(dmtf_mockup.url)
    assert bios.registry() is None and bios.vendor() == ""
    targets = Targets(bmc=BmcTargets(bios={"ProcTurboMode": "Enabled", "NoSuchKnob": "On"}))
    refused = apply_settings([BiosActuator(bios)], targets, NO_TREE, tmp_path / "journal")
    assert refused.state == REFUSED and "NoSuchKnob is not on this BMC" in refused.problems[0]

    targets = Targets(bmc=BmcTargets(bios={"ProcTurboMode": "Enabled"}))
    result = apply_settings([BiosActuator(bios)], targets, NO_TREE, tmp_path / "journal")
    # Current Enabled, pending Disabled: the next boot would turn it off, so Enabled is written.
    assert result.changes == [Change("bmc.bios.ProcTurboMode", "Disabled", "Enabled", pending_reboot=True)]
    assert result.state == ROLLED_BACK and result.left == []
    assert "ProcTurboMode reads back 'Disabled' (pending), not 'Enabled'" in result.problems[0]
    log = dmtf_mockup.log_text()
    assert "PATCH /redfish/v1/Systems/437XR1138R2/Bios/Settings" in log
    assert '"ProcTurboMode": "Enabled"' in log and "SettingsApplyTime" not in log and "If-Match" not in log
