"""Real processes: agents spread over two controller replicas (replica_ingest) on one store (a
PostgreSQL database, and an SQLite file on one host), behind a stand-in for their Service that sends
each connection to the first replica up (tests/service_proxy.py).

The agent's connection reaches the standby, which ingests and owns its node (on PostgreSQL through
an ingest front of its own); the leader's operators'
API lists the node, streaming, with the standby's position, and an operator's probe through the
leader runs there (the standby sends the command) and answers with its results. kill -9 the standby
mid-stream: the agent reconnects through the Service to the leader, which takes the node over (the
store names it the owner) and goes on from the stored position, no acked frame lost and none stored
twice."""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import psycopg
import pytest
import yaml

from protos.gpufleet.v1 import operator_pb2, operator_pb2_grpc
from tests.processes import spawn, stop
from tests.service_proxy import ServiceProxy
from tests.support import free_port
from tests.test_controller_crash_e2e import (
    NODE,
    _position_or_zero,
    assert_each_seq_once,
    metric,
    stored_position,
    wait_for,
    write_configs,
)
from tests.test_controller_failover_e2e import TAKEOVER_SECONDS

pytestmark = pytest.mark.slow
P = "gpufleet_controller_"
PROBE_NODE = [sys.executable, "-m", "controller", "probe-node", NODE, "--probe", "gemm"]


def _owner(db: str) -> str:
    """The replica (host:pid) that owns the node, or "" before any does."""
    try:
        if db.startswith("postgresql://"):
            with psycopg.connect(db, connect_timeout=5) as pg:
                row = pg.execute("SELECT holder FROM node_owners WHERE node = %s", (NODE,)).fetchone()
        else:
            with sqlite3.connect(db, timeout=5) as conn:
                row = conn.execute("SELECT holder FROM node_owners WHERE node = ?", (NODE,)).fetchone()
    except (sqlite3.Error, psycopg.Error):
        return ""
    return "" if row is None else str(row[0])


def _listed(address: str) -> operator_pb2.NodeSummary | None:
    """The node as the controller at `address` lists it (None: not listed)."""
    with grpc.insecure_channel(address) as channel:
        nodes = operator_pb2_grpc.OperatorStub(channel).ListNodes(operator_pb2.ListNodesRequest(), timeout=5)
    return next((n for n in nodes.nodes if n.name == NODE), None)


def _probed(address: str, log: Path) -> Any:
    """An operator's probe of the node (gemm) through the controller at `address`, answered ok: the
    answer as `probe-node -o json` prints it (`log`: the replica's, shown when it fails)."""
    probed = subprocess.run(
        [*PROBE_NODE, "--controller", address, "-o", "json"],
        capture_output=True,
        text=True,
        timeout=90,
        check=False,
    )
    assert probed.returncode == 0, probed.stderr + log.read_text()[-3000:]
    answer = json.loads(probed.stdout)
    assert (answer["done"], answer["ok"]) == (True, True), answer
    return answer


def _controller(
    directory: Path, name: str, db: str, metrics_port: int, *, fronts: int = 0
) -> tuple[Path, str]:
    """A replica's config: its own ports, replica_ingest, syncing every second; `fronts` ingest
    fronts serving its agents' port (the operators' then on a port of its own)."""
    listen = f"127.0.0.1:{free_port()}"
    cfg = directory / f"{name}.yaml"
    config = {
        "listen": listen,
        "metrics_address": f"127.0.0.1:{metrics_port}",
        "db": db,
        "probes": {"on_connect": False, "periodic": False},
        "replica_ingest": True,
        "replica_sync_seconds": 1.0,
    }
    if fronts:
        config |= {"ingest_fronts": fronts, "operator_listen": f"127.0.0.1:{free_port()}"}
    cfg.write_text(yaml.safe_dump(config))
    return cfg, listen


