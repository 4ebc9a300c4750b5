"""BMC faults, each against a real server: unreachable, slower than the timeout, 401, 5xx, malformed
JSON, TLS. Each gives a clear error in the sample (whole poll or one section) and never raises."""

from __future__ import annotations

import time

import pytest

from agent.sources.bmc import SECTIONS, BmcSample
from agent.sources.redfish.bmc import RedfishBmc
from agent.sources.redfish.session import BmcEndpoint, BmcError, Credentials, RedfishSession
from tests.redfish_servers import HGX_NODE, FakeBmcServer, TlsFiles

ADMIN = Credentials("admin", "secret")


def poll(url: str, creds: Credentials | None = ADMIN, **endpoint: object) -> BmcSample:
    bmc = RedfishBmc(BmcEndpoint(url, creds, **endpoint))  # type: ignore[arg-type]
    try:
        return bmc.poll()
    finally:
        bmc.close()


def failed(sample: BmcSample) -> dict[str, str]:
    return {s.name: s.error for s in sample.sections if not s.success}


def test_unreachable_bmc(unreachable_url: str) -> None:
    sample = poll(unreachable_url)
    assert not sample.success
    assert sample.error.startswith(f"GET {unreachable_url}/redfish/v1/: cannot connect")
    assert "Connection refused" in sample.error
    assert set(failed(sample)) == set(SECTIONS)


