"""`gpufleet controller` stopped by a signal sent to its whole process group, as Ctrl-C in a
terminal, systemd's stop (its cgroup) and `timeout` send it: its children (the detection process,
ingest fronts, record workers) leave the signal to it, so the stop is clean: no traceback, no error
logged, no front started again, and no child left behind."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.processes import ready_address
from tests.support import free_port

STOP_MASK = (1 << (signal.SIGINT - 1)) | (1 << (signal.SIGTERM - 1))


def _children_ignoring(pgid: int) -> dict[int, bool]:
    """The group's other processes, each with whether it ignores SIGINT and SIGTERM yet (its
    SigIgn in /proc): a child does so first thing once started."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == pgid:
            continue
        try:
            stat = (entry / "stat").read_text()
            status = (entry / "status").read_text()
        except OSError:  # it ended meanwhile
            continue
        if int(stat.rsplit(")", 1)[1].split()[2]) != pgid:  # pgrp: the 3rd field after the name
            continue
        ignored = next(int(line.split()[1], 16) for line in status.splitlines() if line.startswith("SigIgn:"))
        found[int(entry.name)] = ignored & STOP_MASK == STOP_MASK
    return found


def _group_gone(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return True
    return False


@pytest.mark.skipif(not Path("/proc/self/status").is_file(), reason="reads /proc (Linux)")
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_a_signal_to_the_process_group_stops_the_controller_and_its_children_cleanly(
    tmp_path: Path, signum: signal.Signals
) -> None:
    config = {
        "listen": f"127.0.0.1:{free_port()}",
        "operator_listen": f"127.0.0.1:{free_port()}",
        "metrics_address": "none",
        "db": str(tmp_path / "fleet.db"),
        "ingest_fronts": 1,
        "record": str(tmp_path / "fleet.jsonl"),
    }
    (tmp_path / "controller.yaml").write_text(yaml.safe_dump(config))
    ready, log = tmp_path / "controller.ready", tmp_path / "controller.log"
    argv = [sys.executable, "-m", "controller", "controller", "--config", str(tmp_path / "controller.yaml")]
    with log.open("ab") as out:
        process = subprocess.Popen(
            [*argv, "--ready-file", str(ready)],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # its own process group, as a terminal's job or a service's
        )
    try:
        ready_address(process, ready, log)
        deadline = time.monotonic() + 30
        # The detection process and the ingest front past their start-up (a signal during their
        # imports still ends them: that window is not what this test is about)
        while len(children := _children_ignoring(process.pid)) < 2 or not all(children.values()):
            assert time.monotonic() < deadline, f"children not ignoring SIGINT and SIGTERM: {children}"
            time.sleep(0.05)
        os.killpg(process.pid, signum)
        assert process.wait(timeout=60) == 0, log.read_text()[-3000:]
        deadline = time.monotonic() + 10  # the controller waited for its children; give stragglers a moment
        while not _group_gone(process.pid):
            assert time.monotonic() < deadline, "a child outlived the controller"
            time.sleep(0.05)
    finally:
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
    text = log.read_text()
    assert "controller stopping" in text
    assert "Traceback" not in text and "Exception ignored" not in text, text[-3000:]
    assert [line for line in text.splitlines() if " ERROR " in line] == []
