"""`gpufleet agent --metrics-address ...` as a process: serves /metrics while it runs, stops on SIGTERM,
and refuses an address it cannot serve before it samples anything."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time

from tests.agent.exporter.simnode import Page, fetch
from tests.support import free_port

START_SECONDS = 15.0


def _agent(*args: str) -> list[str]:
    return [sys.executable, "-m", "agent", "--sim", "--node", "n1", "--interval", "0.5", *args]


def _wait_for_page(url: str, process: subprocess.Popen[str]) -> Page:
    """The first page that carries both GPU and dcgm series (the agent samples once at start)."""
    deadline = time.monotonic() + START_SECONDS
    while time.monotonic() < deadline:
        assert process.poll() is None, process.communicate()[1]
        try:
            status, _, body = fetch(url)
        except OSError:
            time.sleep(0.1)
            continue
        if status == 200 and "gpufleet_gpu_power_watts{" in body and "DCGM_FI_DEV_GPU_TEMP{" in body:
            return Page(body)
        time.sleep(0.1)
    raise AssertionError(f"no GPU page at {url} within {START_SECONDS} s")


def test_serves_metrics_and_exits_cleanly_on_sigterm() -> None:
    port = free_port()
    process = subprocess.Popen(
        _agent("--metrics-address", f"127.0.0.1:{port}", "--dcgm-compat"),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        page = _wait_for_page(f"http://127.0.0.1:{port}/metrics", process)
        assert len(page.samples("gpufleet_gpu_power_watts")) == 8
        assert {s.labels["Hostname"] for s in page.samples("DCGM_FI_DEV_GPU_TEMP")} == {"n1"}
        assert page.value("gpufleet_collector_success", collector="gpu") == 1.0
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, err
    assert f"serving metrics on http://127.0.0.1:{port}/metrics" in err
    with socket.socket() as probe:  # nobody listens there any more (TIME_WAIT connections may linger)
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        probe.bind(("127.0.0.1", port))
        probe.listen()


def test_nonsense_address_exits_2_with_one_clear_line() -> None:
    done = subprocess.run(
        _agent("--metrics-address", "nonsense"), capture_output=True, text=True, timeout=60, check=False
    )
    assert done.returncode == 2
    assert done.stderr.startswith("gpufleet agent: ") and "metrics.address must be HOST:PORT" in done.stderr
    assert "Traceback" not in done.stderr and done.stdout == ""


def test_port_in_use_exits_2_before_sampling() -> None:
    port = free_port()
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(
            _agent("--metrics-address", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 2
    assert f"gpufleet agent: cannot serve metrics on 127.0.0.1:{port}" in done.stderr
    assert "in use" in done.stderr and "Traceback" not in done.stderr
    assert "on node n1:" not in done.stderr  # the sampling loop never started


def test_none_serves_nothing_and_once_never_binds() -> None:
    port = free_port()
    with socket.socket() as taken:  # --once must not even try the port
        taken.bind(("127.0.0.1", port))
        taken.listen()
        done = subprocess.run(
            _agent("--once", "--metrics-address", f"127.0.0.1:{port}"),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0, done.stderr
    process = subprocess.Popen(
        _agent("--metrics-address", "none"), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        # Its first log line comes from the running agent, after the SIGTERM handler is in place (a
        # fixed sleep sent the signal before it was, when two test processes slowed its start).
        assert process.stderr is not None
        started = process.stderr.readline()
        assert " on node n1: " in started, started + process.communicate()[1]
        time.sleep(0.5)
        assert process.poll() is None
        process.send_signal(signal.SIGTERM)
        _, err = process.communicate(timeout=15)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0
    assert "serving metrics" not in err