def test_bmc_slower_than_the_timeout_costs_one_timeout_not_one_per_section(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.delay_seconds = {"/redfish/v1/Chassis/HGX_GPU_SXM_*": 2.0}  # the root and login are quick
    start = time.monotonic()
    sample = poll(hgx_bmc.url, read_timeout_seconds=0.3)
    elapsed = time.monotonic() - start
    assert "no answer within 0.3 s" in sample.error
    assert elapsed < 1.5, elapsed
    assert failed(sample)["chassis"].endswith("no answer within 0.3 s")
    assert all(e.startswith("not read: ") for name, e in failed(sample).items() if name != "chassis")
    assert [s.name for s in sample.sections if s.success] == ["systems"]
    assert sample.manufacturer == "Kestrel Systems"  # what was read before the BMC stalled is kept


def test_slow_root_is_a_timeout(slow_bmc: FakeBmcServer) -> None:
    sample = poll(slow_bmc.url, read_timeout_seconds=0.3)
    assert "/redfish/v1/: no answer within 0.3 s" in sample.error


def test_wrong_password_on_the_emulator_is_401(sushy_emulator: object) -> None:
    server = sushy_emulator(users={"admin": "secret"})  # type: ignore[operator]
    sample = poll(server.url, Credentials("admin", "wrong"))
    assert "HTTP 401 (the credentials were refused)" in sample.error
    anonymous = poll(server.url, None)
    assert "HTTP 401 (no credentials were given)" in anonymous.error


def test_wrong_password_with_sessions_is_401(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.require_auth = ("admin", "secret")
    sample = poll(hgx_bmc.url, Credentials("admin", "nope"))
    assert "HTTP 401" in sample.error and sample.auth == "basic"  # the session was refused, then basic
    assert "nope" not in sample.error


def test_a_5xx_section_fails_alone(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1/Chassis/BMC_0/PowerSubsystem": 500}
    sample = poll(hgx_bmc.url)
    assert sample.error == ""
    assert list(failed(sample)) == ["power"]
    assert "GET /redfish/v1/Chassis/BMC_0/PowerSubsystem: HTTP 500" in failed(sample)["power"]
    assert sample.power_supplies == []
    assert sample.power_consumed_watts == 3420.0  # EnvironmentMetrics still answered
    assert len(sample.fans) == 6 and len(sample.gpus) == 8


def test_one_bad_sensor_loses_that_sensor_only(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1/Chassis/BMC_0/Sensors/CPU0_Temp": 503}
    sample = poll(hgx_bmc.url)
    assert list(failed(sample)) == ["thermal"]
    names = {t.name for t in sample.temperatures}
    assert not any("CPU0" in n for n in names) and any("CPU1" in n for n in names)


def test_service_root_5xx_fails_the_poll(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1": 503}
    sample = poll(hgx_bmc.url)
    assert sample.error.startswith("GET /redfish/v1/: HTTP 503")


def test_malformed_json_fails_its_section(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.malformed = {"/redfish/v1/UpdateService/FirmwareInventory"}
    sample = poll(hgx_bmc.url)
    assert failed(sample) == {
        "firmware": "/redfish/v1/UpdateService/FirmwareInventory: the BMC answered with invalid JSON"
    }
    assert sample.bios_attributes and sample.temperatures


def test_session_expiry_logs_in_again(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.require_auth = ("admin", "secret")
    bmc = RedfishBmc(BmcEndpoint(hgx_bmc.url, Credentials("admin", "secret")))
    try:
        assert bmc.poll().auth == "session"
        hgx_bmc.sessions.clear()  # the BMC rebooted: every token is gone
        second = bmc.poll()
    finally:
        bmc.close()
    assert second.error == "" and second.auth == "session"
    assert len(hgx_bmc.paths("POST")) == 2


def test_a_service_root_behind_auth_is_read_with_basic_auth(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.require_auth = ("admin", "secret")
    hgx_bmc.root_requires_auth = True
    sample = poll(hgx_bmc.url)
    assert sample.error == "" and sample.auth == "session" and len(sample.gpus) == 8
    assert "HTTP 401 (no credentials were given)" in poll(hgx_bmc.url, None).error


def test_noncompliant_session_creation_falls_back_to_basic(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.require_auth = ("admin", "secret")
    hgx_bmc.noncompliant_sessions = True  # 204 without X-Auth-Token or Location, as seen in the wild
    sample = poll(hgx_bmc.url)
    assert sample.auth == "basic" and sample.error == ""
    assert hgx_bmc.requests[-1].headers["authorization"].startswith("Basic ")


def test_tls_verified_by_default(sushy_static_server: object, tls_files: TlsFiles) -> None:
    server = sushy_static_server(HGX_NODE, tls=tls_files)  # type: ignore[operator]
    assert server.url.startswith("https://")
    refused = poll(server.url)
    assert "TLS verification failed" in refused.error and "ca_bundle" in refused.error
    trusted = poll(server.url, ca_bundle=str(tls_files.ca_pem))
    assert trusted.error == "" and trusted.model == "KS-8H100-G5"
    insecure = poll(server.url, insecure=True)
    assert insecure.error == ""


def test_bad_url_is_a_config_error() -> None:
    with pytest.raises(BmcError) as exc:
        RedfishSession(BmcEndpoint("10.0.0.1"))
    assert exc.value.kind == "config"


def test_a_failed_inventory_read_is_retried_next_poll_not_carried(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1/UpdateService/FirmwareInventory": 500}
    bmc = RedfishBmc(BmcEndpoint(hgx_bmc.url, ADMIN), inventory_every=10)
    try:
        first = bmc.poll()
        hgx_bmc.status_for = {}
        second = bmc.poll()
        third = bmc.poll()
    finally:
        bmc.close()
    assert list(failed(first)) == ["firmware"] and first.firmware == []
    assert second.success and len(second.firmware) == 6
    assert third.success and third.firmware == second.firmware
    inventory_reads = hgx_bmc.paths("GET").count("/redfish/v1/UpdateService/FirmwareInventory")
    assert inventory_reads == 2  # the failed read and its retry; the third poll reuses it


def test_a_bmc_lost_mid_poll_still_says_how_it_logged_in(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1/Chassis": 401}
    sample = poll(hgx_bmc.url)
    assert sample.auth == "session" and "HTTP 401" in sample.error


def test_a_member_link_that_is_no_absolute_path_fails_its_section_not_the_poll(
    hgx_bmc: FakeBmcServer,
) -> None:
    # Appended to the base URL as is, "redfish/v1/..." names another host ("127.0.0.1:PORTredfish"):
    # the request must not be sent (credentials would go with it), nor end the poll as unreachable.
    sensors = hgx_bmc.tree / "Chassis" / "BMC_0" / "Sensors" / "index.json"
    sensors.write_text(
        sensors.read_text().replace(
            '"/redfish/v1/Chassis/BMC_0/Sensors/CPU0', '"redfish/v1/Chassis/BMC_0/Sensors/CPU0'
        )
    )
    sample = poll(hgx_bmc.url)
    assert sample.error == ""
    assert list(failed(sample)) == ["thermal"]
    assert "redfish/v1/Chassis/BMC_0/Sensors/CPU0_Temp" in failed(sample)["thermal"]
    assert any("CPU1" in t.name for t in sample.temperatures)
    assert len(hgx_bmc.logouts) == 1  # the session was kept, and logged out at close


def test_a_forbidden_resource_fails_its_section_not_the_poll(hgx_bmc: FakeBmcServer) -> None:
    # A read-only BMC account may be refused a log or the BIOS (403): the credentials were accepted,
    # so the rest of the poll stands and the session is kept (and logged out at close).
    hgx_bmc.require_auth = ("admin", "secret")
    hgx_bmc.status_for = {"/redfish/v1/UpdateService/FirmwareInventory": 403}
    sample = poll(hgx_bmc.url)
    assert sample.error == "" and sample.auth == "session"
    assert list(failed(sample)) == ["firmware"]
    assert "HTTP 403" in failed(sample)["firmware"] and "refused" not in failed(sample)["firmware"]
    assert sample.temperatures and sample.log_entries
    assert len(hgx_bmc.logouts) == 1


def test_bios_and_system_logs_are_not_reported_read_when_the_systems_failed(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for = {"/redfish/v1/Systems": 500}
    bmc = RedfishBmc(BmcEndpoint(hgx_bmc.url, ADMIN))
    try:
        sample = bmc.poll()
        assert set(failed(sample)) == {"systems", "bios", "logs"}
        assert failed(sample)["bios"] == "not read: the systems collection could not be read"
        assert "system logs not read" in failed(sample)["logs"]
        assert sample.log_entries  # the BMC's own log was still read
        hgx_bmc.status_for = {}
        again = bmc.poll()  # the BIOS is read again at once, not carried empty for inventory_every polls
    finally:
        bmc.close()
    assert again.success and again.bios_attributes
