"""`gpufleet nodes|node|findings` against a real controller on loopback, and against none."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from controller.app import ControllerApp
from controller.cli import operator
from controller.main import main
from controller.security.warning import security_warning
from protos.gpufleet.v1 import telemetry_pb2 as pb
from tests.controller.harness import (
    STALE_AFTER,
    Clock,
    ControllerThread,
    bmc_sample,
    config,
    frame,
    hello,
    populate,
)
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[3]
Capture = pytest.CaptureFixture[str]
# A plaintext controller without operator tokens says so on every `nodes` and `findings`.
WARNED = f"WARNING: {security_warning(config())}\n"


@pytest.fixture(scope="module")
def controller() -> Iterator[ControllerThread]:
    """One controller for the module: the commands only read, so tests cannot disturb each other."""
    clock = Clock()
    with ControllerThread(config(stale_after_seconds=STALE_AFTER), clock) as c:

        async def setup(app: ControllerApp) -> None:
            await populate(app, clock)
            facts = pb.HostFacts(
                hostname="c1", os="Ubuntu 22.04", kernel="6.8.0", cpu_count=64, cpu_model="EPYC"
            )
            await app.ingest.hello(hello("c-critical", gpus=2, host=facts))
            f = frame(2, "c-critical", t=clock.now)
            f.gpus[0].clock_event_reasons = 4 | 64
            f.gpus.add(index=1, power_watts=300.0, clock_event_reasons=0)
            f.host.load1 = 2.5
            f.bmc.CopyFrom(bmc_sample(clock.now - 30, "c-critical"))
            assert await app.ingest.frame("c-critical", f) == 2

        c.call(setup)
        yield c


@pytest.fixture
def wide(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tables wide enough that rich never folds a cell."""
    monkeypatch.setenv("COLUMNS", "250")


def output(capsys: Capture) -> tuple[str, str]:
    captured = capsys.readouterr()
    return captured.out, captured.err


def json_out(capsys: Capture) -> Any:
    out, err = output(capsys)
    assert err in ("", WARNED)  # stdout stays a clean document; `node` brings no warning
    return json.loads(out)


def test_nodes_json(controller: ControllerThread, capsys: Capture) -> None:
    assert operator.nodes(controller.address, "json") == 0
    doc = json_out(capsys)
    assert list(doc) == ["nodes"]
    nodes = doc["nodes"]
    assert [(n["name"], n["health"], n["active_findings"]) for n in nodes] == [  # worst first
        ("c-critical", "critical", 3),
        ("b-degraded", "degraded", 2),
        ("d-stale", "stale", 1),
        ("a-healthy", "healthy", 0),
        ("e-returned", "healthy", 0),
    ]
    a = nodes[3]
    assert a["acked_seq"] == 1 and isinstance(a["acked_seq"], int)
    assert a["connected"] is True and nodes[2]["connected"] is False
    assert a["gpu_count"] == 2 and a["source"] == "sim" and a["boot_id"] == "b1"
    assert a["last_seen"] == "2027-01-15T08:00:00Z"  # T0, RFC 3339 in UTC


def test_nodes_table(controller: ControllerThread, capsys: Capture, wide: None) -> None:
    assert operator.nodes(controller.address, "table") == 0
    out, err = output(capsys)
    assert err == WARNED
    assert "Nodes (5)" in out
    for name, health in (("a-healthy", "healthy"), ("c-critical", "critical"), ("d-stale", "stale")):
        (line,) = [row for row in out.splitlines() if name in row]
        assert health in line.replace(name, "")


def test_node_json(controller: ControllerThread, capsys: Capture) -> None:
    assert operator.node(controller.address, "c-critical", "json") == 0
    doc = json_out(capsys)
    assert {"summary", "hello", "gpus", "host", "probes", "findings"} <= set(doc)
    assert doc["summary"]["name"] == "c-critical" and doc["summary"]["acked_seq"] == 2
    assert doc["hello"]["host"]["cpu_count"] == 64 and doc["host"]["load1"] == 2.5
    gpu0, gpu1 = doc["gpus"]
    assert gpu0["clock_event_reasons"] == 68
    assert gpu0["clock_event_reason_names"] == ["sw_power_cap", "hw_thermal_slowdown"]
    assert gpu1["clock_event_reason_names"] == [] and "temperature_celsius" not in gpu1
    assert [(f["node"], f["gpu"], f["cause"], f["severity"]) for f in doc["findings"]] == [
        ("c-critical", None, "nvlink_down", "critical"),
        ("c-critical", 1, "ecc_row_remap_pending", "critical"),
        ("c-critical", 0, "thermal_throttle", "warning"),
    ]
    assert list(doc["findings"][0])[:3] == ["id", "node", "gpu"]


