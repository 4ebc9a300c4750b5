"""`gpufleet controller --metrics-address` as a process: serves /metrics, stops cleanly, refuses bad input."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tests.support import free_port

START_TIMEOUT_SECONDS = 20.0


def controller_args(tmp_path: Path, metrics: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "controller",
        "controller",
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--metrics-address",
        metrics,
        "--db",
        str(tmp_path / "gpufleet.db"),
        "--ready-file",
        str(tmp_path / "ready"),
    ]


@contextmanager
def controller(tmp_path: Path, metrics: str) -> Iterator[subprocess.Popen[str]]:
    """A controller process that has started serving; SIGTERMed (or killed, if it must be) at the end."""
    log = (tmp_path / "controller.log").open("w")
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    process = subprocess.Popen(controller_args(tmp_path, metrics), stdout=log, stderr=log, text=True, env=env)
    try:
        deadline = time.monotonic() + START_TIMEOUT_SECONDS
        while not (tmp_path / "ready").exists():
            assert process.poll() is None, (tmp_path / "controller.log").read_text()
            assert time.monotonic() < deadline, "the controller did not start in time"
            time.sleep(0.05)
        yield process
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        log.close()


def test_serves_metrics_and_stops_cleanly_on_sigterm(tmp_path: Path) -> None:
    port = free_port()
    with controller(tmp_path, f"127.0.0.1:{port}") as process:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as response:
            assert response.status == 200
            assert response.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            body = response.read().decode()
        assert "\ngpufleet_controller_nodes 0.0\n" in body
        assert 'gpufleet_controller_store_latency_seconds_count{operation="init"} 1.0' in body
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    log = (tmp_path / "controller.log").read_text()
    assert f"metrics on http://127.0.0.1:{port}/metrics" in log
    assert "uvloop event loop" in log, log  # the default where uvloop is installed (a dependency)
    assert "Traceback" not in log, log
    with socket.socket() as probe:  # nothing listens there any more (the scrape may leave a TIME_WAIT)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


def test_metrics_address_none_serves_no_metrics(tmp_path: Path) -> None:
    with controller(tmp_path, "none") as process:
        process.send_signal(signal.SIGTERM)
        assert process.wait(timeout=10) == 0
    log = (tmp_path / "controller.log").read_text()
    assert "controller listening on" in log and "metrics on" not in log, log


def test_a_malformed_metrics_address_exits_2(tmp_path: Path) -> None:
    result = subprocess.run(
        controller_args(tmp_path, "nonsense"), capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 2, result.stderr
    assert "metrics_address must be HOST:PORT, not 'nonsense'" in result.stderr
    assert not (tmp_path / "ready").exists()


def test_a_metrics_port_in_use_exits_1_with_a_clear_error(tmp_path: Path) -> None:
    port = free_port()
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", port))
        holder.listen()
        result = subprocess.run(
            controller_args(tmp_path, f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert result.returncode == 1, result.stderr
    assert f"gpufleet controller: cannot serve metrics on 127.0.0.1:{port}: " in result.stderr
    assert "in use" in result.stderr and "Traceback" not in result.stderr
    assert not (tmp_path / "ready").exists()
