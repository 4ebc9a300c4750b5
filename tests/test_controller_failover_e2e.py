"""Real processes: two controllers on one store (a PostgreSQL database, and an SQLite file on one
host), the same config and ports. One leads; the other waits as a standby, neither listening nor
acting. kill -9 the leader while an agent streams: the standby takes the lead within 30 s with the
next term, listens on the same address, and the agent's stream goes on from the stored position,
no acked frame lost and none stored twice."""

from __future__ import annotations

import functools
import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import yaml

from controller.store.postgres_lease import SILENCE_SECONDS
from tests.postgres_server import PostgresServer
from tests.processes import spawn, stop
from tests.test_controller_crash_e2e import (
    _position_or_zero,
    assert_each_seq_once,
    stored_position,
    wait_for,
    write_configs,
)

pytestmark = pytest.mark.slow
TAKEOVER_SECONDS = 30.0


def _controller(cfg: Path, ready: Path, log: Path) -> subprocess.Popen[bytes]:
    return spawn(["controller", "controller", "--config", str(cfg), "--ready-file", str(ready)], log)


def _started(ready: Path, log: Path) -> bool:
    """Leading (its ready file written) or waiting as a standby."""
    return ready.exists() or "standby" in log.read_text()


def _leader_term(db: str) -> tuple[int, str]:
    if db.startswith("postgresql://"):
        import psycopg

        with psycopg.connect(db, connect_timeout=5) as pg:
            row = pg.execute("SELECT epoch, holder FROM leader WHERE id = 1").fetchone()
    else:
        import contextlib
        import sqlite3

        with contextlib.closing(sqlite3.connect(db, timeout=5)) as conn:
            row = conn.execute("SELECT epoch, holder FROM leader WHERE id = 1").fetchone()
    assert row is not None
    return int(row[0]), str(row[1])


def test_a_standby_takes_over_from_a_killed_leader_and_no_acked_frame_is_lost(
    tmp_path: Path, store_db: str
) -> None:
    cfg, agent_cfg, metrics_port = write_configs(tmp_path, store_db)
    logs = [tmp_path / "first.log", tmp_path / "second.log", tmp_path / "agent.log"]
    ready = [tmp_path / "first.ready", tmp_path / "second.ready"]

    first = _controller(cfg, ready[0], logs[0])
    second = None
    agent = None
    try:
        wait_for("the first controller did not start", ready[0].exists, logs)
        second = _controller(cfg, ready[1], logs[1])
        wait_for("the second did not wait as a standby", lambda: "standby" in logs[1].read_text(), logs)
        agent = spawn(["agent", "--config", str(agent_cfg)], logs[2])
        wait_for("no frames ingested", lambda: _position_or_zero(store_db) >= 30, logs)
        assert not ready[1].exists() and second.poll() is None  # the standby neither listens nor quits
        assert _leader_term(store_db)[0] == 1

        os.kill(first.pid, signal.SIGKILL)  # mid-stream: frames in flight, acks unsent
        first.wait(timeout=10)
        killed = time.monotonic()
        at_kill = stored_position(store_db)
        wait_for("the standby did not take the lead", ready[1].exists, logs)
        took = time.monotonic() - killed
        assert took < TAKEOVER_SECONDS, f"took the lead after {took:.1f} s"
        term, holder = _leader_term(store_db)
        assert term == 2 and holder.endswith(f":{second.pid}"), (term, holder)
        wait_for(
            "the agent's stream did not go on with the new leader",
            lambda: _position_or_zero(store_db) >= at_kill + 30,
            logs,
        )
        assert_each_seq_once(store_db, metrics_port, at_kill, agent)  # by the new leader
        text = logs[1].read_text()
        assert "leading the store" in text and ": term 2" in text, text[-3000:]
        assert "OUT_OF_RANGE" not in text and "expected frame" not in text, text[-3000:]
    finally:
        for process in (agent, second, first):
            if process is not None:
                stop(process)


def test_a_hung_leader_loses_the_lead_to_the_standby_and_stops_when_it_wakes(
    tmp_path: Path, postgres_server: PostgresServer
) -> None:
    """SIGSTOP the leader: PostgreSQL ends its silent lease session after SILENCE_SECONDS, the standby
    leads with term 2; SIGCONT: the old leader finds its lead gone and stops (exit 1) without acting."""
    db = postgres_server.new_database()
    processes: list[subprocess.Popen[bytes]] = []
    logs = [tmp_path / "first.log", tmp_path / "second.log"]
    ready = [tmp_path / "first.ready", tmp_path / "second.ready"]
    for i in range(2):
        cfg = tmp_path / f"controller{i}.yaml"
        cfg.write_text(yaml.safe_dump({"listen": "127.0.0.1:0", "metrics_address": None, "db": db}))
        processes.append(_controller(cfg, ready[i], logs[i]))
        wait_for(f"controller {i} did not start", functools.partial(_started, ready[i], logs[i]), logs)
    first, second = processes
    try:
        assert ready[0].exists() and not ready[1].exists()
        os.kill(first.pid, signal.SIGSTOP)
        stopped = time.monotonic()
        wait_for("the standby did not take the lead from the hung leader", ready[1].exists, logs)
        took = time.monotonic() - stopped
        assert SILENCE_SECONDS - 1 < took < TAKEOVER_SECONDS, f"took the lead after {took:.1f} s"
        assert _leader_term(db)[0] == 2
        os.kill(first.pid, signal.SIGCONT)
        assert first.wait(timeout=15) == 1
        text = logs[0].read_text()
        assert "lost the lead of the store" in text and "term 1" in text, text[-3000:]
        assert postgres_server.password not in text
        assert second.poll() is None and _leader_term(db)[0] == 2  # the new leader goes on
    finally:
        for process in processes:
            stop(process)