def _two_replicas(
    directory: Path, db: str, *, standby_fronts: int = 0
) -> tuple[Path, Path, str, int, Path, str, int]:
    """The agent's config; the leader's config, agents' address and metrics port; the standby's."""
    _, agent_cfg, leader_port = write_configs(directory, db)
    leader_cfg, leader_address = _controller(directory, "leader", db, leader_port)
    standby_port = free_port()
    standby_cfg, standby_address = _controller(directory, "standby", db, standby_port, fronts=standby_fronts)
    return agent_cfg, leader_cfg, leader_address, leader_port, standby_cfg, standby_address, standby_port


def _logs(directory: Path) -> list[Path]:
    return [directory / "leader.log", directory / "standby.log", directory / "agent.log"]


def _dial(agent_cfg: Path, service: ServiceProxy) -> None:
    """The agent's config dials the Service's stand-in."""
    agent_yaml = yaml.safe_load(agent_cfg.read_text())
    agent_yaml["stream"]["controller"] = service.address
    agent_cfg.write_text(yaml.safe_dump(agent_yaml))


def _first_leader(
    cfg: Path, ready: Path, logs: list[Path], processes: list[subprocess.Popen[bytes]]
) -> subprocess.Popen[bytes]:
    """The first controller (in `processes`, to be stopped), once it leads."""
    leader = spawn(["controller", "controller", "--config", str(cfg), "--ready-file", str(ready)], logs[0])
    processes.append(leader)
    wait_for("the leader did not start", ready.exists, logs)
    return leader


def _agent_on_the_standby(
    configs: tuple[Path, Path, Path], ready: Path, logs: list[Path], processes: list[subprocess.Popen[bytes]]
) -> tuple[subprocess.Popen[bytes], subprocess.Popen[bytes], subprocess.Popen[bytes]]:
    """The leader, then the standby ingesting, then the agent, whose Service sends it to the standby
    (configs: the leader's, the standby's, the agent's); all in `processes`, to be stopped."""
    leader_cfg, standby_cfg, agent_cfg = configs
    leader = _first_leader(leader_cfg, ready, logs, processes)
    standby = spawn(["controller", "controller", "--config", str(standby_cfg)], logs[1])
    processes.append(standby)
    wait_for("the standby does not ingest", lambda: "standby: ingesting" in logs[1].read_text(), logs)
    processes.append(spawn(["agent", "--config", str(agent_cfg)], logs[2]))
    return leader, standby, processes[-1]


def _assert_the_standby_says_what_it_ingests(port: int, fronts: int, log: Path) -> None:
    """Each replica's own /metrics: the standby counts what it ingests, and says it is one."""
    assert metric(port, P + "leading") == 0
    assert metric(port, P + "frames_ingested_total") >= 30
    assert metric(port, P + "connected_agents") == 1
    assert metric(port, P + "ingest_fronts") == fronts
    if fronts:  # the front checked and planned the frames; the standby stored them
        assert metric(port, P + "ingest_front_planned_frames_total") >= 20
        assert "; 1 ingest fronts)" in log.read_text()


