"""The Redfish test infrastructure itself: servers start, answer, fail as asked, and stop."""

from __future__ import annotations

import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import requests

from tests.fake_bmc import FakeBmcServer
from tests.redfish_servers import (
    HGX_NODE,
    LEGACY_ONLY,
    EmulatorFactory,
    FakeBmcFactory,
    RunningServer,
    StaticServerFactory,
    TlsFiles,
)

SETTINGS = "/redfish/v1/Systems/System_0/Bios/Settings"


def refused(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) != 0


def links(doc: Any) -> Iterator[str]:
    """Every in-service link in a document: @odata.id values below the top and DataSourceUris."""
    if isinstance(doc, dict):
        for key, value in doc.items():
            if key in ("@odata.id", "DataSourceUri") and isinstance(value, str):
                yield value.split("#")[0]
            else:
                yield from links(value)
    elif isinstance(doc, list):
        for item in doc:
            yield from links(item)


@pytest.mark.parametrize("tree", [HGX_NODE, LEGACY_ONLY], ids=lambda p: p.name)
def test_fixture_trees_are_consistent(tree: Path) -> None:
    files = sorted(tree.rglob("index.json"))
    assert files
    served = {"/".join(["/redfish/v1", *f.parent.relative_to(tree).parts]) for f in files}
    for file in files:
        doc = json.loads(file.read_text())
        path = "/".join(["/redfish/v1", *file.parent.relative_to(tree).parts])
        assert doc["@odata.id"] == path, file
        body = {k: v for k, v in doc.items() if k != "@odata.id"}
        dangling = {link.rstrip("/") for link in links(body)} - served
        assert not dangling, f"{file} links to missing {dangling}"


def test_sushy_static_serves_and_stops(sushy_static_server: StaticServerFactory) -> None:
    server = sushy_static_server(LEGACY_ONLY)
    root = requests.get(f"{server.url}/redfish/v1/", timeout=5)
    assert root.status_code == 200
    assert root.json()["@odata.id"] == "/redfish/v1"
    # Known sushy-static limits the BMC tests rely on: queries 404, PATCH is only logged.
    assert requests.get(f"{server.url}/redfish/v1/Chassis?$expand=.", timeout=5).status_code == 404
    bios = f"{server.url}/redfish/v1/Systems/1/Bios"
    patch = requests.patch(bios, json={"Attributes": {"X": 1}}, headers={"If-Match": '"e1"'}, timeout=5)
    assert patch.status_code == 204
    assert 'If-Match: "e1"' in server.log_text()
    assert '"Attributes"' in server.log_text()
    server.stop()
    assert server.process.returncode is not None
    assert refused(server.port)


def test_dmtf_mockup_serves_a_copy(dmtf_mockup: RunningServer) -> None:
    root = requests.get(f"{dmtf_mockup.url}/redfish/v1/", timeout=5).json()
    assert root["Systems"] == {"@odata.id": "/redfish/v1/Systems"}
    assert dmtf_mockup.tree is not None and (dmtf_mockup.tree / "Chassis").is_dir()


def test_sushy_static_https_needs_the_ca(
    sushy_static_server: StaticServerFactory, tls_files: TlsFiles
) -> None:
    server = sushy_static_server(HGX_NODE, tls=tls_files)
    assert server.url.startswith("https://127.0.0.1:")
    ok = requests.get(f"{server.url}/redfish/v1/", verify=str(tls_files.ca_pem), timeout=5)
    assert ok.json()["@odata.id"] == "/redfish/v1"
    with pytest.raises(requests.exceptions.SSLError):
        requests.get(f"{server.url}/redfish/v1/", timeout=5)


def test_emulator_basic_auth(sushy_emulator: EmulatorFactory) -> None:
    server = sushy_emulator(users={"admin": "s3cret"})
    systems = f"{server.url}/redfish/v1/Systems"
    assert requests.get(f"{server.url}/redfish/v1/", timeout=5).status_code == 200
    assert requests.get(systems, timeout=5).status_code == 401
    assert requests.get(systems, auth=("admin", "wrong"), timeout=5).status_code == 401
    assert requests.get(systems, auth=("admin", "s3cret"), timeout=5).json()["Members@odata.count"] >= 1
    server.stop()
    assert refused(server.port)


