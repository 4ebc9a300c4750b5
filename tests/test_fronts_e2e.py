"""Real processes: `gpufleet controller` with ingest fronts (`ingest_fronts: 2`). Agents' frames are
acked through the fronts and operators see the nodes on their own port; the fronts end with the
controller, on SIGTERM and on SIGKILL (no orphan keeps the agents' port); without operator_listen
the setting is refused before anything starts."""

from __future__ import annotations

import asyncio
import json
import socket
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
import yaml

from tests.controller.harness import frame, hello
from tests.processes import ready_address, spawn, stop
from tests.security.tls_files import stream_one_frame

pytestmark = pytest.mark.slow
TIMEOUT = 30.0
NODES = [f"fronts-e2e-{i}" for i in range(6)]


def start(tmp_path: Path, **fields: object) -> tuple[subprocess.Popen[bytes], dict[str, str], Path]:
    config = {
        "listen": "127.0.0.1:0",
        "operator_listen": "127.0.0.1:0",
        "ingest_fronts": 2,
        "db": str(tmp_path / "c.db"),
        "metrics_address": None,
        "kubernetes": {"enabled": False},
        **fields,
    }
    path, ready, log = tmp_path / "c.yaml", tmp_path / "c.ready", tmp_path / "c.log"
    path.write_text(yaml.safe_dump(config))
    process = spawn(["controller", "controller", "--config", str(path), "--ready-file", str(ready)], log)
    try:
        return process, ready_address(process, ready, log), log
    except BaseException:
        stop(process)
        raise


def fronts_of(process: subprocess.Popen[bytes]) -> list[psutil.Process]:
    return [
        child
        for child in psutil.Process(process.pid).children()
        if "controller.fronts.front" in " ".join(child.cmdline())
    ]


def refused(address: str) -> bool:
    host, _, port = address.rpartition(":")
    try:
        with socket.create_connection((host, int(port)), timeout=2):
            return False
    except ConnectionRefusedError:
        return True


def gone(processes: list[psutil.Process]) -> bool:
    return not any(p.is_running() and p.status() != psutil.STATUS_ZOMBIE for p in processes)


def until(condition: object, what: str) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not condition():  # type: ignore[operator]
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.1)


def test_agents_go_through_the_fronts_and_operators_see_them_and_the_fronts_end_with_it(
    tmp_path: Path,
) -> None:
    process, addresses, log = start(tmp_path)
    try:
        agents, operators = addresses["address"], addresses["operator_address"]
        assert agents != operators
        fronts = fronts_of(process)
        assert len(fronts) == 2
        for node in NODES:
            acked = asyncio.run(stream_one_frame(agents, None, hello(node), frame(1, node, t=time.time())))
            assert acked.ack.seq == 1
        listed = subprocess.run(
            [sys.executable, "-m", "controller", "nodes", "--controller", operators, "-o", "json"],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=True,
        )
        names = {entry["name"] for entry in json.loads(listed.stdout)["nodes"]}
        assert names == set(NODES), listed.stdout
        wrong = subprocess.run(
            [sys.executable, "-m", "controller", "nodes", "--controller", agents],
            capture_output=True,
            text=True,
            timeout=TIMEOUT,
            check=False,
        )
        assert wrong.returncode != 0 and operators in wrong.stderr, wrong.stderr  # told where to go
        process.terminate()
        assert process.wait(timeout=TIMEOUT) == 0, log.read_text()[-3000:]
        until(lambda: gone(fronts), "the fronts to end after SIGTERM")
        assert refused(agents)
    finally:
        stop(process)
    assert "2 ingest fronts serve agents on" in log.read_text()


def test_the_fronts_end_when_the_controller_is_killed(tmp_path: Path) -> None:
    process, addresses, _ = start(tmp_path)
    try:
        fronts = fronts_of(process)
        assert len(fronts) == 2
        process.kill()
        process.wait(timeout=TIMEOUT)
        until(lambda: gone(fronts), "the fronts to end after SIGKILL of the controller")
        assert refused(addresses["address"])  # nothing relays to a controller that is gone
    finally:
        stop(process)


def test_ingest_fronts_without_an_operator_port_are_refused_at_start(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "ingest_fronts": 2, "db": ":memory:"}))
    ended = subprocess.run(
        [sys.executable, "-m", "controller", "controller", "--config", str(path)],
        capture_output=True,
        text=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert ended.returncode == 2
    assert "ingest_fronts serve agents only: give operator_listen" in ended.stderr
