"""A second `gpufleet controller` on a port a first one serves: refused in one line, exit 1, nothing
left running. gRPC sets SO_REUSEPORT, so before it started and the kernel spread the agents'
connections over the two controllers and their two stores."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest

from tests.controller.harness import ControllerThread, config
from tests.support import free_port


@pytest.mark.parametrize("fronts", [0, 1], ids=["served-by-the-controller", "ingest-fronts"])
def test_a_second_controller_on_the_first_ones_port_is_refused(tmp_path: Path, fronts: int) -> None:
    with ControllerThread(config(db=str(tmp_path / "first.db"))) as first:
        extra = (
            ["--ingest-fronts", str(fronts), "--operator-listen", f"127.0.0.1:{free_port()}"]
            if fronts
            else []
        )
        command = [sys.executable, "-m", "controller", "controller", "--listen", first.address, *extra]
        second = subprocess.Popen(
            [*command, "--db", str(tmp_path / "second.db"), "--metrics-address", "none"],
            cwd=tmp_path,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,  # its children are in its session: none may be left
        )
        try:
            _, err = second.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(second.pid, signal.SIGKILL)  # it serves the port too: the bug itself
            second.communicate()
            pytest.fail("the second controller started on the first one's port")
    assert second.returncode == 1, err
    assert "Traceback" not in err
    assert err.strip().splitlines()[-1] == (
        f"gpufleet controller: cannot listen on {first.address}: "
        "already in use (another gpufleet controller, or another program)"
    )
    assert _in_session(second.pid) == []


def _in_session(sid: int) -> list[int]:
    left = []
    for process in psutil.process_iter():
        try:
            if os.getsid(process.pid) == sid:
                left.append(process.pid)
        except (ProcessLookupError, PermissionError):
            continue
    return left