def test_fake_bmc_etag_guards_patch_and_persists(hgx_bmc: FakeBmcServer) -> None:
    url = hgx_bmc.url + SETTINGS
    first = requests.get(url, timeout=5)
    etag = first.headers["ETag"]
    assert etag.startswith('"') and first.json()["@odata.etag"] == etag
    assert requests.get(url, timeout=5).headers["ETag"] == etag  # stable

    change = {"Attributes": {"NumaNodesPerSocket": "NPS4"}}
    stale = requests.patch(url, json=change, headers={"If-Match": '"stale"'}, timeout=5)
    assert stale.status_code == 412
    assert stale.json()["error"]["code"] == "Base.1.8.PreconditionFailed"

    assert requests.patch(url, json=change, headers={"If-Match": etag}, timeout=5).status_code == 204
    after = requests.get(url, timeout=5)
    assert after.headers["ETag"] != etag
    attributes = after.json()["Attributes"]
    assert attributes["NumaNodesPerSocket"] == "NPS4"
    assert attributes["PcieAcsControl"] == "Disabled"  # merged, not replaced
    assert requests.patch(url, json={"Attributes": {"SmtControl": "Disabled"}}, timeout=5).status_code == 204
    assert requests.get(url, timeout=5).json()["Attributes"]["SmtControl"] == "Disabled"

    original = json.loads((HGX_NODE / SETTINGS.removeprefix("/redfish/v1/") / "index.json").read_text())
    assert original["Attributes"]["NumaNodesPerSocket"] == "NPS1"  # the fixture served a copy
    patches = [r for r in hgx_bmc.requests if r.method == "PATCH"]
    assert patches[1].headers["if-match"] == etag and patches[1].json() == change


def test_fake_bmc_faults(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.status_for["/redfish/v1/Chassis/*/Sensors*"] = 503
    hgx_bmc.malformed.add("/redfish/v1/Managers/BMC_0")
    base = hgx_bmc.url + "/redfish/v1"
    sensors = requests.get(f"{base}/Chassis/BMC_0/Sensors", timeout=5)
    assert sensors.status_code == 503 and "error" in sensors.json()
    with pytest.raises(ValueError):
        requests.get(f"{base}/Managers/BMC_0", timeout=5).json()
    assert requests.get(f"{base}/Chassis/BMC_0", timeout=5).status_code == 200
    assert requests.get(f"{base}/NoSuchThing", timeout=5).status_code == 404
    requests.get(f"{base}/Chassis", params={"$expand": ".($levels=1)"}, timeout=5)
    assert hgx_bmc.requests[-1].query == "$expand=.($levels=1)"
    assert hgx_bmc.requests[-1].path == "/redfish/v1/Chassis"


def test_fake_bmc_delay_per_pattern(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.delay_seconds = {"/redfish/v1/Chassis*": 5.0}
    assert requests.get(hgx_bmc.url + "/redfish/v1/", timeout=1).status_code == 200
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(hgx_bmc.url + "/redfish/v1/Chassis", timeout=0.2)


def test_fake_bmc_sessions_and_auth(hgx_bmc: FakeBmcServer) -> None:
    hgx_bmc.require_auth = ("admin", "pw")
    base = hgx_bmc.url + "/redfish/v1"
    assert requests.get(f"{base}/", timeout=5).status_code == 200
    assert requests.get(f"{base}/Systems", timeout=5).status_code == 401
    assert requests.get(f"{base}/Systems", auth=("admin", "pw"), timeout=5).status_code == 200
    sessions = f"{base}/SessionService/Sessions"
    bad = requests.post(sessions, json={"UserName": "admin", "Password": "x"}, timeout=5)
    assert bad.status_code == 401

    login = requests.post(sessions, json={"UserName": "admin", "Password": "pw"}, timeout=5)
    assert login.status_code == 201
    token, location = login.headers["X-Auth-Token"], login.headers["Location"]
    assert location == "/redfish/v1/SessionService/Sessions/1"
    auth = {"X-Auth-Token": token}
    assert requests.get(f"{base}/Systems", headers=auth, timeout=5).status_code == 200
    assert requests.delete(hgx_bmc.url + location, headers=auth, timeout=5).status_code == 204
    assert hgx_bmc.logouts == [location]
    assert requests.get(f"{base}/Systems", headers=auth, timeout=5).status_code == 401

    hgx_bmc.noncompliant_sessions = True
    login = requests.post(sessions, json={"UserName": "admin", "Password": "pw"}, timeout=5)
    assert login.status_code == 204
    assert "X-Auth-Token" not in login.headers and "Location" not in login.headers


def test_fake_bmc_stop_frees_the_port(fake_bmc: FakeBmcFactory) -> None:
    bmc = fake_bmc(LEGACY_ONLY)
    with requests.Session() as session:  # a keep-alive connection must not keep it serving
        assert session.get(bmc.url + "/redfish/v1/Chassis/1/Thermal", timeout=5).status_code == 200
        port = bmc.port
        bmc.stop()
        assert refused(port)
        with pytest.raises(requests.exceptions.ConnectionError):
            session.get(bmc.url + "/redfish/v1/", timeout=5)


def test_unreachable_and_slow(unreachable_url: str, slow_bmc: FakeBmcServer) -> None:
    with pytest.raises(requests.exceptions.ConnectionError):
        requests.get(unreachable_url + "/redfish/v1/", timeout=1)
    started = time.monotonic()
    with pytest.raises(requests.exceptions.ReadTimeout):
        requests.get(slow_bmc.url + "/redfish/v1/", timeout=0.2)
    assert time.monotonic() - started < 1.0