def test_node_table(controller: ControllerThread, capsys: Capture, wide: None) -> None:
    assert operator.node(controller.address, "c-critical", "table") == 0
    out, err = output(capsys)
    assert err == ""
    assert "host c1: Ubuntu 22.04, kernel 6.8.0, 64 CPUs (EPYC)" in out
    assert "sw_power_cap, hw_thermal_slowdown" in out
    for cause in ("nvlink_down", "ecc_row_remap_pending", "thermal_throttle"):
        assert cause in out
    assert "│ power_cap " not in out  # b-degraded's finding is not c-critical's (its CAUSE cell)


def test_node_json_shows_the_bmc_sample(controller: ControllerThread, capsys: Capture) -> None:
    assert operator.node(controller.address, "c-critical", "json") == 0
    bmc = json_out(capsys)["bmc"]
    assert bmc["time"] == "2027-01-15T08:00:31Z"  # RFC 3339, like every timestamp
    assert bmc["endpoint"] == "https://bmc-c-critical.example" and bmc["success"] is False
    assert bmc["bios_attributes"] == {"ProcCStates": "Disabled", "SriovGlobalEnable": "Enabled"}
    assert bmc["bios_pending"] == {"ProcCStates": "Enabled"}
    assert bmc["power_consumed_watts"] == 5230.0
    assert bmc["temperatures"][0] == {
        "name": "Inlet 1",
        "context": "intake",
        "reading_celsius": 24.0,
        "health": "",
        "chassis": "1",
        "source": "",
        "state": "",
    }
    exhaust = bmc["temperatures"][2]
    assert exhaust["upper_critical_celsius"] == 70.0 and "upper_caution_celsius" not in exhaust
    assert bmc["fans"][1]["speed_rpm"] == 0.0 and "speed_rpm" not in bmc["fans"][2]  # 0 kept, unset left out
    assert [(g["index"], g["temperature_celsius"], g.get("power_watts")) for g in bmc["gpus"]] == [
        (0, 63.0, 415.0),
        (1, 71.0, None),
    ]
    assert "power_watts" not in bmc["gpus"][1]
    assert bmc["sections"][1] == {
        "name": "logs",
        "success": False,
        "duration_seconds": 0.0,
        "error": "HTTP 500",
    }

    assert operator.node(controller.address, "a-healthy", "json") == 0
    assert "bmc" not in json_out(capsys)  # its agent reads no BMC


def table_rows(out: str, title: str) -> list[list[str]]:
    """The header and body rows of the rich table titled `title`, as cell texts."""
    lines = out.splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == title)
    stop = next(i for i in range(start, len(lines)) if lines[i].startswith("└"))
    rows = [line.strip()[1:-1] for line in lines[start:stop] if line.startswith(("┃", "│"))]
    return [[cell.strip() for cell in row.replace("┃", "│").split("│")] for row in rows]


def test_node_table_shows_the_bmc_section(controller: ControllerThread, capsys: Capture, wide: None) -> None:
    assert operator.node(controller.address, "c-critical", "table") == 0
    out, err = output(capsys)
    assert err == ""
    lines = [line.strip() for line in out.splitlines()]
    (header,) = [line for line in lines if line.startswith("BMC ")]
    assert header.startswith("BMC https://bmc-c-critical.example polled 2027-01-15 08:00:31Z (")
    assert header.endswith(", took 1.4s): partial")
    assert "system ok, chassis critical; power 5230 W; intake 24-26 C, exhaust 41 C" in lines
    assert "PSUs 3, not ok: PSU 3 warning; fans 2, not ok: Fan 4 critical" in lines
    assert "BIOS 2.1.4, 1 pending BIOS setting; BMC firmware 7.10.30" in lines
    assert "failed sections: logs" in lines
    assert table_rows(out, "GPUs, NVML beside BMC") == [
        ["GPU", "NVML TEMP C", "BMC TEMP C", "NVML POWER W", "BMC POWER W", "BMC HEALTH"],
        ["0", "60", "63", "402", "415", "ok"],
        ["1", "-", "71", "300", "-", "warning"],
    ]

    assert operator.node(controller.address, "a-healthy", "table") == 0
    out, _ = output(capsys)
    assert "GPUs (latest readings)" in out
    assert "BMC" not in out  # no BMC sample: no section at all


