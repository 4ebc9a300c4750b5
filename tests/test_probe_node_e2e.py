"""End to end: `gpufleet probe-node` against a controller process and a simulated agent process.

Real processes, real gRPC on loopback, a real SQLite file: the operator's command reaches the agent
as a RunProbes command on its stream, and the modelled results come back stamped with its id.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml

from tests.processes import spawn, start_controller, stop

pytestmark = pytest.mark.slow
NODE = "sim-e2e"
START_TIMEOUT = 60.0


def gpufleet(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args], capture_output=True, text=True, timeout=60, check=False
    )


@pytest.fixture(scope="module")
def fleet(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A controller and one simulated 2-GPU agent streaming to it; yields the controller's address."""
    tmp = tmp_path_factory.mktemp("probe-node")
    controller, address = start_controller(
        tmp,
        {
            "listen": "127.0.0.1:0",
            "metrics_address": None,
            "db": str(tmp / "gpufleet.db"),
            "probes": {"on_connect": False, "periodic": False},  # only the operator's runs
        },
    )
    agent: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        agent_cfg = tmp / "agent.yaml"
        agent_cfg.write_text(
            yaml.safe_dump(
                {
                    "node": NODE,
                    "source": "sim",
                    "interval_seconds": 0.5,
                    "sim": {"gpus": 2},
                    "stream": {"controller": address, "backoff_initial_seconds": 0.1},
                    "metrics": {"address": None},
                }
            )
        )
        agent = spawn(["agent", "--config", str(agent_cfg)], tmp / "agent.log")
        while True:  # connected once the node lists as such
            listed = gpufleet("nodes", "--controller", address, "-o", "json")
            if listed.returncode == 0 and any(n["connected"] for n in json.loads(listed.stdout)["nodes"]):
                break
            assert agent.poll() is None, (tmp / "agent.log").read_text()
            assert time.monotonic() < deadline, "the agent did not connect"
            time.sleep(0.2)
        yield address
    finally:
        if agent is not None:
            stop(agent)
        stop(controller)


def test_probe_node_json_returns_the_modelled_results_of_its_command(fleet: str) -> None:
    result = gpufleet(
        "probe-node", NODE, "--probe", "gemm", "--probe", "membw", "--controller", fleet, "-o", "json"
    )
    assert result.returncode == 0, result.stderr
    body: dict[str, Any] = json.loads(result.stdout)
    assert list(body) == ["node", "command_id", "done", "ok", "error", "results"]
    assert (body["node"], body["done"], body["ok"], body["error"]) == (NODE, True, True, "")
    assert len(body["command_id"]) == 32
    results = body["results"]
    assert {(r["probe"], r["gpu"]) for r in results} >= {("gemm", 0), ("gemm", 1), ("membw", 0), ("membw", 1)}
    assert {r["probe"] for r in results} == {"gemm", "membw"}
    for r in results:
        assert r["command_id"] == body["command_id"]
        assert r["simulated"] is True and r["value"] > 0 and 0 < r["peak_ratio"] <= 1.0


def test_probe_node_table_and_no_wait(fleet: str) -> None:
    table = gpufleet("probe-node", NODE, "--probe", "pcie", "--gpu", "1", "--controller", fleet)
    assert table.returncode == 0, table.stderr
    assert "PROBE" in table.stdout and "pcie" in table.stdout and "GB/s" in table.stdout
    sent = gpufleet("probe-node", NODE, "--no-wait", "--controller", fleet)
    assert sent.returncode == 0, sent.stderr
    assert sent.stdout.startswith("probe command ") and sent.stdout.rstrip().endswith(f"sent to {NODE}")


def test_probe_node_exits_2_for_an_unknown_node_or_bad_arguments(fleet: str) -> None:
    unknown = gpufleet("probe-node", "ghost", "--controller", fleet)
    assert (unknown.returncode, unknown.stdout) == (2, "")
    assert unknown.stderr.strip() == "gpufleet probe-node: node ghost not found"
    bad = gpufleet("probe-node", NODE, "--gpu", "7", "--controller", fleet)
    assert bad.returncode == 2 and "has no GPU 7" in bad.stderr
    usage = gpufleet("probe-node", NODE, "--timeout", "0", "--controller", fleet)
    assert (usage.returncode, usage.stderr.strip()) == (
        2,
        "gpufleet probe-node: --timeout must be a finite number of seconds > 0",
    )


def test_commands_json_lists_the_probe_commands_with_their_outcome(fleet: str) -> None:
    sent = gpufleet("probe-node", NODE, "--probe", "pcie", "--controller", fleet, "-o", "json")
    assert sent.returncode == 0, sent.stderr
    command_id = json.loads(sent.stdout)["command_id"]
    listed = gpufleet("commands", "--node", NODE, "--controller", fleet, "-o", "json")
    assert listed.returncode == 0, listed.stderr
    doc: dict[str, Any] = json.loads(listed.stdout)
    newest = doc["commands"][0]
    assert (newest["id"], newest["node"], newest["kind"], newest["state"]) == (
        command_id,
        NODE,
        "run_probes",
        "succeeded",
    )
    assert newest["requester"].startswith("anonymous from ") and newest["finished"].endswith("Z")
    assert newest["result"]["ok"] is True and newest["result"]["run_probes"]["results"] >= 2
    assert all(c["state"] in {"succeeded", "failed", "sent", "running"} for c in doc["commands"])
