"""One running agent per state directory (agent/state_lock.py): a second agent on one spool
directory is refused at start naming the first one's pid; the lock goes with its holder."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agent.state_lock import LOCK_FILE, StateInUse, StateLock
from tests.support import free_port

ROOT = Path(__file__).resolve().parents[2]


def test_a_second_holder_is_refused_naming_the_first_and_may_take_it_once_released(tmp_path: Path) -> None:
    first, second = StateLock(), StateLock()
    first.take(str(tmp_path / "spool"), "spool directory")
    with pytest.raises(
        StateInUse,
        match=rf"spool directory {tmp_path / 'spool'} is in use by another agent "
        rf"on this machine \(pid {os.getpid()}\)",
    ):
        second.take(str(tmp_path / "spool"), "spool directory")
    first.close()
    second.take(str(tmp_path / "spool"), "spool directory")
    second.close()


def test_a_directory_that_cannot_be_made_is_left_to_the_spool_to_report(tmp_path: Path) -> None:
    (tmp_path / "file").write_text("not a directory")
    lock = StateLock()
    lock.take(str(tmp_path / "file" / "spool"), "spool directory")  # no error: the spool says it
    lock.close()


def _agent(spool: Path, node: str) -> subprocess.Popen[str]:
    flags = ["--controller", f"127.0.0.1:{free_port()}", "--metrics-address", "none", "--interval", "0.5"]
    return subprocess.Popen(
        [sys.executable, "-m", "agent", "--sim", "--node", node, "--spool-dir", str(spool), *flags],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_a_second_agent_on_one_spool_directory_is_refused_and_the_first_goes_on(tmp_path: Path) -> None:
    """Before, both ran: each resent and deleted the other's frames as an older boot's, and they
    shared one tuning journal."""
    spool = tmp_path / "spool"
    first = _agent(spool, "n1")
    try:
        deadline = time.monotonic() + 60
        while not (spool / LOCK_FILE).exists() or not (spool / LOCK_FILE).read_text().strip():
            assert first.poll() is None and time.monotonic() < deadline, "the first agent did not start"
            time.sleep(0.1)
        second = _agent(spool, "n2")
        _, err = second.communicate(timeout=60)
        assert second.returncode == 2
        assert err.strip() == (
            f"gpufleet agent: spool directory {spool} is in use by another agent on this machine "
            f"(pid {first.pid}): two agents would resend and delete each other's frames and share one "
            "tuning journal"
        )
        assert first.poll() is None
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=60)
    assert first.returncode == 0