def test_unknown_node_is_one_line_and_exit_1(controller: ControllerThread, capsys: Capture) -> None:
    assert operator.node(controller.address, "nope", "json") == 1
    assert output(capsys) == ("", "gpufleet: node nope not found\n")


def test_findings_json_filters(controller: ControllerThread, capsys: Capture) -> None:
    assert operator.findings(controller.address, "json") == 0
    found = json_out(capsys)["findings"]
    assert [f["severity"] for f in found] == ["critical"] * 3 + ["warning"] * 2 + ["info"]
    assert all(f["active"] is True for f in found)

    assert operator.findings(controller.address, "json", node="a-healthy", include_resolved=True) == 0
    (resolved,) = json_out(capsys)["findings"]
    assert (resolved["node"], resolved["gpu"], resolved["cause"], resolved["active"]) == (
        "a-healthy",
        0,
        "slow_unknown",
        False,
    )
    assert resolved["first_seen"].endswith("Z") and resolved["evidence"]["peers"] == 7

    assert operator.findings(controller.address, "json", node="a-healthy") == 0
    assert json_out(capsys) == {"findings": []}


def test_findings_table(controller: ControllerThread, capsys: Capture, wide: None) -> None:
    assert operator.findings(controller.address, "table", include_resolved=True) == 0
    out, err = output(capsys)
    assert err == WARNED
    (resolved,) = [row for row in out.splitlines() if "a-healthy" in row]
    assert "slow_unknown" in resolved and "info (resolved)" in resolved
    (nvlink,) = [row for row in out.splitlines() if "nvlink_down" in row]
    assert "c-critical" in nvlink and " - " in nvlink  # node-level: no GPU


def test_main_dispatches_flags(controller: ControllerThread, capsys: Capture) -> None:
    argv = ["findings", "--controller", controller.address, "-o", "json", "--node", "b-degraded"]
    assert main(argv) == 0
    assert [f["cause"] for f in json_out(capsys)["findings"]] == ["power_cap", "hbm_degraded"]
    assert main(["node", "d-stale", "--controller", controller.address, "-o", "json"]) == 0
    assert json_out(capsys)["summary"]["health"] == "stale"


@pytest.mark.parametrize(
    "argv",
    [["nodes"], ["node", "a-healthy"], ["findings", "--all"], ["nodes", "-o", "json"]],
    ids=["nodes", "node", "findings", "nodes-json"],
)
def test_controller_down_is_one_line_and_exit_1(argv: list[str], capsys: Capture) -> None:
    target = f"127.0.0.1:{free_port()}"
    assert main([*argv, "--controller", target]) == 1
    out, err = output(capsys)
    assert out == ""
    assert err.startswith(f"gpufleet: cannot reach controller at {target}")
    assert err.count("\n") == 1 and err.endswith("\n")


def test_controller_down_as_a_process() -> None:
    target = f"127.0.0.1:{free_port()}"
    proc = subprocess.run(
        [sys.executable, "-m", "controller", "nodes", "--controller", target],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert proc.stdout == ""
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"gpufleet: cannot reach controller at {target}")


def test_a_server_without_the_operator_service_is_reported_not_raised(capsys: Capture) -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=1))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        assert operator.nodes(f"127.0.0.1:{port}", "json") == 1
        assert operator.node(f"127.0.0.1:{port}", "x", "json") == 1
    finally:
        server.stop(None)
    out, err = output(capsys)
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 2
    assert all(
        x.startswith(f"gpufleet: controller at 127.0.0.1:{port} answered UNIMPLEMENTED") for x in lines
    )
