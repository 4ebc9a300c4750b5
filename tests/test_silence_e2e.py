"""End to end: silence, ack and maintenance with real processes: a controller process with a SQLite
file, a simulated agent with a power cap fault, and the `gpufleet` commands. The finding is
silenced (out of `findings`, marked in `node`), acked, its node put under maintenance, and all of
it is still there after the controller restarts on the same file, with its audit trail."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.processes import spawn, start_controller, stop

pytestmark = pytest.mark.slow
NODE = "sim-silence"
TIMEOUT = 60.0


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args], capture_output=True, text=True, timeout=60, check=False
    )


def document(*args: str) -> Any:
    done = gpufleet(*args, "-o", "json")
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def controller(tmp: Path, run: str) -> tuple[subprocess.Popen[bytes], str]:
    """A controller on the store in `tmp`, its config, log and ready file in `tmp/run`."""
    (tmp / run).mkdir()
    return start_controller(
        tmp / run,
        {
            "listen": "127.0.0.1:0",
            "metrics_address": None,
            "db": str(tmp / "gpufleet.db"),
            "probes": {"on_connect": False, "periodic": False},
            "detect": {"interval_seconds": 0.5},
        },
    )


def power_capped(address: str) -> list[dict[str, Any]]:
    found = document("findings", "--controller", address)["findings"]
    return [f for f in found if f["node"] == NODE and f["cause"] == "power_cap"]


def test_silence_ack_and_maintenance_survive_a_controller_restart(tmp_path: Path) -> None:
    process, address = controller(tmp_path, "first")
    agent_cfg = tmp_path / "agent.yaml"
    agent_cfg.write_text(
        yaml.safe_dump(
            {
                "node": NODE,
                "source": "sim",
                "interval_seconds": 0.5,
                "sim": {"gpus": 2, "faults": [{"fault": "power_cap", "gpu": 0}]},
                "stream": {"controller": address, "backoff_initial_seconds": 0.1},
                "metrics": {"address": None},
            }
        )
    )
    agent = spawn(["agent", "--config", str(agent_cfg)], tmp_path / "agent.log")
    try:
        deadline = time.monotonic() + TIMEOUT
        while not (found := power_capped(address)):
            assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
            assert time.monotonic() < deadline, "no power_cap finding"
            time.sleep(0.5)
        finding_id = found[0]["id"]

        silence = document(
            "silence",
            "--node",
            NODE,
            "--cause",
            "power_cap",
            "--for",
            "2h",
            "--comment",
            "known",
            "--controller",
            address,
        )["silence"]
        assert power_capped(address) == []  # hidden from the list, still active in the node view
        shown = document("node", NODE, "--controller", address)["findings"]
        assert [(f["id"], f["silenced_by"]) for f in shown if f["cause"] == "power_cap"] == [
            (finding_id, silence["id"])
        ]
        acked = document("ack", finding_id, "--comment", "on it", "--controller", address)
        assert acked["ack"]["comment"] == "on it"
        assert (
            gpufleet("maintenance", NODE, "on", "--comment", "PSU swap", "--controller", address).returncode
            == 0
        )
    finally:
        stop(agent)
        stop(process)

    process, address = controller(tmp_path, "second")  # the same store
    try:
        [kept] = document("silences", "--controller", address)["silences"]
        assert (kept["id"], kept["cause"], kept["comment"], kept["active"]) == (
            silence["id"],
            "power_cap",
            "known",
            True,
        )
        [node] = document("nodes", "--controller", address)["nodes"]
        assert (node["maintenance"], node["maintenance_comment"], node["active_findings"]) == (
            True,
            "PSU swap",
            0,
        )
        shown = document("node", NODE, "--controller", address)["findings"]
        [capped] = [f for f in shown if f["id"] == finding_id]
        assert (capped["ack"]["comment"], capped["silenced_by"]) == ("on it", "maintenance")
        actions = {e["action"] for e in document("history", "--controller", address)["entries"]}
        assert {"silence", "ack", "maintenance"} <= actions
        ended = document("unsilence", silence["id"], "--controller", address)["silence"]
        assert ended["active"] is False
    finally:
        stop(process)
