"""End to end: the agent's /metrics page says where its stream to the controller stands. A real
simulated agent starts with its controller away (its spool fills and drops the oldest frames), then a
real controller comes up on that address (the agent connects, the spool empties, acks arrive), then
the controller stops (the agent shows itself disconnected again)."""

from __future__ import annotations

import re
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from tests.processes import spawn, start_controller, stop
from tests.support import free_port

pytestmark = pytest.mark.slow
NODE = "sim-stream-metrics"
MAX_FRAMES = 4
TIMEOUT = 60.0
_SAMPLE = re.compile(r"^(gpufleet_agent_(?:controller|spool)_\w+)\{([^}]*)\} (\S+)$", re.M)


def scrape(port: int) -> dict[str, tuple[str, float]]:
    """The stream's series on the agent's page: name -> (labels as written, value)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        page = response.read().decode()
    return {name: (labels, float(value)) for name, labels, value in _SAMPLE.findall(page)}


def wait_for(port: int, what: str, condition: Callable[[dict[str, float]], bool]) -> dict[str, float]:
    deadline = time.monotonic() + TIMEOUT
    while True:
        try:
            values = {name: value for name, (_, value) in scrape(port).items()}
        except OSError:
            values = {}
        if values and condition(values):
            return values
        assert time.monotonic() < deadline, f"{what}: the page showed {values}"
        time.sleep(0.2)


def test_the_page_follows_the_stream_down_up_and_down_again(tmp_path: Path) -> None:
    controller_port, metrics_port = free_port(), free_port()
    controller_address = f"127.0.0.1:{controller_port}"
    config = tmp_path / "agent.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "node": NODE,
                "source": "sim",
                "interval_seconds": 0.2,
                "sim": {"gpus": 2},
                "stream": {
                    "controller": controller_address,
                    "spool_dir": str(tmp_path / "spool"),
                    "spool_max_frames": MAX_FRAMES,
                    "backoff_initial_seconds": 0.1,
                    "backoff_max_seconds": 0.5,
                },
                "metrics": {"address": f"127.0.0.1:{metrics_port}"},
            }
        )
    )
    agent = spawn(["agent", "--config", str(config)], tmp_path / "agent.log")
    controller = None
    try:
        # No controller yet: frames pile up to the spool's limit, then the oldest are dropped.
        down = wait_for(
            metrics_port,
            "the spool full and dropping",
            lambda v: v.get("gpufleet_agent_spool_dropped_frames_total", 0) > 0,
        )
        assert down["gpufleet_agent_controller_connected"] == 0
        assert down["gpufleet_agent_spool_frames"] == MAX_FRAMES
        assert down["gpufleet_agent_spool_max_frames"] == MAX_FRAMES
        assert down["gpufleet_agent_spool_on_disk"] == 1
        assert down["gpufleet_agent_spool_rejected_frames_total"] == 0
        assert "gpufleet_agent_controller_last_ack_timestamp_seconds" not in down  # no ack yet
        labels, _ = scrape(metrics_port)["gpufleet_agent_controller_connected"]
        assert labels == f'controller="{controller_address}",node="{NODE}"'

        (tmp_path / "controller").mkdir()
        controller, _ = start_controller(
            tmp_path / "controller",
            {
                "listen": controller_address,
                "metrics_address": None,
                "db": str(tmp_path / "gpufleet.db"),
                "probes": {"on_connect": False, "periodic": False},
            },
        )
        started = time.time()
        up = wait_for(
            metrics_port,
            "connected, the spool drained",
            lambda v: v["gpufleet_agent_controller_connected"] == 1 and v["gpufleet_agent_spool_frames"] <= 1,
        )
        assert started - 1 <= up["gpufleet_agent_controller_last_ack_timestamp_seconds"] <= time.time() + 1
        dropped = up["gpufleet_agent_spool_dropped_frames_total"]
        assert dropped >= down["gpufleet_agent_spool_dropped_frames_total"]  # a counter: never back

        stop(controller)
        controller = None
        gone = wait_for(metrics_port, "disconnected", lambda v: v["gpufleet_agent_controller_connected"] == 0)
        assert gone["gpufleet_agent_spool_dropped_frames_total"] >= dropped  # never goes back
        assert agent.poll() is None, (tmp_path / "agent.log").read_text()[-3000:]
    finally:
        if controller is not None:
            stop(controller)
        stop(agent)
