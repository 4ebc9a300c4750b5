"""A node whose stream stays open but that sends nothing is STALE (issue 15, case 3).

The rule with a fake clock, then real processes: an agent stopped with SIGSTOP goes STALE within a
little more than stale_after_seconds, and comes back HEALTHY on SIGCONT; and the controller's
keepalive (made short here) closes the stream of a stopped agent.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import yaml

from controller import server
from controller.app import ControllerApp
from controller.fleet.health import node_health
from protos.names import health_name
from tests.controller.harness import T0, Clock, config, frame, hello, running_controller
from tests.processes import spawn, start_controller, stop

STALE_AFTER = 3.0
START_TIMEOUT = 60.0
SLACK = 7.0  # on top of STALE_AFTER: the CLI's own start-up and the polling interval


def health(app: ControllerApp, node: str) -> str:
    state = app.fleet.nodes[node]
    return health_name(node_health(state, [], app.clock(), app.config.stale_after_seconds))


def test_a_connected_node_silent_past_stale_after_is_stale() -> None:
    async def go() -> None:
        clock = Clock()
        app = ControllerApp(config(stale_after_seconds=60.0), clock=clock)
        await app.start()
        try:
            await app.ingest.hello(hello("n1"))
            app.connected("n1")
            assert await app.ingest.frame("n1", frame(1)) == 1
            clock.now = T0 + 60.0
            assert health(app, "n1") == "healthy"  # exactly the limit: not yet
            clock.now = T0 + 60.5
            assert app.fleet.nodes["n1"].connected  # the stream says connected...
            assert health(app, "n1") == "stale"  # ...but nothing came: stale
            # A frame whose readings are old (the agent's clock runs behind) still proves it alive.
            late = frame(2, t=T0 - 3600)
            assert await app.ingest.frame("n1", late) == 2
            assert health(app, "n1") == "healthy"
            assert app.fleet.nodes["n1"].last_seen == T0  # (the Hello's): old readings do not move it
            clock.now = T0 + 121
            assert health(app, "n1") == "stale"
            await app.ingest.hello(hello("n1", boot="b2"))  # a new stream's Hello counts as heard
            assert health(app, "n1") == "healthy"
            app.disconnected("n1")
            clock.now = T0 + 181.5
            assert health(app, "n1") == "stale"  # disconnected and silent: stale as before
        finally:
            app.close()

    asyncio.run(go())


# Real processes


def node_state(address: str, name: str) -> tuple[str, bool] | None:
    """(health, connected) of `name` as `gpufleet nodes -o json` shows it; None before it is known."""
    listed = subprocess.run(
        [sys.executable, "-m", "controller", "nodes", "--controller", address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert listed.returncode == 0, listed.stderr
    for node in json.loads(listed.stdout)["nodes"]:
        if node["name"] == name:
            return str(node["health"]), bool(node["connected"])
    return None


def wait_for(address: str, name: str, wanted: tuple[str, bool], deadline: float, why: Path) -> float:
    """Poll until `name` shows `wanted`; returns when (monotonic seconds)."""
    while node_state(address, name) != wanted:
        assert time.monotonic() < deadline, f"{name} never showed {wanted}:\n{why.read_text()}"
        time.sleep(0.2)
    return time.monotonic()


@pytest.mark.slow
def test_a_stopped_agent_goes_stale_and_comes_back_healthy(tmp_path: Path) -> None:
    controller, address = start_controller(
        tmp_path,
        {
            "listen": "127.0.0.1:0",
            "metrics_address": None,
            "db": str(tmp_path / "gpufleet.db"),
            "stale_after_seconds": STALE_AFTER,
            "probes": {"on_connect": False, "periodic": False},
        },
    )
    agent: subprocess.Popen[bytes] | None = None
    try:
        deadline = time.monotonic() + START_TIMEOUT
        agent_cfg = tmp_path / "agent.yaml"
        agent_cfg.write_text(
            yaml.safe_dump(
                {
                    "node": "sim-stale",
                    "source": "sim",
                    "interval_seconds": 0.5,
                    "sim": {"gpus": 1},
                    "stream": {"controller": address, "backoff_initial_seconds": 0.1},
                    "metrics": {"address": None},
                }
            )
        )
        agent = spawn(["controller", "agent", "--config", str(agent_cfg)], tmp_path / "agent.log")
        wait_for(address, "sim-stale", ("healthy", True), deadline, tmp_path / "agent.log")

        os.kill(agent.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        went_stale = wait_for(
            address, "sim-stale", ("stale", True), stopped + STALE_AFTER + SLACK, tmp_path / "controller.log"
        )
        assert went_stale - stopped > STALE_AFTER - 1.0  # stale by its silence, not at once

        os.kill(agent.pid, signal.SIGCONT)
        wait_for(address, "sim-stale", ("healthy", True), time.monotonic() + 30, tmp_path / "agent.log")
        assert agent.poll() is None and controller.poll() is None
    finally:
        if agent is not None:
            stop(agent)
        stop(controller)


def agent_config(path: Path, node: str, address: str) -> Path:
    path.write_text(
        yaml.safe_dump(
            {
                "node": node,
                "source": "sim",
                "interval_seconds": 0.5,
                "sim": {"gpus": 1},
                "stream": {"controller": address, "backoff_initial_seconds": 0.1},
                "metrics": {"address": None},
            }
        )
    )
    return path


async def until(condition: Callable[[], bool], timeout: float, why: Path) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, why.read_text()
        await asyncio.sleep(0.05)


@pytest.mark.slow
def test_the_controller_keepalive_closes_the_stream_of_a_stopped_agent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(server, "SERVER_KEEPALIVE_MS", 1000)  # seconds here, not the real 30 + 10
    monkeypatch.setattr(server, "SERVER_KEEPALIVE_TIMEOUT_MS", 1000)
    log = tmp_path / "agent.log"

    async def go() -> None:
        async with running_controller(config(stale_after_seconds=STALE_AFTER), clock=time.time) as running:
            app = running.app
            agent = spawn(
                [
                    "controller",
                    "agent",
                    "--config",
                    str(agent_config(tmp_path / "a.yaml", "ka", running.address)),
                ],
                log,
            )
            try:
                await until(
                    lambda: app.connected_agents == 1 and "ka" in app.ingest.last_frame, START_TIMEOUT, log
                )
                os.kill(agent.pid, signal.SIGSTOP)
                await until(lambda: app.connected_agents == 0, 30, log)  # closed: no answer to its ping
                assert not app.fleet.nodes["ka"].connected
                os.kill(agent.pid, signal.SIGCONT)
                await until(lambda: app.connected_agents == 1, 30, log)  # it reconnects by itself
                assert agent.poll() is None
            finally:
                stop(agent)

    asyncio.run(go())