def test_agents_spread_over_replicas_and_a_dead_replicas_node_moves_to_another(
    tmp_path: Path, store_db: str
) -> None:
    # On PostgreSQL the standby serves its agents through an ingest front, as the leader would.
    fronts = 1 if store_db.startswith("postgresql://") else 0
    agent_cfg, leader_cfg, leader_address, leader_metrics, standby_cfg, standby_address, standby_metrics = (
        _two_replicas(tmp_path, store_db, standby_fronts=fronts)
    )
    logs, ready = _logs(tmp_path), tmp_path / "leader.ready"
    processes: list[subprocess.Popen[bytes]] = []
    with ServiceProxy([standby_address, leader_address]) as service:
        _dial(agent_cfg, service)
        try:
            leader, standby, agent = _agent_on_the_standby(
                (leader_cfg, standby_cfg, agent_cfg), ready, logs, processes
            )
            wait_for("the standby stored no frames", lambda: _position_or_zero(store_db) >= 30, logs)
            assert _owner(store_db).endswith(f":{standby.pid}")
            assert metric(leader_metrics, P + "leading") == 1
            _assert_the_standby_says_what_it_ingests(standby_metrics, fronts, logs[1])

            def leader_sees_it_streaming() -> bool:
                node = _listed(leader_address)
                return node is not None and node.connected and node.acked_seq >= 30

            wait_for("the leader does not list the standby's node", leader_sees_it_streaming, logs)
            # An operator's probe, through the leader: the standby sends it on the node's stream.
            answer = _probed(leader_address, logs[1])
            assert {(r["probe"], r["gpu"]) for r in answer["results"]} == {("gemm", 0), ("gemm", 1)}
            assert f"command {answer['command_id']} (run_probes" in logs[1].read_text()  # sent from there

            standby.kill()  # mid-stream: frames in flight, acks unsent
            standby.wait(timeout=10)
            at_kill = stored_position(store_db)
            wait_for(
                "the leader did not take the node over",
                lambda: _owner(store_db).endswith(f":{leader.pid}"),
                logs,
            )
            wait_for(
                "the agent's stream did not go on with the leader",
                lambda: _position_or_zero(store_db) >= at_kill + 30,
                logs,
            )
            assert_each_seq_once(store_db, leader_metrics, at_kill, agent)  # by the leader, from there
            text = logs[0].read_text()
            assert f"node {NODE}: taken over from replica" in text, text[-3000:]
            assert "OUT_OF_RANGE" not in text and "expected frame" not in text, text[-3000:]
            # Replicas on one SQLite file share its one writer: said at the start, for the operator
            shared = (
                "replica_ingest on the SQLite file" in text and "PostgreSQL (--db postgresql://...)" in text
            )
            assert shared == (not store_db.startswith("postgresql://"))
        finally:
            for process in reversed(processes):
                stop(process)


def test_a_warm_standby_takes_over_from_a_killed_leader_with_the_fleet_it_holds(
    tmp_path: Path, store_db: str
) -> None:
    """The standby loads the store while it waits (controller/warm_standby.py); kill -9 the leader
    mid-stream: the standby leads with that fleet, caught up, without loading the store again, and
    the agent's stream goes on with it from the stored position."""
    agent_cfg, leader_cfg, leader_address, _, standby_cfg, standby_address, standby_metrics = _two_replicas(
        tmp_path, store_db
    )
    logs, ready = _logs(tmp_path), tmp_path / "leader.ready"
    processes: list[subprocess.Popen[bytes]] = []
    with ServiceProxy([leader_address, standby_address]) as service:
        _dial(agent_cfg, service)
        try:
            leader = _first_leader(leader_cfg, ready, logs, processes)
            processes.append(spawn(["agent", "--config", str(agent_cfg)], logs[2]))
            agent = processes[-1]
            wait_for("the leader stored no frames", lambda: _position_or_zero(store_db) >= 20, logs)
            standby = spawn(["controller", "controller", "--config", str(standby_cfg)], logs[1])
            processes.append(standby)
            wait_for(
                "the standby did not load the store while waiting",
                lambda: "warm standby: 1 nodes loaded from the store" in logs[1].read_text(),
                logs,
            )
            loaded_at = stored_position(store_db)
            wait_for("no frames after the load", lambda: _position_or_zero(store_db) >= loaded_at + 20, logs)

            leader.kill()  # mid-stream: frames in flight, acks unsent
            killed = time.monotonic()
            leader.wait(timeout=10)
            at_kill = stored_position(store_db)
            wait_for(
                "the standby did not lead with the fleet it held",
                lambda: "warm standby: leading with the fleet held" in logs[1].read_text(),
                logs,
            )
            assert time.monotonic() - killed < TAKEOVER_SECONDS

            def listed_from_there() -> bool:
                try:
                    node = _listed(standby_address)
                except grpc.RpcError:  # not listening as the leader yet
                    return False
                return node is not None and node.acked_seq >= at_kill

            wait_for("the new leader does not list the node where it was", listed_from_there, logs)
            # served meanwhile (listed above); caught up before it leads ("listening", after
            # controller/server.py's _before_judging) and before its detection process gets the fleet
            wait_for("no catch-up logged", lambda: "caught up: took in" in logs[1].read_text(), logs)
            wait_for(
                "no detectors started",
                lambda: "the detection process has the fleet" in logs[1].read_text(),
                logs,
            )
            caught_up = logs[1].read_text()
            # it leads (listening, ready) while its detection process still gets its copy of the fleet
            copied = caught_up.index("the detection process has the fleet")
            assert caught_up.index("caught up: took in") < caught_up.index("controller listening on") < copied
            wait_for(
                "the agent's stream did not go on with the new leader",
                lambda: _position_or_zero(store_db) >= at_kill + 30,
                logs,
            )
            assert_each_seq_once(store_db, standby_metrics, at_kill, agent)
            text = logs[1].read_text()
            assert "loading the store" not in text and "OUT_OF_RANGE" not in text, text[-3000:]
        finally:
            for process in reversed(processes):
                stop(process)


