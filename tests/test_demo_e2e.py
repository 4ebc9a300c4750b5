"""End to end: `gpufleet demo` with real agent processes, real gRPC on loopback, a real SQLite file.

Every fault kind the demo injects (the agent's list, narrowed to what the controller detects) is
injected once; each must be found on its (node, gpu)
with its own cause, no healthy GPU may be flagged (while jobs pause and the scheduler probes the
idle GPUs), and no child process may outlive the demo, also when it is stopped with Ctrl-C.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from controller.demo.catalogue import agent_faults, detectable

pytestmark = pytest.mark.slow


def demo_command(*args: str) -> list[str]:
    return [sys.executable, "-m", "controller", "demo", *args]


def demo_env(tmp_path: Path) -> dict[str, str]:
    # The demo's temporary directory (configs, logs, the SQLite file) lands under tmp_path, so any
    # process still running from it afterwards is one the demo failed to stop.
    return {**os.environ, "TMPDIR": str(tmp_path), "PYTHONUNBUFFERED": "1"}


def leftovers(tmp_path: Path) -> list[str]:
    found = []
    for proc in psutil.process_iter(["pid", "cmdline"]):
        cmdline = " ".join(proc.info["cmdline"] or [])
        if str(tmp_path) in cmdline:
            found.append(f"{proc.info['pid']}: {cmdline}")
    return found


def test_demo_finds_every_injected_fault_and_nothing_else(tmp_path: Path) -> None:
    kinds = sorted(k.name for k in detectable(agent_faults()))
    nodes = len(kinds) + 2  # one fault of each kind, each on a node of its own, and two healthy nodes
    args = ("--nodes", str(nodes), "--gpus-per-node", "4", "--faults", str(len(kinds)))
    started = time.monotonic()
    result = subprocess.run(
        demo_command(*args, "--seconds", "20", "--seed", "11", "--json"),
        capture_output=True,
        text=True,
        timeout=120,
        env=demo_env(tmp_path),
        check=False,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 0, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout)  # exactly one JSON object on stdout

    assert list(summary) == [
        "nodes",
        "gpus",
        "seed",
        "injected",
        "findings",
        "precision",
        "recall",
        "probe_rounds",
        "elapsed_s",
    ]
    assert summary["nodes"] == nodes and summary["gpus"] == 4 * nodes and summary["seed"] == 11
    assert sorted(i["fault"] for i in summary["injected"]) == kinds
    injected = {(i["node"], i["gpu"]): i["cause"] for i in summary["injected"]}
    found: dict[tuple[str, int | None], set[str]] = {}
    for f in summary["findings"]:  # a fault may show as more than one cause (a driver is also drift)
        found.setdefault((f["node"], f["gpu"]), set()).add(f["cause"])
    assert set(found) == set(injected), f"findings {found} != injected {injected}"
    assert all(cause in found[where] for where, cause in injected.items()), (found, injected)
    assert summary["precision"] == 1.0 and summary["recall"] == 1.0
    for f in summary["findings"]:
        assert f["severity"] in {"info", "warning", "critical"}
        assert f["evidence"]["metric"] and f["evidence"]["detail"]
    assert 20.0 <= summary["elapsed_s"] <= elapsed
    # Jobs pause on every node within the run, and the scheduler probes the idle GPUs: every node
    # had its round on connect, and scheduled ones followed (seen through GetNode's results).
    rounds = summary["probe_rounds"]
    assert rounds["nodes"] == nodes
    assert rounds["periodic"] >= 5 and rounds["total"] == rounds["nodes"] + rounds["periodic"]
    assert leftovers(tmp_path) == []


def test_demo_stops_every_child_on_ctrl_c(tmp_path: Path) -> None:
    # No --seed: the demo picks one, says it, and puts it in the summary.
    proc = subprocess.Popen(
        demo_command("--nodes", "3", "--gpus-per-node", "2", "--faults", "1", "--json"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=demo_env(tmp_path),
    )
    try:
        assert proc.stderr is not None
        deadline = time.monotonic() + 60
        said = ""
        for line in proc.stderr:  # wait until the agents are streaming
            if "repeat this run with --seed" in line:
                said = line.split("--seed ")[-1].strip().rstrip(")")
            if "3/3 agents connected" in line:
                break
            assert time.monotonic() < deadline, "the demo's agents never connected"
        assert len(leftovers(tmp_path)) >= 4  # the controller and three agents are running
        proc.send_signal(signal.SIGINT)
        stdout, _ = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        for pipe in (proc.stdout, proc.stderr):  # closed even when the test failed midway
            if pipe is not None:
                pipe.close()
    assert proc.returncode == 0
    summary = json.loads(stdout)
    assert summary["nodes"] == 3 and len(summary["injected"]) == 1
    assert said.isdigit() and summary["seed"] == int(said)
    assert leftovers(tmp_path) == []


def test_demo_rejects_bad_arguments_with_one_line(tmp_path: Path) -> None:
    result = subprocess.run(
        demo_command("--nodes", "2", "--faults", "3", "--json"),
        capture_output=True,
        text=True,
        timeout=60,
        env=demo_env(tmp_path),
        check=False,
    )
    assert result.returncode == 2
    assert result.stdout == ""
    assert (
        result.stderr.strip().splitlines()[-1]
        == "gpufleet demo: --faults 3 needs at least as many nodes (have 2)"
    )


FIXABLE = ("power_cap", "clocks_locked_low", "cpu_governor_powersave", "numa_balancing_on", "thp_disabled")


def test_demo_tuning_auto_fixes_the_fixable_faults_and_recommends_the_rest(tmp_path: Path) -> None:
    """Power cap, locked clocks and the host settings are settings: the controller applies
    gpu-defaults or os-accelerator-performance, the agent re-probes (or reads back) and commits, the
    finding resolves. The others get their cause's answer recommended: seed 9 draws a thermal
    throttle (hardware: a drain) and a BIOS drift (the fleet's value, pending a reboot: never
    applied automatically)."""
    args = ("--nodes", "8", "--gpus-per-node", "4", "--faults", "7", "--tuning", "auto", "--seed", "9")
    result = subprocess.run(
        demo_command(*args, "--json"),
        capture_output=True,
        text=True,
        timeout=240,
        env=demo_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout)
    outcomes = {i["fault"]: i["outcome"] for i in summary["injected"]}
    assert outcomes == {
        **dict.fromkeys(FIXABLE, "fixed"),  # fixable faults are injected first
        "thermal_throttle": "recommended_drain",
        "bios_drift": "recommended_set_fleet_value",
    }, (outcomes, result.stderr[-3000:])
    tuning = summary["tuning"]
    assert (tuning["verified"], tuning["rolled_back"], tuning["needs_attention"]) == (5, 0, 0)
    assert tuning["drain_recommended"] == 1
    assert summary["precision"] == 1.0 and summary["recall"] == 1.0
    assert summary["elapsed_s"] < 200  # it ended when every fault had its outcome
    assert leftovers(tmp_path) == []


def test_demo_kubernetes_fake_drains_repairs_and_returns_a_broken_node(tmp_path: Path) -> None:
    """A hardware fault on a Kubernetes node: cordoned and drained by the policy, repaired by the
    demo, re-probed and uncordoned; the fixable faults are retuned online, without a drain."""
    # The five fixable kinds come first; seed 5 draws nvlink_down as the sixth.
    args = ("--nodes", "7", "--gpus-per-node", "4", "--faults", "6", "--kubernetes", "fake", "--seed", "5")
    result = subprocess.run(
        demo_command(*args, "--json"),
        capture_output=True,
        text=True,
        timeout=280,
        env=demo_env(tmp_path),
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary: dict[str, Any] = json.loads(result.stdout)
    outcomes = {i["fault"]: i["outcome"] for i in summary["injected"]}
    assert outcomes == {**dict.fromkeys(FIXABLE, "fixed"), "nvlink_down": "recommended_drain"}, outcomes
    [life] = summary["kubernetes"]  # the one hardware fault
    assert life["fault"] == "nvlink_down"
    steps = life["steps"]
    assert list(steps) == ["cordoned", "drained", "repaired", "uncordoned"], (steps, result.stderr[-3000:])
    assert steps["cordoned"] <= steps["drained"] <= steps["repaired"] <= steps["uncordoned"]
    assert summary["elapsed_s"] < 250
    assert leftovers(tmp_path) == []
