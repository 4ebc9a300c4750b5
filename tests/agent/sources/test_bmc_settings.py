"""BIOS pending settings for the tuning work: read with ETag and apply times, PATCH with If-Match."""

from __future__ import annotations

import json
import urllib.request

import pytest

from agent.sources.redfish.session import BmcEndpoint, BmcError, Credentials, RedfishSession
from agent.sources.redfish.settings import patch_bios_settings, read_bios_settings
from tests.redfish_servers import FakeBmcServer, RunningServer

SETTINGS = "/redfish/v1/Systems/System_0/Bios/Settings"


def session(url: str) -> RedfishSession:
    return RedfishSession(BmcEndpoint(url, Credentials("admin", "secret")))


def test_read_gives_etag_apply_times_and_what_is_pending(hgx_bmc: FakeBmcServer) -> None:
    with session(hgx_bmc.url) as s:
        settings = read_bios_settings(s)
    assert settings.settings == SETTINGS and settings.etag
    assert settings.apply_times == ["OnReset", "AtMaintenanceWindowStart"]
    assert settings.pending == {"PcieAcsControl": "Disabled", "ProcessorPowerProfile": "PowerSaving"}
    assert settings.current["SriovGlobalEnable"] == "Enabled"
    assert hgx_bmc.paths("PATCH") == []  # reading writes nothing


def test_patch_sends_if_match_and_reads_back(hgx_bmc: FakeBmcServer) -> None:
    with session(hgx_bmc.url) as s:
        before = read_bios_settings(s)
        after = patch_bios_settings(s, {"SriovGlobalEnable": "Disabled"}, apply_time="OnReset")
    patch = next(r for r in hgx_bmc.requests if r.method == "PATCH")
    assert patch.path == SETTINGS and patch.headers["if-match"] == before.etag
    assert patch.json() == {
        "Attributes": {"SriovGlobalEnable": "Disabled"},
        "@Redfish.SettingsApplyTime": {"ApplyTime": "OnReset"},
    }
    assert after.pending["SriovGlobalEnable"] == "Disabled" and after.etag != before.etag
    assert after.current["SriovGlobalEnable"] == "Enabled"  # current changes only on reboot


def test_a_change_made_meanwhile_is_refused_not_overwritten(hgx_bmc: FakeBmcServer) -> None:
    with session(hgx_bmc.url) as s:
        stale = read_bios_settings(s)
        # Someone else writes the settings between our read and our write.
        other = urllib.request.Request(
            f"{hgx_bmc.url}{SETTINGS}",
            data=json.dumps({"Attributes": {"NumaNodesPerSocket": "NPS4"}}).encode(),
            method="PATCH",
            headers={"Content-Type": "application/json", "Authorization": "Basic YWRtaW46c2VjcmV0"},
        )
        urllib.request.urlopen(other, timeout=5).close()
        with pytest.raises(BmcError, match="changed since it was read") as exc:
            s.patch(stale.settings, {"Attributes": {"SriovGlobalEnable": "Disabled"}}, etag=stale.etag)
        assert exc.value.status == 412
        assert read_bios_settings(s).pending.get("SriovGlobalEnable") is None


def test_refuses_unknown_attributes_and_unsupported_apply_times(hgx_bmc: FakeBmcServer) -> None:
    with session(hgx_bmc.url) as s:
        with pytest.raises(BmcError, match="unknown BIOS attributes NoSuchThing"):
            patch_bios_settings(s, {"NoSuchThing": "1"})
        with pytest.raises(BmcError, match="apply time 'Immediate' is not supported"):
            patch_bios_settings(s, {"SriovGlobalEnable": "Disabled"}, apply_time="Immediate")
    assert hgx_bmc.paths("PATCH") == []


def test_patch_reaches_sushy_static_without_if_match_when_no_etag(dmtf_mockup: RunningServer) -> None:
    """DMTF's mockup gives no ETag for its settings: the PATCH goes without If-Match. sushy-static
    keeps nothing, so what it received is read from its log."""
    with session(dmtf_mockup.url) as s:
        assert read_bios_settings(s).etag == ""
        patch_bios_settings(s, {"ProcTurboMode": "Enabled"})
    log = dmtf_mockup.log_text()
    assert "PATCH /redfish/v1/Systems/437XR1138R2/Bios/Settings" in log
    assert '"ProcTurboMode": "Enabled"' in log and "If-Match" not in log