def test_a_standby_that_takes_the_lead_keeps_its_agents_streams(tmp_path: Path, store_db: str) -> None:
    """The agent streams to the standby, whose agents' port refuses operators (UNAVAILABLE, naming
    the leader's role). kill -9 the leader: the standby leads on the same port without ending the
    agent's stream (one connection in all), carries its node from memory, serves operators there,
    and an operator's probe through it runs on that stream; no acked frame lost, none stored twice."""
    agent_cfg, leader_cfg, _, _, standby_cfg, standby_address, standby_metrics = _two_replicas(
        tmp_path, store_db
    )
    logs, ready = _logs(tmp_path), tmp_path / "leader.ready"
    processes: list[subprocess.Popen[bytes]] = []
    with ServiceProxy([standby_address]) as service:
        _dial(agent_cfg, service)
        try:
            leader, standby, agent = _agent_on_the_standby(
                (leader_cfg, standby_cfg, agent_cfg), ready, logs, processes
            )
            wait_for("the standby stored no frames", lambda: _position_or_zero(store_db) >= 20, logs)
            assert _owner(store_db).endswith(f":{standby.pid}")
            with pytest.raises(grpc.RpcError) as refused:
                _listed(standby_address)
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
            assert "is a standby" in str(refused.value.details())

            leader.kill()  # mid-stream
            leader.wait(timeout=10)
            at_kill = stored_position(store_db)
            wait_for(
                "the standby did not carry its streaming node into the lead",
                lambda: "1 agents stream on through the lead" in logs[1].read_text(),
                logs,
            )

            def listed_streaming() -> bool:
                try:
                    node = _listed(standby_address)
                except grpc.RpcError:  # its operators not served yet
                    return False
                return node is not None and node.connected and node.acked_seq >= at_kill

            wait_for("the new leader does not list its node streaming", listed_streaming, logs)
            answer = _probed(standby_address, logs[1])
            assert f"command {answer['command_id']} (run_probes" in logs[1].read_text()  # on the kept stream
            wait_for(
                "the agent's stream did not go on with the new leader",
                lambda: _position_or_zero(store_db) >= at_kill + 30,
                logs,
            )
            text = logs[1].read_text()  # (before the agent stops)
            assert text.count(f"agent connected: node {NODE} ") == 1, text[-3000:]  # never reconnected
            assert "disconnected" not in text and "OUT_OF_RANGE" not in text, text[-3000:]
            assert_each_seq_once(store_db, standby_metrics, 0, agent)  # all by it, before the lead and after
        finally:
            for process in reversed(processes):
                stop(process)
