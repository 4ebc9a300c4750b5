"""End to end, as processes: `gpufleet bmc` against DMTF's mockup served by sushy-static, and the
BMC section flowing agent -> gRPC stream -> controller (SQLite) -> `gpufleet node NAME -o json`."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from tests.redfish_servers import RunningServer
from tests.support import free_port

REPO = Path(__file__).resolve().parents[1]


def gpufleet(
    *args: str, env: dict[str, str] | None = None, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=env,
        check=False,
    )


def test_gpufleet_bmc_json_on_the_dmtf_mockup(dmtf_mockup: RunningServer, tmp_path: Path) -> None:
    password = tmp_path / "bmc-password"
    password.write_text("not-on-the-command-line\n")
    password.chmod(0o600)
    proc = gpufleet(
        "bmc", "--url", dmtf_mockup.url, "--username", "admin", "--password-file", str(password), "--json"
    )
    assert proc.returncode == 0, proc.stderr
    body: dict[str, Any] = json.loads(proc.stdout)
    assert body["success"] and body["error"] == "" and body["auth"] == "basic"
    temps = {t["name"]: t for t in body["temperatures"]}
    assert temps["CPU #1 Temperature"]["upper_critical_celsius"] == 45.0
    assert any(t["context"] == "intake" for t in temps.values())
    assert len(body["fans"]) == 4 and body["fans"][0]["speed_rpm"] == 2200.0
    assert {p["name"] for p in body["power_supplies"]} == {"Power Supply Bay 1", "Power Supply Bay 2"}
    assert body["power_consumed_watts"] == 374.0
    assert body["bios_attributes"]["ProcTurboMode"] == "Enabled"
    assert body["bios_pending"]["ProcTurboMode"] == "Disabled"
    assert {f["id"] for f in body["firmware"]} == {"BMC", "SS", "BIOS"}
    assert "not-on-the-command-line" not in proc.stdout + proc.stderr


def test_gpufleet_bmc_table_and_its_failures(dmtf_mockup: RunningServer, unreachable_url: str) -> None:
    table = gpufleet("bmc", "--url", dmtf_mockup.url)
    assert table.returncode == 0, table.stderr
    assert "CPU #1 Temperature" in table.stdout and "pending ProcTurboMode = Disabled" in table.stdout
    down = gpufleet("bmc", "--url", unreachable_url, "--timeout", "2")
    assert down.returncode == 1
    assert f"gpufleet bmc: GET {unreachable_url}/redfish/v1/: cannot connect" in down.stderr
    half = gpufleet(
        "bmc",
        "--url",
        dmtf_mockup.url,
        "--username",
        "admin",
        env={**os.environ, "GPUFLEET_BMC_PASSWORD": ""},
    )
    assert half.returncode == 2 and "no password" in half.stderr
    assert "--password" not in gpufleet("bmc", "--help").stdout.replace("--password-file", "")


def test_agent_once_with_a_dead_bmc_still_reports_its_gpus(unreachable_url: str) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "agent",
            "--sim",
            "--gpus",
            "2",
            "--once",
            "--json",
            "--bmc-url",
            unreachable_url,
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1  # a collector failed
    snapshot = json.loads(proc.stdout)["snapshot"]
    assert len(snapshot["gpus"]) == 2 and snapshot["collectors"]["gpu"]["success"]
    assert not snapshot["collectors"]["bmc"]["success"]
    assert "cannot connect" in snapshot["bmc"]["error"]


def test_bmc_section_reaches_gpufleet_node(dmtf_mockup: RunningServer, tmp_path: Path) -> None:
    port = free_port()
    address = f"127.0.0.1:{port}"
    ready = tmp_path / "ready"
    config = tmp_path / "agent.yaml"
    config.write_text(f"bmc:\n  url: {dmtf_mockup.url}\n  interval_seconds: 1\n")
    env = {**os.environ, "GPUFLEET_BMC_USERNAME": "admin", "GPUFLEET_BMC_PASSWORD": "secret"}
    logs = {name: (tmp_path / f"{name}.log").open("w") for name in ("controller", "agent")}
    controller_args = [
        "controller",
        "--listen",
        address,
        "--db",
        str(tmp_path / "db"),
        "--ready-file",
        str(ready),
    ]
    agent_args = ["--sim", "--gpus", "2", "--node", "bmc-node", "--controller", address, "--interval", "0.5"]
    controller = subprocess.Popen(
        [sys.executable, "-m", "controller", *controller_args],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=logs["controller"],
    )
    agent = subprocess.Popen(
        [sys.executable, "-m", "agent", *agent_args, "--config", str(config)],
        cwd=REPO,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=logs["agent"],
    )
    try:
        detail: dict[str, Any] = {}
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline and "bmc" not in detail:
            time.sleep(0.5)
            shown = gpufleet("node", "bmc-node", "--controller", address, "-o", "json")
            if shown.returncode == 0:
                detail = json.loads(shown.stdout)
        assert "bmc" in detail, "the controller never showed a BMC section"
        bmc = detail["bmc"]
        assert bmc["endpoint"] == dmtf_mockup.url and bmc["success"]
        assert bmc["serial"] == "437XR1138R2" and bmc["bios_attributes"]["ProcTurboMode"] == "Enabled"
        assert any(t["context"] == "exhaust" for t in bmc["temperatures"])
        assert bmc["power_consumed_watts"] == 374.0
        table = gpufleet("node", "bmc-node", "--controller", address)
        assert dmtf_mockup.url in table.stdout
    finally:
        for proc in (agent, controller):
            proc.terminate()
        for proc in (agent, controller):
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for log in logs.values():
            log.close()
    agent_log = (tmp_path / "agent.log").read_text()
    assert agent.returncode == 0, agent_log
    assert f"reading BMC {dmtf_mockup.url}" in agent_log and "collector bmc failed" not in agent_log
