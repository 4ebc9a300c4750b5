"""End to end, real processes: a controller with --record and two simulated agents (one with a
thermal throttle on GPU 0); `gpufleet record --duration` against it; `gpufleet analyze` of that
file, and of the controller's own, finds the fault, and nothing on the healthy node."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import yaml

from tests.processes import ready_address, spawn, stop

ROOT = Path(__file__).resolve().parents[1]


def gpufleet(*args: str, timeout: float = 60) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "controller", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def findings(paths: list[Path], config: Path) -> list[set[tuple[str, int | None, str]]]:
    """`gpufleet analyze FILE -o json` of each path, side by side."""
    runs = [
        subprocess.Popen(
            [sys.executable, "-m", "controller", "analyze", str(p), "-o", "json", "--config", str(config)],
            cwd=ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for p in paths
    ]
    out = []
    for run in runs:
        stdout, stderr = run.communicate(timeout=60)
        assert run.returncode == 0, stderr
        out.append({(f["node"], f["gpu"], f["cause"]) for f in json.loads(stdout)["findings"]})
    return out


def test_record_then_analyze_finds_the_simulated_fault(tmp_path: Path) -> None:
    config = tmp_path / "controller.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "listen": "127.0.0.1:0",
                "metrics_address": None,
                "db": str(tmp_path / "gpufleet.db"),
                "kubernetes": {"enabled": False},
                "probes": {"on_connect": False, "periodic": False},
                "detect": {"interval_seconds": 1.0, "throttle_window_seconds": 2.0},
            }
        )
    )
    own, recorded = tmp_path / "controller.jsonl", tmp_path / "recorded.jsonl"
    ready, clog = tmp_path / "controller.ready", tmp_path / "controller.log"
    controller = spawn(
        [
            "controller",
            "controller",
            "--config",
            str(config),
            "--ready-file",
            str(ready),
            "--record",
            str(own),
        ],
        clog,
    )
    agents = []
    try:
        address = ready_address(controller, ready, clog)["address"]
        for node, fault in (("node-a", ["--fault", "thermal_throttle:0"]), ("node-b", [])):
            args = ["agent", "--sim", "--node", node, "--controller", address, "--interval", "0.5"]
            args += ["--gpus", "2", "--metrics-address", "none", *fault]
            agents.append(spawn(args, tmp_path / f"{node}.log"))
        deadline = time.monotonic() + 30
        while clog.read_text().count("agent connected") < 2:
            assert time.monotonic() < deadline, clog.read_text()[-3000:]
            time.sleep(0.1)
        done = gpufleet("record", "--controller", address, "--out", str(recorded), "--duration", "5")
        assert done.returncode == 0, done.stderr
        assert "gpufleet record: wrote" in done.stderr and done.stderr.rstrip().endswith("s; 0 dropped")
    finally:
        for agent in agents:
            stop(agent)
        stop(controller)  # closing writes what --record still held
    lines = recorded.read_text().splitlines()
    assert [json.loads(line)["message"].keys() for line in lines[:2]] == [{"hello"}, {"hello"}]
    assert len(lines) >= 2 + 2 * 6  # a frame each half second from each agent, for 5 s
    from_record, from_controller = findings([recorded, own], config)
    assert from_record == {("node-a", 0, "thermal_throttle")}
    assert ("node-a", 0, "thermal_throttle") in from_controller
    assert not any(n == "node-b" for n, _, _ in from_controller)
