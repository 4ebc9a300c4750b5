"""Real processes: kill -9 the controller while an agent streams to it, start it again on the same
store (an SQLite file, then a PostgreSQL database): no frame the controller acked is lost and none
is stored twice.

The proof is the sequence: the restarted controller starts at the stored position, takes the agent's
resent frames from exactly there (a frame the agent dropped as acked but the store lacked would be a
gap, refused OUT_OF_RANGE forever), drops those it already had as duplicates, and ingests every later
seq once (frames ingested == positions advanced).
"""

from __future__ import annotations

import contextlib
import os
import signal
import sqlite3
import subprocess
import time
import urllib.parse
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from tests.processes import spawn, stop
from tests.support import free_port

pytestmark = pytest.mark.slow
NODE = "crash-e2e"
TIMEOUT = 60.0


def metric(port: int, name: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
        text = resp.read().decode()
    for line in text.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[1])
    raise AssertionError(f"{name} not in the scrape")


def positions(db: str) -> list[tuple[Any, ...]]:
    """The node's stored ack positions, read from the side (SQLite file or PostgreSQL URL)."""
    if db.startswith("postgresql://"):
        with psycopg.connect(db, connect_timeout=5) as pg:
            return pg.execute("SELECT acked_seq FROM boots WHERE node = %s", (NODE,)).fetchall()
    with contextlib.closing(sqlite3.connect(db, timeout=1)) as conn:
        return conn.execute("SELECT acked_seq FROM boots WHERE node = ?", (NODE,)).fetchall()


def stored_position(db: str) -> int:
    rows = positions(db)
    assert len(rows) == 1, rows  # one boot of the agent
    return int(rows[0][0])


def wait_for(what: str, check: Callable[[], bool], logs: list[Path]) -> None:
    deadline = time.monotonic() + TIMEOUT
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}; logs:\n" + "\n".join(p.read_text()[-3000:] for p in logs))
        time.sleep(0.1)


def write_configs(directory: Path, db: str) -> tuple[Path, Path, int]:
    """controller.yaml (free loopback ports, store `db`, no probes) and agent.yaml (NODE, simulated,
    a frame every 0.1 s, streaming to that controller, spooling in `directory`); and the metrics port."""
    grpc_port, metrics_port = free_port(), free_port()
    cfg = directory / "controller.yaml"
    cfg.write_text(
        yaml.safe_dump(
            {
                "listen": f"127.0.0.1:{grpc_port}",
                "metrics_address": f"127.0.0.1:{metrics_port}",
                "db": db,
                "probes": {"on_connect": False, "periodic": False},
            }
        )
    )
    agent_cfg = directory / "agent.yaml"
    agent_cfg.write_text(
        yaml.safe_dump(
            {
                "node": NODE,
                "source": "sim",
                "interval_seconds": 0.1,
                "sim": {"gpus": 2},
                "stream": {
                    "controller": f"127.0.0.1:{grpc_port}",
                    "spool_dir": str(directory / "spool"),
                    "backoff_initial_seconds": 0.1,
                    "backoff_max_seconds": 0.5,
                },
                "metrics": {"address": None},
            }
        )
    )
    return cfg, agent_cfg, metrics_port


def test_kill_9_mid_stream_loses_no_acked_frame_and_stores_none_twice(tmp_path: Path, store_db: str) -> None:
    db = store_db
    cfg, agent_cfg, metrics_port = write_configs(tmp_path, db)
    clog, alog = tmp_path / "controller.log", tmp_path / "agent.log"
    logs = [clog, alog]
    controller = spawn(["controller", "controller", "--config", str(cfg)], clog)
    agent = spawn(["agent", "--config", str(agent_cfg)], alog)
    try:
        wait_for("no frames ingested", lambda: _position_or_zero(db) >= 30, logs)
        os.kill(controller.pid, signal.SIGKILL)  # mid-stream: frames in flight, acks unsent
        controller.wait(timeout=10)
        at_kill = stored_position(db)
        time.sleep(1.0)  # the agent keeps sampling into its spool while the controller is gone

        controller = spawn(["controller", "controller", "--config", str(cfg)], clog)
        wait_for(
            "the restarted controller did not move past the stored position",
            lambda: _position_or_zero(db) >= at_kill + 30,
            logs,
        )
        assert_each_seq_once(db, metrics_port, at_kill, agent)
        text = clog.read_text()
        assert "OUT_OF_RANGE" not in text and "expected frame" not in text, text[-3000:]
        password = urllib.parse.urlsplit(db).password
        assert password is None or password not in text, "the store's password was logged"
        assert db.startswith("postgresql://") is ("store postgresql://gpufleet:***@" in text), text[-3000:]
    finally:
        stop(agent)
        stop(controller)


def assert_each_seq_once(db: str, metrics_port: int, at_kill: int, agent: subprocess.Popen[bytes]) -> None:
    """Stop the agent (no more frames: the counters are final once its stream closed); every seq
    after the position stored when the controller was killed was ingested exactly once by the
    controller now running: nothing lost, nothing twice."""
    stop(agent)
    time.sleep(0.5)
    final = stored_position(db)
    ingested = metric(metrics_port, "gpufleet_controller_frames_ingested_total")
    assert ingested == final - at_kill, (ingested, final, at_kill)


def _position_or_zero(db: str) -> int:
    """0 until the store and the node's row exist."""
    if not db.startswith("postgresql://") and not Path(db).exists():
        return 0
    try:
        rows = positions(db)
    except (sqlite3.Error, psycopg.Error):
        return 0
    return max((int(r[0]) for r in rows), default=0)
